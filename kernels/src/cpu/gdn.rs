//! Gated DeltaNet (GDN) kernels of Qwen3-Next, on plain row-major `f32` slices.
//!
//! The pieces of one GDN layer, in the order a caller composes them
//! (models.md §3.4):
//!
//! 1. [`causal_conv1d_prefill`] / [`causal_conv1d_update`]: depthwise causal
//!    conv over the `[q | k | v]` channels, followed by SiLU, with a rolling
//!    state of the last `K − 1` inputs.
//! 2. [`gdn_gates`]: log-decay `g` and write strength `beta` per token and v-head.
//! 3. [`l2norm_rows`]: L2 normalisation of q (with the `dk^-0.5` scale) and k.
//! 4. [`recurrent_gated_delta_rule`] (token by token, for decode) or
//!    [`chunked_gated_delta_rule`] (chunked WY form, for prefill): the same
//!    recurrence and the same result up to fp32 rounding.
//! 5. [`gated_rms_norm`]: per-head RMS norm with a SiLU gate.
//!
//! Everything is computed in `f32`. The kernels know nothing of models,
//! tensors or configs: every shape is passed explicitly and every slice length
//! is checked against it; a mismatch returns a [`GdnError`] and writes nothing.
//!
//! Head convention: with `Hk` key heads and `Hv` value heads (`Hv % Hk == 0`),
//! value head `j` reads key head `j / (Hv / Hk)` (`repeat_interleave`, as in
//! HF), never `j % Hk`.
//!
//! The recurrent state of one sequence is `[Hv, dk, dv]` (k-major, the HF and
//! LightLLM layout), in `f32`, updated in place.

use rayon::prelude::*;
use std::fmt;

/// Chunk length of [`chunked_gated_delta_rule`] (as in HF and FLA).
pub const GDN_CHUNK: usize = 64;

/// Width (in `f32` columns of the state) of the column blocks that
/// [`recurrent_gated_delta_rule`] keeps in L1 while it scans the tokens.
const REC_COLS: usize = 16;

/// Error of a GDN kernel: a slice length or a dimension that does not fit.
///
/// A kernel returning an error has written nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GdnError {
    /// A slice has the wrong length.
    Len {
        /// Name of the argument.
        what: &'static str,
        /// Length implied by the dimensions.
        expected: usize,
        /// Length actually passed.
        got: usize,
    },
    /// The dimensions themselves are invalid (zero, not divisible, overflow).
    Dims(&'static str),
}

impl fmt::Display for GdnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GdnError::Len { what, expected, got } => {
                write!(f, "gdn kernel: `{what}` has length {got}, expected {expected}")
            }
            GdnError::Dims(msg) => write!(f, "gdn kernel: invalid dimensions: {msg}"),
        }
    }
}

impl std::error::Error for GdnError {}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<(), GdnError> {
    if got == expected {
        Ok(())
    } else {
        Err(GdnError::Len { what, expected, got })
    }
}

/// Product of dimensions, or an error on overflow.
fn prod(dims: &[usize]) -> Result<usize, GdnError> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d).ok_or(GdnError::Dims("size overflows usize")))
}

/// `n` is a multiple of `d` (false for `d == 0`). Spelled with `checked_rem`
/// so that it needs neither `is_multiple_of` (Rust 1.87) nor trips clippy's
/// `manual_is_multiple_of` on newer toolchains.
fn is_multiple(n: usize, d: usize) -> bool {
    n.checked_rem(d) == Some(0)
}

#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Decay factor `exp(x)` for a log-decay `x ≤ 0`, flushed to exactly 0 below
/// `x = −60` (`e^−60 ≈ 9e−27`, far below `f32` resolution next to the O(1)
/// terms it is added to). Without the flush, strongly decaying heads produce
/// subnormal intermediates, which are 10–100× slower on x86.
#[inline(always)]
fn decay_exp(x: f32) -> f32 {
    if x < -60.0 {
        0.0
    } else {
        x.exp()
    }
}

/// PyTorch `softplus` with `beta = 1`, `threshold = 20`.
#[inline(always)]
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

// ---------------------------------------------------------------------------
// Causal depthwise conv1d + SiLU
// ---------------------------------------------------------------------------

/// Causal depthwise conv1d followed by SiLU over `T` tokens of one sequence,
/// continuing from (and updating) a rolling state.
///
/// `y[t, c] = silu(Σ_{j<K} w[c, j] · xin[c, t − (K−1) + j] + bias[c])`, where
/// inputs at positions `< 0` come from `state` (position `−(K−1) + i` is
/// `state[c, i]`). With a zero state this is PyTorch
/// `Conv1d(C, C, K, groups=C, padding=K−1)(x)[..., :T]` followed by SiLU;
/// `w[:, K−1]` multiplies the current token. Accumulation is in `f32`.
///
/// Afterwards `state` holds the last `K − 1` inputs of the whole sequence so
/// far, oldest first (taken partly from the old state when `T < K − 1`), so
/// that prefill can be continued by another prefill or by
/// [`causal_conv1d_update`]. `T = 0` is a no-op.
///
/// # Shapes
/// - `x`: `[T, C]` (raw `[q | k | v]` projections, before conv)
/// - `w`: `[C, K]` (the checkpoint's `[C, 1, K]` conv weight)
/// - `bias`: `[C]` or `None`
/// - `state`: `[C, K − 1]`, oldest input first; zeros for a fresh sequence
/// - `out`: `[T, C]`
///
/// # Errors
/// [`GdnError`] if `c == 0`, `k == 0`, or a slice length does not match.
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d_prefill(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    state: &mut [f32],
    out: &mut [f32],
    t: usize,
    c: usize,
    k: usize,
) -> Result<(), GdnError> {
    if c == 0 || k == 0 {
        return Err(GdnError::Dims("conv channels and kernel size must be > 0"));
    }
    let km1 = k - 1;
    check_len("x", x.len(), prod(&[t, c])?)?;
    check_len("w", w.len(), prod(&[c, k])?)?;
    if let Some(b) = bias {
        check_len("bias", b.len(), c)?;
    }
    check_len("state", state.len(), prod(&[c, km1])?)?;
    check_len("out", out.len(), prod(&[t, c])?)?;
    if t == 0 {
        return Ok(());
    }

    // Transposed weight [K][C] and history [K-1][C], so that the inner loop
    // runs over contiguous channels.
    let mut wt = vec![0.0f32; k * c];
    let mut hist = vec![0.0f32; km1 * c];
    for ch in 0..c {
        for j in 0..k {
            wt[j * c + ch] = w[ch * k + j];
        }
        for i in 0..km1 {
            hist[i * c + ch] = state[ch * km1 + i];
        }
    }
    // Row `idx` of the virtual sequence [hist; x] (K-1 + T rows).
    let row = |idx: usize| -> &[f32] {
        if idx < km1 {
            &hist[idx * c..(idx + 1) * c]
        } else {
            &x[(idx - km1) * c..(idx - km1 + 1) * c]
        }
    };

    out.par_chunks_mut(c).enumerate().with_min_len(4).for_each(|(tt, orow)| {
        orow.fill(0.0);
        for j in 0..k {
            let src = row(tt + j);
            let wr = &wt[j * c..(j + 1) * c];
            for ((o, &wv), &xv) in orow.iter_mut().zip(wr).zip(src) {
                *o += wv * xv;
            }
        }
        match bias {
            Some(b) => {
                for (o, &bv) in orow.iter_mut().zip(b) {
                    *o = silu(*o + bv);
                }
            }
            None => {
                for o in orow.iter_mut() {
                    *o = silu(*o);
                }
            }
        }
    });

    // New state: the last K-1 rows of [hist; x].
    for i in 0..km1 {
        let src = row(t + i);
        for (ch, &v) in src.iter().enumerate() {
            state[ch * km1 + i] = v;
        }
    }
    Ok(())
}

/// One decode step of the causal depthwise conv1d + SiLU (the `T = 1` case of
/// [`causal_conv1d_prefill`], with the same arithmetic order, so both give
/// bit-identical results).
///
/// `y[c] = silu(Σ_{i<K−1} w[c, i] · state[c, i] + w[c, K−1] · x[c] + bias[c])`,
/// then `state[c, :]` is shifted left by one and `x[c]` appended.
///
/// # Shapes
/// - `x`: `[C]` (one token)
/// - `w`: `[C, K]`
/// - `bias`: `[C]` or `None`
/// - `state`: `[C, K − 1]`, oldest input first
/// - `out`: `[C]`
///
/// # Errors
/// [`GdnError`] if `c == 0`, `k == 0`, or a slice length does not match.
pub fn causal_conv1d_update(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    state: &mut [f32],
    out: &mut [f32],
    c: usize,
    k: usize,
) -> Result<(), GdnError> {
    if c == 0 || k == 0 {
        return Err(GdnError::Dims("conv channels and kernel size must be > 0"));
    }
    let km1 = k - 1;
    check_len("x", x.len(), c)?;
    check_len("w", w.len(), prod(&[c, k])?)?;
    if let Some(b) = bias {
        check_len("bias", b.len(), c)?;
    }
    check_len("state", state.len(), prod(&[c, km1])?)?;
    check_len("out", out.len(), c)?;

    for ch in 0..c {
        let wr = &w[ch * k..(ch + 1) * k];
        let st = &mut state[ch * km1..(ch + 1) * km1];
        let mut acc = 0.0f32;
        for (&wv, &sv) in wr.iter().zip(st.iter()) {
            acc += wv * sv;
        }
        acc += wr[km1] * x[ch];
        if let Some(b) = bias {
            acc += b[ch];
        }
        out[ch] = silu(acc);
        if km1 > 0 {
            st.copy_within(1.., 0);
            st[km1 - 1] = x[ch];
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Gates and norms
// ---------------------------------------------------------------------------

/// GDN gates per token and v-head:
/// `g = −exp(A_log) · softplus(a + dt_bias)` (log-decay, `≤ 0`; softplus with
/// threshold 20) and `beta = sigmoid(b)`. All in `f32`.
///
/// `Hv` is taken from `a_log.len()`.
///
/// # Shapes
/// - `a`, `b`: `[T, Hv]`
/// - `a_log`, `dt_bias`: `[Hv]`
/// - `g`, `beta` (outputs): `[T, Hv]`
///
/// # Errors
/// [`GdnError`] if `a_log` is empty or a slice length does not match.
pub fn gdn_gates(
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    g: &mut [f32],
    beta: &mut [f32],
) -> Result<(), GdnError> {
    let hv = a_log.len();
    if hv == 0 {
        return Err(GdnError::Dims("a_log is empty (Hv = 0)"));
    }
    if !is_multiple(a.len(), hv) {
        return Err(GdnError::Dims("a.len() is not a multiple of Hv"));
    }
    let n = a.len();
    check_len("dt_bias", dt_bias.len(), hv)?;
    check_len("b", b.len(), n)?;
    check_len("g", g.len(), n)?;
    check_len("beta", beta.len(), n)?;

    let neg_a: Vec<f32> = a_log.iter().map(|&al| -al.exp()).collect();
    for (((ga, aa), gr), br) in
        g.chunks_exact_mut(hv).zip(a.chunks_exact(hv)).zip(beta.chunks_exact_mut(hv)).zip(b.chunks_exact(hv))
    {
        for h in 0..hv {
            ga[h] = neg_a[h] * softplus(aa[h] + dt_bias[h]);
            gr[h] = sigmoid(br[h]);
        }
    }
    Ok(())
}

/// In-place L2 normalisation of every row, times `scale`:
/// `x ← x · rsqrt(Σ x² + 1e-6) · scale` (eps inside the sum, as FLA's
/// `l2norm`). Use `scale = dk^-0.5` for q and `1.0` for k.
///
/// # Shapes
/// - `x`: `[N, dim]`
///
/// # Errors
/// [`GdnError`] if `dim == 0` or `x.len()` is not a multiple of `dim`.
pub fn l2norm_rows(x: &mut [f32], dim: usize, scale: f32) -> Result<(), GdnError> {
    if dim == 0 {
        return Err(GdnError::Dims("l2norm dim must be > 0"));
    }
    if !is_multiple(x.len(), dim) {
        return Err(GdnError::Dims("x.len() is not a multiple of dim"));
    }
    x.par_chunks_mut(dim).with_min_len(64).for_each(|row| {
        let ss: f32 = row.iter().map(|&v| v * v).sum();
        let r = (ss + 1e-6).sqrt().recip() * scale;
        for v in row.iter_mut() {
            *v *= r;
        }
    });
    Ok(())
}

/// Gated RMS norm (`linear_attn.norm` of Qwen3-Next, fused form of
/// FLA / vLLM / LightLLM): per row,
/// `x ← (x · rsqrt(mean(x²) + eps) · w) · silu(z)`, entirely in `f32`.
/// The weight is plain `w` (no `1 + w`).
///
/// `d` is taken from `w.len()`.
///
/// # Shapes
/// - `x`: `[N, d]` (one row per token and v-head), normalised in place
/// - `z`: `[N, d]` (the gate, same head order as `x`)
/// - `w`: `[d]`
///
/// # Errors
/// [`GdnError`] if `w` is empty or a slice length does not match.
pub fn gated_rms_norm(x: &mut [f32], z: &[f32], w: &[f32], eps: f32) -> Result<(), GdnError> {
    let d = w.len();
    if d == 0 {
        return Err(GdnError::Dims("gated_rms_norm weight is empty"));
    }
    if !is_multiple(x.len(), d) {
        return Err(GdnError::Dims("x.len() is not a multiple of w.len()"));
    }
    check_len("z", z.len(), x.len())?;
    let inv_d = 1.0 / d as f32;
    x.par_chunks_mut(d).zip(z.par_chunks(d)).with_min_len(64).for_each(|(row, zr)| {
        let ss: f32 = row.iter().map(|&v| v * v).sum();
        let r = (ss * inv_d + eps).sqrt().recip();
        for ((v, &wv), &zv) in row.iter_mut().zip(w).zip(zr) {
            *v = (*v * r * wv) * silu(zv);
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------
// Gated delta rule: shared validation
// ---------------------------------------------------------------------------

/// Validated inputs of one gated-delta-rule call.
struct Seq<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
}

impl Seq<'_> {
    /// Key head read by value head `j`.
    #[inline(always)]
    fn kh(&self, j: usize) -> usize {
        j / (self.hv / self.hk)
    }
    #[inline(always)]
    fn q_row(&self, tt: usize, kh: usize) -> &[f32] {
        let o = (tt * self.hk + kh) * self.dk;
        &self.q[o..o + self.dk]
    }
    #[inline(always)]
    fn k_row(&self, tt: usize, kh: usize) -> &[f32] {
        let o = (tt * self.hk + kh) * self.dk;
        &self.k[o..o + self.dk]
    }
    #[inline(always)]
    fn v_row(&self, tt: usize, j: usize) -> &[f32] {
        let o = (tt * self.hv + j) * self.dv;
        &self.v[o..o + self.dv]
    }
    #[inline(always)]
    fn g_at(&self, tt: usize, j: usize) -> f32 {
        self.g[tt * self.hv + j]
    }
    #[inline(always)]
    fn beta_at(&self, tt: usize, j: usize) -> f32 {
        self.beta[tt * self.hv + j]
    }
}

#[allow(clippy::too_many_arguments)]
fn validate<'a>(
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    state_len: usize,
    out_len: usize,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<Seq<'a>, GdnError> {
    if hk == 0 || hv == 0 || dk == 0 || dv == 0 {
        return Err(GdnError::Dims("hk, hv, dk and dv must be > 0"));
    }
    if !is_multiple(hv, hk) {
        return Err(GdnError::Dims("hv must be a multiple of hk"));
    }
    check_len("q", q.len(), prod(&[t, hk, dk])?)?;
    check_len("k", k.len(), prod(&[t, hk, dk])?)?;
    check_len("v", v.len(), prod(&[t, hv, dv])?)?;
    check_len("g", g.len(), prod(&[t, hv])?)?;
    check_len("beta", beta.len(), prod(&[t, hv])?)?;
    check_len("state", state_len, prod(&[hv, dk, dv])?)?;
    check_len("out", out_len, prod(&[t, hv, dv])?)?;
    Ok(Seq { q, k, v, g, beta, t, hk, hv, dk, dv })
}

/// Tokens per slab in [`for_each_head`]: a multiple of [`GDN_CHUNK`], so that
/// slab boundaries are chunk boundaries.
const SLAB: usize = 4 * GDN_CHUNK;

impl<'a> Seq<'a> {
    /// Tokens `[a, b)` of the sequence.
    fn slab(&self, a: usize, b: usize) -> Seq<'a> {
        let (hk, hv, dk, dv) = (self.hk, self.hv, self.dk, self.dv);
        Seq {
            q: &self.q[a * hk * dk..b * hk * dk],
            k: &self.k[a * hk * dk..b * hk * dk],
            v: &self.v[a * hv * dv..b * hv * dv],
            g: &self.g[a * hv..b * hv],
            beta: &self.beta[a * hv..b * hv],
            t: b - a,
            hk,
            hv,
            dk,
            dv,
        }
    }
}

/// Runs `head(p, j, state_j, out_j)` for every v-head `j` in parallel, where
/// `out_j` is a head-major `[t, dv]` buffer, then scatters it into `out`
/// `[T, Hv, dv]`. Long sequences go in slabs of [`SLAB`] tokens (the state
/// carries over), so the head-major buffer stays small and is reused.
fn for_each_head<F>(p: &Seq<'_>, state: &mut [f32], out: &mut [f32], head: F)
where
    F: Fn(&Seq<'_>, usize, &mut [f32], &mut [f32]) + Sync + Send,
{
    let (t, hv, dv, dk) = (p.t, p.hv, p.dv, p.dk);
    if t == 1 {
        // [1, Hv, dv] is already head-major.
        state.par_chunks_mut(dk * dv).zip(out.par_chunks_mut(dv)).enumerate().for_each(|(j, (s, o))| head(p, j, s, o));
        return;
    }
    let mut tmp = vec![0.0f32; hv * SLAB.min(t) * dv];
    let mut a = 0;
    while a < t {
        let b = t.min(a + SLAB);
        let ps = p.slab(a, b);
        let ts = b - a;
        let tmp = &mut tmp[..hv * ts * dv];
        state
            .par_chunks_mut(dk * dv)
            .zip(tmp.par_chunks_mut(ts * dv))
            .enumerate()
            .for_each(|(j, (s, o))| head(&ps, j, s, o));
        out[a * hv * dv..b * hv * dv].par_chunks_mut(hv * dv).enumerate().with_min_len(16).for_each(|(tt, orow)| {
            for (j, oh) in orow.chunks_exact_mut(dv).enumerate() {
                let src = (j * ts + tt) * dv;
                oh.copy_from_slice(&tmp[src..src + dv]);
            }
        });
        a = b;
    }
}

// ---------------------------------------------------------------------------
// Recurrent (token by token) form
// ---------------------------------------------------------------------------

/// Gated delta rule, token by token (the decode path; HF
/// `torch_recurrent_gated_delta_rule`, FLA `fused_recurrent_gated_delta_rule`).
///
/// For every token `t` and v-head `j` (key head `kh = j / (Hv / Hk)`), with
/// `S = state[j]` (`[dk, dv]`):
/// ```text
/// S  = exp(g[t,j]) · S
/// kv = Sᵀ k[t,kh]                    (kv[v] = Σ_i S[i,v] k[i])
/// δ  = beta[t,j] · (v[t,j] − kv)
/// S  = S + k[t,kh] ⊗ δ               (S[i,v] += k[i] δ[v])
/// out[t,j] = Sᵀ q[t,kh]              (the UPDATED state)
/// ```
/// q and k must already be L2-normalised ([`l2norm_rows`]) and q scaled by
/// `dk^-0.5`; the kernel applies no scale. `state` is read as the initial
/// state and left holding the final state, so calls can be chained over a
/// sequence, and mixed with [`chunked_gated_delta_rule`]. Parallel over
/// v-heads (rayon). `T = 0` is a no-op.
///
/// Columns of `S` evolve independently, so each head is scanned in blocks of
/// 16 state columns that stay in L1 over all tokens; on x86-64 an AVX2+FMA
/// version is picked at run time. A decay factor `exp(g)` below `e^−60` is
/// flushed to exactly 0 (a full reset in `f32` terms), which avoids
/// subnormal arithmetic.
///
/// # Shapes
/// - `q`, `k`: `[T, Hk, dk]`
/// - `v`: `[T, Hv, dv]`
/// - `g`, `beta`: `[T, Hv]` (log-decay and write strength, see [`gdn_gates`])
/// - `state`: `[Hv, dk, dv]`, k-major, updated in place
/// - `out`: `[T, Hv, dv]`
///
/// # Errors
/// [`GdnError`] if a dimension is zero, `Hv % Hk != 0`, or a slice length
/// does not match; nothing is written then.
#[allow(clippy::too_many_arguments)]
pub fn recurrent_gated_delta_rule(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<(), GdnError> {
    let p = validate(q, k, v, g, beta, state.len(), out.len(), t, hk, hv, dk, dv)?;
    if t == 0 {
        return Ok(());
    }
    for_each_head(&p, state, out, recurrent_head);
    Ok(())
}

/// Recurrence of one v-head over all tokens; picks the best code path.
fn recurrent_head(p: &Seq<'_>, j: usize, s: &mut [f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above), which
            // is the only requirement of `recurrent_head_avx2`.
            unsafe { recurrent_head_avx2(p, j, s, o) };
            return;
        }
    }
    recurrent_head_impl::<{ cfg!(target_arch = "aarch64") }>(p, j, s, o);
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn recurrent_head_avx2(p: &Seq<'_>, j: usize, s: &mut [f32], o: &mut [f32]) {
    recurrent_head_impl::<true>(p, j, s, o);
}

/// `a·b + c`, fused when `FMA` (only instantiated with `FMA = true` where the
/// target has a hardware FMA; otherwise `mul_add` would call libm).
#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Scans one v-head (`s`: `[dk, dv]`, `o`: head-major `[T, dv]`) in column
/// blocks of `REC_COLS`. For short calls (decode) the blocks are scanned in
/// place; for longer ones each block is first copied to a contiguous buffer
/// (rows of the state are `dv` floats apart, which maps a block's 128 rows
/// onto few L1 sets).
#[inline(always)]
fn recurrent_head_impl<const FMA: bool>(p: &Seq<'_>, j: usize, s: &mut [f32], o: &mut [f32]) {
    const CB: usize = REC_COLS;
    let (t, dk, dv) = (p.t, p.dk, p.dv);
    let mut blk: Vec<f32> = Vec::new();
    let mut c0 = 0;
    while c0 < dv {
        let cw = CB.min(dv - c0);
        if cw == CB && t <= 4 {
            scan_block::<FMA>(p, j, s, dv, c0, c0, cw, o);
        } else {
            blk.resize(dk * CB, 0.0);
            for (row, src) in blk.chunks_exact_mut(CB).zip(s.chunks_exact(dv)) {
                row[..cw].copy_from_slice(&src[c0..c0 + cw]);
                row[cw..].fill(0.0);
            }
            scan_block::<FMA>(p, j, &mut blk, CB, 0, c0, cw, o);
            for (row, dst) in blk.chunks_exact(CB).zip(s.chunks_exact_mut(dv)) {
                dst[c0..c0 + cw].copy_from_slice(&row[..cw]);
            }
        }
        c0 += CB;
    }
}

/// Runs all tokens of `p` through one block of `REC_COLS` state columns:
/// row `i` of the block is `rows[i * stride + off..][..REC_COLS]`, and the
/// block holds state columns `c0..c0 + cw` (`cw < REC_COLS` only for a padded
/// copy, whose extra columns are zero and stay zero). Per token one fused
/// pass over the rows does the rank-1 update and output of token `t` together
/// with the decay and `Sᵀk` of token `t + 1`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn scan_block<const FMA: bool>(
    p: &Seq<'_>,
    j: usize,
    rows: &mut [f32],
    stride: usize,
    off: usize,
    c0: usize,
    cw: usize,
    o: &mut [f32],
) {
    const CB: usize = REC_COLS;
    let (t, dv) = (p.t, p.dv);
    let kh = p.kh(j);
    // Every row has `off + CB <= stride` floats, so `first_chunk_mut` never
    // fails; the `let .. else` only avoids an unwrap.
    macro_rules! block_rows {
        () => {
            rows.chunks_exact_mut(stride).filter_map(|r| r[off..].first_chunk_mut::<CB>())
        };
    }
    // Prologue: decay by exp(g_0) and kv = Sᵀ k_0.
    let mut kv = [0.0f32; CB];
    {
        let a = decay_exp(p.g_at(0, j));
        for (row, &ki) in block_rows!().zip(p.k_row(0, kh)) {
            for c in 0..CB {
                row[c] *= a;
                kv[c] = fmadd::<FMA>(ki, row[c], kv[c]);
            }
        }
    }
    for tt in 0..t {
        let b = p.beta_at(tt, j);
        let vr = &p.v_row(tt, j)[c0..c0 + cw];
        let mut delta = [0.0f32; CB];
        for c in 0..cw {
            delta[c] = b * (vr[c] - kv[c]);
        }
        let kt = p.k_row(tt, kh);
        let qt = p.q_row(tt, kh);
        let mut acc = [0.0f32; CB];
        kv = [0.0f32; CB];
        if tt + 1 < t {
            let a = decay_exp(p.g_at(tt + 1, j));
            let kn = p.k_row(tt + 1, kh);
            for (((row, &ki), &qi), &kni) in block_rows!().zip(kt).zip(qt).zip(kn) {
                for c in 0..CB {
                    let sv = fmadd::<FMA>(ki, delta[c], row[c]);
                    acc[c] = fmadd::<FMA>(qi, sv, acc[c]);
                    let sd = sv * a;
                    kv[c] = fmadd::<FMA>(kni, sd, kv[c]);
                    row[c] = sd;
                }
            }
        } else {
            for ((row, &ki), &qi) in block_rows!().zip(kt).zip(qt) {
                for c in 0..CB {
                    let sv = fmadd::<FMA>(ki, delta[c], row[c]);
                    acc[c] = fmadd::<FMA>(qi, sv, acc[c]);
                    row[c] = sv;
                }
            }
        }
        o[tt * dv + c0..tt * dv + c0 + cw].copy_from_slice(&acc[..cw]);
    }
}

// ---------------------------------------------------------------------------
// Chunked (WY / UT) form
// ---------------------------------------------------------------------------

/// Gated delta rule in the chunked WY/UT form (the prefill path; HF
/// `torch_chunk_gated_delta_rule`, FLA `chunk_gated_delta_rule`): the same
/// recurrence and the same result as [`recurrent_gated_delta_rule`], up to
/// `f32` rounding (about 1e-6 relative).
///
/// Tokens are taken in chunks of [`GDN_CHUNK`] = 64 (the last one may be
/// shorter; there is no padding). Within a chunk, with `G = cumsum(g)`,
/// `Γ[i,m] = exp(G_i − G_m)` for `i ≥ m`, and `S` the state at chunk start:
/// ```text
/// A  = −(diag(β) K Kᵀ ⊙ Γ), strictly lower;   T = (I − A)⁻¹ (forward substitution)
/// U  = T (β ⊙ V);   W = T (β ⊙ K ⊙ exp(G))
/// Vn = U − W S
/// O  = (Q ⊙ exp(G)) S + tril(Q Kᵀ ⊙ Γ) Vn
/// S  = exp(G_last) S + (K ⊙ exp(G_last − G))ᵀ Vn
/// ```
/// The code computes `Vn = T (β⊙V − (β⊙K⊙exp(G)) S)`, which is `U − W S`
/// reassociated (one matmul fewer), and keeps `G` in `f64`: an `f32` cumsum,
/// as in HF's fallback, loses ~`ulp(|G|)` in every `G_i − G_m` and gave
/// ~1e-5 relative error on fast-decaying heads. Decay factors below `e^−60`
/// are flushed to 0 (see the recurrent kernel), avoiding subnormals.
///
/// The chunk matmuls go through `gemm` (single-threaded per call); the
/// parallelism is over v-heads (rayon). Preconditions and state semantics are
/// those of [`recurrent_gated_delta_rule`]: q, k L2-normalised, q scaled by
/// `dk^-0.5`, `state` in/out. `T = 0` is a no-op.
///
/// On CPU this form does about as many flops per token as the recurrent one
/// (`3·dk·dv` + `O(64·(dk+dv))` vs `4·dk·dv`), so it is not faster there;
/// measured on a 16-core Xeon (AVX2 path): 1 thread 5.6K vs 8.0K tokens/s,
/// 16 threads 49K vs 70K tokens/s for recurrent, at Qwen3-Next shapes.
///
/// # Shapes
/// - `q`, `k`: `[T, Hk, dk]`
/// - `v`: `[T, Hv, dv]`
/// - `g`, `beta`: `[T, Hv]`
/// - `state`: `[Hv, dk, dv]`, k-major, updated in place
/// - `out`: `[T, Hv, dv]`
///
/// # Errors
/// [`GdnError`] if a dimension is zero, `Hv % Hk != 0`, or a slice length
/// does not match; nothing is written then.
#[allow(clippy::too_many_arguments)]
pub fn chunked_gated_delta_rule(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<(), GdnError> {
    let p = validate(q, k, v, g, beta, state.len(), out.len(), t, hk, hv, dk, dv)?;
    if t == 0 {
        return Ok(());
    }
    for_each_head(&p, state, out, chunked_head);
    Ok(())
}

/// `dst[m×n] (row stride dst_rs) ← alpha·dst + beta·lhs·rhs` when
/// `alpha = Some(..)`, else `dst ← beta·lhs·rhs`. `lhs` is `m×kd` with
/// strides (`lhs_rs`, `lhs_cs`), `rhs` is `kd×n` with (`rhs_rs`, `rhs_cs`).
/// Single-threaded.
///
/// Panics if a slice is too short for its extent (an internal invariant: all
/// callers are in this module with sizes computed here).
#[allow(clippy::too_many_arguments)]
fn mm(
    m: usize,
    n: usize,
    kd: usize,
    dst: &mut [f32],
    dst_rs: usize,
    lhs: &[f32],
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: &[f32],
    rhs_rs: usize,
    rhs_cs: usize,
    alpha: Option<f32>,
    beta: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    let extent = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs + 1;
    assert!(extent(m, n, dst_rs, 1) <= dst.len(), "mm: dst too short");
    if kd == 0 {
        for r in 0..m {
            let row = &mut dst[r * dst_rs..r * dst_rs + n];
            match alpha {
                Some(a) => row.iter_mut().for_each(|x| *x *= a),
                None => row.fill(0.0),
            }
        }
        return;
    }
    assert!(extent(m, kd, lhs_rs, lhs_cs) <= lhs.len(), "mm: lhs too short");
    assert!(extent(kd, n, rhs_rs, rhs_cs) <= rhs.len(), "mm: rhs too short");
    // SAFETY: every element that gemm reads or writes lies inside the slices
    // (checked above with the same strides); `dst` is a unique borrow, so it
    // cannot alias `lhs` or `rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            kd,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            alpha.is_some(),
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            alpha.unwrap_or(0.0),
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Chunked recurrence of one v-head (`s`: `[dk, dv]`, `o`: head-major `[T, dv]`).
///
/// Per chunk of `l ≤ 64` tokens (`S` = state at chunk start):
/// ```text
/// [K; Q] Kᵀ                     one gemm (2l × l × dk) → A (strictly lower) and P
/// T  = (I − A)⁻¹                forward substitution
/// Vn = T (β⊙V − (β⊙K⊙exp(G)) S)  = U − W S, reassociated: two gemms, no W
/// O  = (Q⊙exp(G)) S + P Vn      two gemms
/// S  = exp(G_last) S + (K⊙exp(G_last − G))ᵀ Vn
/// ```
fn chunked_head(p: &Seq<'_>, j: usize, s: &mut [f32], o: &mut [f32]) {
    const C: usize = GDN_CHUNK;
    let (t, dk, dv) = (p.t, p.dk, p.dv);
    let kh = p.kh(j);

    // Rows 0..l: K (later K ⊙ exp(G_last − G)); rows l..2l: Q (later Q ⊙ exp(G)).
    let mut kq = vec![0.0f32; 2 * C * dk];
    let mut bk = vec![0.0f32; C * dk]; // β ⊙ K ⊙ exp(G)
    let mut r = vec![0.0f32; C * dv]; // β ⊙ V, then R = β⊙V − bk S
    let mut vn = vec![0.0f32; C * dv]; // Vn = T R
    let mut x = vec![0.0f32; 2 * C * C]; // [K; Q] Kᵀ (row stride C); rows 0..l → A → T, rows l..2l → P
                                         // G = cumsum(g), in f64: Γ = exp(G_i − G_m) needs the difference of two
                                         // large sums to f32 accuracy (an f32 cumsum loses ~ulp(|G|) absolute).
    let mut gc = [0.0f64; C];
    let mut eg = [0.0f32; C]; // exp(G)
    let mut bt = [0.0f32; C]; // β
    let mut row = [0.0f32; C];

    let mut t0 = 0;
    while t0 < t {
        let l = C.min(t - t0);

        // Gather the chunk.
        let mut acc = 0.0f64;
        for i in 0..l {
            let tt = t0 + i;
            acc += p.g_at(tt, j) as f64;
            gc[i] = acc;
            eg[i] = decay_exp(acc as f32);
            bt[i] = p.beta_at(tt, j);
            let kr = p.k_row(tt, kh);
            kq[i * dk..(i + 1) * dk].copy_from_slice(kr);
            kq[(l + i) * dk..(l + i + 1) * dk].copy_from_slice(p.q_row(tt, kh));
            let f = bt[i] * eg[i];
            for (d, &kv) in bk[i * dk..(i + 1) * dk].iter_mut().zip(kr) {
                *d = f * kv;
            }
            let b = bt[i];
            for (d, &vv) in r[i * dv..(i + 1) * dv].iter_mut().zip(p.v_row(tt, j)) {
                *d = b * vv;
            }
        }
        let g_last = gc[l - 1];

        // [K; Q] Kᵀ: (2l × l), row stride C.
        mm(2 * l, l, dk, &mut x, C, &kq, dk, 1, &kq, 1, dk, None, 1.0);
        let (tm, pm) = x.split_at_mut(l * C);

        // A = −β K Kᵀ ⊙ Γ (strictly lower) and P = tril(Q Kᵀ ⊙ Γ).
        for i in 0..l {
            let gi = gc[i];
            let bi = bt[i];
            let ti = &mut tm[i * C..i * C + l];
            let pi = &mut pm[i * C..i * C + l];
            for m in 0..i {
                let gam = decay_exp((gi - gc[m]) as f32);
                ti[m] *= -bi * gam;
                pi[m] *= gam;
            }
            ti[i..].fill(0.0);
            pi[i + 1..].fill(0.0);
        }
        // Forward substitution: T[i, :i] = A[i, :i] + Σ_{m<i} A[i, m] T[m, :m].
        for i in 1..l {
            let (above, cur) = tm.split_at_mut(i * C);
            let cur = &mut cur[..i];
            row[..i].copy_from_slice(cur);
            for m in 1..i {
                let a = row[m];
                if a != 0.0 {
                    let tmr = &above[m * C..m * C + m];
                    for (c, &tv) in cur[..m].iter_mut().zip(tmr) {
                        *c += a * tv;
                    }
                }
            }
        }
        for i in 0..l {
            tm[i * C + i] = 1.0;
        }

        // R = β⊙V − (β⊙K⊙exp(G)) S;  Vn = T R.
        mm(l, dv, dk, &mut r, dv, &bk, dk, 1, s, dv, 1, Some(1.0), -1.0);
        mm(l, dv, l, &mut vn, dv, tm, C, 1, &r, dv, 1, None, 1.0);

        // O = (Q ⊙ exp(G)) S + P Vn.
        let (kd, qg) = kq.split_at_mut(l * dk);
        for i in 0..l {
            let e = eg[i];
            qg[i * dk..(i + 1) * dk].iter_mut().for_each(|v| *v *= e);
        }
        let oc = &mut o[t0 * dv..(t0 + l) * dv];
        mm(l, dv, dk, oc, dv, qg, dk, 1, s, dv, 1, None, 1.0);
        mm(l, dv, l, oc, dv, pm, C, 1, &vn, dv, 1, Some(1.0), 1.0);

        // S = exp(G_last) S + (K ⊙ exp(G_last − G))ᵀ Vn.
        for i in 0..l {
            let e = decay_exp((g_last - gc[i]) as f32);
            kd[i * dk..(i + 1) * dk].iter_mut().for_each(|v| *v *= e);
        }
        mm(dk, dv, l, s, dv, kd, 1, dk, &vn, dv, 1, Some(decay_exp(g_last as f32)), 1.0);

        t0 += l;
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64* PRNG, uniform f32 in [-1, 1).
    struct Rng(u64);
    impl Rng {
        fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn uni(&mut self) -> f32 {
            ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| self.uni() * scale).collect()
        }
    }

    fn max_abs(a: &[f32]) -> f32 {
        a.iter().fold(0.0f32, |m, &x| m.max(x.abs()))
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).fold(0.0f32, |m, (&x, &y)| m.max((x - y).abs()))
    }

    /// Random GDN problem with realistic gates and normalised q, k.
    struct Prob {
        t: usize,
        hk: usize,
        hv: usize,
        dk: usize,
        dv: usize,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        s0: Vec<f32>,
    }

    impl Prob {
        fn new(seed: u64, t: usize, hk: usize, hv: usize, dk: usize, dv: usize, s0: bool) -> Self {
            let mut r = Rng::new(seed);
            let mut q = r.vec(t * hk * dk, 1.0);
            let mut k = r.vec(t * hk * dk, 1.0);
            l2norm_rows(&mut q, dk, (dk as f32).powf(-0.5)).unwrap();
            l2norm_rows(&mut k, dk, 1.0).unwrap();
            let v = r.vec(t * hv * dv, 1.0);
            let a = r.vec(t * hv, 4.0);
            let b = r.vec(t * hv, 4.0);
            // exp(A_log) from ~0.02 (slow decay) to ~12 (fast decay) across heads.
            let a_log: Vec<f32> = (0..hv).map(|h| -4.0 + 6.5 * h as f32 / (hv.max(2) - 1) as f32).collect();
            let dt_bias = r.vec(hv, 1.0);
            let mut g = vec![0.0; t * hv];
            let mut beta = vec![0.0; t * hv];
            gdn_gates(&a, &b, &a_log, &dt_bias, &mut g, &mut beta).unwrap();
            let s0 = if s0 { r.vec(hv * dk * dv, 0.5) } else { vec![0.0; hv * dk * dv] };
            Prob { t, hk, hv, dk, dv, q, k, v, g, beta, s0 }
        }

        /// Token range [a, b) of the inputs.
        fn slice(&self, a: usize, b: usize) -> Prob {
            let (hk, hv, dk, dv) = (self.hk, self.hv, self.dk, self.dv);
            Prob {
                t: b - a,
                hk,
                hv,
                dk,
                dv,
                q: self.q[a * hk * dk..b * hk * dk].to_vec(),
                k: self.k[a * hk * dk..b * hk * dk].to_vec(),
                v: self.v[a * hv * dv..b * hv * dv].to_vec(),
                g: self.g[a * hv..b * hv].to_vec(),
                beta: self.beta[a * hv..b * hv].to_vec(),
                s0: Vec::new(),
            }
        }

        /// Runs `f` (recurrent or chunked) from `state`; returns the output.
        fn run(&self, f: RuleFn, state: &mut [f32]) -> Vec<f32> {
            let mut out = vec![0.0; self.t * self.hv * self.dv];
            f(
                &self.q, &self.k, &self.v, &self.g, &self.beta, state, &mut out, self.t, self.hk, self.hv, self.dk,
                self.dv,
            )
            .unwrap();
            out
        }
    }

    type RuleFn = fn(
        &[f32],
        &[f32],
        &[f32],
        &[f32],
        &[f32],
        &mut [f32],
        &mut [f32],
        usize,
        usize,
        usize,
        usize,
        usize,
    ) -> Result<(), GdnError>;

    /// [`recurrent_gated_delta_rule`] forced onto the portable (non-AVX2) code.
    #[allow(clippy::too_many_arguments)]
    fn recurrent_portable(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
        state: &mut [f32],
        out: &mut [f32],
        t: usize,
        hk: usize,
        hv: usize,
        dk: usize,
        dv: usize,
    ) -> Result<(), GdnError> {
        let p = validate(q, k, v, g, beta, state.len(), out.len(), t, hk, hv, dk, dv)?;
        if t > 0 {
            for_each_head(&p, state, out, recurrent_head_impl::<false>);
        }
        Ok(())
    }

    /// The recurrence as plainly as possible, in f64, with dense updates.
    fn brute_force(p: &Prob, state: &mut [f32]) -> Vec<f32> {
        let (hk, hv, dk, dv) = (p.hk, p.hv, p.dk, p.dv);
        let mut out = vec![0.0f32; p.t * hv * dv];
        for j in 0..hv {
            let kh = j / (hv / hk);
            let mut s: Vec<Vec<f64>> =
                (0..dk).map(|i| (0..dv).map(|c| state[(j * dk + i) * dv + c] as f64).collect()).collect();
            for tt in 0..p.t {
                let q: Vec<f64> = (0..dk).map(|i| p.q[(tt * hk + kh) * dk + i] as f64).collect();
                let k: Vec<f64> = (0..dk).map(|i| p.k[(tt * hk + kh) * dk + i] as f64).collect();
                let v: Vec<f64> = (0..dv).map(|c| p.v[(tt * hv + j) * dv + c] as f64).collect();
                let alpha = (p.g[tt * hv + j] as f64).exp();
                let beta = p.beta[tt * hv + j] as f64;
                for row in s.iter_mut() {
                    for x in row.iter_mut() {
                        *x *= alpha;
                    }
                }
                let mut delta = vec![0.0f64; dv];
                for c in 0..dv {
                    let mut kv = 0.0;
                    for i in 0..dk {
                        kv += s[i][c] * k[i];
                    }
                    delta[c] = beta * (v[c] - kv);
                }
                for i in 0..dk {
                    for c in 0..dv {
                        s[i][c] += k[i] * delta[c];
                    }
                }
                for c in 0..dv {
                    let mut o = 0.0;
                    for i in 0..dk {
                        o += s[i][c] * q[i];
                    }
                    out[(tt * hv + j) * dv + c] = o as f32;
                }
            }
            for i in 0..dk {
                for c in 0..dv {
                    state[(j * dk + i) * dv + c] = s[i][c] as f32;
                }
            }
        }
        out
    }

    // 300 spans two slabs of `for_each_head`.
    const TS: [usize; 8] = [1, 5, 63, 64, 65, 150, 200, 300];
    // (hk, hv, dk, dv)
    const CFGS: [(usize, usize, usize, usize); 2] = [(2, 4, 16, 24), (3, 3, 16, 24)];

    #[test]
    fn recurrent_and_chunked_match_brute_force() {
        for (name, f, tol) in [
            ("recurrent", recurrent_gated_delta_rule as RuleFn, 1e-5f32),
            ("chunked", chunked_gated_delta_rule as RuleFn, 1e-5f32),
            ("recurrent (portable path)", recurrent_portable as RuleFn, 1e-5f32),
        ] {
            let mut worst = 0.0f32;
            for &(hk, hv, dk, dv) in &CFGS {
                for &t in &TS {
                    for s0 in [false, true] {
                        let p = Prob::new(7 + t as u64, t, hk, hv, dk, dv, s0);
                        let mut s_ref = p.s0.clone();
                        let o_ref = brute_force(&p, &mut s_ref);
                        let mut s = p.s0.clone();
                        let o = p.run(f, &mut s);
                        let d = max_diff(&o, &o_ref) / max_abs(&o_ref).max(1e-3);
                        let ds = max_diff(&s, &s_ref) / max_abs(&s_ref).max(1e-3);
                        worst = worst.max(d).max(ds);
                        assert!(
                            d <= tol && ds <= tol,
                            "{name} t={t} cfg={hk},{hv},{dk},{dv} s0={s0}: out {d:e} state {ds:e}"
                        );
                    }
                }
            }
            println!("{name} vs f64 brute force: worst relative diff {worst:.2e}");
        }
    }

    #[test]
    fn chunked_matches_recurrent() {
        let mut worst = 0.0f32;
        let mut cases: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
        for &(hk, hv, dk, dv) in &CFGS {
            for &t in &TS {
                cases.push((t, hk, hv, dk, dv));
            }
        }
        cases.push((150, 1, 2, 128, 128));
        for (t, hk, hv, dk, dv) in cases {
            for s0 in [false, true] {
                let p = Prob::new(100 + t as u64, t, hk, hv, dk, dv, s0);
                let mut s_r = p.s0.clone();
                let o_r = p.run(recurrent_gated_delta_rule, &mut s_r);
                let mut s_c = p.s0.clone();
                let o_c = p.run(chunked_gated_delta_rule, &mut s_c);
                let scale = max_abs(&o_r).max(1e-3);
                let d = max_diff(&o_c, &o_r) / scale;
                let ds = max_diff(&s_c, &s_r) / max_abs(&s_r).max(1e-3);
                println!(
                    "chunked vs recurrent t={t:3} hk={hk} hv={hv} dk={dk:3} dv={dv:3} s0={s0:5}: out scale {scale:.3e} rel diff {d:.2e}, state rel diff {ds:.2e}"
                );
                worst = worst.max(d).max(ds);
                assert!(d <= 1e-5 && ds <= 1e-5, "t={t}: out {d:e} state {ds:e}");
            }
        }
        println!("chunked vs recurrent: worst relative diff {worst:e}");
    }

    #[test]
    fn state_carried_across_calls() {
        // Splits at 1, mid-chunk (30, 100), on a chunk boundary (64), past a
        // slab boundary (290) and one before the end (399).
        let (t, hk, hv, dk, dv) = (400, 2, 4, 16, 24);
        let p = Prob::new(42, t, hk, hv, dk, dv, true);
        let mut s_full = p.s0.clone();
        let o_full = p.run(recurrent_gated_delta_rule, &mut s_full);
        let scale = max_abs(&o_full);
        let n = hv * dv;
        let mut worst = 0.0f32;
        for t1 in [1, 30, 64, 100, 290, 399] {
            let (a, b) = (p.slice(0, t1), p.slice(t1, t));
            for (name, f1, f2) in [
                ("rec+rec", recurrent_gated_delta_rule as RuleFn, recurrent_gated_delta_rule as RuleFn),
                ("chunk+chunk", chunked_gated_delta_rule as RuleFn, chunked_gated_delta_rule as RuleFn),
                ("chunk+rec", chunked_gated_delta_rule as RuleFn, recurrent_gated_delta_rule as RuleFn),
                ("rec+chunk", recurrent_gated_delta_rule as RuleFn, chunked_gated_delta_rule as RuleFn),
            ] {
                let mut s = p.s0.clone();
                let mut o = a.run(f1, &mut s);
                o.extend(b.run(f2, &mut s));
                let d = max_diff(&o, &o_full) / scale;
                let ds = max_diff(&s, &s_full) / max_abs(&s_full);
                worst = worst.max(d).max(ds);
                assert!(d <= 1e-5 && ds <= 1e-5, "{name} t1={t1}: {d:e} {ds:e}");
            }
            // Chunked prefill, then recurrent decode token by token.
            let mut s = p.s0.clone();
            let mut o = a.run(chunked_gated_delta_rule, &mut s);
            for tt in t1..t {
                let one = p.slice(tt, tt + 1);
                let ot = one.run(recurrent_gated_delta_rule, &mut s);
                assert_eq!(ot.len(), n);
                o.extend(ot);
            }
            let d = max_diff(&o, &o_full) / scale;
            let ds = max_diff(&s, &s_full) / max_abs(&s_full);
            worst = worst.max(d).max(ds);
            assert!(d <= 1e-5 && ds <= 1e-5, "chunk prefill + decode t1={t1}: {d:e} {ds:e}");
        }
        println!("split calls vs one call: worst relative diff {worst:e}");
    }

    #[test]
    fn shape_errors() {
        let mut s = vec![0.0; 4 * 16 * 24];
        let mut o = vec![0.0; 2 * 4 * 24];
        let q = vec![0.0; 2 * 2 * 16];
        let v = vec![0.0; 2 * 4 * 24];
        let g = vec![0.0; 8];
        let r = recurrent_gated_delta_rule(&q, &q, &v, &g, &g, &mut s, &mut o, 2, 2, 4, 16, 24);
        assert!(r.is_ok());
        let r = chunked_gated_delta_rule(&q, &q, &v, &g, &g, &mut s, &mut o, 3, 2, 4, 16, 24);
        assert!(matches!(r, Err(GdnError::Len { what: "q", .. })));
        let r = chunked_gated_delta_rule(&q, &q, &v, &g, &g, &mut s, &mut o, 2, 3, 4, 16, 24);
        assert!(matches!(r, Err(GdnError::Dims(_))));
        let r = l2norm_rows(&mut o, 7, 1.0);
        assert!(r.is_err());
        let mut st = vec![0.0; 3];
        let mut out = vec![0.0; 2];
        let r = causal_conv1d_update(&[0.0; 2], &[0.0; 8], None, &mut st, &mut out, 2, 4);
        assert!(matches!(r, Err(GdnError::Len { what: "state", .. })));
        assert!(!format!("{}", r.unwrap_err()).is_empty());
    }

    /// PyTorch `Conv1d(groups=C, padding=K-1)(x)[..., :T]` + SiLU on a whole
    /// sequence `x` `[N, C]` starting from zeros.
    fn conv_ref(x: &[f32], w: &[f32], b: Option<&[f32]>, n: usize, c: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; n * c];
        for ch in 0..c {
            // Zero-padded input of length N + 2(K-1), as PyTorch pads both sides.
            let mut xp = vec![0.0f32; n + 2 * (k - 1)];
            for tt in 0..n {
                xp[k - 1 + tt] = x[tt * c + ch];
            }
            for tt in 0..n {
                let mut acc = 0.0f64;
                for j in 0..k {
                    acc += w[ch * k + j] as f64 * xp[tt + j] as f64;
                }
                if let Some(b) = b {
                    acc += b[ch] as f64;
                }
                let a = acc as f32;
                y[tt * c + ch] = a / (1.0 + (-a).exp());
            }
        }
        y
    }

    #[test]
    fn conv_prefill_update_reference() {
        let (n, c) = (20, 10);
        for k in [1, 2, 4] {
            for with_bias in [false, true] {
                let mut r = Rng::new(5 + k as u64);
                let x = r.vec(n * c, 2.0);
                let w = r.vec(c * k, 1.0);
                let bias_v = r.vec(c, 0.5);
                let bias = with_bias.then_some(&bias_v[..]);
                let y_ref = conv_ref(&x, &w, bias, n, c, k);
                let scale = max_abs(&y_ref);
                // Expected final state: last K-1 inputs (zero-padded).
                let state_after = |m: usize| -> Vec<f32> {
                    let mut s = vec![0.0f32; c * (k - 1)];
                    for ch in 0..c {
                        for i in 0..k - 1 {
                            let pos = m as isize - (k as isize - 1) + i as isize;
                            if pos >= 0 {
                                s[ch * (k - 1) + i] = x[pos as usize * c + ch];
                            }
                        }
                    }
                    s
                };

                // One prefill of everything.
                let mut st = vec![0.0; c * (k - 1)];
                let mut y = vec![0.0; n * c];
                causal_conv1d_prefill(&x, &w, bias, &mut st, &mut y, n, c, k).unwrap();
                let d_pre = max_diff(&y, &y_ref) / scale;
                assert!(d_pre <= 1e-6, "prefill k={k}: {d_pre:e}");
                assert_eq!(st, state_after(n));

                // Token-by-token updates: bit-identical to the prefill.
                let mut st2 = vec![0.0; c * (k - 1)];
                let mut y2 = vec![0.0; n * c];
                for tt in 0..n {
                    causal_conv1d_update(
                        &x[tt * c..(tt + 1) * c],
                        &w,
                        bias,
                        &mut st2,
                        &mut y2[tt * c..(tt + 1) * c],
                        c,
                        k,
                    )
                    .unwrap();
                }
                assert_eq!(y2, y, "update vs prefill k={k}");
                assert_eq!(st2, st);

                // Prefill continued in pieces (some shorter than K-1), state carried.
                let mut st3 = vec![0.0; c * (k - 1)];
                let mut y3 = vec![0.0; n * c];
                let mut pos = 0;
                for len in [2, 1, 0, 7, 3, 1, 6] {
                    let (a, b) = (pos, pos + len);
                    causal_conv1d_prefill(&x[a * c..b * c], &w, bias, &mut st3, &mut y3[a * c..b * c], len, c, k)
                        .unwrap();
                    assert_eq!(st3, state_after(b), "state after {b} k={k}");
                    pos = b;
                }
                assert_eq!(pos, n);
                assert_eq!(y3, y, "pieces vs one prefill k={k}");
                println!("conv k={k} bias={with_bias}: prefill vs PyTorch ref rel diff {d_pre:.2e}; updates and pieces bit-identical");
            }
        }
    }

    #[test]
    fn gates_and_norms() {
        let a = [0.0f32, 25.0, -30.0, 1.5];
        let b = [0.0f32, 3.0, -2.0, 40.0];
        let a_log = [0.5f32, -1.0];
        let dt = [0.25f32, -0.5];
        let mut g = [0.0f32; 4];
        let mut beta = [0.0f32; 4];
        gdn_gates(&a, &b, &a_log, &dt, &mut g, &mut beta).unwrap();
        for i in 0..4 {
            let h = i % 2;
            let x = (a[i] + dt[h]) as f64;
            let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
            let ge = -(a_log[h] as f64).exp() * sp;
            let be = 1.0 / (1.0 + (-(b[i] as f64)).exp());
            assert!((g[i] as f64 - ge).abs() <= 1e-6 * ge.abs().max(1e-30), "g[{i}]");
            assert!((beta[i] as f64 - be).abs() <= 1e-6, "beta[{i}]");
        }
        // softplus threshold: a + dt = 24.5 > 20 → exactly 24.5.
        assert_eq!(g[1], -(a_log[1].exp()) * 24.5);

        let mut x = vec![3.0f32, 4.0, 0.0, 0.0];
        l2norm_rows(&mut x, 2, 2.0).unwrap();
        let r = 2.0 / (25.0f32 + 1e-6).sqrt();
        assert_eq!(x, vec![3.0 * r, 4.0 * r, 0.0, 0.0]);

        let mut r = Rng::new(3);
        let (nrow, d) = (5, 8);
        let x0 = r.vec(nrow * d, 2.0);
        let z = r.vec(nrow * d, 3.0);
        let w = r.vec(d, 1.0);
        let mut x = x0.clone();
        gated_rms_norm(&mut x, &z, &w, 1e-6).unwrap();
        for i in 0..nrow {
            let row = &x0[i * d..(i + 1) * d];
            let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
            let rs = 1.0 / (ms + 1e-6).sqrt();
            for c in 0..d {
                let zz = z[i * d + c] as f64;
                let e = row[c] as f64 * rs * w[c] as f64 * zz / (1.0 + (-zz).exp());
                assert!((x[i * d + c] as f64 - e).abs() <= 1e-5, "gated norm");
            }
        }
    }

    /// Micro-benchmark, run with
    /// `cargo test -p porter-kernels --release -- --ignored --nocapture bench_gdn`.
    /// Prefill: one call over T = 4096 tokens (Qwen3-Next GDN layer shapes),
    /// best of 2. Decode: 256 single-token recurrent calls.
    #[test]
    #[ignore = "micro-benchmark: run with --ignored --nocapture"]
    fn bench_gdn() {
        let (t, hk, hv, dk, dv) = (4096, 16, 32, 128, 128);
        let p = Prob::new(1, t, hk, hv, dk, dv, false);
        let all = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut counts = vec![1, 2, 4, 8, 16, all];
        counts.retain(|&n| n <= all);
        counts.dedup();
        for threads in counts {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                for (name, f) in [
                    ("recurrent", recurrent_gated_delta_rule as RuleFn),
                    ("chunked", chunked_gated_delta_rule as RuleFn),
                ] {
                    let w = p.slice(0, 256);
                    let mut s = vec![0.0; hv * dk * dv];
                    let _ = w.run(f, &mut s);
                    let mut best = f64::MAX;
                    for _ in 0..2 {
                        let mut s = vec![0.0; hv * dk * dv];
                        let t0 = std::time::Instant::now();
                        let o = p.run(f, &mut s);
                        best = best.min(t0.elapsed().as_secs_f64());
                        std::hint::black_box(&o);
                    }
                    println!(
                        "{threads:2} threads  prefill {name:9}: T={t} Hv={hv} Hk={hk} dk={dk} dv={dv}: {:.3} s, {:.0} tokens/s",
                        best,
                        t as f64 / best
                    );
                }
                let n = 256;
                let toks: Vec<Prob> = (0..n).map(|tt| p.slice(tt, tt + 1)).collect();
                let mut s = vec![0.0; hv * dk * dv];
                let mut out = vec![0.0; hv * dv];
                let t0 = std::time::Instant::now();
                for one in &toks {
                    recurrent_gated_delta_rule(
                        &one.q, &one.k, &one.v, &one.g, &one.beta, &mut s, &mut out, 1, hk, hv,
                        dk, dv,
                    )
                    .unwrap();
                }
                let dt = t0.elapsed().as_secs_f64();
                println!(
                    "{threads:2} threads  decode  recurrent: T=1 calls: {:.1} us/token/layer, {:.0} tokens/s",
                    dt / n as f64 * 1e6,
                    n as f64 / dt
                );
            });
        }
    }
}
