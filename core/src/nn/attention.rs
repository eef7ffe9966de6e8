//! Causal GQA self-attention with optional q/k norms, sliding window and output gate.

use super::*;

/// Static description of an attention block.
#[derive(Debug, Clone)]
pub struct AttentionConfig {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Sliding-window length (a key is visible while `pos_q − pos_k < window`).
    pub window: Option<usize>,
    /// Qwen3-Next gated attention: `q_proj` yields `[q, gate]` per head and the output is
    /// multiplied by `sigmoid(gate)` before `o_proj`.
    pub output_gate: bool,
    pub scale: f32,
}

impl AttentionConfig {
    /// Plain GQA with scale `head_dim^-½` and no output gate.
    pub fn gqa(heads: usize, kv_heads: usize, head_dim: usize, window: Option<usize>) -> Self {
        Self { heads, kv_heads, head_dim, window, output_gate: false, scale: 1.0 / (head_dim as f32).sqrt() }
    }
}

/// Causal GQA self-attention with optional q/k norms, (partial) RoPE, sliding window and
/// output gate.
///
/// # Shapes
/// - `q_proj`: `[heads·head_dim·(1 + output_gate), hidden]`, `k_proj`/`v_proj`: `[kv_heads·head_dim, hidden]`
/// - `o_proj`: `[hidden, heads·head_dim]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct Attention {
    pub cfg: AttentionConfig,
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: Rope,
}

impl Attention {
    /// Checks the weight shapes against the config (at load time).
    pub fn check(&self) -> Result<()> {
        let c = &self.cfg;
        if c.kv_heads == 0 || !c.heads.is_multiple_of(c.kv_heads) {
            bail!(
                Shape,
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                c.heads,
                c.kv_heads
            );
        }
        let qrows = c.heads * c.head_dim * if c.output_gate { 2 } else { 1 };
        if self.q_proj.out_features() != qrows || self.k_proj.out_features() != c.kv_heads * c.head_dim {
            bail!(Shape, "attention projections do not match heads/head_dim");
        }
        Ok(())
    }

    pub fn forward(&self, x: &Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let c = &self.cfg;
        let (t, hd) = (x.rows(), c.head_dim);
        let LayerCache::Kv(kv) = cache else { bail!(Internal, "attention layer was given a non-KV cache") };
        let qg = self.q_proj.forward(x)?;
        // Gated attention: [T, heads·hd·2] viewed as [T·heads, 2·hd]: q = columns 0..hd,
        // gate = hd..2hd.
        let (q, gate) = if c.output_gate {
            let qg = qg.reshape([t * c.heads, 2 * hd])?;
            (qg.cols(0, hd)?, Some(qg.cols(hd, hd)?))
        } else {
            (qg, None)
        };
        // [T, heads·hd] -> [T, heads, hd]; [T, kv·hd] -> [T, kv, hd]
        let q = q.reshape([t, c.heads, hd])?;
        let k = self.k_proj.forward(x)?.reshape([t, c.kv_heads, hd])?;
        let v = self.v_proj.forward(x)?;
        let mut q = match &self.q_norm {
            Some(n) => n.forward(&q)?,
            None => q,
        };
        let mut k = match &self.k_norm {
            Some(n) => n.forward(&k)?,
            None => k,
        };
        self.rope.forward(&mut q, batch)?;
        self.rope.forward(&mut k, batch)?;
        let args = AttnArgs { heads: c.heads, kv_heads: c.kv_heads, head_dim: hd, scale: c.scale, window: c.window };
        // [T, heads, hd]
        let mut out = ops(&q).attention(&q, &k, &v, &args, batch, kv)?;
        if let Some(g) = gate {
            // [T, heads, hd] viewed as [T·heads, hd], like the gate.
            out = out.reshape([t * c.heads, hd])?;
            ops(&out).sigmoid_gate_mul(&mut out, &g)?;
        }
        // [T, heads, hd] -> [T, heads·hd]
        self.o_proj.forward(&out.reshape([t, c.heads * hd])?)
    }
}
