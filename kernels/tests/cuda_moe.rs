//! `CudaKernels::moe_experts` (routed MoE experts, grouped by expert on the
//! device) against a CPU reference of `porter_core::nn::Moe::forward`'s math,
//! in f32, bf16 and f16 storage, through the decode (GEMV) and prefill (tiled
//! GEMM) paths, with uneven expert loads, and at the real Qwen3-Next-80B-A3B
//! dimensions; plus timings at those dimensions (t = 1 decode, t = 4096 prefill).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with
//! `--include-ignored`; without a GPU they then fail, saying so), the ptxas
//! check `#[ignore = "needs NVRTC ..."]`. Outputs are poisoned with NaN before every launch. The seed is printed; set
//! `PORTER_CUDA_SEED` to replay one.

mod common;

use common::moe::*;
use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cuda::{CudaFloat, CudaKernels};

/// The prefill GEMM forms of the A/B runs (`PORTER_MOE_GEMM`'s values).
const FORMS: [&str; 4] = ["wmma", "mma", "pipe", "wgmma"];

/// Shared memory a wgmma GEMM block needs (moe_wgmma.cu: 230 400 dynamic + 512 static bytes).
const WG_SMEM: usize = 230_400 + 512;

/// Lets the device's default memory pool keep freed memory (as porter-core does for the model
/// path), so that the per-call scratch allocation of the prefill path is not an unmap / remap
/// at every synchronisation of the timing loops.
fn keep_pool_memory(kern: &CudaKernels) {
    use cudarc::driver::sys;
    let dev = kern.context().cu_device();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: plain driver calls on a live context's device; `pool` and `threshold` outlive them.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, dev) == sys::CUresult::CUDA_SUCCESS && !pool.is_null() {
            let mut threshold: u64 = u64::MAX;
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold) as *mut u64 as *mut std::ffi::c_void,
            );
        }
    }
}

// ---------------------------------------------------------------------------
// NVRTC only: register use / spills of the MoE kernels (ptxas -v, sm_90).
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_moe_ptxas_info() {
    let lines = ptxas_info("nvrtc_moe_ptxas_info", "moe.cu");
    // The entries of moe_prefill.cu (compiled in moe.cu's module).
    for which in ["gu", "down"] {
        for t in ["bf16", "f16"] {
            let mut names: Vec<String> =
                [1, 2, 3, 4, 6, 8].iter().map(|mi| format!("moe_gemm_{which}_mma{mi}_{t}")).collect();
            for mi in [4, 8] {
                for st in [3, 4] {
                    names.push(format!("moe_gemm_{which}_pipe{mi}_s{st}_{t}"));
                }
            }
            for name in names {
                assert!(lines.iter().any(|(f, _)| *f == name), "no ptxas line for {name}");
            }
        }
    }
    let mut spills = Vec::new();
    for (func, line) in lines {
        println!("{func}: {line}");
        if line.contains("spill") && !line.contains(" 0 bytes spill stores") {
            spills.push(func);
        }
    }
    println!("kernels with spills: {spills:?}");
    // The prefill path's mma.sync GEMMs and parallel alignment (moe_prefill.cu) must not spill.
    let new: Vec<&String> = spills
        .iter()
        .filter(|f| {
            f.starts_with("moe_palign_") || (f.starts_with("moe_gemm_") && (f.contains("_mma") || f.contains("_pipe")))
        })
        .collect();
    assert!(new.is_empty(), "moe_prefill.cu kernels spill: {new:?}");
}

/// The wgmma GEMMs (moe_wgmma.cu) for sm_90a, as the host loads them on an H200: every entry
/// built, no spills; also compiled for sm_90 (no `a`: the entries trap, never launched).
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_moe_wgmma_ptxas_info() {
    let test = "nvrtc_moe_wgmma_ptxas_info";
    let (log, ptx) = common::ptxas_log_arch(test, "moe_wgmma.cu", "sm_90a");
    println!("{log}");
    for which in ["gu", "down"] {
        for t in ["bf16", "f16", "fp8_bf16", "fp8_f16"] {
            let name = format!("moe_wg_{which}_{t}");
            assert!(ptx.contains(&format!(".entry {name}(")), "no entry {name}");
        }
    }
    // The FP8 form's dequantization (e4m3 pairs to f16x2).
    assert!(ptx.contains("cvt.rn.f16x2.e4m3x2"), "no e4m3 conversion in the FP8 entries");
    for n in (16..=128).step_by(16) {
        assert!(ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16")), "no m64n{n}k16");
    }
    assert!(
        !log.contains("bytes spill stores")
            || log.lines().filter(|l| l.contains("spill stores")).all(|l| l.contains(" 0 bytes spill stores")),
        "moe_wgmma.cu spills:\n{log}"
    );
    // ptxas serializes wgmma it cannot pipeline (and says so): that would cost the overlap.
    assert!(!log.contains("serialized"), "moe_wgmma.cu: wgmma serialized:\n{log}");
    let (log90, _) = common::ptxas_log_arch(test, "moe_wgmma.cu", "sm_90");
    assert!(!log90.contains("error"), "{log90}");
}

fn launch<T: CudaFloat>(kern: &CudaKernels, d: Dims, dev: &Device<T>, out: &mut CudaSlice<f32>) {
    kern.moe_experts::<T>(
        &dev.x, &dev.idx, &dev.w, &dev.gate, &dev.up, &dev.down, out, d.t, d.k, d.e, d.hidden, d.inter,
    )
    .unwrap_or_else(|err| panic!("moe_experts {d:?}: {err}"));
}

/// Runs one case and checks it against the reference; `decode` asserts the path.
fn run_case<T: CudaFloat>(kern: &CudaKernels, what: &str, d: Dims, idx: Vec<u32>, rng: &mut Rng, decode: bool) {
    assert_eq!(CudaKernels::moe_decode_path(d.t, d.k, d.e), decode, "{what}: path for {d:?}");
    let inp = inputs::<T>(rng, d, idx);
    let want = reference::<T>(d, &inp);
    let dev = upload::<T>(kern, d, &inp);
    let mut out = poisoned::<f32>(kern, d.t * d.hidden);
    launch::<T>(kern, d, &dev, &mut out);
    let got = down::<f32>(kern, &out);
    let path = if decode { "decode" } else { "prefill" };
    check(&format!("{what} {} {path} {d:?}", T::NAME), &got, &want, tol::<T>());
    if !decode {
        prefill_forms::<T>(kern, what, d, &dev, &want);
    }
}

/// The form the prefill path must run for `T` and `d` when asked for `form` (`mma`, `pipe`,
/// `wgmma`, `wmma`): the CUDA-core GEMMs for f32 or rows that are not 16-byte multiples, else
/// the tensor-core form asked for where the device allows it (wgmma: an sm_90 device, else as
/// pipe; every mma.sync tile: 4 stages of
/// 64 and 512 rows of 64 bytes; every streamed tile: 3 stages of 128 and 256 rows of 128 bytes;
/// with less shared memory, `None`: the mma.sync form or wmma, by tile height).
fn expected_form<T: CudaFloat>(kern: &CudaKernels, d: Dims, form: &str) -> Option<&'static str> {
    let caps = kern.caps();
    let aligned = (d.hidden * std::mem::size_of::<T>()).is_multiple_of(16)
        && (d.inter * std::mem::size_of::<T>()).is_multiple_of(16);
    if T::NAME == "f32" || !aligned || !caps.tensor_cores() {
        Some("simt")
    } else if form == "wmma" {
        Some("wmma")
    } else if form == "wgmma" && caps.sm90a() && caps.smem_limit() >= WG_SMEM {
        Some("wgmma")
    } else if (form == "pipe" || form == "wgmma") && caps.smem_limit() >= 3 * (128 + 256) * 128 {
        Some("pipe")
    } else if caps.smem_limit() >= 4 * (64 + 512) * 64 {
        Some("mma")
    } else {
        None
    }
}

/// Asserts that a prefill launch ran the form [`expected_form`] says.
fn assert_form<T: CudaFloat>(kern: &CudaKernels, d: Dims, form: &str, ran: &str, what: &str) {
    match expected_form::<T>(kern, d, form) {
        Some(exp) => assert_eq!(ran, exp, "{what}: form"),
        None => assert!(ran == "mma" || ran == "wmma", "{what}: form {ran}"),
    }
}

/// A prefill case through the three GEMM forms, the mma.sync form at every tile height (16, 32,
/// 48, 64, 96, 128 rows), the wmma one at 16 and 64 rows, the streamed one at 64 and 128, and
/// each at its default one, the wgmma one at 64 and 128, each against the CPU reference `want`.
/// The streamed form computes the mma.sync form's MMAs in the same k order with the same
/// roundings: where both ran, their outputs must be bit-identical (the wgmma form: the same
/// roundings, but the tensor cores' own order within a k16 step; its differing bits are printed).
fn prefill_forms<T: CudaFloat>(kern: &CudaKernels, what: &str, d: Dims, dev: &Device<T>, want: &[f32]) {
    let mut mma_out: Option<Vec<f32>> = None;
    for name in FORMS {
        let sweep: &[Option<usize>] = match name {
            "mma" => &[None, Some(1), Some(2), Some(3), Some(4), Some(6), Some(8)],
            "pipe" | "wgmma" => &[None, Some(4), Some(8)],
            _ => &[None, Some(1), Some(4)],
        };
        for &frags in sweep {
            let mut out = poisoned::<f32>(kern, d.t * d.hidden);
            let ran = kern
                .moe_prefill_stage_times_form::<T>(
                    &dev.x,
                    &dev.idx,
                    &dev.w,
                    &dev.gate,
                    &dev.up,
                    &dev.down,
                    &mut out,
                    [d.t, d.k, d.e, d.hidden, d.inter],
                    name,
                    frags,
                    false,
                )
                .unwrap_or_else(|err| panic!("{what} {} {name} frags {frags:?} {d:?}: {err}", T::NAME));
            let asked = format!("{what} {} asked for {name}, frags {frags:?}, {d:?}", T::NAME);
            assert_form::<T>(kern, d, name, ran.form, &asked);
            let got = down::<f32>(kern, &out);
            let label = format!("{what} {} prefill {} ({} rows) {d:?}", T::NAME, ran.form, ran.tile_rows);
            check(&label, &got, want, tol::<T>());
            if ran.form == "mma" && mma_out.is_none() {
                mma_out = Some(got.clone());
            }
            if let (Some(m), "pipe") = (&mma_out, ran.form) {
                let diff = got.iter().zip(m).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(diff, 0, "{label}: {diff} outputs differ from the mma.sync form's bits");
            }
            if let (Some(m), "wgmma") = (&mma_out, ran.form) {
                let diff = got.iter().zip(m).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                println!("{label}: {diff} of {} outputs differ from the mma.sync form's bits", got.len());
            }
        }
    }
}

fn small<T: CudaFloat>(kern: &CudaKernels, rng: &mut Rng) {
    // Aligned dims (16-byte loads, wmma for bf16/f16); K tails and partial column blocks.
    let d = Dims { t: 3, k: 2, e: 8, hidden: 72, inter: 40, bank: 8 };
    run_case::<T>(kern, "small", d, random_routes(rng, d.t, d.k, d.e), rng, true);
    let d = Dims { t: 200, k: 4, e: 16, hidden: 72, inter: 40, bank: 16 };
    run_case::<T>(kern, "small", d, random_routes(rng, d.t, d.k, d.e), rng, false);
    // Odd dims: scalar loads, CUDA-core GEMM for every type.
    let d = Dims { t: 5, k: 3, e: 6, hidden: 37, inter: 21, bank: 6 };
    run_case::<T>(kern, "odd", d, random_routes(rng, d.t, d.k, d.e), rng, true);
    let d = Dims { t: 130, k: 3, e: 6, hidden: 37, inter: 21, bank: 6 };
    run_case::<T>(kern, "odd", d, random_routes(rng, d.t, d.k, d.e), rng, false);
    // k = e: every expert on every row.
    let d = Dims { t: 4, k: 4, e: 4, hidden: 64, inter: 24, bank: 4 };
    run_case::<T>(kern, "k=e", d, random_routes(rng, d.t, d.k, d.e), rng, true);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_small_f32() {
    let kern = gpu("moe_small_f32");
    small::<f32>(&kern, &mut Rng::new(1));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_small_bf16() {
    let kern = gpu("moe_small_bf16");
    small::<bf16>(&kern, &mut Rng::new(2));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_small_f16() {
    let kern = gpu("moe_small_f16");
    small::<f16>(&kern, &mut Rng::new(3));
}

fn uneven<T: CudaFloat>(kern: &CudaKernels, rng: &mut Rng) {
    // Decode: 40 rows on expert 5 (several GEMV passes of 4 rows), experts 8..32 idle.
    let d = Dims { t: 40, k: 3, e: 32, hidden: 64, inter: 48, bank: 32 };
    run_case::<T>(kern, "uneven", d, skewed_routes(rng, d.t, d.k, 5, 8), rng, true);
    // Prefill: 300 rows on expert 20 (five tiles), experts 8..32 but 20 idle.
    let d = Dims { t: 300, k: 3, e: 32, hidden: 64, inter: 48, bank: 32 };
    run_case::<T>(kern, "uneven", d, skewed_routes(rng, d.t, d.k, 20, 8), rng, false);
    // More than 4096 pairs: the parallel alignment (3 blocks), 3000 rows on expert 20.
    let d = Dims { t: 3000, k: 3, e: 32, hidden: 64, inter: 48, bank: 32 };
    run_case::<T>(kern, "uneven parallel align", d, skewed_routes(rng, d.t, d.k, 20, 8), rng, false);
    // Ids >= e are skipped (never read out of bounds), on both paths and both alignments.
    for t in [10, 200, 2100] {
        let d = Dims { t, k: 2, e: 8, hidden: 32, inter: 16, bank: 8 };
        let mut idx = random_routes(rng, d.t, d.k, d.e);
        idx[1] = 8;
        idx[2 * d.k - 1] = u32::MAX;
        idx[d.t * d.k - 2] = 1000;
        run_case::<T>(kern, "bad ids", d, idx, rng, t == 10);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_uneven_f32() {
    let kern = gpu("moe_uneven_f32");
    uneven::<f32>(&kern, &mut Rng::new(4));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_uneven_bf16() {
    let kern = gpu("moe_uneven_bf16");
    uneven::<bf16>(&kern, &mut Rng::new(5));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_uneven_f16() {
    let kern = gpu("moe_uneven_f16");
    uneven::<f16>(&kern, &mut Rng::new(6));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_bad_args() {
    let kern = gpu("moe_bad_args");
    let d = Dims { t: 2, k: 2, e: 4, hidden: 16, inter: 8, bank: 4 };
    let mut rng = Rng::new(7);
    let idx = random_routes(&mut rng, d.t, d.k, d.e);
    let inp = inputs::<f32>(&mut rng, d, idx);
    let dev = upload::<f32>(&kern, d, &inp);
    let mut out = poisoned::<f32>(&kern, d.t * d.hidden);
    let call = |out: &mut CudaSlice<f32>, t: usize, k: usize, e: usize, h: usize, i: usize| {
        kern.moe_experts::<f32>(&dev.x, &dev.idx, &dev.w, &dev.gate, &dev.up, &dev.down, out, t, k, e, h, i)
    };
    assert!(call(&mut out, 2, 0, 4, 16, 8).is_err(), "k = 0");
    assert!(call(&mut out, 2, 5, 4, 16, 8).is_err(), "k > e");
    assert!(call(&mut out, 2, 2, 4, 0, 8).is_err(), "hidden = 0");
    assert!(call(&mut out, 2, 2, 4, 16, 0).is_err(), "inter = 0");
    assert!(call(&mut out, 3, 2, 4, 16, 8).is_err(), "t mismatch");
    assert!(call(&mut out, 2, 2, 4, 16, 8).is_ok());
}

// ---------------------------------------------------------------------------
// Qwen3-Next-80B-A3B dimensions (bf16): hidden 2048, moe_intermediate 512,
// 512 experts, top-10.
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_80b_bf16() {
    let kern = gpu("moe_80b_bf16");
    let mut rng = Rng::new(8);
    for (t, decode) in [(1, true), (64, true), (512, false)] {
        let d = dims_80b(t);
        run_case::<bf16>(&kern, "80b", d, random_routes(&mut rng, d.t, d.k, d.e), &mut rng, decode);
    }
}

/// Average seconds per call over `iters` calls (after a warm-up), cycling
/// through `routes` (distinct expert sets, so that the weights do not stay in L2).
fn time_calls(kern: &CudaKernels, d: Dims, dev: &Device<bf16>, routes: &[CudaSlice<u32>], iters: usize) -> f64 {
    time_calls_submit(kern, d, dev, routes, iters).0
}

/// As [`time_calls`]; also returns the host submission time per call (seconds).
fn time_calls_submit(
    kern: &CudaKernels,
    d: Dims,
    dev: &Device<bf16>,
    routes: &[CudaSlice<u32>],
    iters: usize,
) -> (f64, f64) {
    let mut out = poisoned::<f32>(kern, d.t * d.hidden);
    let s = kern.stream().clone();
    for r in routes.iter().take(2) {
        kern.moe_experts::<bf16>(
            &dev.x, r, &dev.w, &dev.gate, &dev.up, &dev.down, &mut out, d.t, d.k, d.e, d.hidden, d.inter,
        )
        .expect("moe_experts");
    }
    s.synchronize().expect("sync");
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = s.record_event(flags).expect("event");
    let wall = std::time::Instant::now();
    for i in 0..iters {
        let r = &routes[i % routes.len()];
        kern.moe_experts::<bf16>(
            &dev.x, r, &dev.w, &dev.gate, &dev.up, &dev.down, &mut out, d.t, d.k, d.e, d.hidden, d.inter,
        )
        .expect("moe_experts");
    }
    let submit = wall.elapsed().as_secs_f64();
    let end = s.record_event(flags).expect("event");
    let ms = start.elapsed_ms(&end).expect("elapsed") as f64;
    let got = down::<f32>(kern, &out);
    assert!(got.iter().all(|v| v.is_finite()), "non-finite output");
    println!(
        "  host submit {:.1} us/call (if close to the GPU time, the loop is host-bound)",
        submit / iters as f64 * 1e6
    );
    (ms / 1e3 / iters as f64, submit / iters as f64)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_80b_timing() {
    let kern = gpu("moe_80b_timing");
    keep_pool_memory(&kern);
    let mut rng = Rng::new(9);
    // t = 1: decode, bandwidth-bound.
    {
        let d = dims_80b(1);
        let idx = random_routes(&mut rng, d.t, d.k, d.e);
        let inp = inputs::<bf16>(&mut rng, d, idx);
        let dev = upload::<bf16>(&kern, d, &inp);
        let sets: Vec<Vec<u32>> = (0..16).map(|_| random_routes(&mut rng, d.t, d.k, d.e)).collect();
        let routes: Vec<CudaSlice<u32>> = sets.iter().map(|v| up_u32(&kern, v)).collect();
        let sec = time_calls(&kern, d, &dev, &routes, 200);
        // Bytes: the three matrices of every routed expert (10 distinct per set), plus x and out.
        let per_expert = 3 * d.hidden * d.inter * 2;
        let bytes = (d.k * per_expert + d.hidden * 2 + d.hidden * 4) as f64;
        println!(
            "moe_80b decode t=1: {:.1} us/call, {:.1} MB of expert weights, {:.0} GB/s ({:.0}% of 4.8 TB/s)",
            sec * 1e6,
            bytes / 1e6,
            bytes / sec / 1e9,
            bytes / sec / 4.8e12 * 100.0
        );
    }
    // t = 4096: prefill, compute-bound.
    {
        let d = dims_80b(4096);
        let idx = random_routes(&mut rng, d.t, d.k, d.e);
        let inp = inputs::<bf16>(&mut rng, d, idx);
        let dev = upload::<bf16>(&kern, d, &inp);
        let routes = vec![dev.idx.clone()];
        let sec = time_calls(&kern, d, &dev, &routes, 10);
        let flops = 2.0 * (d.t * d.k) as f64 * 3.0 * (d.hidden * d.inter) as f64;
        println!(
            "moe_80b prefill t=4096: {:.3} ms/call, {:.1} GFLOP, {:.1} TFLOP/s",
            sec * 1e3,
            flops / 1e9,
            flops / sec / 1e12
        );
        // Per launch: synchronise + host clock around every stage (best of 5
        // after a warm-up), each GEMM a third (gate+up two thirds) of the FLOPs.
        // (The process's PORTER_MOE_GEMM / PORTER_MOE_ALIGN choose the form, as in moe_experts.)
        let gemm_env = std::env::var("PORTER_MOE_GEMM").unwrap_or_default().trim().to_ascii_lowercase();
        let form = if gemm_env == "wmma" || gemm_env == "pipe" { gemm_env.as_str() } else { "mma" };
        let one_block = std::env::var("PORTER_MOE_ALIGN").is_ok_and(|v| v.trim().eq_ignore_ascii_case("one"));
        let mut out = poisoned::<f32>(&kern, d.t * d.hidden);
        let mut best = [f64::INFINITY; 4];
        let mut ran = None;
        for _ in 0..6 {
            let r = kern
                .moe_prefill_stage_times_form::<bf16>(
                    &dev.x,
                    &dev.idx,
                    &dev.w,
                    &dev.gate,
                    &dev.up,
                    &dev.down,
                    &mut out,
                    [d.t, d.k, d.e, d.hidden, d.inter],
                    form,
                    None,
                    one_block,
                )
                .expect("moe_prefill_stage_times_with");
            for (b, s) in best.iter_mut().zip(r.secs) {
                *b = b.min(s);
            }
            ran = Some(r);
        }
        let ran = ran.expect("ran");
        let got = down::<f32>(&kern, &out);
        assert!(got.iter().all(|v| v.is_finite()), "non-finite output (stage timing)");
        let per_gemm = flops / 3.0;
        println!(
            "moe_80b prefill t=4096 per launch ({} GEMMs, tiles of {} rows, alignment in {} block(s)): align {:.1} us, \
             gate+up {:.3} ms ({:.1} TFLOP/s), down {:.3} ms ({:.1} TFLOP/s), combine {:.1} us",
            ran.form,
            ran.tile_rows,
            ran.align_blocks,
            best[0] * 1e6,
            best[1] * 1e3,
            2.0 * per_gemm / best[1] / 1e12,
            best[2] * 1e3,
            per_gemm / best[2] / 1e12,
            best[3] * 1e6
        );
    }
}

/// The 80B prefill through the GEMM forms side by side at t = 512, 1024 and 4096 (one
/// set of weights; the first t rows of 4096-row inputs): for each form, for the mma form at
/// every tile height too, for it with the single-block alignment, and for the streamed form
/// (`pipe`) at 64 and 128 rows, 96 sampled rows against the CPU reference (the streamed form:
/// every output bit-identical to the mma.sync form's), then the per-launch times (synchronise +
/// host clock around every stage, best of 6; the memory pool keeps freed memory, as in
/// porter-core, and the scratch allocation is timed apart): alignment µs and blocks, gate+up and
/// down ms, TFLOP/s (of the real, unpadded FLOPs) and GB/s of the routed experts' weights (each
/// streamed at least once), combine µs, and their sum. `PORTER_TEST_MOE_FORMS` (e.g.
/// `mma,pipe,wgmma`) keeps only the forms it names.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_80b_forms_timed() {
    let kern = gpu("moe_80b_forms_timed");
    keep_pool_memory(&kern);
    let mut rng = Rng::new(11);
    let full = dims_80b(4096);
    let idx = random_routes(&mut rng, full.t, full.k, full.e);
    let inp = inputs::<bf16>(&mut rng, full, idx);
    let dev = upload::<bf16>(&kern, full, &inp);
    for t in [512usize, 1024, 4096] {
        let d = dims_80b(t);
        let x = up::<bf16>(&kern, &inp.x[..t * d.hidden]);
        let ix = up_u32(&kern, &inp.idx[..t * d.k]);
        let w = up::<f32>(&kern, &inp.w[..t * d.k]);
        let mut rows = vec![0, t - 1];
        while rows.len() < 96 {
            let r = rng.below(t);
            if !rows.contains(&r) {
                rows.push(r);
            }
        }
        let (sd, sinp) = rows_of(d, &inp, &rows);
        let want = reference::<bf16>(sd, &sinp);
        let flops = 2.0 * (d.t * d.k) as f64 * 3.0 * (d.hidden * d.inter) as f64;
        // Weight bytes of one GEMM's distinct experts (each streamed at least once from HBM):
        // gate+up twice those of down.
        let experts = distinct_experts(&inp.idx[..t * d.k], d.e);
        let w_bytes = (experts * d.hidden * d.inter * 2) as f64;
        println!(
            "moe_80b prefill t={t}: {:.1} GFLOP, {experts} experts ({:.2} GB of weights), default tiles: wmma {} \
             rows, mma {} rows",
            flops / 1e9,
            3.0 * w_bytes / 1e9,
            16 * CudaKernels::moe_prefill_tile_frags(d.t, d.k, d.e),
            16 * CudaKernels::moe_prefill_mma_frags(d.t, d.k, d.e)
        );
        // (form, tile fragments, single-block alignment): both forms at their default tiles,
        // the mma form at every tile height, and the default once more with the old alignment.
        let mut configs: Vec<(&str, Option<usize>, bool)> = vec![("wmma", None, false)];
        for frags in [None, Some(1), Some(2), Some(3), Some(4), Some(6), Some(8)] {
            configs.push(("mma", frags, false));
        }
        configs.push(("mma", None, true));
        for frags in [None, Some(4), Some(8)] {
            configs.push(("pipe", frags, false));
        }
        for frags in [None, Some(4), Some(8)] {
            configs.push(("wgmma", frags, false));
        }
        if let Ok(keep) = std::env::var("PORTER_TEST_MOE_FORMS") {
            let keep: Vec<&str> = keep.split(',').map(str::trim).collect();
            configs.retain(|(name, _, _)| keep.contains(name));
        }
        let mut mma_out: Option<Vec<f32>> = None;
        for (name, frags, one_block) in configs {
            let mut out = poisoned::<f32>(&kern, d.t * d.hidden);
            let mut best = [f64::INFINITY; 4];
            let mut alloc = f64::INFINITY;
            let mut ran = None;
            for _ in 0..6 {
                let r = kern
                    .moe_prefill_stage_times_form::<bf16>(
                        &x,
                        &ix,
                        &w,
                        &dev.gate,
                        &dev.up,
                        &dev.down,
                        &mut out,
                        [d.t, d.k, d.e, d.hidden, d.inter],
                        name,
                        frags,
                        one_block,
                    )
                    .unwrap_or_else(|err| panic!("t={t} {name} frags {frags:?}: {err}"));
                for (b, s) in best.iter_mut().zip(r.secs) {
                    *b = b.min(s);
                }
                alloc = alloc.min(r.alloc_secs);
                ran = Some(r);
            }
            let ran = ran.expect("ran");
            assert_form::<bf16>(&kern, d, name, ran.form, &format!("t={t}: asked for {name}, frags {frags:?}"));
            let got = down::<f32>(&kern, &out);
            if ran.form == "mma" && mma_out.is_none() {
                mma_out = Some(got.clone());
            }
            if let (Some(m), "pipe") = (&mma_out, ran.form) {
                let diff = got.iter().zip(m).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(diff, 0, "t={t} pipe {frags:?}: {diff} outputs differ from the mma.sync form's bits");
            }
            let got: Vec<f32> =
                rows.iter().flat_map(|&r| got[r * d.hidden..(r + 1) * d.hidden].iter().copied()).collect();
            let label = format!("80b t={t} {} ({} rows, 96 sampled rows)", ran.form, ran.tile_rows);
            check(&label, &got, &want, tol::<bf16>());
            let per_gemm = flops / 3.0;
            println!(
                "  {:>4} {:>3}-row tiles{}: align {:.1} us ({} block{}), gate+up {:.3} ms ({:.1} TFLOP/s, {:.0} GB/s \
                 of weights), down {:.3} ms ({:.1} TFLOP/s, {:.0} GB/s), combine {:.1} us, sum {:.3} ms \
                 (scratch alloc {:.1} us, not in the sum)",
                ran.form,
                ran.tile_rows,
                if frags.is_none() { " (default)" } else { "" },
                best[0] * 1e6,
                ran.align_blocks,
                if ran.align_blocks == 1 { "" } else { "s" },
                best[1] * 1e3,
                2.0 * per_gemm / best[1] / 1e12,
                2.0 * w_bytes / best[1] / 1e9,
                best[2] * 1e3,
                per_gemm / best[2] / 1e12,
                w_bytes / best[2] / 1e9,
                best[3] * 1e6,
                best.iter().sum::<f64>() * 1e3,
                alloc * 1e6
            );
        }
    }
}

/// The wgmma GEMMs (`PORTER_MOE_GEMM=wgmma`, moe_wgmma.cu; on an sm_90 device, else the form
/// they fall back to) against the CPU reference at the 80B dims: t = 1, 7, 100 (most experts
/// with 0 rows; tiles of 1..7 real rows, N = 16), 512 and 4096 (96 sampled rows), random and
/// skewed routes (one expert on every row: 512 / 4096 rows, several full 128-row tiles and a
/// partial one), tiles of 64 and 128 rows and the default, bf16 and f16 (f16 at t <= 512).
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_wgmma_parity() {
    let kern = gpu("moe_wgmma_parity");
    let mut rng = Rng::new(12);
    for t in [1usize, 7, 100, 512, 4096] {
        for skewed in [false, true] {
            let d = dims_80b(t);
            let idx = if skewed {
                skewed_routes(&mut rng, d.t, d.k, 300, 40)
            } else {
                random_routes(&mut rng, d.t, d.k, d.e)
            };
            wgmma_case::<bf16>(&kern, d, idx.clone(), &mut rng, skewed);
            if t <= 512 {
                wgmma_case::<f16>(&kern, d, idx, &mut rng, skewed);
            }
        }
    }
}

/// One [`moe_wgmma_parity`] case: the wgmma form at the default tiles and at 64 / 128 rows
/// against the reference of all rows (t < 512) or of 96 sampled ones.
fn wgmma_case<T: CudaFloat>(kern: &CudaKernels, d: Dims, idx: Vec<u32>, rng: &mut Rng, skewed: bool) {
    let inp = inputs::<T>(rng, d, idx);
    let dev = upload::<T>(kern, d, &inp);
    let rows: Vec<usize> = if d.t < 512 {
        (0..d.t).collect()
    } else {
        let mut rows = vec![0, d.t - 1];
        while rows.len() < 96 {
            let r = rng.below(d.t);
            if !rows.contains(&r) {
                rows.push(r);
            }
        }
        rows
    };
    let (sd, sinp) = rows_of(d, &inp, &rows);
    let want = reference::<T>(sd, &sinp);
    for frags in [None, Some(4), Some(8)] {
        let mut out = poisoned::<f32>(kern, d.t * d.hidden);
        let ran = kern
            .moe_prefill_stage_times_form::<T>(
                &dev.x,
                &dev.idx,
                &dev.w,
                &dev.gate,
                &dev.up,
                &dev.down,
                &mut out,
                [d.t, d.k, d.e, d.hidden, d.inter],
                "wgmma",
                frags,
                false,
            )
            .unwrap_or_else(|err| panic!("wgmma t={} {} frags {frags:?}: {err}", d.t, T::NAME));
        let what = format!("80b t={} {} skewed {skewed} {} ({} rows)", d.t, T::NAME, ran.form, ran.tile_rows);
        assert_form::<T>(kern, d, "wgmma", ran.form, &what);
        let got = down::<f32>(kern, &out);
        let got: Vec<f32> = rows.iter().flat_map(|&r| got[r * d.hidden..(r + 1) * d.hidden].iter().copied()).collect();
        check(&what, &got, &want, tol::<T>());
    }
}

/// The tile height chosen for the tensor-core prefill GEMMs (host only).
#[test]
fn moe_prefill_tile_choice() {
    // ≈ 80 rows per expert (80B, t = 4096): 48-row tiles (≈ 18 % padding, not 37 %).
    assert_eq!(CudaKernels::moe_prefill_tile_frags(4096, TOP_K, EXPERTS), 3);
    // Many rows per expert: the largest tiles.
    assert_eq!(CudaKernels::moe_prefill_tile_frags(65536, TOP_K, EXPERTS), 4);
    for (t, k, e) in [(512, 10, 512), (200, 4, 16), (300, 3, 32), (130, 3, 6), (1, 1, 1), (100_000_000, 8, 8)] {
        let mi = CudaKernels::moe_prefill_tile_frags(t, k, e);
        assert!((1..=4).contains(&mi), "{t} {k} {e}: {mi}");
        let mi = CudaKernels::moe_prefill_mma_frags(t, k, e);
        assert!([1, 2, 3, 4, 6, 8].contains(&mi), "mma {t} {k} {e}: {mi}");
    }
    // The mma.sync GEMMs: the smallest tile that holds an expert's rows (λ + 3√λ + 1), at most
    // 48 rows (measured on the H200 at λ = 80: 48-row tiles 12 % faster than 128-row ones).
    // λ = 80 (t = 4096): 107 rows -> 48; λ = 20: 34 -> 48; λ = 10: 20.5 -> 32; λ = 2.5: 8.2 -> 16.
    assert_eq!(CudaKernels::moe_prefill_mma_frags(4096, TOP_K, EXPERTS), 3);
    assert_eq!(CudaKernels::moe_prefill_mma_frags(1024, TOP_K, EXPERTS), 3);
    assert_eq!(CudaKernels::moe_prefill_mma_frags(512, TOP_K, EXPERTS), 2);
    assert_eq!(CudaKernels::moe_prefill_mma_frags(128, TOP_K, EXPERTS), 1);
    assert_eq!(CudaKernels::moe_prefill_mma_frags(65536, TOP_K, EXPERTS), 3);
}

/// The 80B dims through both paths: decode at t = 1, 2, 8, 64 (every row
/// checked) and prefill at t = 4096 (rows sampled) against the CPU reference;
/// then timings: µs per call, GB/s of expert weights streamed (each distinct
/// routed expert's three matrices once), TFLOP/s, host submission µs per call.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_80b_paths_timed() {
    let kern = gpu("moe_80b_paths_timed");
    keep_pool_memory(&kern);
    let mut rng = Rng::new(10);
    for t in [1usize, 2, 8, 64, 4096] {
        let d = dims_80b(t);
        let decode = CudaKernels::moe_decode_path(d.t, d.k, d.e);
        assert_eq!(decode, t <= 64, "path for t = {t}");
        let idx = random_routes(&mut rng, d.t, d.k, d.e);
        let inp = inputs::<bf16>(&mut rng, d, idx);
        let dev = upload::<bf16>(&kern, d, &inp);
        let mut out = poisoned::<f32>(&kern, d.t * d.hidden);
        launch::<bf16>(&kern, d, &dev, &mut out);
        let got = down::<f32>(&kern, &out);
        let path = if decode { "decode" } else { "prefill" };
        if t <= 64 {
            let want = reference::<bf16>(d, &inp);
            check(&format!("80b {path} t={t}"), &got, &want, tol::<bf16>());
        } else {
            // 96 sampled rows: the first, the last and 94 random ones.
            let mut rows = vec![0, t - 1];
            while rows.len() < 96 {
                let r = rng.below(t);
                if !rows.contains(&r) {
                    rows.push(r);
                }
            }
            let (sd, sinp) = rows_of(d, &inp, &rows);
            let want = reference::<bf16>(sd, &sinp);
            let got: Vec<f32> =
                rows.iter().flat_map(|&r| got[r * d.hidden..(r + 1) * d.hidden].iter().copied()).collect();
            check(&format!("80b {path} t={t} (96 sampled rows)"), &got, &want, tol::<bf16>());
        }
        // Timing: distinct route sets so that the weights do not stay in L2.
        let nsets = if decode { 16 } else { 1 };
        let sets: Vec<Vec<u32>> = if decode {
            (0..nsets).map(|_| random_routes(&mut rng, d.t, d.k, d.e)).collect()
        } else {
            vec![inp.idx.clone()]
        };
        let routes: Vec<CudaSlice<u32>> = sets.iter().map(|v| up_u32(&kern, v)).collect();
        let iters = if decode { 200 } else { 10 };
        let (sec, submit) = time_calls_submit(&kern, d, &dev, &routes, iters);
        let experts = sets.iter().map(|v| distinct_experts(v, d.e)).sum::<usize>() as f64 / nsets as f64;
        let bytes = experts * (3 * d.hidden * d.inter * 2) as f64 + (d.t * d.hidden * (2 + 4)) as f64;
        let flops = 2.0 * (d.t * d.k) as f64 * 3.0 * (d.hidden * d.inter) as f64;
        println!(
            "moe_80b {path} t={t}: {:.1} us/call, {:.1} MB of weights ({:.0} experts), {:.0} GB/s ({:.0}% of \
             4.8 TB/s), {:.1} TFLOP/s, host submit {:.1} us/call",
            sec * 1e6,
            bytes / 1e6,
            experts,
            bytes / sec / 1e9,
            bytes / sec / 4.8e12 * 100.0,
            flops / sec / 1e12,
            submit * 1e6
        );
    }
}
