//! Command-line flags of `generate`, `logits`, `bench` and `inspect`, and draft (MTP)
//! folders with malformed configs.

use super::{clone_fixture, fixture, fixture_config, Case, Oracle, Rng};
use serde_json::{json, Value};
use std::path::Path;

fn path(name: &str) -> String {
    fixture(name).to_string_lossy().into_owned()
}

/// `generate` on a fixture with extra flags.
fn generate(fx: &str, extra: &[&str], oracle: Oracle) -> Case {
    let m = path(fx);
    let mut args = vec!["generate", "--model", m.as_str(), "--ids", "3,4", "--device", "cpu", "--json"];
    args.extend_from_slice(extra);
    Case::new(format!("{fx}: generate {}", extra.join(" ")), None, &args, oracle)
}

/// A copy of `fx` whose context is `ctx` positions, run with `args` (`{dir}` = the copy).
fn small_context(fx: &'static str, ctx: u64, args: &[&str], oracle: Oracle) -> Case {
    let setup = move |dir: &Path| {
        clone_fixture(fx, dir);
        let mut c = fixture_config(fx);
        c["max_position_embeddings"] = json!(ctx);
        std::fs::write(dir.join("config.json"), c.to_string()).expect("write config");
    };
    Case::new(format!("{fx} (context {ctx}): {}", args.join(" ")), Some(Box::new(setup)), args, oracle)
}

fn bench(extra: &[&str], oracle: Oracle) -> Case {
    let m = path("qwen3");
    let mut args = vec!["bench", "--model", m.as_str(), "--device", "cpu"];
    // Small defaults, overridden by a later repeat of the same flag.
    for (flag, v) in [("--prefill", "4"), ("--batch", "1"), ("--context", "4"), ("--steps", "2")] {
        if !extra.contains(&flag) {
            args.extend_from_slice(&[flag, v]);
        }
    }
    args.extend_from_slice(extra);
    Case::new(format!("bench {}", extra.join(" ")), None, &args, oracle)
}

/// A draft folder cloned from `draft` with one config key set, loaded for `main`.
fn draft_case(main: &'static str, draft: &'static str, key: &'static str, v: Value, oracle: Oracle) -> Case {
    let label = format!("{main} + {draft}: {key} = {v}");
    let setup = move |dir: &Path| {
        clone_fixture(draft, dir);
        let mut c = fixture_config(draft);
        c[key] = v.clone();
        std::fs::write(dir.join("config.json"), c.to_string()).expect("write config");
    };
    let m = path(main);
    let args = [
        "generate",
        "--model",
        m.as_str(),
        "--draft",
        "{dir}",
        "--mtp-step",
        "1",
        "--ids",
        "3,4",
        "--max-tokens",
        "2",
        "--device",
        "cpu",
        "--json",
    ];
    Case::new(label, Some(Box::new(setup)), &args, oracle)
}

pub fn cases(rng: &mut Rng) -> Vec<Case> {
    let mut out = Vec::new();
    let ok = || Oracle::Legal;
    let n = Oracle::names;
    // --max-tokens
    for (v, o) in [
        ("--max-tokens=0", n("--max-tokens")),
        ("--max-tokens=1", ok()),
        ("--max-tokens=-1", n("--max-tokens")),
        ("--max-tokens=abc", n("--max-tokens")),
        ("--max-tokens=18446744073709551615", Oracle::names_all(&["--max-tokens", "4096"])),
        ("--max-tokens=18446744073709551616", n("--max-tokens")),
        ("--max-tokens=4095", Oracle::names_all(&["--max-tokens", "4095", "4096"])),
        ("--max-tokens=1e3", n("--max-tokens")),
    ] {
        out.push(generate("qwen3", &[v], o));
    }
    // At the context limit: legal up to prompt + max_tokens == context, else a clear error.
    out.push(small_context(
        "qwen3",
        16,
        &[
            "generate",
            "--model",
            "{dir}",
            "--ids",
            "3,4",
            "--max-tokens",
            "14",
            "--ignore-eos",
            "--device",
            "cpu",
            "--json",
        ],
        ok(),
    ));
    out.push(small_context(
        "qwen3",
        16,
        &[
            "generate",
            "--model",
            "{dir}",
            "--ids",
            "3,4",
            "--max-tokens",
            "15",
            "--ignore-eos",
            "--device",
            "cpu",
            "--json",
        ],
        Oracle::names_all(&["--max-tokens", "15", "16"]),
    ));
    out.push(small_context(
        "qwen3_next_mtp",
        16,
        &[
            "generate",
            "--model",
            "{dir}",
            "--ids",
            "3,4",
            "--max-tokens",
            "12",
            "--mtp-step",
            "2",
            "--ignore-eos",
            "--device",
            "cpu",
            "--json",
        ],
        ok(),
    ));
    out.push(small_context(
        "qwen3_next_mtp",
        16,
        &[
            "generate",
            "--model",
            "{dir}",
            "--ids",
            "3,4",
            "--max-tokens",
            "13",
            "--mtp-step",
            "2",
            "--ignore-eos",
            "--device",
            "cpu",
            "--json",
        ],
        Oracle::names_all(&["--mtp-step", "16"]),
    ));
    out.push(small_context(
        "qwen3",
        16,
        &[
            "logits",
            "--model",
            "{dir}",
            "--ids",
            "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17",
            "--out",
            "{dir}/o.safetensors",
            "--device",
            "cpu",
        ],
        Oracle::names_all(&["17", "16"]),
    ));
    // --mtp-step
    for (fx, v, o) in [
        ("qwen3_next_mtp", "--mtp-step=0", n("--mtp-step")),
        ("qwen3_next_mtp", "--mtp-step=16", n("--mtp-step")),
        ("qwen3_next_mtp", "--mtp-step=1", ok()),
        ("qwen3_next_mtp", "--mtp-step=15", ok()),
        ("qwen3_next_mtp", "--mtp-step=99999999999999999999", n("--mtp-step")),
        ("qwen3_next_mtp", "--mtp-step=-1", n("--mtp-step")),
        ("qwen3", "--mtp-step=1", n("--draft")),
        ("qwen3_next_mtp", "--mtp-mode=sideways", n("mtp")),
    ] {
        out.push(generate(fx, &[v], o));
    }
    // Sampling flags.
    for (v, o) in [
        ("--top-k=0", n("--top-k")),
        ("--top-k=1", ok()),
        ("--top-k=600", ok()),
        ("--top-k=-1", n("--top-k")),
        ("--top-k=16777217", n("--top-k")),
        ("--top-p=0", n("--top-p")),
        ("--top-p=1", ok()),
        ("--top-p=0.9", ok()),
        ("--top-p=1.5", n("--top-p")),
        ("--top-p=-0.5", n("--top-p")),
        ("--top-p=NaN", n("--top-p")),
        ("--top-p=inf", n("--top-p")),
        ("--temperature=-1", n("--temperature")),
        ("--temperature=NaN", n("--temperature")),
        ("--temperature=inf", n("--temperature")),
        ("--temperature=1e39", n("--temperature")),
        ("--temperature=1e-45", n("--temperature")),
        ("--temperature=0", ok()),
        ("--temperature=0.7", ok()),
        ("--seed=-1", n("--seed")),
        ("--seed=abc", n("--seed")),
        ("--seed=18446744073709551616", n("--seed")),
        ("--dtype=f64", n("dtype")),
        ("--device=tpu", n("device")),
        ("--device=cuda:99999999999999999999", n("device")),
        ("--frobnicate", n("--frobnicate")),
        ("--tensor-parallel-size=2", ok()),
        ("-t4", ok()),
        ("--tensor-parallel-size=0", n("--tensor-parallel-size")),
        ("--tensor-parallel-size=65", n("--tensor-parallel-size")),
        ("--tensor-parallel-size=two", n("--tensor-parallel-size")),
        ("--tensor-parallel-size=3", Oracle::names_all(&["tensor-parallel size 3", "not a multiple of 2"])),
    ] {
        out.push(generate("qwen3", &[v], o));
    }
    out.push(generate(
        "qwen3",
        &["--temperature=0.7", "--seed=18446744073709551615", "--top-k=5", "--top-p=0.8"],
        ok(),
    ));
    // Prompt ids (given after the default --ids, the last one wins).
    let q = path("qwen3");
    for (ids, o) in [
        ("", n("--ids")),
        (",", n("--ids")),
        ("a", n("--ids")),
        ("-1", n("--ids")),
        ("4294967296", n("--ids")),
        ("3,512", n("token id 512")),
        ("3, 4 ,5", ok()),
    ] {
        let arg = format!("--ids={ids}");
        let args = ["generate", "--model", q.as_str(), arg.as_str(), "--max-tokens", "1", "--device", "cpu", "--json"];
        out.push(Case::new(format!("qwen3: generate {arg}"), None, &args, o));
    }
    let long: Vec<String> = (0..5000).map(|i| (i % 500).to_string()).collect();
    let long = format!("--ids={}", long.join(","));
    out.push(Case::new(
        "qwen3: 5000 prompt ids",
        None,
        &["generate", "--model", q.as_str(), long.as_str(), "--device", "cpu"],
        Oracle::names_all(&["5000", "4096"]),
    ));
    out.push(Case::new(
        "qwen3: empty prompt text",
        None,
        &["generate", "--model", q.as_str(), "--prompt", "", "--device", "cpu"],
        n("prompt"),
    ));
    out.push(Case::new(
        "qwen3: prompt text",
        None,
        &[
            "generate",
            "--model",
            q.as_str(),
            "--prompt",
            "Hello there",
            "--max-tokens",
            "3",
            "--device",
            "cpu",
            "--json",
        ],
        ok(),
    ));
    out.push(Case::new(
        "no model folder",
        None,
        &["generate", "--model", "/nonexistent/porter", "--ids", "3", "--device", "cpu"],
        n("does not exist"),
    ));
    out.push(Case::new(
        "logits to a missing folder",
        None,
        &["logits", "--model", q.as_str(), "--ids", "3", "--out", "/nonexistent/dir/o.safetensors", "--device", "cpu"],
        n("/nonexistent/dir/o.safetensors"),
    ));
    out.push(Case::new(
        "logits 3,512",
        None,
        &[
            "logits",
            "--model",
            q.as_str(),
            "--ids",
            "3,512",
            "--out",
            "/tmp/porter-fuzz-never.safetensors",
            "--device",
            "cpu",
        ],
        n("token id 512"),
    ));
    // bench
    for (extra, o) in [
        (vec![], ok()),
        (vec!["--prefill", "0"], n("--prefill")),
        (vec!["--prefill", "5000"], Oracle::names_all(&["--prefill", "4096"])),
        (vec!["--prefill", "18446744073709551615"], n("--prefill")),
        (vec!["--prefill", "4,0"], n("--prefill")),
        (vec!["--batch", "0"], n("--batch")),
        (vec!["--batch", "1000000000"], n("--batch")),
        (vec!["--batch", "18446744073709551615"], n("--batch")),
        (vec!["--batch", "2,3"], ok()),
        (vec!["--context", "0"], n("--context")),
        (vec!["--context", "1000000000"], n("--context")),
        (vec!["--steps", "0"], n("--steps")),
        (vec!["--steps", "18446744073709551615"], n("--steps")),
        (vec!["--context", "4090", "--steps", "10"], Oracle::names_all(&["--context", "--steps", "4096"])),
        (vec!["--layers", "2"], n("--layers")),
        (vec!["--mtp-step", "0"], n("--mtp-step")),
        (vec!["--mtp-step", "16"], n("--mtp-step")),
        (vec!["--json", "/nonexistent/dir/b.json"], n("/nonexistent/dir/b.json")),
    ] {
        out.push(bench(&extra, o));
    }
    let cfg = fixture("qwen3").join("config.json").to_string_lossy().into_owned();
    for (layers, o) in
        [("0", n("--layers")), ("1000000000", n("--layers")), ("18446744073709551615", n("--layers")), ("2", ok())]
    {
        out.push(bench(&["--config", cfg.as_str(), "--layers", layers], o));
    }
    out.push(bench(&["--config", "/nonexistent.json"], n("--config")));
    // A geometry inside every bound whose random weights cannot fit (8 TiB of embeddings).
    let huge = |dir: &Path| {
        let mut c = fixture_config("qwen3");
        c["hidden_size"] = json!(1 << 17);
        c["vocab_size"] = json!(1 << 24);
        std::fs::write(dir.join("huge.json"), c.to_string()).expect("write config");
    };
    let q3 = path("qwen3");
    let args = ["bench", "--model", q3.as_str(), "--device", "cpu", "--config", "{dir}/huge.json", "--layers", "1"];
    out.push(Case::new("bench --config huge geometry", Some(Box::new(huge)), &args, n("--config")));
    // porter load
    for (layers, o) in
        [("0", n("--layers")), ("1000000000", n("--layers")), ("18446744073709551616", n("--layers")), ("2", ok())]
    {
        let args = ["load", "--print-tensors", cfg.as_str(), "--layers", layers];
        out.push(Case::new(format!("load --print-tensors --layers {layers}"), None, &args, o));
    }
    out.push(Case::new("load", None, &["load", "--model", q.as_str(), "--device", "cpu", "--dtype", "f32"], ok()));
    out.push(Case::new(
        "load --layers",
        None,
        &["load", "--model", q.as_str(), "--device", "cpu", "--layers", "2"],
        n("--layers"),
    ));
    out.push(Case::new("inspect", None, &["inspect", "--model", q.as_str()], ok()));
    out.push(Case::new(
        "inspect bad draft",
        None,
        &["inspect", "--model", q.as_str(), "--draft", "/nonexistent/d"],
        n("does not exist"),
    ));

    // Draft (MTP) folders.
    let bad = Oracle::names;
    let moe = ("qwen3_moe", "qwen3_moe_mtp_draft");
    let mut draft_keys: Vec<(&'static str, &'static str, &'static str, Value, Oracle)> = Vec::new();
    for (main, draft) in [moe, ("mistral", "mistral_mtp_draft"), ("qwen3", "qwen3_dense_mtp_draft")] {
        for v in [json!(-1), json!(0), json!("abc"), json!(null), json!(1e-60), json!([1e-6])] {
            draft_keys.push((main, draft, "rms_norm_eps", v, bad("rms_norm_eps")));
        }
        draft_keys.push((main, draft, "rms_norm_eps", json!(1e-5), Oracle::Legal));
        for v in [json!(65), json!("abc"), json!(null), json!(1u64 << 63)] {
            draft_keys.push((main, draft, "hidden_size", v, bad("hidden_size")));
        }
        draft_keys.push((main, draft, "vocab_size", json!(100), bad("vocab_size")));
        draft_keys.push((main, draft, "intermediate_size", json!("abc"), bad("intermediate_size")));
        draft_keys.push((main, draft, "intermediate_size", json!(1u64 << 63), bad("intermediate_size")));
    }
    draft_keys.push((moe.0, moe.1, "intermediate_size", json!(7), Oracle::Legal)); // unused: the module is MoE
    for (k, v, o) in [
        ("num_experts", json!(1_000_000_000u64), bad("num_experts")),
        ("num_experts", json!("abc"), bad("num_experts")),
        ("num_experts", json!(0), Oracle::key_or_map("num_experts")),
        ("num_experts_per_tok", json!(0), bad("num_experts_per_tok")),
        ("num_experts_per_tok", json!(99), bad("num_experts_per_tok")),
        ("num_experts_per_tok", json!(1), Oracle::Legal),
        ("decoder_sparse_step", json!(0), bad("decoder_sparse_step")),
        ("decoder_sparse_step", json!(null), bad("decoder_sparse_step")),
        ("mlp_only_layers", json!([99999]), bad("mlp_only_layers")),
        ("mlp_only_layers", json!("abc"), bad("mlp_only_layers")),
        ("mlp_only_layers", json!(null), Oracle::Legal),
        ("mlp_only_layers", json!([0]), Oracle::key_or_map("mlp_only_layers")),
        ("moe_intermediate_size", json!(0), bad("moe_intermediate_size")),
        ("moe_intermediate_size", json!(1u64 << 40), bad("moe_intermediate_size")),
        ("norm_topk_prob", json!("abc"), bad("norm_topk_prob")),
        ("norm_topk_prob", json!(false), Oracle::Legal),
    ] {
        draft_keys.push((moe.0, moe.1, k, v, o));
    }
    draft_keys.push((
        "mistral",
        "mistral_mtp_draft",
        "intermediate_size",
        json!(161),
        Oracle::key_or_map("intermediate_size"),
    ));
    for (main, draft, k, v, o) in draft_keys {
        // Each draft case is a full load; keep about two thirds of the wrong-type ones.
        if matches!(o, Oracle::Illegal(_)) && v.is_string() && !rng.chance(2, 3) {
            continue;
        }
        out.push(draft_case(main, draft, k, v, o));
    }
    out
}
