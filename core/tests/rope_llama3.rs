//! `rope_type: llama3` against transformers 5.17 (`ROPE_INIT_FUNCTIONS["llama3"]` on a
//! LlamaConfig; `data/gen_llama3_reference.py`): the inverse frequencies of the Llama 3.1
//! and 3.2 settings and of a small-context one with many smoothed (medium) frequencies,
//! stored in `data/llama3_reference.json`: every inverse frequency within 1 f32 ulp (bit-exact here), and
//! the cos / sin tables at large positions.

use porter_core::config::{rope_params, RopeScaling};
use porter_core::nn::Rope;
use porter_core::DType;

#[test]
fn llama3_inv_freq_matches_transformers() {
    let cases: serde_json::Value =
        serde_json::from_str(include_str!("data/llama3_reference.json")).expect("reference json");
    for case in cases.as_array().expect("list") {
        let params = case[0].clone();
        let head_dim = case[1].as_u64().expect("head_dim") as usize;
        let want: Vec<f32> =
            case[2].as_array().expect("inv_freq").iter().map(|v| v.as_f64().unwrap_or(f64::NAN) as f32).collect();
        let raw = serde_json::json!({"max_position_embeddings": 1 << 20, "rope_parameters": params});
        let p = rope_params(&raw, 10_000.0, 1.0, 1 << 20).expect("llama3 params");
        assert!(matches!(p.scaling, RopeScaling::Llama3 { .. }), "{:?}", p.scaling);
        let rope = Rope::new(&p, head_dim).expect("rope");
        assert_eq!(rope.rot_dim(), head_dim);
        assert_eq!(want.len(), head_dim / 2);
        // inv_freq itself: transformers computes it in f32 (base ** (2i / dim) and the
        // blend); porter's libm powf may differ from torch's pow by an ulp elsewhere.
        for (i, (&got, &w)) in rope.inv_freq().expect("inv_freq").iter().zip(&want).enumerate() {
            let ulps = (got - w).abs() / (w.abs() * f32::EPSILON);
            assert!(ulps <= 1.0, "{params} freq {i}: porter {got} vs transformers {w} ({ulps:.1} ulp)");
        }
        // Large positions magnify any inv_freq difference: p · inv_freq in f32 as HF.
        let positions = [1000usize, 8191, 100_000];
        let (cos, sin) = rope.tables(&positions, DType::F32).expect("tables");
        for (row, &pos) in positions.iter().enumerate() {
            for (i, &w) in want.iter().enumerate() {
                let a = pos as f32 * w;
                let (c, s) = (cos[row * want.len() + i], sin[row * want.len() + i]);
                assert!(
                    (c - a.cos()).abs() < 1e-5 && (s - a.sin()).abs() < 1e-5,
                    "{params} position {pos} freq {i}: ({c}, {s}) vs ({}, {})",
                    a.cos(),
                    a.sin()
                );
            }
        }
    }
}

#[test]
fn llama3_reference_has_all_three_bands() {
    // The small-context case must exercise high (unchanged), medium (smoothed) and low
    // (divided) frequencies, or the test above would not cover the blend.
    let cases: serde_json::Value =
        serde_json::from_str(include_str!("data/llama3_reference.json")).expect("reference json");
    let case = &cases[2];
    let p = &case[0];
    let (factor, old) =
        (p["factor"].as_f64().unwrap_or(0.0), p["original_max_position_embeddings"].as_f64().unwrap_or(0.0));
    let (low, high) = (p["low_freq_factor"].as_f64().unwrap_or(0.0), p["high_freq_factor"].as_f64().unwrap_or(0.0));
    let dim = case[1].as_f64().unwrap_or(0.0);
    let theta = p["rope_theta"].as_f64().unwrap_or(0.0);
    let mut bands = [0usize; 3];
    for i in 0..(dim as usize / 2) {
        let inv = 1.0 / theta.powf(2.0 * i as f64 / dim);
        let wl = 2.0 * std::f64::consts::PI / inv;
        bands[if wl < old / high {
            0
        } else if wl > old / low {
            2
        } else {
            1
        }] += 1;
    }
    assert!(bands.iter().all(|&n| n > 0), "bands {bands:?} (factor {factor})");
}
