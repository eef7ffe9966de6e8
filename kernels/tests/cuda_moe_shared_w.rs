//! The direct MoE decode form with the shared expert fused in and its gate / up products
//! computed by the gate+up launch from the `[gate; up]` weight (`SharedGu::Weights`: the FP8
//! checkpoints hold those rows apart from the bf16 router's, so no input GEMM computes them),
//! for FP8 and dense bf16 / f16 / f32 weights, t = 1, 2, 4, I_s = I (the shared down row in
//! the routed groups) and I_s ≠ I, aligned rows (16-byte loads) and odd ones (scalar loads).
//!
//! Checked against:
//! - the CPU reference (routed experts, then `g, u = x · W_guᵀ` in f64, `swiglu`, the shared
//!   down projection and the sigmoid gate), with the MoE tests' tolerance (`tol::<T>()`:
//!   relative to the largest value, 1e-2 for bf16 / f16, 1e-5 for f32);
//! - the same kernels fed the reference's f32 products as columns (`SharedGu::Cols`): only the
//!   summation order of g and u differs, so at most a rounding of T in some h_s elements (how
//!   many outputs are bit-identical is printed; the bound is the tolerance above);
//! - the legacy down kernel (`PORTER_MOE_DOWN=legacy`): bit for bit;
//! - row 0 alone: bit for bit row 0 of the batch.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`).

mod common;

use common::fp8::{moe_ref, stack, W8};
use common::moe::*;
use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{CudaFloat, CudaKernels, MoeSharedDev, SharedGu, MOE_DOWN_ENV};

/// Held by every test of this binary (the legacy runs set the process environment).
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The shared expert's host values: the `[gate; up]` weight and the down weight (as the
/// kernels read them: rounded to T, or dequantized and rounded), the gate logits `[t, e + 1]`
/// (column e).
struct Shared {
    is: usize,
    gu_w: Vec<f32>,
    down: Vec<f32>,
    glog: Vec<f32>,
}

/// `g, u = x · W_guᵀ` (f64, then f32) per row: `[t, 2·I_s]`.
fn products(x: &[f32], s: &Shared, t: usize, h: usize) -> Vec<f32> {
    let mut gu = Vec::with_capacity(t * 2 * s.is);
    for r in 0..t {
        let xr = &x[r * h..(r + 1) * h];
        for j in 0..2 * s.is {
            let w = &s.gu_w[j * h..(j + 1) * h];
            gu.push(xr.iter().zip(w).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() as f32);
        }
    }
    gu
}

/// The shared term `[t, hidden]`: `σ(round(g_r)) · round(h_s[r] · down_s[c])` with
/// `h_s = round(silu(round(g)) · round(u))` of the products `gu` `[t, 2·I_s]`.
fn shared_ref<T: CudaFloat>(s: &Shared, gu: &[f32], t: usize, e: usize, h: usize) -> Vec<f32> {
    let is = s.is;
    let mut hs = Vec::with_capacity(t * is);
    for r in 0..t {
        let row = &gu[r * 2 * is..];
        hs.extend((0..is).map(|c| rnd::<T>(ops::silu(rnd::<T>(row[c])) * rnd::<T>(row[is + c]))));
    }
    let mut so = vec![0.0f32; t * h];
    ops::matmul_t(&hs, &s.down, &mut so, t, is, h, false);
    so.iter().enumerate().map(|(q, v)| ops::sigmoid(rnd::<T>(s.glog[(q / h) * (e + 1) + e])) * rnd::<T>(*v)).collect()
}

/// The kernels' view of the shared expert: `gu` the products' columns (`Some`) or the weight.
fn dev_of<'a, W>(
    gu: Option<&'a CudaSlice<f32>>,
    w: W,
    down: W,
    glog: &'a CudaSlice<f32>,
    e: usize,
    is: usize,
) -> MoeSharedDev<'a, W> {
    MoeSharedDev {
        gu: match gu {
            Some(gu) => SharedGu::Cols { gu, stride: 2 * is, col0: 0 },
            None => SharedGu::Weights(w),
        },
        gate: glog,
        gate_stride: e + 1,
        gate_col: e,
        down,
        inter: is,
    }
}

/// One fused call's output `[rows, hidden]` (f32 host values) for the first `rows` rows, the
/// shared products from `gu` columns when given (else from the weight); the down kernel is the
/// one `PORTER_MOE_DOWN` names.
type Call<'c> = dyn FnMut(Option<&CudaSlice<f32>>, usize) -> Vec<f32> + 'c;

/// The checks of the module doc for one case; `call(gu columns, rows)`.
fn check_case<T: CudaFloat>(what: &str, want: &[f32], gu_ref: &CudaSlice<f32>, t: usize, call: &mut Call<'_>) {
    let fused = call(None, t);
    check(&format!("{what}: fused (weights) vs CPU"), &fused, want, tol::<T>());
    std::env::set_var(MOE_DOWN_ENV, "legacy");
    let legacy = call(None, t);
    std::env::set_var(MOE_DOWN_ENV, "stream");
    check_bits(&format!("{what}: legacy down vs streamed"), &legacy, &fused);
    let cols = call(Some(gu_ref), t);
    check(&format!("{what}: fused (columns) vs CPU"), &cols, want, tol::<T>());
    let same = fused.iter().zip(&cols).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
    let worst = fused.iter().zip(&cols).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    println!("  {what}: weights vs columns: {same} of {} bit-identical, max |diff| {worst:.3e}", fused.len());
    if t > 1 {
        let h = fused.len() / t;
        let alone = call(None, 1);
        check_bits(&format!("{what}: row 0 alone vs in the batch"), &alone, &fused[..h]);
    }
}

/// FP8 experts and FP8 shared weights, `dims` = `[t, k, e, hidden, inter]`, `bank` distinct
/// experts.
fn fp8_case<T: CudaFloat>(kern: &CudaKernels, rng: &mut Rng, dims: [usize; 5], bank: usize, is: usize) {
    let [t, kk, e, h, i] = dims;
    let (g, u, dw) =
        (W8::new(kern, rng, bank * i, h), W8::new(kern, rng, bank * i, h), W8::new(kern, rng, bank * h, i));
    let (gs, us, ds) = (stack(kern, &g, e, bank), stack(kern, &u, e, bank), stack(kern, &dw, e, bank));
    let (sgu, sdn) = (W8::new(kern, rng, 2 * is, h), W8::new(kern, rng, h, is));
    let s = Shared { is, gu_w: sgu.dense::<T>(), down: sdn.dense::<T>(), glog: rng.vec(t * (e + 1), 2.0) };
    let x = rnd_vec::<T>(&rng.vec(t * h, 1.0));
    let idx = random_routes(rng, t, kk, e);
    let wt: Vec<f32> = (0..t * kk).map(|_| rng.f(0.5) + 0.5).collect();
    let routed = moe_ref::<T>(&x, &idx, &wt, &g.dense::<T>(), &u.dense::<T>(), &dw.dense::<T>(), dims, bank);
    let gu = products(&x, &s, t, h);
    let want: Vec<f32> = routed.iter().zip(shared_ref::<T>(&s, &gu, t, e, h)).map(|(a, b)| a + b).collect();
    let (xd, id, wd, gud) = (up::<T>(kern, &x), up_u32(kern, &idx), up::<f32>(kern, &wt), up::<f32>(kern, &gu));
    let what = format!("fp8 {} {dims:?} I_s={is}", T::NAME);
    check_case::<T>(&what, &want, &gud, t, &mut |cols, rows| {
        let mut out = poisoned::<f32>(kern, rows * h);
        // The gate logits of the call's rows (the kernels check the exact length).
        let gl = up::<f32>(kern, &s.glog[..rows * (e + 1)]);
        let sd = dev_of(cols, sgu.dev(), sdn.dev(), &gl, e, is);
        let (x0, i0, w0) = (xd.slice(0..rows * h), id.slice(0..rows * kk), wd.slice(0..rows * kk));
        kern.moe_experts_fp8_shared::<T>(
            &x0,
            &i0,
            &w0,
            gs.dev(),
            us.dev(),
            ds.dev(),
            &sd,
            &mut out,
            [rows, kk, e, h, i],
        )
        .unwrap_or_else(|err| panic!("{what}: {err}"));
        down::<f32>(kern, &out)
    });
}

/// Dense experts and shared weights of T.
fn dense_case<T: CudaFloat>(kern: &CudaKernels, rng: &mut Rng, d: Dims, is: usize) {
    let (t, h) = (d.t, d.hidden);
    let idx = random_routes(rng, d.t, d.k, d.e);
    let inp = inputs::<T>(rng, d, idx);
    let sc = 1.0 / (h as f32).sqrt();
    let s = Shared {
        is,
        gu_w: rnd_vec::<T>(&rng.vec(2 * is * h, 2.0 * sc)),
        down: rnd_vec::<T>(&rng.vec(h * is, 1.7 / (is as f32).sqrt())),
        glog: rng.vec(t * (d.e + 1), 2.0),
    };
    let gu = products(&inp.x, &s, t, h);
    let routed = reference::<T>(d, &inp);
    let want: Vec<f32> = routed.iter().zip(shared_ref::<T>(&s, &gu, t, d.e, h)).map(|(a, b)| a + b).collect();
    let dev = upload::<T>(kern, d, &inp);
    let (sgd, sdd, gud) = (up::<T>(kern, &s.gu_w), up::<T>(kern, &s.down), up::<f32>(kern, &gu));
    let what = format!("dense {} {d:?} I_s={is}", T::NAME);
    check_case::<T>(&what, &want, &gud, t, &mut |cols, rows| {
        let mut out = poisoned::<f32>(kern, rows * h);
        let gl = up::<f32>(kern, &s.glog[..rows * (d.e + 1)]);
        let sd = dev_of(cols, &sgd, &sdd, &gl, d.e, is);
        let (x0, i0, w0) = (dev.x.slice(0..rows * h), dev.idx.slice(0..rows * d.k), dev.w.slice(0..rows * d.k));
        let dims = [rows, d.k, d.e, h, d.inter];
        kern.moe_experts_shared::<T>(&x0, &i0, &w0, &dev.gate, &dev.up, &dev.down, &sd, &mut out, dims)
            .unwrap_or_else(|err| panic!("{what}: {err}"));
        down::<f32>(kern, &out)
    });
}

fn all_cases<T: CudaFloat>(test: &str, seed: u64) {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var(MOE_DOWN_ENV, "stream");
    let kern = gpu(test);
    let mut rng = Rng::new(seed);
    for t in [1, 2, 4] {
        // FP8, aligned: I_s = I (mode 1) and I_s = 64; k = 10 (two zip groups).
        fp8_case::<T>(&kern, &mut rng, [t, 10, 16, 256, 128], 4, 128);
        fp8_case::<T>(&kern, &mut rng, [t, 10, 16, 256, 128], 4, 64);
        // FP8, rows of 200 e4m3 bytes (scalar loads, a partial scale block), I_s = 72.
        fp8_case::<T>(&kern, &mut rng, [t, 3, 8, 200, 64], 8, 72);
        // Dense, aligned and odd.
        dense_case::<T>(&kern, &mut rng, Dims { t, k: 3, e: 8, hidden: 72, inter: 40, bank: 8 }, 40);
        dense_case::<T>(&kern, &mut rng, Dims { t, k: 3, e: 8, hidden: 72, inter: 40, bank: 8 }, 24);
        dense_case::<T>(&kern, &mut rng, Dims { t, k: 10, e: 12, hidden: 37, inter: 21, bank: 12 }, 13);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_weights_bf16() {
    all_cases::<bf16>("moe_shared_weights_bf16", 71);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_weights_f16() {
    all_cases::<f16>("moe_shared_weights_f16", 72);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_shared_weights_f32() {
    all_cases::<f32>("moe_shared_weights_f32", 73);
}
