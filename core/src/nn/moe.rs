//! Sparse mixture of experts with an optional shared expert.

use super::*;

/// The shared expert of Qwen3-Next MoE blocks: `sigmoid(x·g) · SwiGLU(x)`. Its gate / up
/// projections and its gate row live in the MoE's packed input projection.
#[derive(Debug, Clone)]
pub struct SharedExpert {
    /// Intermediate size `I_s`.
    pub inter: usize,
    /// `[hidden, I_s]`
    pub down: Linear,
}

/// Sparse mixture of experts: softmax router → top-k → optional renormalisation, experts
/// evaluated on the rows routed to them (grouped by expert), plus an optional shared expert.
///
/// # Shapes
/// - `input`: `[E + 2·I_s + 1, hidden]` = `[router; shared gate; shared up; shared expert
///   gate]` packed at load (just `[E, hidden]`, the router, without a shared expert): one
///   f32-output GEMM serves all four
/// - `gate`, `up`: `[E, inter, hidden]`, `down`: `[E, hidden, inter]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct Moe {
    pub input: Tensor,
    pub experts: usize,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub shared: Option<SharedExpert>,
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
        if self.input.dim(0) != rows {
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
        }
    }

    /// Router: per row, the top-k `(expert, weight)` pairs.
    pub fn route(&self, x: &Tensor) -> Result<Vec<Vec<(usize, f32)>>> {
        // Router logits stay in f32 (no bf16 rounding of the scores that pick experts):
        // near-ties between experts are decided as the f32 model decides them.
        let logits = x.matmul_t_to(&self.input, DType::F32)?.to_host()?;
        crate::backend::cpu::route(&logits, &self.args())
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // [T, H] -> [T, E + 2·I_s + 1] f32: router logits, shared gate/up, shared gate logit.
        let all = x.matmul_t_to(&self.input, DType::F32)?;
        let o = ops(x);
        // [T, H] f32
        let mut y = o.moe_experts(x, &all, &self.args(), &self.gate, &self.up, &self.down)?;
        if let Some(s) = &self.shared {
            // [T, I_s] in the model dtype, then [T, H]
            let h = o.swiglu_cols(&all, self.experts, s.inter, x.dtype())?;
            let so = s.down.forward(&h)?;
            o.shared_expert_add(&mut y, &so, &all, self.experts + 2 * s.inter)?;
        }
        // [T, H] f32, into the residual stream (see `Ops::moe_experts` on rounding).
        Ok(y)
    }
}
