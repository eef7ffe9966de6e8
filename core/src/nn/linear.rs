//! `Linear`: `y = x·Wᵀ + b`.

use super::*;

/// `y = x·Wᵀ + b`. A row-parallel shard (tensor parallelism: `w` holds this rank's input
/// columns) sums the ranks' partial products with `reduce` before the bias is added once.
///
/// # Shapes
/// - `w`: `[out, in]`, `b`: `[out]`
/// - input `[.., in]` → output `[.., out]`
#[derive(Debug, Clone)]
pub struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
    pub reduce: Option<Arc<dyn Communicator>>,
}

impl Linear {
    pub fn new(w: Tensor, b: Option<Tensor>) -> Self {
        Self { w, b, reduce: None }
    }

    pub fn out_features(&self) -> usize {
        self.w.dim(0)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.matmul_t(&self.w)?;
        if let Some(c) = &self.reduce {
            c.all_reduce_sum(&mut y)?;
        }
        if let Some(b) = &self.b {
            ops(&y).add_bias(&mut y, b)?;
        }
        Ok(y)
    }

    /// `(norm(x), self.forward(norm(x)))`: the norm fused into the product where the backend
    /// can ([`RmsNorm::forward_matmul`]); a row-parallel shard (`reduce`, whose input is a
    /// slice of columns, not a whole row to normalise) never takes this path's fusion.
    pub fn forward_normed(&self, x: &Tensor, norm: &RmsNorm) -> Result<(Tensor, Tensor)> {
        if self.reduce.is_some() {
            let h = norm.forward(x)?;
            let y = self.forward(&h)?;
            return Ok((h, y));
        }
        let (h, mut y) = norm.forward_matmul(x, &self.w, self.w.dtype())?;
        if let Some(b) = &self.b {
            ops(&y).add_bias(&mut y, b)?;
        }
        Ok((h, y))
    }

    /// `x += y`, then `(norm(x), self.forward(norm(x)))` as [`Linear::forward_normed`].
    pub fn forward_add_normed(&self, x: &mut Tensor, y: &Tensor, norm: &RmsNorm) -> Result<(Tensor, Tensor)> {
        if self.reduce.is_some() {
            let h = norm.add_forward(x, y)?;
            let p = self.forward(&h)?;
            return Ok((h, p));
        }
        let (h, mut p) = norm.add_forward_matmul(x, y, &self.w, self.w.dtype())?;
        if let Some(b) = &self.b {
            ops(&p).add_bias(&mut p, b)?;
        }
        Ok((h, p))
    }

    /// Weight (and bias) bytes.
    pub fn bytes(&self) -> usize {
        self.w.bytes() + self.b.as_ref().map_or(0, Tensor::bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::tensor::CpuStorage;
    use half::{bf16, f16};

    #[test]
    fn matches_reference_with_and_without_bias() {
        let mut rng = Rng::new(1);
        for bias in [false, true] {
            let l = rng.linear(5, 7, bias);
            // [2, 3, 7]: leading dims are kept.
            let x = rng.tensor(&[2, 3, 7], 1.0);
            let y = l.forward(&x).unwrap();
            assert_eq!(y.shape(), &[2, 3, 5]);
            assert_eq!(y.dtype(), DType::F32);
            assert_tensor(&format!("linear bias={bias}"), &y, &linear(&vals(&x), &l));
        }
    }

    /// Half-precision host weights give exactly what `f32` storage of the same rounded
    /// values gives: without a bias the half-weight output is the f32-weight output
    /// rounded once to the weight dtype; with a bias it is bit-identical to f32 storage
    /// tagged with that dtype (the GEMM output and the bias add each rounded).
    #[test]
    fn half_host_weights_equal_f32_weights_of_the_same_values() {
        let mut rng = Rng::new(2);
        for dt in [DType::BF16, DType::F16] {
            // 3 rows take the per-row widening path, 9 rows the blocked one.
            for m in [3, 9] {
                let (n, k) = (6, 20);
                let w: Vec<f32> = rng.vec(n * k, 0.5).into_iter().map(|v| dt.round(v)).collect();
                let b: Vec<f32> = rng.vec(n, 0.5).into_iter().map(|v| dt.round(v)).collect();
                let host = |v: &[f32], shape: &[usize]| {
                    let s = match dt {
                        DType::BF16 => CpuStorage::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
                        _ => CpuStorage::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
                    };
                    Tensor::from_host(s, shape.to_vec(), dt).unwrap()
                };
                let x = rng.tensor(&[m, k], 1.0);
                let half = Linear::new(host(&w, &[n, k]), None).forward(&x).unwrap();
                let full = Linear::new(f32t(w.clone(), &[n, k]), None).forward(&x).unwrap();
                assert_eq!(half.dtype(), dt);
                let want: Vec<f32> = full.data().iter().map(|&v| dt.round(v)).collect();
                assert_eq!(half.host_vec().unwrap(), want, "{dt} m={m}: half weights vs f32 weights");
                // The f32-weight result itself against the naive reference.
                let l32 = Linear::new(f32t(w.clone(), &[n, k]), None);
                assert_tensor(&format!("{dt} f32 weights"), &full, &linear(&vals(&x), &l32));

                let hb = Linear::new(host(&w, &[n, k]), Some(host(&b, &[n]))).forward(&x).unwrap();
                let tagged = |v: &[f32], s: &[usize]| Tensor::from_vec(v.to_vec(), s.to_vec(), dt).unwrap();
                let fb = Linear::new(tagged(&w, &[n, k]), Some(tagged(&b, &[n]))).forward(&x).unwrap();
                assert_eq!(hb.host_vec().unwrap(), fb.host_vec().unwrap(), "{dt} m={m}: with bias");
            }
        }
    }

    #[test]
    fn shape_errors_are_errors() {
        let mut rng = Rng::new(3);
        let l = rng.linear(4, 6, false);
        assert!(is_shape(&l.forward(&rng.tensor(&[2, 5], 1.0))));
        let bad_bias = Linear::new(rng.tensor(&[4, 6], 1.0), Some(rng.tensor(&[3], 1.0)));
        assert!(is_shape(&bad_bias.forward(&rng.tensor(&[2, 6], 1.0))));
        assert_eq!(l.out_features(), 4);
        assert_eq!(l.bytes(), 4 * 6 * 4);
    }
}
