//! Bad input gives a clear error naming the problem, never a panic.

use porter_core::{registry, Batch, DType, Device, LogitsFor, StateCache};
use std::path::{Path, PathBuf};
use tests::fixture;

/// Copies a fixture into a fresh temporary folder.
fn scratch(name: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("porter-bad-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

fn load_err(dir: &Path) -> String {
    match registry::load(dir, DType::F32, Device::Cpu, false) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn malformed_config() {
    let d = scratch("qwen3", "malformed");
    std::fs::write(d.join("config.json"), "{ \"architectures\": [\"Qwen3ForCausalLM\", ").unwrap();
    let e = load_err(&d);
    assert!(e.contains("config.json is not valid JSON"), "{e}");
}

#[test]
fn config_with_wrong_value_type() {
    let d = scratch("qwen3", "wrongtype");
    edit_config(&d, |v| v["hidden_size"] = serde_json::json!("sixty-four"));
    let e = load_err(&d);
    assert!(e.contains("hidden_size") || e.contains("invalid type"), "{e}");
}

#[test]
fn missing_architecture() {
    let d = scratch("qwen3", "noarch");
    edit_config(&d, |v| {
        v.as_object_mut().unwrap().remove("architectures");
    });
    let e = load_err(&d);
    assert!(e.contains("no `architectures`"), "{e}");
}

#[test]
fn unknown_architecture() {
    let d = scratch("qwen3", "unknownarch");
    edit_config(&d, |v| v["architectures"] = serde_json::json!(["GPT2LMHeadModel"]));
    let e = load_err(&d);
    assert!(e.contains("unknown architecture `GPT2LMHeadModel`") && e.contains("Qwen3ForCausalLM"), "{e}");
}

#[test]
fn truncated_safetensors() {
    let d = scratch("qwen3", "truncated");
    let p = d.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(&d);
    assert!(e.contains("truncated or corrupt"), "{e}");
}

#[test]
fn corrupt_safetensors_header() {
    let d = scratch("qwen3", "corrupt");
    std::fs::write(d.join("model.safetensors"), b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}").unwrap();
    let e = load_err(&d);
    assert!(e.contains("not a valid safetensors file"), "{e}");
}

#[test]
fn missing_tensors_are_listed() {
    // One more layer in the config than in the checkpoint: layer 3's tensors are missing.
    let d = scratch("qwen3", "missing");
    edit_config(&d, |v| v["num_hidden_layers"] = serde_json::json!(4));
    let e = load_err(&d);
    assert!(e.contains("missing tensors") && e.contains("model.layers.3.self_attn.q_proj.weight"), "{e}");
}

#[test]
fn unexpected_tensors_are_listed() {
    let d = scratch("qwen3", "unexpected");
    edit_config(&d, |v| v["num_hidden_layers"] = serde_json::json!(2));
    let e = load_err(&d);
    assert!(e.contains("unexpected tensors") && e.contains("model.layers.2.mlp.up_proj.weight"), "{e}");
}

#[test]
fn shape_mismatch_names_expected_and_found() {
    let d = scratch("qwen3", "shape");
    edit_config(&d, |v| v["intermediate_size"] = serde_json::json!(100));
    let e = load_err(&d);
    assert!(e.contains("shape mismatches") && e.contains("expected [100, 64], found [128, 64]"), "{e}");
}

#[test]
fn token_id_out_of_vocab() {
    let m = registry::load(&fixture("qwen3"), DType::F32, Device::Cpu, false).unwrap();
    let mut cache = m.new_cache(1).unwrap();
    let seq = cache.alloc_seq().unwrap();
    let err = m.forward(&Batch::single(seq, 0, &[3, 512]), &mut cache, LogitsFor::All).expect_err("must fail");
    assert!(err.to_string().contains("token id 512 is out of range"), "{err}");
    // Nothing was consumed: the sequence is still empty and usable.
    assert_eq!(cache.seq_len(seq), 0);
    assert!(m.forward(&Batch::single(seq, 0, &[3, 4]), &mut cache, LogitsFor::All).is_ok());
}

#[test]
fn missing_model_folder() {
    let e = load_err(Path::new("/nonexistent/porter-model"));
    assert!(e.contains("does not exist"), "{e}");
}

#[test]
fn bad_moe_config_value() {
    let d = scratch("qwen3_moe", "topk");
    edit_config(&d, |v| v["num_experts_per_tok"] = serde_json::json!(99));
    let e = load_err(&d);
    assert!(e.contains("num_experts_per_tok"), "{e}");
}

#[test]
fn unallocated_or_repeated_sequences_are_rejected() {
    let m = registry::load(&fixture("qwen3_next_a"), DType::F32, Device::Cpu, false).unwrap();
    let mut cache = m.new_cache(2).unwrap();
    let e =
        m.forward(&Batch::single(porter_core::SeqId(1), 0, &[3]), &mut cache, LogitsFor::All).expect_err("must fail");
    assert!(e.to_string().contains("not allocated"), "{e}");
    let a = cache.alloc_seq().unwrap();
    let mut b = Batch::default();
    b.push(a, 0, &[3]);
    b.push(a, 1, &[4]);
    let e = m.forward(&b, &mut cache, LogitsFor::All).expect_err("must fail");
    assert!(e.to_string().contains("appears twice"), "{e}");
    assert_eq!(cache.seq_len(a), 0);
}

/// `--dtype f16` on a bf16 checkpoint whose weights overflow f16 (±65504) is a clear error
/// naming the tensor, not a model full of infinities; bf16 and f32 load it.
#[test]
fn f16_overflow_at_load_is_a_clear_error() {
    let dir = scratch("qwen3", "f16-overflow");
    let p = dir.join("model.safetensors");
    let ck = porter_core::checkpoint::Checkpoint::open_files(std::slice::from_ref(&p)).unwrap();
    let target = "model.layers.0.mlp.down_proj.weight";
    let mut kept = Vec::new();
    for (name, info) in ck.tensors() {
        let mut bytes = vec![0u8; info.end - info.start];
        ck.read_bytes(name, &mut bytes).unwrap();
        assert_eq!(format!("{:?}", info.dtype), "BF16", "{name}");
        if name == target {
            // Element 3 becomes 1.0e5 in bf16 (0x47C3 ≈ 99840), beyond f16's 65504.
            bytes[6..8].copy_from_slice(&0x47C3u16.to_le_bytes());
        }
        kept.push((name.clone(), info.shape.clone(), bytes));
    }
    drop(ck);
    let file = tests::safetensors_bytes(kept.iter().map(|(n, s, b)| (n.as_str(), "BF16", &s[..], &b[..])));
    std::fs::write(&p, file).unwrap();
    for dt in [DType::BF16, DType::F32] {
        registry::load(&dir, dt, Device::Cpu, false).unwrap_or_else(|e| panic!("{dt}: {e:#}"));
    }
    let e = match registry::load(&dir, DType::F16, Device::Cpu, false) {
        Ok(_) => panic!("an f16 load of weights beyond f16's range should fail"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains(target) && e.contains("f16") && e.contains("9.984e4"), "{e}");
}
