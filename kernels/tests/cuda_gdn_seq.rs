//! The multi-token Gated DeltaNet kernels (`kernels/cuda/gdn_seq.cu`) against
//! the CPU reference (`porter_kernels::cpu::gdn`, run per span from the same
//! storage-rounded inputs): conv over spans with a rolling window (lag,
//! continuation across calls) fused with the gates from the `[b | a]`
//! projection (also bit for bit against the pre-fusion kernels of
//! tests/fixtures/gdn_conv_unfused.cu), the delta rule over spans (in place and
//! with per-token snapshots), and the Qwen3-Next-80B-A3B sizes (decode at batch
//! 1, 8 and 64, speculative verify, a 4k prefill), timed (fused vs old chain).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with
//! `--include-ignored`; without a GPU they then fail, saying so), the ptxas
//! check `#[ignore = "needs NVRTC ..."]`. Outputs are NaN-poisoned before every launch. The seed is printed; set
//! `PORTER_CUDA_SEED` to replay one.

mod common;

use common::gdn::*;
use common::*;
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::{bf16, f16};
use porter_kernels::cpu::gdn;
use porter_kernels::cuda::{self, CudaFloat, CudaKernels, DeltaNorm, KernelSource};
use std::time::Instant;

// ---------------------------------------------------------------------------
// NVRTC only: register use / spills of the delta-rule kernels (ptxas -v).
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_gdn_seq_ptxas_info() {
    let lines = ptxas_info("nvrtc_gdn_seq_ptxas_info", "gdn_seq.cu");
    for (func, line) in lines {
        println!("{func}: {line}");
    }
}

/// The baseline of the fused conv + gates kernel (tests/fixtures/gdn_conv_unfused.cu)
/// compiles, for sm_75 and sm_90, as the GPU tests compile it.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_gdn_conv_unfused_baseline() {
    need_nvrtc("nvrtc_gdn_conv_unfused_baseline");
    for arch in ["sm_75", "sm_90"] {
        cuda::compile_with(&UNFUSED, arch, false).unwrap_or_else(|e| panic!("{arch}: {e}"));
    }
}

// ---------------------------------------------------------------------------
// Conv + window update + gates (one launch), against the CPU and, bit for
// bit, against the pre-fusion kernels (tests/fixtures/gdn_conv_unfused.cu)
// ---------------------------------------------------------------------------

/// The slot of a [`SeqId::PAD`](porter_core) span (`batch::PAD`): out of range, so invalid.
const PAD: usize = u32::MAX as usize;
/// A "span" of this slot in a list is rows that no span covers (no table entry).
const GAP: usize = usize::MAX - 1;

/// One conv span: rows `row0..row0 + len` continue `slot` after rolling back `lag`.
#[derive(Clone, Copy, Debug)]
struct ConvSpan {
    row0: usize,
    len: usize,
    slot: usize,
    lag: usize,
}

/// The sizes of one conv + gates call: `x` is `[t, x_stride]` with the conv channels at
/// columns `0..c` and `[b | a]` at `ba_col..ba_col + 2·hv`.
#[derive(Clone, Copy, Debug)]
struct ConvGeom {
    c: usize,
    x_stride: usize,
    ba_col: usize,
    hv: usize,
    k: usize,
    win: usize,
    num_slots: usize,
}

/// CPU reference of the conv part of one `gdn_conv_gates_seq` call: returns the output
/// `[t, c]` (NaN outside valid spans) and updates `window` `[num_slots, c, win]`.
fn conv_ref(x: &[f32], geo: ConvGeom, w: &[f32], window: &mut [f32], spans: &[ConvSpan], t: usize) -> Vec<f32> {
    let ConvGeom { c, x_stride, k, win, num_slots, .. } = geo;
    let km1 = k - 1;
    let mut out = vec![f32::NAN; t * c];
    for s in spans {
        if s.slot >= num_slots || s.lag + km1 > win {
            continue; // invalid: NaN rows, window untouched
        }
        let h = win - s.lag;
        let wnd = &mut window[s.slot * c * win..(s.slot + 1) * c * win];
        let xs: Vec<f32> = (0..s.len).flat_map(|i| x[(s.row0 + i) * x_stride..][..c].to_vec()).collect();
        if s.len > 0 {
            let mut state = vec![0.0f32; c * km1];
            for ch in 0..c {
                for i in 0..km1 {
                    state[ch * km1 + i] = wnd[ch * win + h - km1 + i];
                }
            }
            let mut y = vec![0.0f32; s.len * c];
            gdn::causal_conv1d_prefill(&xs, w, None, &mut state, &mut y, s.len, c, k, porter_kernels::cpu::Act::Silu)
                .expect("cpu conv");
            out[s.row0 * c..(s.row0 + s.len) * c].copy_from_slice(&y);
        }
        for ch in 0..c {
            let u: Vec<f32> =
                wnd[ch * win..ch * win + h].iter().copied().chain((0..s.len).map(|i| xs[i * c + ch])).collect();
            for wi in 0..win {
                let j = u.len() as isize - win as isize + wi as isize;
                wnd[ch * win + wi] = if j < 0 { 0.0 } else { u[j as usize] };
            }
        }
    }
    out
}

/// CPU gates of every row of `x` (`[b | a]` at `ba_col`): `(g, beta)`, `[t, hv]` each.
fn gates_ref(x: &[f32], geo: ConvGeom, a_log: &[f32], dt_bias: &[f32], t: usize) -> (Vec<f32>, Vec<f32>) {
    let hv = geo.hv;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..t {
        let row = &x[r * geo.x_stride + geo.ba_col..][..2 * hv];
        b.extend_from_slice(&row[..hv]);
        a.extend_from_slice(&row[hv..]);
    }
    let (mut g, mut beta) = (vec![0.0; t * hv], vec![0.0; t * hv]);
    gdn::gdn_gates(&a, &b, a_log, dt_bias, &mut g, &mut beta).expect("cpu gates");
    (g, beta)
}

/// Spans from `(len, slot, lag)`, rows laid out consecutively ([`GAP`] entries are rows
/// outside every span); returns them and `t`.
fn conv_spans(list: &[(usize, usize, usize)]) -> (Vec<ConvSpan>, usize) {
    let mut row0 = 0;
    let mut spans = Vec::new();
    for &(len, slot, lag) in list {
        if slot != GAP {
            spans.push(ConvSpan { row0, len, slot, lag });
        }
        row0 += len;
    }
    (spans, row0)
}

fn conv_table(spans: &[ConvSpan]) -> Vec<u32> {
    spans.iter().flat_map(|s| [s.row0 as u32, s.len as u32, s.slot as u32, s.lag as u32]).collect()
}

/// Panics unless `got` is NaN exactly where `want` is (invalid spans' rows and rows that
/// no span covers stay NaN: written so, or poisoned and never written).
fn check_nan_rows(what: &str, got: &[f32], want: &[f32]) {
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g.is_nan() != w.is_nan()) {
        panic!("{what}: element {i} is {} where the reference has {}", got[i], want[i]);
    }
}

/// The device buffers of one conv + gates call.
struct ConvDev<T: CudaFloat> {
    x: CudaSlice<T>,
    w: CudaSlice<f32>,
    a_log: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
    spans: CudaSlice<u32>,
    /// The conv output, rounded to `T` (the old chain writes f32 to a buffer of its own).
    out: CudaSlice<T>,
    g: CudaSlice<f32>,
    beta: CudaSlice<f32>,
    t: usize,
    n_spans: usize,
}

impl<T: CudaFloat> ConvDev<T> {
    fn fused(&mut self, k: &CudaKernels, geo: ConvGeom, window: &mut CudaSlice<f32>) {
        let ConvGeom { c, x_stride, ba_col, hv, k: kk, win, num_slots } = geo;
        k.gdn_conv_gates_seq(
            &self.x,
            x_stride,
            None::<&CudaSlice<T>>,
            x_stride,
            ba_col,
            &self.w,
            &self.a_log,
            &self.dt_bias,
            window,
            &self.spans,
            &mut self.out,
            &mut self.g,
            &mut self.beta,
            self.t,
            self.n_spans,
            c,
            kk,
            win,
            num_slots,
            hv,
        )
        .expect("gdn_conv_gates_seq");
    }
}

/// The pre-fusion kernels (`gdn_conv_seq_<T>`, `gdn_conv_seq_window_<T>`, `gdn_gates_ba_<T>`),
/// compiled from tests/fixtures/gdn_conv_unfused.cu for this GPU: the baseline that
/// the fused kernel must equal bit for bit, and be faster than.
struct Unfused {
    conv: CudaFunction,
    window: CudaFunction,
    gates: CudaFunction,
}

static UNFUSED: KernelSource =
    KernelSource { name: "gdn_conv_unfused.cu", code: include_str!("fixtures/gdn_conv_unfused.cu") };

impl Unfused {
    fn new<T: CudaFloat>(k: &CudaKernels) -> Self {
        let ptx = cuda::compile_with(&UNFUSED, k.arch(), k.caps().fallback_build()).expect("compile the baseline");
        let m = k.context().load_module(ptx).expect("load the baseline");
        let f = |n: &str| m.load_function(&format!("{n}_{}", T::NAME)).expect("baseline function");
        Self { conv: f("gdn_conv_seq"), window: f("gdn_conv_seq_window"), gates: f("gdn_gates_ba") }
    }

    /// The three launches of the old chain, with the old launch shapes; its conv output (f32,
    /// unrounded) to `out`.
    fn run<T: CudaFloat>(
        &self,
        k: &CudaKernels,
        d: &mut ConvDev<T>,
        geo: ConvGeom,
        window: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) {
        let s = k.stream();
        let u = |v: usize| u32::try_from(v).expect("u32");
        let (t, ns, c) = (u(d.t), u(d.n_spans), u(geo.c));
        let (xs, kk, win, slots, hv) = (u(geo.x_stride), u(geo.k), u(geo.win), u(geo.num_slots), u(geo.hv));
        let cblocks = u(geo.c.div_ceil(256));
        let cfg = |grid: (u32, u32)| LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (px, _gx) = d.x.device_ptr(s);
        let (pw, _gw) = d.w.device_ptr(s);
        let (pwin, _gwin) = window.device_ptr_mut(s);
        let (psp, _gsp) = d.spans.device_ptr(s);
        let (pout, _gout) = out.device_ptr_mut(s);
        let (pl, _gl) = d.a_log.device_ptr(s);
        let (pd, _gd) = d.dt_bias.device_ptr(s);
        let (pg, _gg) = d.g.device_ptr_mut(s);
        let (pb, _gb) = d.beta.device_ptr_mut(s);
        let pba = px + (geo.ba_col * std::mem::size_of::<T>()) as u64;
        let n = (d.t * geo.hv) as u64;
        // SAFETY: the arguments match the fixture's kernels (the old wrappers' launches):
        // `gdn_conv_seq_<T>(x, x_stride, w, window, spans, out, t, n_spans, c, k, win, num_slots)`,
        // `gdn_conv_seq_window_<T>(x, x_stride, window, spans, t, c, k, win, num_slots)`,
        // `gdn_gates_ba_<T>(ba, a_log, dt_bias, g, beta, n, hv, stride)`; the buffers are the
        // ones the fused call checked.
        unsafe {
            let mut b = s.launch_builder(&self.conv);
            b.arg(&px).arg(&xs).arg(&pw).arg(&pwin).arg(&psp).arg(&pout);
            b.arg(&t).arg(&ns).arg(&c).arg(&kk).arg(&win).arg(&slots);
            b.launch(cfg((t.div_ceil(16), cblocks))).expect("baseline conv");
            if win > 0 && ns > 0 {
                let mut b = s.launch_builder(&self.window);
                b.arg(&px).arg(&xs).arg(&pwin).arg(&psp).arg(&t).arg(&c).arg(&kk).arg(&win).arg(&slots);
                b.launch(cfg((cblocks, ns))).expect("baseline window");
            }
            let mut b = s.launch_builder(&self.gates);
            b.arg(&pba).arg(&pl).arg(&pd).arg(&pg).arg(&pb).arg(&n).arg(&hv).arg(&xs);
            b.launch(cfg((u((d.t * geo.hv).div_ceil(256)).max(1), 1))).expect("baseline gates");
        }
    }
}

/// One call: the fused kernel against the CPU (conv output, window, gates) and, bit for
/// bit, against the old chain run on the same window (its f32 conv output rounded to `T`,
/// and that f32 output against the CPU at the f32 tolerance).
#[allow(clippy::too_many_arguments)]
fn conv_call<T: CudaFloat>(
    k: &CudaKernels,
    base: &Unfused,
    rng: &mut Rng,
    list: &[(usize, usize, usize)],
    geo: ConvGeom,
    w: &[f32],
    gates_w: (&[f32], &[f32]),
    window: &mut [f32],
    dwin: &mut CudaSlice<f32>,
) {
    let (spans, t) = conv_spans(list);
    let x = rnd_vec::<T>(&rng.vec(t * geo.x_stride, 2.0));
    let mut dwin_old = up::<f32>(k, &down(k, dwin));
    let want = conv_ref(&x, geo, w, window, &spans, t);
    let (want_g, want_beta) = gates_ref(&x, geo, gates_w.0, gates_w.1, t);
    let mut d = ConvDev::<T> {
        x: up::<T>(k, &x),
        w: up::<f32>(k, w),
        a_log: up::<f32>(k, gates_w.0),
        dt_bias: up::<f32>(k, gates_w.1),
        spans: up_u32(k, &conv_table(&spans)),
        out: poisoned::<T>(k, t * geo.c),
        g: poisoned::<f32>(k, t * geo.hv),
        beta: poisoned::<f32>(k, t * geo.hv),
        t,
        n_spans: spans.len(),
    };
    d.fused(k, geo, dwin);
    let what = format!("conv_gates_seq {} {geo:?} spans {list:?}", T::NAME);
    let (out, g, beta, win) = (down(k, &d.out), down(k, &d.g), down(k, &d.beta), down(k, dwin));
    check_nan_rows(&format!("{what}: out"), &out, &want);
    check(&format!("{what}: out"), &out, &want, tol::<T>());
    check(&format!("{what}: window"), &win, window, 0.0);
    check(&format!("{what}: g"), &g, &want_g, TOL_F32);
    check(&format!("{what}: beta"), &beta, &want_beta, TOL_F32);
    // The old chain on the window as it was, into fresh poisoned outputs.
    let mut old_out = poisoned::<f32>(k, t * geo.c);
    (d.g, d.beta) = (poisoned::<f32>(k, t * geo.hv), poisoned::<f32>(k, t * geo.hv));
    base.run(k, &mut d, geo, &mut dwin_old, &mut old_out);
    let old_out = down(k, &old_out);
    check(&format!("{what}: old chain out (f32)"), &old_out, &want, TOL_F32);
    check_bits(&format!("{what}: out vs the old chain rounded"), &out, &rnd_vec::<T>(&old_out));
    check_bits(&format!("{what}: window vs the old chain"), &win, &down(k, &dwin_old));
    check_bits(&format!("{what}: g vs the old chain"), &g, &down(k, &d.g));
    check_bits(&format!("{what}: beta vs the old chain"), &beta, &down(k, &d.beta));
}

/// Calls that continue the same windows: decode spans, speculative verify spans (2–4 rows)
/// with lags, long prefill spans (more rows per block; spans whose window rows cross a
/// tile), a span shorter than its lag, an empty span with a lag, the PAD slot, a lag too
/// large for the window, and rows outside every span.
#[allow(clippy::too_many_arguments)]
fn conv_case<T: CudaFloat>(
    k: &CudaKernels,
    base: &Unfused,
    rng: &mut Rng,
    c: usize,
    extra: usize,
    kk: usize,
    spec: usize,
    hv: usize,
) {
    let win = kk - 1 + spec;
    let ba_col = c + extra;
    let geo = ConvGeom { c, x_stride: ba_col + 2 * hv, ba_col, hv, k: kk, win, num_slots: 6 };
    let w = rng.vec(c * kk, 0.5);
    let mut a_log = rng.vec(hv, 2.0);
    a_log[0] = 3.0;
    let mut dt_bias = rng.vec(hv, 2.0);
    dt_bias[hv - 1] = 25.0; // softplus above its threshold
    let mut window = rng.vec(geo.num_slots * c * win, 1.0);
    let mut dwin = up::<f32>(k, &window);
    let lag = |l: usize| l.min(spec);
    let calls: [&[(usize, usize, usize)]; 6] = [
        &[(1, 2, 0), (37, 0, lag(2)), (1, 5, lag(1)), (300, 3, lag(spec)), (2, 4, 0)],
        &[(3, 0, lag(1)), (1, 2, lag(spec)), (1, 3, 0), (2, 5, lag(3)), (1, 4, lag(2)), (1, 1, 0)],
        // Verify spans of 2–4 rows after rolled-back drafts, a PAD span, a gap, a lag
        // past the window, an empty span that only rolls its window back.
        &[(4, 1, lag(3)), (2, PAD, 0), (3, 0, lag(1)), (2, GAP, 0), (2, 2, spec + 1), (0, 3, lag(2)), (4, 4, 0)],
        &[(999, 1, lag(1)), (2, 0, 0)],
        &[(4094, 2, lag(2)), (4, 5, lag(1)), (3, PAD, 0), (5, 0, 0), (0, 1, 0)],
        &[(1, 0, 0), (1, 1, 0), (1, 2, 0), (1, 3, 0), (1, 4, 0), (1, 5, 0), (1, PAD, 0)],
    ];
    for list in calls {
        conv_call::<T>(k, base, rng, list, geo, &w, (&a_log, &dt_bias), &mut window, &mut dwin);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_conv_gates_seq() {
    let k = gpu("cuda_gdn_conv_gates_seq");
    let mut rng = Rng::new(101);
    conv_case::<f32>(&k, &Unfused::new::<f32>(&k), &mut rng, 300, 33, CONV_K, 3, LIN_HV);
    let base = Unfused::new::<bf16>(&k);
    conv_case::<bf16>(&k, &base, &mut rng, 300, 0, CONV_K, 0, 5);
    conv_case::<f16>(&k, &Unfused::new::<f16>(&k), &mut rng, 129, 71, 2, 4, 3);
    conv_case::<bf16>(&k, &base, &mut rng, 2 * LIN_HK * LIN_D + LIN_HV * LIN_D, LIN_HV * LIN_D, CONV_K, 3, LIN_HV);
    // k = 1: no window rows; the window (spec entries) is still rolled.
    conv_case::<f32>(&k, &Unfused::new::<f32>(&k), &mut rng, 40, 0, 1, 2, 2);
}

/// `gdn_window_at` (prefix-cache checkpoints inside a prefill span) writes, bit for bit, the
/// window `gdn_conv_gates_seq` leaves in a slot after a span of `cut` rows: cuts shorter than
/// the window (history read, with lags) and past it; the window it reads is left alone, and
/// a save with an out-of-range slot gets NaN windows.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_window_at_equals_the_window_after_cut_rows() {
    let k = gpu("cuda_gdn_window_at_equals_the_window_after_cut_rows");
    let mut rng = Rng::new(303);
    window_at_case::<f32>(&k, &mut rng, 300, CONV_K, 3);
    window_at_case::<bf16>(&k, &mut rng, 2 * LIN_HK * LIN_D + LIN_HV * LIN_D, CONV_K, 0);
    window_at_case::<f16>(&k, &mut rng, 129, 2, 4);
}

fn window_at_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, c: usize, kk: usize, spec: usize) {
    let win = kk - 1 + spec;
    let (hv, num_slots, t) = (2, 4, 300);
    let ba_col = c + 5;
    let x_stride = ba_col + 2 * hv;
    let x = rnd_vec::<T>(&rng.vec(t * x_stride, 2.0));
    let window = rng.vec(num_slots * c * win, 1.0);
    // (row0, cut, slot, lag)
    let saves = [(0, 1, 0, 0), (5, 2, 1, spec.min(2)), (10, 64, 2, spec), (100, 200, 3, 0), (0, win + 1, 1, 0)];
    let mut table = Vec::new();
    for (d, &(row0, cut, slot, lag)) in saves.iter().enumerate() {
        table.extend([row0, cut, slot, lag, d].map(|v: usize| v as u32));
    }
    table.extend([0, 3, num_slots as u32, 0, saves.len() as u32]); // an out-of-range slot
    let nd = saves.len() + 1;
    let (dx, dwin) = (up::<T>(k, &x), up::<f32>(k, &window));
    let mut dst = poisoned::<f32>(k, nd * c * win);
    k.gdn_window_at::<T>(&dx, x_stride, &dwin, &up_u32(k, &table), &mut dst, t, nd, c, win, num_slots, nd)
        .expect("gdn_window_at");
    let got = down(k, &dst);
    check_bits(&format!("window_at {}: the windows read", T::NAME), &down(k, &dwin), &window);
    let w = up::<f32>(k, &rng.vec(c * kk, 0.5));
    let (a_log, dt_bias) = (up::<f32>(k, &rng.vec(hv, 1.0)), up::<f32>(k, &rng.vec(hv, 1.0)));
    for (d, &(row0, cut, slot, lag)) in saves.iter().enumerate() {
        let mut wnd = up::<f32>(k, &window);
        let (mut out, mut g, mut beta) =
            (poisoned::<T>(k, t * c), poisoned::<f32>(k, t * hv), poisoned::<f32>(k, t * hv));
        let span = up_u32(k, &[row0 as u32, cut as u32, slot as u32, lag as u32]);
        k.gdn_conv_gates_seq(
            &dx,
            x_stride,
            None::<&CudaSlice<T>>,
            x_stride,
            ba_col,
            &w,
            &a_log,
            &dt_bias,
            &mut wnd,
            &span,
            &mut out,
            &mut g,
            &mut beta,
            t,
            1,
            c,
            kk,
            win,
            num_slots,
            hv,
        )
        .expect("gdn_conv_gates_seq");
        let after = down(k, &wnd);
        check_bits(
            &format!("window_at {} save {d} (row0 {row0}, cut {cut}, slot {slot}, lag {lag})", T::NAME),
            &got[d * c * win..(d + 1) * c * win],
            &after[slot * c * win..(slot + 1) * c * win],
        );
    }
    assert!(got[saves.len() * c * win..].iter().all(|v| v.is_nan()), "an out-of-range slot gives NaN windows");
}

// ---------------------------------------------------------------------------
// Delta rule over spans
// ---------------------------------------------------------------------------

/// CPU reference of one `gdn_delta_seq` call; updates `state`
/// `[num_slots, nbuf, hv, dk, dv]` and returns the output `[t, hv, dv]` (f32).
fn delta_ref(
    d: GdnDims,
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    spans: &[DeltaSpan],
    nbuf: usize,
) -> Vec<f32> {
    let (hk, hv, dk, dv, sl) = (d.hk, d.hv, d.dk, d.dv, d.state());
    gdn_ref(d, qkv, g, beta, state, spans, nbuf, |sp, slot_s, o| {
        let (src, len) = (sp.src, sp.len);
        let mut st = slot_s[src * sl..(src + 1) * sl].to_vec();
        if sp.snapshot {
            for i in 0..len {
                gdn::recurrent_gated_delta_rule(
                    &sp.q[i * hk * dk..(i + 1) * hk * dk],
                    &sp.k[i * hk * dk..(i + 1) * hk * dk],
                    &sp.v[i * hv * dv..(i + 1) * hv * dv],
                    &sp.g[i * hv..(i + 1) * hv],
                    &sp.beta[i * hv..(i + 1) * hv],
                    &mut st,
                    &mut o[i * hv * dv..(i + 1) * hv * dv],
                    1,
                    hk,
                    hv,
                    dk,
                    dv,
                )
                .expect("cpu recurrence");
                slot_s[i * sl..(i + 1) * sl].copy_from_slice(&st);
            }
        } else {
            gdn::recurrent_gated_delta_rule(&sp.q, &sp.k, &sp.v, sp.g, sp.beta, &mut st, o, len, hk, hv, dk, dv)
                .expect("cpu recurrence");
            slot_s[src * sl..(src + 1) * sl].copy_from_slice(&st);
        }
    })
}

/// Runs `calls` consecutive `gdn_delta_seq` calls (the state carries over) and
/// compares outputs and the whole state pool with the CPU after each.
fn delta_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    d: GdnDims,
    num_slots: usize,
    nbuf: usize,
    calls: &[&[DeltaSpan]],
) {
    let sl = d.state();
    let mut state = rng.vec(num_slots * nbuf * sl, 0.5);
    let mut dstate = up::<f32>(k, &state);
    for (ci, spans) in calls.iter().enumerate() {
        let (flat, t, max_len) = span_table(spans.iter().copied());
        let (qkv, g, beta) = gdn_inputs(rng, d, t);
        // The conv output comes in the activation type: the reference sees the rounded values.
        let qkv = rnd_vec::<T>(&qkv);
        let want: Vec<f32> = rnd_vec::<T>(&delta_ref(d, &qkv, &g, &beta, &mut state, spans, nbuf));
        let (dq, dg, db, dsp) = (up::<T>(k, &qkv), up::<f32>(k, &g), up::<f32>(k, &beta), up_u32(k, &flat));
        let mut out = poisoned::<T>(k, t * d.hv * d.dv);
        let dstate_0 = k.stream().clone_dtod(&dstate).expect("dtod");
        let n = spans.len();
        let run = |st: &mut CudaSlice<f32>, o: &mut CudaSlice<T>, nz: Option<DeltaNorm<'_, T>>| {
            k.gdn_delta_seq(&dq, &dg, &db, st, &dsp, o, t, n, max_len, d.hk, d.hv, d.dk, d.dv, num_slots, nbuf, nz)
        };
        run(&mut dstate, &mut out, None).expect("gdn_delta_seq");
        let what = format!("delta_seq {} {d:?} call {ci} spans {spans:?}", T::NAME);
        check(&format!("{what}: out"), &down(k, &out), &want, tol::<T>());
        check(&format!("{what}: state"), &down(k, &dstate), &state, TOL_F32);
        // The gated norm taken into the launch: its rows are gated_norm_z's of the output, bit
        // for bit; the output and the state are the plain launch's; the counters end at zero.
        let (zoff, pw) = (3, 3 + d.hv * d.dv + 5);
        let (dz, dw) = (up::<T>(k, &rng.vec(t * pw, 2.0)), up::<T>(k, &rng.vec(d.dv, 1.0)));
        for whole_head in [false, true] {
            let mut dstate_n = k.stream().clone_dtod(&dstate_0).expect("dtod");
            let (mut out_n, mut normed) = (poisoned::<T>(k, t * d.hv * d.dv), poisoned::<T>(k, t * d.hv * d.dv));
            let mut counters = up_u32(k, &vec![0; spans.len() * d.hv + 3]);
            let norm = DeltaNorm {
                whole_head,
                z: &dz,
                z_stride: pw,
                zoff,
                w: &dw,
                eps: 1e-6,
                out: &mut normed,
                counters: &mut counters,
            };
            run(&mut dstate_n, &mut out_n, Some(norm)).expect("gdn_delta_seq with the norm");
            // Bits, every NaN as one (rows outside every span keep their poison, a refused span's
            // rows are NaN in both, with different payloads).
            let bits = |v: Vec<f32>| {
                v.into_iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>()
            };
            // The column-block form takes the plain launch's lanes: its output and state are
            // the plain launch's bits. The whole-head form takes its own lanes (another sum
            // order): within tolerance of the CPU.
            let w = format!("{what} (whole head {whole_head})");
            if whole_head {
                check(&format!("{w}: out"), &down(k, &out_n), &want, tol::<T>());
                check(&format!("{w}: state"), &down(k, &dstate_n), &state, TOL_F32);
            } else {
                assert_eq!(bits(down(k, &out_n)), bits(down(k, &out)), "{w}: output with the norm taken in");
                assert_eq!(bits(down(k, &dstate_n)), bits(down(k, &dstate)), "{w}: state with the norm taken in");
            }
            // The normed rows are gated_norm_z's of the launch's own output, bit for bit.
            let mut want_n = poisoned::<T>(k, t * d.hv * d.dv);
            k.gated_norm_z::<T>(&out_n, &dz, &dw, &mut want_n, t, d.hv, d.dv, pw, zoff, 1e-6).expect("gated_norm_z");
            assert_eq!(bits(down(k, &normed)), bits(down(k, &want_n)), "{w}: normed rows against gated_norm_z");
            assert!(
                down_u32(k, &counters).iter().all(|&c| c == 0),
                "{what} (whole head {whole_head}): counters left non-zero"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_delta_seq_in_place() {
    let k = gpu("cuda_gdn_delta_seq_in_place");
    let mut rng = Rng::new(103);
    let small = GdnDims { hk: 2, hv: 4, dk: 32, dv: 48 };
    let calls: [&[DeltaSpan]; 2] = [
        &[(1, 0, 0, false), (37, 2, 1, false), (5, 3, 0, false), (1, 1, 1, false)],
        &[(20, 2, 1, false), (1, 0, 0, false), (1, 1, 0, false)],
    ];
    delta_case::<f32>(&k, &mut rng, small, 4, 2, &calls);
    delta_case::<bf16>(&k, &mut rng, small, 4, 2, &calls);
    // Odd head dims (rows beyond dk and columns beyond dv in the blocks), dk > 128.
    delta_case::<f16>(
        &k,
        &mut rng,
        GdnDims { hk: 1, hv: 3, dk: 200, dv: 70 },
        3,
        1,
        &[&[(9, 1, 0, false), (3, 0, 0, false)]],
    );
    delta_case::<f32>(&k, &mut rng, GdnDims { hk: 3, hv: 3, dk: 256, dv: 33 }, 2, 1, &[&[(40, 1, 0, false)]]);
    delta_case::<f32>(
        &k,
        &mut rng,
        GdnDims { hk: 2, hv: 2, dk: 5, dv: 7 },
        2,
        1,
        &[&[(3, 0, 0, false), (17, 1, 0, false)]],
    );
    // The real dims, a few sequences of mixed lengths, continuing.
    let real = GdnDims { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D };
    // (5 sequences: 2 lanes per state column, 64 rows each.)
    let calls: [&[DeltaSpan]; 2] = [
        &[(1, 0, 0, false), (70, 1, 0, false), (3, 2, 0, false), (1, 3, 0, false), (2, 4, 0, false)],
        &[(1, 1, 0, false), (2, 0, 0, false), (1, 4, 0, false), (1, 3, 0, false), (1, 2, 0, false)],
    ];
    delta_case::<bf16>(&k, &mut rng, real, 5, 1, &calls);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_delta_seq_snapshots() {
    let k = gpu("cuda_gdn_delta_seq_snapshots");
    let mut rng = Rng::new(104);
    let small = GdnDims { hk: 2, hv: 4, dk: 32, dv: 48 };
    // src_buf among the written buffers (0..len), beyond them, and a plain span in the same call.
    let calls: [&[DeltaSpan]; 3] = [
        &[(4, 0, 2, true), (1, 1, 3, true), (3, 2, 3, true), (6, 3, 1, false)],
        &[(4, 0, 3, true), (2, 1, 0, true), (4, 2, 0, true), (1, 3, 1, true)],
        &[(1, 0, 3, false), (4, 1, 1, true)],
    ];
    delta_case::<f32>(&k, &mut rng, small, 4, 4, &calls);
    delta_case::<bf16>(&k, &mut rng, small, 4, 4, &calls);
    let real = GdnDims { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D };
    let calls: [&[DeltaSpan]; 2] = [&[(4, 0, 1, true), (3, 1, 0, true)], &[(2, 0, 3, true), (4, 1, 2, true)]];
    delta_case::<bf16>(&k, &mut rng, real, 2, 4, &calls);
}

// ---------------------------------------------------------------------------
// Qwen3-Next-80B-A3B sizes, timed
// ---------------------------------------------------------------------------

/// Mean time of `f` over `iters` runs after one warm-up, in µs.
fn time_us(k: &CudaKernels, iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    k.stream().synchronize().expect("sync");
    let t0 = Instant::now();
    for _ in 0..iters {
        f();
    }
    k.stream().synchronize().expect("sync");
    t0.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// One call of the full GDN sequence path at the 80B dims (conv + window + gates over the
/// in_proj rows `[q | k | v | z | b | a]` in one launch, then the delta rule), checked
/// against the CPU and the old chain, then timed (the fused launch vs the old three).
/// `nbuf > 1`: speculative verify (snapshot spans, a window of `k − 1 + nbuf − 1`).
fn real_case<T: CudaFloat>(
    k: &CudaKernels,
    base: &Unfused,
    rng: &mut Rng,
    spans: &[DeltaSpan],
    num_slots: usize,
    nbuf: usize,
) {
    let d = GdnDims { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D };
    let (c, hv) = (d.width(), d.hv);
    let ba_col = c + hv * d.dv;
    let geo = ConvGeom { c, x_stride: ba_col + 2 * hv, ba_col, hv, k: CONV_K, win: CONV_K - 2 + nbuf, num_slots };
    let (flat, t, max_len) = span_table(spans.iter().copied());
    let n = spans.len();
    let label = format!("80B {} t {t} spans {n} max_len {max_len} nbuf {nbuf}", T::NAME);

    // Conv + gates.
    let cspans: Vec<ConvSpan> = {
        let mut r = 0;
        spans
            .iter()
            .map(|s| {
                let cs = ConvSpan { row0: r, len: s.0, slot: s.1, lag: (nbuf - 1).min(1) };
                r += s.0;
                cs
            })
            .collect()
    };
    let x = rnd_vec::<T>(&rng.vec(t * geo.x_stride, 2.0));
    let w = rng.vec(c * CONV_K, 0.5);
    let (a_log, dt_bias) = (rng.vec(hv, 1.0), rng.vec(hv, 1.0));
    let mut window = rng.vec(num_slots * c * geo.win, 1.0);
    let mut dwin = up::<f32>(k, &window);
    let mut dwin_old = up::<f32>(k, &window);
    let want_y = conv_ref(&x, geo, &w, &mut window, &cspans, t);
    let (want_g, want_beta) = gates_ref(&x, geo, &a_log, &dt_bias, t);
    let mut cd = ConvDev::<T> {
        x: up::<T>(k, &x),
        w: up::<f32>(k, &w),
        a_log: up::<f32>(k, &a_log),
        dt_bias: up::<f32>(k, &dt_bias),
        spans: up_u32(k, &conv_table(&cspans)),
        out: poisoned::<T>(k, t * c),
        g: poisoned::<f32>(k, t * hv),
        beta: poisoned::<f32>(k, t * hv),
        t,
        n_spans: n,
    };
    cd.fused(k, geo, &mut dwin);
    let (y, g, beta) = (down(k, &cd.out), down(k, &cd.g), down(k, &cd.beta));
    check(&format!("{label}: conv"), &y, &want_y, tol::<T>());
    check(&format!("{label}: conv window"), &down(k, &dwin), &window, 0.0);
    check(&format!("{label}: g"), &g, &want_g, TOL_F32);
    check(&format!("{label}: beta"), &beta, &want_beta, TOL_F32);
    let mut old = ConvDev::<T> {
        x: cd.x.clone(),
        w: cd.w.clone(),
        a_log: cd.a_log.clone(),
        dt_bias: cd.dt_bias.clone(),
        spans: cd.spans.clone(),
        out: poisoned::<T>(k, t * c),
        g: poisoned::<f32>(k, t * hv),
        beta: poisoned::<f32>(k, t * hv),
        t,
        n_spans: n,
    };
    let mut old_out = poisoned::<f32>(k, t * c);
    base.run(k, &mut old, geo, &mut dwin_old, &mut old_out);
    let old_y = down(k, &old_out);
    check(&format!("{label}: old chain conv (f32)"), &old_y, &want_y, TOL_F32);
    check_bits(&format!("{label}: conv vs the old chain rounded"), &y, &rnd_vec::<T>(&old_y));
    check_bits(&format!("{label}: window vs the old chain"), &down(k, &dwin), &down(k, &dwin_old));
    check_bits(&format!("{label}: g vs the old chain"), &g, &down(k, &old.g));
    check_bits(&format!("{label}: beta vs the old chain"), &beta, &down(k, &old.beta));

    // Delta rule on the GPU's conv output and gates.
    let mut state = rng.vec(num_slots * nbuf * d.state(), 0.5);
    let mut dstate = up::<f32>(k, &state);
    let dsp = up_u32(k, &flat);
    let mut out = poisoned::<T>(k, t * hv * d.dv);
    let delta = |out: &mut CudaSlice<T>, dstate: &mut CudaSlice<f32>| {
        k.gdn_delta_seq(
            &cd.out, &cd.g, &cd.beta, dstate, &dsp, out, t, n, max_len, d.hk, hv, d.dk, d.dv, num_slots, nbuf, None,
        )
        .expect("delta")
    };
    delta(&mut out, &mut dstate);
    let got = down(k, &out);
    let got_state = down(k, &dstate);
    let t0 = Instant::now();
    let want = rnd_vec::<T>(&delta_ref(d, &y, &g, &beta, &mut state, spans, nbuf));
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
    check(&format!("{label}: delta out"), &got, &want, tol::<T>());
    check(&format!("{label}: delta state"), &got_state, &state, TOL_F32);

    let iters = if t >= 1024 { 5 } else { 200 };
    let delta_us = time_us(k, iters, || delta(&mut out, &mut dstate));
    let fused_us = time_us(k, iters, || cd.fused(k, geo, &mut dwin));
    let old_us = time_us(k, iters, || base.run(k, &mut old, geo, &mut dwin_old, &mut old_out));
    let state_mb = (n * d.state() * 4 * 2) as f64 / 1e6;
    println!(
        "  {label}: conv+window+gates fused {fused_us:.1} µs (1 launch) vs old chain {old_us:.1} µs (3 launches): \
         {:.2}x; delta_seq {delta_us:.1} µs ({:.0} GB/s of state r+w; {:.1} µs/token), CPU ref {cpu_ms:.0} ms",
        old_us / fused_us,
        state_mb * 1e3 / delta_us,
        delta_us / max_len as f64,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_seq_80b_decode() {
    let k = gpu("cuda_gdn_seq_80b_decode");
    let mut rng = Rng::new(105);
    let base = Unfused::new::<bf16>(&k);
    real_case::<bf16>(&k, &base, &mut rng, &[(1, 3, 0, false)], 4, 1);
    let batch: Vec<DeltaSpan> = (0..64).map(|i| (1, (i * 7) % 64, 0, false)).collect();
    real_case::<bf16>(&k, &base, &mut rng, &batch[..8], 64, 1);
    real_case::<bf16>(&k, &base, &mut rng, &batch, 64, 1);
    real_case::<f32>(&k, &Unfused::new::<f32>(&k), &mut rng, &batch[..8], 64, 1);
    // Speculative verify: 4 tokens a sequence with per-token snapshots, batch 1 and 8.
    let verify: Vec<DeltaSpan> = (0..8).map(|i| (4, i, 0, true)).collect();
    real_case::<bf16>(&k, &base, &mut rng, &verify[..1], 8, 4);
    real_case::<bf16>(&k, &base, &mut rng, &verify, 8, 4);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_seq_80b_prefill() {
    let k = gpu("cuda_gdn_seq_80b_prefill");
    let mut rng = Rng::new(106);
    let base = Unfused::new::<bf16>(&k);
    real_case::<bf16>(&k, &base, &mut rng, &[(4096, 1, 0, false)], 2, 1);
    real_case::<bf16>(&k, &base, &mut rng, &[(1000, 0, 0, false), (3, 1, 0, false), (500, 2, 0, false)], 3, 1);
}
