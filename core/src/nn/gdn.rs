//! Gated DeltaNet linear attention (Qwen3-Next `linear_attn`), as a shared block.
//!
//! Math (models.md §3.4): projections → causal depthwise conv + SiLU over `[q|k|v]` →
//! gates `g = −exp(A_log)·softplus(a + dt_bias)`, `β = σ(b)` → L2-normalised q (scaled by
//! `dk^-½`) and k → gated delta rule with an f32 state → gated RMSNorm with SiLU(z) →
//! `out_proj`. Prefill (T > 1) uses the chunked algorithm, decode the per-token recurrence.
//! With speculative snapshots enabled in the cache, a short step keeps the state after
//! every token so that rejected draft tokens roll back without recomputation.

use super::*;

/// Sizes of a Gated DeltaNet block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnConfig {
    /// Key heads (Hk).
    pub key_heads: usize,
    /// Value heads (Hv, a multiple of Hk; value head j reads key head j / (Hv/Hk)).
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
    pub eps: f32,
}

impl GdnConfig {
    /// Conv channels `2·Hk·dk + Hv·dv` (`[q | k | v]`).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// f32 values per SSM state `Hv·dk·dv`.
    pub fn state_len(&self) -> usize {
        self.value_heads * self.key_dim * self.value_dim
    }
}

impl GdnConfig {
    fn args(&self) -> GdnArgs {
        GdnArgs {
            key_heads: self.key_heads,
            value_heads: self.value_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim,
            conv_kernel: self.conv_kernel,
        }
    }
}

/// Gated DeltaNet block with de-interleaved projections, packed at load into one GEMM.
///
/// # Shapes
/// - `in_proj`: `[2·Hk·dk + 2·Hv·dv + 2·Hv, hidden]`, rows `[Q_all | K_all | V_all | Z_all |
///   B_all | A_all]` (`in_proj_qkvz` then `in_proj_ba`, each de-interleaved by the weight
///   map's `regroup`)
/// - `conv_w`: `[conv_dim, K]`, `a_log`, `dt_bias`: `[Hv]`, all f32 (values rounded to the
///   model dtype, as the reference holds them); `norm_w`: `[dv]` in the model dtype
/// - `out_proj`: `[hidden, Hv·dv]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    pub cfg: GdnConfig,
    pub in_proj: Linear,
    pub conv_w: Tensor,
    pub a_log: Tensor,
    pub dt_bias: Tensor,
    pub norm_w: Tensor,
    pub out_proj: Linear,
}

impl GatedDeltaNet {
    /// Checks the weight shapes against the config (at load time).
    pub fn check(&self) -> Result<()> {
        let c = &self.cfg;
        if c.key_heads == 0 || c.value_heads == 0 || !c.value_heads.is_multiple_of(c.key_heads) {
            bail!(
                Config,
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                c.value_heads,
                c.key_heads
            );
        }
        if c.conv_kernel == 0 {
            bail!(Config, "linear_conv_kernel_dim must be >= 1");
        }
        let rows = 2 * c.key_heads * c.key_dim + 2 * c.value_heads * c.value_dim + 2 * c.value_heads;
        if self.in_proj.out_features() != rows
            || self.conv_w.elem_count() != c.conv_dim() * c.conv_kernel
            || self.a_log.elem_count() != c.value_heads
            || self.dt_bias.elem_count() != c.value_heads
            || self.norm_w.elem_count() != c.value_dim
        {
            bail!(Shape, "Gated DeltaNet weights do not match the config {c:?}");
        }
        Ok(())
    }

    pub fn forward(&self, x: &Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let LayerCache::Recurrent(rc) = cache else {
            bail!(Internal, "linear-attention layer was given a non-recurrent cache")
        };
        let c = self.cfg;
        let (t, vd) = (x.rows(), c.value_heads * c.value_dim);
        // [T, H] -> [T, 2kd + 2vd + 2Hv] = [q | k | v | z | b | a] (the conv, z and gates read
        // their columns in place).
        let p = self.in_proj.forward(x)?;
        let w = GdnWeights { conv_w: &self.conv_w, a_log: &self.a_log, dt_bias: &self.dt_bias };
        let o = ops(&p);
        // [T·Hv, dv]
        let core = o.gdn(&p, &w, &c.args(), batch, rc)?;
        let normed = o.gated_norm(&core, &p, &self.norm_w, c.conv_dim(), c.eps)?;
        // [T·Hv, dv] -> [T, Hv·dv] -> [T, H]
        self.out_proj.forward(&normed.reshape([t, vd])?)
    }
}
