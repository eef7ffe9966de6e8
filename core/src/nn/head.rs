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

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::tensor::CpuStorage;
    use half::bf16;

    /// The final norm, then logits in f32 from a bf16 lm_head: the GEMM result is not
    /// rounded to bf16 (f32 accumulation of the exact bf16 values, vs the f64 reference).
    #[test]
    fn norm_then_f32_logits() {
        let mut rng = Rng::new(81);
        let (vocab, hidden) = (11, 6);
        let w: Vec<bf16> = rng.vec(vocab * hidden, 0.5).into_iter().map(bf16::from_f32).collect();
        let lm = Tensor::from_host(CpuStorage::BF16(w), [vocab, hidden], DType::BF16).unwrap();
        let head = NormHead { norm: rng.norm(hidden, NormKind::ZeroCentred), lm_head: Arc::new(lm) };
        let h = rng.tensor(&[3, hidden], 2.0);
        let normed = head.norm(&h).unwrap();
        assert_tensor("final norm", &normed, &rms_norm(&vals(&h), &head.norm));
        let logits = head.logits(&normed).unwrap();
        assert_eq!((logits.shape(), logits.dtype()), (&[3, vocab][..], DType::F32));
        let want = matmul_t(&vals(&normed), &vals(&head.lm_head), vocab, hidden);
        assert_tensor("logits", &logits, &want);
        let rounded = logits.data().iter().filter(|&&v| DType::BF16.round(v) == v).count();
        assert!(rounded < logits.elem_count() / 2, "{rounded} logits are bf16 values: rounded output?");
        assert_eq!(head.weight_bytes(), vocab * hidden * 2 + hidden * 4);
    }

    #[test]
    fn shape_errors_are_errors() {
        let mut rng = Rng::new(82);
        let head = NormHead { norm: rng.norm(4, NormKind::Standard), lm_head: Arc::new(rng.tensor(&[7, 4], 1.0)) };
        assert!(is_shape(&head.norm(&rng.tensor(&[2, 5], 1.0))));
        assert!(is_shape(&head.logits(&rng.tensor(&[2, 5], 1.0))));
    }
}
