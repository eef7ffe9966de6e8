//! Shared helpers of the block tests (compiled for tests only): a fixed-seed xorshift, tensor
//! and cache builders, the tolerance check, and naive `f64` references of each block's math
//! (models.md §3) written as plain loops. The references call no porter kernel or op: they
//! read a block's weights through its public fields and recompute everything else.

use super::*;
use crate::error::Error;
use crate::state::{KvCache, PageStep, RecCache};
use crate::tensor::Device;

/// The tolerance of every `f32` comparison: `max|Δ| ≤ TOL · max|ref|`.
pub(crate) const TOL: f64 = 1e-5;

/// Fixed-seed xorshift64 (no dependency, same values on every machine).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in `[-1, 1)`.
    pub(crate) fn next(&mut self) -> f32 {
        let s = &mut self.0;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub(crate) fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }

    /// An `f32` tensor of uniform values in `[-scale, scale)`.
    pub(crate) fn tensor(&mut self, shape: &[usize], scale: f32) -> Tensor {
        f32t(self.vec(shape.iter().product(), scale), shape)
    }

    /// A `[out, inp]` linear (weights scaled by `inp^-½`), with a bias if asked.
    pub(crate) fn linear(&mut self, out: usize, inp: usize, bias: bool) -> Linear {
        let w = self.tensor(&[out, inp], 1.0 / (inp as f32).sqrt());
        Linear::new(w, bias.then(|| self.tensor(&[out], 0.5)))
    }

    /// A norm of width `d` in `f32`: weights near 1 (standard) or near 0 (zero-centred).
    pub(crate) fn norm(&mut self, d: usize, kind: NormKind) -> RmsNorm {
        let base = if kind == NormKind::Standard { 1.0 } else { 0.0 };
        let w: Vec<f32> = self.vec(d, 0.3).into_iter().map(|v| base + v).collect();
        RmsNorm::new(f32t(w, &[d]), 1e-6, kind)
    }
}

/// An `f32` host tensor.
pub(crate) fn f32t(v: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape.to_vec(), DType::F32).unwrap()
}

/// A tensor's values as `f64`.
pub(crate) fn vals(t: &Tensor) -> Vec<f64> {
    t.host_vec().unwrap().into_iter().map(f64::from).collect()
}

/// Values as `f64`.
pub(crate) fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Rows `r0..r1` of a `[rows, d]` matrix.
pub(crate) fn rows<T: Copy>(v: &[T], d: usize, r0: usize, r1: usize) -> Vec<T> {
    v[r0 * d..r1 * d].to_vec()
}

/// Asserts `max|got − want| ≤ tol · max|want|` (and equal lengths).
pub(crate) fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {} values vs {} expected", got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(scale > 0.0, "{what}: the reference is all zeros (a vacuous test)");
    let (i, d) = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .enumerate()
        .fold((0, 0.0f64), |a, (i, d)| if d > a.1 || d.is_nan() { (i, d) } else { a });
    assert!(
        d <= tol * scale,
        "{what}: max|Δ| = {d:.3e} at {i} ({} vs {}) exceeds {tol:.0e}·max|ref| = {:.3e}",
        got[i],
        want[i],
        tol * scale
    );
}

/// [`assert_close`] on a tensor's values.
pub(crate) fn assert_tensor(what: &str, got: &Tensor, want: &[f64]) {
    assert_close(what, &got.host_vec().unwrap(), want, TOL);
}

/// Whether `r` failed with an [`Error::Shape`] (after any context).
pub(crate) fn is_shape<T>(r: &Result<T>) -> bool {
    matches!(r.as_ref().err().map(Error::root), Some(Error::Shape(_)))
}

/// Blocks of 16 positions each test sequence `s` owns: `s·64 .. s·64 + 64` (1024 positions).
const TEST_BLOCKS_PER_SEQ: usize = 64;

/// An empty CPU KV pool for 8 test sequences (see [`page`]).
pub(crate) fn kv_cache(kv_heads: usize, head_dim: usize) -> LayerCache {
    LayerCache::Kv(
        KvCache::new(Device::Cpu, kv_heads, head_dim, DType::F32, Default::default(), 16, 8 * TEST_BLOCKS_PER_SEQ)
            .unwrap(),
    )
}

/// Hands a test KV cache the paging metadata of `batch` (what a model cache's `prepare` does),
/// sequence `s` owning the contiguous blocks `s·64..`.
pub(crate) fn page(cache: &mut LayerCache, batch: &Batch) {
    if let LayerCache::Kv(kv) = cache {
        let tables: Vec<Vec<u32>> = batch
            .spans
            .iter()
            .map(|s| {
                let n = (s.pos0 + s.len).div_ceil(16);
                (0..n).map(|j| (s.seq.0 * TEST_BLOCKS_PER_SEQ + j) as u32).collect()
            })
            .collect();
        let lists: Vec<&[u32]> = tables.iter().map(|t| &t[..]).collect();
        kv.step = Some(std::sync::Arc::new(PageStep::new(batch, 16, &lists).unwrap()));
    }
}

/// An empty CPU recurrent cache for `slots` sequences with `spec` rejectable tokens.
pub(crate) fn rec_cache(c: &GdnConfig, spec: usize, slots: usize) -> LayerCache {
    let rc = RecCache::new(Device::Cpu, c.conv_dim(), c.conv_kernel, c.state_len(), spec, slots, 0).unwrap();
    LayerCache::Recurrent(rc)
}

// ---------------------------------------------------------------------------------------
// Naive f64 references (models.md §3)
// ---------------------------------------------------------------------------------------

pub(crate) fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `act` in f64: [`silu`] for SiLU, else `Act::eval_f64`.
pub(crate) fn act64(act: Act) -> impl Fn(f64) -> f64 + Copy {
    move |x| if act.is_silu() { silu(x) } else { act.eval_f64(x) }
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `softplus` with β = 1 and threshold 20 (torch's default).
pub(crate) fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `x · wᵀ`: `x: [rows, k]`, `w: [n, k]` → `[rows, n]`.
pub(crate) fn matmul_t(x: &[f64], w: &[f64], n: usize, k: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len() / k * n);
    for xr in x.chunks(k) {
        for wr in w.chunks(k).take(n) {
            out.push(xr.iter().zip(wr).map(|(a, b)| a * b).sum());
        }
    }
    out
}

/// `x · Wᵀ + b`.
pub(crate) fn linear(x: &[f64], l: &Linear) -> Vec<f64> {
    let (n, k) = (l.w.dim(0), l.w.dim(1));
    let mut y = matmul_t(x, &vals(&l.w), n, k);
    if let Some(b) = &l.b {
        let b = vals(b);
        for r in y.chunks_mut(n) {
            r.iter_mut().zip(&b).for_each(|(v, b)| *v += b);
        }
    }
    y
}

/// RMSNorm over rows of `n.dim()` values, without rounding: `x·rsqrt(mean(x²)+eps)·w`
/// (standard) or `·(1 + w)` (zero-centred).
pub(crate) fn rms_norm(x: &[f64], n: &RmsNorm) -> Vec<f64> {
    let w = vals(&n.w);
    let d = w.len();
    let mut y = Vec::with_capacity(x.len());
    for r in x.chunks(d) {
        let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / d as f64 + f64::from(n.eps())).sqrt();
        for (v, w) in r.iter().zip(&w) {
            let scale = if n.kind() == NormKind::ZeroCentred { 1.0 + w } else { *w };
            y.push(v * inv * scale);
        }
    }
    y
}

/// NeoX RoPE on the first `rot` dims of every head of `x: [T, heads, hd]` (row `t` at
/// `positions[t]`), with `inv_freq[i] = theta^(−2i/rot) / factor`.
pub(crate) fn rope_ref(x: &mut [f64], positions: &[usize], hd: usize, rot: usize, theta: f64, factor: f64) {
    let half = rot / 2;
    let per_row = x.len() / positions.len();
    for (row, &p) in x.chunks_mut(per_row).zip(positions) {
        for head in row.chunks_mut(hd) {
            for i in 0..half {
                let angle = p as f64 * theta.powf(-2.0 * i as f64 / rot as f64) / factor;
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * angle.cos() - b * angle.sin();
                head[i + half] = b * angle.cos() + a * angle.sin();
            }
        }
    }
}

/// Softmax attention of one sequence at positions `0..T`: `q: [T, heads, hd]`,
/// `k`, `v`: `[T, kv_heads, hd]`; q-head `h` reads kv-head `h / (heads / kv_heads)`, key `j`
/// is visible to query `i` iff `j ≤ i` and `i − j < window`.
pub(crate) fn sdpa(q: &[f64], k: &[f64], v: &[f64], c: &AttentionConfig) -> Vec<f64> {
    let (h, kvh, hd) = (c.heads, c.kv_heads, c.head_dim);
    let t = q.len() / (h * hd);
    let mut out = vec![0.0; q.len()];
    for i in 0..t {
        for head in 0..h {
            let g = head / (h / kvh);
            let qr = &q[(i * h + head) * hd..][..hd];
            let keys: Vec<usize> = (0..=i).filter(|&j| c.window.is_none_or(|w| i - j < w)).collect();
            let scores: Vec<f64> = keys
                .iter()
                .map(|&j| qr.iter().zip(&k[(j * kvh + g) * hd..][..hd]).map(|(a, b)| a * b).sum::<f64>())
                .map(|s| s * f64::from(c.scale))
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            let o = &mut out[(i * h + head) * hd..][..hd];
            for (&j, s) in keys.iter().zip(&scores) {
                let p = (s - m).exp() / z;
                for (o, vv) in o.iter_mut().zip(&v[(j * kvh + g) * hd..][..hd]) {
                    *o += p * vv;
                }
            }
        }
    }
    out
}

/// The attention block on one whole sequence (positions `0..T`) of `x: [T, hidden]`:
/// per-head `[q, gate]` split, q/k norms, RoPE (`theta`), GQA softmax attention,
/// `sigmoid(gate)` output gate, `o_proj` (models.md §3.2).
pub(crate) fn attention(x: &[f64], a: &Attention, theta: f64) -> Vec<f64> {
    let c = &a.cfg;
    let hd = c.head_dim;
    let qrows = c.heads * hd * if c.output_gate { 2 } else { 1 };
    let (qg, mut k, v) = match &a.qkv {
        QkvProj::Apart { q, k, v } => (linear(x, q), linear(x, k), linear(x, v)),
        QkvProj::Packed(l) => {
            // Each output row is [q | k | v].
            let (all, kv) = (linear(x, l), c.kv_heads * hd);
            let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for row in all.chunks(qrows + 2 * kv) {
                q.extend_from_slice(&row[..qrows]);
                k.extend_from_slice(&row[qrows..qrows + kv]);
                v.extend_from_slice(&row[qrows + kv..]);
            }
            (q, k, v)
        }
    };
    let t = qg.len() / qrows;
    let (mut q, mut gate) = (Vec::new(), Vec::new());
    if c.output_gate {
        // Per head: rows [h·2hd, h·2hd + hd) are q, the next hd the gate.
        for blk in qg.chunks(2 * hd) {
            q.extend_from_slice(&blk[..hd]);
            gate.extend_from_slice(&blk[hd..]);
        }
    } else {
        q = qg;
    }
    if let Some(n) = &a.q_norm {
        q = rms_norm(&q, n);
    }
    if let Some(n) = &a.k_norm {
        k = rms_norm(&k, n);
    }
    let pos: Vec<usize> = (0..t).collect();
    rope_ref(&mut q, &pos, hd, a.rope.rot_dim(), theta, 1.0);
    rope_ref(&mut k, &pos, hd, a.rope.rot_dim(), theta, 1.0);
    let mut o = sdpa(&q, &k, &v, c);
    if c.output_gate {
        o.iter_mut().zip(&gate).for_each(|(o, g)| *o *= sigmoid(*g));
    }
    linear(&o, &a.o_proj)
}

/// `down(act(gate) · up)` with `[gate; up]` packed in `gate_up` (silu written out, the other
/// activations by `Act::eval_f64`).
pub(crate) fn swiglu(x: &[f64], m: &SwiGlu) -> Vec<f64> {
    let gu = linear(x, &m.gate_up);
    let i = m.gate_up.out_features() / 2;
    let act = act64(m.act);
    let h: Vec<f64> = gu.chunks(2 * i).flat_map(|r| (0..i).map(move |j| act(r[j]) * r[i + j])).collect();
    linear(&h, &m.down)
}

/// Softmax over all experts, top-k by (probability desc, index asc), optional
/// renormalisation: the `(expert, weight)` pairs of one row of router logits.
pub(crate) fn top_k(logits: &[f64], k: usize, renorm: bool) -> Vec<(usize, f64)> {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
    let p: Vec<f64> = logits.iter().map(|l| (l - m).exp() / z).collect();
    let mut sel: Vec<(usize, f64)> = Vec::new();
    for _ in 0..k {
        // The largest remaining probability; `>` keeps the lower index on a tie.
        let mut best: Option<usize> = None;
        for e in 0..p.len() {
            if sel.iter().all(|s| s.0 != e) && best.is_none_or(|b| p[e] > p[b]) {
                best = Some(e);
            }
        }
        let b = best.unwrap();
        sel.push((b, p[b]));
    }
    if renorm {
        let s: f64 = sel.iter().map(|s| s.1).sum();
        sel.iter_mut().for_each(|e| e.1 /= s);
    }
    sel
}

/// The sparse MoE (models.md §3.6) with `top_k` as given: routed experts plus the optional
/// shared expert `sigmoid(x·g) · SwiGLU_s(x)`; `input` rows `[router; shared gate; shared up;
/// shared gate row]`.
pub(crate) fn moe(x: &[f64], m: &Moe) -> Vec<f64> {
    moe_with(x, m, &|l| top_k(l, m.top_k, m.norm_topk_prob))
}

/// A routing rule: router logits of one row → `(expert, weight)` pairs.
pub(crate) type Router<'a> = &'a dyn Fn(&[f64]) -> Vec<(usize, f64)>;

/// [`moe`] with the routing given by `route`.
pub(crate) fn moe_with(x: &[f64], m: &Moe, route: Router<'_>) -> Vec<f64> {
    let (e, h) = (m.experts, m.input.dim(1));
    let inter = m.gate.dim(1);
    let (all_n, input) = (m.input.dim(0), vals(&m.input));
    let (wg, wu, wd) = (vals(&m.gate), vals(&m.up), vals(&m.down));
    let all = matmul_t(x, &input, all_n, h);
    let act = act64(m.act);
    let mut y = Vec::with_capacity(x.len());
    for (xr, ar) in x.chunks(h).zip(all.chunks(all_n)) {
        let mut out = vec![0.0; h];
        for (j, w) in route(&ar[..e]) {
            let g = matmul_t(xr, &wg[j * inter * h..(j + 1) * inter * h], inter, h);
            let u = matmul_t(xr, &wu[j * inter * h..(j + 1) * inter * h], inter, h);
            let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| act(*g) * u).collect();
            let d = matmul_t(&a, &wd[j * h * inter..(j + 1) * h * inter], h, inter);
            out.iter_mut().zip(&d).for_each(|(o, d)| *o += w * d);
        }
        if let Some(s) = &m.shared {
            let i = s.inter;
            let a: Vec<f64> = (0..i).map(|c| act(ar[e + c]) * ar[e + i + c]).collect();
            let so = linear(&a, &s.down);
            let gate = sigmoid(ar[e + 2 * i]);
            out.iter_mut().zip(&so).for_each(|(o, s)| *o += gate * s);
        }
        y.extend(out);
    }
    y
}

/// Gated DeltaNet (models.md §3.4) on one whole sequence from a zero state, token by token:
/// causal depthwise conv + `cfg.act` over `[q|k|v]`, gates, L2-normalised q (·dk^-½) and k,
/// the delta rule on an `[Hv, dk, dv]` state, gated RMSNorm with SiLU(z) (always SiLU, as in
/// transformers), `out_proj`.
pub(crate) fn gdn(x: &[f64], b: &GatedDeltaNet) -> Vec<f64> {
    let c = b.cfg;
    let (hk, hv, dk, dv, kk) = (c.key_heads, c.value_heads, c.key_dim, c.value_dim, c.conv_kernel);
    let (kd, vd) = (hk * dk, hv * dv);
    let conv = 2 * kd + vd;
    let pw = conv + vd + 2 * hv;
    let p = linear(x, &b.in_proj);
    let t = p.len() / pw;
    let (cw, a_log, dt_bias, nw) = (vals(&b.conv_w), vals(&b.a_log), vals(&b.dt_bias), vals(&b.norm_w));
    let mut s = vec![0.0f64; hv * dk * dv];
    let mut normed = Vec::with_capacity(t * vd);
    let act = act64(c.act);
    for ti in 0..t {
        let row = &p[ti * pw..(ti + 1) * pw];
        // y[c] = act(Σ_j w[c, j] · mixed[t − (K−1) + j, c]), zero before the sequence.
        let y: Vec<f64> = (0..conv)
            .map(|ch| {
                let acc: f64 = (0..kk)
                    .filter(|&j| ti + j >= kk - 1)
                    .map(|j| cw[ch * kk + j] * p[(ti + j + 1 - kk) * pw + ch])
                    .sum();
                act(acc)
            })
            .collect();
        let l2 = |v: &[f64], scale: f64| -> Vec<f64> {
            let r = 1.0 / (v.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
            v.iter().map(|a| a * r * scale).collect()
        };
        let q: Vec<f64> = y[..kd].chunks(dk).flat_map(|h| l2(h, 1.0 / (dk as f64).sqrt())).collect();
        let k: Vec<f64> = y[kd..2 * kd].chunks(dk).flat_map(|h| l2(h, 1.0)).collect();
        let v = &y[2 * kd..];
        for j in 0..hv {
            let kh = j / (hv / hk);
            let (qh, khv) = (&q[kh * dk..][..dk], &k[kh * dk..][..dk]);
            let beta = sigmoid(row[conv + vd + j]);
            let g = -a_log[j].exp() * softplus(row[conv + vd + hv + j] + dt_bias[j]);
            let st = &mut s[j * dk * dv..(j + 1) * dk * dv];
            st.iter_mut().for_each(|v| *v *= g.exp());
            let mut o = vec![0.0; dv];
            for (vv, o) in o.iter_mut().enumerate() {
                let kv: f64 = (0..dk).map(|i| st[i * dv + vv] * khv[i]).sum();
                let delta = beta * (v[j * dv + vv] - kv);
                (0..dk).for_each(|i| st[i * dv + vv] += khv[i] * delta);
                *o = (0..dk).map(|i| st[i * dv + vv] * qh[i]).sum();
            }
            // Gated RMSNorm per v-head with SiLU(z) (plain weight).
            let r = 1.0 / (o.iter().map(|a| a * a).sum::<f64>() / dv as f64 + f64::from(c.eps)).sqrt();
            let z = &row[conv + j * dv..][..dv];
            normed.extend((0..dv).map(|i| o[i] * r * nw[i] * silu(z[i])));
        }
    }
    linear(&normed, &b.out_proj)
}

// ---------------------------------------------------------------------------------------
// Random blocks
// ---------------------------------------------------------------------------------------

/// RoPE base of [`attention_block`].
pub(crate) const THETA: f32 = 10_000.0;

/// Attention with heads 4, kv_heads 2, head_dim 8 (rot_dim 4, base [`THETA`]), zero-centred
/// q/k norms if asked.
pub(crate) fn attention_block(
    rng: &mut Rng,
    hidden: usize,
    window: Option<usize>,
    gate: bool,
    qk_norm: bool,
) -> Attention {
    let (h, kv, hd) = (4, 2, 8);
    let mut cfg = AttentionConfig::gqa(h, kv, hd, window);
    cfg.output_gate = gate;
    let params = RopeParams { theta: THETA, partial_rotary_factor: 0.5, scaling: RopeScaling::Default };
    let a = Attention {
        qkv: QkvProj::Apart {
            q: rng.linear(h * hd * if gate { 2 } else { 1 }, hidden, false),
            k: Box::new(rng.linear(kv * hd, hidden, false)),
            v: Box::new(rng.linear(kv * hd, hidden, false)),
        },
        o_proj: rng.linear(hidden, h * hd, false),
        q_norm: qk_norm.then(|| rng.norm(hd, NormKind::ZeroCentred)),
        k_norm: qk_norm.then(|| rng.norm(hd, NormKind::ZeroCentred)),
        rope: Rope::new(&params, hd).unwrap(),
        cfg,
    };
    a.check().unwrap();
    a
}

/// `a` with its q / k / v projections packed into one weight (the same values).
pub(crate) fn packed(a: &Attention) -> Attention {
    let QkvProj::Apart { q, k, v } = &a.qkv else { return a.clone() };
    let w = Tensor::concat_rows(&[&q.w, &k.w, &v.w]).unwrap();
    let b = match (&q.b, &k.b, &v.b) {
        (Some(q), Some(k), Some(v)) => Some(Tensor::concat_rows(&[q, k, v]).unwrap()),
        _ => None,
    };
    let p = Attention { qkv: QkvProj::Packed(Linear::new(w, b)), ..a.clone() };
    p.check().unwrap();
    p
}

/// The geometry of [`gdn_block`]: Hk 2, Hv 4 (two v-heads per k-head), dk 4, dv 6, kernel 3.
pub(crate) const GDN_CFG: GdnConfig =
    GdnConfig { key_heads: 2, value_heads: 4, key_dim: 4, value_dim: 6, conv_kernel: 3, eps: 1e-6, act: Act::Silu };

/// A Gated DeltaNet of geometry [`GDN_CFG`].
pub(crate) fn gdn_block(rng: &mut Rng, hidden: usize) -> GatedDeltaNet {
    let c = GDN_CFG;
    let rows = 2 * c.key_heads * c.key_dim + 2 * c.value_heads * c.value_dim + 2 * c.value_heads;
    let hv = c.value_heads;
    let g = GatedDeltaNet {
        cfg: c,
        in_proj: rng.linear(rows, hidden, false),
        in_proj_ba: None,
        conv_w: rng.tensor(&[c.conv_dim(), c.conv_kernel], 0.8),
        // exp(A_log) in [0.08, 0.6]: decays of about 0.6..0.95 per token.
        a_log: f32t(rng.vec(hv, 1.0).into_iter().map(|v| v - 1.5).collect(), &[hv]),
        dt_bias: rng.tensor(&[hv], 0.5),
        norm_w: f32t(rng.vec(c.value_dim, 0.2).into_iter().map(|v| 1.0 + v).collect(), &[c.value_dim]),
        out_proj: rng.linear(hidden, hv * c.value_dim, false),
    };
    g.check().unwrap();
    g
}

/// A MoE of `e` experts of width `inter`, optionally with a shared expert of width `shared`.
pub(crate) fn moe_block(
    rng: &mut Rng,
    hidden: usize,
    inter: usize,
    e: usize,
    top_k: usize,
    renorm: bool,
    shared: Option<usize>,
) -> Moe {
    let rows = e + shared.map_or(0, |i| 2 * i + 1);
    let s = 1.0 / (hidden as f32).sqrt();
    let m = Moe {
        input: rng.tensor(&[rows, hidden], 3.0 * s),
        shared_in: None,
        experts: e,
        gate: rng.tensor(&[e, inter, hidden], s),
        up: rng.tensor(&[e, inter, hidden], s),
        down: rng.tensor(&[e, hidden, inter], 1.0 / (inter as f32).sqrt()),
        top_k,
        norm_topk_prob: renorm,
        shared: shared.map(|i| SharedExpert { inter: i, down: rng.linear(hidden, i, false) }),
        reduce: None,
        act: Act::Silu,
    };
    m.check().unwrap();
    m
}
