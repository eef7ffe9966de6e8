//! Tests of [`Rope`] (a separate file so that `rope.rs` stays as it is edited elsewhere).

use super::super::test_util::*;
use super::*;
use crate::batch::SeqId;

fn params(theta: f32, partial: f64, scaling: RopeScaling) -> RopeParams {
    RopeParams { theta, partial_rotary_factor: partial, scaling }
}

/// Partial rotary (rot_dim 4 of head_dim 10) on two spans of one batch at positions
/// 5..8 and 40..42: the first rot_dim dims of every head rotate by the f64 reference (NeoX
/// pairing d ↔ d + rot/2), the other dims pass through bit for bit. Tolerance 1e-5: the f32
/// angle `pos·inv_freq` is off by at most a few ulp of 42 rad (< 1e-5).
#[test]
fn partial_rotary_at_arbitrary_positions_across_spans() {
    let mut rng = Rng::new(21);
    let (heads, hd, theta) = (3, 10, 10_000.0);
    for (scaling, factor) in [(RopeScaling::Default, 1.0), (RopeScaling::Linear { factor: 4.0 }, 4.0)] {
        let rope = Rope::new(&params(theta, 0.4, scaling), hd).unwrap();
        assert_eq!(rope.rot_dim(), 4);
        let mut batch = Batch::single(SeqId(0), 5, &[1, 2, 3]);
        batch.push(SeqId(1), 40, &[4, 5]);
        let x0 = rng.tensor(&[5, heads, hd], 1.0);
        let mut x = x0.clone();
        rope.forward(&mut x, &batch).unwrap();
        let mut want = vals(&x0);
        rope_ref(&mut want, &[5, 6, 7, 40, 41], hd, 4, f64::from(theta), factor);
        assert_tensor(&format!("rope {factor}"), &x, &want);
        for (i, (a, b)) in x.data().iter().zip(x0.data()).enumerate() {
            if i % hd >= 4 {
                assert_eq!(a, b, "pass-through dim {} changed", i % hd);
            }
        }
    }
}

/// Full rotary at a large position: HF computes `pos·inv_freq` in f32 (models.md §3.3), so
/// the reference does too and evaluates cos / sin and the rotation in f64.
#[test]
fn full_rotary_at_a_large_position_matches_the_f32_angle_reference() {
    let mut rng = Rng::new(22);
    let (heads, hd, theta) = (2, 8, 1_000_000.0f32);
    let rope = Rope::new(&params(theta, 1.0, RopeScaling::Default), hd).unwrap();
    let batch = Batch::single(SeqId(0), 123_456, &[7, 8]);
    let x0 = rng.tensor(&[2, heads, hd], 1.0);
    let mut x = x0.clone();
    rope.forward(&mut x, &batch).unwrap();
    let mut want = vals(&x0);
    for (t, row) in want.chunks_mut(heads * hd).enumerate() {
        for h in row.chunks_mut(hd) {
            for i in 0..hd / 2 {
                let inv = 1.0f32 / theta.powf((2 * i) as f32 / hd as f32);
                let angle = f64::from((123_456 + t) as f32 * inv);
                let (a, b) = (h[i], h[i + hd / 2]);
                h[i] = a * angle.cos() - b * angle.sin();
                h[i + hd / 2] = b * angle.cos() + a * angle.sin();
            }
        }
    }
    assert_tensor("rope at 123456", &x, &want);
}

/// transformers' widths: `dim = int(head_dim · p)` frequencies `1/θ^(2i/dim)`, `i < ceil(dim/2)`,
/// rotating `2·ceil(dim/2)` dims. Expected frequencies from torch 2.15
/// (`1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))`).
#[test]
fn rotary_dims_follow_transformers() {
    let p = |f, scaling| params(10_000.0, f, scaling);
    let d = || RopeScaling::Default;
    for (hd, partial, theta, rot, want) in [
        (30, 0.25, 10_000.0f32, 8, &[1.0, 0.07196855545043945, 0.005179473198950291, 0.00037275932845659554][..]),
        (10, 0.3, 10_000.0, 4, &[1.0, 0.002154434332624078][..]),
        (8, 0.125, 1e6, 2, &[1.0][..]),
    ] {
        let rope = Rope::new(&params(theta, partial, d()), hd).unwrap();
        assert_eq!(rope.rot_dim(), rot, "{hd} × {partial}");
        let got = rope.inv_freq().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - *w as f32).abs() <= f32::EPSILON * g.abs(), "{hd} × {partial}: {got:?} vs {want:?}");
        }
    }
    assert_eq!(Rope::new(&p(1.0, d()), 10).unwrap().rot_dim(), 10);
    // No rotated dim, more than the head, an odd head rotated whole, yarn with an odd dim.
    assert!(is_shape(&Rope::new(&p(0.05, d()), 10)));
    assert!(is_shape(&Rope::new(&p(2.0, d()), 10)));
    assert!(is_shape(&Rope::new(&p(1.0, d()), 9)));
    let yarn = RopeScaling::Yarn {
        factor: 2.0,
        original_max_position_embeddings: 64.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.0,
        truncate: true,
    };
    assert!(is_shape(&Rope::new(&p(0.25, yarn.clone()), 30)));
    assert_eq!(Rope::new(&p(0.25, yarn), 32).unwrap().rot_dim(), 8);
}

#[test]
fn shape_errors_are_errors() {
    let mut rng = Rng::new(23);
    let rope = Rope::new(&params(10_000.0, 1.0, RopeScaling::Default), 8).unwrap();
    let batch = Batch::single(SeqId(0), 0, &[1, 2]);
    assert!(is_shape(&rope.forward(&mut rng.tensor(&[2, 16], 1.0), &batch)));
    assert!(is_shape(&rope.forward(&mut rng.tensor(&[2, 2, 6], 1.0), &batch)));
    assert!(is_shape(&rope.forward(&mut rng.tensor(&[3, 2, 8], 1.0), &batch)));
}
