//! The FP8 kernels (`kernels/cuda/fp8.cu`) against the CPU reference (`porter_kernels::cpu::fp8`):
//! the dequantizing GEMV (every row count 1..=8, row-invariance), dequantize and block quantize
//! (bit-exact), and the FP8 MoE decode GEMVs (v1 and v2, bit for bit, per-stage timings), in f32,
//! bf16 and f16, at small shapes with partial 128-blocks and at the real Qwen3-Next-80B-A3B
//! dimensions (hidden 2048, GDN qkvz 2048 → 12288, expert intermediate 512, 512 experts top-10),
//! with timings and GB/s.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`), the
//! ptxas check `#[ignore = "needs NVRTC ..."]`. Outputs are poisoned with NaN before every launch.

mod common;

use common::fp8::{moe_ref, stack, W8};
use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cpu::fp8::{matmul_t_fp8, quantize_blocks, BLOCK};
use porter_kernels::cuda::{
    CudaFloat, CudaKernels, Fp8GemvConv, Fp8GemvForm, MoeGemv, FP8_GEMV_FMA_M1_MIN, MOE_PHASES_ALL,
};
use std::time::Instant;

#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_fp8_ptxas_info() {
    let mut spills = Vec::new();
    for (func, line) in ptxas_info("nvrtc_fp8_ptxas_info", "fp8.cu") {
        if func.contains("fp8") {
            println!("{func}: {line}");
            if line.contains("spill") && !line.contains(" 0 bytes spill stores") {
                spills.push(func);
            }
        }
    }
    assert!(spills.is_empty(), "fp8 kernels with spills: {spills:?}");
}

/// Largest |got − want| over max |want| (infinite where `got` is NaN and `want` is not).
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    got.iter().zip(want).fold(0.0f32, |e, (g, w)| {
        if g.is_nan() && !w.is_nan() {
            f32::INFINITY
        } else {
            e.max((g - w).abs() / scale)
        }
    })
}

/// Records a failure unless `got` is within `tol` (relative to max |want|) of `want`.
fn close(fails: &mut Vec<String>, what: &str, got: &[f32], want: &[f32], tol: f32) {
    let e = rel_err(got, want);
    if e > tol {
        fails.push(format!("{what}: max error {e:.3e} of max |ref| > {tol:.1e}"));
    }
}

/// Records a failure unless `a` and `b` are the same bits.
fn same(fails: &mut Vec<String>, what: &str, a: &[f32], b: &[f32]) {
    let diff = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    if diff > 0 || a.len() != b.len() {
        fails.push(format!("{what}: {diff} of {} elements differ", a.len()));
    }
}

/// The A/B forms of the FP8 GEMV (bf16 -> bf16 kernels; every one gives the FMA form's bits).
const AB_FORMS: [Fp8GemvForm; 4] = [
    Fp8GemvForm { conv: Fp8GemvConv::Hw, rows_per_warp: 1 },
    Fp8GemvForm { conv: Fp8GemvConv::Hw, rows_per_warp: 2 },
    Fp8GemvForm { conv: Fp8GemvConv::Hw, rows_per_warp: 4 },
    Fp8GemvForm { conv: Fp8GemvConv::Alu, rows_per_warp: 0 },
];
const LEGACY: Fp8GemvForm = Fp8GemvForm { conv: Fp8GemvConv::Legacy, rows_per_warp: 0 };

/// The GEMV at every row count 1..=8 against the CPU oracle, failures collected. Reference:
/// `matmul_t_fp8` with no rounding of W (the kernel's semantics: W = e4m3 · scale in f32; the
/// CPU accumulates in another order, so the f32 tolerance, 1e-5 of max |ref|, covers f32
/// reordering over k ≤ 4096 terms, ~√k · 2⁻²⁴ relative); outputs in T against the reference
/// rounded to T within 1e-2 (one rounding to T plus the f32 difference). The legacy form
/// (W rounded to T per weight) against the rounded reference. Both the default (tensor cores
/// for bf16 / f16 x) and the FMA form are checked so; row 0's bits must not depend on m in
/// either (but the default form's at m = 1 on a weight of `FP8_GEMV_FMA_M1_MIN` elements or
/// more, which is the FMA form's); the A/B forms must give the FMA form's bits.
fn gemv_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, n: usize, kk: usize, fails: &mut Vec<String>) {
    let w = W8::new(k, rng, n, kk);
    let x = rnd_vec::<T>(&rng.vec(8 * kk, 1.0));
    let xd = up::<T>(k, &x);
    let bf16 = T::NAME == "bf16";
    let mut row0: Vec<Vec<f32>> = Vec::new();
    let mut row0_fma: Vec<Vec<f32>> = Vec::new();
    let mut dev_max = 0.0f32;
    for m in 1..=8 {
        let what = format!("fp8_gemv {} m={m} [{n}, {kk}]", T::NAME);
        let mut want = vec![0.0; m * n];
        matmul_t_fp8(&x[..m * kk], w.host(), &mut want, m, kk, n, false, &|v| v);
        let mut rounded = vec![0.0; m * n];
        matmul_t_fp8(&x[..m * kk], w.host(), &mut rounded, m, kk, n, false, &|v| rnd::<T>(v));
        dev_max = dev_max.max(rel_err(&want, &rounded));
        let xv = xd.slice(0..m * kk);
        let mut o32 = poisoned::<f32>(k, m * n);
        k.fp8_gemv_with::<T, f32>(&xv, w.dev(), &mut o32, m, Fp8GemvForm::AUTO).unwrap();
        let got = down(k, &o32);
        close(fails, &format!("{what} -> f32"), &got, &want, TOL_F32);
        let mut ot = poisoned::<T>(k, m * n);
        k.fp8_gemv_with::<T, T>(&xv, w.dev(), &mut ot, m, Fp8GemvForm::AUTO).unwrap();
        let got_t = down(k, &ot);
        close(fails, &format!("{what} -> {}", T::NAME), &got_t, &rnd_vec::<T>(&want), tol::<T>());
        row0.push(got[..n].to_vec());
        // The FMA form (the default for f32 x), the reference of the A/B forms' bits.
        let mut o32 = poisoned::<f32>(k, m * n);
        k.fp8_gemv_with::<T, f32>(&xv, w.dev(), &mut o32, m, Fp8GemvForm::FMA).unwrap();
        let got_fma = down(k, &o32);
        close(fails, &format!("{what} fma -> f32"), &got_fma, &want, TOL_F32);
        row0_fma.push(got_fma[..n].to_vec());
        let mut ot = poisoned::<T>(k, m * n);
        k.fp8_gemv_with::<T, T>(&xv, w.dev(), &mut ot, m, Fp8GemvForm::FMA).unwrap();
        let got_fma_t = down(k, &ot);
        close(fails, &format!("{what} fma -> {}", T::NAME), &got_fma_t, &rnd_vec::<T>(&want), tol::<T>());
        if bf16 {
            for form in AB_FORMS {
                let mut o = poisoned::<T>(k, m * n);
                k.fp8_gemv_with::<T, T>(&xv, w.dev(), &mut o, m, form).unwrap();
                same(fails, &format!("{what} {form:?} vs the fma form"), &down(k, &o), &got_fma_t);
            }
            let mut o = poisoned::<f32>(k, m * n);
            k.fp8_gemv_with::<T, f32>(&xv, w.dev(), &mut o, m, LEGACY).unwrap();
            close(fails, &format!("{what} legacy -> f32 (rounded W)"), &down(k, &o), &rounded, TOL_F32);
        }
    }
    // The default form takes the FMA kernel for one row of a large weight (measured faster
    // there) and tensor cores otherwise: its m = 1 row has the FMA form's bits there.
    let m1_fma = k.fp8_gemv_tc_fits::<T>() && n * kk >= FP8_GEMV_FMA_M1_MIN;
    for (m, r) in row0.iter().enumerate() {
        let (want, of) = if m == 0 && m1_fma { (&row0_fma[7], "the fma form at m = 8") } else { (&row0[7], "m = 8") };
        same(fails, &format!("fp8_gemv {} [{n}, {kk}] row 0 at m = {} vs {of}", T::NAME, m + 1), r, want);
        let f = &row0_fma[m];
        same(fails, &format!("fp8_gemv fma {} [{n}, {kk}] row 0 at m = {} vs m = 8", T::NAME, m + 1), f, &row0_fma[7]);
    }
    println!(
        "  fp8_gemv {} [{n}, {kk}]: checked m = 1..8; exact vs rounded-to-{} W differ by {dev_max:.2e} of max |ref|",
        T::NAME,
        T::NAME
    );
}

fn gemv_all<T: CudaFloat>(test: &str) {
    let k = gpu(test);
    let mut rng = Rng::new(81);
    let mut fails = Vec::new();
    // Odd sizes (n not a multiple of 16, k of 128 or 64, one scale block, k > 4 · 8 scale
    // blocks: a second batch in the tensor-core form) and the 80B shapes.
    for (n, kk) in
        [(300, 400), (130, 16), (17, 1040), (40, 8208), (12352, 2048), (2048, 4096), (1544, 2048), (1024, 2048)]
    {
        gemv_case::<T>(&k, &mut rng, n, kk, &mut fails);
    }
    assert!(fails.is_empty(), "{test}: {} failures:\n{}", fails.len(), fails.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemv_f32() {
    gemv_all::<f32>("fp8_gemv_f32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemv_bf16() {
    gemv_all::<bf16>("fp8_gemv_bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemv_f16() {
    gemv_all::<f16>("fp8_gemv_f16");
}

/// Mean µs per call of `f(i)` over `iters` calls (CUDA events), after two warm-up calls.
fn time_us(k: &CudaKernels, iters: usize, mut f: impl FnMut(usize)) -> f64 {
    f(0);
    f(1);
    let s = k.stream().clone();
    s.synchronize().unwrap();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let a = s.record_event(flags).unwrap();
    for i in 0..iters {
        f(i);
    }
    let b = s.record_event(flags).unwrap();
    f64::from(a.elapsed_ms(&b).unwrap()) * 1e3 / iters as f64
}

/// Speed of every FP8 GEMV form at the 80B FP8 decode shapes (bf16 activations; out_proj and
/// in_proj to bf16, the router + shared input to f32), m = 1, 2, 4, 8, and the bf16 GEMV on a
/// weight of the same bytes ([n, k/2] bf16). Weights rotate over copies of ≥ 160 MB (the
/// H200's L2 is 50 MB), so every call reads HBM. GB/s counts the weight bytes (+ scales).
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemv_speed() {
    let k = gpu("fp8_gemv_speed");
    let mut rng = Rng::new(84);
    let s = k.stream().clone();
    for (n, kk, f32_out) in [(12352usize, 2048usize, false), (2048, 4096, false), (1544, 2048, true)] {
        let w = W8::new(&k, &mut rng, n, kk);
        let copies = (160usize << 20).div_ceil(n * kk).clamp(2, 64);
        let qs: Vec<CudaSlice<u8>> = (0..copies).map(|_| s.clone_dtod(&w.dq).unwrap()).collect();
        let dev = |i: usize| w.dev_with(&qs[i % copies]);
        let wb = up::<bf16>(&k, &rng.vec(n * kk / 2, 0.05));
        let wbs: Vec<CudaSlice<bf16>> = (0..copies).map(|_| s.clone_dtod(&wb).unwrap()).collect();
        let xd = up::<bf16>(&k, &rnd_vec::<bf16>(&rng.vec(8 * kk, 1.0)));
        let bytes = (n * kk + 4 * n + 4 * w.scales.len()) as f64;
        let mut forms = vec![("default", Fp8GemvForm::AUTO), ("legacy", LEGACY)];
        if !f32_out {
            forms.extend(["hw:1", "hw:2", "hw:4", "alu"].into_iter().zip(AB_FORMS));
        }
        for m in [1usize, 2, 4, 8] {
            let xv = xd.slice(0..m * kk);
            let mut line = format!("  fp8_gemv bf16 -> {} m={m} [{n}, {kk}]:", if f32_out { "f32" } else { "bf16" });
            for (label, form) in &forms {
                let us = if f32_out {
                    let mut o = poisoned::<f32>(&k, m * n);
                    time_us(&k, 60, |i| k.fp8_gemv_with::<bf16, f32>(&xv, dev(i), &mut o, m, *form).unwrap())
                } else {
                    let mut o = poisoned::<bf16>(&k, m * n);
                    time_us(&k, 60, |i| k.fp8_gemv_with::<bf16, bf16>(&xv, dev(i), &mut o, m, *form).unwrap())
                };
                line += &format!(" {label} {us:.1} us ({:.0} GB/s) |", bytes / us / 1e3);
            }
            let xh = xd.slice(0..m * kk / 2);
            let mut o = poisoned::<bf16>(&k, m * n);
            let us = time_us(&k, 60, |i| k.gemv::<bf16, bf16>(&xh, &wbs[i % copies], &mut o, m, kk / 2, n).unwrap());
            line +=
                &format!(" bf16 gemv [{n}, {}] same bytes {us:.1} us ({:.0} GB/s)", kk / 2, (n * kk) as f64 / us / 1e3);
            println!("{line}");
        }
    }
}

/// GPU time of the FP8 GEMV forms at the 80B decode shapes, m = 1, 2, 4, 8: the default
/// (tensor cores), `fma` (the default before) and `legacy`, beside the bf16 GEMV on a bf16
/// weight of the same shape (the dense decode path). 60 calls back to back behind a hold
/// (common/timing.rs: the events time the GPU, not the host's launches), weights rotated over
/// copies of ≥ 160 MB (the H200's L2 is 50 MB), PDL as the process has it (`PORTER_PDL`).
/// TB/s counts the weight bytes (+ scales) read once a call.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemv_tc_speed() {
    let k = gpu("fp8_gemv_tc_speed");
    let mut rng = Rng::new(85);
    let s = k.stream().clone();
    let mut hold = common::timing::Hold::new(&k);
    println!("  PDL {}", k.pdl());
    let shapes = [(12352usize, 2048usize), (2048, 4096), (4096, 2048), (1024, 2048), (512, 2048), (151_936, 2048)];
    for (n, kk) in shapes {
        let w = W8::new(&k, &mut rng, n, kk);
        let copies = (160usize << 20).div_ceil(n * kk).clamp(2, 64);
        let qs: Vec<CudaSlice<u8>> = (0..copies).map(|_| s.clone_dtod(&w.dq).unwrap()).collect();
        let dev = |i: usize| w.dev_with(&qs[i % copies]);
        let bcopies = (160usize << 20).div_ceil(2 * n * kk).clamp(2, 64);
        let wb = up::<bf16>(&k, &rng.vec(n * kk, 0.05));
        let wbs: Vec<CudaSlice<bf16>> = (0..bcopies).map(|_| s.clone_dtod(&wb).unwrap()).collect();
        drop(wb);
        let xd = up::<bf16>(&k, &rnd_vec::<bf16>(&rng.vec(8 * kk, 1.0)));
        let bytes = (n * kk + 4 * n + 4 * w.scales.len()) as f64;
        for m in [1usize, 2, 4, 8] {
            let xv = xd.slice(0..m * kk);
            let mut o = poisoned::<bf16>(&k, m * n);
            let mut line = format!("  fp8_gemv bf16 m={m} [{n}, {kk}]:");
            for (label, form) in [("tc", Fp8GemvForm::AUTO), ("fma", Fp8GemvForm::FMA), ("legacy", LEGACY)] {
                let sec = common::timing::time_calls(&k, &mut hold, 60, &mut |i| {
                    k.fp8_gemv_with::<bf16, bf16>(&xv, dev(i), &mut o, m, form).unwrap()
                });
                line += &format!(" {label} {:.2} us {:.2} TB/s |", sec * 1e6, bytes / sec / 1e12);
            }
            let sec = common::timing::time_calls(&k, &mut hold, 60, &mut |i| {
                k.gemv::<bf16, bf16>(&xv, &wbs[i % bcopies], &mut o, m, kk, n).unwrap()
            });
            line += &format!(" bf16 gemv {:.2} us {:.2} TB/s", sec * 1e6, (2 * n * kk) as f64 / sec / 1e12);
            println!("{line}");
        }
    }
}

fn dequant_quant<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, rows: usize, cols: usize) {
    let w = W8::new(k, rng, rows, cols);
    let mut o = poisoned::<T>(k, rows * cols);
    k.fp8_dequant::<T>(w.dev(), &mut o).unwrap();
    assert_eq!(down(k, &o), w.dense::<T>(), "fp8_dequant {} [{rows}, {cols}] is not bit-exact", T::NAME);
    // Block quantization of values already in T: bit-exact against the host.
    let v = rnd_vec::<T>(&rng.vec(rows * cols, 0.3));
    let mut v2 = v.clone();
    v2[..cols.min(200)].iter_mut().for_each(|x| *x = 0.0); // a (partly) zero block
    let (q, s) = quantize_blocks(&v2, rows, cols);
    let vd = up::<T>(k, &v2);
    let mut dq = k.stream().clone_htod(&vec![0xAAu8; rows * cols]).unwrap();
    let mut ds = poisoned::<f32>(k, rows.div_ceil(BLOCK) * cols.div_ceil(BLOCK));
    k.fp8_quantize::<T>(&vd, &mut dq, &mut ds, rows, cols).unwrap();
    k.stream().synchronize().unwrap();
    assert_eq!(k.stream().clone_dtoh(&ds).unwrap(), s, "fp8_quantize {} scales", T::NAME);
    assert_eq!(k.stream().clone_dtoh(&dq).unwrap(), q, "fp8_quantize {} bytes", T::NAME);
    println!("  fp8_dequant / fp8_quantize {} [{rows}, {cols}]: bit-exact", T::NAME);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_dequant_and_quantize() {
    let k = gpu("fp8_dequant_and_quantize");
    let mut rng = Rng::new(82);
    for (r, c) in [(300, 400), (130, 77), (2048, 512)] {
        dequant_quant::<f32>(&k, &mut rng, r, c);
        dequant_quant::<bf16>(&k, &mut rng, r, c);
        dequant_quant::<f16>(&k, &mut rng, r, c);
    }
    // Speed of the prefill-path dequantization at the GDN qkvz size.
    let w = W8::new(&k, &mut rng, 12288, 2048);
    let mut o = poisoned::<bf16>(&k, 12288 * 2048);
    k.fp8_dequant::<bf16>(w.dev(), &mut o).unwrap();
    k.stream().synchronize().unwrap();
    let t0 = std::time::Instant::now();
    for _ in 0..20 {
        k.fp8_dequant::<bf16>(w.dev(), &mut o).unwrap();
    }
    k.stream().synchronize().unwrap();
    let s = t0.elapsed().as_secs_f64() / 20.0;
    println!(
        "  fp8_dequant bf16 [12288, 2048]: {:.1} us, {:.0} GB/s (read + write)",
        s * 1e6,
        3.0 * 12288.0 * 2048.0 / s / 1e9
    );
}

/// `k` distinct random experts per row out of `e`.
fn routes(rng: &mut Rng, t: usize, k: usize, e: usize) -> Vec<u32> {
    let mut idx = Vec::with_capacity(t * k);
    for _ in 0..t {
        let mut row: Vec<u32> = Vec::new();
        while row.len() < k {
            let v = rng.below(e) as u32;
            if !row.contains(&v) {
                row.push(v);
            }
        }
        idx.extend(row);
    }
    idx
}

/// Panics, naming the element and both values, unless `a` and `b` are the same bits.
fn same_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: length");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()) {
        let diff = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        panic!("{what}: {diff} of {} elements differ, first at {i}: {:e} vs {:e}", a.len(), a[i], b[i]);
    }
}

fn moe_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, dims: [usize; 5], bank: usize, timing: bool) {
    let [t, kk, e, h, i] = dims;
    let (g, u, d) = (W8::new(k, rng, bank * i, h), W8::new(k, rng, bank * i, h), W8::new(k, rng, bank * h, i));
    let (gs, us, dstk) = (stack(k, &g, e, bank), stack(k, &u, e, bank), stack(k, &d, e, bank));
    let x = rnd_vec::<T>(&rng.vec(t * h, 1.0));
    let idx = routes(rng, t, kk, e);
    let wt: Vec<f32> = (0..t * kk).map(|_| rng.f(0.5) + 0.5).collect();
    let want = moe_ref::<T>(&x, &idx, &wt, &g.dense::<T>(), &u.dense::<T>(), &d.dense::<T>(), dims, bank);
    let (xd, id, wd) = (up::<T>(k, &x), up_u32(k, &idx), up::<f32>(k, &wt));
    let what = format!("moe_experts_fp8 {} t={t} k={kk} e={e} h={h} i={i}", T::NAME);
    // Every form against the reference and bit for bit against each other.
    let mut got = Vec::new();
    for which in [MoeGemv::V1, MoeGemv::V2, MoeGemv::Direct, MoeGemv::DirectL2] {
        let mut out = poisoned::<f32>(k, t * h);
        k.moe_experts_fp8_with::<T>(
            &xd,
            &id,
            &wd,
            gs.dev(),
            us.dev(),
            dstk.dev(),
            &mut out,
            dims,
            which,
            MOE_PHASES_ALL,
        )
        .unwrap();
        let o = down(k, &out);
        check(&format!("{what} {which:?}"), &o, &want, tol::<T>());
        got.push(o);
    }
    same_bits(&format!("{what}: v2 vs v1"), &got[1], &got[0]);
    same_bits(&format!("{what}: direct vs v1"), &got[2], &got[0]);
    same_bits(&format!("{what}: direct-l2 vs v1"), &got[3], &got[0]);
    // Batch invariance: row 0 alone equals row 0 of the whole call, bit for bit.
    let mut one = poisoned::<f32>(k, h);
    k.moe_experts_fp8::<T>(
        &xd.slice(0..h),
        &id.slice(0..kk),
        &wd.slice(0..kk),
        gs.dev(),
        us.dev(),
        dstk.dev(),
        &mut one,
        [1, kk, e, h, i],
    )
    .unwrap();
    assert_eq!(down(k, &one)[..], got[1][..h], "{what}: row 0 differs between t = 1 and t = {t}");
    if timing {
        // 16 distinct route sets (the weights of one set would stay in L2), CUDA events, per
        // stage: grouping, + gate+up, + down, + combine (v1: down includes the combine).
        let sets: Vec<Vec<u32>> = (0..16).map(|_| routes(rng, t, kk, e)).collect();
        let rd: Vec<CudaSlice<u32>> = sets.iter().map(|v| up_u32(k, v)).collect();
        let experts = sets
            .iter()
            .map(|v| {
                let mut u = v.clone();
                u.sort_unstable();
                u.dedup();
                u.len()
            })
            .sum::<usize>() as f64
            / sets.len() as f64;
        let bytes = experts * (3 * h * i) as f64;
        let mut out = poisoned::<f32>(k, t * h);
        let s = k.stream().clone();
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        for which in [MoeGemv::V1, MoeGemv::V2, MoeGemv::Direct, MoeGemv::DirectL2] {
            let mut st = [0.0f64; 4];
            for (p, slot) in st.iter_mut().enumerate() {
                let call = |r: &CudaSlice<u32>, out: &mut CudaSlice<f32>| {
                    k.moe_experts_fp8_with::<T>(&xd, r, &wd, gs.dev(), us.dev(), dstk.dev(), out, dims, which, p as u32)
                        .unwrap()
                };
                call(&rd[0], &mut out);
                call(&rd[1], &mut out);
                s.synchronize().unwrap();
                let iters = 50;
                let a = s.record_event(flags).unwrap();
                for it in 0..iters {
                    call(&rd[it % rd.len()], &mut out);
                }
                let b = s.record_event(flags).unwrap();
                *slot = a.elapsed_ms(&b).unwrap() as f64 / 1e3 / iters as f64;
            }
            println!(
                "  {what} {which:?}: {:.1} us, {experts:.1} experts read, {:.0} GB/s of expert weights | cumulative: \
                 grouping {:.1} us, +gate+up {:.1} us, +down {:.1} us, +combine {:.1} us",
                st[3] * 1e6,
                bytes / st[3] / 1e9,
                st[0] * 1e6,
                st[1] * 1e6,
                st[2] * 1e6,
                st[3] * 1e6
            );
        }
        let got = down(k, &out);
        assert!(got.iter().all(|v| v.is_finite()), "{what}: non-finite output after the timing loop");
    }
}

fn moe_all<T: CudaFloat>(test: &str) {
    let k = gpu(test);
    let mut rng = Rng::new(83);
    moe_case::<T>(&k, &mut rng, [3, 2, 8, 256, 136], 8, false);
    moe_case::<T>(&k, &mut rng, [5, 3, 6, 200, 64], 6, false); // scalar path (h % 16 != 0)
    for t in [1, 2, 4] {
        moe_case::<T>(&k, &mut rng, [t, 4, 16, 384, 256], 16, false);
    }
    moe_case::<T>(&k, &mut rng, [1, 10, 512, 2048, 512], 16, true);
    moe_case::<T>(&k, &mut rng, [2, 10, 512, 2048, 512], 16, false);
    moe_case::<T>(&k, &mut rng, [4, 10, 512, 2048, 512], 16, false);
    moe_case::<T>(&k, &mut rng, [8, 10, 512, 2048, 512], 16, true);
    moe_case::<T>(&k, &mut rng, [32, 10, 512, 2048, 512], 16, true);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_fp8_f32() {
    moe_all::<f32>("moe_fp8_f32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_fp8_bf16() {
    moe_all::<bf16>("moe_fp8_bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_fp8_f16() {
    moe_all::<f16>("moe_fp8_f16");
}

// ---------------------------------------------------------------------------
// The tensor-core decode form of the FP8 routed experts (fp8_moe_mma.cu, PORTER_FP8_MOE_DEC=mma).
// ---------------------------------------------------------------------------

/// The tensor-core form against the CPU reference with `moe_case`'s tolerance, and beside the
/// GEMV form (v1) within the same tolerance of the reference (not the same bits: another
/// summation order). `hot`: every row routed to experts 0..k (all pairs on k experts, so
/// each expert has t rows: several n8 passes).
fn moe_mma_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, dims: [usize; 5], bank: usize, hot: bool) {
    let [t, kk, e, h, i] = dims;
    let (g, u, d) = (W8::new(k, rng, bank * i, h), W8::new(k, rng, bank * i, h), W8::new(k, rng, bank * h, i));
    let (gs, us, dstk) = (stack(k, &g, e, bank), stack(k, &u, e, bank), stack(k, &d, e, bank));
    let x = rnd_vec::<T>(&rng.vec(t * h, 1.0));
    let idx = if hot { (0..t).flat_map(|_| (0..kk as u32).rev()).collect() } else { routes(rng, t, kk, e) };
    let wt: Vec<f32> = (0..t * kk).map(|_| rng.f(0.5) + 0.5).collect();
    let want = moe_ref::<T>(&x, &idx, &wt, &g.dense::<T>(), &u.dense::<T>(), &d.dense::<T>(), dims, bank);
    let (xd, id, wd) = (up::<T>(k, &x), up_u32(k, &idx), up::<f32>(k, &wt));
    let what = format!("moe_experts_fp8_mma {} t={t} k={kk} e={e} h={h} i={i} hot={hot}", T::NAME);
    assert!(k.moe_fp8_mma_fits::<T>(h, i), "{what}: does not fit");
    let mut out = poisoned::<f32>(k, t * h);
    k.moe_experts_fp8_mma::<T>(&xd, &id, &wd, gs.dev(), us.dev(), dstk.dev(), &mut out, dims).unwrap();
    let got = down(k, &out);
    let e_mma = check(&what, &got, &want, tol::<T>());
    let mut gemv = poisoned::<f32>(k, t * h);
    k.moe_experts_fp8_with::<T>(
        &xd,
        &id,
        &wd,
        gs.dev(),
        us.dev(),
        dstk.dev(),
        &mut gemv,
        dims,
        MoeGemv::V1,
        MOE_PHASES_ALL,
    )
    .unwrap();
    let e_gemv = check(&format!("{what} (gemv v1)"), &down(k, &gemv), &want, tol::<T>());
    println!("  {what}: max error {e_mma:.2e} (gemv {e_gemv:.2e}) of max |ref|");
}

fn moe_mma_all<T: CudaFloat>(test: &str) {
    let k = gpu(test);
    let mut rng = Rng::new(85);
    // Small odd shapes: partial row blocks (inter 144 = 2 · 64 + 16, hidden 208 = 128 + 80),
    // partial k blocks (down K = 144, gate / up K = 208), experts without rows.
    moe_mma_case::<T>(&k, &mut rng, [3, 2, 8, 256, 144], 8, false);
    moe_mma_case::<T>(&k, &mut rng, [5, 3, 6, 208, 80], 6, false);
    moe_mma_case::<T>(&k, &mut rng, [7, 4, 16, 384, 256], 16, false);
    // Hot experts: 40 rows on each of 4 experts (5 passes of 8 rows), and 100 on 10.
    moe_mma_case::<T>(&k, &mut rng, [40, 4, 16, 384, 256], 16, true);
    moe_mma_case::<T>(&k, &mut rng, [100, 10, 512, 2048, 512], 16, true);
    for t in [1, 2, 7, 8, 32, 64, 100] {
        moe_mma_case::<T>(&k, &mut rng, [t, 10, 512, 2048, 512], 16, false);
    }
    // f32 activations stay on the GEMV form.
    assert!(!k.moe_fp8_mma_fits::<f32>(2048, 512));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_fp8_mma_bf16() {
    moe_mma_all::<bf16>("moe_fp8_mma_bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_fp8_mma_f16() {
    moe_mma_all::<f16>("moe_fp8_mma_f16");
}

/// Speed of the tensor-core form beside the GEMV forms (direct, v1) at the 80B shapes (bf16,
/// hidden 2048, inter 512, top-10 of 512 experts, all 512 distinct in memory: 1.6 GB, beyond
/// L2), t = 1, 8, 32, 64: µs per call over 16 rotating random route sets (CUDA events, 50
/// calls) and TB/s of the FP8 weight bytes the routed experts touch (3 · 2048 · 512 a routed
/// expert; the scales add 1/16 KiB).
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_fp8_mma_speed() {
    let k = gpu("moe_fp8_mma_speed");
    let mut rng = Rng::new(86);
    let (e, h, i, kk, bank) = (512usize, 2048usize, 512usize, 10usize, 16usize);
    let t0 = Instant::now();
    let (g, u, d) =
        (W8::new(&k, &mut rng, bank * i, h), W8::new(&k, &mut rng, bank * i, h), W8::new(&k, &mut rng, bank * h, i));
    let (gs, us, dstk) = (stack(&k, &g, e, bank), stack(&k, &u, e, bank), stack(&k, &d, e, bank));
    println!("  weights ready in {:.1} s", t0.elapsed().as_secs_f64());
    for t in [1usize, 8, 32, 64] {
        let dims = [t, kk, e, h, i];
        let x = rnd_vec::<bf16>(&rng.vec(t * h, 1.0));
        let xd = up::<bf16>(&k, &x);
        let wd = up::<f32>(&k, &(0..t * kk).map(|_| rng.f(0.5) + 0.5).collect::<Vec<_>>());
        let sets: Vec<Vec<u32>> = (0..16).map(|_| routes(&mut rng, t, kk, e)).collect();
        let rd: Vec<CudaSlice<u32>> = sets.iter().map(|v| up_u32(&k, v)).collect();
        let experts = sets
            .iter()
            .map(|v| {
                let mut s = v.clone();
                s.sort_unstable();
                s.dedup();
                s.len()
            })
            .sum::<usize>() as f64
            / sets.len() as f64;
        let bytes = experts * (3 * h * i) as f64;
        let mut out = poisoned::<f32>(&k, t * h);
        let mut line = format!("  t={t:3} ({experts:.1} experts, {:.0} MB):", bytes / 1e6);
        for form in ["mma", "direct", "v1"] {
            let us_call = time_us(&k, 50, |it| {
                let r = &rd[it % rd.len()];
                match form {
                    "mma" => k.moe_experts_fp8_mma::<bf16>(&xd, r, &wd, gs.dev(), us.dev(), dstk.dev(), &mut out, dims),
                    "direct" => k.moe_experts_fp8_with::<bf16>(
                        &xd,
                        r,
                        &wd,
                        gs.dev(),
                        us.dev(),
                        dstk.dev(),
                        &mut out,
                        dims,
                        MoeGemv::Direct,
                        MOE_PHASES_ALL,
                    ),
                    _ => k.moe_experts_fp8_with::<bf16>(
                        &xd,
                        r,
                        &wd,
                        gs.dev(),
                        us.dev(),
                        dstk.dev(),
                        &mut out,
                        dims,
                        MoeGemv::V1,
                        MOE_PHASES_ALL,
                    ),
                }
                .unwrap()
            });
            line += &format!(" {form} {us_call:.1} us {:.2} TB/s |", bytes / us_call / 1e6);
        }
        println!("{line}");
        assert!(down(&k, &out).iter().all(|v| v.is_finite()), "t={t}: non-finite output");
    }
}
