//! The multi-token Gated DeltaNet kernels (`kernels/cuda/gdn_seq.cu`) against
//! the CPU reference (`porter_kernels::cpu::gdn`, run per span from the same
//! storage-rounded inputs): conv over spans with a rolling window (lag,
//! continuation across calls), gates from the fused `[b | a]` projection, the
//! delta rule over spans (in place and with per-token snapshots), and the
//! Qwen3-Next-80B-A3B sizes (decode at batch 1 and 64, a 4k prefill), timed.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with
//! `--include-ignored`; without a GPU they then fail, saying so), the ptxas
//! check `#[ignore = "needs NVRTC ..."]`. Outputs are NaN-poisoned before every launch. The seed is printed; set
//! `PORTER_CUDA_SEED` to replay one.

mod common;

use common::gdn::*;
use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cpu::gdn;
use porter_kernels::cuda::{CudaFloat, CudaKernels};
use std::time::Instant;

// ---------------------------------------------------------------------------
// NVRTC only: register use / spills of the delta-rule kernels (ptxas -v).
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_gdn_seq_ptxas_info() {
    let lines = ptxas_info("nvrtc_gdn_seq_ptxas_info", "gdn_seq.cu");
    for (func, line) in lines {
        println!("{func}: {line}");
    }
}

// ---------------------------------------------------------------------------
// Conv over spans
// ---------------------------------------------------------------------------

/// One conv span: rows `row0..row0 + len` continue `slot` after rolling back `lag`.
#[derive(Clone, Copy, Debug)]
struct ConvSpan {
    row0: usize,
    len: usize,
    slot: usize,
    lag: usize,
}

/// CPU reference of one `gdn_conv_seq` call: returns the output `[t, c]`
/// (rows of the spans) and updates `window` `[num_slots, c, win]`.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f32],
    x_stride: usize,
    w: &[f32],
    window: &mut [f32],
    spans: &[ConvSpan],
    t: usize,
    c: usize,
    k: usize,
    win: usize,
) -> Vec<f32> {
    let km1 = k - 1;
    let mut out = vec![f32::NAN; t * c];
    for s in spans {
        let h = win - s.lag;
        let wnd = &mut window[s.slot * c * win..(s.slot + 1) * c * win];
        let mut state = vec![0.0f32; c * km1];
        for ch in 0..c {
            for i in 0..km1 {
                state[ch * km1 + i] = wnd[ch * win + h - km1 + i];
            }
        }
        let xs: Vec<f32> = (0..s.len).flat_map(|i| x[(s.row0 + i) * x_stride..][..c].to_vec()).collect();
        let mut y = vec![0.0f32; s.len * c];
        gdn::causal_conv1d_prefill(&xs, w, None, &mut state, &mut y, s.len, c, k).expect("cpu conv");
        out[s.row0 * c..(s.row0 + s.len) * c].copy_from_slice(&y);
        for ch in 0..c {
            let u: Vec<f32> =
                wnd[ch * win..ch * win + h].iter().copied().chain((0..s.len).map(|i| xs[i * c + ch])).collect();
            for wi in 0..win {
                let j = u.len() as isize - win as isize + wi as isize;
                wnd[ch * win + wi] = if j < 0 { 0.0 } else { u[j as usize] };
            }
        }
    }
    out
}

/// Spans from `(len, slot, lag)`, rows laid out consecutively; returns them and `t`.
fn conv_spans(list: &[(usize, usize, usize)]) -> (Vec<ConvSpan>, usize) {
    let mut row0 = 0;
    let spans = list
        .iter()
        .map(|&(len, slot, lag)| {
            let s = ConvSpan { row0, len, slot, lag };
            row0 += len;
            s
        })
        .collect();
    (spans, row0)
}

#[allow(clippy::too_many_arguments)]
fn conv_call<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    list: &[(usize, usize, usize)],
    c: usize,
    x_stride: usize,
    kk: usize,
    win: usize,
    num_slots: usize,
    w: &[f32],
    dw: &CudaSlice<f32>,
    window: &mut [f32],
    dwin: &mut CudaSlice<f32>,
) {
    let (spans, t) = conv_spans(list);
    let x = rnd_vec::<T>(&rng.vec(t * x_stride, 2.0));
    let want = conv_ref(&x, x_stride, w, window, &spans, t, c, kk, win);
    let flat: Vec<u32> =
        spans.iter().flat_map(|s| [s.row0 as u32, s.len as u32, s.slot as u32, s.lag as u32]).collect();
    let dx = up::<T>(k, &x);
    let dsp = up_u32(k, &flat);
    let mut out = poisoned::<f32>(k, t * c);
    k.gdn_conv_seq(&dx, x_stride, dw, dwin, &dsp, &mut out, t, spans.len(), c, kk, win, num_slots)
        .expect("gdn_conv_seq");
    let what = format!("conv_seq {} c {c} k {kk} win {win} spans {list:?}", T::NAME);
    check(&format!("{what}: out"), &down(k, &out), &want, TOL_F32);
    check(&format!("{what}: window"), &down(k, dwin), window, 0.0);
}

fn conv_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, c: usize, x_stride: usize, kk: usize, spec: usize) {
    let win = kk - 1 + spec;
    let num_slots = 6;
    let w = rng.vec(c * kk, 0.5);
    let mut window = rng.vec(num_slots * c * win, 1.0);
    let dw = up::<f32>(k, &w);
    let mut dwin = up::<f32>(k, &window);
    // Decode spans and long ones, nonzero lags; then continue the same windows,
    // with lags again (rolled-back drafts), a span shorter than its lag, and a prefill.
    let lag = |l: usize| l.min(spec);
    let calls: [&[(usize, usize, usize)]; 3] = [
        &[(1, 2, 0), (37, 0, lag(2)), (1, 5, lag(1)), (300, 3, lag(spec)), (2, 4, 0)],
        &[(3, 0, lag(1)), (1, 2, lag(spec)), (1, 3, 0), (2, 5, lag(3)), (1, 4, lag(2)), (1, 1, 0)],
        &[(1000, 1, lag(1)), (1, 0, 0)],
    ];
    for list in calls {
        conv_call::<T>(k, rng, list, c, x_stride, kk, win, num_slots, &w, &dw, &mut window, &mut dwin);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_conv_seq() {
    let k = gpu("cuda_gdn_conv_seq");
    let mut rng = Rng::new(101);
    conv_case::<f32>(&k, &mut rng, 300, 333, CONV_K, 3);
    conv_case::<bf16>(&k, &mut rng, 300, 300, CONV_K, 0);
    conv_case::<f16>(&k, &mut rng, 129, 200, 2, 4);
    conv_case::<bf16>(&k, &mut rng, 2 * LIN_HK * LIN_D + LIN_HV * LIN_D, 2 * (LIN_HK + LIN_HV) * LIN_D, CONV_K, 3);
}

// ---------------------------------------------------------------------------
// Gates
// ---------------------------------------------------------------------------

fn gates_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, t: usize, hv: usize) {
    let ba = rnd_vec::<T>(&rng.vec(t * 2 * hv, 8.0));
    let mut a_log = rng.vec(hv, 2.0);
    a_log[0] = 3.0;
    let mut dt_bias = rng.vec(hv, 2.0);
    dt_bias[hv - 1] = 25.0; // softplus above its threshold
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for row in ba.chunks(2 * hv) {
        b.extend_from_slice(&row[..hv]);
        a.extend_from_slice(&row[hv..]);
    }
    let (mut g, mut beta) = (vec![0.0; t * hv], vec![0.0; t * hv]);
    gdn::gdn_gates(&a, &b, &a_log, &dt_bias, &mut g, &mut beta).expect("cpu gates");
    let dba = up::<T>(k, &ba);
    let (dl, dd) = (up::<f32>(k, &a_log), up::<f32>(k, &dt_bias));
    let (mut dg, mut dbeta) = (poisoned::<f32>(k, t * hv), poisoned::<f32>(k, t * hv));
    k.gdn_gates_ba(&dba, 2 * hv, 0, &dl, &dd, &mut dg, &mut dbeta, t, hv).expect("gdn_gates_ba");
    check(&format!("gates_ba {} [{t}, {hv}]: g", T::NAME), &down(k, &dg), &g, TOL_F32);
    check(&format!("gates_ba {} [{t}, {hv}]: beta", T::NAME), &down(k, &dbeta), &beta, TOL_F32);
    // The same values as columns 7..7+2hv of a wider fused projection.
    let stride = 2 * hv + 11;
    let mut wide = rng.vec(t * stride, 1.0);
    for (r, row) in ba.chunks(2 * hv).enumerate() {
        wide[r * stride + 7..r * stride + 7 + 2 * hv].copy_from_slice(row);
    }
    let dwide = up::<T>(k, &wide);
    let (mut dg, mut dbeta) = (poisoned::<f32>(k, t * hv), poisoned::<f32>(k, t * hv));
    k.gdn_gates_ba(&dwide, stride, 7, &dl, &dd, &mut dg, &mut dbeta, t, hv).expect("strided gdn_gates_ba");
    check(&format!("gates_ba strided {} [{t}, {hv}]: g", T::NAME), &down(k, &dg), &g, TOL_F32);
    check(&format!("gates_ba strided {} [{t}, {hv}]: beta", T::NAME), &down(k, &dbeta), &beta, TOL_F32);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_gates_ba() {
    let k = gpu("cuda_gdn_gates_ba");
    let mut rng = Rng::new(102);
    gates_case::<f32>(&k, &mut rng, 37, LIN_HV);
    gates_case::<bf16>(&k, &mut rng, 1000, LIN_HV);
    gates_case::<f16>(&k, &mut rng, 3, 5);
}

// ---------------------------------------------------------------------------
// Delta rule over spans
// ---------------------------------------------------------------------------

/// CPU reference of one `gdn_delta_seq` call; updates `state`
/// `[num_slots, nbuf, hv, dk, dv]` and returns the output `[t, hv, dv]` (f32).
fn delta_ref(
    d: GdnDims,
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    spans: &[DeltaSpan],
    nbuf: usize,
) -> Vec<f32> {
    let (hk, hv, dk, dv, sl) = (d.hk, d.hv, d.dk, d.dv, d.state());
    gdn_ref(d, qkv, g, beta, state, spans, nbuf, |sp, slot_s, o| {
        let (src, len) = (sp.src, sp.len);
        let mut st = slot_s[src * sl..(src + 1) * sl].to_vec();
        if sp.snapshot {
            for i in 0..len {
                gdn::recurrent_gated_delta_rule(
                    &sp.q[i * hk * dk..(i + 1) * hk * dk],
                    &sp.k[i * hk * dk..(i + 1) * hk * dk],
                    &sp.v[i * hv * dv..(i + 1) * hv * dv],
                    &sp.g[i * hv..(i + 1) * hv],
                    &sp.beta[i * hv..(i + 1) * hv],
                    &mut st,
                    &mut o[i * hv * dv..(i + 1) * hv * dv],
                    1,
                    hk,
                    hv,
                    dk,
                    dv,
                )
                .expect("cpu recurrence");
                slot_s[i * sl..(i + 1) * sl].copy_from_slice(&st);
            }
        } else {
            gdn::recurrent_gated_delta_rule(&sp.q, &sp.k, &sp.v, sp.g, sp.beta, &mut st, o, len, hk, hv, dk, dv)
                .expect("cpu recurrence");
            slot_s[src * sl..(src + 1) * sl].copy_from_slice(&st);
        }
    })
}

/// Runs `calls` consecutive `gdn_delta_seq` calls (the state carries over) and
/// compares outputs and the whole state pool with the CPU after each.
fn delta_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    d: GdnDims,
    num_slots: usize,
    nbuf: usize,
    calls: &[&[DeltaSpan]],
) {
    let sl = d.state();
    let mut state = rng.vec(num_slots * nbuf * sl, 0.5);
    let mut dstate = up::<f32>(k, &state);
    for (ci, spans) in calls.iter().enumerate() {
        let (flat, t, max_len) = span_table(spans.iter().copied());
        let (qkv, g, beta) = gdn_inputs(rng, d, t);
        let want: Vec<f32> = rnd_vec::<T>(&delta_ref(d, &qkv, &g, &beta, &mut state, spans, nbuf));
        let (dq, dg, db, dsp) = (up::<f32>(k, &qkv), up::<f32>(k, &g), up::<f32>(k, &beta), up_u32(k, &flat));
        let mut out = poisoned::<T>(k, t * d.hv * d.dv);
        k.gdn_delta_seq(
            &dq,
            &dg,
            &db,
            &mut dstate,
            &dsp,
            &mut out,
            t,
            spans.len(),
            max_len,
            d.hk,
            d.hv,
            d.dk,
            d.dv,
            num_slots,
            nbuf,
        )
        .expect("gdn_delta_seq");
        let what = format!("delta_seq {} {d:?} call {ci} spans {spans:?}", T::NAME);
        check(&format!("{what}: out"), &down(k, &out), &want, tol::<T>());
        check(&format!("{what}: state"), &down(k, &dstate), &state, TOL_F32);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_delta_seq_in_place() {
    let k = gpu("cuda_gdn_delta_seq_in_place");
    let mut rng = Rng::new(103);
    let small = GdnDims { hk: 2, hv: 4, dk: 32, dv: 48 };
    let calls: [&[DeltaSpan]; 2] = [
        &[(1, 0, 0, false), (37, 2, 1, false), (5, 3, 0, false), (1, 1, 1, false)],
        &[(20, 2, 1, false), (1, 0, 0, false), (1, 1, 0, false)],
    ];
    delta_case::<f32>(&k, &mut rng, small, 4, 2, &calls);
    delta_case::<bf16>(&k, &mut rng, small, 4, 2, &calls);
    // Odd head dims (rows beyond dk and columns beyond dv in the blocks), dk > 128.
    delta_case::<f16>(
        &k,
        &mut rng,
        GdnDims { hk: 1, hv: 3, dk: 200, dv: 70 },
        3,
        1,
        &[&[(9, 1, 0, false), (3, 0, 0, false)]],
    );
    delta_case::<f32>(&k, &mut rng, GdnDims { hk: 3, hv: 3, dk: 256, dv: 33 }, 2, 1, &[&[(40, 1, 0, false)]]);
    delta_case::<f32>(
        &k,
        &mut rng,
        GdnDims { hk: 2, hv: 2, dk: 5, dv: 7 },
        2,
        1,
        &[&[(3, 0, 0, false), (17, 1, 0, false)]],
    );
    // The real dims, a few sequences of mixed lengths, continuing.
    let real = GdnDims { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D };
    // (5 sequences: 2 lanes per state column, 64 rows each.)
    let calls: [&[DeltaSpan]; 2] = [
        &[(1, 0, 0, false), (70, 1, 0, false), (3, 2, 0, false), (1, 3, 0, false), (2, 4, 0, false)],
        &[(1, 1, 0, false), (2, 0, 0, false), (1, 4, 0, false), (1, 3, 0, false), (1, 2, 0, false)],
    ];
    delta_case::<bf16>(&k, &mut rng, real, 5, 1, &calls);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_delta_seq_snapshots() {
    let k = gpu("cuda_gdn_delta_seq_snapshots");
    let mut rng = Rng::new(104);
    let small = GdnDims { hk: 2, hv: 4, dk: 32, dv: 48 };
    // src_buf among the written buffers (0..len), beyond them, and a plain span in the same call.
    let calls: [&[DeltaSpan]; 3] = [
        &[(4, 0, 2, true), (1, 1, 3, true), (3, 2, 3, true), (6, 3, 1, false)],
        &[(4, 0, 3, true), (2, 1, 0, true), (4, 2, 0, true), (1, 3, 1, true)],
        &[(1, 0, 3, false), (4, 1, 1, true)],
    ];
    delta_case::<f32>(&k, &mut rng, small, 4, 4, &calls);
    delta_case::<bf16>(&k, &mut rng, small, 4, 4, &calls);
    let real = GdnDims { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D };
    let calls: [&[DeltaSpan]; 2] = [&[(4, 0, 1, true), (3, 1, 0, true)], &[(2, 0, 3, true), (4, 1, 2, true)]];
    delta_case::<bf16>(&k, &mut rng, real, 2, 4, &calls);
}

// ---------------------------------------------------------------------------
// Qwen3-Next-80B-A3B sizes, timed
// ---------------------------------------------------------------------------

/// Mean time of `f` over `iters` runs after one warm-up, in µs.
fn time_us(k: &CudaKernels, iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    k.stream().synchronize().expect("sync");
    let t0 = Instant::now();
    for _ in 0..iters {
        f();
    }
    k.stream().synchronize().expect("sync");
    t0.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// One call of the full GDN sequence path at the 80B dims (conv over the
/// in_proj rows, gates, delta rule), checked against the CPU, then timed.
fn real_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, spans: &[DeltaSpan], num_slots: usize) {
    let d = GdnDims { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D };
    let (c, hv, kk, win) = (d.width(), d.hv, CONV_K, CONV_K - 1);
    let stride = c + hv * d.dv; // [q | k | v | z]
    let (flat, t, max_len) = span_table(spans.iter().copied());
    let n = spans.len();
    let label = format!("80B {} t {t} spans {n} max_len {max_len}", T::NAME);

    // Conv.
    let cspans: Vec<ConvSpan> = {
        let mut r = 0;
        spans
            .iter()
            .map(|s| {
                let cs = ConvSpan { row0: r, len: s.0, slot: s.1, lag: 0 };
                r += s.0;
                cs
            })
            .collect()
    };
    let x = rnd_vec::<T>(&rng.vec(t * stride, 2.0));
    let w = rng.vec(c * kk, 0.5);
    let mut window = rng.vec(num_slots * c * win, 1.0);
    let mut dwin = up::<f32>(k, &window);
    let want_y = conv_ref(&x, stride, &w, &mut window, &cspans, t, c, kk, win);
    let cflat: Vec<u32> = cspans.iter().flat_map(|s| [s.row0 as u32, s.len as u32, s.slot as u32, 0]).collect();
    let (dx, dw, dcs) = (up::<T>(k, &x), up::<f32>(k, &w), up_u32(k, &cflat));
    let mut dy = poisoned::<f32>(k, t * c);
    k.gdn_conv_seq(&dx, stride, &dw, &mut dwin, &dcs, &mut dy, t, n, c, kk, win, num_slots).expect("conv");
    let y = down(k, &dy);
    check(&format!("{label}: conv"), &y, &want_y, TOL_F32);
    check(&format!("{label}: conv window"), &down(k, &dwin), &window, 0.0);

    // Gates.
    let ba = rnd_vec::<T>(&rng.vec(t * 2 * hv, 4.0));
    let (a_log, dt_bias) = (rng.vec(hv, 1.0), rng.vec(hv, 1.0));
    let (dba, dl, dd) = (up::<T>(k, &ba), up::<f32>(k, &a_log), up::<f32>(k, &dt_bias));
    let (mut dg, mut dbeta) = (poisoned::<f32>(k, t * hv), poisoned::<f32>(k, t * hv));
    k.gdn_gates_ba(&dba, 2 * hv, 0, &dl, &dd, &mut dg, &mut dbeta, t, hv).expect("gates");
    let (g, beta) = (down(k, &dg), down(k, &dbeta));

    // Delta rule on the GPU's conv output and gates.
    let mut state = rng.vec(num_slots * d.state(), 0.5);
    let mut dstate = up::<f32>(k, &state);
    let dsp = up_u32(k, &flat);
    let mut out = poisoned::<T>(k, t * hv * d.dv);
    k.gdn_delta_seq(&dy, &dg, &dbeta, &mut dstate, &dsp, &mut out, t, n, max_len, d.hk, hv, d.dk, d.dv, num_slots, 1)
        .expect("delta");
    let got = down(k, &out);
    let got_state = down(k, &dstate);
    let t0 = Instant::now();
    let want = rnd_vec::<T>(&delta_ref(d, &y, &g, &beta, &mut state, spans, 1));
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
    check(&format!("{label}: delta out"), &got, &want, tol::<T>());
    check(&format!("{label}: delta state"), &got_state, &state, TOL_F32);

    let iters = if t >= 1024 { 5 } else { 50 };
    let conv_us = time_us(k, iters, || {
        k.gdn_conv_seq(&dx, stride, &dw, &mut dwin, &dcs, &mut dy, t, n, c, kk, win, num_slots).expect("conv");
    });
    let gates_us =
        time_us(k, iters, || k.gdn_gates_ba(&dba, 2 * hv, 0, &dl, &dd, &mut dg, &mut dbeta, t, hv).expect("gates"));
    let delta_us = time_us(k, iters, || {
        k.gdn_delta_seq(
            &dy,
            &dg,
            &dbeta,
            &mut dstate,
            &dsp,
            &mut out,
            t,
            n,
            max_len,
            d.hk,
            hv,
            d.dk,
            d.dv,
            num_slots,
            1,
        )
        .expect("delta");
    });
    let state_mb = (n * d.state() * 4 * 2) as f64 / 1e6;
    println!(
        "  {label}: conv {conv_us:.1} µs, gates {gates_us:.1} µs, delta_seq {delta_us:.1} µs \
         ({:.0} GB/s of state r+w; {:.1} µs/token), CPU ref {cpu_ms:.0} ms",
        state_mb * 1e3 / delta_us,
        delta_us / max_len as f64,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_seq_80b_decode() {
    let k = gpu("cuda_gdn_seq_80b_decode");
    let mut rng = Rng::new(105);
    real_case::<bf16>(&k, &mut rng, &[(1, 3, 0, false)], 4);
    let batch: Vec<DeltaSpan> = (0..64).map(|i| (1, (i * 7) % 64, 0, false)).collect();
    real_case::<bf16>(&k, &mut rng, &batch, 64);
    real_case::<f32>(&k, &mut rng, &batch[..8], 64);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_seq_80b_prefill() {
    let k = gpu("cuda_gdn_seq_80b_prefill");
    let mut rng = Rng::new(106);
    real_case::<bf16>(&k, &mut rng, &[(4096, 1, 0, false)], 2);
    real_case::<bf16>(&k, &mut rng, &[(1000, 0, 0, false), (3, 1, 0, false), (500, 2, 0, false)], 3);
}
