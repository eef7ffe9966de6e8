//! The gated MLP (SwiGLU for the default `hidden_act`).

use super::*;

/// `down(act(gate(x)) · up(x))`, with `gate` and `up` packed into one projection at load;
/// `act` is the config's `hidden_act` (SiLU: SwiGLU, what every released model of porter
/// uses; others run on the CPU backend only).
///
/// # Shapes
/// - `gate_up`: `[2·inter, hidden]` = `[gate; up]` (biases `[2·inter]` likewise), `down`: `[hidden, inter]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct SwiGlu {
    pub gate_up: Linear,
    pub down: Linear,
    /// The gate activation (`hidden_act`).
    pub act: Act,
}

impl SwiGlu {
    /// The intermediate size.
    pub fn inter(&self) -> usize {
        self.gate_up.out_features() / 2
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // [T, H] -> [T, 2I] = [gate | up] -> [T, I] (one rounding of act(g)·u) -> [T, H]
        let gu = self.gate_up.forward(x)?;
        let h = ops(&gu).swiglu(&gu, self.act)?;
        self.down.forward(&h)
    }

    /// `res += y`, then [`SwiGlu::forward`] of `norm(res)`, the add and norm fused into
    /// `gate_up` where the backend can ([`Linear::forward_add_normed`]).
    pub fn forward_add(&self, res: &mut Tensor, y: &Tensor, norm: &RmsNorm) -> Result<Tensor> {
        let (_, gu) = self.gate_up.forward_add_normed(res, y, norm)?;
        let h = ops(&gu).swiglu(&gu, self.act)?;
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
            let m = SwiGlu {
                gate_up: rng.linear(2 * inter, hidden, bias),
                down: rng.linear(hidden, inter, bias),
                act: Act::Silu,
            };
            assert_eq!(m.inter(), inter);
            let x = rng.tensor(&[4, hidden], 1.5);
            let y = m.forward(&x).unwrap();
            assert_eq!(y.shape(), &[4, hidden]);
            assert_tensor(&format!("swiglu bias={bias}"), &y, &swiglu(&vals(&x), &m));
        }
    }

    /// Every `hidden_act` against the f64 reference `down(act(gate·x) · up·x)`; the gate's
    /// activation is really applied (silu and gelu give different outputs).
    #[test]
    fn every_activation_matches_reference() {
        let mut rng = Rng::new(44);
        let (hidden, inter) = (6, 5);
        let m = SwiGlu {
            gate_up: rng.linear(2 * inter, hidden, true),
            down: rng.linear(hidden, inter, true),
            act: Act::Silu,
        };
        // Gate pre-activations of several units: every branch of relu6 / hardswish is met.
        let x = rng.tensor(&[4, hidden], 4.0);
        let silu = vals(&m.forward(&x).unwrap());
        for act in Act::ALL {
            let m = SwiGlu { act, ..m.clone() };
            let y = m.forward(&x).unwrap();
            assert_tensor(&format!("gated MLP {act}"), &y, &swiglu(&vals(&x), &m));
            if !act.is_silu() {
                let d = vals(&y).iter().zip(&silu).fold(0.0f64, |d, (a, b)| d.max((a - b).abs()));
                assert!(d > 1e-3, "{act} gives the silu output (max|Δ| {d})");
            }
        }
    }

    /// The packing is `[gate; up]`: swapping the halves changes the result.
    #[test]
    fn gate_is_the_first_half() {
        let mut rng = Rng::new(42);
        let m = SwiGlu { gate_up: rng.linear(6, 4, false), down: rng.linear(4, 3, false), act: Act::Silu };
        let w = m.gate_up.w.data();
        let swapped = [&w[12..], &w[..12]].concat();
        let s = SwiGlu { gate_up: Linear::new(f32t(swapped, &[6, 4]), None), down: m.down.clone(), act: Act::Silu };
        let x = rng.tensor(&[2, 4], 3.0);
        let (a, b) = (vals(&m.forward(&x).unwrap()), vals(&s.forward(&x).unwrap()));
        let d = a.iter().zip(&b).fold(0.0f64, |d, (a, b)| d.max((a - b).abs()));
        assert!(d > 0.05 * a.iter().fold(0.0f64, |m, v| m.max(v.abs())), "max|Δ| = {d}");
        assert_tensor("swiglu", &m.forward(&x).unwrap(), &swiglu(&vals(&x), &m));
    }

    #[test]
    fn shape_errors_are_errors() {
        let mut rng = Rng::new(43);
        let m = SwiGlu { gate_up: rng.linear(8, 6, true), down: rng.linear(6, 4, true), act: Act::Silu };
        assert!(is_shape(&m.forward(&rng.tensor(&[3, 5], 1.0))));
        assert_eq!(m.bytes(), (8 * 6 + 8 + 6 * 4 + 6) * 4);
    }
}
