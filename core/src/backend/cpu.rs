//! The CPU backend: [`Ops`] on host tensors, the reference every other backend is tested
//! against. Activations are `f32` buffers rounded to the model dtype at the points a real
//! bf16 / f16 model rounds (op outputs); reductions run in f32. Weights are read in their
//! stored dtype (bf16 / f16 weights are converted block by block inside the GEMM, never
//! inflated to a full f32 copy). The kernels themselves are `porter_kernels::cpu`.

use super::{
    Act, AttnArgs, GateIn, GdnArgs, GdnWeights, KvBuf, KvCache, MoeArgs, MoeShared, NormKind, Ops, RecBuf, RecCache,
    RopeArgs,
};
use crate::batch::Batch;
use crate::error::Result;
use crate::tensor::{CpuStorage, DType, HostSlice, Tensor};
use crate::{bail, err};
use porter_kernels::cpu::{gdn, ops};
use rayon::prelude::*;

pub use super::cpu_state::{CpuCkpt, CpuKv, CpuRec, CpuRecSlot};

/// The CPU implementation of [`Ops`].
#[derive(Debug, Clone, Copy)]
pub struct CpuOps;

/// Host storage of a tensor (every CPU op input).
fn host(t: &Tensor) -> Result<&CpuStorage> {
    t.host()
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with the weight in its stored element type
/// (bf16 / f16 weights are widened block by block inside the GEMM, bit-identical to a full
/// f32 copy; see `porter_kernels::cpu::ops::matmul_t_w`).
pub fn matmul_host(x: &[f32], w: HostSlice<'_>, out: &mut [f32], m: usize, k: usize, n: usize) {
    match w {
        HostSlice::F32(w) => ops::matmul_t(x, w, out, m, k, n, false),
        HostSlice::BF16(w) => ops::matmul_t_w(x, w, out, m, k, n, false),
        HostSlice::F16(w) => ops::matmul_t_w(x, w, out, m, k, n, false),
        // FP8: dequantized row by row inside the GEMV (same dot, same row invariance).
        HostSlice::F8(w, dt) => porter_kernels::cpu::fp8::matmul_t_fp8(x, w, out, m, k, n, false, &|v| dt.round(v)),
    }
}

/// A new host activation of `dtype` (values rounded).
fn act(data: Vec<f32>, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Tensor> {
    Tensor::from_vec(data, shape, dtype)
}

impl Ops for CpuOps {
    fn matmul_t(&self, x: &Tensor, w: &Tensor, out: DType) -> Result<Tensor> {
        let (m, k, n) = (x.rows(), x.last_dim(), w.dim(0));
        let xs = x.host_f32()?;
        let wh = host(w)?;
        let mut o = vec![0.0f32; m * n];
        matmul_host(&xs, wh.range(0, wh.len())?, &mut o, m, k, n);
        let mut shape = x.shape().to_vec();
        if let Some(l) = shape.last_mut() {
            *l = n;
        }
        act(o, shape, out)
    }

    fn add_(&self, x: &mut Tensor, y: &Tensor) -> Result<()> {
        let ys = y.host_f32()?;
        let dt = x.dtype();
        for (a, b) in x.data_mut().iter_mut().zip(ys.iter()) {
            *a = dt.round(*a + *b);
        }
        Ok(())
    }

    fn add_bias(&self, y: &mut Tensor, b: &Tensor) -> Result<()> {
        let bd = b.host_f32()?;
        let n = bd.len();
        if n == 0 || y.last_dim() != n {
            bail!(Shape, "bias of {n} values for an output {:?}", y.shape());
        }
        let dt = y.dtype();
        ops::for_each_row(y.data_mut(), n, |_, r| {
            for (v, bb) in r.iter_mut().zip(bd.iter()) {
                *v = dt.round(*v + bb);
            }
        });
        Ok(())
    }

    fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        act(x.host_f32()?.into_owned(), x.shape().to_vec(), dtype)
    }

    fn gather_rows(&self, x: &Tensor, idx: &[usize]) -> Result<Tensor> {
        let d = x.last_dim();
        let h = host(x)?;
        let mut data = Vec::with_capacity(idx.len() * d);
        for &i in idx {
            match h.range(i * d, (i + 1) * d)? {
                HostSlice::F32(s) => data.extend_from_slice(s),
                HostSlice::BF16(s) => data.extend(s.iter().map(|v| v.to_f32())),
                HostSlice::F16(s) => data.extend(s.iter().map(|v| v.to_f32())),
                HostSlice::F8(w, dt) => {
                    let mut row = vec![0.0; d];
                    w.dequant_row(0, &mut row, &|v| dt.round(v));
                    data.extend_from_slice(&row);
                }
            }
        }
        act(data, [idx.len(), d], x.dtype())
    }

    fn cols(&self, x: &Tensor, col0: usize, n: usize) -> Result<Tensor> {
        let d = x.last_dim();
        let xs = x.host_f32()?;
        let mut out = Vec::with_capacity(x.rows() * n);
        for row in xs.chunks(d) {
            out.extend_from_slice(&row[col0..col0 + n]);
        }
        act(out, [x.rows(), n], x.dtype())
    }

    fn concat_last(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (da, db) = (a.last_dim(), b.last_dim());
        let (xa, xb) = (a.host_f32()?, b.host_f32()?);
        let mut out = Vec::with_capacity(a.rows() * (da + db));
        for r in 0..a.rows() {
            out.extend_from_slice(&xa[r * da..(r + 1) * da]);
            out.extend_from_slice(&xb[r * db..(r + 1) * db]);
        }
        act(out, [a.rows(), da + db], a.dtype())
    }

    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let mut shape = parts[0].shape().to_vec();
        shape[0] = parts.iter().map(|p| p.dim(0)).sum();
        let mut v = Vec::with_capacity(shape.iter().product());
        for p in parts {
            v.extend_from_slice(&p.host_f32()?);
        }
        act(v, shape, parts[0].dtype())
    }

    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        // The residual stream is kept in f32; embedding rows are exact in any dtype.
        let idx: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
        self.gather_rows(table, &idx)?.try_to_dtype(DType::F32)
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, kind: NormKind) -> Result<Tensor> {
        let d = w.elem_count();
        if d == 0 || !x.elem_count().is_multiple_of(d) {
            bail!(Shape, "rms_norm: input {:?} is not a multiple of the norm width {d}", x.shape());
        }
        let dt = w.dtype();
        let scale: Vec<f32> = match kind {
            NormKind::Standard => w.host_f32()?.into_owned(),
            NormKind::ZeroCentred => w.host_f32()?.iter().map(|v| 1.0 + v).collect(),
        };
        let mut y = x.host_f32()?.into_owned();
        ops::for_each_row(&mut y, d, |_, r| {
            let inv = ops::rms_inv(r, eps);
            match kind {
                NormKind::Standard => {
                    for (v, w) in r.iter_mut().zip(&scale) {
                        *v = dt.round(w * dt.round(*v * inv));
                    }
                }
                NormKind::ZeroCentred => {
                    for (v, w) in r.iter_mut().zip(&scale) {
                        *v = dt.round(*v * inv * w);
                    }
                }
            }
        });
        act(y, x.shape().to_vec(), dt)
    }

    fn add_rms_norm(&self, x: &mut Tensor, y: &Tensor, w: &Tensor, eps: f32, kind: NormKind) -> Result<Tensor> {
        self.add_(x, y)?;
        self.rms_norm(x, w, eps, kind)
    }

    fn rope(&self, x: &mut Tensor, r: &RopeArgs<'_>, batch: &Batch) -> Result<()> {
        let (t, heads) = (x.dim(0), x.dim(1));
        if x.shape().len() != 3 || x.dim(2) != r.head_dim || t != batch.len() {
            bail!(Shape, "rope: expected [{}, heads, {}], got {:?}", batch.len(), r.head_dim, x.shape());
        }
        let (cos, sin) = rope_tables(&r.inv_freq.host_f32()?, &batch.positions(), r.scaling, x.dtype());
        ops::rope_neox(x.data_mut(), &cos, &sin, t, heads, r.head_dim, r.rot_dim);
        x.round_();
        Ok(())
    }

    fn swiglu(&self, gu: &Tensor, a: Act) -> Result<Tensor> {
        let (t, i2) = (gu.rows(), gu.last_dim());
        let i = i2 / 2;
        let dt = gu.dtype();
        let v = gu.data();
        let mut h = vec![0.0f32; t * i];
        // Rows in parallel when large (elementwise: the same values either way).
        ops::for_each_row(&mut h, i, |r, out| {
            let row = &v[r * i2..(r + 1) * i2];
            for ((o, g), u) in out.iter_mut().zip(&row[..i]).zip(&row[i..]) {
                *o = dt.round(a.apply(*g) * *u);
            }
        });
        act(h, [t, i], dt)
    }

    fn sigmoid_gate_mul(&self, x: &mut Tensor, gate: &Tensor) -> Result<()> {
        let g = gate.host_f32()?;
        let dt = x.dtype();
        for (o, gv) in x.data_mut().iter_mut().zip(g.iter()) {
            *o = dt.round(*o * dt.round(ops::sigmoid(*gv)));
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        a: &AttnArgs,
        batch: &Batch,
        kv: &mut KvCache,
    ) -> Result<Tensor> {
        let step = kv.step_for(batch)?;
        let KvBuf::Cpu(store) = &mut kv.buf else { bail!(Internal, "attention on the CPU with a device KV cache") };
        let (t, hd) = (q.dim(0), a.head_dim);
        let dt = q.dtype();
        let row_q = a.heads * hd;
        let (qd, kd, vd) = (q.data(), k.data(), v.data());
        store.write(&step.slots, kd, vd)?;
        let mut out = vec![0.0f32; t * row_q];
        let (mut kc, mut vc) = (Vec::new(), Vec::new());
        for (i, s) in batch.spans.iter().enumerate() {
            // The sequence's keys 0..pos0+len, gathered from its blocks in order (every row
            // is computed alone, so the result does not depend on the rest of the batch).
            store.gather(&step, i, s.pos0 + s.len, &mut kc, &mut vc)?;
            ops::causal_attention(
                &qd[s.start * row_q..(s.start + s.len) * row_q],
                &kc,
                &vc,
                &mut out[s.start * row_q..(s.start + s.len) * row_q],
                s.len,
                s.pos0,
                a.heads,
                a.kv_heads,
                hd,
                a.scale,
                a.window,
            );
        }
        act(out, [t, a.heads, hd], dt)
    }

    fn moe_experts(
        &self,
        x: &Tensor,
        logits: &Tensor,
        m: &MoeArgs,
        gate: &Tensor,
        up: &Tensor,
        down: &Tensor,
        _shared: Option<&MoeShared<'_>>,
    ) -> Result<(Tensor, bool)> {
        // The shared expert is left to the caller (the reference sequence).
        let (t, h) = (x.rows(), x.last_dim());
        let dt = x.dtype();
        let e = m.experts;
        let routes = route(logits, m)?;
        // Group rows by expert: for expert j, (row, weight) pairs.
        let mut groups: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
        for (r, sel) in routes.iter().enumerate() {
            for &(j, w) in sel {
                groups[j].push((r, w));
            }
        }
        let inter = gate.dim(1);
        let (wg, wu, wd) = (host(gate)?, host(up)?, host(down)?);
        let xd = x.data();
        let hit: Vec<usize> = (0..e).filter(|&j| !groups[j].is_empty()).collect();
        // Each hit expert runs on its gathered rows: [n, H] -> [n, I] -> [n, H].
        let outs: Vec<Result<Vec<f32>>> = hit
            .par_iter()
            .map(|&j| {
                let rows = &groups[j];
                let n = rows.len();
                let mut xs = Vec::with_capacity(n * h);
                for &(r, _) in rows {
                    xs.extend_from_slice(&xd[r * h..(r + 1) * h]);
                }
                let (ih, hi) = (inter * h, h * inter);
                let mut g = vec![0.0; n * inter];
                let mut u = vec![0.0; n * inter];
                matmul_host(&xs, wg.range(j * ih, (j + 1) * ih)?, &mut g, n, h, inter);
                matmul_host(&xs, wu.range(j * ih, (j + 1) * ih)?, &mut u, n, h, inter);
                // Fused activation: bf16 GEMM outputs in, f32 math, one rounding out.
                for (uv, gv) in u.iter_mut().zip(&g) {
                    *uv = dt.round(m.act.apply(dt.round(*gv)) * dt.round(*uv));
                }
                let mut o = vec![0.0; n * h];
                matmul_host(&u, wd.range(j * hi, (j + 1) * hi)?, &mut o, n, inter, h);
                // Routing weight applied in f32 to the bf16 expert output.
                for (ri, &(_, w)) in rows.iter().enumerate() {
                    for v in &mut o[ri * h..(ri + 1) * h] {
                        *v = dt.round(*v) * w;
                    }
                }
                Ok(o)
            })
            .collect();
        // Accumulate in f32 in ascending expert order (a fused top-k sum).
        let mut y = vec![0.0f32; t * h];
        for (&j, o) in hit.iter().zip(outs) {
            let o = o?;
            for (ri, &(r, _)) in groups[j].iter().enumerate() {
                for (a, b) in y[r * h..(r + 1) * h].iter_mut().zip(&o[ri * h..(ri + 1) * h]) {
                    *a += b;
                }
            }
        }
        if !m.shared {
            dt.round_slice(&mut y);
        }
        Ok((act(y, [t, h], DType::F32)?, false))
    }

    fn swiglu_cols(&self, all: &Tensor, col0: usize, inter: usize, dtype: DType, a: Act) -> Result<Tensor> {
        let (t, stride) = (all.rows(), all.last_dim());
        let v = all.data();
        let mut h = vec![0.0f32; t * inter];
        ops::for_each_row(&mut h, inter, |r, out| {
            let row = &v[r * stride..(r + 1) * stride];
            let (g, u) = (&row[col0..col0 + inter], &row[col0 + inter..col0 + 2 * inter]);
            for ((o, g), u) in out.iter_mut().zip(g).zip(u) {
                *o = dtype.round(a.apply(dtype.round(*g)) * dtype.round(*u));
            }
        });
        act(h, [t, inter], dtype)
    }

    fn shared_expert_add(&self, y: &mut Tensor, so: &Tensor, all: &Tensor, gate_col: usize) -> Result<()> {
        let (t, h, stride) = (y.rows(), y.last_dim(), all.last_dim());
        let dt = so.dtype();
        let (sd, ad) = (so.data(), all.data());
        let yd = y.data_mut();
        for r in 0..t {
            let gr = ops::sigmoid(dt.round(ad[r * stride + gate_col]));
            for (a, b) in yd[r * h..(r + 1) * h].iter_mut().zip(&sd[r * h..(r + 1) * h]) {
                *a = dt.round(*a + gr * b);
            }
        }
        Ok(())
    }

    fn gdn(
        &self,
        p: &Tensor,
        gate_in: GateIn<'_>,
        w: &GdnWeights<'_>,
        c: &GdnArgs,
        batch: &Batch,
        rec: &mut RecCache,
    ) -> Result<Tensor> {
        let dt = p.dtype();
        let (hk, hv, dk, dv) = (c.key_heads, c.value_heads, c.key_dim, c.value_dim);
        let (kd, vd, conv) = (hk * dk, hv * dv, c.conv_dim());
        // No fused form here: in_proj_ba's product (GateIn::Proj) first, as its Linear would.
        let projected = gate_in.project()?;
        let (gates, ba_col) = c.gate_cols(p, gate_in.cols(&projected))?;
        let (pw, gw) = (p.last_dim(), gates.last_dim());
        let (pd, gd) = (p.data(), gates.data());
        let (conv_w, a_log, dt_bias) = (w.conv_w.host_f32()?, w.a_log.host_f32()?, w.dt_bias.host_f32()?);
        let (spec, state_len, kernel) = (rec.spec, rec.state_len, rec.kernel);
        let mut o_all = vec![0.0f32; p.rows() * vd];
        let saves = rec.ckpt_step.clone().unwrap_or_default();
        let mut new_ckpts = Vec::new();
        for (si, s) in batch.spans.iter().enumerate() {
            let t = s.len;
            let snapshots = rec.snapshots_for(t);
            let meta = *rec.meta_mut(s.seq)?;
            let RecBuf::Cpu(store) = &mut rec.buf else {
                bail!(Internal, "Gated DeltaNet on the CPU with a device cache")
            };
            let slot = store.slot(s.seq, spec + 1, state_len);
            // Drop the conv inputs of rolled-back tokens.
            let n = slot.conv_hist.len().saturating_sub(meta.lag * conv);
            slot.conv_hist.truncate(n);
            // mixed = [T, conv] (= [q|k|v] columns of P); b, a from their columns (of P or ba).
            let mut mixed = Vec::with_capacity(t * conv);
            let (mut b, mut a) = (Vec::with_capacity(t * hv), Vec::with_capacity(t * hv));
            for r in s.start..s.start + t {
                mixed.extend_from_slice(&pd[r * pw..r * pw + conv]);
                let row = &gd[r * gw + ba_col..r * gw + ba_col + 2 * hv];
                b.extend_from_slice(&row[..hv]);
                a.extend_from_slice(&row[hv..]);
            }
            // Causal conv + activation (`hidden_act`), continuing from the slot's conv window.
            let hist_before = if saves.iter().any(|c| c.span == si) { slot.conv_hist.clone() } else { Vec::new() };
            let mut state = slot.conv_state(conv, kernel);
            let mut y = vec![0.0f32; t * conv];
            gdn::causal_conv1d_prefill(&mixed, &conv_w, None, &mut state, &mut y, t, conv, kernel, c.act)
                .map_err(|e| err!(Shape, "conv1d: {e}"))?;
            slot.push_conv_inputs(&mixed, (kernel.saturating_sub(1) + spec) * conv);
            // The conv output stays in f32 through the L2 norm, gates and delta rule; only
            // the GEMM inputs and outputs around the block are rounded to the model dtype.
            // Split [T, conv] into q [T, Hk, dk], k [T, Hk, dk], v [T, Hv, dv].
            let (mut q, mut k, mut v) =
                (Vec::with_capacity(t * kd), Vec::with_capacity(t * kd), Vec::with_capacity(t * vd));
            for row in y.chunks(conv) {
                q.extend_from_slice(&row[..kd]);
                k.extend_from_slice(&row[kd..2 * kd]);
                v.extend_from_slice(&row[2 * kd..]);
            }
            let (mut g, mut beta) = (vec![0.0f32; t * hv], vec![0.0f32; t * hv]);
            gdn::gdn_gates(&a, &b, &a_log, &dt_bias, &mut g, &mut beta).map_err(|e| err!(Shape, "gates: {e}"))?;
            gdn::l2norm_rows(&mut q, dk, 1.0 / (dk as f32).sqrt()).map_err(|e| err!(Shape, "l2norm: {e}"))?;
            gdn::l2norm_rows(&mut k, dk, 1.0).map_err(|e| err!(Shape, "l2norm: {e}"))?;
            let o = &mut o_all[s.start * vd..(s.start + t) * vd];
            let e = |e: gdn::GdnError| err!(Shape, "gated delta rule: {e}");
            if snapshots {
                // Speculative step: the state after token j goes to buffer j (zero-copy rollback).
                let mut st = slot.ssm[meta.cur].clone();
                for j in 0..t {
                    gdn::recurrent_gated_delta_rule(
                        &q[j * kd..(j + 1) * kd],
                        &k[j * kd..(j + 1) * kd],
                        &v[j * vd..(j + 1) * vd],
                        &g[j * hv..(j + 1) * hv],
                        &beta[j * hv..(j + 1) * hv],
                        &mut st,
                        &mut o[j * vd..(j + 1) * vd],
                        1,
                        hk,
                        hv,
                        dk,
                        dv,
                    )
                    .map_err(e)?;
                    slot.ssm[j].copy_from_slice(&st);
                }
            } else {
                let st = &mut slot.ssm[meta.cur];
                if t == 1 {
                    gdn::recurrent_gated_delta_rule(&q, &k, &v, &g, &beta, st, o, t, hk, hv, dk, dv).map_err(e)?;
                } else {
                    // The chunked rule in pieces that end at this span's checkpoints (chunk-
                    // aligned: the same chunks as one call, so the same bits), saving the state
                    // after each.
                    let mut from = 0;
                    let mut cuts: Vec<(usize, usize)> =
                        saves.iter().filter(|c| c.span == si).map(|c| (c.pos - s.pos0, c.slot)).collect();
                    cuts.retain(|&(r, _)| r > 0 && r <= t);
                    cuts.push((t, usize::MAX));
                    for (to, ck) in cuts {
                        if to > from {
                            let n = to - from;
                            gdn::chunked_gated_delta_rule(
                                &q[from * kd..to * kd],
                                &k[from * kd..to * kd],
                                &v[from * vd..to * vd],
                                &g[from * hv..to * hv],
                                &beta[from * hv..to * hv],
                                st,
                                &mut o[from * vd..to * vd],
                                n,
                                hk,
                                hv,
                                dk,
                                dv,
                            )
                            .map_err(e)?;
                            from = to;
                        }
                        if ck != usize::MAX {
                            // Conv inputs before position pos0 + to: the window's history, then
                            // this span's rows.
                            let keep = kernel.saturating_sub(1) * conv;
                            let mut hist = hist_before.clone();
                            hist.extend_from_slice(&mixed[..to * conv]);
                            let cut = hist.len().saturating_sub(keep);
                            new_ckpts.push((ck, CpuCkpt { conv_hist: hist[cut..].to_vec(), ssm: st.clone() }));
                        }
                    }
                }
            }
            rec.meta_mut(s.seq)?.start_step(s.pos0, t, snapshots);
        }
        if let RecBuf::Cpu(store) = &mut rec.buf {
            for (c, ck) in new_ckpts {
                store.save(c, ck);
            }
        }
        act(o_all, [p.rows() * hv, dv], dt)
    }

    fn gated_norm(&self, o: &Tensor, p: &Tensor, w: &Tensor, zoff: usize, eps: f32) -> Result<Tensor> {
        let (rows, pw) = (p.rows(), p.last_dim());
        let dv = w.elem_count();
        let vd = o.elem_count() / rows.max(1);
        let dt = o.dtype();
        let pd = p.data();
        let mut z = Vec::with_capacity(rows * vd);
        for r in 0..rows {
            z.extend_from_slice(&pd[r * pw + zoff..r * pw + zoff + vd]);
        }
        let mut out = o.data().to_vec();
        gdn::gated_rms_norm(&mut out, &z, &w.host_f32()?, eps).map_err(|e| err!(Shape, "gated norm: {e}"))?;
        act(out, [o.elem_count() / dv.max(1), dv], dt)
    }
}

/// Router: per row, the top-k `(expert, weight)` pairs from the first `m.experts` f32
/// columns of `logits` (softmax, ties by lower index first as `torch.topk` on the CPU,
/// optional renormalisation).
pub fn route(logits: &Tensor, m: &MoeArgs) -> Result<Vec<Vec<(usize, f32)>>> {
    let (e, stride) = (m.experts, logits.last_dim());
    if m.top_k == 0 || m.top_k > e || e > stride {
        bail!(Shape, "router: top-{} of {e} experts from {stride} logit columns", m.top_k);
    }
    let v = logits.host_f32()?;
    Ok((0..logits.rows())
        .map(|r| {
            let mut p = v[r * stride..r * stride + e].to_vec();
            ops::softmax_inplace(&mut p);
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let mut sel: Vec<(usize, f32)> = idx[..m.top_k].iter().map(|&i| (i, p[i])).collect();
            if m.norm_topk_prob {
                let s: f32 = sel.iter().map(|(_, w)| w).sum();
                sel.iter_mut().for_each(|(_, w)| *w /= s);
            }
            sel
        })
        .collect())
}

/// cos / sin tables for the given positions, rounded to `dtype` like HF.
///
/// # Shapes
/// `inv_freq: [rot/2]` → two `[positions.len(), rot/2]` tables
pub fn rope_tables(inv_freq: &[f32], positions: &[usize], scaling: f32, dtype: DType) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for f in inv_freq {
            let a = p as f32 * f;
            cos.push(dtype.round(a.cos() * scaling));
            sin.push(dtype.round(a.sin() * scaling));
        }
    }
    (cos, sin)
}

// ---------------------------------------------------------------------------------------
// State buffers
// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(l: &[f64]) -> Vec<f64> {
        let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = l.iter().map(|v| (v - m).exp()).sum();
        l.iter().map(|v| (v - m).exp() / z).collect()
    }

    /// Softmax over the first `experts` columns (the rest ignored), then top-k with ties to
    /// the lower index, then optional renormalisation, against f64.
    #[test]
    fn route_is_softmax_then_top_k_with_ties_to_the_lower_index() {
        // Columns 4 and 5 are not router logits (shared-expert columns of a packed input).
        let rows = [[0.5, 2.0, -1.0, 1.0, 9.0, 9.0], [1.0, 1.0, 1.0, 0.0, 9.0, -9.0]];
        let logits = Tensor::from_vec(rows.concat(), [2, 6], DType::F32).unwrap();
        for renorm in [false, true] {
            let m = MoeArgs { experts: 4, top_k: 2, norm_topk_prob: renorm, shared: false, act: Act::Silu };
            let got = route(&logits, &m).unwrap();
            for (r, (sel, want_idx)) in got.iter().zip([[1, 3], [0, 1]]).enumerate() {
                let p = softmax(&rows[r][..4].iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
                assert_eq!(sel.iter().map(|s| s.0).collect::<Vec<_>>(), want_idx, "row {r}");
                let sum: f64 = want_idx.iter().map(|&i| p[i]).sum();
                for (&(i, w), &j) in sel.iter().zip(&want_idx) {
                    let want = if renorm { p[j] / sum } else { p[j] };
                    assert!((f64::from(w) - want).abs() <= 1e-6 * want, "row {r} expert {i}: {w} vs {want}");
                }
            }
        }
    }

    #[test]
    fn route_rejects_bad_arguments() {
        let logits = Tensor::from_vec(vec![0.0; 12], [2, 6], DType::F32).unwrap();
        for (experts, top_k) in [(4, 0), (4, 5), (7, 2)] {
            let r = route(&logits, &MoeArgs { experts, top_k, norm_topk_prob: true, shared: false, act: Act::Silu });
            assert!(matches!(r, Err(crate::error::Error::Shape(_))), "experts {experts} top_k {top_k}");
        }
    }

    /// `cos / sin(pos · inv_freq) · scaling` per position and frequency, rounded to the
    /// dtype: f32 within 1e-5 of f64 (the f32 angle at position ≤ 17 is off by < 2e-6);
    /// bf16 values are bf16 numbers within one bf16 ulp of the f64 value rounded.
    #[test]
    fn rope_tables_are_scaled_cos_sin_of_the_angles() {
        let inv = [1.0f32, 0.1, 0.013];
        let pos = [0usize, 3, 17];
        for scaling in [1.0f32, 0.7] {
            for dt in [DType::F32, DType::BF16] {
                let (cos, sin) = rope_tables(&inv, &pos, scaling, dt);
                assert_eq!((cos.len(), sin.len()), (9, 9));
                for (i, (c, s)) in cos.iter().zip(&sin).enumerate() {
                    let angle = pos[i / 3] as f64 * f64::from(inv[i % 3]);
                    let (wc, ws) = (angle.cos() * f64::from(scaling), angle.sin() * f64::from(scaling));
                    for (got, want) in [(*c, wc), (*s, ws)] {
                        assert_eq!(dt.round(got), got, "{dt} table value {got} is not a {dt} number");
                        let tol = if dt == DType::F32 { 1e-5 } else { 2f64.powf(want.abs().log2().floor() - 7.0) };
                        assert!((f64::from(got) - want).abs() <= tol, "{dt} [{i}]: {got} vs {want}");
                    }
                }
                // Position 0: cos = scaling, sin = 0, exactly.
                assert_eq!((&cos[..3], &sin[..3]), (&[dt.round(scaling); 3][..], &[0.0; 3][..]));
            }
        }
    }
}
