//! RMSNorm (standard and zero-centred).

use super::*;

/// RMSNorm over the last dimension (or over each head when applied to `[T, heads, d]`).
///
/// # Shapes
/// - `w`: `[d]` in the model dtype; input `[.., d]` → output `[.., d]` in the model dtype
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// The weight as stored (`w`, not `1 + w`, for zero-centred norms).
    pub w: Tensor,
    eps: f32,
    kind: NormKind,
}

impl RmsNorm {
    pub fn new(w: Tensor, eps: f32, kind: NormKind) -> Self {
        Self { w, eps, kind }
    }

    /// This norm as the backend's per-head norm argument ([`crate::backend::QkPrep`]).
    pub fn as_head(&self) -> crate::backend::HeadNorm<'_> {
        crate::backend::HeadNorm { w: &self.w, eps: self.eps, kind: self.kind }
    }

    pub fn dim(&self) -> usize {
        self.w.elem_count()
    }

    pub fn kind(&self) -> NormKind {
        self.kind
    }

    /// The output dtype.
    pub fn dtype(&self) -> DType {
        self.w.dtype()
    }

    pub fn eps(&self) -> f32 {
        self.eps
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.last_dim() != self.dim() {
            bail!(Shape, "rms_norm: input {:?} does not end in the norm width {}", x.shape(), self.dim());
        }
        ops(x).rms_norm(x, &self.w, self.eps, self.kind)
    }

    /// `x += y` (the f32 residual stream) and the norm of the sum, in one op.
    pub fn add_forward(&self, x: &mut Tensor, y: &Tensor) -> Result<Tensor> {
        if x.shape() != y.shape() || x.dtype() != DType::F32 || x.last_dim() != self.dim() {
            bail!(
                Shape,
                "add_rms_norm of {:?} {} and {:?} {} (norm width {})",
                x.shape(),
                x.dtype(),
                y.shape(),
                y.dtype(),
                self.dim()
            );
        }
        ops(x).add_rms_norm(x, y, &self.w, self.eps, self.kind)
    }

    /// `(norm(x), norm(x) · wᵀ)` with the product in `out` (`w`: `[n, d]`, a plain weight):
    /// one op where the backend fuses them ([`crate::backend::Ops::norm_matmul`]; decode on
    /// CUDA), else [`RmsNorm::forward`] and the product — the same values either way.
    pub fn forward_matmul(&self, x: &Tensor, w: &Tensor, out: DType) -> Result<(Tensor, Tensor)> {
        if x.last_dim() != self.dim() {
            bail!(Shape, "rms_norm: input {:?} does not end in the norm width {}", x.shape(), self.dim());
        }
        if let Some(r) = ops(x).norm_matmul(x, None, &self.w, self.eps, self.kind, w, out)? {
            return Ok((r.normed, r.out));
        }
        let h = self.forward(x)?;
        let y = h.matmul_t_to(w, out)?;
        Ok((h, y))
    }

    /// `x += y`, then `(norm(x), norm(x) · wᵀ)` as [`RmsNorm::forward_matmul`].
    pub fn add_forward_matmul(&self, x: &mut Tensor, y: &Tensor, w: &Tensor, out: DType) -> Result<(Tensor, Tensor)> {
        // (Shapes the fused op does not take — bad ones included — go the unfused way, whose
        // checks name the problem.)
        if let Some(r) = ops(x).norm_matmul(x, Some(y), &self.w, self.eps, self.kind, w, out)? {
            let Some(sum) = r.sum else { bail!(Internal, "norm_matmul with an add returned no sum") };
            *x = sum;
            return Ok((r.normed, r.out));
        }
        let h = self.add_forward(x, y)?;
        let p = h.matmul_t_to(w, out)?;
        Ok((h, p))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::tensor::CpuStorage;
    use half::bf16;

    #[test]
    fn standard_and_zero_centred_match_reference() {
        let mut rng = Rng::new(11);
        // [T, heads, d]: the norm runs over each head's d values.
        let x = rng.tensor(&[3, 2, 8], 2.0);
        for kind in [NormKind::Standard, NormKind::ZeroCentred] {
            let n = rng.norm(8, kind);
            let y = n.forward(&x).unwrap();
            assert_eq!((y.shape(), y.dtype()), (&[3, 2, 8][..], DType::F32));
            assert_tensor(&format!("{kind:?}"), &y, &rms_norm(&vals(&x), &n));
        }
        // Zero-centred `w` is standard `1 + w` (same f32 products).
        let zc = rng.norm(8, NormKind::ZeroCentred);
        let plus1: Vec<f32> = zc.w.data().iter().map(|w| 1.0 + w).collect();
        let st = RmsNorm::new(f32t(plus1, &[8]), zc.eps(), NormKind::Standard);
        assert_eq!(zc.forward(&x).unwrap().data(), st.forward(&x).unwrap().data());
    }

    /// bf16 weights: the standard norm rounds `x·inv` to bf16 before multiplying by `w` and
    /// rounds again; the zero-centred one computes `x·inv·(1 + w)` in f32 and rounds once.
    /// The f64 reference places the roundings the same way, so the outputs are equal except
    /// where a product falls within the f32-vs-f64 error (~1e-7 relative) of a bf16 rounding
    /// boundary (then 1 ulp). The other placements are checked to differ often, so the test
    /// sees a misplaced rounding.
    #[test]
    fn bf16_rounding_points() {
        let mut rng = Rng::new(12);
        let (r, d) = (4, 64);
        let x = rng.tensor(&[r, d], 3.0);
        let xv = vals(&x);
        let bf = |v: f64| f64::from(bf16::from_f64(v).to_f32());
        let ulp = |v: f64| 2f64.powf(v.abs().log2().floor() - 7.0);
        for kind in [NormKind::Standard, NormKind::ZeroCentred] {
            let base = if kind == NormKind::Standard { 1.0 } else { 0.0 };
            let w: Vec<bf16> = rng.vec(d, 0.5).into_iter().map(|v| bf16::from_f32(base + v)).collect();
            let wf: Vec<f64> = w.iter().map(|v| f64::from(v.to_f32())).collect();
            let n = RmsNorm::new(Tensor::from_host(CpuStorage::BF16(w), [d], DType::BF16).unwrap(), 1e-6, kind);
            let y = n.forward(&x).unwrap();
            assert_eq!(y.dtype(), DType::BF16);
            // The other placements: Standard rounding once; ZeroCentred rounding `x·inv`, or
            // `1 + w`, to bf16 first.
            let alternatives = if kind == NormKind::Standard { 1 } else { 2 };
            let (mut right, mut wrong) = (Vec::new(), vec![Vec::new(); alternatives]);
            for row in xv.chunks(d) {
                let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / d as f64 + 1e-6).sqrt();
                for (v, w) in row.iter().zip(&wf) {
                    let u = v * inv;
                    match kind {
                        NormKind::Standard => {
                            right.push(bf(w * bf(u)));
                            wrong[0].push(bf(u * w));
                        }
                        NormKind::ZeroCentred => {
                            right.push(bf(u * (1.0 + w)));
                            wrong[0].push(bf(bf(u) * (1.0 + w)));
                            wrong[1].push(bf(u * bf(1.0 + w)));
                        }
                    }
                }
            }
            let got = vals(&y);
            let off: Vec<usize> = (0..got.len()).filter(|&i| got[i] != right[i]).collect();
            assert!(off.len() <= got.len() / 100, "{kind:?}: {} of {} differ from the reference", off.len(), got.len());
            for &i in &off {
                assert!((got[i] - right[i]).abs() <= ulp(right[i]), "{kind:?} [{i}]: {} vs {}", got[i], right[i]);
            }
            for (j, wr) in wrong.iter().enumerate() {
                let diff = (0..got.len()).filter(|&i| wr[i] != right[i]).count();
                assert!(diff >= got.len() / 10, "{kind:?}: alternative {j} differs in only {diff} values");
            }
        }
    }

    #[test]
    fn add_forward_adds_into_the_stream_and_norms_the_sum() {
        let mut rng = Rng::new(13);
        let n = rng.norm(6, NormKind::ZeroCentred);
        let (x0, y) = (rng.tensor(&[3, 6], 1.0), rng.tensor(&[3, 6], 1.0));
        let mut x = x0.clone();
        let normed = n.add_forward(&mut x, &y).unwrap();
        let sum: Vec<f64> = vals(&x0).iter().zip(vals(&y)).map(|(a, b)| a + b).collect();
        assert_tensor("x + y", &x, &sum);
        assert_tensor("norm(x + y)", &normed, &rms_norm(&sum, &n));
    }

    #[test]
    fn shape_errors_are_errors() {
        let mut rng = Rng::new(14);
        let n = rng.norm(4, NormKind::Standard);
        assert!(is_shape(&n.forward(&rng.tensor(&[2, 5], 1.0))));
        // A last dimension that is a multiple of the width is still the wrong width.
        assert!(is_shape(&n.forward(&rng.tensor(&[2, 8], 1.0))));
        let mut x = rng.tensor(&[2, 4], 1.0);
        assert!(is_shape(&n.add_forward(&mut x, &rng.tensor(&[3, 4], 1.0))));
        let mut x16 = Tensor::from_vec(rng.vec(8, 1.0), [2, 4], DType::BF16).unwrap();
        assert!(is_shape(&n.add_forward(&mut x16, &rng.tensor(&[2, 4], 1.0))));
    }
}
