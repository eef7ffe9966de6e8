//! Dense CPU kernels: GEMM, norms, RoPE, causal attention, activations.
//!
//! All kernels take row-major `f32` slices; the GEMM's weight may also be `bf16`/`f16`
//! ([`HostWeight`], widened block by block). Parallelism is rayon over rows or
//! heads; the GEMM is the `gemm` crate (packed, SIMD, multi-threaded).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

/// Minimum number of output elements before a kernel fans out over rayon.
const PAR_MIN: usize = 1 << 14;

/// A weight element type the CPU GEMM reads directly: `f32`, or a half-precision checkpoint
/// dtype (`bf16`, `f16`) that is widened to `f32` block by block inside [`matmul_t_w`].
pub trait HostWeight: Copy + Send + Sync + 'static {
    /// The dtype's name as safetensors spells it (`"F32"`, `"BF16"`, `"F16"`).
    const NAME: &'static str;

    /// Widens `src` into `dst` element by element (exact: every bf16/f16 value is an f32).
    ///
    /// # Panics
    /// When `src.len() != dst.len()`.
    fn to_f32_slice(src: &[Self], dst: &mut [f32]);

    /// `src` itself when `Self` is `f32` (no conversion needed), `None` otherwise.
    fn as_f32(src: &[Self]) -> Option<&[f32]> {
        let _ = src;
        None
    }
}

impl HostWeight for f32 {
    const NAME: &'static str = "F32";

    fn to_f32_slice(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }
}

impl HostWeight for bf16 {
    const NAME: &'static str = "BF16";

    fn to_f32_slice(src: &[bf16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

impl HostWeight for f16 {
    const NAME: &'static str = "F16";

    fn to_f32_slice(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

/// Widens a whole weight to a new `f32` vector (parallel over chunks when large).
pub fn to_f32_vec<W: HostWeight>(w: &[W]) -> Vec<f32> {
    let mut out = vec![0.0f32; w.len()];
    convert_into(w, &mut out);
    out
}

/// [`HostWeight::to_f32_slice`], fanned out over rayon for large slices.
fn convert_into<W: HostWeight>(src: &[W], dst: &mut [f32]) {
    const CHUNK: usize = 1 << 16;
    if src.len() >= 4 * CHUNK {
        dst.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| W::to_f32_slice(s, d));
    } else {
        W::to_f32_slice(src, dst);
    }
}

/// Whether [`matmul_t`] / [`matmul_t_w`] compute every output as one fixed-order [`dot`]
/// whatever the number of rows (batch-invariant: a row's result does not depend on the other
/// rows). The gemm crate's packed kernels are faster for large `m` but chunk the reduction by
/// the matrix shape, so a row's bits would depend on the batch; the CPU backend is the
/// reference backend, so it stays invariant. (The gemm path is kept for `matmul`.)
const ROW_INVARIANT: bool = true;

/// Most `f32` values one block of widened weight rows may hold in [`matmul_t_w`] (4 MiB).
const WEIGHT_BLOCK_FLOATS: usize = 1 << 20;

/// `out = x · wᵀ` (+ `out` when `accumulate`) for a weight in any [`HostWeight`] dtype.
///
/// `f32` weights go straight to [`matmul_t`]. Half-precision weights are never widened as a
/// whole: decode-sized calls (`m ≤ 4`) widen one weight row at a time per task, larger calls
/// widen a block of at most 4 MiB of output rows (at least 256 rows) and run the f32 GEMM on it,
/// writing the matching column block of `out`. The result is bit-identical to
/// `matmul_t(x, &to_f32_vec(w), ..)`.
///
/// # Shapes
/// - `x`: `[m, k]` row-major
/// - `w`: `[n, k]` row-major (the safetensors `[out, in]` layout)
/// - `out`: `[m, n]`
pub fn matmul_t_w<W: HostWeight>(x: &[f32], w: &[W], out: &mut [f32], m: usize, k: usize, n: usize, accumulate: bool) {
    matmul_t_w_blocked(x, w, out, m, k, n, accumulate, WEIGHT_BLOCK_FLOATS);
}

/// [`matmul_t_w`] with the block bound as a parameter (the tests use small ones).
#[allow(clippy::too_many_arguments)]
fn matmul_t_w_blocked<W: HostWeight>(
    x: &[f32],
    w: &[W],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
    block_floats: usize,
) {
    // At least 256 rows per block, so that after balancing every block has more than 64 rows
    // and at least 5·128 outputs: the gemm crate then takes the same kernel path (same k
    // chunking, same per-element FMA chain) on a block as on the whole weight, which is what
    // makes the blocked result bit-identical.
    const MIN_BLOCK_ROWS: usize = 256;
    if let Some(wf) = W::as_f32(w) {
        matmul_t(x, wf, out, m, k, n, accumulate);
        return;
    }
    assert_eq!(x.len(), m * k, "matmul_t_w: x is not [m, k]");
    assert_eq!(w.len(), n * k, "matmul_t_w: w is not [n, k]");
    assert_eq!(out.len(), m * n, "matmul_t_w: out is not [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        matmul_t(x, &[], out, m, k, n, accumulate);
        return;
    }
    if ROW_INVARIANT {
        gemv_t(x, w, out, m, k, n, accumulate);
        return;
    }
    let cap_rows = (block_floats / k).max(MIN_BLOCK_ROWS);
    let blocks = n.div_ceil(cap_rows);
    // Balanced split: the first `n % blocks` blocks get one extra row.
    let (base, extra) = (n / blocks, n % blocks);
    let mut scratch = vec![0.0f32; (base + usize::from(extra > 0)) * k];
    let mut col0 = 0;
    for bi in 0..blocks {
        let nb = base + usize::from(bi < extra);
        let buf = &mut scratch[..nb * k];
        convert_into(&w[col0 * k..(col0 + nb) * k], buf);
        gemm_cols(x, buf, out, m, k, n, col0, accumulate);
        col0 += nb;
    }
}

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
    if ROW_INVARIANT {
        // Every output is the same `dot` of its row and weight row whatever `m` is: a row's
        // result does not depend on the other rows of the batch (the serving engine's batch
        // invariance). Decode-sized calls stream the weight once at full bandwidth.
        gemv_t(x, w, out, m, k, n, accumulate);
        return;
    }
    gemm_cols(x, w, out, m, k, n, 0, accumulate);
}

/// The gemm-crate call behind [`matmul_t`]: `out[:, col0..col0 + nb] (+)= x · w_rowsᵀ`.
///
/// # Shapes
/// - `x`: `[m, k]`, `w_rows`: `[nb, k]` (output rows `col0..col0 + nb`), `out`: `[m, n]`
#[allow(clippy::too_many_arguments)]
fn gemm_cols(x: &[f32], w_rows: &[f32], out: &mut [f32], m: usize, k: usize, n: usize, col0: usize, accumulate: bool) {
    let nb = w_rows.len() / k;
    assert!(k > 0 && w_rows.len() == nb * k, "gemm_cols: w_rows is not [nb, k]");
    assert!(x.len() == m * k && out.len() == m * n && col0 + nb <= n, "gemm_cols: shapes disagree");
    if m == 0 || nb == 0 {
        return;
    }
    let threads = rayon::current_num_threads();
    let par =
        if m * nb * k >= 1 << 15 && threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: the slices have exactly the sizes the strides describe (checked above): dst
    // element (i, j) is out[i * n + col0 + j] with i < m, j < nb, col0 + nb ≤ n; lhs is x
    // [m, k]; rhs element (l, j) is w_rows[j * k + l]. dst does not alias lhs or rhs
    // (distinct borrows).
    unsafe {
        gemm::gemm(
            m,
            nb,
            k,
            out.as_mut_ptr().add(col0),
            1,
            n as isize,
            accumulate,
            x.as_ptr(),
            1,
            k as isize,
            w_rows.as_ptr(),
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
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
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
///
/// Half-precision weights are widened one row at a time into a `k`-float buffer per task, so
/// every output is the same [`dot`] of the same f32 values whatever the weight dtype.
fn gemv_t<W: HostWeight>(x: &[f32], w: &[W], out: &mut [f32], m: usize, k: usize, n: usize, accumulate: bool) {
    const BLOCK: usize = 64;
    // Column-major scratch [n, m]: each task owns a contiguous block of output features.
    let mut scratch = vec![0.0f32; n * m];
    let fill = |(bi, blk): (usize, &mut [f32])| {
        let mut row = if W::as_f32(w).is_some() { Vec::new() } else { vec![0.0f32; k] };
        for (j, o) in blk.chunks_mut(m).enumerate() {
            let col = bi * BLOCK + j;
            let src = &w[col * k..(col + 1) * k];
            let wr = match W::as_f32(src) {
                Some(wr) => wr,
                None => {
                    W::to_f32_slice(src, &mut row);
                    &row[..]
                }
            };
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

    /// Deterministic values in [-1, 1) (xorshift), so the tests need no extra dependency.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Runs the blocked half-weight GEMM and the whole-f32 reference on the same inputs and
    /// asserts every output is bit-identical.
    fn check_bit_identical<W: HostWeight>(
        from: fn(f32) -> W,
        (m, k, n): (usize, usize, usize),
        accumulate: bool,
        block_floats: usize,
    ) {
        let x = values(m * k, 1 + (m * 31 + k * 7 + n) as u64);
        let w: Vec<W> = values(n * k, 2 + (m + k * 13 + n * 3) as u64).into_iter().map(from).collect();
        let init = values(m * n, 3);
        let mut want = init.clone();
        matmul_t(&x, &to_f32_vec(&w), &mut want, m, k, n, accumulate);
        let mut got = init;
        matmul_t_w_blocked(&x, &w, &mut got, m, k, n, accumulate, block_floats);
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                r.to_bits(),
                "{} m={m} k={k} n={n} acc={accumulate} blk={block_floats}: out[{i}] {g} vs {r}",
                W::NAME
            );
        }
    }

    const SHAPES: [(usize, usize, usize); 14] = [
        (1, 64, 300),
        (3, 37, 1000),
        (4, 600, 513),
        (5, 64, 700),
        (7, 64, 1000),
        (7, 1, 600),
        (7, 2, 600),
        (7, 0, 50),
        (0, 8, 9),
        (7, 600, 3001),
        (9, 1030, 700),
        (33, 96, 1025),
        (70, 130, 777),
        (7, 48, 40),
    ];

    #[test]
    fn half_weight_gemm_is_bit_identical_to_widened_f32() {
        for &shape in &SHAPES {
            for accumulate in [false, true] {
                // 256·k floats per block forces several (balanced) blocks once n > 256;
                // the default bound keeps these shapes in one block.
                for block_floats in [256 * shape.1, WEIGHT_BLOCK_FLOATS] {
                    check_bit_identical(bf16::from_f32, shape, accumulate, block_floats);
                    check_bit_identical(f16::from_f32, shape, accumulate, block_floats);
                }
            }
        }
    }

    #[test]
    fn half_weight_gemm_lm_head_sized_blocks_are_bit_identical() {
        // 8192×576 bf16 is 4.5M floats widened: five default-sized blocks of ≤ 4 MiB.
        check_bit_identical(bf16::from_f32, (7, 576, 8192), false, WEIGHT_BLOCK_FLOATS);
        check_bit_identical(bf16::from_f32, (2, 576, 8192), true, WEIGHT_BLOCK_FLOATS);
    }

    #[test]
    fn f32_weight_goes_straight_to_matmul_t() {
        let (m, k, n) = (6, 40, 300);
        let x = values(m * k, 5);
        let w = values(n * k, 6);
        let mut want = vec![0.0; m * n];
        matmul_t(&x, &w, &mut want, m, k, n, false);
        let mut got = vec![0.0; m * n];
        matmul_t_w(&x, &w, &mut got, m, k, n, false);
        assert_eq!(got, want);
        assert_eq!(<f32 as HostWeight>::NAME, "F32");
    }

    #[test]
    fn to_f32_vec_widens_exactly() {
        let v = values(300_000, 7);
        let b: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
        let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let bw = to_f32_vec(&b);
        let hw = to_f32_vec(&h);
        for i in 0..v.len() {
            assert_eq!(bw[i].to_bits(), b[i].to_f32().to_bits());
            assert_eq!(hw[i].to_bits(), h[i].to_f32().to_bits());
        }
        assert_eq!((bf16::NAME, f16::NAME), ("BF16", "F16"));
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
