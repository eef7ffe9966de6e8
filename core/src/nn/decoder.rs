//! The pre-norm decoder layer and its mixer / feed-forward halves.

use super::*;

/// The feed-forward half of a decoder layer.
#[derive(Debug, Clone)]
pub enum FeedForward {
    Dense(Box<SwiGlu>),
    Moe(Box<Moe>),
}

impl FeedForward {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Moe(m) => m.forward(x),
        }
    }
}

/// The token mixer of a decoder layer.
#[derive(Debug, Clone)]
pub enum Mixer {
    /// Softmax self-attention with a KV cache.
    Attention(Box<Attention>),
    /// Gated DeltaNet linear attention with a recurrent state.
    GatedDeltaNet(Box<crate::nn::gdn::GatedDeltaNet>),
}

impl Mixer {
    pub fn forward(&self, x: &Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        match self {
            Mixer::Attention(a) => a.forward(x, batch, cache),
            Mixer::GatedDeltaNet(g) => g.forward(x, batch, cache),
        }
    }
}

/// A pre-norm decoder layer: `h += mixer(norm1(h)); h += ffn(norm2(h))`.
///
/// # Shapes
/// `[T, hidden]` → `[T, hidden]`
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub attn: Mixer,
    pub post_norm: RmsNorm,
    pub ffn: FeedForward,
}

impl crate::layer::TransformerLayer for DecoderLayer {
    fn kind(&self) -> crate::layer::LayerKind {
        match &self.attn {
            Mixer::Attention(a) => {
                crate::layer::LayerKind::Attention { kv_heads: a.cfg.kv_heads, head_dim: a.cfg.head_dim }
            }
            Mixer::GatedDeltaNet(g) => crate::layer::LayerKind::Recurrent {
                conv_dim: g.cfg.conv_dim(),
                kernel: g.cfg.conv_kernel,
                state_len: g.cfg.state_len(),
            },
        }
    }

    fn cost(&self) -> crate::layer::LayerCost {
        let mut c = crate::layer::LayerCost::default();
        let dsize = self.input_norm.dtype().size_in_bytes();
        c.dense_bytes = self.input_norm.w.bytes() + self.post_norm.w.bytes();
        match &self.attn {
            Mixer::Attention(a) => {
                c.dense_bytes += a.q_proj.bytes() + a.k_proj.bytes() + a.v_proj.bytes() + a.o_proj.bytes();
                c.kv_bytes_per_token = 2 * a.cfg.kv_heads * a.cfg.head_dim * dsize;
            }
            Mixer::GatedDeltaNet(g) => {
                c.dense_bytes += g.in_proj.bytes() + g.out_proj.bytes();
                c.dense_bytes += g.conv_w.bytes() + g.a_log.bytes() + g.dt_bias.bytes() + g.norm_w.bytes();
                c.state_bytes = g.cfg.state_len() * 4 + g.cfg.conv_dim() * g.cfg.conv_kernel.saturating_sub(1) * 4;
            }
        }
        match &self.ffn {
            FeedForward::Dense(m) => c.dense_bytes += m.bytes(),
            FeedForward::Moe(m) => {
                c.dense_bytes += m.input.bytes();
                if let Some(s) = &m.shared {
                    c.dense_bytes += s.down.bytes();
                }
                let e = m.experts.max(1);
                c.expert_bytes = (m.gate.bytes() + m.up.bytes() + m.down.bytes()) / e;
                c.experts = e;
                c.top_k = m.top_k;
            }
        }
        c
    }

    fn forward(&self, mut x: Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        // x: [T, H] f32 residual stream
        let a = self.attn.forward(&self.input_norm.forward(&x)?, batch, cache)?;
        // One op for the residual add and the post-attention norm.
        let h = self.post_norm.add_forward(&mut x, &a)?;
        let f = self.ffn.forward(&h)?;
        x.add_(&f)?;
        Ok(x)
    }
}
