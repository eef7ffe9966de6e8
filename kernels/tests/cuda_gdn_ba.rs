//! The Gated DeltaNet conv + gates launch that computes its gate inputs itself
//! (`gdn_conv_gates_proj_seq`, kernels/cuda/gdn_seq.cu: `in_proj_ba`'s product, held apart in
//! the FP8 checkpoints) against the apart form it replaces at decode (the product by the decode
//! GEMV, or cuBLAS where the GEMV does not take the shape, then `gdn_conv_gates_seq` reading it):
//! the conv outputs and window updates bit for bit; g and β bit for bit where the apart
//! product is the GEMV's (same summation order), and always within a derived bound of the f64
//! reference; the vector path (16-byte rows), the element path (odd widths, an unaligned
//! input); argument errors. Plus a timing of both forms at the Qwen3-Next-80B sizes.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`;
//! without a GPU they then fail, saying so). Outputs are NaN-poisoned before every launch.
//! The seed is printed; set `PORTER_CUDA_SEED` to replay one.

mod common;

use common::timing::{time_calls, Hold};
use common::*;
use cudarc::driver::{CudaSlice, DevicePtr};
use half::{bf16, f16};
use porter_kernels::cuda::{CudaFloat, CudaKernels, GateProj, Gemm};

/// The slot of a padding span (out of range: NaN conv rows, no window update).
const PAD: usize = u32::MAX as usize;
/// Conv window of a speculative cache with 3 draft tokens: `k − 1 + 3`.
const SPEC: usize = 3;
/// Slots of the conv windows (every span of a step takes its own, up to 16 spans).
const SLOTS: usize = 16;

/// Spans `(len, slot, lag)` of a `t`-row step: decode rows, verify spans with rolled-back
/// lags, a padding span.
fn spans_for(t: usize) -> Vec<(usize, usize, usize)> {
    match t {
        1 => vec![(1, 0, 0)],
        2 => vec![(2, 1, 1)],
        4 => vec![(1, 0, 0), (1, PAD, 0), (2, 2, 3)],
        16 => vec![(4, 0, 2), (1, 1, 0), (1, 2, 0), (3, 3, 1), (1, PAD, 0), (6, 4, 0)],
        _ => (0..t).map(|i| (1, i % SLOTS, 0)).collect(),
    }
}

/// The `[n, 4]` table `(row0, len, slot, lag)` of consecutive spans.
fn span_table(spans: &[(usize, usize, usize)]) -> Vec<u32> {
    let mut row0 = 0;
    let mut table = Vec::new();
    for &(len, slot, lag) in spans {
        table.extend([row0, len, slot, lag].map(|v| v as u32));
        row0 += len;
    }
    table
}

/// The sizes of one case.
#[derive(Clone, Copy, Debug)]
struct Geom {
    t: usize,
    hv: usize,
    /// Conv channels `2·hk·dk + hv·dv`.
    c: usize,
    /// Row width of the projections: conv channels, then z (`hv·dv`).
    stride: usize,
    hidden: usize,
}

impl Geom {
    /// Qwen3-Next's heads at `hv` value heads (`hk = hv / 2`, head dims 128 at 32 heads, 64 below).
    fn new(t: usize, hv: usize, hidden: usize) -> Self {
        let d = if hv == 32 { 128 } else { 64 };
        let c = 2 * (hv / 2) * d + hv * d;
        Self { t, hv, c, stride: c + hv * d, hidden }
    }
}

/// The host inputs of one case (values of `T`, as f32).
struct Inputs {
    p: Vec<f32>,
    conv_w: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    window: Vec<f32>,
    /// `[t, hidden]`, the rows the projections read.
    x: Vec<f32>,
    /// `[2·hv, hidden]`, `in_proj_ba`.
    w: Vec<f32>,
}

impl Inputs {
    fn new<T: CudaFloat>(rng: &mut Rng, d: Geom) -> Self {
        let win = CONV_K - 1 + SPEC;
        let mut a_log = rng.vec(d.hv, 2.0);
        a_log[0] = 3.0;
        let mut dt_bias = rng.vec(d.hv, 2.0);
        dt_bias[d.hv - 1] = 25.0; // softplus above its threshold
        Self {
            p: rnd_vec::<T>(&rng.vec(d.t * d.stride, 2.0)),
            conv_w: rng.vec(d.c * CONV_K, 0.5),
            a_log,
            dt_bias,
            window: rng.vec(SLOTS * d.c * win, 1.0),
            x: rnd_vec::<T>(&rng.vec(d.t * d.hidden, 2.0)),
            w: rnd_vec::<T>(&rng.vec(2 * d.hv * d.hidden, 2.0 / (d.hidden as f32).sqrt())),
        }
    }
}

/// What one launch leaves: conv output, window, g, β.
struct Outs {
    out: Vec<f32>,
    window: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

/// The device buffers of one case (both forms start from the same window).
struct Dev<T: CudaFloat> {
    p: CudaSlice<T>,
    conv_w: CudaSlice<f32>,
    a_log: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
    spans: CudaSlice<u32>,
    /// `x` with one element before it (the unaligned case reads from offset 1).
    x: CudaSlice<T>,
    w: CudaSlice<T>,
    n_spans: usize,
}

impl<T: CudaFloat> Dev<T> {
    fn new(k: &CudaKernels, inp: &Inputs, spans: &[(usize, usize, usize)]) -> Self {
        let x: Vec<f32> = std::iter::once(0.0).chain(inp.x.iter().copied()).collect();
        Self {
            p: up::<T>(k, &inp.p),
            conv_w: up::<f32>(k, &inp.conv_w),
            a_log: up::<f32>(k, &inp.a_log),
            dt_bias: up::<f32>(k, &inp.dt_bias),
            spans: up_u32(k, &span_table(spans)),
            x: up::<T>(k, &x),
            w: up::<T>(k, &inp.w),
            n_spans: spans.len(),
        }
    }

    /// The fused form, `x` read from an aligned buffer of its own or one element into a
    /// buffer (not 16-byte aligned: the element path).
    fn proj(&self, k: &CudaKernels, d: Geom, inp: &Inputs, unaligned: bool) -> Outs {
        if unaligned {
            self.proj_from(k, d, inp, &self.x.slice(1..1 + d.t * d.hidden))
        } else {
            self.proj_from(k, d, inp, &up::<T>(k, &inp.x))
        }
    }

    fn proj_from(&self, k: &CudaKernels, d: Geom, inp: &Inputs, x: &impl DevicePtr<T>) -> Outs {
        let win = CONV_K - 1 + SPEC;
        let mut window = up::<f32>(k, &inp.window);
        let (mut out, mut g, mut beta) = (poisoned(k, d.t * d.c), poisoned(k, d.t * d.hv), poisoned(k, d.t * d.hv));
        k.gdn_conv_gates_proj_seq::<T>(
            &self.p,
            d.stride,
            GateProj { x, w: &self.w, hidden: d.hidden },
            &self.conv_w,
            &self.a_log,
            &self.dt_bias,
            &mut window,
            &self.spans,
            &mut out,
            &mut g,
            &mut beta,
            d.t,
            self.n_spans,
            d.c,
            CONV_K,
            win,
            SLOTS,
            d.hv,
        )
        .expect("gdn_conv_gates_proj_seq");
        Outs { out: down(k, &out), window: down(k, &window), g: down(k, &g), beta: down(k, &beta) }
    }

    /// The apart form: `ba = x · wᵀ` by the decode GEMV (groups of at most 8 rows, as the
    /// model's batch-invariant path) where it takes the shape, else cuBLAS; then the conv +
    /// gates launch reading it. Returns the outputs and whether the GEMV ran.
    fn apart(&self, k: &CudaKernels, gemm: &Gemm, d: Geom, inp: &Inputs) -> (Outs, bool) {
        let win = CONV_K - 1 + SPEC;
        let n = 2 * d.hv;
        let x = up::<T>(k, &inp.x);
        let mut ba = poisoned::<T>(k, d.t * n);
        let gemv = CudaKernels::gemv_fits::<T, T>(8, d.hidden);
        if gemv {
            for r0 in (0..d.t).step_by(8) {
                let r = 8.min(d.t - r0);
                let xv = x.slice(r0 * d.hidden..(r0 + r) * d.hidden);
                let mut ov = ba.slice_mut(r0 * n..(r0 + r) * n);
                k.gemv::<T, T>(&xv, &self.w, &mut ov, r, d.hidden, n).expect("gemv");
            }
        } else {
            gemm.matmul_t::<T, T>(&x, &self.w, &mut ba, d.t, d.hidden, n).expect("cublas");
        }
        let mut window = up::<f32>(k, &inp.window);
        let (mut out, mut g, mut beta) = (poisoned(k, d.t * d.c), poisoned(k, d.t * d.hv), poisoned(k, d.t * d.hv));
        k.gdn_conv_gates_seq::<T>(
            &self.p,
            d.stride,
            Some(&ba),
            n,
            0,
            &self.conv_w,
            &self.a_log,
            &self.dt_bias,
            &mut window,
            &self.spans,
            &mut out,
            &mut g,
            &mut beta,
            d.t,
            self.n_spans,
            d.c,
            CONV_K,
            win,
            SLOTS,
            d.hv,
        )
        .expect("gdn_conv_gates_seq");
        (Outs { out: down(k, &out), window: down(k, &window), g: down(k, &g), beta: down(k, &beta) }, gemv)
    }
}

/// Most roundings a product `w_i·x_i` passes through in the fused form's f32 sum of `hidden`
/// terms (and the decode GEMV's): a lane's FMA chain of at most `⌈⌈hidden / E⌉ / 32⌉ · E`
/// steps (E elements a 16-byte chunk; the element path's chains are no longer), the 5
/// butterfly levels of `warp_sum`, up to 3 additions of the parts.
fn roundings<T: CudaFloat>(hidden: usize) -> usize {
    let e = 16 / std::mem::size_of::<T>();
    hidden.div_ceil(e).div_ceil(32) * e + 5 + 3
}

/// Unit roundoff of f32.
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// `softplus` with the kernels' threshold (`x` above 20 is returned as is).
fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Checks the device's g and β of every (row, head) against the f64 reference.
///
/// The bound. The device's b is `round_T(f)` where `f` is an f32 sum of the `hidden` products
/// `w_i·x_i` (exact in f64: both are values of `T`) in which each product passes through at
/// most `n` roundings ([`roundings`]), so `|f − d| ≤ γ_n Σ|w_i x_i|` with `d` the exact dot and
/// `γ_n = n·u / (1 − n·u)`. f is an f32, so it lies in `[fl32(d − E), fl32(d + E)]`, and rounding
/// to T is monotone: b lies in `[round_T(fl32(d − E)), round_T(fl32(d + E))]` (one or two
/// values of T in practice: at hidden 2048, γ_n Σ|w x| ≈ 2e-4 against a bf16 ulp of 8e-3 at
/// 1). g is decreasing in a and β increasing in b, so the reference values at the two ends
/// bound them. The device then evaluates the gates in f32: `fl(a + dt_bias)` (relative error
/// u, i.e. `|x|·u` of softplus since softplus' = σ ≤ softplus), expf (2 ulp), log1pf (1 ulp),
/// the product: at most `(|x| + 16)·u` relative for g, with x = a + dt_bias; `1 / (1 +
/// expf(−b))` at most `6·u` for β. Both are doubled as the slack.
fn check_gates(what: &str, d: Geom, inp: &Inputs, got: &Outs, n: usize, is_t: &dyn Fn(f32) -> f32) {
    let n = n as f64;
    let gamma = n * U / (1.0 - n * U);
    let (mut worst_g, mut worst_b) = (0.0f64, 0.0f64);
    for r in 0..d.t {
        let xr = &inp.x[r * d.hidden..(r + 1) * d.hidden];
        // [lo, hi] of the rounded b (j = 0) and a (j = 1) of head h.
        let range = |row: usize| {
            let wr = &inp.w[row * d.hidden..(row + 1) * d.hidden];
            let (mut dot, mut abs) = (0.0f64, 0.0f64);
            for (w, x) in wr.iter().zip(xr) {
                let p = f64::from(*w) * f64::from(*x);
                dot += p;
                abs += p.abs();
            }
            let e = gamma * abs;
            (f64::from(is_t((dot - e) as f32)), f64::from(is_t((dot + e) as f32)))
        };
        for h in 0..d.hv {
            let ((b_lo, b_hi), (a_lo, a_hi)) = (range(h), range(d.hv + h));
            let (al, dt) = (f64::from(inp.a_log[h]), f64::from(inp.dt_bias[h]));
            let gate = |a: f64| -al.exp() * softplus(a + dt);
            let sig = |b: f64| 1.0 / (1.0 + (-b).exp());
            let (g_lo, g_hi) = (gate(a_hi), gate(a_lo));
            let (s_lo, s_hi) = (sig(b_lo), sig(b_hi));
            let x = (a_lo.abs().max(a_hi.abs()) + dt.abs()).max(1.0);
            let slack_g = 2.0 * (x + 16.0) * U * g_lo.abs().max(g_hi.abs());
            let slack_b = 12.0 * U * s_hi;
            let (gv, bv) = (f64::from(got.g[r * d.hv + h]), f64::from(got.beta[r * d.hv + h]));
            let out_g = (g_lo - slack_g - gv).max(gv - g_hi - slack_g);
            let out_b = (s_lo - slack_b - bv).max(bv - s_hi - slack_b);
            assert!(
                out_g <= 0.0,
                "{what}: g[{r}, {h}] = {gv:e} outside [{g_lo:e}, {g_hi:e}] ± {slack_g:e} (a in [{a_lo}, {a_hi}])"
            );
            assert!(
                out_b <= 0.0,
                "{what}: beta[{r}, {h}] = {bv:e} outside [{s_lo:e}, {s_hi:e}] ± {slack_b:e} (b in [{b_lo}, {b_hi}])"
            );
            worst_g = worst_g.max((gv - 0.5 * (g_lo + g_hi)).abs());
            worst_b = worst_b.max((bv - 0.5 * (s_lo + s_hi)).abs());
        }
    }
    println!("  {what}: gates within the bound (max |Δ| from the interval's middle: g {worst_g:.2e}, β {worst_b:.2e})");
}

/// One case: the fused form (aligned, and with an unaligned `x` at 16-byte widths) against
/// the apart form and the reference.
fn case<T: CudaFloat>(k: &CudaKernels, gemm: &Gemm, rng: &mut Rng, t: usize, hv: usize, hidden: usize) {
    let d = Geom::new(t, hv, hidden);
    let inp = Inputs::new::<T>(rng, d);
    let spans = spans_for(t);
    assert_eq!(spans.iter().map(|s| s.0).sum::<usize>(), t);
    let dev = Dev::<T>::new(k, &inp, &spans);
    let (apart, gemv) = dev.apart(k, gemm, d, &inp);
    let fused_n = roundings::<T>(hidden);
    let vector = (hidden * std::mem::size_of::<T>()).is_multiple_of(16);
    for unaligned in [false, true] {
        if unaligned && !vector {
            continue; // already the element path
        }
        let what = format!("{} {d:?}{}", T::NAME, if unaligned { " (x unaligned)" } else { "" });
        let fused = dev.proj(k, d, &inp, unaligned);
        check_bits(&format!("{what}: conv out vs apart"), &fused.out, &apart.out);
        check_bits(&format!("{what}: window vs apart"), &fused.window, &apart.window);
        if gemv && !unaligned {
            // The GEMV's summation order: the same b and a, so the same gates.
            check_bits(&format!("{what}: g vs the GEMV"), &fused.g, &apart.g);
            check_bits(&format!("{what}: beta vs the GEMV"), &fused.beta, &apart.beta);
        }
        check_gates(&what, d, &inp, &fused, fused_n, &rnd::<T>);
    }
    // The GEMV sums as the fused form; cuBLAS in its own order: any order of `hidden` terms
    // rounds each product at most `hidden` times.
    let apart_n = if gemv { fused_n } else { hidden + 1 };
    check_gates(&format!("{} {d:?} apart", T::NAME), d, &inp, &apart, apart_n, &rnd::<T>);
}

/// bf16, f16 and f32 at t = 1, 2, 4, 16 rows, 32 / 16 / 8 value heads, hidden 2048 (the
/// model), 1000 (16-byte rows, a partial last round of lanes; the GEMV splits it over fewer
/// warps) and 999 (the element path; cuBLAS for the apart product).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_conv_gates_proj_equals_apart() {
    let k = gpu("cuda_gdn_conv_gates_proj_equals_apart");
    let gemm = Gemm::new(&k).expect("cuBLAS");
    let mut rng = Rng::new(0xba);
    for t in [1, 2, 4, 16] {
        for hv in [32, 16, 8] {
            for hidden in [HIDDEN, 1000, 999] {
                case::<bf16>(&k, &gemm, &mut rng, t, hv, hidden);
                case::<f16>(&k, &gemm, &mut rng, t, hv, hidden);
                case::<f32>(&k, &gemm, &mut rng, t, hv, hidden);
            }
        }
    }
}

/// No rows: nothing launched. Projection buffers of the wrong length and a zero width are
/// refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_conv_gates_proj_errors() {
    let k = gpu("cuda_gdn_conv_gates_proj_errors");
    let mut rng = Rng::new(0xbb);
    let d = Geom::new(2, 8, 64);
    let inp = Inputs::new::<bf16>(&mut rng, d);
    let dev = Dev::<bf16>::new(&k, &inp, &spans_for(2));
    let win = CONV_K - 1 + SPEC;
    let x = up::<bf16>(&k, &inp.x);
    let call = |t: usize, x: &CudaSlice<bf16>, w: &CudaSlice<bf16>, hidden: usize| {
        let mut window = up::<f32>(&k, &inp.window);
        let (mut out, mut g, mut beta) = (poisoned(&k, t * d.c), poisoned(&k, t * d.hv), poisoned(&k, t * d.hv));
        let p = dev.p.slice(0..t * d.stride);
        k.gdn_conv_gates_proj_seq::<bf16>(
            &p,
            d.stride,
            GateProj { x, w, hidden },
            &dev.conv_w,
            &dev.a_log,
            &dev.dt_bias,
            &mut window,
            &dev.spans,
            &mut out,
            &mut g,
            &mut beta,
            t,
            dev.n_spans,
            d.c,
            CONV_K,
            win,
            SLOTS,
            d.hv,
        )
    };
    let empty = up::<bf16>(&k, &[]);
    assert!(call(0, &empty, &dev.w, d.hidden).is_ok(), "no rows");
    assert!(call(2, &x, &dev.w, d.hidden).is_ok());
    let short_w = up::<bf16>(&k, &inp.w[..inp.w.len() - 1]);
    assert!(call(2, &x, &short_w, d.hidden).is_err(), "w too short");
    assert!(call(2, &dev.w, &dev.w, d.hidden).is_err(), "x of the wrong length");
    assert!(call(2, &empty, &empty, 0).is_err(), "hidden 0");
}

/// GPU time of the two forms at the Qwen3-Next-80B sizes (bf16, 32 value heads, hidden 2048,
/// the conv over 8,192 channels): the fused launch against the GEMV (the model's decode GEMV
/// at ≤ 4 rows; beyond, the apart path's cuBLAS) followed by the conv + gates launch, back
/// to back as in a CUDA graph. Prints µs per step; asserts nothing about speed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_conv_gates_proj_timed() {
    let k = gpu("cuda_gdn_conv_gates_proj_timed");
    let gemm = Gemm::new(&k).expect("cuBLAS");
    let mut rng = Rng::new(0xbc);
    let mut hold = Hold::new(&k);
    let win = CONV_K - 1 + SPEC;
    for t in [1, 2, 4, 8, 16] {
        let d = Geom::new(t, LIN_HV, HIDDEN);
        let inp = Inputs::new::<bf16>(&mut rng, d);
        let spans: Vec<(usize, usize, usize)> = (0..t).map(|i| (1, i % SLOTS, 0)).collect();
        let dev = Dev::<bf16>::new(&k, &inp, &spans);
        let x = up::<bf16>(&k, &inp.x);
        let n = 2 * d.hv;
        let mut window = up::<f32>(&k, &inp.window);
        let mut ba = poisoned::<bf16>(&k, t * n);
        let (mut out, mut g, mut beta) = (poisoned(&k, t * d.c), poisoned(&k, t * d.hv), poisoned(&k, t * d.hv));
        let iters = 200;
        let fused = time_calls(&k, &mut hold, iters, &mut |_| {
            k.gdn_conv_gates_proj_seq::<bf16>(
                &dev.p,
                d.stride,
                GateProj { x: &x, w: &dev.w, hidden: d.hidden },
                &dev.conv_w,
                &dev.a_log,
                &dev.dt_bias,
                &mut window,
                &dev.spans,
                &mut out,
                &mut g,
                &mut beta,
                t,
                dev.n_spans,
                d.c,
                CONV_K,
                win,
                SLOTS,
                d.hv,
            )
            .expect("proj");
        });
        let apart = time_calls(&k, &mut hold, iters, &mut |_| {
            if t <= porter_kernels::cuda::GEMV_MAX_ROWS {
                k.gemv::<bf16, bf16>(&x, &dev.w, &mut ba, t, d.hidden, n).expect("gemv");
            } else {
                gemm.matmul_t::<bf16, bf16>(&x, &dev.w, &mut ba, t, d.hidden, n).expect("cublas");
            }
            k.gdn_conv_gates_seq::<bf16>(
                &dev.p,
                d.stride,
                Some(&ba),
                n,
                0,
                &dev.conv_w,
                &dev.a_log,
                &dev.dt_bias,
                &mut window,
                &dev.spans,
                &mut out,
                &mut g,
                &mut beta,
                t,
                dev.n_spans,
                d.c,
                CONV_K,
                win,
                SLOTS,
                d.hv,
            )
            .expect("conv gates");
        });
        println!("t = {t:2}: fused {:6.2} µs, apart (GEMV + conv/gates) {:6.2} µs", fused * 1e6, apart * 1e6);
    }
}
