//! The chunked Gated DeltaNet prefill (`kernels/cuda/gdn_chunk.cu`,
//! `CudaKernels::gdn_chunked_seq`) against the recurrent GPU kernel
//! (`gdn_delta_seq`, same inputs) and the CPU chunked reference
//! (`cpu::gdn::chunked_gated_delta_rule` per span): f32 / bf16 / f16 outputs,
//! spans of 1, 63, 64, 65, 200 and 1000 tokens in one call continuing from
//! nonzero states (twice), dk ≠ dv, hv / hk = 2, and the Qwen3-Next-80B dims
//! at a 4096-token prefill (timed against `gdn_delta_seq`).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with
//! `--include-ignored`; without a GPU they then fail, saying so), the ptxas
//! check `#[ignore = "needs NVRTC ..."]`. Outputs are NaN-poisoned before every launch.

mod common;

use common::gdn::*;
use common::*;
use half::{bf16, f16};
use porter_kernels::cpu::gdn;
use porter_kernels::cuda::{CudaFloat, CudaKernels};
use std::time::Instant;

/// Relative tolerance (of max |ref|) of f32 outputs and of the state.
const TOL_CHUNK_F32: f32 = 1e-4;

// ---------------------------------------------------------------------------
// NVRTC only: register use / spills (ptxas -v).
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_gdn_chunk_ptxas_info() {
    let lines = ptxas_info("nvrtc_gdn_chunk_ptxas_info", "gdn_chunk.cu");
    for (func, line) in lines {
        println!("{func}: {line}");
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// One span: `(len, slot, src_buf)` (never a snapshot span).
type Span = (usize, usize, usize);

/// `spans` as delta-rule spans (no snapshots).
fn delta_spans(spans: &[Span]) -> Vec<DeltaSpan> {
    spans.iter().map(|&(len, slot, src)| (len, slot, src, false)).collect()
}

/// CPU chunked reference of one call; updates `state`
/// `[num_slots, nbuf, hv, dk, dv]`, returns the output `[t, hv, dv]` (f32).
fn chunk_ref(
    d: GdnDims,
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    spans: &[Span],
    nbuf: usize,
) -> Vec<f32> {
    let sl = d.state();
    gdn_ref(d, qkv, g, beta, state, &delta_spans(spans), nbuf, |sp, slot_s, o| {
        let st = &mut slot_s[sp.src * sl..(sp.src + 1) * sl];
        gdn::chunked_gated_delta_rule(&sp.q, &sp.k, &sp.v, sp.g, sp.beta, st, o, sp.len, d.hk, d.hv, d.dk, d.dv)
            .expect("cpu chunked");
    })
}

fn out_tol<T: CudaFloat>() -> f32 {
    if T::NAME == "f32" {
        TOL_CHUNK_F32
    } else {
        TOL_BF16
    }
}

/// Runs `calls` consecutive calls (the state carries over) of both GPU kernels
/// on separate state pools, and compares outputs and the whole pools with each
/// other and with the CPU chunked reference after each call.
fn chunk_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    d: GdnDims,
    num_slots: usize,
    nbuf: usize,
    calls: &[&[Span]],
) {
    let mut state = rng.vec(num_slots * nbuf * d.state(), 0.5);
    let mut dstate = up::<f32>(k, &state);
    let mut dstate_seq = up::<f32>(k, &state);
    for (ci, spans) in calls.iter().enumerate() {
        let (flat, t, max_len) = span_table(delta_spans(spans));
        let (qkv, g, beta) = gdn_inputs(rng, d, t);
        let want = rnd_vec::<T>(&chunk_ref(d, &qkv, &g, &beta, &mut state, spans, nbuf));
        let (dq, dg, db, dsp) = (up::<f32>(k, &qkv), up::<f32>(k, &g), up::<f32>(k, &beta), up_u32(k, &flat));
        let n = spans.len();
        let mut out = poisoned::<T>(k, t * d.hv * d.dv);
        k.gdn_chunked_seq(
            &dq,
            &dg,
            &db,
            &mut dstate,
            &dsp,
            &mut out,
            t,
            n,
            max_len,
            d.hk,
            d.hv,
            d.dk,
            d.dv,
            num_slots,
            nbuf,
        )
        .expect("gdn_chunked_seq");
        let mut out_seq = poisoned::<T>(k, t * d.hv * d.dv);
        k.gdn_delta_seq(
            &dq,
            &dg,
            &db,
            &mut dstate_seq,
            &dsp,
            &mut out_seq,
            t,
            n,
            max_len,
            d.hk,
            d.hv,
            d.dk,
            d.dv,
            num_slots,
            nbuf,
        )
        .expect("gdn_delta_seq");
        let what = format!("chunked {} {d:?} call {ci} spans {spans:?}", T::NAME);
        let got = down(k, &out);
        let got_state = down(k, &dstate);
        check(&format!("{what}: out vs CPU chunked"), &got, &want, out_tol::<T>());
        check(&format!("{what}: state vs CPU chunked"), &got_state, &state, TOL_CHUNK_F32);
        check(&format!("{what}: out vs gdn_delta_seq"), &got, &down(k, &out_seq), out_tol::<T>());
        check(&format!("{what}: state vs gdn_delta_seq"), &got_state, &down(k, &dstate_seq), TOL_CHUNK_F32);
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_chunked_seq_spans() {
    let k = gpu("cuda_gdn_chunked_seq_spans");
    let mut rng = Rng::new(201);
    // dk ≠ dv, hv / hk = 2; chunk-boundary lengths, several spans per call,
    // continuing from nonzero states (src_buf 1 of 2 for some).
    let d = GdnDims { hk: 2, hv: 4, dk: 64, dv: 96 };
    let calls: [&[Span]; 2] = [
        &[(1, 0, 0), (63, 1, 1), (64, 2, 0), (65, 3, 1), (200, 4, 0), (1000, 5, 1)],
        &[(1000, 2, 0), (65, 5, 1), (1, 4, 0), (200, 0, 0), (64, 1, 1), (63, 3, 1)],
    ];
    chunk_case::<f32>(&k, &mut rng, d, 6, 2, &calls);
    chunk_case::<bf16>(&k, &mut rng, d, 6, 2, &calls);
    chunk_case::<f16>(&k, &mut rng, d, 6, 2, &calls);
    // Odd dims (rows beyond dk / columns beyond dv in the blocks), dk = dv = 256.
    chunk_case::<f32>(&k, &mut rng, GdnDims { hk: 1, hv: 2, dk: 5, dv: 7 }, 2, 1, &[&[(3, 0, 0), (130, 1, 0)]]);
    chunk_case::<f32>(&k, &mut rng, GdnDims { hk: 1, hv: 3, dk: 200, dv: 70 }, 2, 1, &[&[(129, 1, 0), (9, 0, 0)]]);
    chunk_case::<bf16>(&k, &mut rng, GdnDims { hk: 1, hv: 1, dk: 256, dv: 256 }, 1, 1, &[&[(150, 0, 0)]]);
}

/// Best of 3 timed calls (synchronised), in µs.
fn best_us(k: &CudaKernels, mut f: impl FnMut()) -> f64 {
    f();
    k.stream().synchronize().expect("sync");
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = Instant::now();
        f();
        k.stream().synchronize().expect("sync");
        best = best.min(t0.elapsed().as_secs_f64() * 1e6);
    }
    best
}

/// Times the chunked and the sequential delta rule at the 80B head layout; `check` first
/// compares the chunked form against the CPU reference (left out at 16k tokens, where the
/// CPU reference alone would take longer than the timing).
fn prefill_80b<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, spans: &[Span], num_slots: usize, check: bool) {
    let d = GdnDims { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D };
    if check {
        chunk_case::<T>(k, rng, d, num_slots, 1, &[spans]);
    }
    let (flat, t, max_len) = span_table(delta_spans(spans));
    let n = spans.len();
    let (qkv, g, beta) = gdn_inputs(rng, d, t);
    let (dq, dg, db, dsp) = (up::<f32>(k, &qkv), up::<f32>(k, &g), up::<f32>(k, &beta), up_u32(k, &flat));
    let mut dstate = up::<f32>(k, &rng.vec(num_slots * d.state(), 0.5));
    let mut out = poisoned::<T>(k, t * d.hv * d.dv);
    let (hk, hv, dk, dv) = (d.hk, d.hv, d.dk, d.dv);
    let chunk_us = best_us(k, || {
        k.gdn_chunked_seq(&dq, &dg, &db, &mut dstate, &dsp, &mut out, t, n, max_len, hk, hv, dk, dv, num_slots, 1)
            .expect("gdn_chunked_seq");
    });
    let seq_us = best_us(k, || {
        k.gdn_delta_seq(&dq, &dg, &db, &mut dstate, &dsp, &mut out, t, n, max_len, hk, hv, dk, dv, num_slots, 1)
            .expect("gdn_delta_seq");
    });
    // The chunked delta rule's matrix products, per 64-token chunk and value head:
    // K·Kᵀ, A·K (W), A·V (U), Q·Kᵀ, (Q·Kᵀ)·V' at 2·C²·d each and Q·S, W·S, Kᵀ·V' at
    // 2·C·d² each (the triangular solve not counted); scripts/fla_gdn_bench.py counts the same.
    let flop = (t as f64) * (hv as f64) * (10.0 * 64.0 * dk as f64 + 6.0 * (dk * dv) as f64);
    println!(
        "  80B {} t {t} spans {n}: gdn_chunked_seq {chunk_us:.1} µs ({:.1} TFLOP/s), gdn_delta_seq {seq_us:.1} µs ({:.2}x)",
        T::NAME,
        flop / chunk_us * 1e-6,
        seq_us / chunk_us
    );
    let mut laps = [f64::INFINITY; 4];
    for _ in 0..3 {
        let us = k
            .gdn_chunked_seq_timed(
                &dq,
                &dg,
                &db,
                &mut dstate,
                &dsp,
                &mut out,
                t,
                n,
                max_len,
                hk,
                hv,
                dk,
                dv,
                num_slots,
                1,
            )
            .expect("gdn_chunked_seq_timed");
        for (b, u) in laps.iter_mut().zip(us) {
            *b = b.min(u);
        }
    }
    println!(
        "    per launch (synchronised, best of 3): prep {:.1} µs, wu {:.1} µs, state {:.1} µs, out {:.1} µs",
        laps[0], laps[1], laps[2], laps[3]
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_chunked_seq_80b_prefill() {
    let k = gpu("cuda_gdn_chunked_seq_80b_prefill");
    let mut rng = Rng::new(202);
    prefill_80b::<bf16>(&k, &mut rng, &[(4096, 1, 0)], 2, true);
    prefill_80b::<bf16>(&k, &mut rng, &[(16384, 0, 0)], 1, false);
    prefill_80b::<f32>(&k, &mut rng, &[(4096, 0, 0)], 1, true);
    prefill_80b::<bf16>(&k, &mut rng, &[(1000, 0, 0), (3, 1, 0), (500, 2, 0)], 3, true);
}
