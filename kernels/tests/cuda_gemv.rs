//! The decode GEMV's two kernels (`GemvKind::Block`: misc.cu `gemv_*`; `GemvKind::Preload`:
//! gemv_pdl.cu `gemvw_*`, the default) and the one-row norms with and without their weights
//! read before the PDL wait: parity against the CPU at m = 1, 2, 4, 8 (odd m and n too), the
//! two kernels bit for bit equal (same split, same per-column summation order: a column's
//! bits do not depend on the kernel), and a timing A/B at the Qwen3-Next-80B decode shapes.
//!
//! `#[ignore = "needs a CUDA GPU"]`. Parity:
//! `cargo test -p porter-kernels --release --test cuda_gemv -- --ignored --nocapture gemv_kinds norm_preload`;
//! timing: `... --test cuda_gemv -- --ignored --nocapture decode_gemv_norm_timed`.

mod common;

use common::timing::{time_calls, Hold};
use common::*;
use half::bf16;
use porter_kernels::cuda::{CudaFloat, CudaKernels, GemvKind, RmsNormKind};

fn bits<T: CudaFloat>(k: &CudaKernels, d: &cudarc::driver::CudaSlice<T>) -> Vec<u32> {
    down(k, d).into_iter().map(f32::to_bits).collect()
}

fn gemv_kinds_case<A: CudaFloat, O: CudaFloat>(k: &CudaKernels, rng: &mut Rng, m: usize, kk: usize, n: usize) {
    let (dx, dw, want) = gemv_inputs::<A, O>(k, rng, m, kk, n);
    let mut got = Vec::new();
    for kind in [GemvKind::Block, GemvKind::Preload] {
        let mut out = poisoned::<O>(k, m * n);
        k.gemv_as::<A, O>(kind, &dx, &dw, &mut out, m, kk, n).expect("gemv launch");
        let what = format!("gemv {kind:?} {}->{} [{m}, {kk}] x [{n}, {kk}]", A::NAME, O::NAME);
        check(&what, &down(k, &out), &want, tol::<O>());
        got.push(bits(k, &out));
    }
    assert!(got[0] == got[1], "gemv {}->{} [{m}, {kk}] x [{n}, {kk}]: Block and Preload differ", A::NAME, O::NAME);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_kinds() {
    let k = gpu("gemv_kinds");
    let mut rng = Rng::new(160);
    for m in [1, 2, 3, 4, 5, 8] {
        // The 80B decode shapes (split 1, 4, 4 / G 8, 16, 8) and odd ones: n not a multiple of
        // a block's 8 columns, k not a multiple of a lane batch (32·G chunks), tiny k.
        gemv_kinds_case::<bf16, bf16>(&k, &mut rng, m, HIDDEN, 12352);
        gemv_kinds_case::<bf16, bf16>(&k, &mut rng, m, 4096, HIDDEN);
        gemv_kinds_case::<bf16, f32>(&k, &mut rng, m, HIDDEN, 1544);
        gemv_kinds_case::<bf16, bf16>(&k, &mut rng, m, HIDDEN, 4096);
        gemv_kinds_case::<bf16, bf16>(&k, &mut rng, m, HIDDEN, 517);
        gemv_kinds_case::<bf16, f32>(&k, &mut rng, m, 8 * 1003, 37);
        gemv_kinds_case::<bf16, bf16>(&k, &mut rng, m, 8200, 13);
        gemv_kinds_case::<bf16, bf16>(&k, &mut rng, m, 8, 9);
        gemv_kinds_case::<f32, f32>(&k, &mut rng, m, 24, 101);
        gemv_kinds_case::<f32, f32>(&k, &mut rng, m, 4100, 29);
        gemv_kinds_case::<half::f16, half::f16>(&k, &mut rng, m, 4096, 64);
        gemv_kinds_case::<half::f16, f32>(&k, &mut rng, m, 40, 7);
    }
}

fn norm_case<O: CudaFloat>(k: &CudaKernels, rng: &mut Rng, rows: usize, d: usize) {
    for kind in [RmsNormKind::Standard, RmsNormKind::ZeroCentred] {
        let x = rng.vec(rows * d, 3.0);
        let y = rnd_vec::<O>(&rng.vec(rows * d, 2.0));
        let w = rnd_vec::<O>(&rng.vec(d, 1.0));
        let sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        let (dy, dw) = (up::<O>(k, &y), up::<O>(k, &w));
        let mut got = Vec::new();
        for pre in [false, true] {
            let mut dx = up::<f32>(k, &x);
            let mut out = poisoned::<O>(k, rows * d);
            k.add_rms_norm_with(pre, &mut dx, &dy, &dw, &mut out, rows, d, 1e-6, kind).expect("add_rms_norm");
            check(
                &format!("add_rms_norm pre={pre} {kind:?} {} [{rows}, {d}]: sum", O::NAME),
                &down(k, &dx),
                &sum,
                1e-5,
            );
            got.push(bits(k, &out));
        }
        assert!(got[0] == got[1], "add_rms_norm {kind:?} [{rows}, {d}]: preload changes the bits");
        // The default (preloading) rms_norm of the sum against the add_rms_norm output.
        let ds = up::<f32>(k, &sum);
        let mut out = poisoned::<O>(k, rows * d);
        k.rms_norm::<f32, O>(&ds, &dw, &mut out, rows, d, 1e-6, kind).expect("rms_norm");
        assert!(bits(k, &out) == got[1], "rms_norm vs add_rms_norm [{rows}, {d}] {kind:?}: bits differ");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_preload() {
    let k = gpu("norm_preload");
    let mut rng = Rng::new(161);
    for (rows, d) in [(1, HIDDEN), (2, HIDDEN), (4, HIDDEN), (8, HIDDEN), (3, 1000), (1, 77), (2, 5000)] {
        norm_case::<bf16>(&k, &mut rng, rows, d);
        norm_case::<f32>(&k, &mut rng, rows, d);
    }
}

/// µs a call over `iters` back-to-back calls (programmatic dependent launch between them, as
/// in the model's graph), the weights rotated over ≥ 160 MB so that L2 (50 MB) does not hold them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn decode_gemv_norm_timed() {
    let k = gpu("decode_gemv_norm_timed");
    let mut hold = Hold::new(&k);
    let iters = 60;
    let shapes: [(&str, usize, usize, bool); 6] = [
        ("in_proj", 12352, HIDDEN, false),
        ("out_proj", HIDDEN, 4096, false),
        ("moe input f32", 1544, HIDDEN, true),
        ("q proj", 4096, HIDDEN, false),
        ("small", 512, HIDDEN, false),
        ("lm_head f32", 151_936, HIDDEN, true),
    ];
    for (name, n, kk, f32_out) in shapes {
        let bytes = n * kk * 2;
        let copies = (160usize << 20).div_ceil(bytes).max(1);
        let mut wbuf = k.stream().alloc_zeros::<bf16>(copies * n * kk).expect("alloc");
        k.fill_uniform(&mut wbuf, 7, 0.02, 0.0).expect("fill");
        for m in [1usize, 8] {
            let x = up::<bf16>(&k, &Rng::new(162).vec(m * kk, 1.0));
            let mut ob = poisoned::<bf16>(&k, m * n);
            let mut of = poisoned::<f32>(&k, m * n);
            let mut res = Vec::new();
            for kind in [GemvKind::Block, GemvKind::Preload] {
                let sec = time_calls(&k, &mut hold, iters, &mut |i| {
                    let c = i % copies;
                    let w = wbuf.slice(c * n * kk..(c + 1) * n * kk);
                    if f32_out {
                        k.gemv_as::<bf16, f32>(kind, &x, &w, &mut of, m, kk, n).expect("gemv");
                    } else {
                        k.gemv_as::<bf16, bf16>(kind, &x, &w, &mut ob, m, kk, n).expect("gemv");
                    }
                });
                res.push(format!("{kind:?} {:.2} µs {:.2} TB/s", sec * 1e6, bytes as f64 / sec / 1e12));
            }
            println!("gemv {name} [{n}, {kk}] m={m} ({copies} weight copies): {}", res.join(" | "));
        }
    }
    // The one-row norms of a decode step (d = 2048, bf16 out), weights rotated too.
    let d = HIDDEN;
    let copies = 64;
    let mut nw = k.stream().alloc_zeros::<bf16>(copies * d).expect("alloc");
    k.fill_uniform(&mut nw, 8, 0.5, 0.0).expect("fill");
    let mut xr = up::<f32>(&k, &Rng::new(163).vec(d, 1.0));
    let yb = up::<bf16>(&k, &Rng::new(164).vec(d, 0.01));
    let yf = up::<f32>(&k, &Rng::new(165).vec(d, 0.01));
    let mut out = poisoned::<bf16>(&k, d);
    for pre in [false, true] {
        let s1 = time_calls(&k, &mut hold, iters, &mut |i| {
            let w = nw.slice((i % copies) * d..(i % copies + 1) * d);
            k.add_rms_norm_with::<bf16, bf16>(pre, &mut xr, &yb, &w, &mut out, 1, d, 1e-6, RmsNormKind::ZeroCentred)
                .expect("add_rms_norm");
        });
        let s2 = time_calls(&k, &mut hold, iters, &mut |i| {
            let w = nw.slice((i % copies) * d..(i % copies + 1) * d);
            k.add_rms_norm_with::<f32, bf16>(pre, &mut xr, &yf, &w, &mut out, 1, d, 1e-6, RmsNormKind::ZeroCentred)
                .expect("add_rms_norm");
        });
        println!("add_rms_norm [1, {d}] preload={pre}: bf16 y {:.2} µs, f32 y {:.2} µs", s1 * 1e6, s2 * 1e6);
    }
}
