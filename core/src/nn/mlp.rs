//! The SwiGLU MLP.

use super::*;

/// `down(silu(gate(x)) · up(x))`, with `gate` and `up` packed into one projection at load.
///
/// # Shapes
/// - `gate_up`: `[2·inter, hidden]` = `[gate; up]` (biases `[2·inter]` likewise), `down`: `[hidden, inter]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct SwiGlu {
    pub gate_up: Linear,
    pub down: Linear,
}

impl SwiGlu {
    /// The intermediate size.
    pub fn inter(&self) -> usize {
        self.gate_up.out_features() / 2
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // [T, H] -> [T, 2I] = [gate | up] -> [T, I] (one rounding of silu(g)·u) -> [T, H]
        let gu = self.gate_up.forward(x)?;
        let h = ops(&gu).swiglu(&gu)?;
        self.down.forward(&h)
    }

    /// Weight bytes.
    pub fn bytes(&self) -> usize {
        self.gate_up.bytes() + self.down.bytes()
    }
}
