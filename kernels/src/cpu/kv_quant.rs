//! Quantized KV-cache rows: one byte per element and one `f32` scale per (token, KV head),
//! computed when the row is appended (the LMDeploy / TurboMind scheme, finer than one scale
//! per head for the whole cache).
//!
//! - FP8 (e4m3fn): `scale = amax / 448`, `q = e4m3(x / scale)` (round to nearest even,
//!   saturated to ±448, as [`super::fp8::f32_to_e4m3`]).
//! - int8: `scale = amax / 127`, `q = clamp(round_half_even(x / scale), −127, 127)`.
//!
//! An all-zero (or non-finite-free zero-amax) head row gets scale 1 (its bytes are all 0).
//! Dequantization is `e4m3(q) · scale` or `q · scale` in `f32` (the backends then round it to
//! the model dtype, as a model-dtype cache would hold it). The CUDA kernels
//! (`kernels/cuda/kv_quant.cu`) compute the same bytes and scales bit for bit: the same `f32`
//! division, the same rounding.

use super::fp8::{e4m3_to_f32, f32_to_e4m3, E4M3_MAX};

/// Largest int8 magnitude used (symmetric: −128 is never produced).
pub const INT8_MAX: f32 = 127.0;

/// The 1-byte element format of a quantized KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvQuant {
    /// float8 e4m3fn.
    Fp8,
    /// Symmetric int8 (stored as the byte of an `i8`).
    Int8,
}

impl KvQuant {
    /// The largest quantized magnitude (448 or 127): `scale = amax / qmax`.
    pub fn qmax(self) -> f32 {
        match self {
            KvQuant::Fp8 => E4M3_MAX,
            KvQuant::Int8 => INT8_MAX,
        }
    }

    /// The scale of a head row whose largest magnitude is `amax` (1 for an all-zero row).
    #[inline]
    pub fn scale_for(self, amax: f32) -> f32 {
        if amax > 0.0 && amax.is_finite() {
            amax / self.qmax()
        } else {
            1.0
        }
    }

    /// `x / scale` as one byte.
    #[inline]
    pub fn encode(self, x: f32, scale: f32) -> u8 {
        let y = x / scale;
        match self {
            KvQuant::Fp8 => f32_to_e4m3(y),
            // NaN saturates to 0 (`as` casts NaN to 0).
            KvQuant::Int8 => (y.round_ties_even().clamp(-INT8_MAX, INT8_MAX) as i8) as u8,
        }
    }

    /// The value of one byte before scaling (exact).
    #[inline]
    pub fn decode(self, b: u8) -> f32 {
        match self {
            KvQuant::Fp8 => e4m3_to_f32(b),
            KvQuant::Int8 => f32::from(b as i8),
        }
    }
}

/// Quantizes one head row `x` into `q` (same length) and returns its scale.
///
/// # Shapes
/// `x`, `q`: `[head_dim]`
pub fn quantize_head(kind: KvQuant, x: &[f32], q: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = kind.scale_for(amax);
    for (b, &v) in q.iter_mut().zip(x) {
        *b = kind.encode(v, scale);
    }
    scale
}

/// Quantizes a token row of `heads` heads of `head_dim` values: bytes into `q`, one scale
/// per head into `scales`.
///
/// # Shapes
/// `x`, `q`: `[heads · head_dim]`, `scales`: `[heads]`
pub fn quantize_row(kind: KvQuant, x: &[f32], head_dim: usize, q: &mut [u8], scales: &mut [f32]) {
    if head_dim == 0 {
        return;
    }
    for ((xh, qh), s) in x.chunks(head_dim).zip(q.chunks_mut(head_dim)).zip(scales.iter_mut()) {
        *s = quantize_head(kind, xh, qh);
    }
}

/// Dequantizes a token row: `out[h·d + i] = round(decode(q[h·d + i]) · scales[h])`.
///
/// # Shapes
/// `q`, `out`: `[heads · head_dim]`, `scales`: `[heads]`
pub fn dequantize_row(
    kind: KvQuant,
    q: &[u8],
    scales: &[f32],
    head_dim: usize,
    out: &mut [f32],
    round: &(impl Fn(f32) -> f32 + ?Sized),
) {
    if head_dim == 0 {
        return;
    }
    for ((qh, o), &s) in q.chunks(head_dim).zip(out.chunks_mut(head_dim)).zip(scales) {
        for (v, &b) in o.iter_mut().zip(qh) {
            *v = round(kind.decode(b) * s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The e4m3fn value set, enumerated independently of the crate's table: ±m·2⁻⁹ for the
    /// subnormals, ±(1 + m/8)·2^(e−7) for the normals, up to 448.
    fn e4m3_values() -> Vec<f64> {
        let mut v = Vec::new();
        for m in 0..8 {
            v.push(f64::from(m) * 2f64.powi(-9));
        }
        for e in 1..16 {
            for m in 0..8 {
                if e == 15 && m == 7 {
                    continue;
                }
                v.push((1.0 + f64::from(m) / 8.0) * 2f64.powi(e - 7));
            }
        }
        v
    }

    /// Nearest e4m3 magnitude of `a` (ties to the even mantissa), saturating at 448 — a
    /// brute-force reference over the value set.
    fn nearest_e4m3(a: f64, set: &[f64]) -> f64 {
        if a >= 448.0 {
            return 448.0;
        }
        let mut best = 0usize;
        for (i, &c) in set.iter().enumerate() {
            let (d, db) = ((c - a).abs(), (set[best] - a).abs());
            // Values of the set are in increasing order, index parity = mantissa parity.
            if d < db || (d == db && i % 2 == 0) {
                best = i;
            }
        }
        set[best]
    }

    fn rows(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = ((s >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0;
                // Mixed magnitudes per element: outliers every 37th element.
                (u * if i % 37 == 0 { 30.0 } else { 1.5 }) as f32
            })
            .collect()
    }

    /// int8: scale = amax/127 exactly as f32 division, bytes = round-half-even(x/scale)
    /// clamped, checked against an f64 reference computed independently; the element of the
    /// largest magnitude maps to ±127; the round trip is within scale/2 per element.
    #[test]
    fn int8_round_trip_matches_the_reference_exactly() {
        let d = 256;
        let x = rows(7, 4 * d);
        let mut q = vec![0u8; x.len()];
        let mut sc = vec![0f32; 4];
        quantize_row(KvQuant::Int8, &x, d, &mut q, &mut sc);
        for h in 0..4 {
            let xh = &x[h * d..(h + 1) * d];
            let amax = xh.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(sc[h], amax / 127.0, "head {h} scale");
            for (i, &v) in xh.iter().enumerate() {
                let y = f64::from(v / sc[h]);
                let r = y.round();
                let r = if (y - y.trunc()).abs() == 0.5 { 2.0 * (y / 2.0).round() } else { r };
                let want = r.clamp(-127.0, 127.0) as i8;
                assert_eq!(q[h * d + i] as i8, want, "head {h} element {i}: {v}");
            }
            assert!(xh.iter().zip(&q[h * d..]).any(|(v, &b)| v.abs() == amax && (b as i8).abs() == 127));
        }
        let mut back = vec![0f32; x.len()];
        dequantize_row(KvQuant::Int8, &q, &sc, d, &mut back, &|v| v);
        for (i, (a, b)) in x.iter().zip(&back).enumerate() {
            assert!((a - b).abs() <= sc[i / d] * 0.5 * (1.0 + 1e-6), "{i}: {a} vs {b}");
        }
    }

    /// Ties go to even: 2.5 → 2, 3.5 → 4, −2.5 → −2 (scale 1 via amax 127).
    #[test]
    fn int8_rounds_half_to_even() {
        let x = [127.0f32, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5];
        let mut q = [0u8; 7];
        let s = quantize_head(KvQuant::Int8, &x, &mut q);
        assert_eq!(s, 1.0);
        assert_eq!(q.map(|b| b as i8), [127, 2, 4, -2, 0, 0, 2]);
    }

    /// FP8: every byte is the e4m3 value nearest to x/scale (brute force over an independently
    /// enumerated value set, ties to even), the amax element maps to ±448, and the round trip
    /// error is within half an e4m3 step of the element (relative 2⁻⁴, or 2⁻¹⁰·scale near 0).
    #[test]
    fn fp8_round_trip_matches_the_reference() {
        let set = e4m3_values();
        let d = 256;
        let x = rows(11, 2 * d);
        let mut q = vec![0u8; x.len()];
        let mut sc = vec![0f32; 2];
        quantize_row(KvQuant::Fp8, &x, d, &mut q, &mut sc);
        for h in 0..2 {
            let xh = &x[h * d..(h + 1) * d];
            let amax = xh.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(sc[h], amax / 448.0);
            for (i, &v) in xh.iter().enumerate() {
                let y = f64::from(v / sc[h]);
                let want = nearest_e4m3(y.abs(), &set).copysign(y);
                let got = f64::from(e4m3_to_f32(q[h * d + i]));
                assert!(got == want || (got == 0.0 && want == 0.0), "head {h} element {i}: {y} -> {got} vs {want}");
            }
        }
        let mut back = vec![0f32; x.len()];
        dequantize_row(KvQuant::Fp8, &q, &sc, d, &mut back, &|v| v);
        for (i, (a, b)) in x.iter().zip(&back).enumerate() {
            let s = sc[i / d];
            let tol = (a.abs() * 2f32.powi(-4)).max(s * 2f32.powi(-10)) * (1.0 + 1e-5);
            assert!((a - b).abs() <= tol, "{i}: {a} vs {b}");
        }
    }

    /// An all-zero head has scale 1 and zero bytes; the zero row round-trips to zeros.
    #[test]
    fn zero_heads_have_scale_one() {
        for kind in [KvQuant::Fp8, KvQuant::Int8] {
            let x = [0.0f32; 8];
            let mut q = [9u8; 8];
            assert_eq!(quantize_head(kind, &x, &mut q), 1.0);
            assert_eq!(q, [0; 8]);
            let mut out = [1f32; 8];
            dequantize_row(kind, &q, &[1.0], 8, &mut out, &|v| v);
            assert_eq!(out, [0.0; 8]);
        }
    }
}
