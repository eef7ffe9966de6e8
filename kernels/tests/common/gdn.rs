//! Helpers of the Gated DeltaNet delta-rule tests (`cuda_gdn_seq.rs`, `cuda_gdn_chunk.rs`):
//! head dims, random inputs, the span table the kernels read and the per-span CPU reference.

use super::Rng;
use porter_kernels::cpu::gdn;

/// Head dims of a delta-rule case.
#[derive(Clone, Copy, Debug)]
pub struct GdnDims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

impl GdnDims {
    /// Width of a qkv row: q `[hk, dk]`, k `[hk, dk]`, v `[hv, dv]`.
    pub fn width(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }
    /// Elements of one state buffer `[hv, dk, dv]`.
    pub fn state(&self) -> usize {
        self.hv * self.dk * self.dv
    }
}

/// One delta-rule span: `(len, slot, src_buf, snapshot)`; the spans of a call cover rows
/// `0..Σ len` in order.
pub type DeltaSpan = (usize, usize, usize, bool);

/// Random inputs of `t` rows: qkv (conv outputs), g (a few below −60), β.
pub fn gdn_inputs(rng: &mut Rng, d: GdnDims, t: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let qkv = rng.vec(t * d.width(), 1.0);
    let g: Vec<f32> = (0..t * d.hv)
        .map(|_| {
            if rng.below(97) == 0 {
                -70.0
            } else {
                -0.5 * (rng.f(1.0) + 1.0) * if rng.below(4) == 0 { 8.0 } else { 1.0 }
            }
        })
        .collect();
    let beta: Vec<f32> = (0..t * d.hv).map(|_| 1.0 / (1.0 + (-rng.f(4.0)).exp())).collect();
    (qkv, g, beta)
}

/// The `[n_spans, 5]` table `(row0, len, slot, src_buf, snapshot)` of `spans`, the rows
/// they cover and their longest length.
pub fn span_table(spans: impl IntoIterator<Item = DeltaSpan>) -> (Vec<u32>, usize, usize) {
    let (mut flat, mut row0, mut max_len) = (Vec::new(), 0usize, 0usize);
    for (len, slot, src, snap) in spans {
        flat.extend_from_slice(&[row0 as u32, len as u32, slot as u32, src as u32, snap as u32]);
        row0 += len;
        max_len = max_len.max(len);
    }
    (flat, row0, max_len)
}

/// One span's inputs as the CPU delta rule takes them.
pub struct SpanInputs<'a> {
    /// `[len, hk, dk]`, L2-normalised and scaled by `dk^-½` (as the kernels do).
    pub q: Vec<f32>,
    /// `[len, hk, dk]`, L2-normalised.
    pub k: Vec<f32>,
    /// `[len, hv, dv]`.
    pub v: Vec<f32>,
    /// `[len, hv]`.
    pub g: &'a [f32],
    /// `[len, hv]`.
    pub beta: &'a [f32],
    pub len: usize,
    pub src: usize,
    pub snapshot: bool,
}

/// CPU reference of one delta-rule call: for every span, its inputs, the `nbuf` state
/// buffers of its slot (`state` is `[num_slots, nbuf, hv, dk, dv]`) and its output rows go
/// to `run`, which updates the states. Returns the output `[t, hv, dv]`.
#[allow(clippy::too_many_arguments)]
pub fn gdn_ref(
    d: GdnDims,
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    spans: &[DeltaSpan],
    nbuf: usize,
    mut run: impl FnMut(&SpanInputs<'_>, &mut [f32], &mut [f32]),
) -> Vec<f32> {
    let (hk, hv, dk, dv, wd, sl) = (d.hk, d.hv, d.dk, d.dv, d.width(), d.state());
    let t: usize = spans.iter().map(|s| s.0).sum();
    let mut out = vec![0.0f32; t * hv * dv];
    let mut row0 = 0;
    for &(len, slot, src, snapshot) in spans {
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for r in row0..row0 + len {
            let row = &qkv[r * wd..(r + 1) * wd];
            q.extend_from_slice(&row[..hk * dk]);
            k.extend_from_slice(&row[hk * dk..2 * hk * dk]);
            v.extend_from_slice(&row[2 * hk * dk..]);
        }
        gdn::l2norm_rows(&mut q, dk, 1.0 / (dk as f32).sqrt()).expect("l2norm");
        gdn::l2norm_rows(&mut k, dk, 1.0).expect("l2norm");
        let inputs = SpanInputs {
            q,
            k,
            v,
            g: &g[row0 * hv..(row0 + len) * hv],
            beta: &beta[row0 * hv..(row0 + len) * hv],
            len,
            src,
            snapshot,
        };
        let slot_states = &mut state[slot * nbuf * sl..(slot + 1) * nbuf * sl];
        run(&inputs, slot_states, &mut out[row0 * hv * dv..(row0 + len) * hv * dv]);
        row0 += len;
    }
    out
}
