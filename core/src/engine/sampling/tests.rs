//! Unit tests of the sampler: hand-computed penalties, validation, RNG independence, the
//! draws of the previous sampler at its knobs, and sampling frequencies (chi-square).

use super::*;

fn params(t: f32, top_k: Option<usize>, top_p: Option<f32>, seed: u64) -> SamplingParams {
    SamplingParams { temperature: t, top_k, top_p, seed: Some(seed), ..Default::default() }
}

/// Small deterministic logits (SplitMix-style hash → roughly N(0, 2)).
fn row(n: usize, salt: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 31)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let u = (z >> 11) as f64 / (1u64 << 53) as f64;
            ((u - 0.5) * 7.0) as f32
        })
        .collect()
}

#[test]
fn greedy_is_argmax_first_on_ties_and_draws_nothing() {
    let mut s = SeqSampler::new(params(0.0, None, None, 1)).unwrap();
    let before = s.clone().uniform();
    assert_eq!(s.sample(&[0.1, 2.0, 2.0, -1.0], 0, &[]).unwrap().token, 1);
    assert_eq!(s.uniform(), before, "greedy must not consume the stream");
    assert_eq!(s.probs(&[0.1, 2.0, 2.0, -1.0], 0, &[]).unwrap(), vec![0.0, 1.0, 0.0, 0.0]);
}

/// The host argmax decides as the device's `argmax_f32`: the first index on ties, NaN never
/// wins (also at index 0), an all-NaN or empty row gives 0; infinities are values.
#[test]
fn host_argmax_skips_nan_like_the_device() {
    assert_eq!(argmax(&[0.1, 2.0, 2.0, -1.0]), 1);
    assert_eq!(argmax(&[f32::NAN, -3.0, -2.0]), 2);
    assert_eq!(argmax(&[-1.0, f32::NAN, 5.0, f32::NAN]), 2);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY, -1e30]), 2);
    assert_eq!(argmax(&[1.0, f32::INFINITY, f32::INFINITY]), 1);
    assert_eq!(argmax(&[-0.0, 0.0, -0.0]), 0, "signed zeros tie: the first");
}

/// The vectorized argmax against a plain scan (the first largest non-NaN, 0 when none), on
/// rows of every length around the chunk size with NaN, ±inf, ties and signed zeros.
#[test]
fn host_argmax_equals_a_scan() {
    fn scan(xs: &[f32]) -> usize {
        let mut best: Option<(usize, f32)> = None;
        for (i, &v) in xs.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
                best = Some((i, v));
            }
        }
        best.map_or(0, |(i, _)| i)
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1.0, -1.0];
    for len in (0..70).chain([151_936, 1001]) {
        for _ in 0..20 {
            let xs: Vec<f32> = (0..len)
                .map(|_| {
                    let r = next();
                    match r % 10 {
                        0 => specials[(r >> 8) as usize % specials.len()],
                        1 => 3.0, // a frequent tie
                        _ => ((r >> 16) % 2000) as f32 / 100.0 - 10.0,
                    }
                })
                .collect();
            assert_eq!(argmax(&xs), scan(&xs), "len {len}: {xs:?}");
        }
    }
    // Only NaN and −inf; only NaN.
    assert_eq!(argmax(&[f32::NAN; 40]), 0);
    let mut v = vec![f32::NAN; 40];
    v[33] = f32::NEG_INFINITY;
    assert_eq!(argmax(&v), 33);
}

#[test]
fn top_k_one_is_greedy_and_top_p_truncates() {
    let mut s = SeqSampler::new(params(0.8, Some(1), None, 7)).unwrap();
    assert_eq!(s.sample(&[0.1, 2.0, 1.9], 0, &[]).unwrap().token, 1);
    // p = [0.25, 0.75, ~0] → top_p 0.5 keeps only the 0.75 token.
    let s = SeqSampler::new(params(1.0, None, Some(0.5), 1)).unwrap();
    assert_eq!(s.probs(&[0.0, (3.0f32).ln(), -10.0], 0, &[]).unwrap(), vec![0.0, 1.0, 0.0]);
}

#[test]
fn penalties_by_hand() {
    // logits [2, -1, 0.5, 3]; prompt {0, 1}; output [2, 2, 3].
    let l = [2.0f32, -1.0, 0.5, 3.0];
    let p = SamplingParams {
        temperature: 1.0,
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        logprobs: Some(4),
        ..Default::default()
    };
    let mut s = SeqSampler::new(p).unwrap();
    s.observe_prompt(&[0, 1, 1]);
    for t in [2, 2, 3] {
        s.accept(t);
    }
    // rep: 2/2 = 1, -1·2 = -2, 0.5/2 = 0.25, 3/2 = 1.5;
    // pres/freq on output: id 2: 0.25 − (0.5 + 0.25·2) = −0.75; id 3: 1.5 − (0.5 + 0.25) = 0.75.
    let want = [1.0f64, -2.0, -0.75, 0.75];
    let lse = want.iter().map(|v| v.exp()).sum::<f64>().ln();
    let got = s.sample(&l, 3, &[]).unwrap();
    let top: Vec<u32> = got.top.iter().map(|e| e.0).collect();
    assert_eq!(top, vec![0, 3, 2, 1]);
    for (id, lp) in &got.top {
        assert!((*lp as f64 - (want[*id as usize] - lse)).abs() < 1e-6, "id {id}: {lp}");
    }
    let probs = s.probs(&l, 3, &[]).unwrap();
    for (i, &v) in want.iter().enumerate() {
        let e = (v - lse).exp();
        assert!((probs[i] as f64 - e).abs() < 1e-6 * e, "{i}: {} vs {e}", probs[i]);
    }
    // Rolling the output back to [2] leaves id 3 to the repetition penalty only (not seen: none).
    s.truncate_output(1);
    assert_eq!(s.output(), &[2]);
    let g = s.sample(&l, 1, &[]).unwrap();
    let lp3 = g.top.iter().find(|e| e.0 == 3).unwrap().1 as f64;
    let w = [1.0f64, -2.0, 0.25 - 0.75, 3.0];
    let lse = w.iter().map(|v| v.exp()).sum::<f64>().ln();
    assert!((lp3 - (3.0 - lse)).abs() < 1e-6);
}

#[test]
fn logit_bias_by_hand_before_the_penalties() {
    // logits [2, -1, 0.5, 3]; bias {1: +4, 3: -100}; repetition 2 over prompt {1, 2}.
    let l = [2.0f32, -1.0, 0.5, 3.0];
    let p = SamplingParams {
        temperature: 1.0,
        repetition_penalty: 2.0,
        logit_bias: vec![(1, 4.0), (3, -100.0), (9, 5.0)],
        logprobs: Some(4),
        ..Default::default()
    };
    assert!(!p.device_compatible(0), "the device sampler has no bias");
    let mut s = SeqSampler::new(p).unwrap();
    s.observe_prompt(&[1, 2]);
    // id 1: (−1 + 4) = 3 > 0 → 3 / 2 = 1.5; id 2: 0.5 / 2 = 0.25; id 3: 3 − 100 = −97; id 9
    // is beyond the row (ignored).
    let want = [2.0f64, 1.5, 0.25, -97.0];
    let lse = want.iter().map(|v| v.exp()).sum::<f64>().ln();
    let got = s.sample(&l, 0, &[]).unwrap();
    for (id, lp) in &got.top {
        assert!((*lp as f64 - (want[*id as usize] - lse)).abs() < 1e-5, "id {id}: {lp}");
    }
    // Greedy follows the bias: +4 on id 2 beats id 3's 3 (2 + 0.5 + 4 = 4.5 > 3).
    let mut g = SeqSampler::new(SamplingParams { logit_bias: vec![(2, 4.0)], ..Default::default() }).unwrap();
    assert_eq!(g.sample(&l, 0, &[]).unwrap().token, 2);
    // Validation: unsorted or repeated ids, a bias out of [−100, 100] or not finite.
    for bad in [vec![(3, 1.0), (1, 1.0)], vec![(2, 1.0), (2, 1.0)], vec![(0, 100.5)], vec![(0, f32::NAN)]] {
        let e = SeqSampler::new(SamplingParams { logit_bias: bad.clone(), ..Default::default() });
        assert!(e.err().is_some_and(|e| e.to_string().contains("logit_bias")), "{bad:?}");
    }
}

#[test]
fn min_tokens_masks_eos_and_stop_ids_then_stops() {
    let p = SamplingParams {
        stop: StopParams { min_tokens: 2, stop_token_ids: vec![1], max_tokens: Some(4), ignore_eos: false },
        logprobs: Some(2),
        ..Default::default()
    };
    let mut s = SeqSampler::new(p.clone()).unwrap();
    let l = [0.0f32, 5.0, 4.0, 1.0];
    let a = s.sample(&l, 0, &[2]).unwrap();
    assert_eq!(a.token, 3, "1 (stop id) and 2 (eos) are masked");
    assert_eq!(a.top[1], (0, a.top[1].1));
    assert_eq!(s.sample(&l, 2, &[2]).unwrap().token, 1, "min_tokens reached");
    assert_eq!(p.stop.finish(1, 1, &[2]), None, "no stop before min_tokens");
    assert_eq!(p.stop.finish(2, 2, &[2]), Some(FinishReason::Eos));
    assert_eq!(p.stop.finish(0, 4, &[2]), Some(FinishReason::Length));
    let ig = StopParams { ignore_eos: true, ..p.stop.clone() };
    assert_eq!(ig.finish(2, 3, &[2]), None);
    assert_eq!(ig.finish(1, 3, &[2]), Some(FinishReason::Eos));
}

#[test]
fn bad_rows_are_errors_not_panics() {
    let mut s = SeqSampler::new(params(1.0, None, Some(0.9), 1)).unwrap();
    assert!(s.sample(&[], 0, &[]).is_err());
    assert!(s.sample(&[0.0, f32::NAN], 0, &[]).is_err());
    assert!(s.sample(&[f32::NEG_INFINITY; 3], 0, &[]).is_err());
    assert!(s.probs(&[f32::INFINITY, 0.0], 0, &[]).is_err());
    // Ids beyond the row (prompt, output, eos) are ignored.
    let mut r = SeqSampler::new(SamplingParams {
        repetition_penalty: 1.5,
        stop: StopParams { min_tokens: 3, ..Default::default() },
        ..Default::default()
    })
    .unwrap();
    r.observe_prompt(&[9, u32::MAX]);
    r.accept(1_000_000);
    assert_eq!(r.sample(&[0.0, 1.0], 0, &[7]).unwrap().token, 1);
}

#[test]
fn validate_names_every_field() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str)> = vec![
        (SamplingParams { temperature: -1.0, ..d() }, "temperature"),
        (SamplingParams { temperature: f32::INFINITY, ..d() }, "temperature"),
        (SamplingParams { temperature: f32::NAN, ..d() }, "temperature"),
        (SamplingParams { top_p: Some(0.0), ..d() }, "top_p"),
        (SamplingParams { top_p: Some(1.5), ..d() }, "top_p"),
        (SamplingParams { top_p: Some(f32::NAN), ..d() }, "top_p"),
        (SamplingParams { top_k: Some(0), ..d() }, "top_k"),
        (SamplingParams { min_p: Some(-0.1), ..d() }, "min_p"),
        (SamplingParams { min_p: Some(1.1), ..d() }, "min_p"),
        (SamplingParams { min_p: Some(f32::NAN), ..d() }, "min_p"),
        (SamplingParams { repetition_penalty: 0.0, ..d() }, "repetition_penalty"),
        (SamplingParams { repetition_penalty: f32::INFINITY, ..d() }, "repetition_penalty"),
        (SamplingParams { presence_penalty: 2.5, ..d() }, "presence_penalty"),
        (SamplingParams { presence_penalty: f32::NAN, ..d() }, "presence_penalty"),
        (SamplingParams { frequency_penalty: -2.1, ..d() }, "frequency_penalty"),
        (SamplingParams { logprobs: Some(21), ..d() }, "logprobs"),
        (SamplingParams { stop: StopParams { max_tokens: Some(0), ..Default::default() }, ..d() }, "max_tokens"),
        (
            SamplingParams { stop: StopParams { max_tokens: Some(3), min_tokens: 4, ..Default::default() }, ..d() },
            "min_tokens",
        ),
    ];
    for (p, field) in cases {
        let e = SeqSampler::new(p.clone()).err().unwrap_or_else(|| panic!("{p:?} accepted")).to_string();
        assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
    }
    let ok = SamplingParams {
        temperature: 2.0,
        top_k: Some(1),
        top_p: Some(1.0),
        min_p: Some(1.0),
        repetition_penalty: 0.5,
        presence_penalty: -2.0,
        frequency_penalty: 2.0,
        logprobs: Some(20),
        stop: StopParams { max_tokens: Some(3), min_tokens: 3, ..Default::default() },
        ..d()
    };
    assert!(ok.validate().is_ok());
}

#[test]
fn seeded_requests_reproduce_whatever_shares_the_batch() {
    let q = SamplingParams { temperature: 1.0, top_p: Some(0.9), seed: Some(3), ..Default::default() };
    let rows: Vec<Vec<f32>> = (0..40).map(|i| row(300, i)).collect();
    let alone: Vec<u32> = {
        let mut s = SeqSampler::new(q.clone()).unwrap();
        rows.iter().map(|r| s.sample(r, 0, &[]).unwrap().token).collect()
    };
    let again: Vec<u32> = {
        let mut s = SeqSampler::new(q.clone()).unwrap();
        rows.iter().map(|r| s.sample(r, 0, &[]).unwrap().token).collect()
    };
    assert_eq!(alone, again);
    // Interleaved with two other requests (one unseeded) in a "batch".
    let mut a = SeqSampler::new(q).unwrap();
    let mut b = SeqSampler::new(params(0.7, Some(5), None, 99)).unwrap();
    let mut c = SeqSampler::new(SamplingParams { temperature: 1.0, ..Default::default() }).unwrap();
    let mut mixed = Vec::new();
    for r in &rows {
        b.sample(r, 0, &[]).unwrap();
        mixed.push(a.sample(r, 0, &[]).unwrap().token);
        c.sample(r, 0, &[]).unwrap();
    }
    assert_eq!(alone, mixed);
    assert!(alone.iter().collect::<std::collections::HashSet<_>>().len() > 5, "draws vary: {alone:?}");
}

/// The previous sampler (full sort, then top-k, top-p, walk), kept as the compatibility oracle.
fn old_sample(p: &SamplingParams, state: &mut u64, logits: &[f32]) -> u32 {
    let mut next = || {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    };
    let n = logits.len();
    if p.temperature == 0.0 {
        return argmax(logits) as u32;
    }
    let t = p.temperature;
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let k = p.top_k.unwrap_or(n).min(n);
    let kept = &idx[..k];
    let max = logits[kept[0]] / t;
    let mut probs: Vec<f64> = kept.iter().map(|&i| ((logits[i] / t - max) as f64).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|v| *v /= sum);
    let mut keep = k;
    if let Some(tp) = p.top_p {
        let mut acc = 0.0;
        for (i, v) in probs.iter().enumerate() {
            acc += v;
            if acc >= tp as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    let mass: f64 = probs[..keep].iter().sum();
    let mut d = vec![0.0f32; n];
    for (j, &i) in kept[..keep].iter().enumerate() {
        d[i] = (probs[j] / mass) as f32;
    }
    if d.iter().filter(|&&v| v > 0.0).count() <= 1 {
        return argmax(&d) as u32;
    }
    let u = next();
    let (mut acc, mut last) = (0.0f64, 0);
    for (i, &v) in d.iter().enumerate() {
        if v > 0.0 {
            acc += v as f64;
            last = i;
            if u < acc {
                return i as u32;
            }
        }
    }
    last as u32
}

#[test]
fn draws_equal_the_previous_sampler_at_its_knobs() {
    let knobs = [
        (0.0, None, None),
        (1.0, None, None),
        (0.8, Some(20), None),
        (1.0, None, Some(0.9)),
        (0.7, Some(50), Some(0.8)),
        (1.3, Some(2000), Some(0.95)),
        (0.6, None, Some(0.5)),
    ];
    for (t, k, tp) in knobs {
        let p = params(t, k, tp, 1234);
        let mut s = SeqSampler::new(p.clone()).unwrap();
        let mut state = 1234 ^ 0x9E37_79B9_7F4A_7C15;
        for i in 0..200 {
            let r = row(if i % 2 == 0 { 3000 } else { 257 }, i);
            let want = old_sample(&p, &mut state, &r);
            assert_eq!(s.sample(&r, 0, &[]).unwrap().token, want, "t={t} k={k:?} p={tp:?} step {i}");
        }
    }
}

/// Chi-square upper quantile (Wilson–Hilferty) for `df` degrees of freedom at standard normal
/// quantile `z` (z = 4.753: one-sided α = 1e-6).
fn chi2_quantile(df: f64, z: f64) -> f64 {
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// 20 000 seeded draws vs `probs`: tokens outside the support never drawn, and the
/// chi-square statistic below its α = 1e-6 quantile (the expected counts are ≥ 5 per cell;
/// cells below are pooled).
fn check_frequencies(p: SamplingParams, logits: &[f32]) -> (usize, f64, f64) {
    let n = 20_000;
    let mut s = SeqSampler::new(p).unwrap();
    let probs = s.probs(logits, 0, &[]).unwrap();
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, 0, &[]).unwrap().token as usize] += 1;
    }
    let (mut chi2, mut cells, mut pool_e, mut pool_o) = (0.0, 0usize, 0.0, 0.0);
    for (i, &c) in counts.iter().enumerate() {
        let e = probs[i] as f64 * n as f64;
        if probs[i] == 0.0 {
            assert_eq!(c, 0, "token {i} is outside the support but was drawn {c} times");
        } else if e < 5.0 {
            pool_e += e;
            pool_o += c as f64;
        } else {
            chi2 += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e >= 5.0 {
        chi2 += (pool_o - pool_e).powi(2) / pool_e;
        cells += 1;
    }
    let crit = chi2_quantile((cells - 1) as f64, 4.753);
    assert!(chi2 < crit, "chi-square {chi2:.1} over {cells} cells exceeds the α = 1e-6 bound {crit:.1}");
    (cells, chi2, crit)
}

#[test]
fn sampling_frequencies_match_the_distribution() {
    let r = row(64, 5);
    let kinds = [
        params(1.0, None, Some(0.9), 11),
        params(0.8, Some(12), None, 12),
        params(1.0, None, None, 13),
        SamplingParams { temperature: 1.0, min_p: Some(0.05), seed: Some(14), ..Default::default() },
        SamplingParams {
            temperature: 0.9,
            top_k: Some(30),
            top_p: Some(0.95),
            min_p: Some(0.01),
            seed: Some(15),
            ..Default::default()
        },
    ];
    for p in kinds {
        let (cells, chi2, crit) = check_frequencies(p.clone(), &r);
        assert!(cells >= 5, "{p:?}: only {cells} cells");
        eprintln!("{p:?}: chi2 {chi2:.1} over {cells} cells < {crit:.1}");
    }
}

#[test]
fn lane_parallel_greedy_keeps_the_first_index_on_ties() {
    // Quantised rows (many ties), with and without overrides (repetition penalty, a masked id):
    // the lane-parallel greedy scan equals the sequential one (the logprobs path) and argmax.
    for salt in 0..300u64 {
        let n = 1 + (salt as usize * 37) % 200;
        let r: Vec<f32> = row(n, salt).iter().map(|v| v.round().min(2.0)).collect();
        let pen = salt % 2 == 1;
        let p = SamplingParams {
            repetition_penalty: if pen { 1.5 } else { 1.0 },
            stop: StopParams { min_tokens: if pen { 1 } else { 0 }, ..Default::default() },
            ..Default::default()
        };
        let mut a = SeqSampler::new(p.clone()).unwrap();
        let mut b = SeqSampler::new(SamplingParams { logprobs: Some(1), ..p }).unwrap();
        let prompt: Vec<u32> = (0..n as u32).step_by(3).collect();
        a.observe_prompt(&prompt);
        b.observe_prompt(&prompt);
        let eos = [(salt % n as u64) as u32];
        let (ta, tb) = (a.sample(&r, 0, &eos), b.sample(&r, 0, &eos));
        match (ta, tb) {
            (Ok(x), Ok(y)) => {
                assert_eq!(x.token, y.token, "salt {salt}");
                if !pen {
                    assert_eq!(x.token as usize, argmax(&r), "salt {salt}");
                }
            }
            (Err(_), Err(_)) => {}
            (x, y) => panic!("salt {salt}: {x:?} vs {y:?}"),
        }
    }
}

/// JSON mode over a toy vocabulary: 200 seeded draws from random logits stay a JSON-object
/// prefix, the end id comes only once the object is complete, masked tokens get probability 0,
/// and rolling the output back rolls the recogniser back.
#[test]
fn json_mode_keeps_the_output_one_json_object() {
    let words: [Option<&str>; 12] = [
        Some("{"),
        Some("}"),
        Some("\"a\""),
        Some(":"),
        Some("1"),
        Some("x"),
        None,
        Some(" "),
        Some("["),
        Some("]"),
        Some(","),
        Some("\"b"),
    ];
    let toks: Vec<Option<Vec<u8>>> = words.iter().map(|w| w.map(|w| w.as_bytes().to_vec())).collect();
    let vocab = std::sync::Arc::new(JsonVocab::new(&toks));
    let schema = std::sync::Arc::new(Schema::any_object());
    let mode = || JsonMode { vocab: vocab.clone(), schema: schema.clone() };
    let eos = [6u32];
    let mut completed = 0;
    for seed in 0..40u64 {
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            json: Some(mode()),
            stop: StopParams { max_tokens: Some(200), ..Default::default() },
            ..Default::default()
        };
        assert!(!p.device_compatible(0));
        let mut s = SeqSampler::new(p).unwrap();
        let mut text = Vec::new();
        for step in 0..200 {
            let l = row(words.len(), seed * 1000 + step);
            let probs = s.probs(&l, step as usize, &eos).unwrap();
            let st = json::JsonState::new().feed(&text).expect("a prefix");
            for (id, &pr) in probs.iter().enumerate() {
                let ok = if id == 6 { st.complete() } else { st.feed(vocab.of(id as u32)).is_some() };
                assert!(ok || pr == 0.0, "seed {seed} step {step}: token {id} refused but p = {pr}");
            }
            let t = s.sample(&l, step as usize, &eos).unwrap().token;
            s.accept(t);
            if t == 6 {
                assert!(st.complete());
                completed += 1;
                break;
            }
            text.extend_from_slice(vocab.of(t));
        }
    }
    assert!(completed > 0, "no draw completed an object");
    // Rolling back: after `{"a"` then truncating to `{`, a key is allowed again and `:` is not.
    let p = SamplingParams { json: Some(mode()), ..Default::default() };
    let mut s = SeqSampler::new(p).unwrap();
    s.accept(0);
    s.accept(2);
    let l = [0.0f32, 0.0, 0.0, 5.0, 0.0, 9.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    assert_eq!(s.sample(&l, 2, &eos).unwrap().token, 3, "`:` after a key");
    s.truncate_output(1);
    let l2 = [0.0f32, 1.0, 0.0, 5.0, 0.0, 9.0, 9.0, 0.0, 0.0, 0.0, 0.0, 2.0];
    assert_eq!(s.sample(&l2, 1, &eos).unwrap().token, 11, "a key (`\"b`) after `{{`, not `:`");
}
