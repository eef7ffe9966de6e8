//! The tensor-core routed experts for decode batches with dense bf16 / f16 weights
//! (kernels/cuda/moe_dec_mma.cu, `CudaKernels::moe_experts_mma`, `PORTER_MOE_DEC=mma`): against
//! the CPU reference of `porter_core::nn::Moe::forward` (tests/common/moe.rs) with the existing
//! tolerance, on small shapes (partial stages and row blocks, rows of a multiple of 8 but not of
//! 16, experts with no rows, a hot expert with 40 rows: passes of 8, bad ids) and on the
//! Qwen3-Next-80B-A3B shapes at t = 1, 2, 7, 8, 32, 64, 100; then µs and TB/s of the weights
//! touched at t = 8, 32, 64 beside the GEMV forms (direct, v1); ptxas: no spills in the dense or
//! the FP8 tensor-core decode kernels (one core, two formats).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`).
//! Outputs are poisoned with NaN before every launch.

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

/// One tensor-core call on `x` / `idx` / `w` (`d.t` rows of them) into a poisoned output.
fn run_mma<T: CudaFloat>(
    kern: &CudaKernels,
    d: Dims,
    x: &impl DevicePtr<T>,
    idx: &impl DevicePtr<u32>,
    w: &impl DevicePtr<f32>,
    dev: &Device<T>,
) -> Vec<f32> {
    let mut out = poisoned::<f32>(kern, d.t * d.hidden);
    kern.moe_experts_mma::<T>(x, idx, w, &dev.gate, &dev.up, &dev.down, &mut out, dims5(d))
        .unwrap_or_else(|err| panic!("moe_experts_mma {d:?}: {err}"));
    down::<f32>(kern, &out)
}

/// The tensor-core form on one case against the reference.
fn parity_case<T: CudaFloat>(kern: &CudaKernels, what: &str, d: Dims, idx: Vec<u32>, rng: &mut Rng) {
    assert!(kern.moe_mma_fits::<T>(d.hidden, d.inter), "{what}: {d:?} must fit");
    let inp = inputs::<T>(rng, d, idx);
    let want = reference::<T>(d, &inp);
    let dev = upload::<T>(kern, d, &inp);
    let got = run_mma::<T>(kern, d, &dev.x, &dev.idx, &dev.w, &dev);
    check(&format!("{what} {} {d:?}", T::NAME), &got, &want, tol::<T>());
}

/// Small shapes, then the 80B shapes at t = 1, 2, 7, 8, 32, 64, 100 (one set of weights, the
/// first t rows of one batch).
fn parity<T: CudaFloat>(test: &str, seed: u64) {
    let kern = gpu(test);
    if !kern.moe_mma_fits::<T>(2048, 512) {
        eprintln!("{test}: no tensor cores here; skipped");
        return;
    }
    let mut rng = Rng::new(seed);
    for t in [1, 2, 7, 8] {
        // hidden 72: 144-byte rows (a partial second stage), rows of 9 chunks (not 16 weights);
        // inter 40: a partial gate+up row block (40 of 64 columns), a partial down stage.
        let d = Dims { t, k: 2, e: 8, hidden: 72, inter: 40, bank: 8 };
        parity_case::<T>(&kern, "small", d, random_routes(&mut rng, d.t, d.k, d.e), &mut rng);
        // More than 128 hidden columns (two down row blocks, the second partial) and stages.
        let d = Dims { t, k: 3, e: 6, hidden: 200, inter: 136, bank: 6 };
        parity_case::<T>(&kern, "two blocks", d, random_routes(&mut rng, d.t, d.k, d.e), &mut rng);
    }
    // 40 rows on expert 5 (five passes of 8 rows), experts 8..32 without rows.
    let d = Dims { t: 40, k: 3, e: 32, hidden: 64, inter: 48, bank: 32 };
    parity_case::<T>(&kern, "hot expert", d, skewed_routes(&mut rng, d.t, d.k, 5, 8), &mut rng);
    // 13 rows on one expert (a full pass and a partial one) among idle ones.
    let d = Dims { t: 13, k: 2, e: 16, hidden: 128, inter: 64, bank: 16 };
    parity_case::<T>(&kern, "hot 13", d, skewed_routes(&mut rng, d.t, d.k, 11, 4), &mut rng);
    // Ids >= e are skipped; no valid id at all gives zeros.
    let d = Dims { t: 8, k: 2, e: 8, hidden: 32, inter: 16, bank: 8 };
    let mut idx = random_routes(&mut rng, d.t, d.k, d.e);
    idx[1] = 8;
    idx[2 * d.k - 1] = u32::MAX;
    idx[d.t * d.k - 2] = 1000;
    parity_case::<T>(&kern, "bad ids", d, idx, &mut rng);
    let d = Dims { t: 2, k: 2, e: 4, hidden: 32, inter: 16, bank: 4 };
    parity_case::<T>(&kern, "no valid id", d, vec![4, 100, u32::MAX, 7], &mut rng);

    let all = dims_80b(100);
    let idx = random_routes(&mut rng, all.t, all.k, all.e);
    let inp = inputs::<T>(&mut rng, all, idx);
    let dev = upload::<T>(&kern, all, &inp);
    for t in [1usize, 2, 7, 8, 32, 64, 100] {
        let rows: Vec<usize> = (0..t).collect();
        let (d, sub) = rows_of(all, &inp, &rows);
        let want = reference::<T>(d, &sub);
        let (h, k) = (d.hidden, d.k);
        let (x, i, w) = (dev.x.slice(0..t * h), dev.idx.slice(0..t * k), dev.w.slice(0..t * k));
        let got = run_mma::<T>(&kern, d, &x, &i, &w, &dev);
        let err = check(&format!("80b {} t={t}", T::NAME), &got, &want, tol::<T>());
        println!("{test}: 80b t={t}: max error {err:.3e} of max |ref| (tolerance {:.1e})", tol::<T>());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_mma_bf16() {
    parity::<bf16>("moe_mma_bf16", 41);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_mma_f16() {
    parity::<f16>("moe_mma_f16", 42);
}

/// µs per call and TB/s of the bf16 weights touched (3 · hidden · inter · 2 bytes a distinct
/// expert) at t = 8, 32, 64 on the 80B shapes: the tensor-core form beside the GEMV forms
/// (direct, v1), 16 distinct route sets cycled so that the weights do not stay in L2.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_mma_speed() {
    let kern = gpu("moe_mma_speed");
    if !kern.moe_mma_fits::<bf16>(2048, 512) {
        eprintln!("moe_mma_speed: no tensor cores here; skipped");
        return;
    }
    let mut rng = Rng::new(43);
    let mut hold = Hold::new(&kern);
    let all = dims_80b(64);
    let idx = random_routes(&mut rng, all.t, all.k, all.e);
    let inp = inputs::<bf16>(&mut rng, all, idx);
    let dev = upload::<bf16>(&kern, all, &inp);
    for t in [8usize, 32, 64] {
        let d = Dims { t, ..all };
        let dims = dims5(d);
        let sets: Vec<Vec<u32>> = (0..16).map(|_| random_routes(&mut rng, t, d.k, d.e)).collect();
        let routes: Vec<CudaSlice<u32>> = sets.iter().map(|v| up_u32(&kern, v)).collect();
        let experts = sets.iter().map(|v| distinct_experts(v, d.e)).sum::<usize>() as f64 / sets.len() as f64;
        let bytes = 3.0 * (d.hidden * d.inter * 2) as f64 * experts;
        let (x, w) = (dev.x.slice(0..t * d.hidden), dev.w.slice(0..t * d.k));
        let iters = if t <= 16 { 100 } else { 40 };
        let mut out = poisoned::<f32>(&kern, t * d.hidden);
        let mut line = format!("moe mma 80b bf16 t={t} ({experts:.1} experts, {:.1} MB):", bytes / 1e6);
        let mut times = Vec::new();
        for form in ["mma", "direct", "v1"] {
            let sec = time_calls(&kern, &mut hold, iters, &mut |q| {
                let r = &routes[q % routes.len()];
                let res = match form {
                    "mma" => kern.moe_experts_mma::<bf16>(&x, r, &w, &dev.gate, &dev.up, &dev.down, &mut out, dims),
                    _ => {
                        let which = if form == "direct" { MoeGemv::Direct } else { MoeGemv::V1 };
                        kern.moe_decode_with::<bf16>(
                            &x,
                            r,
                            &w,
                            &dev.gate,
                            &dev.up,
                            &dev.down,
                            &mut out,
                            dims,
                            which,
                            MOE_PHASES_ALL,
                        )
                    }
                };
                res.unwrap_or_else(|err| panic!("moe_mma_speed {form} t={t}: {err}"));
            });
            line += &format!(" {form} {:.1} us {:.2} TB/s |", sec * 1e6, bytes / sec / 1e12);
            times.push(sec);
        }
        println!("{line} mma vs v1 {:.2}x, vs direct {:.2}x", times[2] / times[0], times[1] / times[0]);
        let got = down::<f32>(&kern, &out);
        assert!(got.iter().all(|v| v.is_finite()), "moe_mma_speed t={t}: non-finite output after the timing loop");
    }
}

/// ptxas (sm_90) of the tensor-core decode kernels, dense (moe.cu) and FP8 (fp8.cu): no spills.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_moe_mma_ptxas_info() {
    let mut spills = Vec::new();
    for source in ["moe.cu", "fp8.cu"] {
        for (func, line) in ptxas_info("nvrtc_moe_mma_ptxas_info", source) {
            if !(func.starts_with("moe_dec_mma_") || func.starts_with("fp8_moe_mma_")) {
                continue;
            }
            println!("{source} {func}: {line}");
            if line.contains("spill") && !line.contains(" 0 bytes spill stores") {
                spills.push(func);
            }
        }
    }
    assert!(spills.is_empty(), "tensor-core decode kernels with spills: {spills:?}");
}
