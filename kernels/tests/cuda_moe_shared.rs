//! The direct MoE decode form with the shared expert fused in (kernels/cuda/moe_shared.cu:
//! `CudaKernels::moe_experts_shared`, `moe_experts_fp8_shared`) against the CPU reference of
//! `porter_core::nn::Moe::forward` (routed experts, then `swiglu_cols`, the shared down
//! projection and `shared_expert_add`), for dense bf16 / f16 / f32 and FP8 experts, t = 1, 2,
//! 4, with I_s = I (the shared row rides in the routed groups) and I_s ≠ I (a dot product of
//! its own; aligned and scalar), the shared inputs packed into one matrix (the model's input
//! projection) or apart (an FP8 shared expert next to a bf16 router), and a row without any
//! valid expert id. Against the unfused GPU sequence (`moe_decode_with` direct,
//! `swiglu_f32in`, the GEMV, `shared_expert_add_f32g`) per element: only the shared down dot
//! product's summation order differs, so the outputs differ by at most σ(g) · one rounding of
//! T of the shared output. Batch invariance (row 0 alone = row 0 of the batch, bit for bit).
//! Then µs per call of fused (streamed down kernel, and legacy: `PORTER_MOE_DOWN=legacy`) vs
//! unfused at the Qwen3-Next-80B shapes (hidden 2048, I = I_s = 512, 512 experts, top-10,
//! t = 1), bf16 and FP8, calls queued behind a hold (the host's submission not timed); the
//! fused legacy output is asserted bit-identical to the streamed one.
//!
//! The tests of this binary set `PORTER_MOE_DOWN` for the legacy runs, so each holds one lock
//! (`ENV`) for its whole run: they never run at the same time.
//!
//! Tolerances: against the CPU the usual ones of the MoE tests (`tol::<T>()`, relative to
//! the largest reference value: 1e-2 for bf16 / f16 — a flipped rounding of T in any of the
//! routed or shared outputs — and 1e-5 for f32, the f32 summation order of dot products of
//! 512–2048 terms).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`).

mod common;

use common::fp8::{moe_ref, stack, W8};
use common::moe::*;
use common::timing::{time_calls, Hold};
use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{CudaFloat, CudaKernels, Fp8Dev, Gemm, MoeGemv, MoeSharedDev, SharedGu, MOE_PHASES_ALL};

/// Held by every test of this binary (the legacy runs set the process environment).
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The lock of [`ENV`] and the GPU.
fn gpu_locked(test: &str) -> (std::sync::MutexGuard<'static, ()>, CudaKernels) {
    let guard = ENV.lock().unwrap_or_else(|e| e.into_inner());
    // The streamed down kernels unless a test asks for the legacy ones (unset, the direct
    // form's default is the legacy kernel: kernels/src/cuda/moe_decode.rs DOWN_DEFAULT).
    std::env::set_var(porter_kernels::cuda::MOE_DOWN_ENV, "stream");
    (guard, gpu(test))
}

/// `f` with the legacy down kernels (`PORTER_MOE_DOWN=legacy`); the caller holds [`ENV`].
fn with_legacy_down<R>(f: impl FnOnce() -> R) -> R {
    std::env::set_var(porter_kernels::cuda::MOE_DOWN_ENV, "legacy");
    let r = f();
    std::env::set_var(porter_kernels::cuda::MOE_DOWN_ENV, "stream");
    r
}

/// Where the shared expert's f32 inputs lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// One matrix `[t, e + 2·I_s + 1]`: router logits, shared gate, shared up, gate logit.
    Packed,
    /// `[t, 2·I_s]` gate / up, and the gate logit in `[t, e + 1]` after the router logits.
    Apart,
}

/// The shared expert's host inputs (f32 matrices, the down weight as the kernels read it).
struct Shared {
    is: usize,
    gu: Vec<f32>,
    gu_stride: usize,
    gu_col0: usize,
    glog: Vec<f32>,
    g_stride: usize,
    g_col: usize,
    /// `[hidden, I_s]`, rounded to T (dense) or dequantized and rounded (FP8).
    down: Vec<f32>,
}

/// Random f32 inputs of the shared expert of `t` rows after `e` router columns.
fn shared_inputs(rng: &mut Rng, t: usize, e: usize, is: usize, layout: Layout, down: Vec<f32>) -> Shared {
    let packed = rng.vec(t * (e + 2 * is + 1), 2.0);
    match layout {
        Layout::Packed => Shared {
            is,
            gu: packed.clone(),
            gu_stride: e + 2 * is + 1,
            gu_col0: e,
            glog: packed,
            g_stride: e + 2 * is + 1,
            g_col: e + 2 * is,
            down,
        },
        Layout::Apart => Shared {
            is,
            gu: rng.vec(t * 2 * is, 2.0),
            gu_stride: 2 * is,
            gu_col0: 0,
            glog: rng.vec(t * (e + 1), 2.0),
            g_stride: e + 1,
            g_col: e,
            down,
        },
    }
}

/// σ(round(g_r)) per row.
fn gates<T: CudaFloat>(s: &Shared, t: usize) -> Vec<f32> {
    (0..t).map(|r| ops::sigmoid(rnd::<T>(s.glog[r * s.g_stride + s.g_col]))).collect()
}

/// The CPU reference of the shared expert's term, `[t, hidden]`:
/// `σ(round(g_r)) · round(h_s[r] · down_s[c])`, `h_s = round(silu(round(g)) · round(u))`.
fn shared_ref<T: CudaFloat>(s: &Shared, t: usize, hidden: usize) -> Vec<f32> {
    let is = s.is;
    let mut hs = Vec::with_capacity(t * is);
    for r in 0..t {
        let row = &s.gu[r * s.gu_stride + s.gu_col0..];
        hs.extend((0..is).map(|c| rnd::<T>(ops::silu(rnd::<T>(row[c])) * rnd::<T>(row[is + c]))));
    }
    let mut so = vec![0.0f32; t * hidden];
    ops::matmul_t(&hs, &s.down, &mut so, t, is, hidden, false);
    let sig = gates::<T>(s, t);
    so.iter().enumerate().map(|(q, v)| sig[q / hidden] * rnd::<T>(*v)).collect()
}

/// The shared inputs on the device: gu, glog (f32).
fn upload_shared(kern: &CudaKernels, s: &Shared) -> (CudaSlice<f32>, CudaSlice<f32>) {
    (up::<f32>(kern, &s.gu), up::<f32>(kern, &s.glog))
}

fn dev_of<'a, W>(s: &Shared, gu: &'a CudaSlice<f32>, glog: &'a CudaSlice<f32>, down: W) -> MoeSharedDev<'a, W> {
    MoeSharedDev {
        gu: SharedGu::Cols { gu, stride: s.gu_stride, col0: s.gu_col0 },
        gate: glog,
        gate_stride: s.g_stride,
        gate_col: s.g_col,
        down,
        inter: s.is,
    }
}

/// Scratch of the unfused tail: h_s `[t, I_s]` and the shared output `[t, hidden]` (T).
struct Tail<T> {
    hs: CudaSlice<T>,
    so: CudaSlice<T>,
}

impl<T: CudaFloat> Tail<T> {
    fn new(kern: &CudaKernels, t: usize, is: usize, hidden: usize) -> Self {
        Tail { hs: poisoned::<T>(kern, t * is), so: poisoned::<T>(kern, t * hidden) }
    }
}

/// The unfused tail on the device after the routed experts wrote `out`: `swiglu_f32in`,
/// `down` (the shared down projection of h_s into the shared output), `shared_expert_add_f32g`.
#[allow(clippy::too_many_arguments)]
fn unfused_tail<T: CudaFloat>(
    kern: &CudaKernels,
    s: &Shared,
    dev: (&CudaSlice<f32>, &CudaSlice<f32>),
    t: usize,
    hidden: usize,
    out: &mut CudaSlice<f32>,
    tail: &mut Tail<T>,
    down: &mut dyn FnMut(&CudaSlice<T>, &mut CudaSlice<T>),
) {
    kern.swiglu_f32in::<T>(dev.0, &mut tail.hs, t, s.is, s.gu_stride, s.gu_col0).expect("swiglu_f32in");
    down(&tail.hs, &mut tail.so);
    kern.shared_expert_add_f32g::<T>(out, &tail.so, dev.1, t, hidden, s.g_stride, s.g_col)
        .expect("shared_expert_add_f32g");
}

/// Per element, `fused` within σ(g_r) · (one rounding of T of the unfused shared output, plus
/// the f32 summation-order slack of its dot product) plus two f32 roundings of the sum, of
/// `unfused`; prints how many are bit-identical and the largest difference.
fn near_unfused<T: CudaFloat>(what: &str, fused: &[f32], unfused: &[f32], so: &[f32], sig: &[f32], hidden: usize) {
    let eps_t = match T::NAME {
        "bf16" => 2f32.powi(-7),
        "f16" => 2f32.powi(-10),
        _ => 0.0,
    };
    let so_max = so.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let (mut same, mut worst) = (0usize, 0.0f32);
    for (q, (f, u)) in fused.iter().zip(unfused).enumerate() {
        let (r, c) = (q / hidden, q % hidden);
        let d = (f - u).abs();
        let bound = sig[r] * (so[q].abs() * 2.0 * eps_t + 1e-5 * so_max) + 2f32.powi(-21) * u.abs() + 1e-30;
        assert!(
            d <= bound && f.is_finite(),
            "{what}: row {r} column {c}: fused {f:e} vs unfused {u:e} (shared output {:e}, gate {}): {d:e} > {bound:e}",
            so[q],
            sig[r]
        );
        same += usize::from(f.to_bits() == u.to_bits());
        worst = worst.max(d);
    }
    println!("  {what}: fused vs unfused: {same} of {} bit-identical, max |diff| {worst:.3e}", fused.len());
}

/// Sets every id of row `r` invalid (>= e).
fn invalid_row(idx: &mut [u32], k: usize, e: usize, r: usize) {
    for (j, v) in idx[r * k..(r + 1) * k].iter_mut().enumerate() {
        *v = if j % 2 == 0 { e as u32 + j as u32 } else { u32::MAX };
    }
}

/// The shared down projection on the device as `nn::Linear` would run it: the GEMV when it
/// fits, else cuBLAS.
fn dense_down<'a, T: CudaFloat>(
    kern: &'a CudaKernels,
    gemm: &'a Gemm,
    w: &'a CudaSlice<T>,
    t: usize,
    is: usize,
    hidden: usize,
) -> impl FnMut(&CudaSlice<T>, &mut CudaSlice<T>) + 'a {
    move |hs, so| {
        if CudaKernels::gemv_fits::<T, T>(t, is) {
            kern.gemv::<T, T>(hs, w, so, t, is, hidden).expect("gemv")
        } else {
            gemm.matmul_t::<T, T>(hs, w, so, t, is, hidden).expect("cublas")
        }
    }
}

/// Dense experts: fused against the CPU reference and the unfused GPU sequence, and batch
/// invariance.
fn dense_case<T: CudaFloat>(
    kern: &CudaKernels,
    gemm: &Gemm,
    what: &str,
    d: Dims,
    is: usize,
    layout: Layout,
    rng: &mut Rng,
) {
    let mut idx = random_routes(rng, d.t, d.k, d.e);
    if d.t > 1 {
        invalid_row(&mut idx, d.k, d.e, d.t - 1);
    }
    let inp = inputs::<T>(rng, d, idx);
    let sdown = rnd_vec::<T>(&rng.vec(d.hidden * is, 1.7 / (is as f32).sqrt()));
    let s = shared_inputs(rng, d.t, d.e, is, layout, sdown);
    let routed = reference::<T>(d, &inp);
    let want: Vec<f32> = routed.iter().zip(shared_ref::<T>(&s, d.t, d.hidden)).map(|(a, b)| a + b).collect();
    let dev = upload::<T>(kern, d, &inp);
    let (gud, gld) = upload_shared(kern, &s);
    let sdd = up::<T>(kern, &s.down);
    let what = format!("{what} {} {d:?} I_s={is} {layout:?}", T::NAME);
    let dims = [d.t, d.k, d.e, d.hidden, d.inter];
    let mut out = poisoned::<f32>(kern, d.t * d.hidden);
    kern.moe_experts_shared::<T>(
        &dev.x,
        &dev.idx,
        &dev.w,
        &dev.gate,
        &dev.up,
        &dev.down,
        &dev_of(&s, &gud, &gld, &sdd),
        &mut out,
        dims,
    )
    .unwrap_or_else(|e| panic!("{what}: moe_experts_shared: {e}"));
    let fused = down::<f32>(kern, &out);
    check(&format!("{what}: fused vs CPU"), &fused, &want, tol::<T>());
    // The legacy down kernel: the same bits.
    let mut lo = poisoned::<f32>(kern, d.t * d.hidden);
    with_legacy_down(|| {
        kern.moe_experts_shared::<T>(
            &dev.x,
            &dev.idx,
            &dev.w,
            &dev.gate,
            &dev.up,
            &dev.down,
            &dev_of(&s, &gud, &gld, &sdd),
            &mut lo,
            dims,
        )
    })
    .unwrap_or_else(|e| panic!("{what}: moe_experts_shared (legacy down): {e}"));
    let legacy = down::<f32>(kern, &lo);
    assert!(
        legacy.iter().zip(&fused).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: the legacy down kernel differs from the streamed one"
    );
    // The unfused GPU sequence.
    let mut uo = poisoned::<f32>(kern, d.t * d.hidden);
    kern.moe_decode_with::<T>(
        &dev.x,
        &dev.idx,
        &dev.w,
        &dev.gate,
        &dev.up,
        &dev.down,
        &mut uo,
        dims,
        MoeGemv::Direct,
        MOE_PHASES_ALL,
    )
    .unwrap_or_else(|e| panic!("{what}: moe_decode_with: {e}"));
    let mut tail = Tail::<T>::new(kern, d.t, is, d.hidden);
    let mut down_fn = dense_down(kern, gemm, &sdd, d.t, is, d.hidden);
    unfused_tail::<T>(kern, &s, (&gud, &gld), d.t, d.hidden, &mut uo, &mut tail, &mut down_fn);
    let (uf, so) = (down::<f32>(kern, &uo), down::<T>(kern, &tail.so));
    near_unfused::<T>(&what, &fused, &uf, &so, &gates::<T>(&s, d.t), d.hidden);
    // Row 0 alone.
    if d.t > 1 {
        let s0 =
            Shared { gu: s.gu[..s.gu_stride].to_vec(), glog: s.glog[..s.g_stride].to_vec(), down: Vec::new(), ..s };
        let (g0, l0) = upload_shared(kern, &s0);
        let mut o0 = poisoned::<f32>(kern, d.hidden);
        let (x0, i0, w0) = (dev.x.slice(0..d.hidden), dev.idx.slice(0..d.k), dev.w.slice(0..d.k));
        kern.moe_experts_shared::<T>(
            &x0,
            &i0,
            &w0,
            &dev.gate,
            &dev.up,
            &dev.down,
            &dev_of(&s0, &g0, &l0, &sdd),
            &mut o0,
            [1, d.k, d.e, d.hidden, d.inter],
        )
        .unwrap_or_else(|e| panic!("{what}: row 0 alone: {e}"));
        let a = down::<f32>(kern, &o0);
        assert!(
            a.iter().zip(&fused).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: row 0 alone differs from row 0 in the batch"
        );
    }
}

fn dense_small<T: CudaFloat>(kern: &CudaKernels, rng: &mut Rng) {
    let gemm = Gemm::new(kern).expect("cuBLAS");
    for t in [1, 2, 4] {
        // Aligned: I_s = I (in the routed groups), I_s = 24 and 56 (its own dot product).
        let d = Dims { t, k: 3, e: 8, hidden: 72, inter: 40, bank: 8 };
        for (is, layout) in [(40, Layout::Packed), (24, Layout::Apart), (56, Layout::Packed)] {
            dense_case::<T>(kern, &gemm, "aligned", d, is, layout, rng);
        }
        // Odd: scalar loads, I_s = I and I_s ≠ I; k = 10 (two zip groups, the shared row in the second).
        let d = Dims { t, k: 10, e: 12, hidden: 37, inter: 21, bank: 12 };
        for (is, layout) in [(21, Layout::Apart), (13, Layout::Packed)] {
            dense_case::<T>(kern, &gemm, "odd", d, is, layout, rng);
        }
        // k = 8: the routed pairs fill one group exactly, the shared row opens a second.
        let d = Dims { t, k: 8, e: 16, hidden: 64, inter: 32, bank: 16 };
        dense_case::<T>(kern, &gemm, "k=8", d, 32, Layout::Packed, rng);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_small_bf16() {
    let (_env, kern) = gpu_locked("moe_shared_small_bf16");
    dense_small::<bf16>(&kern, &mut Rng::new(41));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_small_f16() {
    let (_env, kern) = gpu_locked("moe_shared_small_f16");
    dense_small::<f16>(&kern, &mut Rng::new(42));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_small_f32() {
    let (_env, kern) = gpu_locked("moe_shared_small_f32");
    dense_small::<f32>(&kern, &mut Rng::new(43));
}

/// FP8 experts and FP8 shared down weight, `[t, k, e, hidden, inter]`, `bank` distinct experts:
/// fused against the CPU reference (dequantized weights), printed against the unfused GPU
/// sequence (the FP8 GEMV, whose dequantization order may differ from the row reader's).
fn fp8_case<T: CudaFloat>(kern: &CudaKernels, rng: &mut Rng, dims: [usize; 5], bank: usize, is: usize, layout: Layout) {
    let [t, kk, e, h, i] = dims;
    let (g, u, dw) =
        (W8::new(kern, rng, bank * i, h), W8::new(kern, rng, bank * i, h), W8::new(kern, rng, bank * h, i));
    let (gs, us, ds) = (stack(kern, &g, e, bank), stack(kern, &u, e, bank), stack(kern, &dw, e, bank));
    let sw = W8::new(kern, rng, h, is);
    let s = shared_inputs(rng, t, e, is, layout, sw.dense::<T>());
    let x = rnd_vec::<T>(&rng.vec(t * h, 1.0));
    let mut idx = random_routes(rng, t, kk, e);
    let wt: Vec<f32> = (0..t * kk).map(|_| rng.f(0.5) + 0.5).collect();
    let mut routed = moe_ref::<T>(&x, &idx, &wt, &g.dense::<T>(), &u.dense::<T>(), &dw.dense::<T>(), dims, bank);
    if t > 1 {
        // The last row has no valid id: no routed term (moe_ref knows no invalid ids).
        invalid_row(&mut idx, kk, e, t - 1);
        routed[(t - 1) * h..].fill(0.0);
    }
    let want: Vec<f32> = routed.iter().zip(shared_ref::<T>(&s, t, h)).map(|(a, b)| a + b).collect();
    let (xd, id, wd) = (up::<T>(kern, &x), up_u32(kern, &idx), up::<f32>(kern, &wt));
    let (gud, gld) = upload_shared(kern, &s);
    let what = format!("fp8 {} {dims:?} I_s={is} {layout:?}", T::NAME);
    let mut out = poisoned::<f32>(kern, t * h);
    kern.moe_experts_fp8_shared::<T>(
        &xd,
        &id,
        &wd,
        gs.dev(),
        us.dev(),
        ds.dev(),
        &dev_of(&s, &gud, &gld, sw.dev()),
        &mut out,
        dims,
    )
    .unwrap_or_else(|err| panic!("{what}: {err}"));
    let fused = down::<f32>(kern, &out);
    check(&format!("{what}: fused vs CPU"), &fused, &want, tol::<T>());
    let mut lo = poisoned::<f32>(kern, t * h);
    with_legacy_down(|| {
        kern.moe_experts_fp8_shared::<T>(
            &xd,
            &id,
            &wd,
            gs.dev(),
            us.dev(),
            ds.dev(),
            &dev_of(&s, &gud, &gld, sw.dev()),
            &mut lo,
            dims,
        )
    })
    .unwrap_or_else(|err| panic!("{what}: legacy down: {err}"));
    let legacy = down::<f32>(kern, &lo);
    assert!(
        legacy.iter().zip(&fused).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: the legacy down kernel differs from the streamed one"
    );
    if CudaKernels::fp8_gemv_fits::<T, T>(t, is) {
        let mut uo = poisoned::<f32>(kern, t * h);
        kern.moe_experts_fp8_with::<T>(
            &xd,
            &id,
            &wd,
            gs.dev(),
            us.dev(),
            ds.dev(),
            &mut uo,
            dims,
            MoeGemv::Direct,
            MOE_PHASES_ALL,
        )
        .unwrap_or_else(|err| panic!("{what}: unfused: {err}"));
        let swd: Fp8Dev<'_> = sw.dev();
        let mut gemv =
            |hs: &CudaSlice<T>, so: &mut CudaSlice<T>| kern.fp8_gemv::<T, T>(hs, swd, so, t).expect("fp8_gemv");
        let mut tail = Tail::<T>::new(kern, t, is, h);
        unfused_tail::<T>(kern, &s, (&gud, &gld), t, h, &mut uo, &mut tail, &mut gemv);
        let (uf, sof) = (down::<f32>(kern, &uo), down::<T>(kern, &tail.so));
        let worst = fused.iter().zip(&uf).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        let scale = sof.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        println!("  {what}: fused vs unfused (fp8_gemv): max |diff| {worst:.3e} (max |shared output| {scale:.3e})");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_fp8() {
    let (_env, kern) = gpu_locked("moe_shared_fp8");
    let mut rng = Rng::new(44);
    for t in [1, 2, 4] {
        // I_s = I; I_s ≠ I (16-byte rows); I_s not a multiple of 16 (scalar rows).
        for (is, layout) in [(128, Layout::Apart), (64, Layout::Packed), (40, Layout::Apart)] {
            fp8_case::<bf16>(&kern, &mut rng, [t, 3, 8, 256, 128], 8, is, layout);
        }
        fp8_case::<f16>(&kern, &mut rng, [t, 10, 16, 128, 64], 16, 64, Layout::Apart);
        fp8_case::<f32>(&kern, &mut rng, [t, 4, 8, 128, 64], 8, 48, Layout::Packed);
    }
}

/// µs per call of `f(i)` (CUDA events around `iters` calls queued behind a hold).
fn time_us(kern: &CudaKernels, hold: &mut Hold, iters: usize, f: &mut dyn FnMut(usize)) -> f64 {
    time_calls(kern, hold, iters, f) * 1e6
}

/// The 80B shapes, bf16: parity at t = 1, 2, 4, then fused vs unfused µs per call at t = 1
/// (16 distinct route sets so that the routed weights do not stay in L2).
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_80b_bf16() {
    let (_env, kern) = gpu_locked("moe_shared_80b_bf16");
    let gemm = Gemm::new(&kern).expect("cuBLAS");
    let mut rng = Rng::new(45);
    for t in [1, 2, 4] {
        dense_case::<bf16>(&kern, &gemm, "80b", dims_80b(t), MOE_INTER, Layout::Packed, &mut rng);
    }
    let d = dims_80b(1);
    let idx = random_routes(&mut rng, 1, d.k, d.e);
    let inp = inputs::<bf16>(&mut rng, d, idx);
    let dev = upload::<bf16>(&kern, d, &inp);
    let sdown = rnd_vec::<bf16>(&rng.vec(d.hidden * MOE_INTER, 0.075));
    let s = shared_inputs(&mut rng, 1, d.e, MOE_INTER, Layout::Packed, sdown);
    let (gud, gld) = upload_shared(&kern, &s);
    let sdd = up::<bf16>(&kern, &s.down);
    let sd = dev_of(&s, &gud, &gld, &sdd);
    let routes: Vec<CudaSlice<u32>> = (0..16).map(|_| up_u32(&kern, &random_routes(&mut rng, 1, d.k, d.e))).collect();
    let dims = [1, d.k, d.e, d.hidden, d.inter];
    let mut out = poisoned::<f32>(&kern, d.hidden);
    let mut hold = Hold::new(&kern);
    let mut fused_call = |i: usize| {
        kern.moe_experts_shared::<bf16>(
            &dev.x,
            &routes[i % 16],
            &dev.w,
            &dev.gate,
            &dev.up,
            &dev.down,
            &sd,
            &mut out,
            dims,
        )
        .expect("fused")
    };
    let fused = time_us(&kern, &mut hold, 300, &mut fused_call);
    let fused_legacy = with_legacy_down(|| time_us(&kern, &mut hold, 300, &mut fused_call));
    let mut down_fn = dense_down(&kern, &gemm, &sdd, 1, MOE_INTER, d.hidden);
    let mut tail = Tail::<bf16>::new(&kern, 1, MOE_INTER, d.hidden);
    let mut out = poisoned::<f32>(&kern, d.hidden);
    let unfused = time_us(&kern, &mut hold, 300, &mut |i| {
        kern.moe_decode_with::<bf16>(
            &dev.x,
            &routes[i % 16],
            &dev.w,
            &dev.gate,
            &dev.up,
            &dev.down,
            &mut out,
            dims,
            MoeGemv::Direct,
            MOE_PHASES_ALL,
        )
        .expect("routed");
        unfused_tail::<bf16>(&kern, &s, (&gud, &gld), 1, d.hidden, &mut out, &mut tail, &mut down_fn);
    });
    // The routed experts alone: gate+up only (phases 1), then the whole call, both down kernels.
    let mut routed_t = |which: MoeGemv, phases: u32| {
        time_us(&kern, &mut hold, 300, &mut |i| {
            kern.moe_decode_with::<bf16>(
                &dev.x,
                &routes[i % 16],
                &dev.w,
                &dev.gate,
                &dev.up,
                &dev.down,
                &mut out,
                dims,
                which,
                phases,
            )
            .expect("routed");
        })
    };
    let gu = routed_t(MoeGemv::Direct, 1);
    let routed = routed_t(MoeGemv::Direct, MOE_PHASES_ALL);
    let routed_legacy = routed_t(MoeGemv::DirectLegacy, MOE_PHASES_ALL);
    let dn_bytes = (d.k * d.hidden * d.inter * 2) as f64;
    println!(
        "moe shared 80b bf16 t=1: fused {fused:.1} us/call (legacy down {fused_legacy:.1}), unfused {unfused:.1} \
         us/call (routed alone {routed:.1}, legacy down {routed_legacy:.1}): the shared expert costs {:.1} us \
         fused, {:.1} us unfused | routed gate+up {gu:.1} us, down {:.1} us = {:.0} GB/s (legacy {:.1} us = {:.0} \
         GB/s)",
        fused - routed,
        unfused - routed,
        routed - gu,
        dn_bytes / (routed - gu) / 1e3,
        routed_legacy - gu,
        dn_bytes / (routed_legacy - gu) / 1e3
    );
}

/// The 80B shapes with FP8 weights (4 distinct experts replicated): parity at t = 1, then
/// fused vs unfused µs per call at t = 1.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_80b_fp8() {
    let (_env, kern) = gpu_locked("moe_shared_80b_fp8");
    let mut rng = Rng::new(46);
    let (e, k, h, i) = (EXPERTS, TOP_K, HIDDEN, MOE_INTER);
    fp8_case::<bf16>(&kern, &mut rng, [1, k, e, h, i], 4, i, Layout::Apart);
    let bank = 4;
    let (g, u, dw) = (
        W8::new(&kern, &mut rng, bank * i, h),
        W8::new(&kern, &mut rng, bank * i, h),
        W8::new(&kern, &mut rng, bank * h, i),
    );
    let (gs, us, ds) = (stack(&kern, &g, e, bank), stack(&kern, &u, e, bank), stack(&kern, &dw, e, bank));
    let sw = W8::new(&kern, &mut rng, h, i);
    let s = shared_inputs(&mut rng, 1, e, i, Layout::Apart, Vec::new());
    let (gud, gld) = upload_shared(&kern, &s);
    let x = up::<bf16>(&kern, &rnd_vec::<bf16>(&rng.vec(h, 1.0)));
    let wt = up::<f32>(&kern, &(0..k).map(|_| rng.f(0.5) + 0.5).collect::<Vec<_>>());
    let routes: Vec<CudaSlice<u32>> = (0..16).map(|_| up_u32(&kern, &random_routes(&mut rng, 1, k, e))).collect();
    let dims = [1, k, e, h, i];
    let sd = dev_of(&s, &gud, &gld, sw.dev());
    let mut out = poisoned::<f32>(&kern, h);
    let mut hold = Hold::new(&kern);
    let mut fused_call = |q: usize| {
        kern.moe_experts_fp8_shared::<bf16>(&x, &routes[q % 16], &wt, gs.dev(), us.dev(), ds.dev(), &sd, &mut out, dims)
            .expect("fused")
    };
    let fused = time_us(&kern, &mut hold, 300, &mut fused_call);
    let fused_legacy = with_legacy_down(|| time_us(&kern, &mut hold, 300, &mut fused_call));
    let mut out = poisoned::<f32>(&kern, h);
    let swd = sw.dev();
    let mut gemv =
        |hs: &CudaSlice<bf16>, so: &mut CudaSlice<bf16>| kern.fp8_gemv::<bf16, bf16>(hs, swd, so, 1).expect("fp8_gemv");
    let mut tail = Tail::<bf16>::new(&kern, 1, i, h);
    let unfused = time_us(&kern, &mut hold, 300, &mut |q| {
        kern.moe_experts_fp8_with::<bf16>(
            &x,
            &routes[q % 16],
            &wt,
            gs.dev(),
            us.dev(),
            ds.dev(),
            &mut out,
            dims,
            MoeGemv::Direct,
            MOE_PHASES_ALL,
        )
        .expect("routed");
        unfused_tail::<bf16>(&kern, &s, (&gud, &gld), 1, h, &mut out, &mut tail, &mut gemv);
    });
    let mut routed_t = |which: MoeGemv, phases: u32| {
        time_us(&kern, &mut hold, 300, &mut |q| {
            kern.moe_experts_fp8_with::<bf16>(
                &x,
                &routes[q % 16],
                &wt,
                gs.dev(),
                us.dev(),
                ds.dev(),
                &mut out,
                dims,
                which,
                phases,
            )
            .expect("routed");
        })
    };
    let gu = routed_t(MoeGemv::Direct, 1);
    let routed = routed_t(MoeGemv::Direct, MOE_PHASES_ALL);
    let routed_legacy = routed_t(MoeGemv::DirectLegacy, MOE_PHASES_ALL);
    let (gu_bytes, dn_bytes) = ((2 * k * h * i) as f64, (k * h * i) as f64);
    println!(
        "moe shared 80b fp8 (bf16 activations) t=1: fused {fused:.1} us/call (legacy down {fused_legacy:.1}), unfused \
         {unfused:.1} us/call | routed alone {routed:.1} us (legacy down {routed_legacy:.1}): gate+up {gu:.1} us = \
         {:.0} GB/s, down {:.1} us = {:.0} GB/s (legacy {:.1} us = {:.0} GB/s)",
        gu_bytes / gu / 1e3,
        routed - gu,
        dn_bytes / (routed - gu) / 1e3,
        routed_legacy - gu,
        dn_bytes / (routed_legacy - gu) / 1e3
    );
}
