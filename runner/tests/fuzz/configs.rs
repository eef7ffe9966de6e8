//! Malformed `config.json` files: every key a model honours, with wrong types, `null`,
//! negative, zero, huge and out-of-range values, plus RoPE scaling blocks and lists.
//!
//! Oracles follow transformers (v5 strict config classes): an `int` key rejects `null`, a
//! string, a float or a bool; `int | None` keys take `null` as their documented default;
//! porter's documented upper bounds (`porter_core::config::limits`) reject absurd counts.

use super::{clone_fixture, fixture_config, gen_args, Case, Oracle, Rng};
use serde_json::{json, Value};

/// What `null` means for a key in transformers.
#[derive(Clone, Copy, PartialEq)]
enum Null {
    /// Rejected (`int` / `float` / `bool` / `str` fields, or a crash later).
    Reject,
    /// The default, which equals the fixture's value.
    Same,
    /// The default, which describes another geometry than the fixture's checkpoint.
    Other,
}

#[derive(Clone, Copy)]
enum Kind {
    /// An integer in `lo..=hi`; `even` when odd values are rejected.
    Count {
        lo: i128,
        hi: i128,
        even: bool,
    },
    /// A float accepted by `ok`.
    Float(fn(f64) -> bool),
    Bool,
}

struct Key {
    name: &'static str,
    kind: Kind,
    null: Null,
    /// Another value changes tensor shapes (the checkpoint no longer fits).
    fixed: bool,
}

const fn count(name: &'static str, lo: i128, hi: i128, null: Null, fixed: bool) -> Key {
    Key { name, kind: Kind::Count { lo, hi, even: false }, null, fixed }
}

fn pos_f32(x: f64) -> bool {
    x.is_finite() && x > 0.0 && (x as f32).is_normal()
}

const L: i128 = 4096; // layers, heads, head dims
const U32: i128 = u32::MAX as i128;

/// The shared keys of every decoder-only config.
fn base_keys(kv_null: Null, head_dim: Option<Null>, moe_only_dense: bool) -> Vec<Key> {
    let mut v = vec![
        count("vocab_size", 1, 1 << 24, Null::Reject, true),
        count("hidden_size", 1, 1 << 17, Null::Reject, true),
        count("num_hidden_layers", 1, L, Null::Reject, true),
        count("num_attention_heads", 1, L, Null::Reject, true),
        count("num_key_value_heads", 1, L, kv_null, true),
        count("max_position_embeddings", 4, 1 << 24, Null::Reject, false),
        Key { name: "rms_norm_eps", kind: Kind::Float(pos_f32), null: Null::Reject, fixed: false },
        Key { name: "tie_word_embeddings", kind: Kind::Bool, null: Null::Reject, fixed: true },
    ];
    // With every layer MoE the dense width is never used.
    v.push(count("intermediate_size", 0, 1 << 20, Null::Reject, !moe_only_dense));
    if let Some(n) = head_dim {
        v.push(Key { name: "head_dim", kind: Kind::Count { lo: 2, hi: L, even: true }, null: n, fixed: true });
    }
    v
}

fn moe_keys(experts: i128) -> Vec<Key> {
    vec![
        count("num_experts", 0, 1 << 14, Null::Reject, true),
        count("num_experts_per_tok", 1, experts, Null::Reject, false),
        count("moe_intermediate_size", 1, 1 << 20, Null::Reject, true),
        count("decoder_sparse_step", 1, U32, Null::Reject, true),
        Key { name: "norm_topk_prob", kind: Kind::Bool, null: Null::Reject, fixed: false },
    ]
}

/// The keys fuzzed on each fixture.
fn keys_of(fixture: &str) -> Vec<Key> {
    match fixture {
        "qwen3" | "qwen3_tied" => {
            let kv = if fixture == "qwen3_tied" { Null::Same } else { Null::Other };
            let mut v = base_keys(kv, Some(Null::Reject), false);
            v.push(Key { name: "attention_bias", kind: Kind::Bool, null: Null::Reject, fixed: true });
            v.push(Key { name: "use_sliding_window", kind: Kind::Bool, null: Null::Reject, fixed: false });
            v.push(count("sliding_window", 1, 1 << 24, Null::Same, false));
            v.push(count("max_window_layers", 0, U32, Null::Reject, false));
            v
        }
        "qwen3_moe" | "qwen3_moe_sparse2" => {
            let experts = if fixture == "qwen3_moe" { 8 } else { 6 };
            let mut v = base_keys(Null::Reject, Some(Null::Reject), false);
            v.extend(moe_keys(experts));
            v.push(Key { name: "use_sliding_window", kind: Kind::Bool, null: Null::Reject, fixed: false });
            v.push(count("sliding_window", 1, 1 << 24, Null::Same, false));
            v
        }
        "mistral" | "mistral_swa" => {
            let hd = if fixture == "mistral" { Null::Other } else { Null::Same };
            let mut v = base_keys(Null::Reject, Some(hd), false);
            // Null disables the window: the same output on a short prompt.
            v.push(count("sliding_window", 1, 1 << 24, Null::Same, false));
            v
        }
        "qwen3_next_a" | "qwen3_next_b" => {
            let mut v = base_keys(Null::Reject, Some(Null::Reject), fixture == "qwen3_next_a");
            v.extend(moe_keys(if fixture == "qwen3_next_a" { 8 } else { 4 }));
            v.push(Key { name: "attention_bias", kind: Kind::Bool, null: Null::Reject, fixed: true });
            v.push(count("shared_expert_intermediate_size", 1, 1 << 20, Null::Reject, true));
            v.push(count("linear_conv_kernel_dim", 1, 64, Null::Reject, true));
            v.push(count("linear_key_head_dim", 1, L, Null::Reject, true));
            v.push(count("linear_value_head_dim", 1, L, Null::Reject, true));
            v.push(count("linear_num_key_heads", 1, L, Null::Reject, true));
            v.push(count("linear_num_value_heads", 1, L, Null::Reject, true));
            if fixture == "qwen3_next_a" {
                v.push(count("full_attention_interval", 1, U32, Null::Reject, true));
            }
            v
        }
        _ => vec![],
    }
}

/// The values tried on a key, with their oracles.
fn values(key: &Key, orig: &Value) -> Vec<(Value, Oracle)> {
    let bad = || Oracle::names(key.name);
    let changed = |same: bool| {
        if same || !key.fixed {
            Oracle::Legal
        } else {
            Oracle::key_or_map(key.name)
        }
    };
    let null = match key.null {
        Null::Reject => bad(),
        Null::Same => Oracle::Legal,
        Null::Other => Oracle::key_or_map(key.name),
    };
    let mut v: Vec<(Value, Oracle)> =
        vec![(json!("abc"), bad()), (json!(null), null), (json!([]), bad()), (json!({"a": 1}), bad())];
    match key.kind {
        Kind::Count { lo, hi, even } => {
            let o = orig.as_i64().map(i128::from);
            let ints: Vec<i128> = vec![
                -1,
                0,
                1,
                3,
                1 << 63,
                1_000_000_000,
                1_000_000,
                hi,
                hi + 1,
                lo - 1,
                o.map_or(5, |o| o + 1),
                o.map_or(64, |o| o * 2),
            ];
            for n in ints {
                let oracle = if n < lo || n > hi || (even && n % 2 != 0) { bad() } else { changed(Some(n) == o) };
                let val = if n < 0 { json!(n as i64) } else { json!(n as u64) };
                v.push((val, oracle));
            }
            // 2^64 only parses as a float; floats and bools are wrong types.
            v.push((json!(18446744073709551616.0f64), bad()));
            v.push((json!(1.5), bad()));
            v.push((json!(true), bad()));
            v.push((json!("64"), bad()));
        }
        Kind::Float(ok) => {
            for x in [-1.0, 0.0, -1e-6, 1e-5, 0.5, 1e-50, 1e39, 1e300] {
                v.push((json!(x), if ok(x) { Oracle::Legal } else { bad() }));
            }
            v.push((json!("1e-5"), bad()));
            v.push((json!("NaN"), bad()));
            v.push((json!("Infinity"), bad()));
            v.push((json!(false), bad()));
        }
        Kind::Bool => {
            let b = orig.as_bool().unwrap_or(false);
            // A flipped tie_word_embeddings is not a config question: whether an lm_head in
            // the checkpoint is ignored or an error is up to the model's weight map.
            if key.name != "tie_word_embeddings" {
                v.push((json!(!b), changed(false)));
            }
            v.push((json!(b), Oracle::Legal));
            v.push((json!(1), bad()));
            v.push((json!("true"), bad()));
        }
    }
    v
}

fn config_case(fixture: &'static str, label: String, cfg: Value, oracle: Oracle) -> Case {
    let text = serde_json::to_string_pretty(&cfg).expect("json");
    raw_case(fixture, label, text, oracle)
}

fn raw_case(fixture: &'static str, label: String, text: String, oracle: Oracle) -> Case {
    let setup = move |dir: &std::path::Path| {
        clone_fixture(fixture, dir);
        std::fs::write(dir.join("config.json"), &text).expect("write config");
    };
    Case::new(label, Some(Box::new(setup)), &gen_args(), oracle)
}

fn with(fixture: &str, f: impl FnOnce(&mut Value)) -> Value {
    let mut c = fixture_config(fixture);
    f(&mut c);
    c
}

const FIXTURES: [&str; 8] =
    ["qwen3", "qwen3_tied", "qwen3_moe", "qwen3_moe_sparse2", "mistral", "mistral_swa", "qwen3_next_a", "qwen3_next_b"];

pub fn cases(rng: &mut Rng) -> Vec<Case> {
    let mut out = Vec::new();
    for fx in FIXTURES {
        let base = fixture_config(fx);
        for key in keys_of(fx) {
            let orig = base.get(key.name).cloned().unwrap_or(Value::Null);
            for (i, (val, oracle)) in values(&key, &orig).into_iter().enumerate() {
                // A string and null always, the huge counts always; the rest sampled (1 in 5).
                let always = i < 2 || val.as_u64().is_some_and(|n| n >= 1_000_000_000);
                if !always && !rng.chance(1, 5) {
                    continue;
                }
                let cfg = with(fx, |c| c[key.name] = val.clone());
                out.push(config_case(fx, format!("{fx}: {} = {val}", key.name), cfg, oracle));
            }
            // The key deleted: porter requires the four geometry keys; the others take
            // transformers' default, which for these keys describes the fixture too.
            if base.get(key.name).is_some() && rng.chance(1, 3) {
                let oracle = match key.name {
                    "vocab_size" | "hidden_size" | "num_hidden_layers" | "num_attention_heads" => {
                        Some(Oracle::key_or_map(key.name))
                    }
                    "max_position_embeddings"
                    | "rms_norm_eps"
                    | "norm_topk_prob"
                    | "use_sliding_window"
                    | "max_window_layers"
                    | "sliding_window" => Some(Oracle::Legal),
                    _ => None,
                };
                if let Some(o) = oracle {
                    let cfg = with(fx, |c| {
                        c.as_object_mut().map(|o| o.remove(key.name));
                    });
                    out.push(config_case(fx, format!("{fx}: {} deleted", key.name), cfg, o));
                }
            }
        }
    }
    out.extend(rope_cases());
    out.extend(list_cases());
    out.extend(misc_cases());
    out.extend(llama_cases());
    out.extend(fp8_cases());
    out
}

/// `quantization_config` of the FP8 fixture (`tests/fixtures/qwen3_fp8`): only Qwen's block-128
/// e4m3 scheme loads; every other value is an error naming the key.
fn fp8_cases() -> Vec<Case> {
    let fx = "qwen3_fp8";
    let mut out = Vec::new();
    for (k, v, ok) in [
        ("quant_method", json!("FP8"), true),
        ("quant_method", json!("awq"), false),
        ("quant_method", json!(null), false),
        ("quant_method", json!(8), false),
        ("fmt", json!("e5m2"), false),
        ("fmt", json!(["e4m3"]), false),
        ("activation_scheme", json!("static"), false),
        ("weight_block_size", json!([64, 64]), false),
        ("weight_block_size", json!([128]), false),
        ("weight_block_size", json!([128, 128, 1]), false),
        ("weight_block_size", json!("128"), false),
        ("weight_block_size", json!(null), false),
        ("weight_block_size", json!([128.5, 128]), false),
        ("modules_to_not_convert", json!("lm_head"), false),
        ("modules_to_not_convert", json!([1]), false),
        ("modules_to_not_convert", json!([]), true),
        ("modules_to_not_convert", json!(null), true),
    ] {
        let cfg = with(fx, |c| c["quantization_config"][k] = v.clone());
        let o = if ok { Oracle::Legal } else { Oracle::names(&format!("quantization_config.{k}")) };
        out.push(config_case(fx, format!("{fx}: quantization_config.{k} = {v}"), cfg, o));
    }
    for v in [json!(3), json!([]), json!("fp8"), json!(null)] {
        let cfg = with(fx, |c| c["quantization_config"] = v.clone());
        out.push(config_case(
            fx,
            format!("{fx}: quantization_config = {v}"),
            cfg,
            Oracle::names("quantization_config"),
        ));
    }
    // A dense checkpoint that declares FP8.
    let cfg = with("qwen3", |c| c["quantization_config"] = fixture_config(fx)["quantization_config"].clone());
    out.push(config_case("qwen3", "qwen3: an fp8 quantization_config".into(), cfg, Oracle::names("F8_E4M3")));
    out
}

/// `LlamaForCausalLM` configs, resolved against the weight map by `porter load
/// --print-tensors` (no fixture checkpoint: every consistent geometry is legal).
fn llama_cases() -> Vec<Case> {
    let base = json!({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rope_theta": 5e5, "tie_word_embeddings": true,
    });
    let case = |label: String, cfg: Value, oracle: Oracle| {
        let text = cfg.to_string();
        let setup = move |dir: &std::path::Path| std::fs::write(dir.join("config.json"), &text).expect("write config");
        Case::new(label, Some(Box::new(setup)), &["load", "--print-tensors", "{dir}/config.json"], oracle)
    };
    let set = |k: &str, v: &Value| {
        let mut c = base.clone();
        c[k] = v.clone();
        c
    };
    let mut out = vec![case("llama: base".into(), base.clone(), Oracle::Legal)];
    let counts = [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "pretraining_tp",
    ];
    // `int | None` keys: null is their default.
    let nullable = ["num_key_value_heads", "head_dim", "pretraining_tp"];
    for k in counts.iter().chain(&["intermediate_size"]) {
        for v in [json!("abc"), json!(1.5), json!(true), json!([1]), json!(-1), json!(1u64 << 63), json!(1_000_000_000)]
        {
            out.push(case(format!("llama: {k} = {v}"), set(k, &v), Oracle::names(k)));
        }
        let null = if nullable.contains(k) { Oracle::Legal } else { Oracle::names(k) };
        out.push(case(format!("llama: {k} = null"), set(k, &json!(null)), null));
    }
    for k in ["rms_norm_eps", "rope_theta"] {
        for v in [json!("abc"), json!(null), json!(0), json!(-1), json!(1e39)] {
            out.push(case(format!("llama: {k} = {v}"), set(k, &v), Oracle::names(k)));
        }
    }
    for k in ["mlp_bias", "attention_bias", "tie_word_embeddings"] {
        for v in [json!("abc"), json!(null), json!(1)] {
            out.push(case(format!("llama: {k} = {v}"), set(k, &v), Oracle::names(k)));
        }
        out.push(case(format!("llama: {k} = true"), set(k, &json!(true)), Oracle::Legal));
        out.push(case(format!("llama: {k} = false"), set(k, &json!(false)), Oracle::Legal));
    }
    for (k, v, o) in [
        ("num_key_value_heads", json!(3), Oracle::names("num_key_value_heads")),
        ("num_key_value_heads", json!(4), Oracle::Legal),
        ("hidden_size", json!(30), Oracle::names("hidden_size")),
        ("num_attention_heads", json!(3), Oracle::names("num_attention_heads")),
        ("head_dim", json!(7), Oracle::names("head_dim")),
        ("head_dim", json!(64), Oracle::Legal),
        ("intermediate_size", json!(0), Oracle::Legal),
        ("pretraining_tp", json!(2), Oracle::Legal),
        ("hidden_act", json!("gelu"), Oracle::Legal),
        ("hidden_act", json!("prelu"), Oracle::names("hidden_act")),
        ("max_position_embeddings", json!(0), Oracle::names("max_position_embeddings")),
    ] {
        out.push(case(format!("llama: {k} = {v}"), set(k, &v), o));
    }
    let llama3 = |extra: Value| {
        let mut r = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 1024});
        for (k, v) in extra.as_object().into_iter().flatten() {
            r[k] = v.clone();
        }
        set("rope_scaling", &r)
    };
    for (extra, o) in [
        (json!({}), Oracle::Legal),
        // Equal to max_position_embeddings: transformers warns and computes.
        (json!({"original_max_position_embeddings": 2048}), Oracle::Legal),
        (json!({"original_max_position_embeddings": "x"}), Oracle::names("original_max_position_embeddings")),
        (json!({"factor": 0.5}), Oracle::Legal),
        (json!({"factor": 0}), Oracle::names("factor")),
        (json!({"factor": null}), Oracle::names("factor")),
        (json!({"low_freq_factor": 0}), Oracle::names("low_freq_factor")),
        (json!({"high_freq_factor": 1.0}), Oracle::Legal),
        // transformers only warns about the llama3 keys dynamic does not use.
        (json!({"rope_type": "dynamic"}), Oracle::Legal),
    ] {
        out.push(case(format!("llama: llama3 rope {extra}"), llama3(extra), o));
    }
    out
}

/// RoPE: theta, partial factor, scaling blocks in both styles.
fn rope_cases() -> Vec<Case> {
    let mut out = Vec::new();
    let theta = |fx: &'static str, v: Value, o: Oracle| {
        config_case(fx, format!("{fx}: rope_theta = {v}"), with(fx, |c| c["rope_theta"] = v.clone()), o)
    };
    for fx in ["qwen3", "mistral", "qwen3_next_a"] {
        for v in [json!("abc"), json!(null), json!(0), json!(-1e4), json!("1e6"), json!(1e39), json!([1e6])] {
            out.push(theta(fx, v, Oracle::names("rope_theta")));
        }
        out.push(theta(fx, json!(5e5), Oracle::Legal));
    }
    // rope_theta inside rope_parameters (qwen3_tied, qwen3_next_b use that style).
    for fx in ["qwen3_tied", "qwen3_next_b"] {
        for v in [json!("abc"), json!(null), json!(0), json!(-1), json!(f64::MAX)] {
            let cfg = with(fx, |c| c["rope_parameters"]["rope_theta"] = v.clone());
            out.push(config_case(
                fx,
                format!("{fx}: rope_parameters.rope_theta = {v}"),
                cfg,
                Oracle::names("rope_theta"),
            ));
        }
        let cfg = with(fx, |c| c["rope_parameters"]["rope_type"] = json!("linear"));
        out.push(config_case(fx, format!("{fx}: linear without factor"), cfg, Oracle::names("factor")));
    }
    // partial_rotary_factor: honoured by Qwen3-Next; must be in (0, 1] everywhere.
    for (fx, v, ok) in [
        ("qwen3_next_a", json!(0.5), true),
        ("qwen3_next_a", json!(1), true),
        ("qwen3_next_a", json!(0), false),
        ("qwen3_next_a", json!(-0.25), false),
        ("qwen3_next_a", json!(1.5), false),
        ("qwen3_next_a", json!("abc"), false),
        ("qwen3_next_a", json!(null), false),
        ("qwen3_next_a", json!(1e-9), false),
        ("qwen3", json!(2.0), false),
        ("qwen3", json!("half"), false),
    ] {
        let cfg = with(fx, |c| c["partial_rotary_factor"] = v.clone());
        let o = if ok { Oracle::Legal } else { Oracle::names("partial_rotary_factor") };
        out.push(config_case(fx, format!("{fx}: partial_rotary_factor = {v}"), cfg, o));
    }
    let scalings: Vec<(Value, Option<&str>)> = vec![
        (json!({"rope_type": "linear", "factor": 2.0}), None),
        (json!({"type": "linear", "factor": 4}), None),
        (json!({"rope_type": "linear", "factor": 0}), Some("factor")),
        (json!({"rope_type": "linear", "factor": -1}), Some("factor")),
        // transformers only warns about a factor below 1 and computes with it.
        (json!({"rope_type": "linear", "factor": 0.5}), None),
        (json!({"rope_type": "linear", "factor": "2"}), Some("factor")),
        (json!({"rope_type": "linear", "factor": null}), Some("factor")),
        (json!({"rope_type": "linear"}), Some("factor")),
        (json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}), None),
        (json!({"rope_type": "yarn", "factor": 2.0, "beta_fast": 16, "beta_slow": 2, "truncate": false}), None),
        (json!({"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 1024}), None),
        (json!({"rope_type": "yarn", "original_max_position_embeddings": 1024}), Some("factor")),
        (
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}),
            Some("original_max_position_embeddings"),
        ),
        (
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": "x"}),
            Some("original_max_position_embeddings"),
        ),
        (json!({"rope_type": "yarn", "factor": 4.0, "attention_factor": -1}), Some("attention_factor")),
        (json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": "fast"}), Some("beta_fast")),
        (json!({"rope_type": "yarn", "factor": 4.0, "truncate": "yes"}), Some("truncate")),
        (
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}),
            None,
        ),
        (
            // high <= low: a warning in transformers, then no medium band.
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 1024}),
            None,
        ),
        (
            json!({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}),
            Some("low_freq_factor"),
        ),
        (
            json!({"rope_type": "llama3", "factor": 0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}),
            Some("factor"),
        ),
        (json!({"rope_type": "dynamic", "factor": 2.0}), None),
        (json!({"rope_type": "dynamic"}), Some("factor")),
        (json!({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}), Some("longrope")),
        (json!({"rope_type": "su", "factor": 2.0}), Some("su")),
        (json!({"rope_type": "Linear", "factor": 2.0}), Some("Linear")),
        (json!({"rope_type": null, "factor": 2.0}), Some("rope_type")),
        (json!({"rope_type": 3}), Some("rope_type")),
        (json!({"factor": 2.0}), None),
        (json!({}), None),
        (json!("linear"), Some("rope_scaling")),
        (json!([1, 2]), Some("rope_scaling")),
        (json!(2.0), Some("rope_scaling")),
        (json!({"full_attention": {"rope_type": "default", "rope_theta": 1e6}}), Some("full_attention")),
    ];
    for fx in ["qwen3", "mistral_swa", "qwen3_moe"] {
        for (s, bad) in &scalings {
            let o = bad.map_or(Oracle::Legal, Oracle::names);
            let cfg = with(fx, |c| c["rope_scaling"] = s.clone());
            out.push(config_case(fx, format!("{fx}: rope_scaling = {s}"), cfg, o));
        }
    }
    // The v5 style: the same blocks as rope_parameters (theta inside).
    for (s, bad) in scalings.iter().step_by(3) {
        let mut s = s.clone();
        if let Some(o) = s.as_object_mut() {
            o.insert("rope_theta".into(), json!(1e6));
        }
        let o = bad.map_or(Oracle::Legal, |b| Oracle::names(b).or("rope_parameters"));
        let cfg = with("qwen3_tied", |c| c["rope_parameters"] = s.clone());
        out.push(config_case("qwen3_tied", format!("qwen3_tied: rope_parameters = {s}"), cfg, o));
    }
    out
}

/// `mlp_only_layers` and `layer_types`.
fn list_cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mlp = |fx: &'static str, v: Value, o: Oracle| {
        config_case(fx, format!("{fx}: mlp_only_layers = {v}"), with(fx, |c| c["mlp_only_layers"] = v.clone()), o)
    };
    let bad = || Oracle::names("mlp_only_layers");
    for fx in ["qwen3_moe", "qwen3_moe_sparse2", "qwen3_next_a", "qwen3_next_b"] {
        let cfg = fixture_config(fx);
        let layers = cfg["num_hidden_layers"].as_u64().unwrap_or(0);
        // transformers checks `layer_idx not in mlp_only_layers`: an entry past the last layer
        // is ignored, so the MoE layers are those of an empty list — legal when they are the
        // checkpoint's, else the weight map does not match.
        let step = cfg["decoder_sparse_step"].as_u64().unwrap_or(1).max(1);
        let listed: Vec<u64> =
            cfg["mlp_only_layers"].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
        let same = (0..layers).all(|i| !listed.contains(&i) || !(i + 1).is_multiple_of(step));
        for v in [json!([99]), json!([layers])] {
            out.push(mlp(fx, v, if same { Oracle::Legal } else { Oracle::key_or_map("mlp_only_layers") }));
        }
        for v in [json!([-1]), json!(["a"]), json!("abc"), json!(5), json!([1u64 << 63])] {
            out.push(mlp(fx, v, bad()));
        }
        out.push(mlp(fx, json!([[1]]), bad()));
    }
    // Same MoE layers as the fixture: legal.
    out.push(mlp("qwen3_moe", json!([1, 1]), Oracle::Legal));
    out.push(mlp("qwen3_moe_sparse2", json!(null), Oracle::Legal));
    out.push(mlp("qwen3_moe_sparse2", json!([0, 2]), Oracle::Legal)); // dense anyway (step 2)
    out.push(mlp("qwen3_next_a", json!(null), Oracle::Legal));
    // Other MoE layers than the checkpoint's.
    out.push(mlp("qwen3_moe", json!(null), Oracle::key_or_map("mlp_only_layers")));
    out.push(mlp("qwen3_moe", json!([0]), Oracle::key_or_map("mlp_only_layers")));

    let lt = |fx: &'static str, v: Value, o: Oracle| {
        config_case(fx, format!("{fx}: layer_types = {v}"), with(fx, |c| c["layer_types"] = v.clone()), o)
    };
    let bad = || Oracle::names("layer_types");
    let (lin, full) = ("linear_attention", "full_attention");
    for v in [
        json!([lin, full, lin]),
        json!([lin, full, lin, lin, lin]),
        json!([lin, full, "foo", lin]),
        json!([lin, "sliding_attention", lin, lin]),
        json!([lin, full, lin, 1]),
        json!("abc"),
        json!(4),
        json!([]),
    ] {
        out.push(lt("qwen3_next_b", v, bad()));
    }
    // transformers maps the legacy names.
    out.push(lt("qwen3_next_b", json!(["mamba", "attention", "mamba", "mamba"]), Oracle::Legal));
    out.push(lt("qwen3_next_b", json!(null), Oracle::key_or_map("layer_types")));
    out.push(lt("qwen3_next_a", json!([lin, full, lin, full]), Oracle::Legal));
    out.push(lt("qwen3_next_a", json!([full, full, lin, full]), Oracle::key_or_map("layer_types")));
    for v in [json!([full]), json!([full, lin]), json!([full, "foo"]), json!(["full", "full"]), json!({"0": full})] {
        out.push(lt("qwen3_tied", v, bad()));
    }
    out.push(lt("qwen3_tied", json!(null), Oracle::Legal));
    out.push(lt("qwen3_tied", json!([full, full]), Oracle::Legal));
    // full_attention_interval is not read when layer_types is given (transformers ignores it).
    for v in [json!(0), json!("abc"), json!(null), json!(3)] {
        let cfg = with("qwen3_next_b", |c| c["full_attention_interval"] = v.clone());
        out.push(config_case(
            "qwen3_next_b",
            format!("qwen3_next_b: full_attention_interval = {v}"),
            cfg,
            Oracle::Legal,
        ));
    }
    out
}

/// Everything else: hidden_act, token ids, whole-file damage, unknown keys.
fn misc_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for fx in ["qwen3", "mistral", "qwen3_next_a"] {
        for (v, ok) in [
            (json!("silu"), true),
            (json!("swish"), true),
            (json!("gelu"), true),
            (json!("relu2"), true),
            (json!("gelu_pytorch_tanh"), true),
            (json!("prelu"), false),
            (json!("xielu"), false),
            (json!("foo"), false),
            (json!("SiLU"), false),
            (json!(""), false),
            (json!(null), false),
            (json!(1), false),
            (json!(["silu"]), false),
        ] {
            let cfg = with(fx, |c| c["hidden_act"] = v.clone());
            let o = if ok { Oracle::Legal } else { Oracle::names("hidden_act") };
            out.push(config_case(fx, format!("{fx}: hidden_act = {v}"), cfg, o));
        }
        for (k, v, ok) in [
            ("eos_token_id", json!("abc"), false),
            ("eos_token_id", json!([0, "x"]), false),
            ("eos_token_id", json!(1.5), false),
            ("eos_token_id", json!(null), true),
            ("eos_token_id", json!([0, 7]), true),
            ("bos_token_id", json!({"a": 1}), false),
            ("bos_token_id", json!(null), true),
            ("architectures", json!("Qwen3ForCausalLM"), false),
            ("architectures", json!([]), false),
            ("architectures", json!(null), false),
            ("architectures", json!(["GPT2LMHeadModel"]), false),
            ("some_unknown_key", json!({"x": [1, 2, 3]}), true),
            ("attention_dropout", json!(0.1), true),
        ] {
            let cfg = with(fx, |c| c[k] = v.clone());
            let o = if ok { Oracle::Legal } else { Oracle::names(k) };
            out.push(config_case(fx, format!("{fx}: {k} = {v}"), cfg, o));
        }
    }
    for (text, needle) in [
        ("", "config.json"),
        ("[1, 2]", "config.json"),
        ("null", "config.json"),
        ("{\"architectures\": [\"Qwen3ForCausalLM\"], ", "config.json"),
        ("{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 1e400}", "config.json"),
        ("\u{feff}{}", "config.json"),
    ] {
        out.push(raw_case("qwen3", format!("qwen3: config.json = {text:?}"), text.to_owned(), Oracle::names(needle)));
    }
    // generation_config.json: the ids it sets are typed like config.json's.
    for (text, o) in [
        ("{\"eos_token_id\": \"abc\"}", Oracle::names_all(&["eos_token_id", "generation_config.json"])),
        ("{\"eos_token_id\": [0, null]}", Oracle::names("eos_token_id")),
        ("{\"bos_token_id\": [1, 2]}", Oracle::names("bos_token_id")),
        ("{\"eos_token_id\": ", Oracle::names("generation_config.json")),
        ("{\"eos_token_id\": [0, 7], \"top_k\": 0}", Oracle::Legal),
        ("{}", Oracle::Legal),
    ] {
        let setup = move |dir: &std::path::Path| {
            clone_fixture("qwen3", dir);
            let _ = std::fs::remove_file(dir.join("generation_config.json"));
            std::fs::write(dir.join("generation_config.json"), text).expect("write generation config");
        };
        out.push(Case::new(format!("qwen3: generation_config.json = {text}"), Some(Box::new(setup)), &gen_args(), o));
    }
    // Known blow-ups on main: each count alone.
    for (fx, k, n) in [
        ("qwen3", "num_hidden_layers", 1u64 << 63),
        ("qwen3", "num_hidden_layers", 1_000_000_000),
        ("qwen3", "num_hidden_layers", 1_000_000),
        ("qwen3_moe", "num_experts", 1_000_000_000),
        ("qwen3_next_a", "num_experts", 1_000_000_000),
        ("qwen3_next_a", "linear_num_value_heads", 1 << 40),
        ("qwen3_next_a", "linear_conv_kernel_dim", 1_000_000_000),
        ("mistral", "head_dim", 1 << 40),
    ] {
        let cfg = with(fx, |c| c[k] = json!(n));
        out.push(config_case(fx, format!("{fx}: {k} = {n}"), cfg, Oracle::names(k)));
    }
    // More layers than the checkpoint holds, within bounds: the missing-tensor list is capped.
    let cfg = with("qwen3", |c| c["num_hidden_layers"] = json!(4000));
    out.push(config_case("qwen3", "qwen3: 4000 layers".into(), cfg, Oracle::names_all(&["missing tensors", "more"])));
    out
}
