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
use porter_kernels::cuda::{CudaFloat, CudaKernels, MoeGemv, MOE_PHASES_ALL};

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

fn gemv_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, n: usize, kk: usize, timing: bool) {
    let w = W8::new(k, rng, n, kk);
    let x = rnd_vec::<T>(&rng.vec(8 * kk, 1.0));
    let xd = up::<T>(k, &x);
    let mut full: Vec<Vec<f32>> = Vec::new();
    for m in 1..=8 {
        let mut want = vec![0.0; m * n];
        matmul_t_fp8(&x[..m * kk], w.host(), &mut want, m, kk, n, false, &|v| rnd::<T>(v));
        let xv = xd.slice(0..m * kk);
        let mut o32 = poisoned::<f32>(k, m * n);
        k.fp8_gemv::<T, f32>(&xv, w.dev(), &mut o32, m).unwrap();
        let got = down(k, &o32);
        check(&format!("fp8_gemv {} -> f32 m={m} [{n}, {kk}]", T::NAME), &got, &want, TOL_F32);
        let mut ot = poisoned::<T>(k, m * n);
        k.fp8_gemv::<T, T>(&xv, w.dev(), &mut ot, m).unwrap();
        check(&format!("fp8_gemv {} -> {} m={m}", T::NAME, T::NAME), &down(k, &ot), &rnd_vec::<T>(&want), tol::<T>());
        full.push(got);
    }
    // Row-invariance: row r is bit-identical whatever the row count.
    for (m, rows) in full.iter().enumerate() {
        assert_eq!(rows[..n], full[7][..n], "fp8_gemv row 0 differs between m = {} and m = 8", m + 1);
    }
    if timing {
        for m in [1usize, 4] {
            let xv = xd.slice(0..m * kk);
            let mut o = poisoned::<T>(k, m * n);
            k.fp8_gemv::<T, T>(&xv, w.dev(), &mut o, m).unwrap();
            k.stream().synchronize().unwrap();
            let iters = 50;
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                k.fp8_gemv::<T, T>(&xv, w.dev(), &mut o, m).unwrap();
            }
            k.stream().synchronize().unwrap();
            let s = t0.elapsed().as_secs_f64() / iters as f64;
            let bytes = (n * kk + 4 * n + 4 * w.scales.len()) as f64;
            println!(
                "  fp8_gemv {} m={m} [{n}, {kk}]: {:.1} us, {:.0} GB/s of weights",
                T::NAME,
                s * 1e6,
                bytes / s / 1e9
            );
        }
    }
}

fn gemv_all<T: CudaFloat>(test: &str) {
    let k = gpu(test);
    let mut rng = Rng::new(81);
    gemv_case::<T>(&k, &mut rng, 300, 400, false);
    gemv_case::<T>(&k, &mut rng, 12288, 2048, true);
    gemv_case::<T>(&k, &mut rng, 2048, 4096, true);
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
    for which in [MoeGemv::V1, MoeGemv::V2, MoeGemv::Direct] {
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
        for which in [MoeGemv::V1, MoeGemv::V2, MoeGemv::Direct] {
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
