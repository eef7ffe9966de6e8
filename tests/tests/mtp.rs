//! MTP speculative decoding: greedy output with --mtp-step 1..3 equals plain greedy output
//! token for token (f32), for every main + draft pair; draft loading errors are clear.

use porter_core::draft::DraftHead;
use porter_core::generate::generate;
use porter_core::sampling::SamplingParams;
use porter_core::speculative::{generate_speculative, MtpMode};
use porter_core::{config, registry, DType, Model};
use tests::*;

fn main_and_draft(main_name: &str, draft_dir: &str) -> (Model, Box<dyn DraftHead>) {
    let m = load(main_name, DType::F32).unwrap();
    let cfg = config::read_config(&fixture(main_name)).unwrap();
    let d = registry::load_draft(&fixture(draft_dir), &cfg, &m).unwrap();
    (m, d)
}

fn check_exact(main_name: &str, draft_dir: &str) {
    let (m, d) = main_and_draft(main_name, draft_dir);
    let drafts = vec![d];
    let prompt: Vec<u32> = vec![5, 77, 300, 12, 9, 41, 256];
    let n = 64;
    let plain = generate(&m, &prompt, SamplingParams::default(), n, &[]).unwrap().ids;
    for k in 1..=3 {
        let spec =
            generate_speculative(&m, &drafts, &prompt, SamplingParams::default(), n, &[], k, MtpMode::Eagle).unwrap();
        println!(
            "{main_name} + {draft_dir}, k = {k}: {:.2} tokens/step over {} steps",
            spec.tokens_per_step(),
            spec.steps
        );
        assert_eq!(spec.ids, plain, "{main_name} k={k}: speculative greedy output differs from plain greedy");
    }
}

#[test]
fn qwen3_next_mtp_greedy_is_exact() {
    check_exact("qwen3_next_mtp", "qwen3_next_mtp");
}

#[test]
fn qwen3_moe_mtp_greedy_is_exact() {
    check_exact("qwen3_moe", "qwen3_moe_mtp_draft");
}

#[test]
fn qwen3_dense_mtp_greedy_is_exact() {
    check_exact("qwen3", "qwen3_dense_mtp_draft");
}

#[test]
fn mistral_mtp_greedy_is_exact() {
    check_exact("mistral", "mistral_mtp_draft");
}

#[test]
fn vanilla_mode_with_ffn_modules_is_exact() {
    let m = load("mistral", DType::F32).unwrap();
    let cfg = config::read_config(&fixture("mistral")).unwrap();
    let prompt: Vec<u32> = vec![5, 77, 300, 12];
    let plain = generate(&m, &prompt, SamplingParams::default(), 48, &[]).unwrap().ids;
    for k in 1..=3 {
        let drafts: Vec<Box<dyn DraftHead>> =
            (0..k).map(|_| registry::load_draft(&fixture("mistral_mtp_draft"), &cfg, &m).unwrap()).collect();
        let spec = generate_speculative(&m, &drafts, &prompt, SamplingParams::default(), 48, &[], k, MtpMode::Vanilla)
            .unwrap();
        assert_eq!(spec.ids, plain, "vanilla k={k}");
    }
}

/// Draft logits against the torch references of `tests/gen_mtp_fixtures.py`.
fn check_draft_parity(main_name: &str, draft_dir: &str) {
    let r = porter_core::checkpoint::Checkpoint::open_files(&[fixture(main_name).join("mtp_reference.safetensors")])
        .unwrap();
    let ids: Vec<u32> = r.read_i64("ids").unwrap().into_iter().map(|v| v as u32).collect();
    let want = r.read_f32("mtp_logits").unwrap();
    let cfg = config::read_config(&fixture(main_name)).unwrap();
    for (dtype, tol) in [(DType::F32, 1e-3), (DType::BF16, 5e-2)] {
        let m = load(main_name, dtype).unwrap();
        let d = registry::load_draft(&fixture(draft_dir), &cfg, &m).unwrap();
        let got = porter_core::speculative::draft_logits(&m, d.as_ref(), &ids).unwrap();
        assert_eq!(got.shape(), &[ids.len() - 1, m.info.vocab_size]);
        assert_close(&format!("{main_name} + {draft_dir} mtp_logits {dtype}"), got.data(), &want, tol);
    }
}

#[test]
fn qwen3_next_mtp_draft_logits_match_reference() {
    check_draft_parity("qwen3_next_mtp", "qwen3_next_mtp");
}

#[test]
fn qwen3_moe_mtp_draft_logits_match_reference() {
    check_draft_parity("qwen3_moe", "qwen3_moe_mtp_draft");
}

#[test]
fn qwen3_dense_mtp_draft_logits_match_reference() {
    check_draft_parity("qwen3", "qwen3_dense_mtp_draft");
}

#[test]
fn mistral_mtp_draft_logits_match_reference() {
    check_draft_parity("mistral", "mistral_mtp_draft");
}

#[test]
fn draft_with_wrong_hidden_size_is_rejected() {
    // A layout that matches no draft registered for the main architecture.
    let m = load("qwen3", DType::F32).unwrap();
    let cfg = config::read_config(&fixture("qwen3")).unwrap();
    let e = registry::load_draft(&fixture("mistral_mtp_draft"), &cfg, &m)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(e.contains("matches no registered draft head"), "{e}");
    // A matching layout whose config disagrees with the main model's hidden size.
    let dir = std::env::temp_dir().join(format!("porter-draft-hidden-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(fixture("qwen3_dense_mtp_draft").join(f), dir.join(f)).unwrap();
    }
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["hidden_size"] = serde_json::json!(96);
    std::fs::write(&p, v.to_string()).unwrap();
    let e = registry::load_draft(&dir, &cfg, &m).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(e.contains("hidden_size = 96 but the main model has 64"), "{e}");
}

/// A copy of draft folder `draft` under the temp dir with `hidden_act` set in its config.
fn draft_with_act(draft: &str, act: &str) -> std::path::PathBuf {
    tests::variant(draft, &format!("draft-act-{draft}-{act}"), |c| c["hidden_act"] = serde_json::json!(act))
}

/// The draft heads' FFNs follow the `hidden_act` of the config they are built from: the
/// draft folder's for the FFN-only heads (`qwen3_moe_mtp`, `mistral_mtp`), the main model's
/// for `qwen3_next_mtp` (its MTP layer is a main-model decoder layer). Another activation
/// changes the draft logits; an unsupported one is refused at load, naming the key.
#[test]
fn draft_heads_follow_hidden_act() {
    let ids: Vec<u32> = vec![5, 77, 300, 12, 9, 41, 256, 3];
    let differs = |a: &porter_core::Tensor, b: &porter_core::Tensor| max_abs_diff(a.data(), b.data()) / std(a.data());
    for (main_name, draft) in [("qwen3_moe", "qwen3_moe_mtp_draft"), ("mistral", "mistral_mtp_draft")] {
        let m = load(main_name, DType::F32).unwrap();
        let cfg = config::read_config(&fixture(main_name)).unwrap();
        let base = registry::load_draft(&fixture(draft), &cfg, &m).unwrap();
        let silu = porter_core::speculative::draft_logits(&m, base.as_ref(), &ids).unwrap();
        let dir = draft_with_act(draft, "gelu");
        let d = registry::load_draft(&dir, &cfg, &m).unwrap();
        let gelu = porter_core::speculative::draft_logits(&m, d.as_ref(), &ids).unwrap();
        let r = differs(&silu, &gelu);
        assert!(r > 1e-2, "{draft}: hidden_act gelu in the draft config changes nothing ({r:e}·std)");
        let bad = draft_with_act(draft, "prelu");
        let e = registry::load_draft(&bad, &cfg, &m).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("`hidden_act` = \"prelu\": is not supported"), "{draft}: {e}");
        for d in [dir, bad] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    let m = load("qwen3_next_mtp", DType::F32).unwrap();
    let mut cfg = config::read_config(&fixture("qwen3_next_mtp")).unwrap();
    let base = registry::load_draft(&fixture("qwen3_next_mtp"), &cfg, &m).unwrap();
    let silu = porter_core::speculative::draft_logits(&m, base.as_ref(), &ids).unwrap();
    cfg["hidden_act"] = serde_json::json!("relu2");
    let d = registry::load_draft(&fixture("qwen3_next_mtp"), &cfg, &m).unwrap();
    let relu2 = porter_core::speculative::draft_logits(&m, d.as_ref(), &ids).unwrap();
    let r = differs(&silu, &relu2);
    assert!(r > 1e-2, "qwen3_next_mtp: the main config's hidden_act relu2 changes nothing ({r:e}·std)");
}
