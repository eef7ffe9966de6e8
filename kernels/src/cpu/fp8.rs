//! FP8 (`float8_e4m3fn`) weights with 128×128 block scales (Qwen's / DeepSeek's block-FP8
//! format): the exact e4m3fn decode table, round-to-nearest-even encoding, block quantization
//! and the row-invariant dequantizing GEMV the CPU backend runs on such weights.
//!
//! e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; `0x7F` / `0xFF` are
//! NaN; exponent 0 holds the subnormals `m · 2⁻⁹`; the largest finite value is ±448.

use rayon::prelude::*;
use std::sync::LazyLock;

/// Side of a scale block: one `f32` scale per 128 × 128 weights (partial blocks at the edges).
pub const BLOCK: usize = 128;

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The 256 e4m3fn values (NaN at `0x7F` and `0xFF`).
static TABLE: LazyLock<[f32; 256]> = LazyLock::new(|| std::array::from_fn(|b| decode(b as u8)));

fn decode(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((b >> 3) & 0xF) as i32, (b & 7) as f32);
    if e == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 { m * (-9f32).exp2() } else { (1.0 + m / 8.0) * ((e - 7) as f32).exp2() };
    sign * mag
}

/// The value of one e4m3fn byte (exact).
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    TABLE[b as usize]
}

/// `x` rounded to the nearest e4m3fn value (ties to even), saturated to ±448; NaN → `0x7F`.
/// Equal to torch's `x.to(torch.float8_e4m3fn)` for every finite `|x| ≤ 448` (torch turns
/// values ≥ 480 into NaN instead of saturating; block quantization never produces them).
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7E;
    }
    let bits = a.to_bits();
    let exp = (bits >> 23) as i32 - 127;
    if exp < -6 {
        // Subnormal range: a multiple of 2⁻⁹ (the scaling by 512 is exact); 8 · 2⁻⁹ is the
        // smallest normal, whose code (exponent 1, mantissa 0) is 8 too.
        let m = (a * 512.0).round_ties_even() as u8;
        return sign | m;
    }
    let mant = bits & 0x7F_FFFF;
    let (mut m, rem, half) = (mant >> 20, mant & 0xF_FFFF, 1u32 << 19);
    let mut e = (exp + 7) as u32;
    if rem > half || (rem == half && m & 1 == 1) {
        m += 1;
        if m == 8 {
            m = 0;
            e += 1;
        }
    }
    sign | ((e << 3) | m).min(0x7E) as u8
}

/// Block-quantizes a row-major `[rows, cols]` weight: per 128 × 128 block `scale = amax / 448`
/// (`1` for an all-zero block) and `q = e4m3(w / scale)`, as torch computes
/// `(w / scale).to(torch.float8_e4m3fn)` in `f32`.
///
/// # Shapes
/// - `w`: `[rows, cols]` → `q`: `[rows, cols]`, scales `[ceil(rows/128), ceil(cols/128)]`
pub fn quantize_blocks(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(w.len(), rows * cols, "quantize_blocks: w is not [rows, cols]");
    let (sr, sc) = (rows.div_ceil(BLOCK), cols.div_ceil(BLOCK));
    let mut scales = vec![1.0f32; sr * sc];
    for (bi, srow) in scales.chunks_mut(sc.max(1)).enumerate() {
        for (bj, s) in srow.iter_mut().enumerate() {
            let mut amax = 0.0f32;
            for r in bi * BLOCK..((bi + 1) * BLOCK).min(rows) {
                for &v in &w[r * cols + bj * BLOCK..r * cols + ((bj + 1) * BLOCK).min(cols)] {
                    amax = amax.max(v.abs());
                }
            }
            if amax > 0.0 {
                *s = amax / E4M3_MAX;
            }
        }
    }
    let mut q = vec![0u8; rows * cols];
    for (r, qr) in q.chunks_mut(cols.max(1)).enumerate().take(rows) {
        let srow = &scales[(r / BLOCK) * sc..(r / BLOCK + 1) * sc];
        for (c, b) in qr.iter_mut().enumerate() {
            *b = f32_to_e4m3(w[r * cols + c] / srow[c / BLOCK]);
        }
    }
    (q, scales)
}

/// A borrowed FP8 weight `[n, k]`: e4m3 bytes and the block scales, with the scale row of every
/// weight row given explicitly (`row_scale[j]`), so packed, stacked or regrouped weights keep
/// the scales of the checkpoint tensors they came from.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Rows<'a> {
    /// `[n, k]` e4m3fn bytes.
    pub q: &'a [u8],
    /// `[scale_rows, ceil(k/128)]` scales (multiplied).
    pub scales: &'a [f32],
    /// `[n]`: the scale row of each weight row.
    pub row_scale: &'a [u32],
}

impl Fp8Rows<'_> {
    /// Dequantizes weight row `j` (`k` values) into `out`, each value passed through `round`.
    ///
    /// # Panics
    /// When `out.len() * (j + 1)` exceeds the weight or a scale index is out of range.
    #[inline]
    pub fn dequant_row(&self, j: usize, out: &mut [f32], round: &(impl Fn(f32) -> f32 + ?Sized)) {
        let k = out.len();
        let sc = k.div_ceil(BLOCK);
        let sr = self.row_scale[j] as usize;
        let srow = &self.scales[sr * sc..(sr + 1) * sc];
        let src = &self.q[j * k..(j + 1) * k];
        for ((o, &b), c) in out.iter_mut().zip(src).zip(0..) {
            *o = round(TABLE[b as usize] * srow[c / BLOCK]);
        }
    }
}

/// `out = x · Wᵀ` (+ `out` when `accumulate`) for an FP8 weight, dequantized one row at a time
/// (`W[j, c] = round(e4m3(q[j, c]) · scale)`; `round` is the model dtype's rounding) and dotted
/// with every row of `x` by the same fixed-order dot as the dense GEMV: a row's result does not
/// depend on the other rows (the CPU backend's `ROW_INVARIANT` rule), and it is bit-identical to
/// the dense GEMV on the dequantized weight.
///
/// # Shapes
/// - `x`: `[m, k]`, `w`: `[n, k]`, `out`: `[m, n]`
///
/// # Panics
/// When the slices disagree with the shapes.
#[allow(clippy::too_many_arguments)]
pub fn matmul_t_fp8(
    x: &[f32],
    w: Fp8Rows<'_>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
    round: &(dyn Fn(f32) -> f32 + Sync),
) {
    assert_eq!(x.len(), m * k, "matmul_t_fp8: x is not [m, k]");
    assert_eq!(w.q.len(), n * k, "matmul_t_fp8: w is not [n, k]");
    assert_eq!(w.row_scale.len(), n, "matmul_t_fp8: row_scale is not [n]");
    assert_eq!(out.len(), m * n, "matmul_t_fp8: out is not [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    const ROWS: usize = 64;
    // Column-major scratch [n, m]: each task owns a block of output features.
    let mut scratch = vec![0.0f32; n * m];
    let fill = |(bi, blk): (usize, &mut [f32])| {
        let mut row = vec![0.0f32; k];
        for (jj, o) in blk.chunks_mut(m).enumerate() {
            w.dequant_row(bi * ROWS + jj, &mut row, round);
            for (r, v) in o.iter_mut().enumerate() {
                *v = super::ops::dot(&x[r * k..(r + 1) * k], &row);
            }
        }
    };
    if n * k >= 1 << 16 {
        scratch.par_chunks_mut(ROWS * m).enumerate().for_each(fill);
    } else {
        scratch.chunks_mut(ROWS * m).enumerate().for_each(fill);
    }
    for r in 0..m {
        for (c, o) in out[r * n..(r + 1) * n].iter_mut().enumerate() {
            let v = scratch[c * m + r];
            *o = if accumulate { *o + v } else { v };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_the_e4m3fn_format() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert_eq!((0..=255u8).filter(|&b| e4m3_to_f32(b).is_nan()).count(), 2);
        // Every finite byte round-trips through the encoder.
        for b in (0..=255u8).filter(|&b| !e4m3_to_f32(b).is_nan()) {
            let want = if b == 0x80 { 0x80 } else { b };
            assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), want, "byte {b:#04x}");
        }
    }

    #[test]
    fn encoder_rounds_to_nearest_even_and_saturates() {
        // 1.0625 is halfway between 1.0 (m=0) and 1.125 (m=1): even → 1.0.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // 1.1875 is halfway between 1.125 (m=1) and 1.25 (m=2): even → 1.25.
        assert_eq!(f32_to_e4m3(1.1875), 0x3A);
        // Half the smallest subnormal rounds to 0; 1.5 subnormal quanta to 2.
        assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00);
        assert_eq!(f32_to_e4m3(3.0 * 2f32.powi(-10)), 0x02);
        assert_eq!(f32_to_e4m3(1e6), 0x7E);
        assert_eq!(f32_to_e4m3(-1e6), 0xFE);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
    }

    /// The dequantizing GEMV equals the naive product with the dequantized weight, with
    /// partial blocks on both edges and several scale rows (300 × 200 = 3 × 2 blocks).
    #[test]
    fn fp8_gemv_matches_the_dequantized_product() {
        let (n, k, m) = (300, 200, 3);
        let mut s = 7u64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        };
        // Magnitudes differ per block row and per block column, so a wrong scale index shows.
        let w: Vec<f32> =
            (0..n * k).map(|i| rnd() * (1.0 + (i / k / 128) as f32) * 4f32.powi(((i % k) / 128) as i32)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
        let (q, scales) = quantize_blocks(&w, n, k);
        assert_eq!(scales.len(), 3 * 2);
        let row_scale: Vec<u32> = (0..n as u32).map(|r| r / BLOCK as u32).collect();
        let wq = Fp8Rows { q: &q, scales: &scales, row_scale: &row_scale };
        let mut out = vec![0.0; m * n];
        matmul_t_fp8(&x, wq, &mut out, m, k, n, false, &|v| v);
        let mut max_err = 0.0f32;
        for j in 0..n {
            let mut row = vec![0.0; k];
            wq.dequant_row(j, &mut row, &|v| v);
            for c in 0..k {
                // Dequantized within half an e4m3 step (2⁻⁴ relative) of the original.
                let sc = scales[(j / BLOCK) * 2 + c / BLOCK];
                assert!((row[c] - w[j * k + c]).abs() <= w[j * k + c].abs() / 16.0 + sc * 2f32.powi(-10));
            }
            for r in 0..m {
                let want: f64 = (0..k).map(|c| f64::from(x[r * k + c]) * f64::from(row[c])).sum();
                max_err = max_err.max((out[r * n + j] as f64 - want).abs() as f32);
            }
        }
        assert!(max_err < 1e-4, "max error {max_err}");
        // Row invariance: one row alone gives the same bits.
        let mut one = vec![0.0; n];
        matmul_t_fp8(&x[k..2 * k], wq, &mut one, 1, k, n, false, &|v| v);
        assert_eq!(one, out[n..2 * n]);
    }
}
