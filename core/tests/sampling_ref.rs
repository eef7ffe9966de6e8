//! The per-request sampler against an outside reference: `tests/gen_sampling_reference.py`
//! (numpy ports of HF transformers' logits processors and warpers, the OpenAI penalty formula)
//! wrote `tests/fixtures/sampling_ref/cases.json`. For every case: the filtered distribution
//! within 1e-6 relative (and exactly zero where the reference drops a token), the greedy token
//! exactly, the greedy token's logprob and the top-N logprobs within 1e-5.

use porter_core::sampling::{SamplingParams, SeqSampler, StopParams};
use serde_json::Value;

fn cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/sampling_ref/cases.json");
    let text = std::fs::read_to_string(path).expect("the sampling fixture is committed");
    let v: Value = serde_json::from_str(&text).expect("valid JSON");
    v["cases"].as_array().expect("a case list").clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an id list").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

fn params(c: &Value) -> SamplingParams {
    let p = &c["params"];
    let f = |k: &str| p[k].as_f64().map(|x| x as f32);
    SamplingParams {
        temperature: f("temperature").expect("temperature"),
        top_k: p["top_k"].as_u64().map(|k| k as usize),
        top_p: f("top_p"),
        min_p: f("min_p"),
        repetition_penalty: f("repetition_penalty").expect("repetition_penalty"),
        presence_penalty: f("presence_penalty").expect("presence_penalty"),
        frequency_penalty: f("frequency_penalty").expect("frequency_penalty"),
        logit_bias: Vec::new(),
        json: None,
        seed: Some(7),
        logprobs: p["logprobs"].as_u64().map(|n| n as usize),
        stop: StopParams {
            max_tokens: None,
            min_tokens: p["min_tokens"].as_u64().expect("min_tokens") as usize,
            ignore_eos: p["ignore_eos"].as_bool().expect("ignore_eos"),
            stop_token_ids: ids(&p["stop_token_ids"]),
        },
        prompt_logprobs: None,
        priority: 0,
        cache_salt: None,
    }
}

/// A sampler that has seen the case's prompt and accepted its output.
fn sampler(c: &Value, params: SamplingParams) -> SeqSampler {
    let mut s = SeqSampler::new(params).expect("valid params");
    s.observe_prompt(&ids(&c["prompt"]));
    for t in ids(&c["output"]) {
        s.accept(t);
    }
    s
}

fn logits(c: &Value) -> Vec<f32> {
    c["logits"].as_array().expect("logits").iter().map(|x| x.as_f64().expect("a logit") as f32).collect()
}

#[test]
fn distributions_match_the_reference() {
    let cases = cases();
    assert!(cases.len() >= 10);
    for c in &cases {
        let name = c["name"].as_str().expect("a name");
        let (row, eos, out_len) = (logits(c), ids(&c["eos"]), ids(&c["output"]).len());
        let want: Vec<f64> = c["probs"].as_array().expect("probs").iter().map(|x| x.as_f64().expect("p")).collect();
        let got = sampler(c, params(c)).probs(&row, out_len, &eos).expect("probs");
        assert_eq!(got.len(), want.len(), "{name}");
        let mut worst = 0.0f64;
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if w == 0.0 {
                assert_eq!(g, 0.0, "{name}: token {i} is dropped by the reference, porter gives it {g}");
            } else {
                let rel = (g as f64 - w).abs() / w;
                worst = worst.max(rel);
                assert!(rel <= 1e-6, "{name}: token {i}: porter {g}, reference {w} (relative {rel:.2e})");
            }
        }
        let kept = want.iter().filter(|&&w| w > 0.0).count();
        eprintln!("{name}: vocab {}, {kept} kept, worst relative error {worst:.2e}", row.len());
    }
}

#[test]
fn greedy_and_logprobs_match_the_reference() {
    for c in &cases() {
        let name = c["name"].as_str().expect("a name");
        let (row, eos, out_len) = (logits(c), ids(&c["eos"]), ids(&c["output"]).len());
        let mut p = params(c);
        p.temperature = 0.0;
        let n = p.logprobs.unwrap_or(0);
        p.logprobs = Some(n);
        let got = sampler(c, p).sample(&row, out_len, &eos).expect("sample");
        assert_eq!(got.token as u64, c["greedy"].as_u64().expect("greedy"), "{name}: greedy token");
        let lp = got.logprob.expect("logprobs were asked for");
        let want_lp = c["greedy_logprob"].as_f64().expect("greedy_logprob");
        assert!((lp as f64 - want_lp).abs() <= 1e-5, "{name}: greedy logprob {lp}, reference {want_lp}");
        let want_top = c["top"].as_array().expect("top");
        assert_eq!(got.top.len(), want_top.len(), "{name}: top-N length");
        for (j, ((id, lp), w)) in got.top.iter().zip(want_top).enumerate() {
            let (wid, wlp) = (w[0].as_u64().expect("id"), w[1].as_f64().expect("logprob"));
            assert_eq!(*id as u64, wid, "{name}: top[{j}] id");
            assert!((*lp as f64 - wlp).abs() <= 1e-5, "{name}: top[{j}] logprob {lp}, reference {wlp}");
        }
    }
}

#[test]
fn sampled_tokens_are_kept_by_the_reference_and_logprobs_agree() {
    // Non-greedy draws: the token is one the reference keeps; its logprob is the greedy-free
    // log-softmax value, consistent with the top list when it appears there.
    for c in &cases() {
        let name = c["name"].as_str().expect("a name");
        let (row, eos, out_len) = (logits(c), ids(&c["eos"]), ids(&c["output"]).len());
        let want: Vec<f64> = c["probs"].as_array().expect("probs").iter().map(|x| x.as_f64().expect("p")).collect();
        let mut s = sampler(c, params(c));
        for _ in 0..50 {
            let got = s.sample(&row, out_len, &eos).expect("sample");
            assert!(want[got.token as usize] > 0.0, "{name}: sampled token {} has reference probability 0", got.token);
            if let (Some(lp), Some(hit)) = (got.logprob, got.top.iter().find(|e| e.0 == got.token)) {
                assert_eq!(lp, hit.1, "{name}: chosen logprob and top entry differ");
            }
        }
    }
}
