//! `Linear`: `y = x·Wᵀ + b`.

use super::*;

/// `y = x·Wᵀ + b`.
///
/// # Shapes
/// - `w`: `[out, in]`, `b`: `[out]`
/// - input `[.., in]` → output `[.., out]`
#[derive(Debug, Clone)]
pub struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
}

impl Linear {
    pub fn new(w: Tensor, b: Option<Tensor>) -> Self {
        Self { w, b }
    }

    pub fn out_features(&self) -> usize {
        self.w.dim(0)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.matmul_t(&self.w)?;
        if y.is_cuda() {
            if let Some(b) = &self.b {
                crate::backend::cuda::blocks::add_bias(&mut y, b)?;
            }
            return Ok(y);
        }
        if let Some(b) = &self.b {
            let n = b.elem_count();
            let dt = y.dtype();
            let bd = b.data();
            ops::for_each_row(y.data_mut(), n, |_, r| {
                for (v, bb) in r.iter_mut().zip(bd) {
                    *v = dt.round(*v + bb);
                }
            });
        }
        Ok(y)
    }
}

/// Bytes of a weight tensor in its dtype.
pub fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

impl Linear {
    /// Weight (and bias) bytes.
    pub fn bytes(&self) -> usize {
        tensor_bytes(&self.w) + self.b.as_ref().map_or(0, tensor_bytes)
    }
}
