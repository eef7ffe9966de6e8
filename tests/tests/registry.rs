//! The registry holds exactly the model crates the umbrella links, and reports unknown
//! architectures with the full list.

use porter_core::registry::{self, RegistryError};

#[test]
fn registered_architectures_are_exact() {
    models::link();
    assert_eq!(
        registry::architectures(),
        vec![
            "LlamaForCausalLM",
            "MistralForCausalLM",
            "Qwen3ForCausalLM",
            "Qwen3MoeForCausalLM",
            "Qwen3NextForCausalLM"
        ]
    );
}

#[test]
fn unknown_architecture_lists_all() {
    models::link();
    let err = registry::lookup("GPT2LMHeadModel").map(|e| e.architecture).expect_err("must fail");
    assert!(matches!(err, RegistryError::UnknownArchitecture { .. }));
    let msg = err.to_string();
    assert!(msg.contains("GPT2LMHeadModel"), "{msg}");
    for a in registry::architectures() {
        assert!(msg.contains(a), "{msg} should list {a}");
    }
}

#[test]
fn registered_drafts_are_exact() {
    models::link();
    let drafts: Vec<(&str, Vec<&str>)> =
        registry::draft_entries().iter().map(|e| (e.name, e.main_architectures.to_vec())).collect();
    assert_eq!(
        drafts,
        vec![
            ("mistral_mtp", vec!["MistralForCausalLM"]),
            ("qwen3_moe_mtp", vec!["Qwen3MoeForCausalLM", "Qwen3ForCausalLM"]),
            ("qwen3_next_mtp", vec!["Qwen3NextForCausalLM"]),
        ]
    );
}
