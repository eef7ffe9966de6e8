//! The SwiGLU MLP.

use super::*;

/// `down(silu(gate(x)) · up(x))`.
///
/// # Shapes
/// - `gate`, `up`: `[inter, hidden]`, `down`: `[hidden, inter]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct SwiGlu {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    /// On a CUDA device: `[gate; up]` stacked (`[2·inter, hidden]`), one GEMM for both.
    pub gate_up: Option<Tensor>,
}

impl SwiGlu {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.is_cuda() {
            return crate::backend::cuda::blocks::swiglu(self, x);
        }
        let g = self.gate.forward(x)?;
        let mut u = self.up.forward(x)?;
        let dt = u.dtype();
        // Fused activation: one rounding of silu(g)·u.
        for (uv, gv) in u.data_mut().iter_mut().zip(g.data()) {
            *uv = dt.round(ops::silu(*gv) * *uv);
        }
        self.down.forward(&u)
    }
}
