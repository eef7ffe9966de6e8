//! insta snapshots of every weight map resolved against each fixture's config: the table
//! "checkpoint name → engine slot [shape] transform". Any change to a mapping shows up as
//! a snapshot diff. Also checks each map covers its fixture checkpoint exactly.

use porter_core::registry;
use tests::fixture;

fn table(name: &str) -> String {
    let p = registry::prepare(&fixture(name)).expect("prepare");
    p.map.validate(&p.checkpoint).unwrap_or_else(|e| panic!("{name}: {e}"));
    p.map.render_table()
}

macro_rules! snap {
    ($($test:ident => $fixture:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            insta::assert_snapshot!($fixture, table($fixture));
        }
    )*};
}

snap! {
    qwen3 => "qwen3",
    qwen3_tied => "qwen3_tied",
    qwen3_moe => "qwen3_moe",
    qwen3_moe_sparse2 => "qwen3_moe_sparse2",
    mistral => "mistral",
    mistral_swa => "mistral_swa",
    qwen3_next_a => "qwen3_next_a",
    qwen3_next_b => "qwen3_next_b",
    qwen3_next_mtp_sharded => "qwen3_next_mtp",
}

/// Draft maps resolved against their folders (the main model's facts come from its config).
fn draft_table(main: &str, draft: &str) -> String {
    let main_cfg = porter_core::config::read_config(&fixture(main)).expect("main config");
    let m = tests::load(main, porter_core::DType::F32).expect("main model");
    let p = registry::prepare_draft(&fixture(draft), &main_cfg, &m.info, porter_core::DType::F32).expect("draft");
    p.map.validate(&p.checkpoint).unwrap_or_else(|e| panic!("{draft}: {e}"));
    format!("# draft {}\n{}", p.entry.name, p.map.render_table())
}

macro_rules! snap_draft {
    ($($test:ident => $main:literal, $draft:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            insta::assert_snapshot!(stringify!($test), draft_table($main, $draft));
        }
    )*};
}

snap_draft! {
    draft_qwen3_next_mtp => "qwen3_next_mtp", "qwen3_next_mtp",
    draft_qwen3_moe_mtp => "qwen3_moe", "qwen3_moe_mtp_draft",
    draft_qwen3_dense_mtp => "qwen3", "qwen3_dense_mtp_draft",
    draft_mistral_mtp => "mistral", "mistral_mtp_draft",
}

/// `LlamaForCausalLM`'s map (the shared Llama layout as is) resolved against the real
/// SmolLM2-135M-Instruct config committed with its reference (tied embeddings, 30 layers).
#[test]
fn llama_smollm2() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/smollm2_ref/reference.json");
    let text = std::fs::read_to_string(&path).expect("reference.json");
    let reference: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let map = registry::resolve_config(&reference["config"]).expect("resolve");
    insta::assert_snapshot!("llama_smollm2", map.render_table());
}
