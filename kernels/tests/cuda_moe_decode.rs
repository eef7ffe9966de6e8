//! The MoE decode GEMVs (kernels/cuda/moe_decode.cu) in every form, v1 (two launches), v2
//! (one launch: ticketed items, gate+up -> down readiness counters, self-resetting counters)
//! and direct (two launches, no grouping), v1 and direct each with the streamed down kernel
//! (the default) and the legacy one (`V1Legacy`, `DirectLegacy`), and direct's down-L2
//! variant (`DirectL2`: the gate+up launch asks the down rows into L2),
//! through `CudaKernels::moe_decode_with`: against the CPU reference of
//! `porter_core::nn::Moe::forward` (tests/common/moe.rs) and against each other bit for bit
//! (the same per-pair order), at batch 1, 2, 4 and 8 on small shapes (aligned, odd, uneven
//! loads, bad ids, no valid id, the global-list grouping) and on the Qwen3-Next-80B-A3B shapes,
//! with batch invariance (row 0 alone = row 0 of the batch, bit for bit); then a timing table
//! per stage (CUDA events, calls queued behind a hold so that the host's submission is not
//! timed): µs and GB/s of each kernel (gate+up, down + combine) and of the whole call, every
//! form side by side, t = 1 .. 64; ptxas: no spills in the down kernels.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`).
//! Outputs are poisoned with NaN before every launch. The seed is printed; set
//! `PORTER_CUDA_SEED` to replay one.

mod common;

use common::moe::*;
use common::timing::{time_calls, Hold};
use common::*;
use cudarc::driver::{CudaSlice, DevicePtr};
use half::{bf16, f16};
use porter_kernels::cuda::{CudaFloat, CudaKernels, MoeGemv, MOE_PHASES_ALL};

fn dims5(d: Dims) -> [usize; 5] {
    [d.t, d.k, d.e, d.hidden, d.inter]
}

/// One decode call of form `which` on `x` / `idx` / `w` (any rows of them: `d.t`).
#[allow(clippy::too_many_arguments)]
fn run<T: CudaFloat>(
    kern: &CudaKernels,
    d: Dims,
    x: &impl DevicePtr<T>,
    idx: &impl DevicePtr<u32>,
    w: &impl DevicePtr<f32>,
    dev: &Device<T>,
    out: &mut CudaSlice<f32>,
    which: MoeGemv,
    phases: u32,
) {
    kern.moe_decode_with::<T>(x, idx, w, &dev.gate, &dev.up, &dev.down, out, dims5(d), which, phases)
        .unwrap_or_else(|err| panic!("moe_decode_with {which:?} {d:?}: {err}"));
}

/// Panics, naming the element (row, column) and both values, unless `a` and `b` are the same bits.
fn same_bits(what: &str, a: &[f32], b: &[f32], hidden: usize) {
    assert_eq!(a.len(), b.len(), "{what}: length");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()) {
        let diff = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        panic!(
            "{what}: {diff} of {} elements differ, first at {i} (row {}, column {}): {:e} vs {:e}",
            a.len(),
            i / hidden,
            i % hidden,
            a[i],
            b[i]
        );
    }
}

/// The forms compared bit for bit (the first, legacy v1, is the baseline).
const FORMS: [MoeGemv; 6] =
    [MoeGemv::V1Legacy, MoeGemv::V1, MoeGemv::V2, MoeGemv::DirectLegacy, MoeGemv::Direct, MoeGemv::DirectL2];

/// Every form on one case: each against the reference, every other form against legacy v1 bit
/// for bit, v2 twice (the counters it zeroes must leave the next call right), and row 0 alone
/// against row 0 of the batch (v1, v2 and direct).
fn parity_case<T: CudaFloat>(kern: &CudaKernels, what: &str, d: Dims, idx: Vec<u32>, rng: &mut Rng) {
    let inp = inputs::<T>(rng, d, idx);
    let want = reference::<T>(d, &inp);
    let dev = upload::<T>(kern, d, &inp);
    let what = format!("{what} {} {d:?}", T::NAME);
    let mut got = Vec::new();
    for which in FORMS.into_iter().chain([MoeGemv::V2]) {
        let mut out = poisoned::<f32>(kern, d.t * d.hidden);
        run::<T>(kern, d, &dev.x, &dev.idx, &dev.w, &dev, &mut out, which, MOE_PHASES_ALL);
        let o = down::<f32>(kern, &out);
        check(&format!("{what} {which:?}"), &o, &want, tol::<T>());
        got.push(o);
    }
    for (i, which) in FORMS.iter().enumerate().skip(1) {
        same_bits(&format!("{what}: {which:?} vs V1Legacy"), &got[i], &got[0], d.hidden);
    }
    same_bits(&format!("{what}: v2, second call"), &got[FORMS.len()], &got[2], d.hidden);
    if d.t > 1 {
        let one = Dims { t: 1, ..d };
        for which in [MoeGemv::V1, MoeGemv::V2, MoeGemv::Direct, MoeGemv::DirectL2] {
            let mut out = poisoned::<f32>(kern, d.hidden);
            let (x0, i0, w0) = (dev.x.slice(0..d.hidden), dev.idx.slice(0..d.k), dev.w.slice(0..d.k));
            run::<T>(kern, one, &x0, &i0, &w0, &dev, &mut out, which, MOE_PHASES_ALL);
            same_bits(
                &format!("{what}: row 0 alone ({which:?}) vs in the batch"),
                &down::<f32>(kern, &out),
                &got[1][..d.hidden],
                d.hidden,
            );
        }
    }
}

fn small<T: CudaFloat>(kern: &CudaKernels, rng: &mut Rng) {
    for t in [1, 2, 4, 8] {
        // Aligned (16-byte loads); hidden 72: a partial last column group of 8.
        let d = Dims { t, k: 2, e: 8, hidden: 72, inter: 40, bank: 8 };
        parity_case::<T>(kern, "aligned", d, random_routes(rng, d.t, d.k, d.e), rng);
        // Odd dims: scalar loads.
        let d = Dims { t, k: 3, e: 6, hidden: 37, inter: 21, bank: 6 };
        parity_case::<T>(kern, "odd", d, random_routes(rng, d.t, d.k, d.e), rng);
    }
    // k = e: every expert on every row.
    let d = Dims { t: 4, k: 4, e: 4, hidden: 64, inter: 24, bank: 4 };
    parity_case::<T>(kern, "k=e", d, random_routes(rng, d.t, d.k, d.e), rng);
    // 40 rows on expert 5 (passes of several rows), experts 8..32 idle.
    let d = Dims { t: 40, k: 3, e: 32, hidden: 64, inter: 48, bank: 32 };
    parity_case::<T>(kern, "uneven", d, skewed_routes(rng, d.t, d.k, 5, 8), rng);
    // Ids >= e are skipped; no valid id at all gives zeros.
    let d = Dims { t: 8, k: 2, e: 8, hidden: 32, inter: 16, bank: 8 };
    let mut idx = random_routes(rng, d.t, d.k, d.e);
    idx[1] = 8;
    idx[2 * d.k - 1] = u32::MAX;
    idx[d.t * d.k - 2] = 1000;
    parity_case::<T>(kern, "bad ids", d, idx, rng);
    let d = Dims { t: 2, k: 2, e: 4, hidden: 32, inter: 16, bank: 4 };
    parity_case::<T>(kern, "no valid id", d, vec![4, 100, u32::MAX, 7], rng);
    // e + n + 3·min(e, n) u32 past the in-block grouping's 40 KiB: moe_align's global lists.
    let d = Dims { t: 300, k: 8, e: 4096, hidden: 32, inter: 16, bank: 16 };
    parity_case::<T>(kern, "global lists", d, random_routes(rng, d.t, d.k, d.e), rng);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_decode_small_bf16() {
    let kern = gpu("moe_decode_small_bf16");
    small::<bf16>(&kern, &mut Rng::new(21));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_decode_small_f16() {
    let kern = gpu("moe_decode_small_f16");
    small::<f16>(&kern, &mut Rng::new(22));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_decode_small_f32() {
    let kern = gpu("moe_decode_small_f32");
    small::<f32>(&kern, &mut Rng::new(23));
}

/// Best-of-6 device-to-device copy bandwidth of 1 GiB, bytes/s, read + write counted (as
/// `porter_core::backend::cuda::copy_bandwidth`, the roofline `porter bench` reports).
fn copy_bandwidth(kern: &CudaKernels) -> f64 {
    let n = 1usize << 28;
    let s = kern.stream();
    let src = s.alloc_zeros::<f32>(n).expect("alloc");
    let mut dst = s.alloc_zeros::<f32>(n).expect("alloc");
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        let a = s.record_event(flags).expect("event");
        s.memcpy_dtod(&src, &mut dst).expect("dtod");
        let b = s.record_event(flags).expect("event");
        best = best.min(a.elapsed_ms(&b).expect("elapsed") as f64 / 1e3);
    }
    2.0 * (n * 4) as f64 / best
}

/// Seconds per call of form `which` stopping after `phases` (CUDA events around `iters` calls
/// queued behind a hold), cycling through `routes` (distinct expert sets, so that the weights
/// do not stay in L2).
#[allow(clippy::too_many_arguments)]
fn time_phase(
    kern: &CudaKernels,
    hold: &mut Hold,
    d: Dims,
    dev: &Device<bf16>,
    routes: &[CudaSlice<u32>],
    which: MoeGemv,
    phases: u32,
    iters: usize,
) -> f64 {
    let mut out = poisoned::<f32>(kern, d.t * d.hidden);
    let sec = time_calls(kern, hold, iters, &mut |i| {
        run::<bf16>(kern, d, &dev.x, &routes[i % routes.len()], &dev.w, dev, &mut out, which, phases)
    });
    if phases == MOE_PHASES_ALL {
        let got = down::<f32>(kern, &out);
        assert!(got.iter().all(|v| v.is_finite()), "{which:?} t={}: non-finite output", d.t);
    }
    sec
}

/// The forms timed at `t` rows: direct (both down kernels) only up to 16 rows (beyond, two
/// rows on one expert read its weights twice: far slower), v2 up to 16.
fn timed_forms(t: usize) -> Vec<MoeGemv> {
    let mut f = vec![MoeGemv::V1Legacy, MoeGemv::V1];
    if t <= 16 {
        f.extend([MoeGemv::V2, MoeGemv::DirectLegacy, MoeGemv::Direct, MoeGemv::DirectL2]);
    }
    f
}

/// The 80B shapes (bf16) at t = 1, 2, 4, 8, 16, 32, 64: every form against the reference
/// (every row), bit for bit against legacy v1, batch invariance; then µs and GB/s per kernel
/// (gate+up, down + combine) and per call of every form side by side.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_decode_80b_bf16() {
    let kern = gpu("moe_decode_80b_bf16");
    let mut rng = Rng::new(24);
    let bw = copy_bandwidth(&kern);
    let mut hold = Hold::new(&kern);
    println!("copy bandwidth (read + write): {:.0} GB/s", bw / 1e9);
    let mut summary = Vec::new();
    for t in [1usize, 2, 4, 8, 16, 32, 64] {
        let d = dims_80b(t);
        let idx = random_routes(&mut rng, d.t, d.k, d.e);
        let inp = inputs::<bf16>(&mut rng, d, idx);
        let want = reference::<bf16>(d, &inp);
        let dev = upload::<bf16>(&kern, d, &inp);
        let forms = timed_forms(t);
        let mut outs = Vec::new();
        for &which in &forms {
            let mut out = poisoned::<f32>(&kern, d.t * d.hidden);
            run::<bf16>(&kern, d, &dev.x, &dev.idx, &dev.w, &dev, &mut out, which, MOE_PHASES_ALL);
            let o = down::<f32>(&kern, &out);
            check(&format!("80b t={t} {which:?}"), &o, &want, tol::<bf16>());
            outs.push(o);
        }
        for (i, which) in forms.iter().enumerate().skip(1) {
            same_bits(&format!("80b t={t}: {which:?} vs V1Legacy"), &outs[i], &outs[0], d.hidden);
        }
        if t > 1 {
            for which in [MoeGemv::V1, MoeGemv::Direct, MoeGemv::DirectL2] {
                let mut out = poisoned::<f32>(&kern, d.hidden);
                let (x0, i0, w0) = (dev.x.slice(0..d.hidden), dev.idx.slice(0..d.k), dev.w.slice(0..d.k));
                run::<bf16>(&kern, Dims { t: 1, ..d }, &x0, &i0, &w0, &dev, &mut out, which, MOE_PHASES_ALL);
                same_bits(
                    &format!("80b t={t}: row 0 alone ({which:?}) vs in the batch"),
                    &down::<f32>(&kern, &out),
                    &outs[0][..d.hidden],
                    d.hidden,
                );
            }
        }
        // Timing: 16 distinct route sets (a set's 10·t experts are 21·t MB of L2 at most).
        let sets: Vec<Vec<u32>> = (0..16).map(|_| random_routes(&mut rng, d.t, d.k, d.e)).collect();
        let routes: Vec<CudaSlice<u32>> = sets.iter().map(|v| up_u32(&kern, v)).collect();
        let experts = sets.iter().map(|v| distinct_experts(v, d.e)).sum::<usize>() as f64 / sets.len() as f64;
        let per = (d.hidden * d.inter * 2) as f64 * experts;
        let (gu_bytes, dn_bytes) = (2.0 * per, per);
        let iters = if t <= 16 { 100 } else { 40 };
        for &which in &forms {
            // Cumulative: 0 nothing but the grouping (v1 / v2) or the scratch (direct), 1 +gate+up,
            // 3 the whole call (2 = 3 but for v2's combine).
            let st: Vec<f64> = [0, 1, MOE_PHASES_ALL]
                .iter()
                .map(|&p| time_phase(&kern, &mut hold, d, &dev, &routes, which, p, iters))
                .collect();
            let (gu, dn, full) = (st[1] - st[0], st[2] - st[1], st[2]);
            println!(
                "moe decode 80b t={t} {which:?}: {:.1} us/call, {:.1} MB ({experts:.1} experts), {:.0} GB/s = {:.0}% of copy \
                 bandwidth | grouping {:.1} us, gate+up {:.1} us {:.0} GB/s, down+combine {:.1} us {:.0} GB/s",
                full * 1e6,
                (gu_bytes + dn_bytes) / 1e6,
                (gu_bytes + dn_bytes) / full / 1e9,
                (gu_bytes + dn_bytes) / full / bw * 100.0,
                st[0] * 1e6,
                gu * 1e6,
                gu_bytes / gu / 1e9,
                dn * 1e6,
                dn_bytes / dn / 1e9,
            );
            summary.push((t, which, full, gu, dn, (gu_bytes + dn_bytes) / full / bw));
        }
    }
    println!("summary (us per call | gate+up | down+combine; the brief asks >= 3 TB/s per kernel):");
    for (t, which, sec, gu, dn, frac) in summary {
        println!(
            "  t={t} {which:?}: {:.1} us ({:.0}% of copy bandwidth) | {:.1} | {:.1}",
            sec * 1e6,
            frac * 100.0,
            gu * 1e6,
            dn * 1e6
        );
    }
}

/// ptxas (sm_90) of the decode kernels in both modules: the down kernels (streamed and
/// legacy, direct, with and without the shared expert, dense and FP8) must not spill.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_moe_decode_ptxas_info() {
    let mut spills = Vec::new();
    for source in ["moe.cu", "fp8.cu"] {
        for (func, line) in ptxas_info("nvrtc_moe_decode_ptxas_info", source) {
            if !(func.starts_with("moe_dec_") || func.starts_with("moe_dir_")) {
                continue;
            }
            println!("{source} {func}: {line}");
            if line.contains("spill") && !line.contains(" 0 bytes spill stores") {
                spills.push(func);
            }
        }
    }
    let bad: Vec<&String> =
        spills.iter().filter(|f| f.starts_with("moe_dec_downs_") || f.starts_with("moe_dir_down")).collect();
    assert!(bad.is_empty(), "MoE decode down kernels spill: {bad:?} (all with spills: {spills:?})");
}

/// The 80B shapes with FP8 experts (16 distinct weight sets stacked into 512 experts of their
/// own memory), bf16 activations, t = 1, 8, 64: every form against the CPU reference on the
/// dequantized weights and bit for bit against legacy v1; then µs and GB/s (e4m3 bytes) per
/// kernel and per call, side by side.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_decode_80b_fp8() {
    use common::fp8::{moe_ref, stack, W8};
    let kern = gpu("moe_decode_80b_fp8");
    let mut rng = Rng::new(25);
    let mut hold = Hold::new(&kern);
    let (e, k, h, i, bank) = (EXPERTS, TOP_K, HIDDEN, MOE_INTER, 16);
    let (g, u, dw) = (
        W8::new(&kern, &mut rng, bank * i, h),
        W8::new(&kern, &mut rng, bank * i, h),
        W8::new(&kern, &mut rng, bank * h, i),
    );
    let (gs, us, ds) = (stack(&kern, &g, e, bank), stack(&kern, &u, e, bank), stack(&kern, &dw, e, bank));
    let (gd, ud, dd) = (g.dense::<bf16>(), u.dense::<bf16>(), dw.dense::<bf16>());
    for t in [1usize, 8, 64] {
        let dims = [t, k, e, h, i];
        let x = rnd_vec::<bf16>(&rng.vec(t * h, 1.0));
        let idx = random_routes(&mut rng, t, k, e);
        let wt: Vec<f32> = (0..t * k).map(|_| rng.f(0.5) + 0.5).collect();
        let want = moe_ref::<bf16>(&x, &idx, &wt, &gd, &ud, &dd, dims, bank);
        let (xd, wd) = (up::<bf16>(&kern, &x), up::<f32>(&kern, &wt));
        let call = |r: &CudaSlice<u32>, out: &mut CudaSlice<f32>, which: MoeGemv, phases: u32| {
            kern.moe_experts_fp8_with::<bf16>(&xd, r, &wd, gs.dev(), us.dev(), ds.dev(), out, dims, which, phases)
                .unwrap_or_else(|err| panic!("moe_experts_fp8_with {which:?} t={t}: {err}"))
        };
        let forms = timed_forms(t);
        let id = up_u32(&kern, &idx);
        let mut outs = Vec::new();
        for &which in &forms {
            let mut out = poisoned::<f32>(&kern, t * h);
            call(&id, &mut out, which, MOE_PHASES_ALL);
            let o = down::<f32>(&kern, &out);
            check(&format!("80b fp8 t={t} {which:?}"), &o, &want, tol::<bf16>());
            outs.push(o);
        }
        for (q, which) in forms.iter().enumerate().skip(1) {
            same_bits(&format!("80b fp8 t={t}: {which:?} vs V1Legacy"), &outs[q], &outs[0], h);
        }
        let sets: Vec<Vec<u32>> = (0..16).map(|_| random_routes(&mut rng, t, k, e)).collect();
        let routes: Vec<CudaSlice<u32>> = sets.iter().map(|v| up_u32(&kern, v)).collect();
        let experts = sets.iter().map(|v| distinct_experts(v, e)).sum::<usize>() as f64 / sets.len() as f64;
        let (gu_bytes, dn_bytes) = (2.0 * (h * i) as f64 * experts, (h * i) as f64 * experts);
        let iters = if t <= 16 { 100 } else { 40 };
        let mut out = poisoned::<f32>(&kern, t * h);
        for &which in &forms {
            let st: Vec<f64> = [0, 1, MOE_PHASES_ALL]
                .iter()
                .map(|&p| time_calls(&kern, &mut hold, iters, &mut |q| call(&routes[q % 16], &mut out, which, p)))
                .collect();
            let (gu, dn, full) = (st[1] - st[0], st[2] - st[1], st[2]);
            println!(
                "moe decode 80b fp8 t={t} {which:?}: {:.1} us/call, {:.1} MB of e4m3 ({experts:.1} experts), {:.0} GB/s | \
                 grouping {:.1} us, gate+up {:.1} us {:.0} GB/s, down+combine {:.1} us {:.0} GB/s",
                full * 1e6,
                (gu_bytes + dn_bytes) / 1e6,
                (gu_bytes + dn_bytes) / full / 1e9,
                st[0] * 1e6,
                gu * 1e6,
                gu_bytes / gu / 1e9,
                dn * 1e6,
                dn_bytes / dn / 1e9,
            );
        }
        let got = down::<f32>(&kern, &out);
        assert!(got.iter().all(|v| v.is_finite()), "80b fp8 t={t}: non-finite output after the timing loop");
    }
}

/// Route sets that rotate through all `e` experts: set s, row r, slot j takes expert
/// ((s·t + r)·k + j) mod e (distinct within a row for k ≤ e), `sets` sets: so that a timing
/// loop over them reads every expert's weights in turn and no set's weights are still in L2
/// when it comes round again (512 experts of 80B bf16: 3.2 GB; FP8: 1.6 GB).
fn rotating_routes(t: usize, k: usize, e: usize, sets: usize) -> Vec<Vec<u32>> {
    (0..sets).map(|s| (0..t * k).map(|q| ((s * t * k + q) % e) as u32).collect()).collect()
}

/// Small-batch decode timing, new against old: the down-L2 direct form (`DirectL2`, the
/// default up to 40 pairs) against the direct form with and without its down kernel's prefetch
/// (`Direct`, `DirectLegacy`: the previous default) and v1, bf16 and FP8 experts, 80B shapes,
/// t = 1, 2, 4, 8: µs per call and TB/s of weight bytes (each distinct expert's gate, up and down
/// once) over 200 back-to-back calls (CUDA events, queued behind a hold), the routes rotating
/// through all 512 experts (FP8: 512 experts of their own memory, 16 distinct weight sets).
/// Each form's output is checked bit for bit against v1 first.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_decode_small_t_timing() {
    use common::fp8::{stack, W8};
    let kern = gpu("moe_decode_small_t_timing");
    let mut rng = Rng::new(26);
    let bw = copy_bandwidth(&kern);
    println!("copy bandwidth (read + write): {:.0} GB/s", bw / 1e9);
    let mut hold = Hold::new(&kern);
    let forms = [MoeGemv::V1, MoeGemv::DirectLegacy, MoeGemv::Direct, MoeGemv::DirectL2];
    let (e, k, h, i) = (EXPERTS, TOP_K, HIDDEN, MOE_INTER);
    let bank = 16;
    let (g8, u8_, d8) = (
        W8::new(&kern, &mut rng, bank * i, h),
        W8::new(&kern, &mut rng, bank * i, h),
        W8::new(&kern, &mut rng, bank * h, i),
    );
    let (gs, us, ds) = (stack(&kern, &g8, e, bank), stack(&kern, &u8_, e, bank), stack(&kern, &d8, e, bank));
    let iters = 200;
    let mut table = Vec::new();
    for t in [1usize, 2, 4, 8] {
        let d = dims_80b(t);
        let idx = random_routes(&mut rng, t, k, e);
        let inp = inputs::<bf16>(&mut rng, d, idx);
        let dev = upload::<bf16>(&kern, d, &inp);
        let sets = rotating_routes(t, k, e, 64);
        let routes: Vec<CudaSlice<u32>> = sets.iter().map(|v| up_u32(&kern, v)).collect();
        let experts = sets.iter().map(|v| distinct_experts(v, e)).sum::<usize>() as f64 / sets.len() as f64;
        for fp8 in [false, true] {
            let wbytes = if fp8 { 1.0 } else { 2.0 };
            let bytes = 3.0 * (h * i) as f64 * wbytes * experts;
            let call = |r: &CudaSlice<u32>, out: &mut CudaSlice<f32>, which: MoeGemv| {
                let res = if fp8 {
                    let dims = [t, k, e, h, i];
                    kern.moe_experts_fp8_with::<bf16>(
                        &dev.x,
                        r,
                        &dev.w,
                        gs.dev(),
                        us.dev(),
                        ds.dev(),
                        out,
                        dims,
                        which,
                        MOE_PHASES_ALL,
                    )
                } else {
                    run::<bf16>(&kern, d, &dev.x, r, &dev.w, &dev, out, which, MOE_PHASES_ALL);
                    Ok(())
                };
                res.unwrap_or_else(|err| panic!("t={t} fp8={fp8} {which:?}: {err}"));
            };
            let mut base = Vec::new();
            for &which in &forms {
                let mut out = poisoned::<f32>(&kern, t * h);
                call(&routes[0], &mut out, which);
                let o = down::<f32>(&kern, &out);
                if base.is_empty() {
                    assert!(o.iter().all(|v| v.is_finite()), "t={t} fp8={fp8}: non-finite output");
                    base = o;
                } else {
                    same_bits(&format!("small-t timing t={t} fp8={fp8}: {which:?} vs V1"), &o, &base, h);
                }
                let sec =
                    time_calls(&kern, &mut hold, iters, &mut |q| call(&routes[q % routes.len()], &mut out, which));
                println!(
                    "moe small-t t={t} {} {which:?}: {:.1} us/call, {:.2} TB/s ({:.0}% of copy bandwidth), {:.1} MB, \
                     {experts:.1} experts",
                    if fp8 { "fp8" } else { "bf16" },
                    sec * 1e6,
                    bytes / sec / 1e12,
                    bytes / sec / bw * 100.0,
                    bytes / 1e6,
                );
                table.push((t, fp8, which, sec, bytes / sec));
            }
        }
    }
    println!("summary (us per call, TB/s):");
    for (t, fp8, which, sec, rate) in table {
        let w = if fp8 { "fp8 " } else { "bf16" };
        println!("  t={t} {w} {which:?}: {:.1} us, {:.2} TB/s", sec * 1e6, rate / 1e12);
    }
}
