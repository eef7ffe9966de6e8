//! Sparse mixture of experts with an optional shared expert.

use super::*;
use crate::backend::{MoeShared, SharedIn};

/// The shared expert of Qwen3-Next MoE blocks: `sigmoid(x·g) · down(act(gate·x) · up·x)`
/// (the MoE's `act`). Its gate / up projections and its gate row live in the MoE's packed
/// input projection.
#[derive(Debug, Clone)]
pub struct SharedExpert {
    /// Intermediate size `I_s`.
    pub inter: usize,
    /// `[hidden, I_s]`
    pub down: Linear,
}

/// The load pads a dense MoE input projection with zero rows up to a multiple of this
/// (see [`Moe`]'s `input`).
pub const MOE_INPUT_ROW_ALIGN: usize = 8;

/// Sparse mixture of experts: softmax router → top-k → optional renormalisation, experts
/// evaluated on the rows routed to them (grouped by expert), plus an optional shared expert.
/// Every expert (and the shared expert) is `down(act(gate·x) · up·x)` with the config's
/// `hidden_act`.
///
/// # Shapes
/// - `input`: `[E + 2·I_s + 1, hidden]` = `[router; shared gate; shared up; shared expert
///   gate]` packed at load (just `[E, hidden]`, the router, without a shared expert): one
///   f32-output GEMM serves all four. With `shared_in` (an FP8 shared expert next to a bf16
///   router) `input` is `[router; shared expert gate]` (`[E + 1, hidden]`) and `shared_in`
///   `[shared gate; shared up]` (`[2·I_s, hidden]`). A dense `input` may carry zero rows
///   after these, up to a multiple of [`MOE_INPUT_ROW_ALIGN`] (the load pads it: an odd
///   width of the f32 product, 1,537 columns at the 80B shapes, makes cuBLAS take its
///   unaligned kernels); every reader of the product takes its columns by position and its
///   row stride from its width, so the pad columns are never read
/// - `gate`, `up`: `[E, inter, hidden]`, `down`: `[E, hidden, inter]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct Moe {
    pub input: Tensor,
    /// The shared expert's `[gate; up]` when held apart from `input`.
    pub shared_in: Option<Tensor>,
    pub experts: usize,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub shared: Option<SharedExpert>,
    /// Tensor parallelism: every expert (and the shared expert) holds this rank's slice of
    /// the intermediate size; the ranks' partial outputs are summed once, at the end.
    pub reduce: Option<Arc<dyn Communicator>>,
    /// The gate activation of the experts and the shared expert (`hidden_act`).
    pub act: Act,
}

impl Moe {
    pub fn check(&self) -> Result<()> {
        let e = self.experts;
        if self.top_k == 0 || self.top_k > e {
            bail!(Config, "num_experts_per_tok = {} must be in 1..={e}", self.top_k);
        }
        if self.gate.dim(0) != e || self.up.dim(0) != e || self.down.dim(0) != e {
            bail!(Shape, "expert count of the weights does not match the router ({e})");
        }
        let rows = e + self.shared.as_ref().map_or(0, |s| 2 * s.inter + 1);
        let apart = self.shared_in.as_ref().map_or(0, |t| t.dim(0));
        // The input's own rows, then (dense) its zero pad.
        let own = rows.saturating_sub(apart);
        let padded = self.input.dim(0) == own.next_multiple_of(MOE_INPUT_ROW_ALIGN) && !self.input.is_fp8();
        if (self.input.dim(0) != own && !padded)
            || apart > rows
            || (apart != 0 && self.shared.as_ref().is_none_or(|s| apart != 2 * s.inter))
        {
            bail!(Shape, "MoE input projection has {} rows, expected {rows}", self.input.dim(0));
        }
        Ok(())
    }

    fn args(&self) -> MoeArgs {
        MoeArgs {
            experts: self.experts,
            top_k: self.top_k,
            norm_topk_prob: self.norm_topk_prob,
            shared: self.shared.is_some(),
            act: self.act,
        }
    }

    /// Router: per row, the top-k `(expert, weight)` pairs.
    pub fn route(&self, x: &Tensor) -> Result<Vec<Vec<(usize, f32)>>> {
        // Router logits stay in f32 (no bf16 rounding of the scores that pick experts):
        // near-ties between experts are decided as the f32 model decides them.
        let logits = x.matmul_t_to(&self.input, DType::F32)?.to_host()?;
        crate::backend::cpu::route(&logits, &self.args())
    }

    /// The shared expert as `Ops::moe_experts` may fuse it: its gate / up columns in `all`,
    /// or (held apart) the weight `shared_in` for the backend to multiply; `all` its gate
    /// logit. `None` without a shared expert, or when its down projection is not a plain one
    /// (a bias, or a reduction of its own).
    fn shared_arg<'a>(&'a self, all: &'a Tensor) -> Option<MoeShared<'a>> {
        let s = self.shared.as_ref().filter(|s| s.down.b.is_none() && s.down.reduce.is_none())?;
        let gu = match &self.shared_in {
            Some(si) => SharedIn::Weights(si),
            None => SharedIn::Cols { gu: all, col0: self.experts },
        };
        Some(MoeShared { gu, gate: all, gate_col: self.shared_gate_col(s), down: &s.down.w, inter: s.inter })
    }

    /// The column of the shared expert gate logit in the input product: right after the
    /// router's when the gate / up rows are held apart (`shared_in`), else after those too.
    fn shared_gate_col(&self, s: &SharedExpert) -> usize {
        self.experts + if self.shared_in.is_some() { 0 } else { 2 * s.inter }
    }

    /// The shared expert's gate / up columns: in `all` after the router, or (held apart) the
    /// `[T, 2·I_s]` f32 product `gu` of their own, read in place (no concatenation); and the
    /// column of its gate logit in `all`. Returns `(matrix, first gate column, gate logit
    /// column)`.
    fn shared_cols<'a>(&self, s: &SharedExpert, all: &'a Tensor, gu: Option<&'a Tensor>) -> (&'a Tensor, usize, usize) {
        let (m, col0) = match gu {
            Some(gu) => (gu, 0),
            None => (all, self.experts),
        };
        (m, col0, self.shared_gate_col(s))
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // [T, H] -> [T, E + 2·I_s + 1] f32: router logits, shared gate/up, shared gate logit
        // (with `shared_in`: [T, E + 1], router logits and the gate logit, and the shared
        // gate / up apart, [T, 2·I_s]).
        let all = x.matmul_t_to(&self.input, DType::F32)?;
        self.experts_of(x, all)
    }

    /// `res += y`, then [`Moe::forward`] of `norm(res)`, the add and norm fused into the input
    /// product where the backend can ([`RmsNorm::add_forward_matmul`]).
    pub fn forward_add(&self, res: &mut Tensor, y: &Tensor, norm: &RmsNorm) -> Result<Tensor> {
        let (x, all) = norm.add_forward_matmul(res, y, &self.input, DType::F32)?;
        self.experts_of(&x, all)
    }

    /// The block after its input product `all` of the (normalised) input `x`.
    fn experts_of(&self, x: &Tensor, all: Tensor) -> Result<Tensor> {
        let o = ops(x);
        // [T, H] f32; the router reads the first E columns of `all`, whatever its width. The
        // backend may add the shared expert in the same kernels (`fused`; with `shared_in`,
        // its gate / up products too).
        let shared = self.shared_arg(&all);
        let (mut y, fused) = o.moe_experts(x, &all, &self.args(), &self.gate, &self.up, &self.down, shared.as_ref())?;
        if let Some(s) = self.shared.as_ref().filter(|_| !fused) {
            // [T, 2·I_s] f32 when the gate / up rows are held apart
            let gu = self.shared_in.as_ref().map(|si| x.matmul_t_to(si, DType::F32)).transpose()?;
            let (gu, col0, gate_col) = self.shared_cols(s, &all, gu.as_ref());
            // [T, I_s] in the model dtype, then [T, H]
            let h = o.swiglu_cols(gu, col0, s.inter, x.dtype(), self.act)?;
            let so = s.down.forward(&h)?;
            o.shared_expert_add(&mut y, &so, &all, gate_col)?;
        }
        if let Some(c) = &self.reduce {
            c.all_reduce_sum(&mut y)?;
        }
        // [T, H] f32, into the residual stream (see `Ops::moe_experts` on rounding).
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    const H: usize = 8;
    const I: usize = 5;

    fn block(rng: &mut Rng, e: usize, top_k: usize, renorm: bool, shared: Option<usize>) -> Moe {
        moe_block(rng, H, I, e, top_k, renorm, shared)
    }

    #[test]
    fn top_k_with_and_without_renormalisation_matches_reference() {
        let mut rng = Rng::new(51);
        for renorm in [false, true] {
            for k in [1, 2, 6] {
                let m = block(&mut rng, 6, k, renorm, None);
                let x = rng.tensor(&[5, H], 1.0);
                assert_tensor(&format!("top-{k} renorm {renorm}"), &m.forward(&x).unwrap(), &moe(&vals(&x), &m));
                // The router's weights: softmax over all experts, then top-k (models.md pitfall 7).
                let logits = matmul_t(&vals(&x), &vals(&m.input), 6, H);
                for (r, sel) in m.route(&x).unwrap().iter().enumerate() {
                    let want = top_k(&logits[r * 6..(r + 1) * 6], k, renorm);
                    assert_eq!(
                        sel.iter().map(|s| s.0).collect::<Vec<_>>(),
                        want.iter().map(|s| s.0).collect::<Vec<_>>()
                    );
                    let (g, w): (Vec<f32>, Vec<f64>) = sel.iter().zip(&want).map(|(s, w)| (s.1, w.1)).unzip();
                    assert_close("routing weights", &g, &w, TOL);
                }
            }
        }
    }

    /// Input rows `[router (E); shared gate (I_s); shared up (I_s); shared gate row (1)]`.
    #[test]
    fn shared_expert_from_the_packed_input_matches_reference() {
        let mut rng = Rng::new(52);
        for renorm in [false, true] {
            let m = block(&mut rng, 4, 2, renorm, Some(3));
            let x = rng.tensor(&[6, H], 1.0);
            assert_tensor(&format!("shared, renorm {renorm}"), &m.forward(&x).unwrap(), &moe(&vals(&x), &m));
        }
    }

    /// Router logits with exact ties (values on a 1/4 grid, so every f32 product and sum is
    /// exact): the lower expert index wins, in `route` and in `forward`, which differs from
    /// what the higher index would give.
    #[test]
    fn ties_go_to_the_lower_index() {
        let mut rng = Rng::new(53);
        let mut m = block(&mut rng, 5, 2, true, None);
        let mut router = vec![0.0f32; 5 * H];
        // Experts 2 and 4 share a router row.
        for (e, row) in [(0, [1.0, 0.0]), (1, [0.25, 0.0]), (2, [0.5, 0.5]), (3, [0.0, 0.0]), (4, [0.5, 0.5])] {
            router[e * H..e * H + 2].copy_from_slice(&row);
        }
        m.input = f32t(router, &[5, H]);
        let mut xv = vec![0.0f32; 2 * H];
        // Row 0: logits [1, 0.25, 0.75, 0, 0.75] → top-2 = {0, tie 2|4}. Row 1: [0, 0, 1, 0, 1].
        xv[..2].copy_from_slice(&[1.0, 0.5]);
        xv[H..H + 2].copy_from_slice(&[0.0, 2.0]);
        let x = f32t(xv, &[2, H]);
        let picked: Vec<Vec<usize>> = m.route(&x).unwrap().iter().map(|r| r.iter().map(|s| s.0).collect()).collect();
        assert_eq!(picked, vec![vec![0, 2], vec![2, 4]]);
        assert_tensor("ties", &m.forward(&x).unwrap(), &moe(&vals(&x), &m));
        m.top_k = 1;
        assert_eq!(m.route(&x).unwrap()[1][0].0, 2);
        let y = m.forward(&x).unwrap();
        assert_tensor("tie at the top", &y, &moe(&vals(&x), &m));
        let higher = moe_with(&vals(&x), &m, &|l| {
            let mut s = top_k(l, 1, true);
            if s[0].0 == 2 {
                s[0].0 = 4;
            }
            s
        });
        let d = y.data()[H..].iter().zip(&higher[H..]).fold(0.0f64, |m, (a, b)| m.max((f64::from(*a) - b).abs()));
        assert!(d > 1e-3, "experts 2 and 4 give the same output ({d}): the tie test would not see a wrong pick");
    }

    /// The shared expert is offered to the backend for fusion only with a plain down
    /// projection, with its columns where `forward` reads them (packed or apart); the CPU
    /// backend never fuses.
    #[test]
    fn shared_expert_is_offered_only_with_a_plain_down_projection() {
        let mut rng = Rng::new(55);
        let mut m = block(&mut rng, 4, 2, true, Some(3));
        let x = rng.tensor(&[2, H], 1.0);
        let all = x.matmul_t_to(&m.input, DType::F32).unwrap();
        let s = m.shared_arg(&all).expect("a plain shared expert is offered");
        assert!(matches!(s.gu, SharedIn::Cols { gu, col0: 4 } if gu.shape() == all.shape()));
        assert_eq!((s.gate_col, s.inter), (4 + 2 * 3, 3));
        let (_, fused) = ops(&x).moe_experts(&x, &all, &m.args(), &m.gate, &m.up, &m.down, Some(&s)).unwrap();
        assert!(!fused, "the CPU backend leaves the shared expert to the caller");
        // Held apart: the weight is offered, the gate logit right after the router's.
        let mut apart = block(&mut Rng::new(55), 4, 2, true, Some(3));
        let rows = apart.input.dim(0);
        apart.shared_in = Some(apart.input.narrow_rows(4, 6).unwrap());
        let gate_row = apart.input.narrow_rows(rows - 1, 1).unwrap();
        apart.input = Tensor::concat_rows(&[&apart.input.narrow_rows(0, 4).unwrap(), &gate_row]).unwrap();
        apart.check().unwrap();
        let all_a = x.matmul_t_to(&apart.input, DType::F32).unwrap();
        let s = apart.shared_arg(&all_a).expect("apart");
        assert!(matches!(s.gu, SharedIn::Weights(w) if w.shape() == [6, H]));
        assert_eq!((s.gate_col, s.gate.shape()), (4, all_a.shape()));
        assert_tensor("shared apart", &apart.forward(&x).unwrap(), &moe(&vals(&x), &m));
        let sh = m.shared.as_mut().unwrap();
        sh.down.b = Some(rng.tensor(&[H], 1.0));
        assert!(m.shared_arg(&all).is_none(), "a biased down projection runs unfused");
        assert_tensor("shared with a bias", &m.forward(&x).unwrap(), &moe(&vals(&x), &m));
    }

    /// Non-SiLU experts and shared expert (`hidden_act` = gelu, relu2, …) against the f64
    /// reference; the activation changes the output.
    #[test]
    fn activations_of_experts_and_shared_expert_match_reference() {
        let mut rng = Rng::new(56);
        let silu = block(&mut rng, 5, 2, true, Some(3));
        let x = rng.tensor(&[6, H], 1.5);
        let y_silu = vals(&silu.forward(&x).unwrap());
        for act in [Act::Gelu, Act::GeluPytorchTanh, Act::Relu2, Act::QuickGelu, Act::Tanh] {
            for shared in [true, false] {
                let mut m = Moe { act, ..silu.clone() };
                if !shared {
                    m.shared = None;
                    m.input = m.input.narrow_rows(0, 5).unwrap();
                }
                let y = m.forward(&x).unwrap();
                assert_tensor(&format!("{act} shared {shared}"), &y, &moe(&vals(&x), &m));
                if shared {
                    let d = vals(&y).iter().zip(&y_silu).fold(0.0f64, |d, (a, b)| d.max((a - b).abs()));
                    assert!(d > 1e-3, "{act}: the same output as silu (max|Δ| {d})");
                }
            }
        }
    }

    #[test]
    fn errors_are_errors() {
        let mut rng = Rng::new(54);
        let m = block(&mut rng, 4, 2, true, Some(3));
        assert!(is_shape(&m.forward(&rng.tensor(&[2, H + 1], 1.0))));
        let mut bad = m.clone();
        bad.top_k = 5;
        assert!(bad.check().is_err());
        bad.top_k = 0;
        assert!(bad.check().is_err());
        let mut bad = m.clone();
        bad.shared = None;
        assert!(is_shape(&bad.check()));
        let mut bad = m.clone();
        bad.experts = 3;
        assert!(is_shape(&bad.check()));
    }

    /// The load's zero pad of the input projection (11 rows → 16): accepted by `check`, the
    /// same output as without it (the pad columns of the product are never read), with and
    /// without the shared expert; any other row count is refused.
    #[test]
    fn zero_padded_input_projection_gives_the_same_output() {
        let mut rng = Rng::new(57);
        for shared in [Some(3), None] {
            let m = block(&mut rng, 5, 2, true, shared);
            let rows = m.input.dim(0);
            let x = rng.tensor(&[6, H], 1.0);
            let want = m.forward(&x).unwrap();
            for pad in 1..=2 * MOE_INPUT_ROW_ALIGN {
                let mut p = m.clone();
                let zeros = Tensor::zeros([pad, H], m.input.dtype());
                p.input = Tensor::concat_rows(&[&m.input, &zeros]).unwrap();
                if (rows + pad) != rows.next_multiple_of(MOE_INPUT_ROW_ALIGN) {
                    assert!(is_shape(&p.check()), "{rows} rows + {pad} of pad accepted");
                    continue;
                }
                p.check().unwrap();
                assert_eq!(vals(&p.forward(&x).unwrap()), vals(&want), "{rows} rows padded by {pad}");
                assert_tensor(&format!("padded {shared:?}"), &p.forward(&x).unwrap(), &moe(&vals(&x), &p));
            }
        }
    }
}
