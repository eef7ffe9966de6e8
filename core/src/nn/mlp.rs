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

    /// `res += y`, then [`SwiGlu::forward`] of `norm(res)`, the add and norm fused into
    /// `gate_up` where the backend can ([`Linear::forward_add_normed`]).
    pub fn forward_add(&self, res: &mut Tensor, y: &Tensor, norm: &RmsNorm) -> Result<Tensor> {
        let (_, gu) = self.gate_up.forward_add_normed(res, y, norm)?;
        let h = ops(&gu).swiglu(&gu)?;
        self.down.forward(&h)
    }

    /// Weight bytes.
    pub fn bytes(&self) -> usize {
        self.gate_up.bytes() + self.down.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn packed_gate_up_with_and_without_biases_matches_reference() {
        let mut rng = Rng::new(41);
        let (hidden, inter) = (6, 5);
        for bias in [false, true] {
            let m = SwiGlu { gate_up: rng.linear(2 * inter, hidden, bias), down: rng.linear(hidden, inter, bias) };
            assert_eq!(m.inter(), inter);
            let x = rng.tensor(&[4, hidden], 1.5);
            let y = m.forward(&x).unwrap();
            assert_eq!(y.shape(), &[4, hidden]);
            assert_tensor(&format!("swiglu bias={bias}"), &y, &swiglu(&vals(&x), &m));
        }
    }

    /// The packing is `[gate; up]`: swapping the halves changes the result.
    #[test]
    fn gate_is_the_first_half() {
        let mut rng = Rng::new(42);
        let m = SwiGlu { gate_up: rng.linear(6, 4, false), down: rng.linear(4, 3, false) };
        let w = m.gate_up.w.data();
        let swapped = [&w[12..], &w[..12]].concat();
        let s = SwiGlu { gate_up: Linear::new(f32t(swapped, &[6, 4]), None), down: m.down.clone() };
        let x = rng.tensor(&[2, 4], 3.0);
        let (a, b) = (vals(&m.forward(&x).unwrap()), vals(&s.forward(&x).unwrap()));
        let d = a.iter().zip(&b).fold(0.0f64, |d, (a, b)| d.max((a - b).abs()));
        assert!(d > 0.05 * a.iter().fold(0.0f64, |m, v| m.max(v.abs())), "max|Δ| = {d}");
        assert_tensor("swiglu", &m.forward(&x).unwrap(), &swiglu(&vals(&x), &m));
    }

    #[test]
    fn shape_errors_are_errors() {
        let mut rng = Rng::new(43);
        let m = SwiGlu { gate_up: rng.linear(8, 6, true), down: rng.linear(6, 4, true) };
        assert!(is_shape(&m.forward(&rng.tensor(&[3, 5], 1.0))));
        assert_eq!(m.bytes(), (8 * 6 + 8 + 6 * 4 + 6) * 4);
    }
}
