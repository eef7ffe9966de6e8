//! Causal GQA self-attention with optional q/k norms, sliding window and output gate.

use super::*;
use crate::backend::{HeadNorm, QkPrep, QkPrepared};

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

/// An attention block's query, key and value projections: packed into one (one GEMM, one GEMV
/// launch at decode; the default) or apart.
///
/// # Shapes
/// - `q`: `[heads·head_dim·(1 + output_gate), hidden]`, `k` / `v`: `[kv_heads·head_dim, hidden]`
/// - `Packed`: `[q; k; v]` stacked along the output rows
#[derive(Debug, Clone)]
pub enum QkvProj {
    /// `[q; k; v]` in one weight.
    Packed(Linear),
    /// Three weights (an FP8 part beside dense ones, or a bias on some parts only).
    Apart { q: Linear, k: Box<Linear>, v: Box<Linear> },
}

impl QkvProj {
    /// The projection the input norm fuses into (the packed one, or q).
    fn first(&self) -> &Linear {
        match self {
            Self::Packed(l) | Self::Apart { q: l, .. } => l,
        }
    }

    /// Weight (and bias) bytes.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Packed(l) => l.bytes(),
            Self::Apart { q, k, v } => q.bytes() + k.bytes() + v.bytes(),
        }
    }
}

/// Causal GQA self-attention with optional q/k norms, (partial) RoPE, sliding window and
/// output gate.
///
/// # Shapes
/// - `qkv`: [`QkvProj`]; `o_proj`: `[hidden, heads·head_dim]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct Attention {
    pub cfg: AttentionConfig,
    pub qkv: QkvProj,
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
        let (qrows, kvrows) = (c.heads * c.head_dim * if c.output_gate { 2 } else { 1 }, c.kv_heads * c.head_dim);
        let ok = match &self.qkv {
            QkvProj::Packed(l) => l.out_features() == qrows + 2 * kvrows,
            QkvProj::Apart { q, k, v } => {
                q.out_features() == qrows && k.out_features() == kvrows && v.out_features() == kvrows
            }
        };
        if !ok {
            bail!(Shape, "attention projections do not match heads/head_dim");
        }
        Ok(())
    }

    pub fn forward(&self, x: &Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let qg = self.qkv.first().forward(x)?;
        self.attend(x, qg, batch, cache)
    }

    /// [`Attention::forward`] of `norm(x)`, the norm fused into the (packed or q) projection
    /// where the backend can ([`Linear::forward_normed`]).
    pub fn forward_normed(&self, x: &Tensor, norm: &RmsNorm, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let (h, qg) = self.qkv.first().forward_normed(x, norm)?;
        self.attend(&h, qg, batch, cache)
    }

    /// `x += y`, then [`Attention::forward_normed`] (the add fused in too where the backend
    /// can: [`Linear::forward_add_normed`]).
    pub fn forward_add_normed(
        &self,
        x: &mut Tensor,
        y: &Tensor,
        norm: &RmsNorm,
        batch: &Batch,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        let (h, qg) = self.qkv.first().forward_add_normed(x, y, norm)?;
        self.attend(&h, qg, batch, cache)
    }

    /// The block after the first projection: `x` the (normalised) input `[T, H]`, `qg` its
    /// packed projection `[T, heads·hd·(1 + gate) + 2·kv·hd]`, or (apart) its query projection
    /// `[T, heads·hd (·2 with the output gate)]`.
    fn attend(&self, x: &Tensor, qg: Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let c = &self.cfg;
        let (t, hd) = (x.rows(), c.head_dim);
        let LayerCache::Kv(kv) = cache else { bail!(Internal, "attention layer was given a non-KV cache") };
        fn head_norm(n: Option<&RmsNorm>, hd: usize) -> Result<Option<HeadNorm<'_>>> {
            n.map(|n| {
                if n.dim() != hd {
                    bail!(Shape, "q / k norm of width {} for head_dim {hd}", n.dim());
                }
                Ok(n.as_head())
            })
            .transpose()
        }
        let rope = &self.rope;
        if rope.head_dim() != hd {
            bail!(Shape, "rope of head_dim {} for attention head_dim {hd}", rope.head_dim());
        }
        let prep = QkPrep {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: hd,
            gated: c.output_gate,
            q_norm: head_norm(self.q_norm.as_ref(), hd)?,
            k_norm: head_norm(self.k_norm.as_ref(), hd)?,
            rope: rope.args(),
        };
        // The gate split, the q / k norms and RoPE (and packed, v's columns; one launch on
        // CUDA): q [T, heads, hd], k [T, kv, hd], gate [T·heads, hd], v [T, kv·hd].
        let (QkPrepared { q, k, gate }, v) = match &self.qkv {
            QkvProj::Packed(_) => ops(&qg).qkv_prep(qg, &prep, batch)?,
            QkvProj::Apart { k, v, .. } => {
                let (k, v) = (k.forward(x)?, v.forward(x)?);
                (ops(&qg).qk_prep(qg, k, &prep, batch)?, v)
            }
        };
        let args = AttnArgs { heads: c.heads, kv_heads: c.kv_heads, head_dim: hd, scale: c.scale, window: c.window };
        // [T, heads, hd], times sigmoid(gate) when gated (on CUDA inside the decode kernels).
        let out = ops(&q).attention_gated(&q, &k, &v, gate.as_ref(), &args, batch, kv)?;
        // [T, heads, hd] -> [T, heads·hd]
        self.o_proj.forward(&out.reshape([t, c.heads * hd])?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::batch::SeqId;
    use crate::error::Error;
    use crate::state::PageStep;

    fn block(rng: &mut Rng, window: Option<usize>, gate: bool, qk_norm: bool) -> Attention {
        attention_block(rng, 12, window, gate, qk_norm)
    }

    fn ids(n: usize) -> Vec<u32> {
        (0..n as u32).collect()
    }

    /// Runs `x` of one sequence through `a` in steps of the given lengths (one cache).
    fn run_in_steps(a: &Attention, x: &Tensor, steps: &[usize]) -> Vec<f32> {
        let mut cache = kv_cache(a.cfg.kv_heads, a.cfg.head_dim);
        let (mut out, mut pos) = (Vec::new(), 0);
        for &n in steps {
            let xs = x.narrow_rows(pos, n).unwrap();
            let b = Batch::single(SeqId(0), pos, &ids(n));
            page(&mut cache, &b);
            out.extend(a.forward(&xs, &b, &mut cache).unwrap().into_vec().unwrap());
            pos += n;
        }
        out
    }

    #[test]
    fn causal_gqa_with_and_without_window_matches_reference() {
        let mut rng = Rng::new(31);
        for window in [None, Some(3)] {
            let a = block(&mut rng, window, false, false);
            let x = rng.tensor(&[7, 12], 1.0);
            let want = attention(&vals(&x), &a, f64::from(THETA));
            assert_close(&format!("window {window:?}"), &run_in_steps(&a, &x, &[7]), &want, TOL);
        }
        // The window matters: a 3-token window differs from full attention on these inputs.
        let mut r2 = Rng::new(31);
        let full = block(&mut r2, None, false, false);
        let x = r2.tensor(&[7, 12], 1.0);
        let mut windowed = full.clone();
        windowed.cfg.window = Some(3);
        let (f, w) = (run_in_steps(&full, &x, &[7]), run_in_steps(&windowed, &x, &[7]));
        assert_eq!(f[..3 * 12], w[..3 * 12], "rows inside the window are the same");
        assert!(f[3 * 12..].iter().zip(&w[3 * 12..]).any(|(a, b)| (a - b).abs() > 1e-3));
    }

    #[test]
    fn output_gate_and_qk_norm_match_reference() {
        let mut rng = Rng::new(32);
        for (gate, norm) in [(true, false), (false, true), (true, true)] {
            let a = block(&mut rng, Some(4), gate, norm);
            let x = rng.tensor(&[6, 12], 1.0);
            let want = attention(&vals(&x), &a, f64::from(THETA));
            assert_close(&format!("gate {gate} norm {norm}"), &run_in_steps(&a, &x, &[6]), &want, TOL);
        }
    }

    /// The packed `[q; k; v]` projection (the loader's default) gives the apart projections'
    /// values exactly, for prefill and decode steps, with and without the gate, norms and
    /// biases, and against the reference.
    #[test]
    fn packed_qkv_equals_apart() {
        let mut rng = Rng::new(36);
        for (gate, norm, bias) in [(false, false, false), (true, true, false), (true, false, true), (false, true, true)]
        {
            let mut a = block(&mut rng, Some(4), gate, norm);
            if bias {
                let QkvProj::Apart { q, k, v } = &mut a.qkv else { unreachable!() };
                for l in [q, &mut **k, &mut **v] {
                    l.b = Some(rng.tensor(&[l.out_features()], 0.5));
                }
            }
            let p = packed(&a);
            assert!(matches!(p.qkv, QkvProj::Packed(_)));
            assert_eq!(p.qkv.bytes(), a.qkv.bytes());
            let x = rng.tensor(&[6, 12], 1.0);
            let case = format!("gate {gate} norm {norm} bias {bias}");
            for steps in [&[6][..], &[3, 1, 1, 1]] {
                let (apart, pk) = (run_in_steps(&a, &x, steps), run_in_steps(&p, &x, steps));
                assert_eq!(apart, pk, "{case} steps {steps:?}: packed vs apart");
            }
            let want = attention(&vals(&x), &p, f64::from(THETA));
            assert_close(&format!("{case} packed"), &run_in_steps(&p, &x, &[6]), &want, TOL);
        }
        // A packed weight of the wrong width is refused at load.
        let a = packed(&block(&mut rng, None, true, false));
        let mut bad = a.clone();
        bad.cfg.kv_heads = 1;
        assert!(is_shape(&bad.check()));
    }

    /// Prefill of 7 tokens == 3-token prefill then 4 single-token decode steps == 2 + 5,
    /// with a window of 3, all against the reference of the whole sequence.
    #[test]
    fn incremental_decode_equals_prefill() {
        let mut rng = Rng::new(33);
        let a = block(&mut rng, Some(3), true, true);
        let x = rng.tensor(&[7, 12], 1.0);
        let want = attention(&vals(&x), &a, f64::from(THETA));
        for steps in [&[7][..], &[3, 1, 1, 1, 1], &[2, 5]] {
            assert_close(&format!("steps {steps:?}"), &run_in_steps(&a, &x, steps), &want, TOL);
        }
    }

    /// Two sequences in one batch (slots 0 and 1), first both prefilling, then one decoding
    /// while the other continues with two tokens: each equals its own reference.
    #[test]
    fn two_sequences_in_one_batch_equal_each_alone() {
        let mut rng = Rng::new(34);
        let a = block(&mut rng, Some(4), true, true);
        let (xa, xb) = (rng.tensor(&[5, 12], 1.0), rng.tensor(&[5, 12], 1.0));
        let mut cache = kv_cache(2, 8);
        let mut b1 = Batch::single(SeqId(0), 0, &ids(4));
        b1.push(SeqId(1), 0, &ids(3));
        let x1 = Tensor::concat_rows(&[&xa.narrow_rows(0, 4).unwrap(), &xb.narrow_rows(0, 3).unwrap()]).unwrap();
        page(&mut cache, &b1);
        let y1 = a.forward(&x1, &b1, &mut cache).unwrap().into_vec().unwrap();
        let mut b2 = Batch::single(SeqId(1), 3, &ids(2));
        b2.push(SeqId(0), 4, &ids(1));
        let x2 = Tensor::concat_rows(&[&xb.narrow_rows(3, 2).unwrap(), &xa.narrow_rows(4, 1).unwrap()]).unwrap();
        page(&mut cache, &b2);
        let y2 = a.forward(&x2, &b2, &mut cache).unwrap().into_vec().unwrap();
        let (ra, rb) = (attention(&vals(&xa), &a, f64::from(THETA)), attention(&vals(&xb), &a, f64::from(THETA)));
        let got_a = [rows(&y1, 12, 0, 4), rows(&y2, 12, 2, 3)].concat();
        let got_b = [rows(&y1, 12, 4, 7), rows(&y2, 12, 0, 2)].concat();
        assert_close("sequence a in a batch", &got_a, &ra, TOL);
        assert_close("sequence b in a batch", &got_b, &rb, TOL);
        assert_close("sequence a alone", &run_in_steps(&a, &xa, &[4, 1]), &ra, TOL);
        assert_close("sequence b alone", &run_in_steps(&a, &xb, &[3, 2]), &rb, TOL);
    }

    #[test]
    fn errors_are_errors() {
        let mut rng = Rng::new(35);
        let a = block(&mut rng, None, true, true);
        let mut cache = kv_cache(2, 8);
        let b3 = Batch::single(SeqId(0), 0, &ids(3));
        // Without paging metadata (no cache prepare) attention refuses to run.
        let r = a.forward(&rng.tensor(&[3, 12], 1.0), &b3, &mut cache);
        assert!(matches!(r.as_ref().err().map(Error::root), Some(Error::Internal(_))));
        page(&mut cache, &b3);
        assert!(is_shape(&a.forward(&rng.tensor(&[3, 11], 1.0), &b3, &mut cache)));
        assert!(is_shape(&a.forward(&rng.tensor(&[2, 12], 1.0), &b3, &mut cache)));
        let r = a.forward(&rng.tensor(&[3, 12], 1.0), &b3, &mut LayerCache::Stateless);
        assert!(matches!(r.as_ref().err().map(Error::root), Some(Error::Internal(_))));
        // Paging metadata whose blocks do not cover the step's positions.
        let b5 = Batch::single(SeqId(0), 16, &[0]);
        let r = PageStep::new(&b5, 16, &[&[0]]);
        assert!(matches!(r.as_ref().err().map(Error::root), Some(Error::Cache(_))));
        let mut bad = a.clone();
        bad.cfg.kv_heads = 3;
        assert!(is_shape(&bad.check()));
        let mut bad = a.clone();
        bad.cfg.output_gate = false;
        assert!(is_shape(&bad.check()));
    }
}
