//! The fused Gated DeltaNet decode / verify kernel (`kernels/cuda/gdn_fused.cu`) against the
//! three launches it replaces — conv + gates (`gdn_conv_gates_seq`), the delta rule
//! (`gdn_delta_seq`) and the gated RMSNorm (`gated_norm_z`), each checked against the CPU
//! reference in `cuda_gdn_seq.rs` and `cuda_kernels.rs` — run on copies of the same windows
//! and states: outputs, windows, states and the counters after consecutive calls (decode,
//! verify with snapshots, rolled-back lags, an empty span that only rolls its window back,
//! PAD spans, the gate inputs apart), bit for bit where the separate delta-rule launch takes
//! the fused kernel's lanes per column (every small-head case; the 80B heads with one span),
//! else within the dtype's tolerance. Spans the kernels refuse: NaN rows, nothing written.
//! Then the 80B decode step timed, fused against the three launches.
//!
//! The GPU tests are `#[ignore = "needs a CUDA GPU"]`. The seed is printed; set
//! `PORTER_CUDA_SEED` to replay one.

mod common;

use common::timing::{time_calls, Hold};
use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cuda::{CudaFloat, CudaKernels, GdnFusedDims, GDN_FUSED_MAX_KEY_HEADS};

/// The slot of a PAD span (invalid).
const PAD: usize = u32::MAX as usize;

/// Head and cache sizes of a case.
#[derive(Clone, Copy, Debug)]
struct Geo {
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    k: usize,
    spec: usize,
    slots: usize,
    /// `[b | a]` in a tensor of its own (the FP8 model's `in_proj_ba`).
    ba_apart: bool,
}

impl Geo {
    fn conv(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }
    fn win(&self) -> usize {
        self.k - 1 + self.spec
    }
    fn nbuf(&self) -> usize {
        self.spec + 1
    }
    /// Columns of the projections: conv channels, z, and `[b | a]` unless apart.
    fn x_stride(&self) -> usize {
        self.conv() + self.hv * self.dv + if self.ba_apart { 0 } else { 2 * self.hv }
    }
    fn state(&self) -> usize {
        self.hv * self.dk * self.dv
    }
    /// The fused call's sizes for `t` rows in `n_spans` spans, `lanes` a state column.
    fn dims(&self, t: usize, n_spans: usize, lanes: usize) -> GdnFusedDims {
        GdnFusedDims {
            t,
            n_spans,
            hk: self.hk,
            hv: self.hv,
            dk: self.dk,
            dv: self.dv,
            k: self.k,
            win: self.win(),
            num_slots: self.slots,
            nbuf: self.nbuf(),
            zoff: self.conv(),
            eps: EPS,
            lanes,
        }
    }
}

/// One span of a call: `(len, slot, lag, src_buf, snapshot)`; a call's spans cover its rows
/// in order.
type Sp = (usize, usize, usize, usize, bool);

/// The weights of a case.
struct Weights {
    conv_w: CudaSlice<f32>,
    a_log: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
}

/// Both sides' windows and states (the fused kernel's, the chain's).
struct Pools {
    win: [CudaSlice<f32>; 2],
    state: [CudaSlice<f32>; 2],
    counters: CudaSlice<u32>,
}

/// The tables of a call: fused `(row0, len, slot, lag, src, snap)`, conv `(row0, len, slot,
/// lag)`, delta `(row0, len, slot, src, snap)`; rows; longest span.
fn tables(spans: &[Sp]) -> (Vec<u32>, Vec<u32>, Vec<u32>, usize, usize) {
    let (mut f, mut c, mut d, mut row0, mut max_len) = (vec![], vec![], vec![], 0usize, 0usize);
    for &(len, slot, lag, src, snap) in spans {
        let v = |x: usize| x as u32;
        f.extend([v(row0), v(len), v(slot), v(lag), v(src), u32::from(snap)]);
        c.extend([v(row0), v(len), v(slot), v(lag)]);
        d.extend([v(row0), v(len), v(slot), v(src), u32::from(snap)]);
        row0 += len;
        max_len = max_len.max(len);
    }
    (f, c, d, row0, max_len)
}

/// One call on both sides; returns (fused out, chain out) as f32.
#[allow(clippy::too_many_arguments)]
fn call<T: CudaFloat>(
    k: &CudaKernels,
    g: Geo,
    w: &Weights,
    norm_w: &CudaSlice<T>,
    pools: &mut Pools,
    x: &CudaSlice<T>,
    ba: Option<&CudaSlice<T>>,
    spans: &[Sp],
    lanes: Option<usize>,
) -> (Vec<f32>, Vec<f32>) {
    let (ft, ct, dt, t, max_len) = tables(spans);
    let (conv, hv) = (g.conv(), g.hv);
    let (xs, ba_col) = (g.x_stride(), if g.ba_apart { 0 } else { conv + hv * g.dv });
    let lanes = lanes.unwrap_or_else(|| CudaKernels::gdn_fused_lanes(spans.len(), hv, g.dk, g.dv, false));
    let d = g.dims(t, spans.len(), lanes);
    let mut out_f = poisoned::<T>(k, t * hv * g.dv);
    let [win_f, win_c] = &mut pools.win;
    let [st_f, st_c] = &mut pools.state;
    k.gdn_fused_seq::<T>(
        x,
        xs,
        ba.map(|b| (b, 2 * hv)),
        ba_col,
        &w.conv_w,
        &w.a_log,
        &w.dt_bias,
        win_f,
        st_f,
        &up_u32(k, &ft),
        norm_w,
        &mut out_f,
        &mut pools.counters,
        d,
    )
    .expect("gdn_fused_seq");
    // The chain: conv + gates, delta rule, gated norm.
    let (mut qkv, mut gate, mut beta) =
        (poisoned::<T>(k, t * conv), poisoned::<f32>(k, t * hv), poisoned::<f32>(k, t * hv));
    let (mut o, mut out_c) = (poisoned::<T>(k, t * hv * g.dv), poisoned::<T>(k, t * hv * g.dv));
    let ba_stride = if g.ba_apart { 2 * hv } else { xs };
    k.gdn_conv_gates_seq::<T>(
        x,
        xs,
        ba,
        ba_stride,
        ba_col,
        &w.conv_w,
        &w.a_log,
        &w.dt_bias,
        win_c,
        &up_u32(k, &ct),
        &mut qkv,
        &mut gate,
        &mut beta,
        t,
        spans.len(),
        conv,
        g.k,
        g.win(),
        g.slots,
        hv,
    )
    .expect("gdn_conv_gates_seq");
    k.gdn_delta_seq::<T>(
        &qkv,
        &gate,
        &beta,
        st_c,
        &up_u32(k, &dt),
        &mut o,
        t,
        spans.len(),
        max_len,
        g.hk,
        hv,
        g.dk,
        g.dv,
        g.slots,
        g.nbuf(),
        None,
    )
    .expect("gdn_delta_seq");
    k.gated_norm_z::<T>(&o, x, norm_w, &mut out_c, t, hv, g.dv, xs, conv, EPS).expect("gated_norm_z");
    (down(k, &out_f), down(k, &out_c))
}

/// Consecutive calls on both sides from the same random windows and states; after each, the
/// outputs, windows and states compared, the counters all zero: bit for bit with the fused
/// kernel on the separate delta rule's lanes per column (`lanes` = `None`), else (other lanes,
/// another summation order) within the dtype's tolerance.
fn case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, g: Geo, calls: &[&[Sp]], lanes: Option<usize>) {
    let bits = lanes.is_none();
    let conv = g.conv();
    let win0 = rng.vec(g.slots * conv * g.win(), 1.0);
    let st0 = rng.vec(g.slots * g.nbuf() * g.state(), 0.5);
    let mut pools = Pools {
        win: [up::<f32>(k, &win0), up::<f32>(k, &win0)],
        state: [up::<f32>(k, &st0), up::<f32>(k, &st0)],
        counters: up_u32(k, &vec![0; g.slots * GDN_FUSED_MAX_KEY_HEADS]),
    };
    let mut a_log = rng.vec(g.hv, 2.0);
    a_log[0] = 3.0;
    let mut dt_bias = rng.vec(g.hv, 2.0);
    dt_bias[g.hv - 1] = 25.0; // softplus above its threshold
    let w = Weights { conv_w: up::<f32>(k, &rng.vec(conv * g.k, 0.5)), a_log: up(k, &a_log), dt_bias: up(k, &dt_bias) };
    let norm_w = up::<T>(k, &rng.vec(g.dv, 1.0));
    for (ci, spans) in calls.iter().enumerate() {
        let t: usize = spans.iter().map(|s| s.0).sum();
        let x = up::<T>(k, &rng.vec(t * g.x_stride(), 1.5));
        let ba = g.ba_apart.then(|| up::<T>(k, &rng.vec(t * 2 * g.hv, 2.0)));
        let (got, want) = call::<T>(k, g, &w, &norm_w, &mut pools, &x, ba.as_ref(), spans, lanes);
        let what = format!("gdn_fused {} {g:?} lanes {lanes:?} call {ci} spans {spans:?}", T::NAME);
        let pairs = [
            ("out", got, want),
            ("window", down(k, &pools.win[0]), down(k, &pools.win[1])),
            ("state", down(k, &pools.state[0]), down(k, &pools.state[1])),
        ];
        for (name, a, b) in pairs {
            if bits {
                check_bits(&format!("{what}: {name}"), &a, &b);
            } else {
                check(&format!("{what}: {name}"), &a, &b, if name == "out" { tol::<T>() } else { TOL_F32 });
            }
        }
        assert!(down_u32(k, &pools.counters).iter().all(|&c| c == 0), "{what}: counters left non-zero");
    }
}

/// Decode, verify with snapshots, then steps after rolled-back drafts (lags, an empty span
/// that only rolls its window back), with PAD spans among them.
fn small_calls(spec: usize) -> Vec<Vec<Sp>> {
    let lag = |l: usize| l.min(spec);
    let snap = spec > 0;
    let v = 1 + spec; // verify rows
    vec![
        vec![(1, 0, 0, 0, false), (1, 1, 0, 0, false), (1, PAD, 0, 0, false), (1, 2, 0, 0, false)],
        vec![(v, 0, 0, 0, snap), (v, 1, 0, 0, snap), (v.min(3), 2, 0, 0, snap), (v, PAD, 0, 0, snap)],
        vec![(1, 0, lag(2), lag(1), false), (v.min(2), 1, lag(1), lag(2), snap), (0, 2, lag(1), 0, false)],
        vec![(1, 3, 0, 0, false), (1, 2, 0, 0, false), (1, 1, 0, 0, false), (1, 0, 0, 0, false), (1, 4, 0, 0, false)],
    ]
}

fn as_refs(calls: &[Vec<Sp>]) -> Vec<&[Sp]> {
    calls.iter().map(|c| c.as_slice()).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_fused_small_heads_bit_for_bit() {
    let k = gpu("cuda_gdn_fused_small_heads_bit_for_bit");
    let mut rng = Rng::new(211);
    let g = Geo { hk: 2, hv: 4, dk: 16, dv: 16, k: 4, spec: 3, slots: 6, ba_apart: false };
    let calls = small_calls(3);
    case::<f32>(&k, &mut rng, g, &as_refs(&calls), None);
    case::<bf16>(&k, &mut rng, g, &as_refs(&calls), None);
    case::<f16>(&k, &mut rng, Geo { ba_apart: true, ..g }, &as_refs(&calls), None);
    // No speculation (window k − 1); one value head a key head; k = 2; odd head dims.
    let calls0 = small_calls(0);
    case::<bf16>(&k, &mut rng, Geo { spec: 0, ..g }, &as_refs(&calls0), None);
    case::<f32>(&k, &mut rng, Geo { hk: 3, hv: 3, dk: 20, dv: 24, k: 2, ..g }, &as_refs(&calls), None);
    // Fewer lanes than the separate launch: more conv channels than threads.
    for p in [1, 2, 4] {
        case::<f32>(&k, &mut rng, g, &as_refs(&calls), Some(p));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_fused_80b_heads() {
    let k = gpu("cuda_gdn_fused_80b_heads");
    let mut rng = Rng::new(212);
    let g = Geo { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D, k: CONV_K, spec: 3, slots: 4, ba_apart: false };
    // One span (8 lanes a column), two and three (4), four (2), eight (1).
    let one: [&[Sp]; 3] = [&[(1, 1, 0, 0, false)], &[(4, 1, 0, 0, true)], &[(1, 1, 2, 1, false)]];
    case::<bf16>(&k, &mut rng, g, &one, None);
    case::<f32>(&k, &mut rng, Geo { ba_apart: true, ..g }, &one, None);
    let three: [&[Sp]; 2] =
        [&[(1, 0, 0, 0, false), (1, 2, 0, 0, false), (1, 3, 0, 0, false)], &[(4, 0, 0, 0, true), (4, 3, 0, 0, true)]];
    case::<bf16>(&k, &mut rng, g, &three, None);
    let g8 = Geo { slots: 9, ..g };
    let four: Vec<Sp> = (0..4).map(|s| (1, 2 * s, 0, 0, false)).collect();
    let eight: Vec<Sp> = (0..8).map(|s| (if s % 3 == 0 { 4 } else { 1 }, s + 1, 0, 0, s % 3 == 0)).collect();
    case::<bf16>(&k, &mut rng, g8, &[&four, &eight], None);
    // One span on 2 lanes a column (the separate launch: 8).
    case::<f32>(&k, &mut rng, g, &one, Some(2));
}

/// Spans the kernels refuse (a lag past the window, a source buffer out of range, a snapshot
/// span longer than the buffers): NaN rows; the window, the states and the counters as they
/// were.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_fused_refused_spans() {
    let k = gpu("cuda_gdn_fused_refused_spans");
    let mut rng = Rng::new(213);
    let g = Geo { hk: 2, hv: 4, dk: 16, dv: 16, k: 4, spec: 2, slots: 3, ba_apart: false };
    let spans: [Sp; 3] = [(1, 0, 3, 0, false), (1, 1, 0, 3, false), (4, 2, 0, 0, true)];
    let (ft, _, _, t, _) = tables(&spans);
    let conv = g.conv();
    let win0 = rng.vec(g.slots * conv * g.win(), 1.0);
    let st0 = rng.vec(g.slots * g.nbuf() * g.state(), 0.5);
    let (mut win, mut st) = (up::<f32>(&k, &win0), up::<f32>(&k, &st0));
    let mut counters = up_u32(&k, &vec![0; g.slots * GDN_FUSED_MAX_KEY_HEADS]);
    let x = up::<bf16>(&k, &rng.vec(t * g.x_stride(), 1.0));
    let mut out = up::<bf16>(&k, &vec![0.0; t * g.hv * g.dv]);
    let d = g.dims(t, spans.len(), 8);
    let (wc, al, db) = (up::<f32>(&k, &rng.vec(conv * g.k, 0.5)), up::<f32>(&k, &[0.0; 4]), up::<f32>(&k, &[0.0; 4]));
    let nw = up::<bf16>(&k, &[1.0; 16]);
    let no_ba: Option<(&CudaSlice<bf16>, usize)> = None;
    k.gdn_fused_seq::<bf16>(
        &x,
        g.x_stride(),
        no_ba,
        conv + g.hv * g.dv,
        &wc,
        &al,
        &db,
        &mut win,
        &mut st,
        &up_u32(&k, &ft),
        &nw,
        &mut out,
        &mut counters,
        d,
    )
    .expect("gdn_fused_seq");
    assert!(down(&k, &out).iter().all(|v| v.is_nan()), "refused spans: rows not NaN");
    check_bits("refused spans: window", &down(&k, &win), &win0);
    check_bits("refused spans: state", &down(&k, &st), &st0);
    assert!(down_u32(&k, &counters).iter().all(|&c| c == 0), "refused spans: counters touched");
}

/// The 80B decode step at batch 1 (one span) and 8: the fused launch against the three.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gdn_fused_80b_timing() {
    let k = gpu("cuda_gdn_fused_80b_timing");
    let mut rng = Rng::new(214);
    let g = Geo { hk: LIN_HK, hv: LIN_HV, dk: LIN_D, dv: LIN_D, k: CONV_K, spec: 0, slots: 8, ba_apart: false };
    let conv = g.conv();
    let mut hold = Hold::new(&k);
    let w = Weights {
        conv_w: up::<f32>(&k, &rng.vec(conv * g.k, 0.5)),
        a_log: up(&k, &rng.vec(g.hv, 1.0)),
        dt_bias: up(&k, &rng.vec(g.hv, 1.0)),
    };
    let norm_w = up::<bf16>(&k, &rng.vec(g.dv, 1.0));
    for batch in [1usize, 8] {
        let spans: Vec<Sp> = (0..batch).map(|s| (1, s, 0, 0, false)).collect();
        let mut pools = Pools {
            win: [
                up::<f32>(&k, &rng.vec(g.slots * conv * g.win(), 1.0)),
                up::<f32>(&k, &vec![0.0; g.slots * conv * g.win()]),
            ],
            state: [up::<f32>(&k, &rng.vec(g.slots * g.state(), 0.5)), up::<f32>(&k, &vec![0.0; g.slots * g.state()])],
            counters: up_u32(&k, &vec![0; g.slots * GDN_FUSED_MAX_KEY_HEADS]),
        };
        let x = up::<bf16>(&k, &rng.vec(batch * g.x_stride(), 1.0));
        let (ft, ct, dt, t, _) = tables(&spans);
        let (ft, ct, dt) = (up_u32(&k, &ft), up_u32(&k, &ct), up_u32(&k, &dt));
        let d = g.dims(t, batch, 1); // spec 0: one state buffer
        let mut out = poisoned::<bf16>(&k, t * g.hv * g.dv);
        let no_ba: Option<(&CudaSlice<bf16>, usize)> = None;
        let ba_col = conv + g.hv * g.dv;
        let mut fused = Vec::new();
        for lanes in [8, 4, 2, 1] {
            let d = GdnFusedDims { lanes, ..d };
            fused.push((
                lanes,
                time_calls(&k, &mut hold, 200, &mut |_| {
                    let [wf, _] = &mut pools.win;
                    let [sf, _] = &mut pools.state;
                    k.gdn_fused_seq::<bf16>(
                        &x,
                        g.x_stride(),
                        no_ba,
                        ba_col,
                        &w.conv_w,
                        &w.a_log,
                        &w.dt_bias,
                        wf,
                        sf,
                        &ft,
                        &norm_w,
                        &mut out,
                        &mut pools.counters,
                        d,
                    )
                    .expect("fused");
                }),
            ));
        }
        let (mut qkv, mut gate, mut beta) =
            (poisoned::<bf16>(&k, t * conv), poisoned::<f32>(&k, t * g.hv), poisoned::<f32>(&k, t * g.hv));
        let mut o = poisoned::<bf16>(&k, t * g.hv * g.dv);
        let chain = time_calls(&k, &mut hold, 200, &mut |_| {
            let [_, wc] = &mut pools.win;
            let [_, sc] = &mut pools.state;
            k.gdn_conv_gates_seq::<bf16>(
                &x,
                g.x_stride(),
                no_ba.map(|b| b.0),
                g.x_stride(),
                ba_col,
                &w.conv_w,
                &w.a_log,
                &w.dt_bias,
                wc,
                &ct,
                &mut qkv,
                &mut gate,
                &mut beta,
                t,
                batch,
                conv,
                g.k,
                g.win(),
                g.slots,
                g.hv,
            )
            .expect("conv");
            k.gdn_delta_seq::<bf16>(
                &qkv, &gate, &beta, sc, &dt, &mut o, t, batch, 1, g.hk, g.hv, g.dk, g.dv, g.slots, 1, None,
            )
            .expect("delta");
            k.gated_norm_z::<bf16>(&o, &x, &norm_w, &mut out, t, g.hv, g.dv, g.x_stride(), conv, EPS).expect("norm");
        });
        let fused: Vec<String> = fused.iter().map(|(p, s)| format!("{p} lanes {:.2} µs", s * 1e6)).collect();
        println!(
            "80B Gated DeltaNet decode step, batch {batch}, bf16: fused {}; three launches {:.2} µs",
            fused.join(", "),
            chain * 1e6
        );
    }
}
