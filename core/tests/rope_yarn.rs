//! YaRN RoPE against transformers 5.24 (`ROPE_INIT_FUNCTIONS["yarn"]` on a Qwen3Config
//! with head_dim 64, max_position_embeddings 16384): cos·attention_factor and
//! sin·attention_factor at positions 0, 1, 1000, 16000, stored in `data/yarn_reference.json`.

use porter_core::config::rope_params;
use porter_core::nn::Rope;
use porter_core::DType;

#[test]
fn yarn_tables_match_transformers() {
    let cases: serde_json::Value =
        serde_json::from_str(include_str!("data/yarn_reference.json")).expect("reference json");
    for case in cases.as_array().expect("list") {
        let mut params = case[0].clone();
        let theta = params["rope_theta"].clone();
        params.as_object_mut().expect("object").remove("rope_theta");
        let raw = serde_json::json!({
            "rope_theta": theta,
            "max_position_embeddings": 16384,
            "rope_scaling": params,
        });
        let p = rope_params(&raw, 10_000.0, 1.0, 16384).expect("yarn params");
        let rope = Rope::new(&p, 64).expect("rope");
        let (cos, sin) = rope.tables(&[0, 1, 1000, 16000], DType::F32).unwrap();
        let want_cos: Vec<f32> =
            case[1].as_array().expect("cos").iter().map(|v| v.as_f64().unwrap_or(f64::NAN) as f32).collect();
        let want_sin: Vec<f32> =
            case[2].as_array().expect("sin").iter().map(|v| v.as_f64().unwrap_or(f64::NAN) as f32).collect();
        // One value per frequency (32 per position); HF repeats them as cat(freqs, freqs).
        for (row, (c, s)) in cos.chunks(32).zip(sin.chunks(32)).enumerate() {
            for i in 0..32 {
                let (wc, ws) = (want_cos[row * 32 + i], want_sin[row * 32 + i]);
                assert!(
                    (c[i] - wc).abs() < 2e-3 && (s[i] - ws).abs() < 2e-3,
                    "case {params}: pos row {row} freq {i}: ({}, {}) vs ({wc}, {ws})",
                    c[i],
                    s[i]
                );
            }
        }
    }
}
