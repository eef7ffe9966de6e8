//! Gated DeltaNet linear attention (Qwen3-Next `linear_attn`), as a shared block.
//!
//! Math (models.md §3.4): projections → causal depthwise conv + SiLU over `[q|k|v]` →
//! gates `g = −exp(A_log)·softplus(a + dt_bias)`, `β = σ(b)` → L2-normalised q (scaled by
//! `dk^-½`) and k → gated delta rule with an f32 state → gated RMSNorm with SiLU(z) →
//! `out_proj`. Prefill (T > 1) uses the chunked algorithm, decode the per-token recurrence.
//! With speculative snapshots enabled in the cache, a short step keeps the state after
//! every token so that rejected draft tokens roll back without recomputation.

use crate::error::Result;
use crate::nn::Linear;
use crate::state::Batch;
use crate::state::{LayerCache, RecurrentLayer, SeqId};
use crate::tensor::Tensor;
use crate::{bail, err};
use porter_kernels::cpu::gdn;

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

/// Gated DeltaNet block with de-interleaved projections.
///
/// # Shapes
/// - `in_proj_qkvz`: `[2·Hk·dk + 2·Hv·dv, hidden]`, rows `[Q_all | K_all | V_all | Z_all]`
///   (the weight map de-interleaves the checkpoint's per-key-head groups)
/// - `in_proj_ba`: `[2·Hv, hidden]`, rows `[B_all | A_all]`
/// - `conv_w`: `[conv_dim, K]`, `a_log`, `dt_bias`: `[Hv]`, `norm_w`: `[dv]`
/// - `out_proj`: `[hidden, Hv·dv]`
/// - input `[T, hidden]` → output `[T, hidden]`
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    pub cfg: GdnConfig,
    pub in_proj_qkvz: Linear,
    pub in_proj_ba: Linear,
    pub conv_w: Vec<f32>,
    pub a_log: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub norm_w: Vec<f32>,
    pub out_proj: Linear,
    /// Device copies of the small weights when the block runs on CUDA.
    pub dev: Option<crate::backend::cuda::blocks::GdnDev>,
}

impl GatedDeltaNet {
    /// Checks the weight shapes against the config (at load time).
    pub fn check(&self) -> Result<()> {
        let c = &self.cfg;
        if c.key_heads == 0 || c.value_heads == 0 || !c.value_heads.is_multiple_of(c.key_heads) {
            bail!(
                Shape,
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                c.value_heads,
                c.key_heads
            );
        }
        if c.conv_kernel == 0 {
            bail!(Shape, "linear_conv_kernel_dim must be >= 1");
        }
        let qkvz = 2 * c.key_heads * c.key_dim + 2 * c.value_heads * c.value_dim;
        if self.in_proj_qkvz.out_features() != qkvz
            || self.in_proj_ba.out_features() != 2 * c.value_heads
            || self.conv_w.len() != c.conv_dim() * c.conv_kernel
            || self.a_log.len() != c.value_heads
            || self.dt_bias.len() != c.value_heads
            || self.norm_w.len() != c.value_dim
        {
            bail!(Shape, "Gated DeltaNet weights do not match the config {c:?}");
        }
        Ok(())
    }

    pub fn forward(&self, x: &Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        if x.is_cuda() {
            return crate::backend::cuda::blocks::gated_delta_net(self, x, batch, cache);
        }
        let LayerCache::Recurrent(rc) = cache else {
            bail!(Shape, "linear-attention layer was given a non-recurrent cache")
        };
        let c = self.cfg;
        let dt = x.dtype();
        let (hk, hv, dk, dv) = (c.key_heads, c.value_heads, c.key_dim, c.value_dim);
        let (kd, vd, conv) = (hk * dk, hv * dv, c.conv_dim());
        // [T, H] -> [T, 2kd + 2vd] = [q | k | v | z] and [T, 2Hv] = [b | a]
        let p = self.in_proj_qkvz.forward(x)?;
        let ba = self.in_proj_ba.forward(x)?;
        let pw = p.last_dim();
        let mut o_all = vec![0.0f32; x.rows() * vd];
        for s in &batch.spans {
            let t = s.len;
            let rows = s.start..s.start + t;
            // mixed = [T, conv] (= [q|k|v] columns of P)
            let mut mixed = Vec::with_capacity(t * conv);
            let mut z = Vec::with_capacity(t * vd);
            let (mut b, mut a) = (Vec::with_capacity(t * hv), Vec::with_capacity(t * hv));
            for r in rows.clone() {
                let row = &p.data()[r * pw..(r + 1) * pw];
                mixed.extend_from_slice(&row[..conv]);
                z.extend_from_slice(&row[conv..]);
                let bar = ba.row(r);
                b.extend_from_slice(&bar[..hv]);
                a.extend_from_slice(&bar[hv..]);
            }
            // Causal conv + SiLU, continuing from the slot's conv window.
            let mut state = rc.conv_state(s.seq);
            let mut y = vec![0.0f32; t * conv];
            gdn::causal_conv1d_prefill(&mixed, &self.conv_w, None, &mut state, &mut y, t, conv, c.conv_kernel)
                .map_err(|e| err!(Shape, "conv1d: {e}"))?;
            rc.push_conv_inputs(s.seq, &mixed);
            // The conv output stays in f32 through the L2 norm, gates and delta rule (one
            // fused step, as in the fused conv + recurrence kernels); only the GEMM inputs
            // and outputs around the block are rounded to the model dtype.
            // Split [T, conv] into q [T, Hk, dk], k [T, Hk, dk], v [T, Hv, dv].
            let (mut q, mut k, mut v) =
                (Vec::with_capacity(t * kd), Vec::with_capacity(t * kd), Vec::with_capacity(t * vd));
            for row in y.chunks(conv) {
                q.extend_from_slice(&row[..kd]);
                k.extend_from_slice(&row[kd..2 * kd]);
                v.extend_from_slice(&row[2 * kd..]);
            }
            let (mut g, mut beta) = (vec![0.0f32; t * hv], vec![0.0f32; t * hv]);
            gdn::gdn_gates(&a, &b, &self.a_log, &self.dt_bias, &mut g, &mut beta)
                .map_err(|e| err!(Shape, "gates: {e}"))?;
            gdn::l2norm_rows(&mut q, dk, 1.0 / (dk as f32).sqrt()).map_err(|e| err!(Shape, "l2norm: {e}"))?;
            gdn::l2norm_rows(&mut k, dk, 1.0).map_err(|e| err!(Shape, "l2norm: {e}"))?;
            let o = &mut o_all[s.start * vd..(s.start + t) * vd];
            self.recurrence(rc, s.seq, s.pos0, &q, &k, &v, &g, &beta, o)?;
            // Gated RMSNorm per value head with SiLU(z), then back to the model dtype.
            dt.round_slice(o);
            gdn::gated_rms_norm(o, &z, &self.norm_w, c.eps).map_err(|e| err!(Shape, "gated norm: {e}"))?;
            dt.round_slice(o);
        }
        // [T, Hv·dv] -> [T, H]
        self.out_proj.forward(&Tensor::from_vec(o_all, [x.rows(), vd], dt)?)
    }

    /// The delta rule over one sequence's step, reading and writing the slot's state.
    #[allow(clippy::too_many_arguments)]
    fn recurrence(
        &self,
        rc: &mut RecurrentLayer,
        seq: SeqId,
        pos0: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let c = self.cfg;
        let (hk, hv, dk, dv) = (c.key_heads, c.value_heads, c.key_dim, c.value_dim);
        let t = g.len() / hv;
        let err = |e: gdn::GdnError| err!(Shape, "gated delta rule: {e}");
        if rc.snapshots_for(t) {
            // Speculative step: state after token j goes to buffer j (zero-copy rollback).
            let (bufs, cur) = rc.snapshot_buffers(seq);
            let mut st = bufs[cur].clone();
            for j in 0..t {
                gdn::recurrent_gated_delta_rule(
                    &q[j * hk * dk..(j + 1) * hk * dk],
                    &k[j * hk * dk..(j + 1) * hk * dk],
                    &v[j * hv * dv..(j + 1) * hv * dv],
                    &g[j * hv..(j + 1) * hv],
                    &beta[j * hv..(j + 1) * hv],
                    &mut st,
                    &mut out[j * hv * dv..(j + 1) * hv * dv],
                    1,
                    hk,
                    hv,
                    dk,
                    dv,
                )
                .map_err(err)?;
                bufs[j].copy_from_slice(&st);
            }
            rc.finish_snapshot_step(seq, pos0, t);
        } else {
            let st = rc.ssm_mut(seq);
            if t == 1 {
                gdn::recurrent_gated_delta_rule(q, k, v, g, beta, st, out, t, hk, hv, dk, dv).map_err(err)?;
            } else {
                gdn::chunked_gated_delta_rule(q, k, v, g, beta, st, out, t, hk, hv, dk, dv).map_err(err)?;
            }
            rc.finish_step(seq, pos0);
        }
        Ok(())
    }
}
