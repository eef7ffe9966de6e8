//! Config variants of the parity fixtures against transformers (`tests/gen_config_variants.py`,
//! `tests/fixtures/config_variants/`): each is a fixture's own weights with config keys edited
//! to legal values that change the computation but no tensor shape — RoPE widths and scaling
//! rules, `layer_types` on a Mistral config (read as Ministral's), the `num_local_experts`
//! alias. f32 logits within 1e-3·std of transformers' float32 CPU logits, prefill and token by
//! token. `variants.json` records how far each edit moves transformers' logits from the
//! unedited fixture's, i.e. what a porter that ignored the edit would miss by.

use porter_core::checkpoint::Checkpoint;
use porter_core::{registry, DType, Device};
use serde_json::Value;
use tests::fixture;

const F32_TOL: f32 = 1e-3;

/// `edit` applied to a config: `delete_marker` removes a key; `num_experts_marker` /
/// `head_dim_marker` stand for values of the unedited config.
fn apply(c: &mut Value, edit: &serde_json::Map<String, Value>, markers: &Value) {
    let orig = c.clone();
    for (k, v) in edit {
        match v.as_str() {
            Some(m) if Some(m) == markers["delete_marker"].as_str() => {
                c.as_object_mut().expect("config object").remove(k);
            }
            Some(m) if Some(m) == markers["num_experts_marker"].as_str() => c[k] = orig["num_experts"].clone(),
            Some(m) if Some(m) == markers["head_dim_marker"].as_str() => {
                let (h, n) = (orig["hidden_size"].as_u64(), orig["num_attention_heads"].as_u64());
                c[k] = (h.expect("hidden_size") / n.expect("num_attention_heads")).into()
            }
            _ => c[k] = v.clone(),
        }
    }
}

#[test]
fn config_variants_match_transformers() {
    let dir = fixture("config_variants");
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("variants.json")).unwrap()).unwrap();
    let variants = meta["variants"].as_array().unwrap();
    assert!(variants.len() >= 9, "{} variants", variants.len());
    for v in variants {
        let name = v["name"].as_str().unwrap();
        let fx = v["fixture"].as_str().unwrap();
        let dir_v = tests::variant(fx, name, |c| apply(c, v["edit"].as_object().unwrap(), &meta));
        let reference = Checkpoint::open_files(&[dir.join(format!("{name}.safetensors"))]).unwrap();
        let ids: Vec<u32> = reference.read_i64("ids").unwrap().into_iter().map(|i| i as u32).collect();
        let want = reference.read_f32("logits").unwrap();
        let m = registry::load(&dir_v, DType::F32, Device::Cpu, false);
        let _ = std::fs::remove_dir_all(&dir_v);
        let m = m.unwrap_or_else(|e| panic!("{name}: {e}"));
        let moved = v["max_abs_diff_from_unedited_over_std"].as_f64().unwrap();
        let got = tests::prefill_logits(&m, &ids).unwrap();
        tests::assert_close(
            &format!("{name} prefill (the edit moves transformers by {moved:.3}·std)"),
            &got,
            &want,
            F32_TOL,
        );
        let inc = tests::incremental_logits(&m, &ids).unwrap();
        tests::assert_close(&format!("{name} token by token"), &inc, &want, F32_TOL);
    }
}
