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
}
