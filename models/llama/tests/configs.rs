//! Llama 2 / 3.x config variants resolved through the registry entry and the weight map (no
//! checkpoint needed): defaults, biases, tying, `pretraining_tp`, and rejected values. The real
//! checkpoint (SmolLM2) is tested against transformers in `tests/tests/smollm2.rs`.

use llama::Config;
use porter_core::weight_map::WeightMap;
use serde_json::{json, Value};

/// A small Llama-2-style config (no `head_dim`, MHA) with `extra` merged in.
fn config(extra: Value) -> Value {
    let mut c = json!({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    });
    for (k, v) in extra.as_object().expect("object") {
        c[k] = v.clone();
    }
    c
}

/// The resolved table of the map for `raw`.
fn table(raw: &Value) -> porter_core::Result<String> {
    let entry = porter_core::registry::lookup("LlamaForCausalLM").expect("llama is registered");
    let ctx = (entry.map_context)(raw)?;
    Ok(WeightMap::parse(entry.weight_map)?.resolve(&ctx)?.render_table())
}

#[test]
fn llama2_defaults_untied_no_biases() {
    let raw = config(json!({"pretraining_tp": 2}));
    let (c, rope) = Config::from_value(&raw).unwrap();
    assert_eq!((c.kv_heads(), c.head_dim(), rope.theta), (4, 8, 10_000.0));
    let t = table(&raw).unwrap();
    assert!(t.contains("lm_head.weight -> lm_head [64, 32]"), "{t}");
    assert!(t.contains("model.layers.1.self_attn.k_proj.weight -> layers.1.attn.k_proj [32, 32]"), "{t}");
    assert!(!t.contains(".bias") && !t.contains("(ignored)"), "{t}");
}

#[test]
fn llama32_style_tied_gqa_head_dim() {
    let raw = config(json!({"num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": true, "rope_theta": 5e5}));
    let (c, rope) = Config::from_value(&raw).unwrap();
    assert_eq!((c.kv_heads(), c.head_dim(), rope.theta), (2, 16, 5e5));
    let t = table(&raw).unwrap();
    assert!(t.contains("model.layers.0.self_attn.q_proj.weight -> layers.0.attn.q_proj [64, 32]"), "{t}");
    assert!(t.contains("model.layers.0.self_attn.v_proj.weight -> layers.0.attn.v_proj [32, 32]"), "{t}");
    assert!(t.contains("lm_head.weight -> (ignored) tied to model.embed_tokens.weight"), "{t}");
}

#[test]
fn attention_and_mlp_biases() {
    let t = table(&config(json!({"num_key_value_heads": 2, "attention_bias": true, "mlp_bias": true}))).unwrap();
    for want in [
        "model.layers.1.self_attn.q_proj.bias -> layers.1.attn.q_proj.bias [32]",
        "model.layers.1.self_attn.k_proj.bias -> layers.1.attn.k_proj.bias [16]",
        "model.layers.1.self_attn.o_proj.bias -> layers.1.attn.o_proj.bias [32]",
        "model.layers.1.mlp.gate_proj.bias -> layers.1.mlp.gate_proj.bias [48]",
        "model.layers.1.mlp.down_proj.bias -> layers.1.mlp.down_proj.bias [32]",
    ] {
        assert!(t.contains(want), "missing `{want}` in {t}");
    }
    let only_attn = table(&config(json!({"attention_bias": true}))).unwrap();
    assert!(only_attn.contains("self_attn.v_proj.bias") && !only_attn.contains("mlp.up_proj.bias"), "{only_attn}");
}

#[test]
fn bad_configs_are_rejected() {
    for (extra, needle) in [
        (json!({"hidden_act": "prelu"}), "`hidden_act` = \"prelu\": is not supported"),
        (json!({"hidden_act": "foo"}), "supported: silu, swish, gelu"),
        (json!({"num_key_value_heads": 3}), "multiple"),
        (json!({"rope_scaling": {"rope_type": "longrope"}}), "longrope"),
        (json!({"num_attention_heads": 0}), "positive"),
    ] {
        let e = Config::from_value(&config(extra.clone())).map(|_| ()).expect_err("must fail").to_string();
        assert!(e.contains(needle), "{extra}: {e}");
    }
    // Every activation transformers' ACT2FN has without learned parameters is read.
    for name in porter_core::config::SUPPORTED_ACTS {
        let (c, _) = Config::from_value(&config(json!({"hidden_act": name}))).expect(name);
        assert_eq!(c.base.hidden_act.name(), name);
    }
}
