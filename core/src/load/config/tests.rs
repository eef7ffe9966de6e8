use super::*;
use serde_json::json;

#[test]
fn architecture_must_be_single() {
    assert_eq!(architecture(&json!({"architectures": ["X"]})).unwrap(), "X");
    assert!(architecture(&json!({})).is_err());
    assert!(architecture(&json!({"architectures": ["X", "Y"]})).is_err());
}

fn msg(r: Result<impl std::fmt::Debug>) -> String {
    r.expect_err("must fail").to_string()
}

#[test]
fn keys_name_the_key_value_and_range() {
    let raw = json!({"a": "abc", "b": -1, "c": 1u64 << 63, "d": null, "e": 1.5, "f": 7});
    let k = Keys::new(&raw).unwrap();
    assert_eq!(
        msg(k.count("a", Some(1), 1..=4096)),
        "config key `a` = \"abc\": must be a positive integer in 1..=4096, found a string"
    );
    assert_eq!(msg(k.count("b", None, 1..=8)), "config key `b` = -1: must be a positive integer in 1..=8");
    assert_eq!(
        msg(k.count("c", None, 1..=4096)),
        "config key `c` = 9223372036854775808: must be a positive integer in 1..=4096"
    );
    assert!(msg(k.count("d", Some(3), 1..=8)).contains("found null"));
    assert_eq!(k.opt_count("d", Some(3), 1..=8).unwrap(), None);
    assert_eq!(k.opt_count("zz", Some(3), 1..=8).unwrap(), Some(3));
    assert!(msg(k.count("e", None, 1..=8)).contains("found a float"));
    assert_eq!(k.count("f", None, 1..=8).unwrap(), 7);
    assert!(msg(k.count("missing", None, 1..=8)).contains("config key `missing` = (absent): is required"));
    assert!(msg(k.flag("f", false)).contains("must be true or false, found an integer"));
    assert!(msg(k.float("a", 1.0, positive_f32, POSITIVE_F32)).contains("`a`"));
    assert!(msg(k.float("b", 1.0, positive_f32, POSITIVE_F32)).contains("must be a positive finite"));
}

#[test]
fn lists_are_checked() {
    let raw = json!({"l": [0, 5], "bad": [0, "x"], "s": "abc", "t": ["a", 1]});
    let k = Keys::new(&raw).unwrap();
    assert_eq!(k.opt_count_list("l", 0..=9).unwrap(), Some(vec![0, 5]));
    assert!(msg(k.opt_count_list("bad", 0..=9)).contains("found \"x\""));
    assert!(msg(k.opt_count_list("s", 0..=9)).contains("found a string"));
    assert!(msg(k.opt_string_list("t")).contains("entries must be strings"));
    let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let ok = check_layer_types(&t(&["mamba", "attention"]), 2, &["linear_attention", "full_attention"], true).unwrap();
    assert_eq!(ok, t(&["linear_attention", "full_attention"]));
    assert!(
        msg(check_layer_types(&t(&["full_attention"]), 2, &["full_attention"], false)).contains("one entry per layer")
    );
    assert!(msg(check_layer_types(&t(&["attention"]), 1, &["full_attention"], false)).contains("found `attention`"));
}

/// Qwen3Config's defaults of the shared keys.
fn qwen3_defaults() -> DecoderDefaults {
    DecoderDefaults {
        max_position_embeddings: 32768,
        reads_attention_bias: true,
        intermediate_size: 22016,
        vocab_size: 151936,
        hidden_size: 4096,
        num_hidden_layers: 32,
        num_attention_heads: 32,
    }
}

#[test]
fn decoder_keys_have_bounds_before_allocation() {
    let base = json!({"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4});
    let d = qwen3_defaults();
    let c = DecoderConfig::read(&Keys::new(&base).unwrap(), &d).unwrap();
    assert_eq!((c.max_position_embeddings, c.rms_norm_eps, c.hidden_act), (Some(32768), 1e-6, Act::Silu));
    for (key, v, needle) in [
        ("num_hidden_layers", json!(1u64 << 63), "1..=4096"),
        ("num_hidden_layers", json!(1_000_000_000), "1..=4096"),
        ("vocab_size", json!(1u64 << 30), "1..=16777216"),
        ("rms_norm_eps", json!(-1e-6), "positive"),
        ("rms_norm_eps", json!(0), "positive"),
        ("rms_norm_eps", json!(1e-50), "positive"),
        ("hidden_act", json!("prelu"), "learned parameters (supported: silu, swish, gelu"),
        ("hidden_act", json!("foo"), "= \"foo\": is not supported (supported: silu, swish, gelu,"),
        ("hidden_act", json!("GELU"), "is not supported"),
        ("hidden_act", json!(null), "found null"),
        ("max_position_embeddings", json!(null), "found null"),
        ("tie_word_embeddings", json!("yes"), "true or false"),
    ] {
        let mut raw = base.clone();
        raw[key] = v.clone();
        let e = msg(DecoderConfig::read(&Keys::new(&raw).unwrap(), &d));
        assert!(e.contains(&format!("`{key}`")) && e.contains(needle), "{key} = {v}: {e}");
    }
    let w = HeadDims::WholeHeadRope;
    let e = msg(check_dims(64, 4, 3, 16, 512, 2, w));
    assert!(e.contains("num_key_value_heads") && e.contains("num_attention_heads = 4"), "{e}");
    let e = msg(check_dims(65, 4, 4, 16, 512, 2, w).and(check_dims(64, 4, 4, 15, 512, 2, w)));
    assert!(e.contains("head_dim") && e.contains("hidden_size / num_attention_heads"), "{e}");
    // Partial RoPE allows an odd head; without attention layers the heads need not divide.
    assert!(check_dims(64, 4, 4, 15, 512, 2, HeadDims::PartialRope).is_ok());
    assert!(msg(check_dims(64, 4, 3, 15, 512, 2, HeadDims::PartialRope)).contains("num_key_value_heads"));
    assert!(check_dims(64, 3, 2, 15, 512, 2, HeadDims::NoAttention).is_ok());
    assert!(msg(check_dims(64, 3, 2, 0, 512, 2, HeadDims::NoAttention)).contains("head_dim"));
}

#[test]
fn hidden_act_names_and_devices() {
    let base = json!({"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4});
    let d = qwen3_defaults();
    for (name, act) in Act::NAMES.iter().zip(Act::ALL) {
        let mut raw = base.clone();
        raw["hidden_act"] = json!(name);
        assert_eq!(DecoderConfig::read(&Keys::new(&raw).unwrap(), &d).unwrap().hidden_act, act);
        assert_eq!(check_act(name).unwrap(), act);
        assert!(check_act_device(act, Device::Cpu).is_ok());
        assert_eq!(check_act_device(act, Device::Cuda(0)).is_ok(), act.is_silu(), "{name}");
    }
    let e = msg(check_act_device(Act::Gelu, Device::Cuda(1)));
    assert_eq!(
        e,
        "config key `hidden_act` = \"gelu\": runs on the CPU backend only (the CUDA kernels fuse silu); use --device cpu"
    );
    assert!(msg(check_act("xielu")).contains("learned parameters"));
    // serde (crates that embed the shared keys) takes the same names.
    let c: DecoderConfig = serde_json::from_value(json!({"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1,
        "num_attention_heads": 1, "hidden_act": "relu2"}))
    .unwrap();
    assert_eq!(c.hidden_act, Act::Relu2);
    let e = serde_json::from_value::<DecoderConfig>(json!({"vocab_size": 8, "hidden_size": 4,
        "num_hidden_layers": 1, "num_attention_heads": 1, "hidden_act": "prelu"}));
    assert!(e.unwrap_err().to_string().contains("learned parameters"));
}

#[test]
fn moe_keys() {
    let d = MoeDefaults {
        num_experts: 128,
        num_experts_per_tok: 8,
        moe_intermediate_size: 768,
        norm_topk_prob: false,
        num_experts_alias: Some("num_local_experts"),
    };
    let m = MoeKeys::read(&Keys::new(&json!({})).unwrap(), &d).unwrap();
    assert_eq!((m.num_experts, m.num_experts_per_tok, m.decoder_sparse_step), (128, 8, 1));
    for (raw, needle) in [
        (json!({"num_experts": 1_000_000_000}), "`num_experts`"),
        (json!({"num_experts": 4, "num_experts_per_tok": 5}), "`num_experts_per_tok` = 5: must be in 1..=4"),
        (json!({"num_experts_per_tok": 0}), "`num_experts_per_tok`"),
        (json!({"decoder_sparse_step": 0}), "`decoder_sparse_step`"),
        (json!({"mlp_only_layers": [-1]}), "`mlp_only_layers`"),
        (json!({"mlp_only_layers": "abc"}), "`mlp_only_layers`"),
        (json!({"moe_intermediate_size": 0}), "`moe_intermediate_size`"),
    ] {
        let e = msg(MoeKeys::read(&Keys::new(&raw).unwrap(), &d));
        assert!(e.contains(needle), "{raw}: {e}");
    }
    let m = MoeKeys::read(&Keys::new(&json!({"mlp_only_layers": null, "num_experts": 0})).unwrap(), &d).unwrap();
    assert!(m.mlp_only_layers.is_empty() && !m.is_moe_layer(0));
    // transformers' attribute_map: `num_local_experts` wins over `num_experts` when present.
    for (raw, want) in [
        (json!({"num_local_experts": 4, "num_experts_per_tok": 2}), 4),
        (json!({"num_local_experts": 4, "num_experts": 6, "num_experts_per_tok": 2}), 4),
        (json!({"num_experts": 6, "num_experts_per_tok": 2}), 6),
    ] {
        assert_eq!(MoeKeys::read(&Keys::new(&raw).unwrap(), &d).unwrap().num_experts, want, "{raw}");
    }
    let e = msg(MoeKeys::read(&Keys::new(&json!({"num_local_experts": "x"})).unwrap(), &d));
    assert!(e.contains("`num_local_experts`"), "{e}");
}

#[test]
fn token_ids_are_typed() {
    let dir = Path::new("/nonexistent");
    let g = generation_config(dir, &json!({"eos_token_id": [2, -1, 7], "bos_token_id": null})).unwrap();
    assert_eq!((g.eos_token_ids, g.bos_token_id), (vec![2, 7], None));
    for raw in [json!({"eos_token_id": "abc"}), json!({"eos_token_id": [0, "x"]}), json!({"bos_token_id": 1.5})] {
        let e = msg(generation_config(dir, &raw));
        assert!(e.contains("(in config.json)") && e.contains("_token_id`"), "{e}");
    }
}
