//! Final norm + lm_head (the post-layer).

use super::*;

/// Final norm followed by the lm_head (possibly the tied embedding table).
///
/// # Shapes
/// - `lm_head`: `[vocab, hidden]`; `[R, hidden]` → `[R, vocab]`
#[derive(Debug, Clone)]
pub struct NormHead {
    pub norm: RmsNorm,
    pub lm_head: Tensor,
}

impl PostLayer for NormHead {
    fn weight_bytes(&self) -> usize {
        tensor_bytes(&self.lm_head) + self.norm.dim() * self.lm_head.dtype().size_in_bytes()
    }

    fn norm(&self, h: &Tensor) -> Result<Tensor> {
        self.norm.forward(h)
    }

    fn logits(&self, normed: &Tensor) -> Result<Tensor> {
        // f32 logits (the GEMM accumulates in f32; no final bf16 rounding).
        normed.matmul_t_to(&self.lm_head, DType::F32)
    }
}
