//! The FP8 prefill GEMMs (`kernels/cuda/fp8_gemm.cu`) against the CPU reference
//! (`porter_kernels::cpu::fp8`): the tile-dequantizing tensor-core GEMM (dense and grouped MoE,
//! bf16 and f16, T and f32 outputs) against the f32 product with the dequantized weights, the
//! per-token activation quantization (bit-exact) and the e4m3 MMA GEMM (against an exact
//! emulation of its arithmetic, and its error against the weights-only reference, in units of
//! std(ref)), at shapes with partial 128-blocks and rows that do not fill a tile, and at the
//! real Qwen3-Next-80B-A3B shapes (GDN qkvz [4096, 2048] × [12288, 2048]ᵀ, out proj
//! [4096, 4096] → 2048, the MoE at 4096 tokens top-10 of 512 experts, hidden 2048, expert
//! intermediate 512), with timings of every path: dequantize + cuBLAS (the old prefill path),
//! tile-dequant TC, e4m3 MMA, and cuBLAS bf16 on the dense weight (the ceiling).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`).
//! Outputs are poisoned with NaN before every launch; at the large shapes the reference is
//! computed for a sample of rows (every row is checked for NaN).

mod common;

use common::fp8::{moe_ref, stack, W8};
use common::*;
use half::{bf16, f16};
use porter_kernels::cpu::fp8::{e4m3_to_f32, matmul_t_fp8, quantize_blocks, BLOCK};
use porter_kernels::cuda::{CudaFloat, CudaKernels, Gemm};
use rayon::prelude::*;

/// `(max |got − want|, rms(got − want))` in units of std(want).
fn err_std(got: &[f32], want: &[f32]) -> (f64, f64) {
    let n = want.len().max(1) as f64;
    let mean = want.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let std = (want.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n).sqrt().max(1e-30);
    let (mut mx, mut ss) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = (f64::from(g) - f64::from(w)).abs();
        mx = mx.max(d);
        ss += d * d;
    }
    (mx / std, (ss / n).sqrt() / std)
}

/// The rows whose reference is computed: all of them up to 256, else 48 (the first 16, the
/// last 16, 16 spread between).
fn sample_rows(m: usize) -> Vec<usize> {
    if m <= 256 {
        return (0..m).collect();
    }
    let mut r: Vec<usize> = (0..16).chain(m - 16..m).chain((1..=16).map(|i| i * (m - 32) / 17 + 16)).collect();
    r.sort_unstable();
    r.dedup();
    r
}

/// `rows` of `v` (`[_, width]`), concatenated.
fn gather(v: &[f32], rows: &[usize], width: usize) -> Vec<f32> {
    rows.iter().flat_map(|&r| v[r * width..(r + 1) * width].iter().copied()).collect()
}

/// Weights-only reference rows: `x[rows] · Wᵀ` on the weight dequantized and rounded to `A`.
fn ref_rows<A: CudaFloat>(x: &[f32], w: &W8, rows: &[usize]) -> Vec<f32> {
    let (k, n) = (w.cols, w.rows);
    let xs = gather(x, rows, k);
    let mut out = vec![0.0; rows.len() * n];
    matmul_t_fp8(&xs, w.host(), &mut out, rows.len(), k, n, false, &|v| rnd::<A>(v));
    out
}

/// Seconds per call of `f` (one warm-up call, then `iters` between two synchronisations).
fn time(k: &CudaKernels, iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    k.stream().synchronize().unwrap();
    let t0 = std::time::Instant::now();
    for _ in 0..iters {
        f();
    }
    k.stream().synchronize().unwrap();
    t0.elapsed().as_secs_f64() / iters as f64
}

fn no_nan(what: &str, v: &[f32]) {
    if let Some(i) = v.iter().position(|x| x.is_nan()) {
        panic!("{what}: element {i} of {} is NaN (not written?)", v.len());
    }
}

/// The tile-dequantizing GEMM `x · Wᵀ` (`A` → `O`, `splits` k-splits, `None`: the kernel's
/// choice) against the weights-only reference.
fn tc_case<A: CudaFloat, O: CudaFloat>(k: &CudaKernels, w: &W8, x: &[f32], m: usize, splits: Option<usize>) {
    let (kk, n) = (w.cols, w.rows);
    let auto = k.fp8_gemm_tc_splits(m, kk, n).unwrap();
    let what = format!("fp8_gemm_tc {} -> {} m={m} [{n}, {kk}] splits {}", A::NAME, O::NAME, splits.unwrap_or(auto));
    if !k.fp8_gemm_tc_fits::<A, O>(kk, n) {
        println!("  {what}: skipped: needs sm_80+ tensor cores ({:?})", k.caps());
        return;
    }
    let xd = up::<A>(k, &x[..m * kk]);
    let mut out = poisoned::<O>(k, m * n);
    k.fp8_gemm_tc_split::<A, O>(&xd, w.dev(), &mut out, m, splits).unwrap();
    let got = down(k, &out);
    no_nan(&what, &got);
    let rows = sample_rows(m);
    let want = ref_rows::<A>(x, w, &rows);
    let got = gather(&got, &rows, n);
    // f32 outputs: the same products, summed by the tensor cores in another order.
    let (want_o, tol) = if O::NAME == "f32" { (want.clone(), 1e-4) } else { (rnd_vec::<O>(&want), tol::<O>()) };
    check(&what, &got, &want_o, tol);
    let (mx, rms) = err_std(&got, &want);
    println!("  {what}: error vs the f32 reference: max {mx:.2e}·std, rms {rms:.2e}·std ({} rows)", rows.len());
    assert!(mx <= 5e-2, "{what}: max error {mx:e}·std(ref) > 5e-2");
}

fn tc_all<A: CudaFloat>(test: &str) {
    let k = gpu(test);
    let mut rng = Rng::new(91);
    // Partial 128-blocks on both axes (k = 3·128 + 16, n = 2·128 + 40), rows that fill no tile.
    let w = W8::new(&k, &mut rng, 296, 400);
    let x = rnd_vec::<A>(&rng.vec(300 * 400, 1.0));
    for m in [1, 9, 16, 37, 64, 100, 130, 300] {
        tc_case::<A, A>(&k, &w, &x, m, None);
        tc_case::<A, f32>(&k, &w, &x, m, None);
    }
    // Split-K: k = 31·128 + 32 cut into splits of 9 k-steps (288 columns: splits end inside a
    // scale block), into 2 and into every k-step (125), and unsplit.
    let w = W8::new(&k, &mut rng, 296, 4000);
    let x = rnd_vec::<A>(&rng.vec(130 * 4000, 1.0));
    for splits in [None, Some(1), Some(2), Some(14), Some(125)] {
        tc_case::<A, A>(&k, &w, &x, 37, splits);
        tc_case::<A, f32>(&k, &w, &x, 130, splits);
    }
    // The real shapes: GDN qkvz 2048 -> 12288 and the attention / GDN out proj 4096 -> 2048
    // (64 rows: split along k).
    for (n, kk) in [(12288, 2048), (2048, 4096)] {
        let w = W8::new(&k, &mut rng, n, kk);
        let x = rnd_vec::<A>(&rng.vec(4096 * kk, 1.0));
        for m in [4, 64, 4096] {
            tc_case::<A, A>(&k, &w, &x, m, None);
        }
        tc_case::<A, f32>(&k, &w, &x, 4096, None);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_tc_bf16() {
    tc_all::<bf16>("fp8_gemm_tc_bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_tc_f16() {
    tc_all::<f16>("fp8_gemm_tc_f16");
}

/// The CPU's per-token, per-128-column quantization of `x` `[m, k]`: bytes and scales.
fn quantize_rows(x: &[f32], m: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let (mut q, mut s) = (Vec::with_capacity(m * k), Vec::with_capacity(m * k.div_ceil(BLOCK)));
    for r in 0..m {
        let (qr, sr) = quantize_blocks(&x[r * k..(r + 1) * k], 1, k);
        q.extend(qr);
        s.extend(sr);
    }
    (q, s)
}

/// The e4m3 MMA GEMM's arithmetic, exactly (f64): Σ_kb a_s · w_s · Σ_c e4m3(aq) · e4m3(wq),
/// for `rows`.
fn mma8_emulated(aq: &[u8], a_s: &[f32], w: &W8, rows: &[usize]) -> Vec<f32> {
    let (k, n) = (w.cols, w.rows);
    let nkb = k.div_ceil(BLOCK);
    let wf: Vec<f64> = w.q.iter().map(|&b| f64::from(e4m3_to_f32(b))).collect();
    rows.par_iter()
        .flat_map_iter(|&r| {
            let af: Vec<f64> = aq[r * k..(r + 1) * k].iter().map(|&b| f64::from(e4m3_to_f32(b))).collect();
            let wf = &wf;
            (0..n).map(move |j| {
                let mut acc = 0.0f64;
                for kb in 0..nkb {
                    let (c0, c1) = (kb * BLOCK, ((kb + 1) * BLOCK).min(k));
                    let dot: f64 = (c0..c1).map(|c| af[c] * wf[j * k + c]).sum();
                    let ws = f64::from(w.scales[w.rs[j] as usize * nkb + kb]);
                    acc += dot * f64::from(a_s[r * nkb + kb]) * ws;
                }
                acc as f32
            })
        })
        .collect()
}

/// Activation quantization (bit-exact) and the e4m3 MMA GEMM for `x` `[m, k]` of `A`.
fn mma8_case<A: CudaFloat, O: CudaFloat>(k: &CudaKernels, w: &W8, x: &[f32], m: usize) {
    let (kk, n) = (w.cols, w.rows);
    let what = format!("fp8_gemm_mma8 {} -> {} m={m} [{n}, {kk}]", A::NAME, O::NAME);
    if !k.fp8_mma8_fits(kk) {
        println!("  {what}: skipped: needs sm_89+ e4m3 MMA, not forced to the fallback ({:?})", k.caps());
        return;
    }
    let x = &x[..m * kk];
    let xd = up::<A>(k, x);
    let (q_want, s_want) = quantize_rows(x, m, kk);
    let mut dq = k.stream().clone_htod(&vec![0xAAu8; m * kk]).unwrap();
    let mut ds = poisoned::<f32>(k, m * kk.div_ceil(BLOCK));
    k.fp8_act_quant::<A>(&xd, &mut dq, &mut ds, m, kk).unwrap();
    k.stream().synchronize().unwrap();
    assert_eq!(k.stream().clone_dtoh(&ds).unwrap(), s_want, "{what}: activation scales");
    assert_eq!(k.stream().clone_dtoh(&dq).unwrap(), q_want, "{what}: activation bytes");
    let mut out = poisoned::<O>(k, m * n);
    k.fp8_gemm_mma8::<O>(&dq, &ds, w.dev(), &mut out, m).unwrap();
    let got = down(k, &out);
    no_nan(&what, &got);
    // The one-call form (quantize into scratch, then the GEMM) gives the same bits.
    let mut out2 = poisoned::<O>(k, m * n);
    k.fp8_gemm_mma8_quant::<A, O>(&xd, w.dev(), &mut out2, m).unwrap();
    assert_eq!(down(k, &out2), got, "{what}: fp8_gemm_mma8_quant differs from fp8_act_quant + fp8_gemm_mma8");
    let rows = sample_rows(m);
    let got = gather(&got, &rows, n);
    let emu = mma8_emulated(&q_want, &s_want, w, &rows);
    // f32 outputs: the tensor cores' e4m3 products are exact, their sums within a 128-block
    // are not IEEE f32 (a shorter accumulator): 2e-3 of max |ref|.
    let (emu_o, tol) = if O::NAME == "f32" { (emu.clone(), 2e-3) } else { (rnd_vec::<O>(&emu), tol::<O>()) };
    check(&format!("{what} vs its exact emulation"), &got, &emu_o, tol);
    let want = ref_rows::<A>(x, w, &rows);
    let (mx, rms) = err_std(&got, &want);
    println!(
        "  {what}: error of the activation-quantized GEMM vs the weights-only f32 reference: max {mx:.3e}·std, rms \
         {rms:.3e}·std ({} rows)",
        rows.len()
    );
    // e4m3 keeps 3 mantissa bits: a relative rounding error of ≤ 2⁻⁴ per activation, ≈ 2.5e-2 rms
    // for these uniform inputs, so the product's error is ≈ 2.5e-2·std rms, ≈ 0.15·std at the max.
    assert!(rms <= 5e-2 && mx <= 0.3, "{what}: error vs the f32 reference max {mx:e}·std, rms {rms:e}·std");
}

fn mma8_all<A: CudaFloat>(test: &str) {
    let k = gpu(test);
    let mut rng = Rng::new(92);
    let w = W8::new(&k, &mut rng, 296, 400);
    let x = rnd_vec::<A>(&rng.vec(300 * 400, 1.0));
    for m in [1, 37, 130, 300] {
        mma8_case::<A, A>(&k, &w, &x, m);
        mma8_case::<A, f32>(&k, &w, &x, m);
    }
    for (n, kk) in [(12288, 2048), (2048, 4096)] {
        let w = W8::new(&k, &mut rng, n, kk);
        let x = rnd_vec::<A>(&rng.vec(4096 * kk, 1.0));
        mma8_case::<A, A>(&k, &w, &x, 4096);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_mma8_bf16() {
    mma8_all::<bf16>("fp8_gemm_mma8_bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_mma8_f16() {
    mma8_all::<f16>("fp8_gemm_mma8_f16");
}

/// µs and TFLOP/s of every dense path at `m` rows of `[n, kk]` (bf16 activations).
fn bench_dense(k: &CudaKernels, gemm: Option<&Gemm>, rng: &mut Rng, n: usize, kk: usize, ms: &[usize]) {
    let w = W8::new(k, rng, n, kk);
    let mmax = ms.iter().copied().max().unwrap_or(1);
    let xd = up::<bf16>(k, &rnd_vec::<bf16>(&rng.vec(mmax * kk, 1.0)));
    let mut out = poisoned::<bf16>(k, mmax * n);
    let mut dense = poisoned::<bf16>(k, n * kk);
    k.fp8_dequant::<bf16>(w.dev(), &mut dense).unwrap();
    for &m in ms {
        let flop = 2.0 * (m * n * kk) as f64;
        let line = |name: &str, s: f64| {
            println!("  [{m}, {kk}] x [{n}, {kk}]^T {name:<28} {:>9.1} us {:>7.1} TFLOP/s", s * 1e6, flop / s / 1e12)
        };
        let xv = xd.slice(0..m * kk);
        let iters = if m >= 1024 { 20 } else { 100 };
        if CudaKernels::fp8_gemv_fits::<bf16, bf16>(m, kk) {
            let s = time(k, iters, || k.fp8_gemv::<bf16, bf16>(&xv, w.dev(), &mut out.slice_mut(0..m * n), m).unwrap());
            line("fp8_gemv (decode path)", s);
        }
        if let Some(g) = gemm {
            let s = time(k, iters, || {
                k.fp8_dequant::<bf16>(w.dev(), &mut dense).unwrap();
                g.matmul_t::<bf16, bf16>(&xv, &dense, &mut out.slice_mut(0..m * n), m, kk, n).unwrap();
            });
            line("dequant + cuBLAS (old path)", s);
            let s = time(k, iters, || {
                g.matmul_t::<bf16, bf16>(&xv, &dense, &mut out.slice_mut(0..m * n), m, kk, n).unwrap();
            });
            line("cuBLAS bf16 dense (ceiling)", s);
        }
        if k.fp8_gemm_tc_fits::<bf16, bf16>(kk, n) {
            let splits = k.fp8_gemm_tc_splits(m, kk, n).unwrap();
            let s =
                time(k, iters, || k.fp8_gemm_tc::<bf16, bf16>(&xv, w.dev(), &mut out.slice_mut(0..m * n), m).unwrap());
            line(&format!("tile-dequant TC ({splits} k-splits)"), s);
            if splits > 1 {
                let s = time(k, iters, || {
                    k.fp8_gemm_tc_split::<bf16, bf16>(&xv, w.dev(), &mut out.slice_mut(0..m * n), m, Some(1)).unwrap()
                });
                line("tile-dequant TC (no split)", s);
            }
        }
        if k.fp8_mma8_fits(kk) {
            let s = time(k, iters, || {
                k.fp8_gemm_mma8_quant::<bf16, bf16>(&xv, w.dev(), &mut out.slice_mut(0..m * n), m).unwrap()
            });
            line("e4m3 MMA (with act quant)", s);
            let mut q = k.stream().clone_htod(&vec![0u8; m * kk]).unwrap();
            let mut sc = poisoned::<f32>(k, m * kk.div_ceil(BLOCK));
            let s = time(k, iters, || k.fp8_act_quant::<bf16>(&xv, &mut q, &mut sc, m, kk).unwrap());
            println!("  [{m}, {kk}] {:<39} {:>9.1} us", "activation quantization alone", s * 1e6);
            let s =
                time(k, iters, || k.fp8_gemm_mma8::<bf16>(&q, &sc, w.dev(), &mut out.slice_mut(0..m * n), m).unwrap());
            line("e4m3 MMA (GEMM alone)", s);
        }
    }
}

/// Timings of every path (dense and MoE) at the real shapes; no parity (the tests above).
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_bench() {
    let k = gpu("fp8_gemm_bench");
    let mut rng = Rng::new(93);
    let gemm = match Gemm::new(&k) {
        Ok(g) => Some(g),
        Err(e) => {
            println!("  cuBLAS paths skipped: {e}");
            None
        }
    };
    println!("  device {} {:?}", k.arch(), k.caps());
    bench_dense(&k, gemm.as_ref(), &mut rng, 12288, 2048, &[1, 4, 8, 16, 64, 256, 1024, 4096]);
    bench_dense(&k, gemm.as_ref(), &mut rng, 2048, 4096, &[4, 8, 64, 4096]);
    moe_bench(&k, &mut rng);
}

/// Random routing of `t` rows to `kk` distinct experts of `e`, and positive weights.
fn routing(rng: &mut Rng, t: usize, kk: usize, e: usize) -> (Vec<u32>, Vec<f32>) {
    let mut idx = Vec::with_capacity(t * kk);
    for _ in 0..t {
        let mut row: Vec<u32> = Vec::new();
        while row.len() < kk {
            let v = rng.below(e) as u32;
            if !row.contains(&v) {
                row.push(v);
            }
        }
        idx.extend(row);
    }
    let wt: Vec<f32> = (0..t * kk).map(|_| rng.f(0.5) + 0.5).collect();
    (idx, wt)
}

/// The grouped FP8 MoE prefill against the CPU reference on dequantized weights (sampled
/// token rows at large `t`): tile-dequant TC (weights-only: within the bf16 / f16 tolerance),
/// or with `mma8` the e4m3 MMA GEMMs (x and h quantized: error bounded in std(ref) units).
fn moe_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, dims: [usize; 5], bank: usize, mma8: bool) {
    let [t, kk, e, h, i] = dims;
    let form = if mma8 { "moe_experts_fp8_mma8" } else { "moe_experts_fp8_prefill" };
    let what = format!("{form} {} t={t} k={kk} e={e} h={h} i={i}", T::NAME);
    let fits = if mma8 { k.moe_prefill_mma8_fits::<T>(h, i) } else { k.moe_prefill_fp8_fits::<T>(h, i) };
    if !fits {
        println!("  {what}: skipped: needs sm_80+ tensor cores, sm_90-class shared memory for mma8 ({:?})", k.caps());
        return;
    }
    let (g, u, d) = (W8::new(k, rng, bank * i, h), W8::new(k, rng, bank * i, h), W8::new(k, rng, bank * h, i));
    let (gs, us, dstk) = (stack(k, &g, e, bank), stack(k, &u, e, bank), stack(k, &d, e, bank));
    let x = rnd_vec::<T>(&rng.vec(t * h, 1.0));
    let (idx, wt) = routing(rng, t, kk, e);
    let (xd, id, wd) = (up::<T>(k, &x), up_u32(k, &idx), up::<f32>(k, &wt));
    let mut out = poisoned::<f32>(k, t * h);
    if mma8 {
        k.moe_experts_fp8_mma8::<T>(&xd, &id, &wd, gs.dev(), us.dev(), dstk.dev(), &mut out, dims).unwrap();
    } else {
        k.moe_experts_fp8_prefill::<T>(&xd, &id, &wd, gs.dev(), us.dev(), dstk.dev(), &mut out, dims).unwrap();
    }
    let got = down(k, &out);
    no_nan(&what, &got);
    let rows = sample_rows(t);
    let (xs, is, ws) = (gather(&x, &rows, h), gather_u32(&idx, &rows, kk), gather(&wt, &rows, kk));
    let n = rows.len();
    let want = moe_ref::<T>(&xs, &is, &ws, &g.dense::<T>(), &u.dense::<T>(), &d.dense::<T>(), [n, kk, e, h, i], bank);
    let got = gather(&got, &rows, h);
    let (mx, rms) = err_std(&got, &want);
    println!("  {what}: error vs the weights-only reference: max {mx:.3e}·std, rms {rms:.3e}·std ({n} rows)");
    if mma8 {
        // x and h each rounded to e4m3 (≈ 2.5e-2 relative rms each on these uniform inputs):
        // ≈ 4e-2·std rms expected, ≈ 0.2·std at the max.
        assert!(rms <= 8e-2 && mx <= 0.5, "{what}: error vs the reference max {mx:e}·std, rms {rms:e}·std");
    } else {
        check(&what, &got, &want, tol::<T>());
        assert!(mx <= 5e-2, "{what}: max error {mx:e}·std(ref) > 5e-2");
    }
}

fn gather_u32(v: &[u32], rows: &[usize], width: usize) -> Vec<u32> {
    rows.iter().flat_map(|&r| v[r * width..(r + 1) * width].iter().copied()).collect()
}

fn moe_all<T: CudaFloat>(test: &str) {
    let k = gpu(test);
    let mut rng = Rng::new(94);
    // Partial 128-blocks (h = 2·128 + 16, i = 128 + 16), experts with few rows.
    for mma8 in [false, true] {
        moe_case::<T>(&k, &mut rng, [40, 4, 8, 272, 144], 8, mma8);
        moe_case::<T>(&k, &mut rng, [300, 3, 6, 208, 64], 6, mma8);
        moe_case::<T>(&k, &mut rng, [4096, 10, 512, 2048, 512], 16, mma8);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_fp8_prefill_bf16() {
    moe_all::<bf16>("moe_fp8_prefill_bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_fp8_prefill_f16() {
    moe_all::<f16>("moe_fp8_prefill_f16");
}

/// The MoE at 4096 tokens, top-10 of 512 experts (hidden 2048, intermediate 512), bf16:
/// tile-dequant TC and e4m3 MMA against dequantize-all + the dense grouped GEMMs (the old
/// path) and the dense grouped GEMMs alone on bf16 experts (the ceiling).
fn moe_bench(k: &CudaKernels, rng: &mut Rng) {
    let dims @ [t, kk, e, h, i] = [4096usize, 10, 512, 2048, 512];
    if !k.moe_prefill_fp8_fits::<bf16>(h, i) {
        println!("  moe bench skipped: needs sm_80+ tensor cores");
        return;
    }
    let bank = 16;
    let (g, u, d) = (W8::new(k, rng, bank * i, h), W8::new(k, rng, bank * i, h), W8::new(k, rng, bank * h, i));
    let (gs, us, dstk) = (stack(k, &g, e, bank), stack(k, &u, e, bank), stack(k, &d, e, bank));
    let xd = up::<bf16>(k, &rnd_vec::<bf16>(&rng.vec(t * h, 1.0)));
    let (idx, wt) = routing(rng, t, kk, e);
    let (id, wd) = (up_u32(k, &idx), up::<f32>(k, &wt));
    let mut out = poisoned::<f32>(k, t * h);
    let flop = 6.0 * (t * kk * h * i) as f64;
    let line = |name: &str, s: f64| {
        println!("  moe t={t} k={kk} e={e} h={h} i={i} {name:<32} {:>9.1} us {:>7.1} TFLOP/s", s * 1e6, flop / s / 1e12)
    };
    let s = time(k, 10, || {
        k.moe_experts_fp8_prefill::<bf16>(&xd, &id, &wd, gs.dev(), us.dev(), dstk.dev(), &mut out, dims).unwrap()
    });
    line("tile-dequant TC (fp8 experts)", s);
    if k.moe_prefill_mma8_fits::<bf16>(h, i) {
        let s = time(k, 10, || {
            k.moe_experts_fp8_mma8::<bf16>(&xd, &id, &wd, gs.dev(), us.dev(), dstk.dev(), &mut out, dims).unwrap()
        });
        line("e4m3 MMA (x, h quantized)", s);
    }
    let n1 = e * i * h;
    let (mut gd, mut ud, mut dd) = (poisoned::<bf16>(k, n1), poisoned::<bf16>(k, n1), poisoned::<bf16>(k, n1));
    let s = time(k, 10, || {
        k.fp8_dequant::<bf16>(gs.dev(), &mut gd).unwrap();
        k.fp8_dequant::<bf16>(us.dev(), &mut ud).unwrap();
        k.fp8_dequant::<bf16>(dstk.dev(), &mut dd).unwrap();
        k.moe_experts::<bf16>(&xd, &id, &wd, &gd, &ud, &dd, &mut out, t, kk, e, h, i).unwrap();
    });
    line("dequant all + dense GEMMs (old)", s);
    let s = time(k, 10, || k.moe_experts::<bf16>(&xd, &id, &wd, &gd, &ud, &dd, &mut out, t, kk, e, h, i).unwrap());
    line("dense GEMMs on bf16 (ceiling)", s);
}
