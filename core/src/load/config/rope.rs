//! RoPE parameters from `config.json`, as transformers v5 reads them
//! (`RotaryEmbeddingConfigMixin.convert_rope_params_to_dict` / `standardize_rope_params` /
//! `validate_rope` and `ROPE_INIT_FUNCTIONS`).
//!
//! - The block is `rope_scaling` when it is a non-empty object, else `rope_parameters`
//!   (transformers: `rope_scaling or rope_parameters`); anything but an object or `null`
//!   is an error, and so are per-layer-type blocks (`{"full_attention": {...}}`).
//! - `rope_theta` / `partial_rotary_factor` come from the block, else the top level, else
//!   the class default; `null` or a non-number is an error (transformers would fail later).
//! - `rope_type` (or the legacy `type`) must be `default`, `linear`, `yarn`, `llama3` or
//!   `dynamic` (plain RoPE on every position porter runs: its NTK rescaling starts past
//!   `max_position_embeddings`, which the model refuses); `longrope` and unknown types are
//!   errors, never plain RoPE. Factors must be numbers `>= 1` where transformers requires it.

use super::{kind, positive_f32, show, Keys, POSITIVE_F32};
use crate::error::{Error, Result};
use serde_json::{Map, Value};

pub use crate::nn::{RopeParams, RopeScaling};

/// What a model class defaults RoPE to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeDefaults {
    /// `rope_theta` when no key gives it.
    pub theta: f32,
    /// `Some(default)` when the class applies `partial_rotary_factor` to plain RoPE
    /// (Qwen3-Next: 0.25). `None` when its plain RoPE always rotates the whole head
    /// (Qwen3, Qwen3-MoE, Mistral, Llama): the key is then ignored for `default` and must
    /// be 1 for the scaled types (transformers would build tables of the wrong width).
    pub partial: Option<f32>,
    /// The config's `max_position_embeddings` (its class default when absent): the
    /// `original_max_position_embeddings` of `yarn` / `llama3` blocks without one, and the
    /// numerator of a `null` yarn factor.
    pub max_position_embeddings: usize,
}

/// Reads RoPE parameters from either config style. `default_theta` and `default_partial`
/// are the model class's defaults; a `default_partial` below 1 means the class applies
/// `partial_rotary_factor` (see [`RopeDefaults::partial`]). `max_position_embeddings` is the
/// config's (its class default when absent; [`RopeDefaults::max_position_embeddings`]).
pub fn rope_params(
    raw: &Value,
    default_theta: f32,
    default_partial: f32,
    max_position_embeddings: usize,
) -> Result<RopeParams> {
    let partial = (default_partial != 1.0).then_some(default_partial);
    rope_params_with(raw, &RopeDefaults { theta: default_theta, partial, max_position_embeddings })
}

/// Checks the rotary width of `head_dim` under `p` as [`crate::nn::Rope`] will build it
/// ([`crate::nn::rotary_dims`]: transformers' `int(head_dim · partial_rotary_factor)`,
/// at least 1, rotating at most `head_dim` dims; even for yarn), naming the config key.
pub fn check_rotary_dim(p: &RopeParams, head_dim: usize) -> Result<()> {
    crate::nn::rotary_dims(head_dim, p).map(|_| ()).map_err(|e| {
        let why = e.to_string();
        let why = why.split("RoPE: ").nth(1).unwrap_or(&why).to_string();
        Error::key("partial_rotary_factor", p.partial_rotary_factor, why)
    })
}

/// The RoPE block: a non-empty `rope_scaling`, else `rope_parameters`, with its name.
fn block(raw: &Value) -> Result<Option<(&'static str, &Map<String, Value>)>> {
    let pick = |key: &'static str| match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some((key, m))),
        Some(v) => {
            Err(Error::key(key, show(v), format!("must be an object of RoPE parameters or null, found {}", kind(v))))
        }
    };
    let (rs, rp) = (pick("rope_scaling")?, pick("rope_parameters")?);
    Ok(match (rs, rp) {
        (Some(s), _) if !s.1.is_empty() => Some(s),
        (_, Some(p)) => Some(p),
        (s, None) => s,
    })
}

fn number(k: &Keys, key: &str, v: &Value, ok: impl Fn(f64) -> bool, allowed: &str) -> Result<f64> {
    match v.as_f64() {
        Some(x) if ok(x) => Ok(x),
        Some(_) => Err(k.error(key, v, format!("must be {allowed}"))),
        None => Err(k.error(key, v, format!("must be {allowed}, found {}", kind(v)))),
    }
}

/// An optional number of the block: `None` when absent or `null`.
fn opt_number(k: &Keys, key: &str, ok: impl Fn(f64) -> bool, allowed: &str) -> Result<Option<f64>> {
    match k.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => number(k, key, v, ok, allowed).map(Some),
    }
}

/// A scaling factor: transformers only warns below 1 and computes with it, so any positive
/// finite number (one that stays finite in f32); 0, negatives and non-numbers would give
/// infinite or NaN frequencies.
fn factor_ok(x: f64) -> bool {
    x.is_finite() && x > 0.0 && (x as f32).is_finite() && (x as f32) > 0.0
}

const FACTOR: &str = "a positive finite number";

/// `original_max_position_embeddings` of a `yarn` / `llama3` block, as transformers'
/// `standardize_rope_params` sets it: a top-level `original_max_position_embeddings` key wins
/// (it overwrites the block's, the Phi-3 convention), else the block's, else the config's
/// `max_position_embeddings` (`max_pos`, its class default when absent).
fn original_max(k: &Keys, raw: &Value, max_pos: usize) -> Result<f64> {
    let ok = |x: f64| x.is_finite() && x >= 1.0 && x <= super::limits::MAX_POSITIONS as f64;
    let allowed = format!("a number in 1..={}", super::limits::MAX_POSITIONS);
    let top = Keys::new(raw)?;
    match (top.get("original_max_position_embeddings"), k.get("original_max_position_embeddings")) {
        (Some(v), _) => number(&top, "original_max_position_embeddings", v, ok, &allowed),
        (None, Some(v)) => number(k, "original_max_position_embeddings", v, ok, &allowed),
        (None, None) => {
            let m = max_pos as f64;
            if ok(m) {
                Ok(m)
            } else {
                Err(Error::key("max_position_embeddings", max_pos, allowed))
            }
        }
    }
}

/// Reads RoPE parameters with explicit class defaults.
pub fn rope_params_with(raw: &Value, defaults: &RopeDefaults) -> Result<RopeParams> {
    let empty = Map::new();
    let (name, obj) = block(raw)?.unwrap_or(("rope_parameters", &empty));
    let k = Keys::nested(obj, name);
    let top = Keys::new(raw)?;
    if let Some((key, _)) = obj.iter().find(|(_, v)| v.is_object()) {
        return Err(k.error(
            key,
            &obj[key],
            "per-layer-type RoPE parameters are not supported (one block for every layer)",
        ));
    }
    // rope_type, or the legacy `type`.
    let rope_type = match (k.get("rope_type"), k.get("type")) {
        (Some(v), _) | (None, Some(v)) => {
            let key = if k.has("rope_type") { "rope_type" } else { "type" };
            match v {
                Value::String(s) => s.clone(),
                other => return Err(k.error(key, other, format!("must be a string, found {}", kind(other)))),
            }
        }
        (None, None) => "default".to_owned(),
    };
    // rope_theta: the block's, else the top level's, else the class default.
    let theta = match (k.get("rope_theta"), top.get("rope_theta")) {
        (Some(v), _) => number(&k, "rope_theta", v, positive_f32, POSITIVE_F32)?,
        (None, Some(v)) => number(&top, "rope_theta", v, positive_f32, POSITIVE_F32)?,
        (None, None) => defaults.theta as f64,
    };
    let unit = |x: f64| x > 0.0 && x <= 1.0;
    let given_partial = match (k.get("partial_rotary_factor"), top.get("partial_rotary_factor")) {
        (Some(v), _) => Some(number(&k, "partial_rotary_factor", v, unit, "a number in (0, 1]")?),
        (None, Some(v)) => Some(number(&top, "partial_rotary_factor", v, unit, "a number in (0, 1]")?),
        (None, None) => None,
    };
    let partial = match (defaults.partial, given_partial) {
        (Some(d), p) => p.unwrap_or(d as f64),
        // Proportional RoPE applies the factor inside a whole-head table on every architecture.
        (None, Some(p)) if rope_type == "proportional" => p,
        (None, Some(p)) if rope_type != "default" && p != 1.0 => {
            return Err(Error::key(
                "partial_rotary_factor",
                p,
                format!(
                    "must be 1 with rope_type `{rope_type}`: this architecture rotates the whole head \
                     (transformers builds {rope_type} tables of the partial width and fails)"
                ),
            ))
        }
        (None, _) => 1.0,
    };
    let scaling = match rope_type.as_str() {
        "default" => RopeScaling::Default,
        "linear" => {
            let v = k.get("factor").ok_or_else(|| k.missing("factor", "rope_type `linear` needs a factor"))?;
            RopeScaling::Linear { factor: number(&k, "factor", v, factor_ok, FACTOR)? as f32 }
        }
        "proportional" => {
            // transformers: `rope_parameters.get("factor", 1.0)`.
            let factor = match k.get("factor") {
                None => 1.0,
                Some(v) => number(&k, "factor", v, factor_ok, FACTOR)?,
            };
            RopeScaling::Proportional { factor: factor as f32 }
        }
        "dynamic" => {
            let v = k.get("factor").ok_or_else(|| k.missing("factor", "rope_type `dynamic` needs a factor"))?;
            RopeScaling::Dynamic { factor: number(&k, "factor", v, factor_ok, FACTOR)? }
        }
        "yarn" => {
            let original = original_max(&k, raw, defaults.max_position_embeddings)?;
            let factor = match k.get("factor") {
                None => return Err(k.missing("factor", "rope_type `yarn` needs a factor (or null)")),
                // transformers: a null factor is max_position_embeddings / original.
                Some(Value::Null) => defaults.max_position_embeddings as f64 / original,
                Some(v) => number(&k, "factor", v, factor_ok, FACTOR)?,
            };
            let positive = |x: f64| x.is_finite() && x > 0.0;
            let finite = |x: f64| x.is_finite();
            let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
            let mscale = opt_number(&k, "mscale", finite, "a finite number")?;
            let mscale_all = opt_number(&k, "mscale_all_dim", finite, "a finite number")?;
            let attention_factor = match opt_number(&k, "attention_factor", positive, "a positive finite number")? {
                Some(a) => a,
                None => match (mscale, mscale_all) {
                    (Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => get_mscale(factor, m) / get_mscale(factor, ma),
                    _ => get_mscale(factor, 1.0),
                },
            };
            // transformers uses `x or default`: a zero / null beta is the default.
            let beta_fast =
                opt_number(&k, "beta_fast", finite, "a finite number")?.filter(|v| *v != 0.0).unwrap_or(32.0);
            let beta_slow =
                opt_number(&k, "beta_slow", finite, "a finite number")?.filter(|v| *v != 0.0).unwrap_or(1.0);
            if !(beta_fast > 0.0 && beta_slow > 0.0 && beta_fast >= beta_slow) {
                return Err(k.error(
                    "beta_fast",
                    &serde_json::json!(beta_fast),
                    format!("must be positive and at least beta_slow = {beta_slow}"),
                ));
            }
            // transformers: `get("truncate", True)`; null is falsy.
            let truncate = match k.get("truncate") {
                None => true,
                Some(Value::Null) => false,
                Some(_) => k.flag("truncate", true)?,
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            }
        }
        "llama3" => {
            let req = |key: &str, ok: &dyn Fn(f64) -> bool, allowed: &str| -> Result<f64> {
                let what = format!("rope_type `llama3` needs {allowed}");
                let v = k.get(key).ok_or_else(|| k.missing(key, &what))?;
                number(&k, key, v, ok, allowed)
            };
            let factor = req("factor", &factor_ok, FACTOR)?;
            let positive = |x: f64| x.is_finite() && x > 0.0;
            let low = req("low_freq_factor", &positive, "a positive finite number")?;
            let high = req("high_freq_factor", &positive, "a positive finite number")?;
            // transformers only warns when high_freq_factor <= low_freq_factor or the original
            // length is not below max_position_embeddings, and computes with them (no band of
            // medium frequencies then): so does `Rope::new`.
            let original = original_max(&k, raw, defaults.max_position_embeddings)?;
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original,
            }
        }
        other => {
            let key = if k.has("rope_type") { "rope_type" } else { "type" };
            return Err(k.error(
                key,
                &Value::String(other.to_owned()),
                "is not supported: porter implements default, linear, yarn, llama3, dynamic and proportional \
                 (longrope switches its factors by sequence length and is not implemented)",
            ));
        }
    };
    Ok(RopeParams { theta: theta as f32, partial_rotary_factor: partial, scaling })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `rope_params` with the config's `max_position_embeddings` (or 4096 when it has none).
    fn rope_params_t(raw: &Value, theta: f32, partial: f32) -> Result<RopeParams> {
        let m = raw.get("max_position_embeddings").and_then(Value::as_u64).map_or(4096, |m| m as usize);
        rope_params(raw, theta, partial, m)
    }

    fn err(raw: Value) -> String {
        rope_params_t(&raw, 1e4, 1.0).expect_err("must fail").to_string()
    }

    #[test]
    fn rope_from_both_styles() {
        let hub = json!({"rope_theta": 1e6, "partial_rotary_factor": 0.25});
        let v5 = json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}});
        assert_eq!(rope_params_t(&hub, 1e4, 0.25).unwrap(), rope_params_t(&v5, 1e4, 0.25).unwrap());
        assert_eq!(rope_params_t(&hub, 1e4, 0.25).unwrap().partial_rotary_factor, 0.25);
        assert_eq!(rope_params_t(&json!({}), 1e4, 1.0).unwrap().theta, 1e4);
        // A class with whole-head RoPE ignores the key for plain RoPE (as transformers).
        assert_eq!(rope_params_t(&hub, 1e4, 1.0).unwrap().partial_rotary_factor, 1.0);
        // rope_scaling wins over rope_parameters when non-empty; `type` is rope_type.
        let both =
            json!({"rope_scaling": {"type": "linear", "factor": 2}, "rope_parameters": {"rope_type": "default"}});
        assert_eq!(rope_params_t(&both, 1e4, 1.0).unwrap().scaling, RopeScaling::Linear { factor: 2.0 });
        let empty = json!({"rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 3}});
        assert_eq!(rope_params_t(&empty, 1e4, 1.0).unwrap().scaling, RopeScaling::Linear { factor: 3.0 });
    }

    #[test]
    fn bad_rope_is_an_error_not_plain_rope() {
        for (raw, needle) in [
            (json!({"rope_theta": "abc"}), "`rope_theta` = \"abc\""),
            (json!({"rope_theta": null}), "`rope_theta` = null"),
            (json!({"rope_theta": -1}), "`rope_theta` = -1"),
            (json!({"rope_theta": 1e39}), "`rope_theta`"),
            (json!({"rope_parameters": {"rope_theta": null}}), "`rope_parameters.rope_theta`"),
            (json!({"partial_rotary_factor": 0}), "`partial_rotary_factor`"),
            (json!({"partial_rotary_factor": "x"}), "`partial_rotary_factor`"),
            (json!({"rope_scaling": "linear"}), "`rope_scaling`"),
            (json!({"rope_scaling": {"rope_type": "linear", "factor": 0}}), "`rope_scaling.factor` = 0"),
            (json!({"rope_scaling": {"rope_type": "linear", "factor": -1}}), "`rope_scaling.factor` = -1"),
            (json!({"rope_scaling": {"rope_type": "linear", "factor": "2"}}), "found a string"),
            (json!({"rope_scaling": {"rope_type": "linear"}}), "`rope_scaling.factor` = (absent)"),
            (json!({"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 10}}), "factor"),
            (
                json!({"max_position_embeddings": 64, "rope_scaling": {"rope_type": "yarn", "factor": 2, "attention_factor": -1}}),
                "attention_factor",
            ),
            (
                json!({"max_position_embeddings": 64, "rope_scaling": {"rope_type": "yarn", "factor": 2, "truncate": "no"}}),
                "truncate",
            ),
            (json!({"rope_scaling": {"rope_type": "dynamic"}}), "`rope_scaling.factor` = (absent)"),
            (json!({"rope_scaling": {"rope_type": "dynamic", "factor": 0}}), "`rope_scaling.factor` = 0"),
            (
                json!({"original_max_position_embeddings": null, "rope_scaling": {"rope_type": "yarn", "factor": 2}}),
                "`original_max_position_embeddings` = null",
            ),
            (json!({"rope_scaling": {"rope_type": "longrope"}}), "\"longrope\": is not supported"),
            (json!({"rope_scaling": {"rope_type": null}}), "`rope_scaling.rope_type` = null"),
            (json!({"rope_scaling": {"full_attention": {"rope_type": "default"}}}), "per-layer-type"),
            (json!({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4}}), "high_freq_factor"),
            (json!({"rope_scaling": {"rope_type": "linear", "factor": 2}, "partial_rotary_factor": 0.5}), "must be 1"),
        ] {
            let e = err(raw.clone());
            assert!(e.contains(needle), "{raw}: {e}");
        }
    }

    /// What transformers 5.24 accepts with a warning (and computes with) is read, not refused;
    /// `original_max_position_embeddings` follows `standardize_rope_params`.
    #[test]
    fn legal_rope_values_transformers_only_warns_about() {
        let p = |raw: Value| rope_params_t(&raw, 1e4, 1.0).unwrap().scaling;
        assert_eq!(
            p(json!({"rope_scaling": {"rope_type": "linear", "factor": 0.5}})),
            RopeScaling::Linear { factor: 0.5 }
        );
        let l3 = |low: f64, high: f64, orig: Option<f64>, top: Option<f64>, max: u64| {
            let mut b = json!({"rope_type": "llama3", "factor": 8, "low_freq_factor": low, "high_freq_factor": high});
            if let Some(o) = orig {
                b["original_max_position_embeddings"] = json!(o);
            }
            let mut raw = json!({"max_position_embeddings": max, "rope_scaling": b});
            if let Some(t) = top {
                raw["original_max_position_embeddings"] = json!(t);
            }
            match p(raw) {
                RopeScaling::Llama3 { low_freq_factor, high_freq_factor, original_max_position_embeddings, .. } => {
                    (low_freq_factor, high_freq_factor, original_max_position_embeddings)
                }
                other => panic!("{other:?}"),
            }
        };
        // high <= low, original == max_position_embeddings, no original: computed as given.
        assert_eq!(l3(2.0, 2.0, Some(64.0), None, 8192), (2.0, 2.0, 64.0));
        assert_eq!(l3(4.0, 1.0, Some(8192.0), None, 8192), (4.0, 1.0, 8192.0));
        assert_eq!(l3(1.0, 4.0, None, None, 8192), (1.0, 4.0, 8192.0));
        // A top-level original_max_position_embeddings overwrites the block's.
        assert_eq!(l3(1.0, 4.0, Some(16.0), Some(64.0), 8192), (1.0, 4.0, 64.0));
        // yarn: no original → max_position_embeddings; a null factor is max / original (< 1 too).
        match p(
            json!({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": null, "original_max_position_embeddings": 8192}}),
        ) {
            RopeScaling::Yarn { factor, original_max_position_embeddings, .. } => {
                assert_eq!((factor, original_max_position_embeddings), (0.5, 8192.0));
            }
            other => panic!("{other:?}"),
        }
        match p(
            json!({"original_max_position_embeddings": 64, "rope_scaling": {"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 16}}),
        ) {
            RopeScaling::Yarn { original_max_position_embeddings, .. } => {
                assert_eq!(original_max_position_embeddings, 64.0)
            }
            other => panic!("{other:?}"),
        }
        // Without max_position_embeddings in the config the class default (passed in) counts.
        match rope_params(
            &json!({"rope_scaling": {"rope_type": "yarn", "factor": null, "original_max_position_embeddings": 4}}),
            1e4,
            0.25,
            32768,
        )
        .unwrap()
        .scaling
        {
            RopeScaling::Yarn { factor, .. } => assert_eq!(factor, 8192.0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dynamic_ntk_is_read_with_its_factor() {
        for raw in [
            json!({"rope_scaling": {"type": "dynamic", "factor": 2}}),
            json!({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}),
            // transformers only warns about keys a type does not use.
            json!({"rope_scaling": {"rope_type": "dynamic", "factor": 2, "low_freq_factor": 1}}),
        ] {
            let p = rope_params_t(&raw, 1e4, 1.0).unwrap();
            assert_eq!(p.scaling, RopeScaling::Dynamic { factor: 2.0 }, "{raw}");
            assert_eq!((p.theta, p.partial_rotary_factor), (1e4, 1.0), "{raw}");
        }
    }

    #[test]
    fn yarn_defaults_follow_transformers() {
        let raw = json!({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "yarn", "factor": null, "original_max_position_embeddings": 2048, "beta_fast": 0, "truncate": null}});
        let p = rope_params_t(&raw, 1e4, 1.0).unwrap();
        assert_eq!(
            p.scaling,
            RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 2048.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 0.1 * 4f64.ln() + 1.0,
                truncate: false,
            }
        );
    }
}
