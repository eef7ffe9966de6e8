//! The fused recurrent Gated DeltaNet step (`gdn_fused_step` in `kernels/cuda/gdn_seq.cu`:
//! conv + window update + gates + L2 norms + delta rule + gated RMSNorm · SiLU(z), one
//! launch) against the three-launch chain it replaces (`gdn_conv_gates_seq` →
//! `gdn_delta_seq` → `gated_norm_z`, each tested against the CPU reference in
//! `cuda_gdn_seq.rs` / `cuda_kernels.rs`), bit for bit: the normed output, the conv windows
//! and the whole state pool, over consecutive calls (decode, snapshot spans, lags, an empty
//! span that only rolls its window back, the PAD slot, invalid spans, rows outside every
//! span, value heads sharing a key head 1–3 ways), and that the key-head counters are back
//! at zero after every call. Then the Qwen3-Next-80B-A3B sizes, timed (fused vs chain).
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`);
//! the ptxas check `#[ignore = "needs NVRTC ..."]`. Outputs are NaN-poisoned before every
//! launch.

mod common;

use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cuda::{CudaFloat, CudaKernels, GdnFusedDims};
use std::time::Instant;

/// The slot of a PAD span (out of range: invalid).
const PAD: usize = u32::MAX as usize;

#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_gdn_fused_ptxas_info() {
    for (func, line) in ptxas_info("nvrtc_gdn_fused_ptxas_info", "gdn_seq.cu") {
        if !func.contains("gdn_fused_step") {
            continue;
        }
        println!("{func}: {line}");
        // The 80B shapes' kernels (dk 128: P = 8) in the model dtypes must not spill; the f32
        // instance at 1024 threads (64 registers) spills a few bytes (printed only).
        let spills = line
            .split(',')
            .find(|p| p.contains("bytes spill stores"))
            .and_then(|p| p.split_whitespace().next().and_then(|n| n.parse::<u32>().ok()))
            .unwrap_or(0);
        if func.starts_with("gdn_fused_step_p8_bf16") || func.starts_with("gdn_fused_step_p8_f16") {
            assert_eq!(spills, 0, "{func} spills: {line}");
        }
    }
}

/// One span of a fused call: `len` rows continuing `slot` after rolling back `lag`, the
/// state read from buffer `src`, per-token snapshots with `snap`.
#[derive(Clone, Copy, Debug)]
struct Span {
    len: usize,
    slot: usize,
    lag: usize,
    src: usize,
    snap: bool,
}

const fn sp(len: usize, slot: usize, lag: usize, src: usize, snap: bool) -> Span {
    Span { len, slot, lag, src, snap }
}

/// The sizes of one case.
#[derive(Clone, Copy, Debug)]
struct Geo {
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    k: usize,
    /// State buffers per slot; the window holds `k − 1 + nbuf − 1` entries.
    nbuf: usize,
    num_slots: usize,
    /// `[b | a]` in a tensor of its own (the FP8 model's `in_proj_ba`).
    ba_apart: bool,
}

impl Geo {
    fn conv(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }
    fn win(&self) -> usize {
        self.k - 1 + self.nbuf - 1
    }
    /// Columns of `x`: conv channels, z, and `[b | a]` unless apart.
    fn x_stride(&self) -> usize {
        self.conv() + self.hv * self.dv + if self.ba_apart { 0 } else { 2 * self.hv }
    }
}

/// The persistent device state of a case (windows, states, counters) and its weights.
struct Dev<T: CudaFloat> {
    w: CudaSlice<f32>,
    a_log: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
    nw: CudaSlice<T>,
    window: CudaSlice<f32>,
    state: CudaSlice<f32>,
    sync: CudaSlice<u32>,
}

/// The inputs of one call.
struct Call<T: CudaFloat> {
    x: CudaSlice<T>,
    ba: Option<CudaSlice<T>>,
    cspans: CudaSlice<u32>,
    dspans: CudaSlice<u32>,
    t: usize,
    n: usize,
    max_len: usize,
}

fn make_call<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, geo: Geo, spans: &[Span]) -> Call<T> {
    let (mut cs, mut ds, mut row0, mut max_len) = (Vec::new(), Vec::new(), 0usize, 0usize);
    for s in spans {
        let u = |v: usize| v as u32; // PAD is u32::MAX
        cs.extend_from_slice(&[u(row0), u(s.len), u(s.slot), u(s.lag)]);
        ds.extend_from_slice(&[u(row0), u(s.len), u(s.slot), u(s.src), u32::from(s.snap)]);
        row0 += s.len;
        max_len = max_len.max(s.len);
    }
    // Two rows past the spans: no span covers them.
    let t = row0 + 2;
    let x = rng.vec(t * geo.x_stride(), 2.0);
    let ba = geo.ba_apart.then(|| up::<T>(k, &rng.vec(t * 2 * geo.hv, 2.0)));
    Call { x: up::<T>(k, &x), ba, cspans: up_u32(k, &cs), dspans: up_u32(k, &ds), t, n: spans.len(), max_len }
}

fn dims(geo: Geo, c: &Call<impl CudaFloat>) -> GdnFusedDims {
    let ba_col = if geo.ba_apart { 0 } else { geo.conv() + geo.hv * geo.dv };
    GdnFusedDims {
        t: c.t,
        n_spans: c.n,
        x_stride: geo.x_stride(),
        ba_stride: if geo.ba_apart { 2 * geo.hv } else { geo.x_stride() },
        ba_col,
        zoff: geo.conv(),
        k: geo.k,
        win: geo.win(),
        num_slots: geo.num_slots,
        hk: geo.hk,
        hv: geo.hv,
        dk: geo.dk,
        dv: geo.dv,
        nbuf: geo.nbuf,
        eps: EPS,
    }
}

/// The fused step into `out`.
fn fused<T: CudaFloat>(k: &CudaKernels, geo: Geo, d: &mut Dev<T>, c: &Call<T>, out: &mut CudaSlice<T>) {
    k.gdn_fused_step::<T>(
        &c.x,
        c.ba.as_ref(),
        &d.w,
        &d.a_log,
        &d.dt_bias,
        &d.nw,
        &mut d.window,
        &mut d.sync,
        &c.cspans,
        &c.dspans,
        &mut d.state,
        out,
        dims(geo, c),
    )
    .expect("gdn_fused_step");
}

/// Scratch of the chain: conv output, gates, delta-rule output.
struct Scratch<T: CudaFloat> {
    qkv: CudaSlice<f32>,
    g: CudaSlice<f32>,
    beta: CudaSlice<f32>,
    o: CudaSlice<T>,
}

fn scratch<T: CudaFloat>(k: &CudaKernels, geo: Geo, t: usize) -> Scratch<T> {
    Scratch {
        qkv: poisoned::<f32>(k, t * geo.conv()),
        g: poisoned::<f32>(k, t * geo.hv),
        beta: poisoned::<f32>(k, t * geo.hv),
        o: poisoned::<T>(k, t * geo.hv * geo.dv),
    }
}

/// The three-launch chain into `out`.
fn chain<T: CudaFloat>(
    k: &CudaKernels,
    geo: Geo,
    d: &mut Dev<T>,
    c: &Call<T>,
    s: &mut Scratch<T>,
    out: &mut CudaSlice<T>,
) {
    let dm = dims(geo, c);
    k.gdn_conv_gates_seq::<T>(
        &c.x,
        dm.x_stride,
        c.ba.as_ref(),
        dm.ba_stride,
        dm.ba_col,
        &d.w,
        &d.a_log,
        &d.dt_bias,
        &mut d.window,
        &c.cspans,
        &mut s.qkv,
        &mut s.g,
        &mut s.beta,
        c.t,
        c.n,
        geo.conv(),
        geo.k,
        geo.win(),
        geo.num_slots,
        geo.hv,
    )
    .expect("gdn_conv_gates_seq");
    let (hk, hv, dk, dv) = (geo.hk, geo.hv, geo.dk, geo.dv);
    k.gdn_delta_seq::<T>(
        &s.qkv,
        &s.g,
        &s.beta,
        &mut d.state,
        &c.dspans,
        &mut s.o,
        c.t,
        c.n,
        c.max_len,
        hk,
        hv,
        dk,
        dv,
        geo.num_slots,
        geo.nbuf,
    )
    .expect("gdn_delta_seq");
    k.gated_norm_z::<T>(&s.o, &c.x, &d.nw, out, c.t, hv, dv, dm.x_stride, geo.conv(), EPS).expect("gated_norm_z");
}

fn new_dev<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, geo: Geo) -> (Dev<T>, Vec<f32>, Vec<f32>) {
    let mut a_log = rng.vec(geo.hv, 2.0);
    a_log[0] = 3.0;
    let mut dt_bias = rng.vec(geo.hv, 2.0);
    dt_bias[geo.hv - 1] = 25.0; // softplus above its threshold
    let window = rng.vec(geo.num_slots * geo.conv() * geo.win(), 1.0);
    let state = rng.vec(geo.num_slots * geo.nbuf * geo.hv * geo.dk * geo.dv, 0.5);
    let d = Dev {
        w: up::<f32>(k, &rng.vec(geo.conv() * geo.k, 0.5)),
        a_log: up::<f32>(k, &a_log),
        dt_bias: up::<f32>(k, &dt_bias),
        nw: up::<T>(k, &rng.vec(geo.dv, 1.0).iter().map(|v| 1.0 + v).collect::<Vec<_>>()),
        window: up::<f32>(k, &window),
        state: up::<f32>(k, &state),
        sync: up_u32(k, &vec![0; geo.num_slots * geo.hk]),
    };
    (d, window, state)
}

fn twin<T: CudaFloat>(k: &CudaKernels, d: &Dev<T>) -> Dev<T> {
    Dev {
        w: d.w.clone(),
        a_log: d.a_log.clone(),
        dt_bias: d.dt_bias.clone(),
        nw: d.nw.clone(),
        window: up::<f32>(k, &down(k, &d.window)),
        state: up::<f32>(k, &down(k, &d.state)),
        sync: up_u32(k, &down_u32(k, &d.sync)),
    }
}

/// Panics unless `got` and `want` are the same bits (NaN matching NaN).
fn check_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad = |(g, w): (&f32, &f32)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan());
    let diff = got.iter().zip(want).filter(|&p| bad(p)).count();
    if let Some(i) = got.iter().zip(want).position(bad) {
        panic!("{what}: {diff} of {} elements differ in bits, first {i}: {} vs {}", got.len(), got[i], want[i]);
    }
}

/// Runs `calls` consecutively on the fused kernel and on the chain (each on its own copy
/// of the windows and states) and compares them bit for bit after each call.
fn case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, geo: Geo, calls: &[&[Span]]) {
    let (mut df, _, _) = new_dev::<T>(k, rng, geo);
    let mut dc = twin(k, &df);
    for (ci, spans) in calls.iter().enumerate() {
        let c = make_call::<T>(k, rng, geo, spans);
        let what = format!("gdn_fused_step {} {geo:?} call {ci} spans {spans:?}", T::NAME);
        let n_out = c.t * geo.hv * geo.dv;
        let (mut of, mut oc) = (poisoned::<T>(k, n_out), poisoned::<T>(k, n_out));
        fused(k, geo, &mut df, &c, &mut of);
        let mut s = scratch::<T>(k, geo, c.t);
        chain(k, geo, &mut dc, &c, &mut s, &mut oc);
        check_bits(&format!("{what}: out"), &down(k, &of), &down(k, &oc));
        check_bits(&format!("{what}: window"), &down(k, &df.window), &down(k, &dc.window));
        check_bits(&format!("{what}: state"), &down(k, &df.state), &down(k, &dc.state));
        assert!(down_u32(k, &df.sync).iter().all(|&v| v == 0), "{what}: counters not back at 0");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_fused_step_vs_chain() {
    let k = gpu("cuda_gdn_fused_step_vs_chain");
    let mut rng = Rng::new(201);
    // Decode and longer plain spans (tiles of 8 tokens), snapshot spans with src among the
    // written buffers and beyond, lags, an empty span that only rolls back, PAD, a src out
    // of range (window updated, state alone), a lag too large (NaN conv rows into the
    // state of slot 5, which no later call reads).
    let geo = Geo { hk: 2, hv: 4, dk: 32, dv: 48, k: 4, nbuf: 4, num_slots: 6, ba_apart: false };
    let calls: [&[Span]; 4] = [
        &[sp(1, 0, 0, 0, false), sp(4, 1, 0, 2, true), sp(20, 2, 0, 1, false), sp(1, PAD, 0, 0, false)],
        &[sp(3, 0, 2, 0, true), sp(0, 1, 1, 0, false), sp(1, 2, 0, 1, false), sp(2, 3, 3, 0, true)],
        &[sp(4, 3, 1, 3, true), sp(1, 4, 0, 9, false), sp(2, PAD, 0, 0, true), sp(1, 5, 9, 0, false)],
        &[sp(1, 0, 0, 2, false), sp(1, 1, 0, 0, false), sp(1, 2, 0, 1, false), sp(1, 3, 0, 3, false)],
    ];
    case::<f32>(&k, &mut rng, geo, &calls);
    case::<bf16>(&k, &mut rng, geo, &calls);
    case::<bf16>(&k, &mut rng, Geo { ba_apart: true, ..geo }, &calls);
    // Three value heads a key head, odd dims (rows past dk, columns past dv), k = 2.
    let odd = Geo { hk: 1, hv: 3, dk: 20, dv: 70, k: 2, nbuf: 2, num_slots: 3, ba_apart: false };
    let calls: [&[Span]; 2] =
        [&[sp(1, 0, 0, 0, false), sp(9, 1, 0, 1, false), sp(2, 2, 1, 0, true)], &[sp(1, 2, 0, 1, false)]];
    case::<f16>(&k, &mut rng, odd, &calls);
    // One value head a key head, tiny dims, k = 1 (no window rows).
    let tiny = Geo { hk: 2, hv: 2, dk: 5, dv: 7, k: 1, nbuf: 1, num_slots: 2, ba_apart: false };
    case::<f32>(&k, &mut rng, tiny, &[&[sp(3, 0, 0, 0, false), sp(17, 1, 0, 0, false)]]);
    case::<f32>(&k, &mut rng, Geo { k: 4, ..tiny }, &[&[sp(1, 1, 0, 0, false), sp(1, 0, 0, 0, false)]]);
}

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

/// The 80B dims: checked bit for bit against the chain, then both timed.
fn real<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, spans: &[Span], num_slots: usize, nbuf: usize) {
    let geo = Geo { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D, k: CONV_K, nbuf, num_slots, ba_apart: false };
    case::<T>(k, rng, geo, &[spans]);
    let (mut d, _, _) = new_dev::<T>(k, rng, geo);
    let c = make_call::<T>(k, rng, geo, spans);
    let n_out = c.t * geo.hv * geo.dv;
    let mut out = poisoned::<T>(k, n_out);
    let mut s = scratch::<T>(k, geo, c.t);
    let iters = 500;
    let fused_us = time_us(k, iters, || fused(k, geo, &mut d, &c, &mut out));
    let chain_us = time_us(k, iters, || chain(k, geo, &mut d, &c, &mut s, &mut out));
    let snaps: usize = spans.iter().map(|s| if s.snap { s.len } else { 1 }).sum();
    let bytes = (spans.len() + snaps) * geo.hv * geo.dk * geo.dv * 4;
    println!(
        "  80B {} spans {} max_len {} nbuf {nbuf}: fused {fused_us:.1} µs (1 launch, {:.0} GB/s of state r+w) vs \
         chain {chain_us:.1} µs (3 launches): {:.2}x",
        T::NAME,
        spans.len(),
        c.max_len,
        bytes as f64 / fused_us / 1e3,
        chain_us / fused_us,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_fused_step_80b() {
    let k = gpu("cuda_gdn_fused_step_80b");
    let mut rng = Rng::new(202);
    for b in [1, 8, 64] {
        let spans: Vec<Span> = (0..b).map(|i| sp(1, (i * 7) % 64, 0, 0, false)).collect();
        real::<bf16>(&k, &mut rng, &spans, 64, 1);
    }
    // Speculative verify: 4 tokens a sequence with per-token snapshots, batch 1 and 8.
    for b in [1, 8] {
        let spans: Vec<Span> = (0..b).map(|i| sp(4, i, 1, 0, true)).collect();
        real::<bf16>(&k, &mut rng, &spans, 8, 4);
    }
}
