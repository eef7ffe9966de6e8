//! Hugging Face `config.json` / `generation_config.json` helpers shared by all models.
//!
//! Each model crate parses its own typed config with serde (unknown keys are ignored, HF
//! defaults via `#[serde(default)]`); this module holds what is common: reading and
//! validating the file, architecture selection, RoPE parameters in both the hub style
//! (top-level `rope_theta`, `partial_rotary_factor`, `rope_scaling`) and the
//! transformers-v5 style (`rope_parameters`), and generation defaults.

use crate::error::{Context, Result};
use crate::{bail, err};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::Path;

/// Reads and parses `config.json` of a model folder.
pub fn read_config(dir: &Path) -> Result<Value> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| err!(Config, "{} is not valid JSON: {e}", path.display()))?;
    if !v.is_object() {
        bail!(Config, "{} must contain a JSON object", path.display());
    }
    Ok(v)
}

/// Deserializes a typed config with an error that names the bad key.
pub fn parse_typed<T: DeserializeOwned>(raw: &Value, what: &str) -> Result<T> {
    serde_json::from_value(raw.clone()).map_err(|e| err!(Config, "invalid {what} config.json: {e}"))
}

/// The single entry of `architectures`.
pub fn architecture(raw: &Value) -> Result<String> {
    let arr = raw
        .get("architectures")
        .ok_or_else(|| {
            err!(Config, "config.json has no `architectures` field; porter selects the model implementation from it")
        })?
        .as_array()
        .ok_or_else(|| err!(Config, "config.json `architectures` must be a list of strings"))?;
    match arr.as_slice() {
        [Value::String(s)] => Ok(s.clone()),
        [] => bail!(Config, "config.json `architectures` is empty"),
        _ => bail!(
            Config,
            "config.json `architectures` must hold exactly one string, found {}",
            Value::Array(arr.clone())
        ),
    }
}

/// How rotary frequencies are scaled.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Positions divided by `factor` (HF `rope_type: linear`).
    Linear { factor: f32 },
    /// YaRN (HF `rope_type: yarn`): per-frequency blend of interpolation and extrapolation,
    /// cos/sin scaled by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
}

/// Rotary-embedding parameters of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub theta: f32,
    pub partial_rotary_factor: f32,
    pub scaling: RopeScaling,
}

/// Reads RoPE parameters from either config style. `default_theta` and `default_partial`
/// are the model class's defaults when the keys are absent.
pub fn rope_params(raw: &Value, default_theta: f32, default_partial: f32) -> Result<RopeParams> {
    let num = |v: Option<&Value>| v.and_then(Value::as_f64).map(|x| x as f32);
    let rp = raw.get("rope_parameters").filter(|v| v.is_object());
    let rs = raw.get("rope_scaling").filter(|v| v.is_object());
    let theta = num(rp.and_then(|p| p.get("rope_theta"))).or(num(raw.get("rope_theta"))).unwrap_or(default_theta);
    let partial = num(rp.and_then(|p| p.get("partial_rotary_factor")))
        .or(num(raw.get("partial_rotary_factor")))
        .unwrap_or(default_partial);
    if !(partial > 0.0 && partial <= 1.0) {
        bail!(Config, "partial_rotary_factor must be in (0, 1], found {partial}");
    }
    if theta.is_nan() || theta <= 0.0 {
        bail!(Config, "rope_theta must be positive, found {theta}");
    }
    let scaling_obj = rp.or(rs);
    let rope_type = scaling_obj
        .and_then(|o| o.get("rope_type").or_else(|| o.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let scaling = match rope_type {
        "default" => RopeScaling::Default,
        "linear" => {
            let factor = num(scaling_obj.and_then(|o| o.get("factor")))
                .ok_or_else(|| err!(Config, "rope scaling `linear` needs a `factor`"))?;
            RopeScaling::Linear { factor }
        }
        "yarn" => {
            let o = scaling_obj.ok_or_else(|| err!(Config, "rope scaling `yarn` needs its parameters"))?;
            let f = |k: &str| o.get(k).and_then(Value::as_f64);
            let original = f("original_max_position_embeddings")
                .or_else(|| raw.get("max_position_embeddings").and_then(Value::as_f64))
                .ok_or_else(|| err!(Config, "rope scaling `yarn` needs original_max_position_embeddings"))?;
            // HF: factor defaults to max_position_embeddings / original_max_position_embeddings.
            let factor = match f("factor") {
                Some(x) => x,
                None => raw
                    .get("max_position_embeddings")
                    .and_then(Value::as_f64)
                    .map(|m| m / original)
                    .ok_or_else(|| err!(Config, "rope scaling `yarn` needs a `factor`"))?,
            };
            let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
            let attention_factor = match (f("attention_factor"), f("mscale"), f("mscale_all_dim")) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => get_mscale(factor, m) / get_mscale(factor, ma),
                _ => get_mscale(factor, 1.0),
            };
            // HF uses `x or default`: a zero/null beta falls back to the default.
            let beta_fast = f("beta_fast").filter(|v| *v != 0.0).unwrap_or(32.0);
            let beta_slow = f("beta_slow").filter(|v| *v != 0.0).unwrap_or(1.0);
            let truncate = o.get("truncate").and_then(Value::as_bool).unwrap_or(true);
            if !(factor > 0.0 && original > 0.0) {
                bail!(Config, "rope scaling `yarn`: factor and original_max_position_embeddings must be positive");
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            }
        }
        other => bail!(Config, "rope scaling type `{other}` is not supported yet (supported: default, linear, yarn)"),
    };
    Ok(RopeParams { theta, partial_rotary_factor: partial, scaling })
}

/// Generation defaults: end-of-sequence ids and sampling parameters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect(),
        _ => vec![],
    }
}

/// Reads `generation_config.json` when present, falling back to `config.json` for the ids.
pub fn generation_config(dir: &Path, raw: &Value) -> Result<GenerationConfig> {
    let path = dir.join("generation_config.json");
    let gen: Value = if path.exists() {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| err!(Config, "{} is not valid JSON: {e}", path.display()))?
    } else {
        Value::Null
    };
    let mut eos = ids(gen.get("eos_token_id"));
    if eos.is_empty() {
        eos = ids(raw.get("eos_token_id"));
    }
    let bos = ids(gen.get("bos_token_id")).first().copied().or_else(|| ids(raw.get("bos_token_id")).first().copied());
    let f = |k: &str| gen.get(k).and_then(Value::as_f64).map(|x| x as f32);
    Ok(GenerationConfig {
        eos_token_ids: eos,
        bos_token_id: bos,
        temperature: f("temperature"),
        top_p: f("top_p"),
        top_k: gen.get("top_k").and_then(Value::as_u64).map(|x| x as usize),
    })
}

/// Load-time checks shared by the attention models.
pub fn check_dims(
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    layers: usize,
) -> Result<()> {
    if hidden == 0 || heads == 0 || kv_heads == 0 || head_dim == 0 || vocab == 0 || layers == 0 {
        bail!(Config, "hidden_size, num_attention_heads, num_key_value_heads, head_dim, vocab_size and num_hidden_layers must be positive");
    }
    if !heads.is_multiple_of(kv_heads) {
        bail!(Config, "num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})");
    }
    if !head_dim.is_multiple_of(2) {
        bail!(Config, "head_dim ({head_dim}) must be even for RoPE");
    }
    Ok(())
}

/// Only SiLU-gated MLPs are implemented.
pub fn check_act(act: &str) -> Result<()> {
    match act {
        "silu" | "swish" => Ok(()),
        other => bail!(Config, "hidden_act `{other}` is not supported (supported: silu)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rope_from_both_styles() {
        let hub = json!({"rope_theta": 1e6, "partial_rotary_factor": 0.25});
        let v5 = json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}});
        assert_eq!(rope_params(&hub, 1e4, 1.0).unwrap(), rope_params(&v5, 1e4, 1.0).unwrap());
        assert_eq!(rope_params(&json!({}), 1e4, 1.0).unwrap().theta, 1e4);
        assert!(rope_params(&json!({"rope_scaling": {"rope_type": "longrope"}}), 1e4, 1.0).is_err());
    }

    #[test]
    fn architecture_must_be_single() {
        assert_eq!(architecture(&json!({"architectures": ["X"]})).unwrap(), "X");
        assert!(architecture(&json!({})).is_err());
        assert!(architecture(&json!({"architectures": ["X", "Y"]})).is_err());
    }
}

fn default_eps() -> f64 {
    1e-6
}

fn default_act() -> String {
    "silu".into()
}

/// The `config.json` keys every decoder-only architecture shares, with HF's defaults.
/// Model configs embed it with `#[serde(flatten)]`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct DecoderConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    #[serde(default)]
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

impl DecoderConfig {
    /// Load-time checks of the shared keys, given the model's resolved KV heads and head dim.
    pub fn check(&self, kv_heads: usize, head_dim: usize) -> Result<()> {
        check_dims(
            self.hidden_size,
            self.num_attention_heads,
            kv_heads,
            head_dim,
            self.vocab_size,
            self.num_hidden_layers,
        )?;
        check_act(&self.hidden_act)
    }
}
