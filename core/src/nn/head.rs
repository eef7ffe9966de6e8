//! Final norm + lm_head (the post-layer).

use super::*;
use std::sync::Arc;

/// Final norm followed by the lm_head (possibly the tied embedding table, shared, not copied).
///
/// # Shapes
/// - `lm_head`: `[vocab, hidden]`; `[R, hidden]` → `[R, vocab]`
#[derive(Debug, Clone)]
pub struct NormHead {
    pub norm: RmsNorm,
    pub lm_head: Arc<Tensor>,
}

impl PostLayer for NormHead {
    fn weight_bytes(&self) -> usize {
        self.lm_head.bytes() + self.norm.w.bytes()
    }

    fn norm(&self, h: &Tensor) -> Result<Tensor> {
        self.norm.forward(h)
    }

    fn logits(&self, normed: &Tensor) -> Result<Tensor> {
        // f32 logits (the GEMM accumulates in f32; no final bf16 rounding).
        normed.matmul_t_to(&self.lm_head, DType::F32)
    }
}
