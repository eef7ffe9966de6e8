//! The tensor-core FP8 GEMV over up to 64 rows in one launch (`fp8_gemv_rows`,
//! kernels/cuda/fp8_gemvt.cu: row groups of 8, a block per (group, weight tile)) against the CPU
//! reference (`porter_kernels::cpu::fp8::matmul_t_fp8`, W = e4m3 · scale in f32) and, bit for
//! bit, against the `m ≤ 8` tensor-core launch on each group of 8 rows (its per-row arithmetic),
//! at odd shapes and the 80B FP8 decode shapes; then timed against the tile-dequantizing
//! tensor-core GEMM that decode batches of 5–64 rows took before.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]`. Outputs are poisoned with NaN before every
//! launch.

mod common;

use common::fp8::W8;
use common::timing::{time_calls, Hold};
use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cpu::fp8::matmul_t_fp8;
use porter_kernels::cuda::{CudaFloat, CudaKernels, Fp8GemvForm, FP8_GEMVT_MAX_ROWS};

/// Row counts: one group, partial groups, whole groups, the most.
const MS: [usize; 8] = [1, 3, 5, 8, 9, 17, 40, FP8_GEMVT_MAX_ROWS];

fn rows_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, n: usize, kk: usize) {
    let w = W8::new(k, rng, n, kk);
    let mmax = FP8_GEMVT_MAX_ROWS;
    let x = rnd_vec::<T>(&rng.vec(mmax * kk, 1.0));
    let xd = up::<T>(k, &x);
    for m in MS {
        let what = format!("fp8_gemv_rows {} m={m} [{n}, {kk}]", T::NAME);
        let mut want = vec![0.0; m * n];
        matmul_t_fp8(&x[..m * kk], w.host(), &mut want, m, kk, n, false, &|v| v);
        let xv = xd.slice(0..m * kk);
        let mut o32 = poisoned::<f32>(k, m * n);
        k.fp8_gemv_rows::<T, f32>(&xv, w.dev(), &mut o32, m).expect("fp8_gemv_rows f32");
        let got = down(k, &o32);
        check(&format!("{what} -> f32"), &got, &want, TOL_F32);
        let mut ot = poisoned::<T>(k, m * n);
        k.fp8_gemv_rows::<T, T>(&xv, w.dev(), &mut ot, m).expect("fp8_gemv_rows");
        check(&format!("{what} -> {}", T::NAME), &down(k, &ot), &rnd_vec::<T>(&want), tol::<T>());
        // The m <= 8 tensor-core launch on each group of 8 rows: the same bits.
        let mut groups = Vec::with_capacity(m * n);
        for r0 in (0..m).step_by(8) {
            let r = 8.min(m - r0);
            let mut og = poisoned::<f32>(k, r * n);
            k.fp8_gemv_with::<T, f32>(&xd.slice(r0 * kk..(r0 + r) * kk), w.dev(), &mut og, r, Fp8GemvForm::TC)
                .expect("fp8_gemv tc");
            groups.extend(down(k, &og));
        }
        check_bits(&format!("{what} vs the 8-row launches"), &got, &groups);
    }
}

fn rows_all<T: CudaFloat>(test: &str) {
    let k = gpu(test);
    if !k.fp8_gemv_tc_fits::<T>() {
        panic!("{test}: no tensor cores on this GPU");
    }
    let mut rng = Rng::new(91);
    for (n, kk) in [(300, 400), (130, 16), (17, 1040), (12352, 2048), (2048, 4096), (1024, 2048)] {
        rows_case::<T>(&k, &mut rng, n, kk);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemv_rows_bf16() {
    rows_all::<bf16>("fp8_gemv_rows_bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemv_rows_f16() {
    rows_all::<f16>("fp8_gemv_rows_f16");
}

/// µs per call at the 80B FP8 shapes, bf16 activations, weights rotated over ≥ 160 MB (every
/// call reads HBM): the row-group GEMV against the tile-dequantizing tensor-core GEMM.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemv_rows_speed() {
    let k = gpu("fp8_gemv_rows_speed");
    let mut rng = Rng::new(92);
    let s = k.stream().clone();
    let mut hold = Hold::new(&k);
    for (n, kk) in [(12352usize, 2048usize), (2048, 4096), (1024, 2048)] {
        let w = W8::new(&k, &mut rng, n, kk);
        let copies = (160usize << 20).div_ceil(n * kk).clamp(2, 64);
        let qs: Vec<CudaSlice<u8>> = (0..copies).map(|_| s.clone_dtod(&w.dq).unwrap()).collect();
        let dev = |i: usize| w.dev_with(&qs[i % copies]);
        let xd = up::<bf16>(&k, &rnd_vec::<bf16>(&rng.vec(FP8_GEMVT_MAX_ROWS * kk, 1.0)));
        let bytes = (n * kk) as f64;
        for m in [8usize, 16, 32, 64] {
            let xv = xd.slice(0..m * kk);
            let mut o = poisoned::<bf16>(&k, m * n);
            let rows =
                time_calls(&k, &mut hold, 60, &mut |i| k.fp8_gemv_rows::<bf16, bf16>(&xv, dev(i), &mut o, m).unwrap());
            let tc = if k.fp8_gemm_tc_fits::<bf16, bf16>(kk, n) {
                time_calls(&k, &mut hold, 60, &mut |i| k.fp8_gemm_tc::<bf16, bf16>(&xv, dev(i), &mut o, m).unwrap())
            } else {
                f64::NAN
            };
            println!(
                "  fp8 [{n}, {kk}] m={m}: rows GEMV {:.2} µs ({:.2} TB/s of weights), tile-dequant GEMM {:.2} µs",
                rows * 1e6,
                bytes / rows / 1e12,
                tc * 1e6
            );
        }
    }
}
