//! Gated DeltaNet (GDN) kernels of Qwen3-Next, on plain row-major `f32` slices.
//!
//! The pieces of one GDN layer, in the order a caller composes them
//! (models.md §3.4):
//!
//! 1. [`causal_conv1d_prefill`] / [`causal_conv1d_update`]: depthwise causal
//!    conv over the `[q | k | v]` channels, followed by the model's activation
//!    (`hidden_act`, SiLU in the released models), with a rolling state of the
//!    last `K − 1` inputs.
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

use super::act::Act;
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
// Causal depthwise conv1d + activation
// ---------------------------------------------------------------------------

/// Causal depthwise conv1d followed by the activation `act` over `T` tokens of
/// one sequence, continuing from (and updating) a rolling state.
///
/// `y[t, c] = act(Σ_{j<K} w[c, j] · xin[c, t − (K−1) + j] + bias[c])`, where
/// inputs at positions `< 0` come from `state` (position `−(K−1) + i` is
/// `state[c, i]`). With a zero state this is PyTorch
/// `Conv1d(C, C, K, groups=C, padding=K−1)(x)[..., :T]` followed by
/// `ACT2FN[act]` (transformers' `causal_conv1d_fn(..., activation)`);
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
    act: Act,
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
        if let Some(b) = bias {
            for (o, &bv) in orow.iter_mut().zip(b) {
                *o += bv;
            }
        }
        act.apply_slice(orow);
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

/// One decode step of the causal depthwise conv1d + activation `act` (the
/// `T = 1` case of [`causal_conv1d_prefill`], with the same arithmetic order,
/// so both give bit-identical results; transformers' `causal_conv1d_update`).
///
/// `y[c] = act(Σ_{i<K−1} w[c, i] · state[c, i] + w[c, K−1] · x[c] + bias[c])`,
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
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d_update(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    state: &mut [f32],
    out: &mut [f32],
    c: usize,
    k: usize,
    act: Act,
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
        out[ch] = act.apply(acc);
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

mod delta;
pub use delta::{chunked_gated_delta_rule, recurrent_gated_delta_rule};

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64* PRNG, uniform f32 in [-1, 1).
    pub(super) struct Rng(u64);
    impl Rng {
        pub(super) fn new(seed: u64) -> Self {
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
        pub(super) fn uni(&mut self) -> f32 {
            ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        pub(super) fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| self.uni() * scale).collect()
        }
    }

    pub(super) fn max_abs(a: &[f32]) -> f32 {
        a.iter().fold(0.0f32, |m, &x| m.max(x.abs()))
    }

    pub(super) fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).fold(0.0f32, |m, (&x, &y)| m.max((x - y).abs()))
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
        let r = causal_conv1d_update(&[0.0; 2], &[0.0; 8], None, &mut st, &mut out, 2, 4, Act::Silu);
        assert!(matches!(r, Err(GdnError::Len { what: "state", .. })));
        assert!(!format!("{}", r.unwrap_err()).is_empty());
    }

    /// PyTorch `Conv1d(groups=C, padding=K-1)(x)[..., :T]` + `act` on a whole
    /// sequence `x` `[N, C]` starting from zeros (SiLU written out, the others by
    /// `Act::eval_f64`).
    fn conv_ref(x: &[f32], w: &[f32], b: Option<&[f32]>, n: usize, c: usize, k: usize, act: Act) -> Vec<f32> {
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
                y[tt * c + ch] = match act {
                    Act::Silu => {
                        let a = acc as f32;
                        a / (1.0 + (-a).exp())
                    }
                    _ => act.eval_f64(acc) as f32,
                };
            }
        }
        y
    }

    #[test]
    fn conv_prefill_update_reference() {
        let (n, c) = (20, 10);
        for (k, act) in [1, 2, 4]
            .into_iter()
            .flat_map(|k| [Act::Silu, Act::Gelu, Act::Relu2, Act::GeluPytorchTanh, Act::Linear].map(move |a| (k, a)))
        {
            for with_bias in [false, true] {
                let mut r = Rng::new(5 + k as u64);
                let x = r.vec(n * c, 2.0);
                let w = r.vec(c * k, 1.0);
                let bias_v = r.vec(c, 0.5);
                let bias = with_bias.then_some(&bias_v[..]);
                let y_ref = conv_ref(&x, &w, bias, n, c, k, act);
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
                causal_conv1d_prefill(&x, &w, bias, &mut st, &mut y, n, c, k, act).unwrap();
                let d_pre = max_diff(&y, &y_ref) / scale;
                assert!(d_pre <= 1e-6, "prefill k={k} {act}: {d_pre:e}");
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
                        act,
                    )
                    .unwrap();
                }
                assert_eq!(y2, y, "update vs prefill k={k} {act}");
                assert_eq!(st2, st);

                // Prefill continued in pieces (some shorter than K-1), state carried.
                let mut st3 = vec![0.0; c * (k - 1)];
                let mut y3 = vec![0.0; n * c];
                let mut pos = 0;
                for len in [2, 1, 0, 7, 3, 1, 6] {
                    let (a, b) = (pos, pos + len);
                    causal_conv1d_prefill(&x[a * c..b * c], &w, bias, &mut st3, &mut y3[a * c..b * c], len, c, k, act)
                        .unwrap();
                    assert_eq!(st3, state_after(b), "state after {b} k={k}");
                    pos = b;
                }
                assert_eq!(pos, n);
                assert_eq!(y3, y, "pieces vs one prefill k={k}");
                println!("conv k={k} {act} bias={with_bias}: prefill vs PyTorch ref rel diff {d_pre:.2e}; updates and pieces bit-identical");
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
}
