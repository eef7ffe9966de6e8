//! The MoE router inside the direct decode form's gate+up kernel (`PORTER_MOE_ROUTER=fused`,
//! kernels/cuda/moe_direct.cu `DirRoute`, kernels/src/cuda/moe_route.rs) against the separate
//! router launch (`apart`): `CudaKernels::moe_experts_routed` / `moe_experts_fp8_routed` with
//! [`MoeRouter::Fused`] and [`MoeRouter::Apart`] must give the same expert ids, the same
//! weights and the same output `y`, bit for bit, for dense bf16 / f16 / f32 and FP8 experts
//! (bf16, f16, f32 activations), t = 1..4, in the three direct forms (streamed down kernel,
//! legacy, down-L2), without and with the shared expert fused in. Shapes: the Qwen3-Next-80B
//! experts (hidden 2048, inter 512, 512 experts, top-10), e = 33 with k = 16, and inter = 3
//! (a block of 8 gate+up items spans two rows, so a block routes two rows); logits random, or
//! with ties (equal values, duplicate maxima), NaN entries, a row all −inf and a row all NaN.
//! The router logits are the first e columns of a packed matrix as the model's MoE input
//! projection writes it (router logits, shared gate, shared up, shared gate logit). The
//! dense and FP8 outputs with random logits are also checked against the CPU reference on
//! the selected experts.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]`: run them with
//! `cargo test -p porter-kernels --test cuda_moe_route -- --include-ignored`.

mod common;

use common::fp8::{moe_ref, stack, W8};
use common::moe::*;
use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cuda::{
    CudaError, CudaFloat, CudaKernels, MoeGemv, MoeRouteDev, MoeRouter, MoeSharedDev, SharedGu,
};

/// What the router logits hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logits {
    /// Random values.
    Random,
    /// Row r % 4: 0 ties (equal values, two equal maxima), 1 a few NaN entries, 2 all −inf,
    /// 3 all NaN.
    Special,
}

/// One shape of the test: `d.t` is the most rows (the cases run t = 1..=d.t), `is` the shared
/// expert's intermediate size.
#[derive(Clone, Copy, Debug)]
struct Shape {
    d: Dims,
    is: usize,
    logits: Logits,
    renorm: bool,
}

/// The shapes every weight kind runs.
fn shapes() -> Vec<Shape> {
    vec![
        Shape { d: dims_80b(4), is: MOE_INTER, logits: Logits::Random, renorm: true },
        Shape {
            d: Dims { t: 4, k: 16, e: 33, hidden: 256, inter: 64, bank: 33 },
            is: 64,
            logits: Logits::Random,
            renorm: false,
        },
        Shape {
            d: Dims { t: 4, k: 10, e: 512, hidden: 96, inter: 3, bank: 16 },
            is: 24,
            logits: Logits::Random,
            renorm: true,
        },
        Shape {
            d: Dims { t: 4, k: 10, e: 512, hidden: 128, inter: 8, bank: 16 },
            is: 8,
            logits: Logits::Special,
            renorm: true,
        },
        Shape {
            d: Dims { t: 4, k: 16, e: 33, hidden: 64, inter: 16, bank: 33 },
            is: 16,
            logits: Logits::Special,
            renorm: false,
        },
    ]
}

/// The packed f32 matrix `[t, e + 2·is + 1]`: router logits (`kind`), then the shared gate, up
/// and gate logit.
fn packed(rng: &mut Rng, t: usize, e: usize, is: usize, kind: Logits) -> Vec<f32> {
    let stride = e + 2 * is + 1;
    let mut all = rng.vec(t * stride, 2.0);
    if kind == Logits::Special {
        for r in 0..t {
            let row = &mut all[r * stride..r * stride + e];
            match r % 4 {
                0 => {
                    row.fill(0.5);
                    row[e - 1] = 2.0;
                    row[7] = 2.0;
                    row[e / 2] = 1.0;
                }
                1 => {
                    row[3] = f32::NAN;
                    row[e - 2] = f32::NAN;
                }
                2 => row.fill(f32::NEG_INFINITY),
                _ => row.fill(f32::NAN),
            }
        }
    }
    all
}

/// A set of routed experts (and a shared expert's down weight) the routed calls run on.
trait Experts<T: CudaFloat> {
    /// Whether the weights are FP8.
    fn fp8(&self) -> bool;
    /// One routed call; `all` the packed matrix of `route` when `shared` (the shared expert's
    /// columns in it).
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        kern: &CudaKernels,
        x: &CudaSlice<T>,
        route: &MoeRouteDev<'_>,
        idx: &mut CudaSlice<u32>,
        w: &mut CudaSlice<f32>,
        shared: bool,
        out: &mut CudaSlice<f32>,
        dims: [usize; 5],
        which: MoeGemv,
    ) -> Result<(), CudaError>;
    /// The CPU reference of the routed experts (no shared expert) for `x`, `idx`, `w` of `t` rows.
    fn reference(&self, x: &[f32], idx: &[u32], w: &[f32], d: Dims) -> Vec<f32>;
}

/// The shared expert's view of the packed matrix `all` (`[t, e + 2·is + 1]`).
fn shared_of<'a, W>(all: &'a CudaSlice<f32>, e: usize, is: usize, down: W) -> MoeSharedDev<'a, W> {
    let stride = e + 2 * is + 1;
    MoeSharedDev {
        gu: SharedGu::Cols { gu: all, stride, col0: e },
        gate: all,
        gate_stride: stride,
        gate_col: e + 2 * is,
        down,
        inter: is,
    }
}

/// Dense experts of `T`.
struct Dense<T> {
    host: Inputs,
    gate: CudaSlice<T>,
    up: CudaSlice<T>,
    down: CudaSlice<T>,
    sdown: CudaSlice<T>,
    is: usize,
}

impl<T: CudaFloat> Dense<T> {
    fn new(kern: &CudaKernels, rng: &mut Rng, s: &Shape) -> Self {
        let d = s.d;
        let host = inputs::<T>(rng, d, vec![0; d.t * d.k]);
        let (gate, up, down) = (
            upload_experts::<T>(kern, &host.gate, d),
            upload_experts::<T>(kern, &host.up, d),
            upload_experts::<T>(kern, &host.down, d),
        );
        let sdown = common::up::<T>(kern, &rnd_vec::<T>(&rng.vec(d.hidden * s.is, 1.7 / (s.is as f32).sqrt())));
        Dense { host, gate, up, down, sdown, is: s.is }
    }
}

impl<T: CudaFloat> Experts<T> for Dense<T> {
    fn fp8(&self) -> bool {
        false
    }
    fn call(
        &self,
        kern: &CudaKernels,
        x: &CudaSlice<T>,
        route: &MoeRouteDev<'_>,
        idx: &mut CudaSlice<u32>,
        w: &mut CudaSlice<f32>,
        shared: bool,
        out: &mut CudaSlice<f32>,
        dims: [usize; 5],
        which: MoeGemv,
    ) -> Result<(), CudaError> {
        let sh = shared.then(|| shared_of(route.logits, dims[2], self.is, &self.sdown));
        kern.moe_experts_routed::<T>(x, route, idx, w, &self.gate, &self.up, &self.down, sh.as_ref(), out, dims, which)
    }
    fn reference(&self, x: &[f32], idx: &[u32], w: &[f32], d: Dims) -> Vec<f32> {
        let inp = Inputs {
            x: x.to_vec(),
            idx: idx.to_vec(),
            w: w.to_vec(),
            gate: self.host.gate.clone(),
            up: self.host.up.clone(),
            down: self.host.down.clone(),
        };
        reference::<T>(d, &inp)
    }
}

/// FP8 experts (`bank` distinct ones stacked into e) and an FP8 shared down weight.
struct Fp8 {
    g: W8,
    u: W8,
    dw: W8,
    gs: W8,
    us: W8,
    ds: W8,
    sw: W8,
    bank: usize,
}

impl Fp8 {
    fn new(kern: &CudaKernels, rng: &mut Rng, s: &Shape) -> Self {
        let Dims { e, hidden: h, inter: i, bank, .. } = s.d;
        let (g, u, dw) =
            (W8::new(kern, rng, bank * i, h), W8::new(kern, rng, bank * i, h), W8::new(kern, rng, bank * h, i));
        let (gs, us, ds) = (stack(kern, &g, e, bank), stack(kern, &u, e, bank), stack(kern, &dw, e, bank));
        let sw = W8::new(kern, rng, h, s.is);
        Fp8 { g, u, dw, gs, us, ds, sw, bank }
    }
}

impl<T: CudaFloat> Experts<T> for Fp8 {
    fn fp8(&self) -> bool {
        true
    }
    fn call(
        &self,
        kern: &CudaKernels,
        x: &CudaSlice<T>,
        route: &MoeRouteDev<'_>,
        idx: &mut CudaSlice<u32>,
        w: &mut CudaSlice<f32>,
        shared: bool,
        out: &mut CudaSlice<f32>,
        dims: [usize; 5],
        which: MoeGemv,
    ) -> Result<(), CudaError> {
        let sh = shared.then(|| shared_of(route.logits, dims[2], self.sw.cols, self.sw.dev()));
        let (g, u, d) = (self.gs.dev(), self.us.dev(), self.ds.dev());
        kern.moe_experts_fp8_routed::<T>(x, route, idx, w, g, u, d, sh.as_ref(), out, dims, which)
    }
    fn reference(&self, x: &[f32], idx: &[u32], w: &[f32], d: Dims) -> Vec<f32> {
        let dims = [d.t, d.k, d.e, d.hidden, d.inter];
        moe_ref::<T>(x, idx, w, &self.g.dense::<T>(), &self.u.dense::<T>(), &self.dw.dense::<T>(), dims, self.bank)
    }
}

/// What one routed call gave: ids, weights, output.
struct Got {
    idx: Vec<u32>,
    w: Vec<f32>,
    y: Vec<f32>,
}

/// One routed call with `router` on poisoned outputs.
#[allow(clippy::too_many_arguments)]
fn run<T: CudaFloat>(
    kern: &CudaKernels,
    ex: &dyn Experts<T>,
    x: &CudaSlice<T>,
    all: &CudaSlice<f32>,
    s: &Shape,
    dims: [usize; 5],
    which: MoeGemv,
    shared: bool,
    router: MoeRouter,
    what: &str,
) -> Got {
    let [t, k, e, h, _] = dims;
    let route = MoeRouteDev { logits: all, stride: e + 2 * s.is + 1, renorm: s.renorm, router };
    let (mut idx, mut w, mut out) =
        (poisoned_u32(kern, t * k), poisoned::<f32>(kern, t * k), poisoned::<f32>(kern, t * h));
    ex.call(kern, x, &route, &mut idx, &mut w, shared, &mut out, dims, which)
        .unwrap_or_else(|err| panic!("{what} {router:?}: {err}"));
    Got { idx: down_u32(kern, &idx), w: down::<f32>(kern, &w), y: down::<f32>(kern, &out) }
}

/// Every case of one shape for one set of experts: t = 1..=d.t, the three direct forms,
/// without and with the shared expert; fused against apart bit for bit, and the routed output
/// with random logits against the CPU reference.
fn shape_cases<T: CudaFloat>(kern: &CudaKernels, rng: &mut Rng, ex: &dyn Experts<T>, s: &Shape) {
    let d = s.d;
    let all_h = packed(rng, d.t, d.e, s.is, s.logits);
    let x_h = rnd_vec::<T>(&rng.vec(d.t * d.hidden, 1.0));
    let stride = d.e + 2 * s.is + 1;
    let kind = if ex.fp8() { "fp8" } else { "dense" };
    for t in 1..=d.t {
        let (all, x) = (up::<f32>(kern, &all_h[..t * stride]), up::<T>(kern, &x_h[..t * d.hidden]));
        let dims = [t, d.k, d.e, d.hidden, d.inter];
        for shared in [false, true] {
            for which in [MoeGemv::Direct, MoeGemv::DirectLegacy, MoeGemv::DirectL2] {
                let what = format!("{kind} {} {:?} t={t} shared={shared} {which:?}", T::NAME, s);
                assert!(
                    MoeRouter::Fused.routes_inside(which, dims, ex.fp8(), shared),
                    "{what}: the fused router does not take this call (PORTER_ROUTER_BLOCK set?)"
                );
                assert!(!MoeRouter::Apart.routes_inside(which, dims, ex.fp8(), shared));
                let apart = run::<T>(kern, ex, &x, &all, s, dims, which, shared, MoeRouter::Apart, &what);
                let fused = run::<T>(kern, ex, &x, &all, s, dims, which, shared, MoeRouter::Fused, &what);
                assert_eq!(fused.idx, apart.idx, "{what}: expert ids differ");
                assert!(fused.idx.iter().all(|&i| (i as usize) < d.e), "{what}: an id out of range: {:?}", fused.idx);
                check_bits(&format!("{what}: weights"), &fused.w, &apart.w);
                check_bits(&format!("{what}: y"), &fused.y, &apart.y);
                if s.logits == Logits::Random && !shared && which == MoeGemv::Direct {
                    let want = ex.reference(&x_h[..t * d.hidden], &fused.idx, &fused.w, Dims { t, ..d });
                    check(&format!("{what}: vs CPU"), &fused.y, &want, tol::<T>());
                }
            }
        }
        println!("  {kind} {} {:?} t={t}: fused = apart (ids, weights, y) in 6 forms", T::NAME, s.d);
    }
}

fn dense<T: CudaFloat>(test: &str, seed: u64) {
    let kern = gpu(test);
    let mut rng = Rng::new(seed);
    for s in shapes() {
        let ex = Dense::<T>::new(&kern, &mut rng, &s);
        shape_cases::<T>(&kern, &mut rng, &ex, &s);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_route_fused_bf16() {
    dense::<bf16>("moe_route_fused_bf16", 61);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_route_fused_f16() {
    dense::<f16>("moe_route_fused_f16", 62);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_route_fused_f32() {
    dense::<f32>("moe_route_fused_f32", 63);
}

/// FP8 experts with bf16, f16 and f32 activations.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_route_fused_fp8() {
    let kern = gpu("moe_route_fused_fp8");
    let mut rng = Rng::new(64);
    for s in shapes() {
        let ex = Fp8::new(&kern, &mut rng, &s);
        shape_cases::<bf16>(&kern, &mut rng, &ex, &s);
        shape_cases::<f16>(&kern, &mut rng, &ex, &s);
        shape_cases::<f32>(&kern, &mut rng, &ex, &s);
    }
}
