//! The chunked Gated DeltaNet prefill (`kernels/cuda/gdn_chunk.cu`,
//! `CudaKernels::gdn_chunked_seq`) against the recurrent GPU kernel
//! (`gdn_delta_seq`, same inputs) and the CPU chunked reference
//! (`cpu::gdn::chunked_gated_delta_rule` per span): f32 / bf16 / f16 qkv (the conv output,
//! rounded to the type; the reference takes the rounded values) and outputs,
//! spans of 1, 63, 64, 65, 200 and 1000 tokens in one call continuing from
//! nonzero states (twice), dk ≠ dv, hv / hk = 2, inputs whose triangular inverse reaches
//! across the whole chunk (`long_range_inputs`), and the Qwen3-Next-80B dims at a
//! 4096-token prefill (timed against `gdn_delta_seq`, per launch).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with
//! `--include-ignored`; without a GPU they then fail, saying so), the ptxas
//! check `#[ignore = "needs NVRTC ..."]`. Outputs are NaN-poisoned before every launch.

mod common;

use common::gdn::*;
use common::timing::{time_calls, Hold};
use common::*;
use half::{bf16, f16};
use porter_kernels::cpu::gdn;
use porter_kernels::cuda::{CudaFloat, CudaKernels, GdnChunkForm};

/// Relative tolerance (of max |ref|) of f32 outputs and of the state.
const TOL_CHUNK_F32: f32 = 1e-4;

// ---------------------------------------------------------------------------
// NVRTC only: register use / spills (ptxas -v).
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_gdn_chunk_ptxas_info() {
    let lines = ptxas_info("nvrtc_gdn_chunk_ptxas_info", "gdn_chunk.cu");
    let mut spills = Vec::new();
    for (func, line) in lines {
        println!("{func}: {line}");
        // The tensor-core wu launch runs under __launch_bounds__(256, 3) (80 registers, for 3
        // blocks per SM): a spill there would cost more than the occupancy gains.
        let hot = func.starts_with("gdn_chunk_tc_wu_")
            || func.starts_with("gdn_chunk_tc2_")
            || func.starts_with("gdn_chunk_tc3_")
            || func.starts_with("gdn_chunk_tc4_")
            || func.starts_with("gdn_chunk_tc5_")
            || func.starts_with("gdn_chunk_tc6_")
            || func.starts_with("gdn_chunk_tc7_");
        // Including `_o3` / `_pad_o3`, the 3-blocks-an-SM builds of the tc4 wu launch (80
        // registers): with q / k / v in the activation type they no longer spill.
        if hot && line.contains("spill") && !line.contains(" 0 bytes spill stores") {
            spills.push(func);
        }
    }
    assert!(spills.is_empty(), "gdn_chunk_tc_wu kernels with spills: {spills:?}");
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// One span: `(len, slot, src_buf)` (never a snapshot span).
type Span = (usize, usize, usize);

/// A generator of one call's inputs `(qkv, g, beta)` for `t` rows ([`gdn_inputs`],
/// [`long_range_inputs`]).
type Inputs = fn(&mut Rng, GdnDims, usize) -> (Vec<f32>, Vec<f32>, Vec<f32>);

/// Inputs under which T = (I − A)⁻¹ reaches across the whole chunk (what the off-diagonal
/// levels of the blockwise inverse, `gc_tril_inverse`, compute): weak decays (g in
/// [−0.02, 0): Γ over a chunk ≥ e^−1.3), the keys of a key head sharing one direction
/// (k = u + noise, u and the noise of the same size: k·k' ≈ 0.5 after the norm) and small
/// β in [0.05, 0.35], so A_im ≈ −0.1 and T's entries 16..48 rows below the diagonal stay at
/// ~1e-2..1e-3. ([`gdn_inputs`]' decays of −0.5..−8 a row leave them below 1e-4, so a wrong
/// off-diagonal block would hardly show there.)
fn long_range_inputs(rng: &mut Rng, d: GdnDims, t: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let w = d.width();
    let mut qkv = rng.vec(t * w, 1.0);
    let dirs = rng.vec(d.hk * d.dk, 1.0);
    for row in qkv.chunks_exact_mut(w) {
        for (k, u) in row[d.hk * d.dk..2 * d.hk * d.dk].iter_mut().zip(&dirs) {
            *k = u + rng.f(1.0);
        }
    }
    let g = (0..t * d.hv).map(|_| -0.01 * (1.0 + rng.f(1.0))).collect();
    let beta = (0..t * d.hv).map(|_| 0.2 + rng.f(0.15)).collect();
    (qkv, g, beta)
}

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

/// Tolerances of the tensor-core form (bf16 / f16 outputs), relative to max |ref|, outputs
/// and final states. Its products take operands rounded to bf16 (relative error ≤ 2⁻⁹ each,
/// ~2⁻⁸·⁵ per product of two, random in sign): a sum over d = 128 (or 64 chunk rows) of such
/// terms keeps that relative size, ~3e-3 rms of the sum, so ~1e-2 at the 4–5σ tail of
/// 10⁵–10⁶ elements for one product; the state update adds the error of Vn = U − W·S (S
/// rounded for the product, cancellation in the difference) and carries it over the chunks
/// (damped by the decays), the output adds Q·S with the rounded state and its own rounding
/// to bf16 (2⁻⁹). Measured against max |ref| this leaves outputs at ≤ 2e-2 and states at
/// ≤ 1e-2 with margin; f16 operands (2⁻¹¹) sit ~8× lower. The f32 form's error on the same
/// inputs is printed beside it (TOL_BF16 for bf16 outputs, 1e-4 for its f32 states).
const TOL_TC_OUT: f32 = 2e-2;
const TOL_TC_STATE: f32 = 1e-2;

/// Error of `got` against `want`: the largest |Δ| (NaN where `want` is not NaN counts as
/// infinite), its index, and that largest |Δ| over max |want| and over std(want).
struct ErrStat {
    max: f32,
    at: usize,
    rel_max: f32,
    rel_std: f32,
}

fn err_stat(got: &[f32], want: &[f32]) -> ErrStat {
    assert_eq!(got.len(), want.len(), "lengths");
    let n = want.len().max(1) as f64;
    let mean = want.iter().map(|&v| v as f64).sum::<f64>() / n;
    let std = (want.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt().max(1e-30) as f32;
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    let (mut max, mut at) = (0.0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = if g.is_nan() && !w.is_nan() { f32::INFINITY } else { (g - w).abs() };
        if d > max {
            (max, at) = (d, i);
        }
    }
    ErrStat { max, at, rel_max: max / scale, rel_std: max / std }
}

/// `[rows, hv, dv]` index `at` as "row r head j col c".
fn out_at(d: GdnDims, at: usize) -> String {
    format!("row {} head {} col {}", at / (d.hv * d.dv), at / d.dv % d.hv, at % d.dv)
}

/// `[num_slots, nbuf, hv, dk, dv]` index `at` as "slot/buf head j row r col c".
fn state_at(d: GdnDims, nbuf: usize, at: usize) -> String {
    let (sl, hsz) = (d.state(), d.dk * d.dv);
    format!(
        "slot {} buf {} head {} k {} v {}",
        at / sl / nbuf,
        at / sl % nbuf,
        at % sl / hsz,
        at % hsz / d.dv,
        at % d.dv
    )
}

/// Prints one comparison and records a failure above `tol`.
fn judge(fails: &mut Vec<String>, what: &str, e: &ErrStat, where_: String, tol: f32) {
    let ok = e.rel_max <= tol;
    println!(
        "    {what}: max|Δ| {:.3e} at {where_}, /max|ref| {:.3e}, /std(ref) {:.3e} (tol {tol:.0e}){}",
        e.max,
        e.rel_max,
        e.rel_std,
        if ok { "" } else { "  FAIL" }
    );
    if !ok {
        fails.push(format!("{what}: max|Δ|/max|ref| {:.3e} > {tol:.0e} at {where_}", e.rel_max));
    }
}

/// Whether the tensor-core form should run for `T` and these dims on this device.
fn tc_expected<T: CudaFloat>(k: &CudaKernels, d: GdnDims) -> bool {
    let caps = k.caps();
    T::NAME != "f32"
        && caps.tensor_cores()
        && caps.smem_limit() >= 124 * 1024
        && (d.dk == 64 || d.dk == 128)
        && d.dv.is_multiple_of(32)
        && d.dv <= 256
}

/// The form `want` (tc2: the mma.sync state sweep, 3 stages of 129 KiB at dk = 128, 32
/// columns a block; tc3: the same writing the outputs, 207 KiB; tc4: tc3 with the mma.sync wu
/// launch, 68 KiB at dk = dv = 128) should run as where the tensor-core form does and its
/// shared memory fits.
fn tc2_expected<T: CudaFloat>(k: &CudaKernels, d: GdnDims, want: GdnChunkForm) -> bool {
    let kb = 2 * 64 * (d.dk + 8);
    let fused = matches!(
        want,
        GdnChunkForm::Tc3 | GdnChunkForm::Tc4 | GdnChunkForm::Tc5 | GdnChunkForm::Tc6 | GdnChunkForm::Tc7
    );
    let stage = 2 * kb + 4 * 64 * 36 + if fused { kb + 2 * 64 * 72 } else { 0 };
    let wu4 = 2 * kb + 2 * 64 * (d.dv + 8) + 4 * 64 * 68;
    // tc5: the warp pairs' exchange, (2 + dk / 32) 512-byte fragments a warp, 4 warps.
    // (tc7 runs where tc5 fits: its stages are smaller by more than its larger exchange.)
    let pairs = if matches!(want, GdnChunkForm::Tc5 | GdnChunkForm::Tc6 | GdnChunkForm::Tc7) {
        4 * (2 + d.dk / 32) * 512
    } else {
        0
    };
    let limit = k.caps().smem_limit();
    tc_expected::<T>(k, d)
        && limit >= 3 * stage + pairs + 2048
        && (!matches!(want, GdnChunkForm::Tc4 | GdnChunkForm::Tc5 | GdnChunkForm::Tc6 | GdnChunkForm::Tc7)
            || limit >= wu4 + 2048)
}

/// The name of the form `want` runs as where [`tc2_expected`] holds: tc6 (clusters of 2
/// column blocks unless `PORTER_GDN_TC6_CLUSTER` says 1 or 4) only on an sm_90 device whose
/// dv / 32 blocks divide into clusters, else tc5; tc7 where tc6 runs in clusters of 2, else as
/// tc6.
fn expected_name(k: &CudaKernels, d: GdnDims, want: GdnChunkForm) -> &'static str {
    let caps = k.caps();
    let cl = match std::env::var(porter_kernels::cuda::GDN_TC6_CLUSTER_ENV).as_deref().map(str::trim) {
        Ok("1") => 1,
        Ok("4") => 4,
        _ => 2,
    };
    match want {
        GdnChunkForm::Tc6 if !(caps.sm90a() && (d.dv / 32).is_multiple_of(cl)) => "tc5",
        GdnChunkForm::Tc7 if !(caps.sm90a() && (d.dv / 32).is_multiple_of(cl)) => "tc5",
        GdnChunkForm::Tc7 if cl != 2 => "tc6",
        w => form_name(w),
    }
}

/// The name [`CudaKernels::gdn_chunked_seq_with`] returns for a form that ran as asked.
fn form_name(f: GdnChunkForm) -> &'static str {
    match f {
        GdnChunkForm::Tc => "tc",
        GdnChunkForm::Tc2 => "tc2",
        GdnChunkForm::Tc3 => "tc3",
        GdnChunkForm::Tc4 => "tc4",
        GdnChunkForm::Tc5 => "tc5",
        GdnChunkForm::Tc6 => "tc6",
        GdnChunkForm::Tc7 => "tc7",
        GdnChunkForm::F32 => "f32",
    }
}

/// Tolerances (outputs, states) of a form that ran.
fn form_tols<T: CudaFloat>(form: &str) -> (f32, f32) {
    if matches!(form, "tc" | "tc2" | "tc3" | "tc4" | "tc5" | "tc6" | "tc7") {
        (TOL_TC_OUT, TOL_TC_STATE)
    } else {
        (out_tol::<T>(), TOL_CHUNK_F32)
    }
}

/// Runs `calls` consecutive calls (the state carries over) of the default form (for bf16 /
/// f16 the tensor-core form where it applies), of the tc2, tc3 and tc4 forms (bf16 / f16 only), of the f32
/// form and of `gdn_delta_seq` on separate state pools, and compares outputs and the whole
/// pools with the CPU chunked reference after each call (the f32 form also with
/// `gdn_delta_seq`). `inputs` makes each call's inputs. Failures are collected in `fails`.
#[allow(clippy::too_many_arguments)]
fn chunk_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    inputs: Inputs,
    d: GdnDims,
    num_slots: usize,
    nbuf: usize,
    calls: &[&[Span]],
    fails: &mut Vec<String>,
) {
    let mut state = rng.vec(num_slots * nbuf * d.state(), 0.5);
    let mut dstate = up::<f32>(k, &state);
    let mut extra = [
        (GdnChunkForm::Tc2, up::<f32>(k, &state)),
        (GdnChunkForm::Tc3, up::<f32>(k, &state)),
        (GdnChunkForm::Tc4, up::<f32>(k, &state)),
        (GdnChunkForm::Tc5, up::<f32>(k, &state)),
        (GdnChunkForm::Tc6, up::<f32>(k, &state)),
        (GdnChunkForm::Tc7, up::<f32>(k, &state)),
    ];
    let mut dstate_f32 = up::<f32>(k, &state);
    let mut dstate_seq = up::<f32>(k, &state);
    let tc = tc_expected::<T>(k, d);
    for (ci, spans) in calls.iter().enumerate() {
        let (flat, t, max_len) = span_table(delta_spans(spans));
        let (qkv, g, beta) = inputs(rng, d, t);
        let qkv = rnd_vec::<T>(&qkv); // the conv output, stored in T: the reference sees the same
        let want = rnd_vec::<T>(&chunk_ref(d, &qkv, &g, &beta, &mut state, spans, nbuf));
        let (dq, dg, db, dsp) = (up::<T>(k, &qkv), up::<f32>(k, &g), up::<f32>(k, &beta), up_u32(k, &flat));
        let n = spans.len();
        let dims = [t, n, max_len, d.hk, d.hv, d.dk, d.dv, num_slots, nbuf];
        let mut out = poisoned::<T>(k, t * d.hv * d.dv);
        let form = k
            .gdn_chunked_seq_with(&dq, &dg, &db, &mut dstate, &dsp, &mut out, dims, GdnChunkForm::Tc, None)
            .expect("gdn_chunked_seq");
        let mut out_f32 = poisoned::<T>(k, t * d.hv * d.dv);
        let form_f32 = k
            .gdn_chunked_seq_with(&dq, &dg, &db, &mut dstate_f32, &dsp, &mut out_f32, dims, GdnChunkForm::F32, None)
            .expect("gdn_chunked_seq f32 form");
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
            None,
        )
        .expect("gdn_delta_seq");
        let what = format!("chunked {} {d:?} call {ci} spans {spans:?}", T::NAME);
        println!("  {what}: form {form} (f32 form: {form_f32})");
        if tc && form != "tc" {
            fails.push(format!("{what}: expected the tensor-core form, ran {form}"));
        }
        let (got, got_state) = (down(k, &out), down(k, &dstate));
        let (got_f, got_state_f) = (down(k, &out_f32), down(k, &dstate_f32));
        let (tol_out, tol_state) = form_tols::<T>(form);
        let e = err_stat(&got, &want);
        judge(fails, &format!("{what}: {form} out vs CPU"), &e, out_at(d, e.at), tol_out);
        let e = err_stat(&got_state, &state);
        judge(fails, &format!("{what}: {form} state vs CPU"), &e, state_at(d, nbuf, e.at), tol_state);
        // (form that ran, outputs, pool) of each extra form, for the bit-for-bit check below.
        let mut ran: Vec<(&str, Vec<f32>, Vec<f32>)> = Vec::new();
        for (want2, dstate2) in extra.iter_mut().filter(|_| T::NAME != "f32") {
            // The tc2 / tc3 / tc4 / tc5 forms (own pools), same tolerances as the tensor-core form.
            let mut out2 = poisoned::<T>(k, t * d.hv * d.dv);
            let form2 = k
                .gdn_chunked_seq_with(&dq, &dg, &db, dstate2, &dsp, &mut out2, dims, *want2, None)
                .expect("gdn_chunked_seq tc2 .. tc7 form");
            let name2 = expected_name(k, d, *want2);
            if tc2_expected::<T>(k, d, *want2) && form2 != name2 {
                fails.push(format!("{what}: expected the {name2} form, ran {form2}"));
            }
            let (tol_out, tol_state) = form_tols::<T>(form2);
            let (got2, got_state2) = (down(k, &out2), down(k, &*dstate2));
            let e = err_stat(&got2, &want);
            judge(fails, &format!("{what}: {form2} out vs CPU"), &e, out_at(d, e.at), tol_out);
            let e = err_stat(&got_state2, &state);
            judge(fails, &format!("{what}: {form2} state vs CPU"), &e, state_at(d, nbuf, e.at), tol_state);
            ran.push((form2, got2, got_state2));
        }
        // tc5 splits each of tc4's state-sweep warps into a pair that sums in tc4's order, and
        // tc6 is tc5 with its stages filled across a cluster: the same bits, outputs (NaN poison
        // included) and states (own pools, same inputs throughout).
        let find = |name: &str| ran.iter().find(|r| r.0 == name);
        for (new, old) in [("tc5", "tc4"), ("tc6", "tc5")] {
            let (Some(a), Some(b)) = (find(new), find(old)) else { continue };
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let mut same = true;
            for (part, x, y) in [("out", &a.1, &b.1), ("state", &a.2, &b.2)] {
                let (bx, by) = (bits(x), bits(y));
                if let Some(i) = bx.iter().zip(&by).position(|(p, q)| p != q) {
                    same = false;
                    fails.push(format!("{what}: {new} {part} differs from {old} at {i}: {} vs {}", x[i], y[i]));
                }
            }
            println!("    {new} ≡ {old} bit for bit: {same}");
        }
        if form != form_f32 {
            let e = err_stat(&got_f, &want);
            judge(fails, &format!("{what}: {form_f32} out vs CPU"), &e, out_at(d, e.at), out_tol::<T>());
            let e = err_stat(&got_state_f, &state);
            judge(fails, &format!("{what}: {form_f32} state vs CPU"), &e, state_at(d, nbuf, e.at), TOL_CHUNK_F32);
        }
        let e = err_stat(&got_f, &down(k, &out_seq));
        judge(fails, &format!("{what}: {form_f32} out vs gdn_delta_seq"), &e, out_at(d, e.at), out_tol::<T>());
        let e = err_stat(&got_state_f, &down(k, &dstate_seq));
        let at = state_at(d, nbuf, e.at);
        judge(fails, &format!("{what}: {form_f32} state vs gdn_delta_seq"), &e, at, TOL_CHUNK_F32);
    }
}

/// A call whose last span names slot `num_slots` (out of range) after valid spans: its rows
/// must come out NaN, every state but the valid spans' untouched, the valid rows and states
/// as the CPU reference (same tolerances as [`chunk_case`]).
fn invalid_slot_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, d: GdnDims, fails: &mut Vec<String>) {
    let (num_slots, nbuf) = (2, 1);
    let valid: &[Span] = &[(70, 0, 0), (5, 1, 0)];
    let bad_len = 100;
    let (mut flat, t1, _) = span_table(delta_spans(valid));
    flat.extend_from_slice(&[t1 as u32, bad_len as u32, num_slots as u32, 0, 0]);
    let t = t1 + bad_len;
    let state0 = rng.vec(num_slots * nbuf * d.state(), 0.5);
    let mut state = state0.clone();
    let (qkv, g, beta) = gdn_inputs(rng, d, t);
    let qkv = rnd_vec::<T>(&qkv); // stored in T, as the kernels read it
    let (w, hv) = (d.width(), d.hv);
    let want = rnd_vec::<T>(&chunk_ref(d, &qkv[..t1 * w], &g[..t1 * hv], &beta[..t1 * hv], &mut state, valid, nbuf));
    let (dq, dg, db, dsp) = (up::<T>(k, &qkv), up::<f32>(k, &g), up::<f32>(k, &beta), up_u32(k, &flat));
    for want_form in [
        GdnChunkForm::Tc,
        GdnChunkForm::Tc2,
        GdnChunkForm::Tc3,
        GdnChunkForm::Tc4,
        GdnChunkForm::Tc5,
        GdnChunkForm::Tc6,
        GdnChunkForm::Tc7,
        GdnChunkForm::F32,
    ] {
        let dims = [t, 3, bad_len, d.hk, d.hv, d.dk, d.dv, num_slots, nbuf];
        let mut out = poisoned::<T>(k, t * d.hv * d.dv);
        let mut pool = up::<f32>(k, &state0);
        let form = k
            .gdn_chunked_seq_with(&dq, &dg, &db, &mut pool, &dsp, &mut out, dims, want_form, None)
            .expect("gdn_chunked_seq");
        let what = format!("invalid slot {} {d:?} {form}", T::NAME);
        let got = down(k, &out);
        let nan_rows = got[t1 * hv * d.dv..].iter().all(|v| v.is_nan());
        println!("  {what}: rows of the invalid span all NaN: {nan_rows}");
        if !nan_rows {
            fails.push(format!("{what}: rows of the invalid span not all NaN"));
        }
        let (tol_out, tol_state) = form_tols::<T>(form);
        let e = err_stat(&got[..t1 * hv * d.dv], &want);
        judge(fails, &format!("{what}: out vs CPU"), &e, out_at(d, e.at), tol_out);
        let e = err_stat(&down(k, &pool), &state);
        judge(fails, &format!("{what}: state vs CPU"), &e, state_at(d, nbuf, e.at), tol_state);
    }
}

/// Panics with every collected failure.
fn finish(test: &str, fails: &[String]) {
    assert!(fails.is_empty(), "{test}: {} failed comparisons:\n{}", fails.len(), fails.join("\n"));
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_chunked_seq_spans() {
    let k = gpu("cuda_gdn_chunked_seq_spans");
    let mut rng = Rng::new(201);
    let mut fails = Vec::new();
    // dk ≠ dv, hv / hk = 2; chunk-boundary lengths, several spans per call,
    // continuing from nonzero states (src_buf 1 of 2 for some).
    let d = GdnDims { hk: 2, hv: 4, dk: 64, dv: 96 };
    let calls: [&[Span]; 2] = [
        &[(1, 0, 0), (63, 1, 1), (64, 2, 0), (65, 3, 1), (200, 4, 0), (1000, 5, 1)],
        &[(1000, 2, 0), (65, 5, 1), (1, 4, 0), (200, 0, 0), (64, 1, 1), (63, 3, 1)],
    ];
    chunk_case::<f32>(&k, &mut rng, gdn_inputs, d, 6, 2, &calls, &mut fails);
    chunk_case::<bf16>(&k, &mut rng, gdn_inputs, d, 6, 2, &calls, &mut fails);
    chunk_case::<f16>(&k, &mut rng, gdn_inputs, d, 6, 2, &calls, &mut fails);
    // Odd dims (rows beyond dk / columns beyond dv in the blocks), dk = dv = 256 (the f32
    // form for every type: the tensor-core form takes dk 64 / 128 only).
    let odd: [&[Span]; 1] = [&[(3, 0, 0), (130, 1, 0)]];
    chunk_case::<f32>(&k, &mut rng, gdn_inputs, GdnDims { hk: 1, hv: 2, dk: 5, dv: 7 }, 2, 1, &odd, &mut fails);
    let odd: [&[Span]; 1] = [&[(129, 1, 0), (9, 0, 0)]];
    chunk_case::<f32>(&k, &mut rng, gdn_inputs, GdnDims { hk: 1, hv: 3, dk: 200, dv: 70 }, 2, 1, &odd, &mut fails);
    let big: [&[Span]; 1] = [&[(150, 0, 0)]];
    chunk_case::<bf16>(&k, &mut rng, gdn_inputs, GdnDims { hk: 1, hv: 1, dk: 256, dv: 256 }, 1, 1, &big, &mut fails);
    finish("cuda_gdn_chunked_seq_spans", &fails);
}

/// The tensor-core form (bf16 / f16) at its head dims: dk 128 with dv 128 / 256 / 32 and
/// dk 64 with dv 64, hv / hk = 2, spans of 1..63 rows, chunk-unaligned lengths, two state
/// buffers, two calls from nonzero states, long-range inverses ([`long_range_inputs`], f32
/// outputs too), and a span with an invalid slot; the f32 form's error on the same inputs
/// beside it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_chunked_seq_tc() {
    let k = gpu("cuda_gdn_chunked_seq_tc");
    let mut rng = Rng::new(203);
    let mut fails = Vec::new();
    let calls: [&[Span]; 2] = [
        &[(17, 0, 0), (63, 1, 1), (64, 2, 0), (129, 3, 1), (300, 4, 0), (1, 5, 1)],
        &[(300, 2, 1), (1, 0, 0), (130, 5, 0), (33, 4, 1)],
    ];
    for d in [
        GdnDims { hk: 2, hv: 4, dk: 128, dv: 128 },
        GdnDims { hk: 1, hv: 2, dk: 128, dv: 256 },
        GdnDims { hk: 2, hv: 4, dk: 128, dv: 32 },
        GdnDims { hk: 2, hv: 4, dk: 64, dv: 64 },
    ] {
        chunk_case::<bf16>(&k, &mut rng, gdn_inputs, d, 6, 2, &calls, &mut fails);
        chunk_case::<f16>(&k, &mut rng, gdn_inputs, d, 6, 2, &calls, &mut fails);
    }
    // Long-range inverses (weak decays, correlated keys, small β): the f32 form's states must
    // still meet 1e-4 (f32 outputs too), the tensor-core form its usual tolerances.
    let long: [&[Span]; 2] = [&[(64, 0, 0), (130, 1, 1), (17, 2, 0), (200, 3, 1)], &[(130, 0, 0), (64, 3, 1)]];
    for d in [GdnDims { hk: 2, hv: 4, dk: 128, dv: 128 }, GdnDims { hk: 2, hv: 4, dk: 64, dv: 64 }] {
        println!("  long-range inputs {d:?}:");
        chunk_case::<f32>(&k, &mut rng, long_range_inputs, d, 4, 2, &long, &mut fails);
        chunk_case::<bf16>(&k, &mut rng, long_range_inputs, d, 4, 2, &long, &mut fails);
        chunk_case::<f16>(&k, &mut rng, long_range_inputs, d, 4, 2, &long, &mut fails);
    }
    let d = GdnDims { hk: 2, hv: 4, dk: 128, dv: 128 };
    invalid_slot_case::<bf16>(&k, &mut rng, d, &mut fails);
    invalid_slot_case::<f16>(&k, &mut rng, d, &mut fails);
    finish("cuda_gdn_chunked_seq_tc", &fails);
}

/// GPU time per call, µs: CUDA events around 10 calls queued behind a hold
/// (common::timing), so host submission does not count.
fn gpu_us(k: &CudaKernels, hold: &mut Hold, mut f: impl FnMut()) -> f64 {
    time_calls(k, hold, 10, &mut |_| f()) * 1e6
}

/// Times the chunked delta rule (for bf16 / f16: the tc4, tc3, tc2, tc and f32 forms; tc4 beside
/// tc3 at the end) and the
/// sequential one at the 80B head layout, each call by CUDA events over 10 calls and each
/// launch by events around it (best of 3), µs and TFLOP/s; `check` first compares the chunked
/// forms against the CPU reference (left out at 16k tokens, where the CPU reference alone
/// would take longer than the timing).
fn prefill_80b<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    spans: &[Span],
    num_slots: usize,
    check: bool,
    fails: &mut Vec<String>,
) {
    let d = GdnDims { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D };
    if check {
        chunk_case::<T>(k, rng, gdn_inputs, d, num_slots, 1, &[spans], fails);
    }
    let (flat, t, max_len) = span_table(delta_spans(spans));
    let n = spans.len();
    let (qkv, g, beta) = gdn_inputs(rng, d, t);
    let (dq, dg, db, dsp) = (up::<T>(k, &qkv), up::<f32>(k, &g), up::<f32>(k, &beta), up_u32(k, &flat));
    let mut dstate = up::<f32>(k, &rng.vec(num_slots * d.state(), 0.5));
    let mut out = poisoned::<T>(k, t * d.hv * d.dv);
    let (hk, hv, dk, dv) = (d.hk, d.hv, d.dk, d.dv);
    let dims = [t, n, max_len, hk, hv, dk, dv, num_slots, 1];
    let mut hold = Hold::new(k);
    // The chunked delta rule's matrix products, per 64-token chunk and value head:
    // K·Kᵀ, A·K (W), A·V (U), Q·Kᵀ, (Q·Kᵀ)·V' at 2·C²·d each and Q·S, W·S, Kᵀ·V' at
    // 2·C·d² each (the triangular solve not counted); scripts/fla_gdn_bench.py counts the same.
    // Per launch: wu K·Kᵀ, A·K, A·V; state W·S, Kᵀ·V'; out Q·Kᵀ, (Q·Kᵀ)·V', Q·S.
    let (c, dkf, dvf, rows) = (64.0, dk as f64, dv as f64, (t * hv) as f64);
    let flop = rows * (10.0 * c * dkf + 6.0 * dkf * dvf);
    let stage_flop = [0.0, rows * 6.0 * c * dkf, rows * 4.0 * dkf * dvf, rows * (4.0 * c * dkf + 2.0 * dkf * dvf)];
    let seq_us = gpu_us(k, &mut hold, || {
        k.gdn_delta_seq(&dq, &dg, &db, &mut dstate, &dsp, &mut out, t, n, max_len, hk, hv, dk, dv, num_slots, 1, None)
            .expect("gdn_delta_seq");
    });
    let forms: &[GdnChunkForm] = if T::NAME == "f32" {
        &[GdnChunkForm::F32]
    } else {
        &[
            GdnChunkForm::Tc7,
            GdnChunkForm::Tc6,
            GdnChunkForm::Tc5,
            GdnChunkForm::Tc4,
            GdnChunkForm::Tc3,
            GdnChunkForm::Tc2,
            GdnChunkForm::Tc,
            GdnChunkForm::F32,
        ]
    };
    let mut seen: Vec<(&str, f64, [f64; 4])> = Vec::new(); // (form, µs a call, per launch)
    for &want in forms {
        let mut form = "";
        let us = gpu_us(k, &mut hold, || {
            form = k
                .gdn_chunked_seq_with(&dq, &dg, &db, &mut dstate, &dsp, &mut out, dims, want, None)
                .expect("gdn_chunked_seq");
        });
        println!(
            "  80B {} t {t} spans {n}: gdn_chunked_seq [{form}] {us:.1} µs ({:.1} TFLOP/s), gdn_delta_seq {seq_us:.1} µs ({:.2}x)",
            T::NAME,
            flop / us * 1e-6,
            seq_us / us
        );
        let mut laps = [f64::INFINITY; 4];
        for _ in 0..3 {
            let mut lap = [0.0; 4];
            k.gdn_chunked_seq_with(&dq, &dg, &db, &mut dstate, &dsp, &mut out, dims, want, Some(&mut lap))
                .expect("gdn_chunked_seq timed");
            for (b, u) in laps.iter_mut().zip(lap) {
                *b = b.min(u);
            }
        }
        let tf = |k: usize| stage_flop[k] / laps[k] * 1e-6;
        println!(
            "    [{form}] per launch (CUDA events, best of 3): prep {:.1} µs, wu {:.1} µs ({:.1} TFLOP/s), \
             state {:.1} µs ({:.1} TFLOP/s), out {:.1} µs ({:.1} TFLOP/s); sum {:.1} µs",
            laps[0],
            laps[1],
            tf(1),
            laps[2],
            tf(2),
            laps[3],
            tf(3),
            laps.iter().sum::<f64>()
        );
        seen.push((form, us, laps));
    }
    let find = |name: &str| seen.iter().find(|x| x.0 == name);
    // Each form against the one it grew from: the call, then its wu and state launches.
    for (new, old) in [("tc7", "tc6"), ("tc6", "tc5"), ("tc5", "tc4"), ("tc4", "tc3")] {
        if let (Some(n), Some(o)) = (find(new), find(old)) {
            println!(
                "    {new} vs {old} ({} t {t}): call {:.1} vs {:.1} µs ({:.2}x), wu {:.1} vs {:.1} µs ({:.2}x), \
                 state {:.1} vs {:.1} µs ({:.2}x)",
                T::NAME,
                n.1,
                o.1,
                o.1 / n.1,
                n.2[1],
                o.2[1],
                o.2[1] / n.2[1],
                n.2[2],
                o.2[2],
                o.2[2] / n.2[2]
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_chunked_seq_80b_prefill() {
    let k = gpu("cuda_gdn_chunked_seq_80b_prefill");
    let mut rng = Rng::new(202);
    let mut fails = Vec::new();
    prefill_80b::<bf16>(&k, &mut rng, &[(4096, 1, 0)], 2, true, &mut fails);
    prefill_80b::<bf16>(&k, &mut rng, &[(16384, 0, 0)], 1, false, &mut fails);
    prefill_80b::<f32>(&k, &mut rng, &[(4096, 0, 0)], 1, true, &mut fails);
    prefill_80b::<bf16>(&k, &mut rng, &[(1000, 0, 0), (3, 1, 0), (500, 2, 0)], 3, true, &mut fails);
    finish("cuda_gdn_chunked_seq_80b_prefill", &fails);
}
