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
        if let Some(b) = &self.b {
            ops(&y).add_bias(&mut y, b)?;
        }
        Ok(y)
    }

    /// Weight (and bias) bytes.
    pub fn bytes(&self) -> usize {
        self.w.bytes() + self.b.as_ref().map_or(0, Tensor::bytes)
    }
}

/// Bytes of a weight tensor in its dtype.
pub fn tensor_bytes(t: &Tensor) -> usize {
    t.bytes()
}
