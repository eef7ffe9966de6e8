//! FP8 (e4m3) and int8 KV caches (`--kv-cache-dtype fp8|int8`, one f32 scale per token and KV
//! head) on the CPU: the logits of f32 models whose K/V go through the quantized cache against
//! the same run with the model-dtype cache, prefill and token by token, on the fixtures
//! (qwen3, qwen3_next_a, mistral_swa: a sliding window of 32 over 160 tokens), greedy
//! continuations, the serving engine with a quantized pool (prefix-cache hits reuse quantized
//! blocks exactly) and the real SmolLM2 checkpoint.
//!
//! Measured (2026-12-01, this file's `println!`s; docs/architecture.md §4.2 has the table),
//! max|Δ| / std(ref) of the logits against the model-dtype KV run, worst over the three
//! fixtures, both prompts, prefill and token by token: int8 1.67e-2, fp8 6.98e-2 (both on
//! mistral_swa). Bounds: a dequantized K/V element is off by ≤ scale/2 = amax/254 for int8 and
//! by ≤ 2⁻⁴·|x| (half an e4m3 step) for fp8, so fp8's logits error is expected a few times
//! int8's (3–6× measured); the asserted bounds are 4e-2 (int8) and 1.5e-1 (fp8), each ≥ 2× the
//! worst measurement, and well below the ≈ 0.14·std greedy margin of these fixtures only for
//! int8 — fp8's greedy continuations agree on all three fixtures, but that is measured, not
//! implied by the bound.

use porter_core::engine::{EngineConfig, EngineCore, Event, SamplingParams};
use porter_core::generate::generate;
use porter_core::state::KvDtype;
use porter_core::{DType, Model};
use tests::engine_util::{cfg, greedy, run_all, Rng};
use tests::*;

/// max|Δ| / std(ref) bound of int8 KV logits vs the model-dtype KV (module docs).
const INT8_TOL: f32 = 4e-2;
/// The same for fp8 (e4m3) KV.
const FP8_TOL: f32 = 1.5e-1;
/// max|Δ| / std(ref) bound on SmolLM2 (bf16, every prompt position; see its test).
const SMOLLM2_TOL: f32 = 1.0;

fn with_kv(mut m: Model, kv: KvDtype) -> Model {
    m.info.kv_cache_dtype = kv;
    m
}

fn tol(kv: KvDtype) -> f32 {
    match kv {
        KvDtype::Int8 => INT8_TOL,
        _ => FP8_TOL,
    }
}

/// Logits with fp8 / int8 KV vs the model-dtype KV (f32 compute), prefill and token by token,
/// both prompt lengths; the greedy continuation of the fixture's prompt is printed with how many
/// tokens agree with the model-dtype KV run.
fn check_fixture(name: &str) {
    let r = Reference::open(name).expect("reference");
    let base = load(name, DType::F32).expect("load");
    let prompt = r.ids("greedy_prompt").unwrap();
    let want_greedy = r.ids("greedy_ids").unwrap();
    let g_auto = generate(&base, &prompt, SamplingParams::default(), want_greedy.len(), &[]).unwrap().ids;
    assert_eq!(g_auto, want_greedy, "{name}: model-dtype KV greedy differs from transformers");
    for kv in [KvDtype::Int8, KvDtype::Fp8] {
        let m = with_kv(load(name, DType::F32).expect("load"), kv);
        for case in ["short", "long"] {
            let ids = r.ids(&format!("ids_{case}")).unwrap();
            let want_pre = prefill_logits(&base, &ids).unwrap();
            let pre = prefill_logits(&m, &ids).unwrap();
            assert_close(&format!("{name} {case} {kv} KV prefill vs auto"), &pre, &want_pre, tol(kv));
            let inc = incremental_logits(&m, &ids).unwrap();
            assert_close(&format!("{name} {case} {kv} KV token by token vs auto"), &inc, &want_pre, tol(kv));
            // Prefill and decode read the same quantized rows (quantized per token as appended).
            assert_close(&format!("{name} {case} {kv} KV prefill vs token by token"), &inc, &pre, 1e-4);
            // And against transformers' f32 reference (with its model-dtype cache).
            let hf = r.f32(&format!("logits_{case}")).unwrap();
            assert_close(&format!("{name} {case} {kv} KV vs transformers f32"), &pre, &hf, tol(kv));
        }
        let g = generate(&m, &prompt, SamplingParams::default(), want_greedy.len(), &[]).unwrap().ids;
        let agree = g.iter().zip(&want_greedy).take_while(|(a, b)| a == b).count();
        println!("{name} {kv} KV greedy: {g:?} ({agree}/{} tokens agree with the model-dtype KV)", want_greedy.len());
    }
}

#[test]
fn qwen3_quantized_kv_logits_within_bounds() {
    check_fixture("qwen3");
}

#[test]
fn qwen3_next_quantized_kv_logits_within_bounds() {
    check_fixture("qwen3_next_a");
}

#[test]
fn mistral_swa_quantized_kv_logits_within_bounds() {
    check_fixture("mistral_swa");
}

/// bf16 compute with a quantized KV: dequantized values are rounded to bf16 as a bf16 cache
/// would hold them; the error against the f32 reference stays within the fp8 / int8 bound plus
/// the bf16 tolerance (5e-2).
#[test]
fn bf16_model_with_quantized_kv() {
    let r = Reference::open("qwen3").expect("reference");
    let ids = r.ids("ids_long").unwrap();
    let hf = r.f32("logits_long").unwrap();
    for kv in [KvDtype::Int8, KvDtype::Fp8] {
        let m = with_kv(load("qwen3", DType::BF16).unwrap(), kv);
        let pre = prefill_logits(&m, &ids).unwrap();
        assert_close(&format!("qwen3 bf16 {kv} KV vs transformers f32"), &pre, &hf, tol(kv) + 5e-2);
    }
}

/// The serving engine with a quantized pool sizes it at the quantized bytes per token (the same
/// memory holds ~2x the tokens of bf16 at head_dim 256, 1.6x at the fixtures' head_dim 32), and a
/// prefix-cache hit reuses quantized blocks: each request's output equals its cold run bit for
/// bit (the bytes and scales of a token do not depend on the rest of the batch).
#[test]
fn engine_serves_with_quantized_kv_and_prefix_hits_are_exact() {
    for kv in [KvDtype::Fp8, KvDtype::Int8] {
        let m = with_kv(load("qwen3", DType::BF16).unwrap(), kv);
        let (q, a) = (m.kv_bytes_per_token_as(kv), m.kv_bytes_per_token_as(KvDtype::Auto));
        // 3 layers × 2 KV heads × (32 bytes + 4 for the scale) × K and V, vs 3 × 2 × 32 × 2 B × 2.
        assert_eq!((q, a), (3 * 2 * 2 * 36, 3 * 2 * 2 * 64));
        let sized = EngineConfig::for_model(&m, Some(1 << 20));
        assert_eq!(sized.kv_dtype, kv);
        assert_eq!(sized.num_blocks, (1 << 20) / (q * sized.block_size));
        let vocab = m.info.vocab_size;
        let mut rng = Rng(99);
        let system = rng.prompt(48, vocab);
        let reqs: Vec<(u64, Vec<u32>, SamplingParams)> = (0..3u64)
            .map(|i| (i, [system.clone(), rng.prompt(5 + 3 * i as usize, vocab)].concat(), greedy(8)))
            .collect();
        let c = EngineConfig { kv_dtype: kv, ..cfg(4, 256, 64) };
        let mut warm = EngineCore::new(&m, c).unwrap();
        for (i, r) in reqs.iter().enumerate() {
            let cold = {
                let mut e = EngineCore::new(&m, c).unwrap();
                run_all(&mut e, std::slice::from_ref(r)).remove(&r.0).unwrap()
            };
            let got = run_all(&mut warm, std::slice::from_ref(r)).remove(&r.0).unwrap();
            assert_eq!(got.0, cold.0, "{kv} request {i}: a prefix-cache hit changed the output");
            let Event::Done(f) = got.1 else { panic!("{kv} request {i} did not finish") };
            assert_eq!(f.cached_tokens, if i == 0 { 0 } else { 48 }, "{kv} request {i}");
        }
        // Against the model-dtype pool: the same greedy tokens on this fixture.
        let auto = EngineConfig { kv_dtype: KvDtype::Auto, ..c };
        let mut e = EngineCore::new(&m, auto).unwrap();
        let base = run_all(&mut e, &reqs[..1]).remove(&0).unwrap();
        let mut e = EngineCore::new(&m, c).unwrap();
        let quant = run_all(&mut e, &reqs[..1]).remove(&0).unwrap();
        let ids = |v: &[porter_core::engine::TokenOut]| v.iter().map(|t| t.id).collect::<Vec<_>>();
        let agree = ids(&base.0).iter().zip(ids(&quant.0)).take_while(|(a, b)| **a == *b).count();
        println!("engine {kv} KV: {agree}/8 greedy tokens agree with the bf16 KV");
    }
}

/// The real SmolLM2-135M-Instruct (bf16, `target/smollm2` from `scripts/test-setup.sh`, or
/// `$PORTER_SMOLLM2`): greedy answers to the reference's 4 chat prompts with fp8 / int8 KV vs
/// the bf16 KV, first 16 tokens (agreeing prefix printed; 2026-12-01: int8 0, 1, 13, 16; fp8
/// 9, 1, 16, 16), and the logits over every prompt position relative to the bf16-KV run
/// (measured 0.17–0.30 int8, 0.25–0.49 fp8 × std: a real model's keys carry outlier channels
/// that set a row's amax, far larger errors than on the random fixtures; bound 1.0, 2× the
/// worst). Per-token scales are not enough for this model's int8 keys; per-channel key scales
/// (KIVI) would be the next step.
#[test]
fn smollm2_greedy_with_quantized_kv() {
    let dir = std::env::var_os("PORTER_SMOLLM2")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/smollm2"));
    assert!(dir.join("conversion.json").is_file(), "{} is missing: run scripts/test-setup.sh", dir.display());
    let r = Reference::open("smollm2_ref").expect("reference");
    let load_kv = |kv| {
        let mut m = porter_core::registry::load(&dir, DType::BF16, porter_core::Device::Cpu, false).expect("load");
        m.info.kv_cache_dtype = kv;
        m
    };
    let base = load_kv(KvDtype::Auto);
    let eos = base.info.generation.eos_token_ids.clone();
    for kv in [KvDtype::Int8, KvDtype::Fp8] {
        let m = load_kv(kv);
        for k in 0..4 {
            let ids = r.ids(&format!("ids_{k}")).unwrap();
            let want_logits = prefill_logits(&base, &ids).unwrap();
            let got_logits = prefill_logits(&m, &ids).unwrap();
            let ratio = max_abs_diff(&got_logits, &want_logits) / std(&want_logits);
            println!("smollm2 prompt {k} bf16 {kv} KV vs bf16 KV, all positions: max|Δ|/std = {ratio:.3e}");
            assert!(ratio <= SMOLLM2_TOL, "smollm2 prompt {k} {kv} KV: {ratio:e} > {SMOLLM2_TOL:e}");
            let want = generate(&base, &ids, SamplingParams::default(), 16, &eos).unwrap().ids;
            let got = generate(&m, &ids, SamplingParams::default(), 16, &eos).unwrap().ids;
            let agree = want.iter().zip(&got).take_while(|(a, b)| a == b).count();
            println!(
                "smollm2 prompt {k} {kv} KV: {agree}/{} of the first greedy tokens agree with bf16 KV",
                want.len()
            );
        }
    }
}
