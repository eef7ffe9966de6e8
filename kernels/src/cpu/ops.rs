//! Dense CPU kernels: GEMM, norms, RoPE, causal attention, activations.
//!
//! All kernels take row-major `f32` slices. Parallelism is rayon over rows or
//! heads; the GEMM is the `gemm` crate (packed, SIMD, multi-threaded).

use rayon::prelude::*;

/// Minimum number of output elements before a kernel fans out over rayon.
const PAR_MIN: usize = 1 << 14;

/// `out = x · wᵀ` (+ `out` when `accumulate`).
///
/// # Shapes
/// - `x`: `[m, k]` row-major
/// - `w`: `[n, k]` row-major (the safetensors `[out, in]` layout, used without a transpose)
/// - `out`: `[m, n]`
pub fn matmul_t(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize, accumulate: bool) {
    assert_eq!(x.len(), m * k, "matmul_t: x is not [m, k]");
    assert_eq!(w.len(), n * k, "matmul_t: w is not [n, k]");
    assert_eq!(out.len(), m * n, "matmul_t: out is not [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            out.fill(0.0);
        }
        return;
    }
    if m <= 4 {
        // Decode-sized GEMMs are GEMVs: split the weight rows across threads so the
        // weight streams once at full memory bandwidth.
        gemv_t(x, w, out, m, k, n, accumulate);
        return;
    }
    let threads = rayon::current_num_threads();
    let par =
        if m * n * k >= 1 << 15 && threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: the slices have exactly the sizes the strides describe (checked above);
    // dst does not alias lhs or rhs (distinct borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
}

/// Dot product with 8 independent accumulators (vectorises well).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in n8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// `out = x · wᵀ` for a handful of rows `m`, parallel over blocks of the `n` output features.
fn gemv_t(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize, accumulate: bool) {
    const BLOCK: usize = 64;
    // Column-major scratch [n, m]: each task owns a contiguous block of output features.
    let mut scratch = vec![0.0f32; n * m];
    let fill = |(bi, blk): (usize, &mut [f32])| {
        for (j, o) in blk.chunks_mut(m).enumerate() {
            let col = bi * BLOCK + j;
            let wr = &w[col * k..(col + 1) * k];
            for (r, v) in o.iter_mut().enumerate() {
                *v = dot(&x[r * k..(r + 1) * k], wr);
            }
        }
    };
    if n * k >= 1 << 16 {
        scratch.par_chunks_mut(BLOCK * m).enumerate().for_each(fill);
    } else {
        scratch.chunks_mut(BLOCK * m).enumerate().for_each(fill);
    }
    for r in 0..m {
        for (c, o) in out[r * n..(r + 1) * n].iter_mut().enumerate() {
            let v = scratch[c * m + r];
            *o = if accumulate { *o + v } else { v };
        }
    }
}

/// Plain row-major `out = a · b`.
///
/// # Shapes
/// - `a`: `[m, k]`, `b`: `[k, n]`, `out`: `[m, n]`
pub fn matmul(a: &[f32], b: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(a.len(), m * k);
    assert_eq!(b.len(), k * n);
    assert_eq!(out.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    // SAFETY: sizes checked above; no aliasing.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Applies `f` to each row of `x` (rows of length `dim`), in parallel when large.
pub fn for_each_row(x: &mut [f32], dim: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if dim == 0 {
        return;
    }
    if x.len() >= PAR_MIN {
        x.par_chunks_mut(dim).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        x.chunks_mut(dim).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// `1 / sqrt(mean(x²) + eps)` of one row, accumulated in f32.
#[inline]
pub fn rms_inv(row: &[f32], eps: f32) -> f32 {
    let ss: f32 = row.iter().map(|v| v * v).sum();
    1.0 / (ss / row.len() as f32 + eps).sqrt()
}

/// SiLU `x·σ(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// In-place numerically stable softmax of one row.
pub fn softmax_inplace(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// NeoX ("rotate_half") rotary embedding on the first `rot_dim` dims of every head.
///
/// Dimension `d < rot_dim/2` pairs with `d + rot_dim/2`; dims `rot_dim..head_dim` pass through.
///
/// # Shapes
/// - `x`: `[t, heads, head_dim]`
/// - `cos`, `sin`: `[t, rot_dim / 2]` (one value per frequency; the second half repeats it)
pub fn rope_neox(x: &mut [f32], cos: &[f32], sin: &[f32], t: usize, heads: usize, head_dim: usize, rot_dim: usize) {
    let half = rot_dim / 2;
    assert_eq!(x.len(), t * heads * head_dim);
    assert_eq!(cos.len(), t * half);
    assert_eq!(sin.len(), t * half);
    for_each_row(x, heads * head_dim, |ti, row| {
        let c = &cos[ti * half..(ti + 1) * half];
        let s = &sin[ti * half..(ti + 1) * half];
        for h in row.chunks_mut(head_dim) {
            for d in 0..half {
                let a = h[d];
                let b = h[d + half];
                h[d] = a * c[d] - b * s[d];
                h[d + half] = b * c[d] + a * s[d];
            }
        }
    });
}

/// Causal grouped-query attention of one sequence's new rows over its cached keys/values.
///
/// Query row `i` sits at absolute position `pos0 + i` and sees key positions `j` with
/// `j ≤ pos0 + i` and, when `window` is set, `pos0 + i − j < window`.
/// Query head `h` reads KV head `h / (heads / kv_heads)`. Softmax in f32.
///
/// # Shapes
/// - `q`: `[t, heads, head_dim]`
/// - `k`, `v`: `[len, kv_heads, head_dim]` with `len ≥ pos0 + t`
/// - `out`: `[t, heads, head_dim]`
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    t: usize,
    pos0: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    window: Option<usize>,
) {
    let len = pos0 + t;
    assert_eq!(q.len(), t * heads * head_dim);
    assert!(k.len() >= len * kv_heads * head_dim && v.len() >= len * kv_heads * head_dim);
    assert_eq!(out.len(), t * heads * head_dim);
    let group = heads / kv_heads;
    let kv_stride = kv_heads * head_dim;
    let work = |idx: usize, o: &mut [f32]| {
        let i = idx / heads;
        let h = idx % heads;
        let kvh = h / group;
        let pos = pos0 + i;
        let lo = match window {
            Some(w) if pos + 1 > w => pos + 1 - w,
            _ => 0,
        };
        let qr = &q[(i * heads + h) * head_dim..(i * heads + h + 1) * head_dim];
        let mut scores = Vec::with_capacity(pos + 1 - lo);
        for j in lo..=pos {
            let kr = &k[j * kv_stride + kvh * head_dim..j * kv_stride + (kvh + 1) * head_dim];
            let mut s = 0.0f32;
            for d in 0..head_dim {
                s += qr[d] * kr[d];
            }
            scores.push(s * scale);
        }
        softmax_inplace(&mut scores);
        o.fill(0.0);
        for (jj, p) in scores.iter().enumerate() {
            let j = lo + jj;
            let vr = &v[j * kv_stride + kvh * head_dim..j * kv_stride + (kvh + 1) * head_dim];
            for d in 0..head_dim {
                o[d] += p * vr[d];
            }
        }
    };
    if t * heads * len >= 4096 {
        out.par_chunks_mut(head_dim).enumerate().for_each(|(idx, o)| work(idx, o));
    } else {
        out.chunks_mut(head_dim).enumerate().for_each(|(idx, o)| work(idx, o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_t_matches_naive() {
        let (m, k, n) = (5, 7, 3);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![0.0; m * n];
        matmul_t(&x, &w, &mut out, m, k, n, false);
        for i in 0..m {
            for j in 0..n {
                let r: f32 = (0..k).map(|l| x[i * k + l] * w[j * k + l]).sum();
                assert!((out[i * n + j] - r).abs() < 1e-5, "({i},{j}) {} vs {r}", out[i * n + j]);
            }
        }
        let before = out.clone();
        matmul_t(&x, &w, &mut out, m, k, n, true);
        for (a, b) in out.iter().zip(&before) {
            assert!((a - 2.0 * b).abs() < 1e-5);
        }
    }

    #[test]
    fn gemv_path_matches_naive() {
        for m in 1..=4 {
            let (k, n) = (37, 300);
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut out = vec![1.0; m * n];
            matmul_t(&x, &w, &mut out, m, k, n, true);
            for i in 0..m {
                for j in 0..n {
                    let r: f32 = 1.0 + (0..k).map(|l| x[i * k + l] * w[j * k + l]).sum::<f32>();
                    assert!((out[i * n + j] - r).abs() < 1e-4, "m={m} ({i},{j})");
                }
            }
        }
    }

    #[test]
    fn attention_single_key_returns_value() {
        let q = vec![1.0, 0.0];
        let k = vec![0.5, 0.5];
        let v = vec![3.0, -2.0];
        let mut o = vec![0.0; 2];
        causal_attention(&q, &k, &v, &mut o, 1, 0, 1, 1, 2, 1.0, None);
        assert_eq!(o, vec![3.0, -2.0]);
    }
}
