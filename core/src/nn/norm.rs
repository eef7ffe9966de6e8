//! RMSNorm (standard and zero-centred).

use super::*;

/// Which RMSNorm formula a norm uses (models.md §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// Llama style: `w · round(x·rsqrt(mean(x²)+eps))` (Qwen3, Qwen3-MoE, Mistral).
    Standard,
    /// Zero-centred: `x·rsqrt(mean(x²)+eps)·(1+w)`, all f32, one rounding (Qwen3-Next).
    ZeroCentred,
}

/// RMSNorm over the last dimension (or over each head when applied to `[T, heads, d]`).
///
/// # Shapes
/// - `w`: `[d]`; input `[.., d]` → output `[.., d]`
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// The effective multiplier (`1 + w` in f32 for zero-centred norms).
    scale: Vec<f32>,
    eps: f32,
    kind: NormKind,
    /// Output dtype (the model's compute dtype; the input may be the f32 residual stream).
    dtype: DType,
    /// The weight as stored (`w`, not `1 + w`) on the device, for CUDA inputs.
    w_dev: Option<Tensor>,
}

impl RmsNorm {
    /// A norm with weight `w` (on the CPU or a CUDA device).
    pub fn new(w: Tensor, eps: f32, kind: NormKind) -> Self {
        let dtype = w.dtype();
        // (A failed device copy leaves `w_dev` empty: the forward then reports it.)
        let w_dev = if w.is_cuda() { w.try_clone().ok() } else { None };
        let scale = match kind {
            NormKind::Standard => w.into_vec(),
            NormKind::ZeroCentred => w.into_vec().into_iter().map(|v| 1.0 + v).collect(),
        };
        Self { scale, eps, kind, dtype, w_dev }
    }

    pub fn dim(&self) -> usize {
        self.scale.len()
    }

    pub fn kind(&self) -> NormKind {
        self.kind
    }

    /// The output dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The weight on the device (CUDA models).
    pub fn device_weight(&self) -> Option<&Tensor> {
        self.w_dev.as_ref()
    }

    pub fn eps(&self) -> f32 {
        self.eps
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.is_cuda() {
            let w = self.w_dev.as_ref().ok_or_else(|| crate::err!(Internal, "RMSNorm weight is not on the device"))?;
            return crate::backend::cuda::blocks::rms_norm(self, w, x);
        }
        let d = self.scale.len();
        if d == 0 || !x.elem_count().is_multiple_of(d) {
            bail!(Shape, "rms_norm: input {:?} is not a multiple of the norm width {d}", x.shape());
        }
        let mut y = x.clone().to_dtype(DType::F32);
        let dt = self.dtype;
        let (scale, eps, kind) = (&self.scale, self.eps, self.kind);
        ops::for_each_row(y.data_mut(), d, |_, r| {
            let inv = ops::rms_inv(r, eps);
            match kind {
                NormKind::Standard => {
                    for (v, w) in r.iter_mut().zip(scale) {
                        *v = dt.round(w * dt.round(*v * inv));
                    }
                }
                NormKind::ZeroCentred => {
                    for (v, w) in r.iter_mut().zip(scale) {
                        *v = dt.round(*v * inv * w);
                    }
                }
            }
        });
        Ok(y.to_dtype(dt))
    }
}
