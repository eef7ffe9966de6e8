//! Time to sample one logits row at vocab 151 936 (Qwen's) with the per-request sampler, and
//! with the previous full-sort sampler for comparison.
//!
//! ```text
//! cargo run -p porter-core --example sampling_bench            # dev profile (opt-level 1)
//! cargo run -p porter-core --example sampling_bench --release
//! ```
//!
//! Two rows: `peaked` (N(0, 2) plus 20 tokens at 10..20, like an LLM's confident step) and
//! `flat` (N(0, 2) only: a wide nucleus). Prints the median of 101 timed calls per case.

use porter_core::sampling::{SamplingParams, SeqSampler};
use std::time::Instant;

const VOCAB: usize = 151_936;

/// Deterministic N(0, 2) logits (Box–Muller over SplitMix64).
fn gaussian_row(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (next().max(1e-300), next());
            (2.0 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

/// The previous sampler's distribution: sort the whole vocabulary, then top-k / top-p.
fn full_sort(logits: &[f32], t: f32, top_k: Option<usize>, top_p: Option<f32>) -> Vec<f32> {
    let n = logits.len();
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let k = top_k.unwrap_or(n).min(n);
    let max = logits[idx[0]] / t;
    let mut probs: Vec<f64> = idx[..k].iter().map(|&i| ((logits[i] / t - max) as f64).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|v| *v /= sum);
    let mut keep = k;
    if let Some(tp) = top_p {
        let mut acc = 0.0;
        for (i, v) in probs.iter().enumerate() {
            acc += v;
            if acc >= tp as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    let mut p = vec![0.0f32; n];
    for (j, &i) in idx[..keep].iter().enumerate() {
        p[i] = probs[j] as f32;
    }
    p
}

fn median_us(mut f: impl FnMut()) -> f64 {
    f();
    let mut ts: Vec<f64> = (0..101)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[ts.len() / 2]
}

fn main() -> porter_core::Result<()> {
    let flat = gaussian_row(VOCAB, 1);
    let mut peaked = flat.clone();
    for j in 0..20 {
        peaked[(j * 7919 + 13) % VOCAB] = 10.0 + j as f32 * 0.5;
    }
    let d = SamplingParams::default;
    let cases: Vec<(&str, SamplingParams)> = vec![
        ("greedy", d()),
        ("greedy + logprobs 5", SamplingParams { logprobs: Some(5), ..d() }),
        ("t 1 (no truncation)", SamplingParams { temperature: 1.0, ..d() }),
        ("top-p 0.9 (t 0.7)", SamplingParams { temperature: 0.7, top_p: Some(0.9), ..d() }),
        ("top-k 50 (t 0.7)", SamplingParams { temperature: 0.7, top_k: Some(50), ..d() }),
        ("top-k 50 + top-p 0.9", SamplingParams { temperature: 0.7, top_k: Some(50), top_p: Some(0.9), ..d() }),
        ("min-p 0.05", SamplingParams { temperature: 1.0, min_p: Some(0.05), ..d() }),
        ("top-p 0.9 + logprobs 5", SamplingParams { temperature: 0.7, top_p: Some(0.9), logprobs: Some(5), ..d() }),
        (
            "top-p 0.9 + rep 1.1/pres/freq, 4k prompt",
            SamplingParams {
                temperature: 0.7,
                top_p: Some(0.9),
                repetition_penalty: 1.1,
                presence_penalty: 0.5,
                frequency_penalty: 0.5,
                ..d()
            },
        ),
    ];
    println!("vocab {VOCAB}; median µs per row over 101 calls");
    println!("{:<42} {:>12} {:>12}", "case", "peaked", "flat");
    for (name, p) in &cases {
        let mut us = Vec::new();
        for row in [&peaked, &flat] {
            let mut s = SeqSampler::new(SamplingParams { seed: Some(1), ..p.clone() })?;
            if p.has_penalties() {
                s.observe_prompt(
                    &(0..4096u32).map(|i| i.wrapping_mul(2_654_435_761) % VOCAB as u32).collect::<Vec<_>>(),
                );
                (0..256u32).for_each(|i| s.accept(i * 37));
            }
            let mut sink = 0u32;
            us.push(median_us(|| sink ^= s.sample(row, 300, &[151_645]).map(|x| x.token).unwrap_or(0)));
            std::hint::black_box(sink);
        }
        println!("{name:<42} {:>12.1} {:>12.1}", us[0], us[1]);
    }
    for (name, t, k, tp) in
        [("previous: top-p 0.9 (full sort)", 0.7, None, Some(0.9)), ("previous: top-k 50", 0.7, Some(50), None)]
    {
        let a = median_us(|| {
            std::hint::black_box(full_sort(&peaked, t, k, tp));
        });
        let b = median_us(|| {
            std::hint::black_box(full_sort(&flat, t, k, tp));
        });
        println!("{name:<42} {a:>12.1} {b:>12.1}");
    }
    Ok(())
}
