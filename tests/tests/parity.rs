//! Parity with Hugging Face transformers (float32 CPU references from
//! `tests/gen_fixtures.py`): f32 within 1e-3·std(ref), bf16 within 5e-2·std(ref),
//! identical greedy continuations, prefill == token-by-token decode.

use porter_core::generate::generate;
use porter_core::sampling::SamplingParams;
use porter_core::DType;
use tests::*;

const F32_TOL: f32 = 1e-3;
const BF16_TOL: f32 = 5e-2;

fn check_fixture(name: &str) {
    let r = Reference::open(name).expect("reference");
    let m32 = load(name, DType::F32).expect("load f32");
    let mbf = load(name, DType::BF16).expect("load bf16");
    for case in ["short", "long"] {
        let ids = r.ids(&format!("ids_{case}")).unwrap();
        let want = r.f32(&format!("logits_{case}")).unwrap();
        let pre = prefill_logits(&m32, &ids).unwrap();
        assert_close(&format!("{name} {case} f32 prefill"), &pre, &want, F32_TOL);
        let inc = incremental_logits(&m32, &ids).unwrap();
        assert_close(&format!("{name} {case} f32 incremental"), &inc, &want, F32_TOL);
        assert_close(&format!("{name} {case} f32 prefill vs incremental"), &inc, &pre, F32_TOL);
        let pre_bf = prefill_logits(&mbf, &ids).unwrap();
        assert_close(&format!("{name} {case} bf16 prefill"), &pre_bf, &want, BF16_TOL);
        let inc_bf = incremental_logits(&mbf, &ids).unwrap();
        assert_close(&format!("{name} {case} bf16 incremental"), &inc_bf, &want, BF16_TOL);
    }
    let prompt = r.ids("greedy_prompt").unwrap();
    let want = r.ids("greedy_ids").unwrap();
    let got = generate(&m32, &prompt, SamplingParams::default(), want.len(), &[]).unwrap().ids;
    assert_eq!(got, want, "{name}: f32 greedy continuation differs from transformers");
    let got_bf = generate(&mbf, &prompt, SamplingParams::default(), want.len(), &[]).unwrap().ids;
    assert_eq!(got_bf, want, "{name}: bf16 greedy continuation differs from transformers");
}

#[test]
fn qwen3() {
    check_fixture("qwen3");
}

#[test]
fn qwen3_tied_v5_config_with_biases() {
    check_fixture("qwen3_tied");
}

#[test]
fn qwen3_moe_mlp_only_layers_norm_topk() {
    check_fixture("qwen3_moe");
}

#[test]
fn qwen3_moe_sparse_step_no_norm_topk_sharded() {
    check_fixture("qwen3_moe_sparse2");
}

#[test]
fn mistral() {
    check_fixture("mistral");
}

#[test]
fn mistral_sliding_window() {
    check_fixture("mistral_swa");
}

#[test]
fn qwen3_next_interval_ratio2_dk_ne_dv() {
    check_fixture("qwen3_next_a");
}

#[test]
fn qwen3_next_layer_types_tied_sparse_step() {
    check_fixture("qwen3_next_b");
}

#[test]
fn qwen3_next_sharded_with_mtp_tensors() {
    check_fixture("qwen3_next_mtp");
}

/// `hidden_act: "gelu_pytorch_tanh"` on a dense Qwen3 (the gated MLPs of `llama_decoder`).
#[test]
fn qwen3_hidden_act_gelu_pytorch_tanh() {
    check_fixture("qwen3_gelu_tanh");
}

/// `hidden_act: "gelu"` (exact, erf) on Qwen3-MoE: the routed experts and the dense
/// `mlp_only_layers` MLP.
#[test]
fn qwen3_moe_hidden_act_gelu() {
    check_fixture("qwen3_moe_gelu");
}

/// `hidden_act: "relu2"` on Qwen3-Next: routed experts, shared expert, dense MLP and the Gated
/// DeltaNet causal conv (prefill and the token-by-token conv step); the gated norm keeps SiLU.
#[test]
fn qwen3_next_hidden_act_relu2() {
    check_fixture("qwen3_next_relu2");
}
