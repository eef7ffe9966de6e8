//! The fused RMSNorm + skinny GEMV (kernels/cuda/norm_gemv.cu): bit for bit the sequence it
//! replaces (rms_norm / add_rms_norm, then gemv, on the GPU), and within the usual tolerance of
//! the CPU reference (f64 sums over the normalised rows rounded as the kernels round them).
//! GPU tests are `#[ignore = "needs a CUDA GPU"]` (run with `--include-ignored`; see
//! kernels/tests/cuda_kernels.rs for the conventions).

mod common;

use common::fp8::W8;
use common::*;
use cudarc::driver::CudaSlice;
use porter_kernels::cuda::{CudaFloat, CudaKernels, Fp8GemvForm, NormGemvAdd, RmsNormKind};

const EPS: f32 = 1e-6;

/// The CPU reference: `(normed, out, sum)` for rows `x (+ y)` (f32 values, `y` already in T).
fn reference<T: CudaFloat>(
    x: &[f32],
    y: Option<&[f32]>,
    nw: &[f32],
    kind: RmsNormKind,
    w: &[f32],
    (m, k, n): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let sum: Vec<f32> = match y {
        Some(y) => x.iter().zip(y).map(|(a, b)| a + b).collect(),
        None => x.to_vec(),
    };
    let mut normed = vec![0.0f32; m * k];
    for r in 0..m {
        let row = &sum[r * k..(r + 1) * k];
        let ss: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let inv = (1.0 / (ss / k as f64 + f64::from(EPS)).sqrt()) as f32;
        for i in 0..k {
            normed[r * k + i] = match kind {
                RmsNormKind::ZeroCentred => rnd::<T>(row[i] * inv * (1.0 + nw[i])),
                RmsNormKind::Standard => rnd::<T>(nw[i] * rnd::<T>(row[i] * inv)),
            };
        }
    }
    let mut out = vec![0.0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            let d: f64 = (0..k).map(|i| f64::from(normed[r * k + i]) * f64::from(w[j * k + i])).sum();
            out[r * n + j] = d as f32;
        }
    }
    (normed, out, sum)
}

fn bits<T: CudaFloat>(k: &CudaKernels, d: &CudaSlice<T>) -> Vec<u32> {
    down(k, d).into_iter().map(f32::to_bits).collect()
}

/// One case; `Y` is the type of the added `y` (T or f32; unused without `add`).
#[allow(clippy::too_many_arguments)]
fn case<T: CudaFloat, O: CudaFloat, Y: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    m: usize,
    kk: usize,
    n: usize,
    add: bool,
    kind: RmsNormKind,
) {
    let what = format!("{} -> {} m={m} k={kk} n={n} add={add} (y {}) {kind:?}", T::NAME, O::NAME, Y::NAME);
    let x = rng.vec(m * kk, 2.0);
    let y = rnd_vec::<Y>(&rng.vec(m * kk, 1.0));
    let nw = rnd_vec::<T>(&rng.vec(kk, 0.5));
    let w = rnd_vec::<T>(&rng.vec(n * kk, 0.1));
    let (dx, dy, dnw, dw) = (up::<f32>(k, &x), up::<Y>(k, &y), up::<T>(k, &nw), up::<T>(k, &w));
    // Fused.
    let (mut out, mut normed, mut sum) =
        (poisoned::<O>(k, m * n), poisoned::<T>(k, m * kk), poisoned::<f32>(k, m * kk));
    let a = add.then_some(NormGemvAdd { y: &dy, sum: &mut sum });
    k.norm_gemv::<T, O, Y>(&dx, a, &dnw, EPS, kind, &dw, &mut out, &mut normed, (m, kk, n)).expect("norm_gemv");
    // The sequence it replaces.
    let mut xs = up::<f32>(k, &x);
    let (mut out2, mut normed2) = (poisoned::<O>(k, m * n), poisoned::<T>(k, m * kk));
    if add {
        k.add_rms_norm::<Y, T>(&mut xs, &dy, &dnw, &mut normed2, m, kk, EPS, kind).expect("add_rms_norm");
    } else {
        k.rms_norm::<f32, T>(&xs, &dnw, &mut normed2, m, kk, EPS, kind).expect("rms_norm");
    }
    k.gemv::<T, O>(&normed2, &dw, &mut out2, m, kk, n).expect("gemv");
    assert_eq!(bits(k, &normed), bits(k, &normed2), "{what}: normalised rows differ from rms_norm's");
    assert_eq!(bits(k, &out), bits(k, &out2), "{what}: outputs differ from rms_norm + gemv");
    if add {
        assert_eq!(bits(k, &sum), bits(k, &xs), "{what}: new residual differs from add_rms_norm's");
        assert_eq!(down(k, &dx), x, "{what}: x was written");
    }
    // The CPU reference.
    let (rn, ro, rs) = reference::<T>(&x, add.then_some(&y[..]), &nw, kind, &w, (m, kk, n));
    check(&format!("{what} normed"), &down(k, &normed), &rn, tol::<T>());
    check(&format!("{what} out"), &down(k, &out), &ro, tol::<T>());
    if add {
        check(&format!("{what} sum"), &down(k, &sum), &rs, TOL_F32);
    }
}

fn all_cases<T: CudaFloat, O: CudaFloat>(k: &CudaKernels, rng: &mut Rng) {
    // k: 2048 (the 80B hidden size: 512 norm threads, 4 a thread), 4096 (8 a thread), 5120
    // (the norm kernel's loop path), 520 (512 threads, a ragged second pass), 160 (fewer
    // norm threads than the GEMV's 256). n: one warp a column (12352), split 4 (1544), odd.
    let kinds = [RmsNormKind::Standard, RmsNormKind::ZeroCentred];
    for (i, &(kk, n)) in [(2048, 12352), (2048, 1544), (4096, 300), (5120, 64), (520, 77), (160, 33)].iter().enumerate()
    {
        for m in [1, 2, 3, 4] {
            // Rows beyond the fused kernel's shared memory run apart (the model's choice).
            if !CudaKernels::norm_gemv_fits::<T, O>(m, kk) {
                continue;
            }
            case::<T, O, T>(k, rng, m, kk, n, (i + m) % 2 == 0, kinds[(i + m / 2) % 2]);
            case::<T, O, T>(k, rng, m, kk, n, (i + m) % 2 == 1, kinds[(i + m / 2 + 1) % 2]);
            // The added rows in f32 (the MoE block's output).
            case::<T, O, f32>(k, rng, m, kk, n, true, kinds[(i + m) % 2]);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_gemv_bf16() {
    let k = gpu("norm_gemv_bf16");
    let mut rng = Rng::new(91);
    all_cases::<half::bf16, half::bf16>(&k, &mut rng);
    all_cases::<half::bf16, f32>(&k, &mut rng);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_gemv_f16_f32() {
    let k = gpu("norm_gemv_f16_f32");
    let mut rng = Rng::new(92);
    all_cases::<half::f16, half::f16>(&k, &mut rng);
    all_cases::<half::f16, f32>(&k, &mut rng);
    all_cases::<f32, f32>(&k, &mut rng);
}

/// The FP8 form: bit for bit `rms_norm` + `fp8_gemv` (the FMA form), and within tolerance of
/// the CPU reference on the exactly dequantized weights.
fn fp8_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, m: usize, kk: usize, n: usize, kind: RmsNormKind) {
    let what = format!("fp8 {} m={m} k={kk} n={n} {kind:?}", T::NAME);
    let x = rng.vec(m * kk, 2.0);
    let nw = rnd_vec::<T>(&rng.vec(kk, 0.5));
    let w = W8::new(k, rng, n, kk);
    let (dx, dnw) = (up::<f32>(k, &x), up::<T>(k, &nw));
    let (mut out, mut normed) = (poisoned::<T>(k, m * n), poisoned::<T>(k, m * kk));
    k.norm_fp8_gemv::<T>(&dx, &dnw, EPS, kind, w.dev(), &mut out, &mut normed, m).expect("norm_fp8_gemv");
    let (mut out2, mut normed2) = (poisoned::<T>(k, m * n), poisoned::<T>(k, m * kk));
    k.rms_norm::<f32, T>(&dx, &dnw, &mut normed2, m, kk, EPS, kind).expect("rms_norm");
    k.fp8_gemv_with::<T, T>(&normed2, w.dev(), &mut out2, m, Fp8GemvForm::FMA).expect("fp8_gemv");
    assert_eq!(bits(k, &normed), bits(k, &normed2), "{what}: normalised rows differ from rms_norm's");
    assert_eq!(bits(k, &out), bits(k, &out2), "{what}: outputs differ from rms_norm + fp8_gemv");
    let (rn, ro, _) = reference::<T>(&x, None, &nw, kind, &w.dense::<f32>(), (m, kk, n));
    check(&format!("{what} normed"), &down(k, &normed), &rn, tol::<T>());
    check(&format!("{what} out"), &down(k, &out), &ro, tol::<T>());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_fp8_gemv_all() {
    let k = gpu("norm_fp8_gemv_all");
    let mut rng = Rng::new(94);
    // n picks the weight rows a warp: 4 (12352 at one row), 2, 1 (2048 from two rows on, 300).
    for &(kk, n) in &[(2048usize, 12352usize), (2048, 2048), (4096, 300), (512, 130)] {
        for m in [1, 2, 3, 4] {
            let kind = if (m + n) % 2 == 0 { RmsNormKind::ZeroCentred } else { RmsNormKind::Standard };
            fp8_case::<half::bf16>(&k, &mut rng, m, kk, n, kind);
            if kk <= 2048 {
                fp8_case::<half::f16>(&k, &mut rng, m, kk, n, kind);
                fp8_case::<f32>(&k, &mut rng, m, kk, n, kind);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_gemv_rejects_bad_args() {
    let k = gpu("norm_gemv_rejects_bad_args");
    let (x, nw, w) =
        (up::<f32>(&k, &[0.0; 5 * 64]), up::<half::bf16>(&k, &[0.0; 64]), up::<half::bf16>(&k, &[0.0; 64 * 8]));
    let (mut out, mut normed) = (poisoned::<half::bf16>(&k, 5 * 8), poisoned::<half::bf16>(&k, 5 * 64));
    for (dims, why) in [((5, 64, 8), "5 rows (at most 4)"), ((1, 64, 9), "a w shorter than n·k")] {
        let none: Option<NormGemvAdd<'_, CudaSlice<half::bf16>, CudaSlice<f32>>> = None;
        let r = k.norm_gemv::<half::bf16, half::bf16, half::bf16>(
            &x,
            none,
            &nw,
            EPS,
            RmsNormKind::Standard,
            &w,
            &mut out,
            &mut normed,
            dims,
        );
        assert!(r.is_err(), "{why} must be refused");
    }
}

/// µs per call of the fused launch against rms_norm / add_rms_norm + gemv at the 80B decode
/// shapes (weights rotated over > 150 MB so they come from HBM).
#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_gemv_80b_timing() {
    type T = half::bf16;
    let k = gpu("norm_gemv_80b_timing");
    let mut rng = Rng::new(93);
    for &(n, add, o32) in &[(12352usize, false, false), (1544, true, true), (520, true, true), (8192, false, false)] {
        let kk = 2048;
        let copies = (160 << 20) / (n * kk * 2) + 1;
        let ws: Vec<CudaSlice<T>> = (0..copies).map(|_| up::<T>(&k, &rng.vec(n * kk, 0.1))).collect();
        for m in [1usize, 4] {
            let (x, y, nw) = (
                up::<f32>(&k, &rng.vec(m * kk, 1.0)),
                up::<T>(&k, &rng.vec(m * kk, 1.0)),
                up::<T>(&k, &rng.vec(kk, 0.5)),
            );
            let mut normed = poisoned::<T>(&k, m * kk);
            let mut sum = poisoned::<f32>(&k, m * kk);
            let (mut ob, mut of) = (poisoned::<T>(&k, m * n), poisoned::<f32>(&k, m * n));
            let kind = RmsNormKind::ZeroCentred;
            let iters = 200;
            let time = |f: &mut dyn FnMut(usize)| {
                for i in 0..10 {
                    f(i);
                }
                k.stream().synchronize().expect("sync");
                let t0 = std::time::Instant::now();
                for i in 0..iters {
                    f(i);
                }
                k.stream().synchronize().expect("sync");
                t0.elapsed().as_secs_f64() * 1e6 / iters as f64
            };
            let fused = time(&mut |i| {
                let w = &ws[i % copies];
                let a = add.then_some(NormGemvAdd { y: &y, sum: &mut sum });
                if o32 {
                    k.norm_gemv::<T, f32, T>(&x, a, &nw, EPS, kind, w, &mut of, &mut normed, (m, kk, n))
                        .expect("fused");
                } else {
                    k.norm_gemv::<T, T, T>(&x, a, &nw, EPS, kind, w, &mut ob, &mut normed, (m, kk, n)).expect("fused");
                }
            });
            let mut xs = up::<f32>(&k, &rng.vec(m * kk, 1.0));
            let apart = time(&mut |i| {
                let w = &ws[i % copies];
                if add {
                    k.add_rms_norm::<T, T>(&mut xs, &y, &nw, &mut normed, m, kk, EPS, kind).expect("norm");
                } else {
                    k.rms_norm::<f32, T>(&x, &nw, &mut normed, m, kk, EPS, kind).expect("norm");
                }
                if o32 {
                    k.gemv::<T, f32>(&normed, w, &mut of, m, kk, n).expect("gemv");
                } else {
                    k.gemv::<T, T>(&normed, w, &mut ob, m, kk, n).expect("gemv");
                }
            });
            let gbs = (n * kk * 2) as f64 / fused / 1e3;
            println!(
                "  TIME norm_gemv [{n}, {kk}] m={m} add={add}: fused {fused:.1} us ({gbs:.0} GB/s), \
                 norm + gemv {apart:.1} us"
            );
        }
    }
}

/// NVRTC only: the fused kernels compile for sm_90 without register spills.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_norm_gemv_ptxas_info() {
    let lines = ptxas_info("nvrtc_norm_gemv_ptxas_info", "misc.cu");
    let mut seen = 0;
    for (func, line) in lines.iter().filter(|(f, _)| f.contains("norm_gemv")) {
        println!("{func}: {line}");
        seen += 1;
        assert!(!line.contains("spill") || line.contains(" 0 bytes spill stores"), "{func} spills: {line}");
    }
    assert!(seen > 0, "no norm_gemv kernel in the ptxas output");
}
