//! Gated DeltaNet linear attention (Qwen3-Next `linear_attn`), as a shared block.
//!
//! Math (models.md §3.4): projections → causal depthwise conv + `hidden_act` (SiLU in the
//! released models; transformers' `self.activation = config.hidden_act`) over `[q|k|v]` →
//! gates `g = −exp(A_log)·softplus(a + dt_bias)`, `β = σ(b)` → L2-normalised q (scaled by
//! `dk^-½`) and k → gated delta rule with an f32 state → gated RMSNorm with SiLU(z) →
//! `out_proj`. Prefill (T > 1) uses the chunked algorithm, decode the per-token recurrence.
//! With speculative snapshots enabled in the cache, a short step keeps the state after
//! every token so that rejected draft tokens roll back without recomputation.

use super::*;
use crate::backend::GateIn;

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
    /// The activation after the causal conv (`hidden_act`). The gated RMSNorm's gate is
    /// SiLU whatever this is (hard-coded in transformers).
    pub act: Act,
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
            act: self.act,
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
    /// `[in_proj_qkvz; in_proj_ba]` packed, or just `in_proj_qkvz` when `in_proj_ba` is held
    /// apart (an FP8 `in_proj_qkvz` next to a bf16 `in_proj_ba`).
    pub in_proj: Linear,
    /// `in_proj_ba` (`[2·Hv, hidden]`) when it is not packed into `in_proj`.
    pub in_proj_ba: Option<Linear>,
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
        let ba_rows = self.in_proj_ba.as_ref().map_or(0, Linear::out_features);
        if self.in_proj.out_features() + ba_rows != rows
            || !(ba_rows == 0 || ba_rows == 2 * c.value_heads)
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
        // [T, H] -> [T, 2kd + 2vd + 2Hv] = [q | k | v | z | b | a], or [q | k | v | z] and
        // [b | a] apart when in_proj_ba is (not concatenated: the conv, z and gates read their
        // columns in place).
        let p = self.in_proj.forward(x)?;
        self.mix(p, x, batch, cache)
    }

    /// [`GatedDeltaNet::forward`] of `norm(x)`, the norm fused into `in_proj` where the backend
    /// can ([`Linear::forward_normed`]).
    pub fn forward_normed(&self, x: &Tensor, norm: &RmsNorm, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let (h, p) = self.in_proj.forward_normed(x, norm)?;
        self.mix(p, &h, batch, cache)
    }

    /// `x += y`, then [`GatedDeltaNet::forward_normed`] (the add fused in too where the
    /// backend can: [`Linear::forward_add_normed`]).
    pub fn forward_add_normed(
        &self,
        x: &mut Tensor,
        y: &Tensor,
        norm: &RmsNorm,
        batch: &Batch,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        let (h, p) = self.in_proj.forward_add_normed(x, y, norm)?;
        self.mix(p, &h, batch, cache)
    }

    /// The block after its input projections: `p` `[T, 2kd + 2vd (+ 2Hv)]`, `h` `[T, H]` the
    /// rows `in_proj` read (`in_proj_ba`'s input when it is apart).
    fn mix(&self, p: Tensor, h: &Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let LayerCache::Recurrent(rc) = cache else {
            bail!(Internal, "linear-attention layer was given a non-recurrent cache")
        };
        let c = self.cfg;
        let (t, vd) = (p.rows(), c.value_heads * c.value_dim);
        if batch.len() != t {
            bail!(Shape, "Gated DeltaNet: {t} input rows for a batch of {} tokens", batch.len());
        }
        let w = GdnWeights { conv_w: &self.conv_w, a_log: &self.a_log, dt_bias: &self.dt_bias };
        // The gate inputs: packed into p, or in_proj_ba's product. A plain projection (no bias,
        // no tensor-parallel reduction) is left to the backend, which computes it inside the
        // launch that reads the gates where it can (a decode step's conv + gates on CUDA) and
        // else exactly as `Linear::forward` would; any other is computed here.
        let ba;
        let gates = match &self.in_proj_ba {
            None => GateIn::Packed,
            Some(l) if l.b.is_none() && l.reduce.is_none() => GateIn::Proj { x: h, w: &l.w },
            Some(l) => {
                ba = l.forward(h)?;
                GateIn::Cols(&ba)
            }
        };
        let o = ops(&p);
        // [T·Hv, dv], the core then its gated RMSNorm (one launch where the backend fuses them)
        let normed = o.gdn_gated(&p, gates, &w, &c.args(), batch, rc, &self.norm_w, c.eps)?;
        // [T·Hv, dv] -> [T, Hv·dv] -> [T, H]
        self.out_proj.forward(&normed.reshape([t, vd])?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::batch::SeqId;
    use crate::error::Error;

    const HIDDEN: usize = 10;
    const CFG: GdnConfig = GDN_CFG;

    fn block(rng: &mut Rng) -> GatedDeltaNet {
        gdn_block(rng, HIDDEN)
    }

    fn ids(n: usize) -> Vec<u32> {
        vec![0; n]
    }

    /// One forward of rows `r0..r1` of `x` as slot `seq` at position `pos`.
    fn step(g: &GatedDeltaNet, x: &Tensor, r0: usize, r1: usize, seq: usize, cache: &mut LayerCache) -> Vec<f32> {
        let b = Batch::single(SeqId(seq), r0, &ids(r1 - r0));
        g.forward(&x.narrow_rows(r0, r1 - r0).unwrap(), &b, cache).unwrap().into_vec().unwrap()
    }

    /// `x` of one sequence in steps of the given lengths (one cache without snapshots).
    fn run_in_steps(g: &GatedDeltaNet, x: &Tensor, steps: &[usize]) -> Vec<f32> {
        let mut cache = rec_cache(&CFG, 0, 1);
        let (mut out, mut pos) = (Vec::new(), 0);
        for &n in steps {
            out.extend(step(g, x, pos, pos + n, 0, &mut cache));
            pos += n;
        }
        out
    }

    /// 70 tokens: one chunked prefill (a full 64-token chunk and a partial one), 70
    /// single-token recurrent steps, and chunked prefills continuing from a state, all equal
    /// to the naive per-token delta rule in f64.
    #[test]
    fn chunked_prefill_and_recurrence_match_the_naive_delta_rule() {
        let mut rng = Rng::new(61);
        let g = block(&mut rng);
        let x = rng.tensor(&[70, HIDDEN], 1.0);
        let want = gdn(&vals(&x), &g);
        let (chunked, recurrent) = (run_in_steps(&g, &x, &[70]), run_in_steps(&g, &x, &[1; 70]));
        assert_close("chunked prefill", &chunked, &want, TOL);
        assert_close("token by token", &recurrent, &want, TOL);
        assert_close("chunked vs token by token", &chunked, &f64s(&recurrent), TOL);
        assert_close("prefill 40 + 1 + 29", &run_in_steps(&g, &x, &[40, 1, 29]), &want, TOL);
        assert_close("prefill 2 + 68", &run_in_steps(&g, &x, &[2, 68]), &want, TOL);
    }

    /// `in_proj_ba` held apart (the FP8 checkpoints' layout: its output is read in place by
    /// the gates, not concatenated onto the projections) gives the packed block's outputs bit
    /// for bit, in one prefill and token by token; gate inputs of the wrong shape are refused.
    #[test]
    fn in_proj_ba_apart_equals_packed() {
        let mut rng = Rng::new(63);
        let g = block(&mut rng);
        let (rows, nba) = (g.in_proj.out_features(), 2 * CFG.value_heads);
        let mut split = g.clone();
        split.in_proj = Linear::new(g.in_proj.w.narrow_rows(0, rows - nba).unwrap(), None);
        split.in_proj_ba = Some(Linear::new(g.in_proj.w.narrow_rows(rows - nba, nba).unwrap(), None));
        split.check().unwrap();
        let x = rng.tensor(&[9, HIDDEN], 1.0);
        for steps in [&[9][..], &[5, 1, 1, 1, 1]] {
            assert_eq!(run_in_steps(&split, &x, steps), run_in_steps(&g, &x, steps), "steps {steps:?}");
        }
        let a = CFG.args();
        let p = split.in_proj.forward(&x).unwrap();
        let ba = split.in_proj_ba.as_ref().unwrap().forward(&x).unwrap();
        assert_eq!(a.gate_cols(&p, Some(&ba)).unwrap().1, 0);
        let packed = g.in_proj.forward(&x).unwrap();
        assert_eq!(a.gate_cols(&packed, None).unwrap().1, rows - nba);
        for (pp, b) in [(&p, None), (&packed, Some(&ba)), (&p, Some(&p)), (&p, Some(&ba.narrow_rows(0, 8).unwrap()))] {
            assert!(
                matches!(a.gate_cols(pp, b), Err(Error::Shape(_))),
                "{:?} with {:?}",
                pp.shape(),
                b.map(|t| t.shape())
            );
        }
    }

    /// The seam of `in_proj_ba` held apart: on the CPU backend `GateIn::Proj { x, w }` (the
    /// product left to the backend) gives the layer outputs of `GateIn::Cols` of the product
    /// `x·wᵀ` computed first, bit for bit (f32 and bf16, a prefill then decode steps); through
    /// the block, a plain `in_proj_ba` (handed over as `Proj`) equals one with a zero bias
    /// (computed by the block, `Cols`); a projection that does not fit is a shape error.
    #[test]
    fn gate_proj_equals_cols_of_the_product() {
        let mut rng = Rng::new(66);
        let g = block(&mut rng);
        let (rows, nba) = (g.in_proj.out_features(), 2 * CFG.value_heads);
        let x = rng.tensor(&[9, HIDDEN], 1.0);
        let bits = |t: Tensor| t.into_vec().unwrap().into_iter().map(f32::to_bits).collect::<Vec<_>>();
        for dt in [DType::F32, DType::BF16] {
            let cast = |t: &Tensor| t.clone().try_to_dtype(dt).unwrap();
            let wq = cast(&g.in_proj.w.narrow_rows(0, rows - nba).unwrap());
            let wba = cast(&g.in_proj.w.narrow_rows(rows - nba, nba).unwrap());
            let (x, norm_w) = (cast(&x), cast(&g.norm_w));
            let w = GdnWeights { conv_w: &g.conv_w, a_log: &g.a_log, dt_bias: &g.dt_bias };
            let run = |proj: bool| {
                let (mut cache, mut out, mut pos) = (rec_cache(&CFG, 0, 1), Vec::new(), 0);
                for n in [5, 1, 1, 2] {
                    let xs = x.narrow_rows(pos, n).unwrap();
                    let p = xs.matmul_t(&wq).unwrap();
                    let product;
                    let gates = if proj {
                        GateIn::Proj { x: &xs, w: &wba }
                    } else {
                        product = xs.matmul_t(&wba).unwrap();
                        GateIn::Cols(&product)
                    };
                    let LayerCache::Recurrent(rc) = &mut cache else { panic!("recurrent cache expected") };
                    let b = Batch::single(SeqId(0), pos, &ids(n));
                    let y = ops(&p).gdn_gated(&p, gates, &w, &CFG.args(), &b, rc, &norm_w, CFG.eps).unwrap();
                    out.extend(bits(y));
                    pos += n;
                }
                out
            };
            assert_eq!(run(true), run(false), "{dt}: GateIn::Proj vs GateIn::Cols of the product");
        }
        let mut split = g.clone();
        split.in_proj = Linear::new(g.in_proj.w.narrow_rows(0, rows - nba).unwrap(), None);
        split.in_proj_ba = Some(Linear::new(g.in_proj.w.narrow_rows(rows - nba, nba).unwrap(), None));
        let mut biased = split.clone();
        let wba = g.in_proj.w.narrow_rows(rows - nba, nba).unwrap();
        biased.in_proj_ba = Some(Linear::new(wba.clone(), Some(Tensor::zeros([nba], DType::F32))));
        for steps in [&[9][..], &[5, 1, 1, 1, 1]] {
            assert_eq!(run_in_steps(&split, &x, steps), run_in_steps(&biased, &x, steps), "steps {steps:?}");
        }
        // Shape errors: a weight of the wrong width (the product) or of too few rows (the gates).
        let p = split.in_proj.forward(&x).unwrap();
        let w = GdnWeights { conv_w: &g.conv_w, a_log: &g.a_log, dt_bias: &g.dt_bias };
        let narrow = wba.narrow_rows(0, nba - 2).unwrap();
        let wide = rng.tensor(&[nba, HIDDEN + 1], 1.0);
        for bad in [&narrow, &wide] {
            let mut cache = rec_cache(&CFG, 0, 1);
            let LayerCache::Recurrent(rc) = &mut cache else { panic!("recurrent cache expected") };
            let b = Batch::single(SeqId(0), 0, &ids(9));
            let r = ops(&p).gdn(&p, GateIn::Proj { x: &x, w: bad }, &w, &CFG.args(), &b, rc);
            assert!(is_shape(&r), "{:?}", bad.shape());
        }
    }

    #[test]
    fn two_sequences_in_one_batch_equal_each_alone() {
        let mut rng = Rng::new(62);
        let g = block(&mut rng);
        let (xa, xb) = (rng.tensor(&[7, HIDDEN], 1.0), rng.tensor(&[7, HIDDEN], 1.0));
        let mut cache = rec_cache(&CFG, 0, 2);
        let mut b1 = Batch::single(SeqId(0), 0, &ids(6));
        b1.push(SeqId(1), 0, &ids(3));
        let x1 = Tensor::concat_rows(&[&xa.narrow_rows(0, 6).unwrap(), &xb.narrow_rows(0, 3).unwrap()]).unwrap();
        let y1 = g.forward(&x1, &b1, &mut cache).unwrap().into_vec().unwrap();
        let mut b2 = Batch::single(SeqId(1), 3, &ids(4));
        b2.push(SeqId(0), 6, &ids(1));
        let x2 = Tensor::concat_rows(&[&xb.narrow_rows(3, 4).unwrap(), &xa.narrow_rows(6, 1).unwrap()]).unwrap();
        let y2 = g.forward(&x2, &b2, &mut cache).unwrap().into_vec().unwrap();
        let (ra, rb) = (gdn(&vals(&xa), &g), gdn(&vals(&xb), &g));
        let got_a = [rows(&y1, HIDDEN, 0, 6), rows(&y2, HIDDEN, 4, 5)].concat();
        let got_b = [rows(&y1, HIDDEN, 6, 9), rows(&y2, HIDDEN, 0, 4)].concat();
        assert_close("sequence a in a batch", &got_a, &ra, TOL);
        assert_close("sequence b in a batch", &got_b, &rb, TOL);
        assert_close("sequence a alone", &run_in_steps(&g, &xa, &[6, 1]), &ra, TOL);
        assert_close("sequence b alone", &run_in_steps(&g, &xb, &[3, 4]), &rb, TOL);
    }

    /// A cache with 3 rejectable tokens: prefill 5, verify 4 tokens of which 2 are accepted
    /// (roll back 9 → 7), verify 3 and accept 1 (10 → 8), then 3 more. Every accepted row
    /// equals a fresh run (no snapshots) over the accepted tokens and the reference.
    #[test]
    fn speculative_snapshots_roll_back_to_a_fresh_run() {
        let mut rng = Rng::new(63);
        let g = block(&mut rng);
        // Rows 0..11: the accepted sequence; rows 11..14: rejected draft tokens.
        let x = rng.tensor(&[14, HIDDEN], 1.0);
        let feed = |r: &[usize]| {
            let parts: Vec<Tensor> = r.iter().map(|&i| x.narrow_rows(i, 1).unwrap()).collect();
            Tensor::concat_rows(&parts.iter().collect::<Vec<_>>()).unwrap()
        };
        let mut cache = rec_cache(&CFG, 3, 1);
        let fwd = |r: &[usize], pos: usize, cache: &mut LayerCache| {
            g.forward(&feed(r), &Batch::single(SeqId(0), pos, &ids(r.len())), cache).unwrap().into_vec().unwrap()
        };
        let rollback = |cache: &mut LayerCache, from: usize, to: usize| {
            let LayerCache::Recurrent(rc) = cache else { panic!("recurrent cache expected") };
            rc.rollback(SeqId(0), from, to)
        };
        let mut got = fwd(&[0, 1, 2, 3, 4], 0, &mut cache);
        // The 5-token prefill kept no snapshots: nothing can be rejected.
        assert!(rollback(&mut cache, 5, 4).is_err());
        got.extend(rows(&fwd(&[5, 6, 11, 12], 5, &mut cache), HIDDEN, 0, 2));
        rollback(&mut cache, 9, 7).unwrap();
        got.extend(rows(&fwd(&[7, 13, 11], 7, &mut cache), HIDDEN, 0, 1));
        rollback(&mut cache, 10, 8).unwrap();
        got.extend(fwd(&[8, 9, 10], 8, &mut cache));
        // Only the last step's tokens can be rejected, and not all of them.
        assert!(rollback(&mut cache, 11, 8).is_err());
        assert!(rollback(&mut cache, 11, 7).is_err());
        let acc = x.narrow_rows(0, 11).unwrap();
        let want = gdn(&vals(&acc), &g);
        assert_close("speculative run", &got, &want, TOL);
        let fresh = run_in_steps(&g, &acc, &[11]);
        assert_close("fresh run", &fresh, &want, TOL);
        assert_close("speculative vs fresh", &got, &f64s(&fresh), TOL);
    }

    /// A non-SiLU conv activation (`hidden_act` = gelu, relu2) in one prefill and token by
    /// token against the naive reference; the gated norm's gate stays SiLU there too.
    #[test]
    fn conv_activation_follows_hidden_act() {
        let mut rng = Rng::new(65);
        let silu = block(&mut rng);
        let x = rng.tensor(&[9, HIDDEN], 1.0);
        let y_silu = run_in_steps(&silu, &x, &[9]);
        for act in [Act::Gelu, Act::Relu2, Act::GeluFast] {
            let mut g = silu.clone();
            g.cfg.act = act;
            let want = gdn(&vals(&x), &g);
            assert_close(&format!("{act} prefill"), &run_in_steps(&g, &x, &[9]), &want, TOL);
            assert_close(&format!("{act} token by token"), &run_in_steps(&g, &x, &[1; 9]), &want, TOL);
            let got = run_in_steps(&g, &x, &[4, 5]);
            let d = got.iter().zip(&y_silu).fold(0.0f32, |d, (a, b)| d.max((a - b).abs()));
            assert!(d > 1e-3, "{act}: the silu output (max|Δ| {d})");
        }
    }

    #[test]
    fn errors_are_errors() {
        let mut rng = Rng::new(64);
        let g = block(&mut rng);
        let mut cache = rec_cache(&CFG, 0, 1);
        let b3 = Batch::single(SeqId(0), 0, &ids(3));
        assert!(is_shape(&g.forward(&rng.tensor(&[3, HIDDEN + 1], 1.0), &b3, &mut cache)));
        // A batch whose length is not the number of rows.
        assert!(is_shape(&g.forward(&rng.tensor(&[2, HIDDEN], 1.0), &b3, &mut cache)));
        assert!(is_shape(&g.forward(&rng.tensor(&[4, HIDDEN], 1.0), &b3, &mut cache)));
        let r = g.forward(&rng.tensor(&[3, HIDDEN], 1.0), &b3, &mut kv_cache(1, 4));
        assert!(matches!(r.as_ref().err().map(Error::root), Some(Error::Internal(_))));
        // Slot 1 of a one-slot cache.
        let r = g.forward(&rng.tensor(&[1, HIDDEN], 1.0), &Batch::single(SeqId(1), 0, &[0]), &mut cache);
        assert!(matches!(r.as_ref().err().map(Error::root), Some(Error::Cache(_))));
        let mut bad = g.clone();
        bad.cfg.value_heads = 3;
        assert!(bad.check().is_err());
        let mut bad = g.clone();
        bad.cfg.value_dim = 5;
        assert!(is_shape(&bad.check()));
    }
}
