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

    /// `res += y`, then the block of `norm(res)` (the add and norm fused into its first
    /// product where the backend can).
    pub fn forward_add(&self, res: &mut Tensor, y: &Tensor, norm: &RmsNorm) -> Result<Tensor> {
        match self {
            FeedForward::Dense(m) => m.forward_add(res, y, norm),
            FeedForward::Moe(m) => m.forward_add(res, y, norm),
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

    /// `x += y`, then the mixer of `norm(x)` (the add and norm fused into its first product
    /// where the backend can).
    pub fn forward_add_normed(
        &self,
        x: &mut Tensor,
        y: &Tensor,
        norm: &RmsNorm,
        batch: &Batch,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        match self {
            Mixer::Attention(a) => a.forward_add_normed(x, y, norm, batch, cache),
            Mixer::GatedDeltaNet(g) => g.forward_add_normed(x, y, norm, batch, cache),
        }
    }

    /// The mixer of `norm(x)` (the norm fused into its first product where the backend can).
    pub fn forward_normed(&self, x: &Tensor, norm: &RmsNorm, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        match self {
            Mixer::Attention(a) => a.forward_normed(x, norm, batch, cache),
            Mixer::GatedDeltaNet(g) => g.forward_normed(x, norm, batch, cache),
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
                c.dense_bytes += a.qkv.bytes() + a.o_proj.bytes();
                c.kv_bytes_per_token = 2 * a.cfg.kv_heads * a.cfg.head_dim * dsize;
            }
            Mixer::GatedDeltaNet(g) => {
                c.dense_bytes += g.in_proj.bytes() + g.out_proj.bytes();
                c.dense_bytes += g.in_proj_ba.as_ref().map_or(0, Linear::bytes);
                c.dense_bytes += g.conv_w.bytes() + g.a_log.bytes() + g.dt_bias.bytes() + g.norm_w.bytes();
                c.state_bytes = g.cfg.state_len() * 4 + g.cfg.conv_dim() * g.cfg.conv_kernel.saturating_sub(1) * 4;
            }
        }
        match &self.ffn {
            FeedForward::Dense(m) => c.dense_bytes += m.bytes(),
            FeedForward::Moe(m) => {
                c.dense_bytes += m.input.bytes() + m.shared_in.as_ref().map_or(0, Tensor::bytes);
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

    fn forward(&self, x: Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let (mut x, f) = self.forward_deferred(x, None, batch, cache)?;
        if let Some(f) = f {
            x.add_(&f)?;
        }
        Ok(x)
    }

    fn forward_deferred(
        &self,
        mut x: Tensor,
        pending: Option<Tensor>,
        batch: &Batch,
        cache: &mut LayerCache,
    ) -> Result<(Tensor, Option<Tensor>)> {
        // x: [T, H] f32 residual stream. The residual add goes into the norm after it, and the
        // norm into the product after it where the backend fuses them (CUDA with
        // PORTER_NORM_GEMV=fused, decode sizes), with the same values as the ops apart.
        let a = match &pending {
            Some(p) => self.attn.forward_add_normed(&mut x, p, &self.input_norm, batch, cache)?,
            None => self.attn.forward_normed(&x, &self.input_norm, batch, cache)?,
        };
        // The residual add, the post-attention norm and the feed-forward input product; the
        // feed-forward output is the next layer's to add.
        let f = self.ffn.forward_add(&mut x, &a, &self.post_norm)?;
        Ok((x, Some(f)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::batch::SeqId;
    use crate::layer::{LayerKind, TransformerLayer};

    /// `h = x + mixer(norm1(x)); out = h + ffn(norm2(h))`, with both branches checked to be
    /// non-trivial (so that a dropped residual or branch shows).
    fn reference(
        x: &[f64],
        l: &DecoderLayer,
        mixer: &dyn Fn(&[f64]) -> Vec<f64>,
        ffn: &dyn Fn(&[f64]) -> Vec<f64>,
    ) -> Vec<f64> {
        let a = mixer(&rms_norm(x, &l.input_norm));
        let h: Vec<f64> = x.iter().zip(&a).map(|(x, a)| x + a).collect();
        let f = ffn(&rms_norm(&h, &l.post_norm));
        let max = |v: &[f64]| v.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(max(&a) > 0.05 * max(x) && max(&f) > 0.05 * max(x), "a branch is negligible");
        h.iter().zip(&f).map(|(h, f)| h + f).collect()
    }

    /// Runs the layer over `x` of one sequence in steps of the given lengths.
    fn run_in_steps(l: &DecoderLayer, x: &Tensor, steps: &[usize], cache: &mut LayerCache) -> Vec<f32> {
        let (mut out, mut pos) = (Vec::new(), 0);
        for &n in steps {
            let b = Batch::single(SeqId(0), pos, &vec![0; n]);
            page(cache, &b);
            out.extend(l.forward(x.narrow_rows(pos, n).unwrap(), &b, cache).unwrap().into_vec().unwrap());
            pos += n;
        }
        out
    }

    #[test]
    fn attention_and_swiglu_layer_is_two_pre_norm_residuals() {
        let mut rng = Rng::new(91);
        let hidden = 12;
        let (a, m) = (
            attention_block(&mut rng, hidden, Some(4), true, true),
            SwiGlu { gate_up: rng.linear(14, hidden, false), down: rng.linear(hidden, 7, false), act: Act::Silu },
        );
        let l = DecoderLayer {
            input_norm: rng.norm(hidden, NormKind::Standard),
            attn: Mixer::Attention(Box::new(a.clone())),
            post_norm: rng.norm(hidden, NormKind::Standard),
            ffn: FeedForward::Dense(Box::new(m.clone())),
        };
        assert_eq!(l.kind(), LayerKind::Attention { kv_heads: 2, head_dim: 8 });
        let x = rng.tensor(&[6, hidden], 2.0);
        let want = reference(&vals(&x), &l, &|v| attention(v, &a, f64::from(THETA)), &|v| swiglu(v, &m));
        let got = run_in_steps(&l, &x, &[4, 1, 1], &mut kv_cache(2, 8));
        assert_close("attention + swiglu layer", &got, &want, TOL);
    }

    #[test]
    fn gdn_and_moe_layer_is_two_pre_norm_residuals() {
        let mut rng = Rng::new(92);
        let hidden = 10;
        let (g, m) = (gdn_block(&mut rng, hidden), moe_block(&mut rng, hidden, 4, 5, 2, true, Some(3)));
        let l = DecoderLayer {
            input_norm: rng.norm(hidden, NormKind::ZeroCentred),
            attn: Mixer::GatedDeltaNet(Box::new(g.clone())),
            post_norm: rng.norm(hidden, NormKind::ZeroCentred),
            ffn: FeedForward::Moe(Box::new(m.clone())),
        };
        let c = GDN_CFG;
        assert_eq!(
            l.kind(),
            LayerKind::Recurrent { conv_dim: c.conv_dim(), kernel: c.conv_kernel, state_len: c.state_len() }
        );
        let x = rng.tensor(&[8, hidden], 2.0);
        let want = reference(&vals(&x), &l, &|v| gdn(v, &g), &|v| moe(v, &m));
        let got = run_in_steps(&l, &x, &[5, 1, 2], &mut rec_cache(&c, 0, 1));
        assert_close("gdn + moe layer", &got, &want, TOL);
    }

    #[test]
    fn shape_errors_are_errors() {
        let mut rng = Rng::new(93);
        let l = DecoderLayer {
            input_norm: rng.norm(12, NormKind::Standard),
            attn: Mixer::Attention(Box::new(attention_block(&mut rng, 12, None, false, false))),
            post_norm: rng.norm(12, NormKind::Standard),
            ffn: FeedForward::Dense(Box::new(SwiGlu {
                gate_up: rng.linear(8, 12, false),
                down: rng.linear(12, 4, false),
                act: Act::Silu,
            })),
        };
        let b = Batch::single(SeqId(0), 0, &[0, 0, 0]);
        assert!(is_shape(&l.forward(rng.tensor(&[3, 11], 1.0), &b, &mut kv_cache(2, 8))));
    }
}
