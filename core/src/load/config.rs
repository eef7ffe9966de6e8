//! Hugging Face `config.json` / `generation_config.json` helpers shared by all models.
//!
//! Every model crate reads its config through [`Keys`], which checks each key as
//! transformers' (v5, `@strict`) config class does and more: a key present with the wrong
//! type is an error, never a silent default; `null` is accepted only where the class
//! declares `T | None` (and then means what the class makes of it); counts are bounded by
//! [`limits`] *before* anything is sized from them. Every error is an
//! [`Error::ConfigKey`] naming the key, its value and the allowed range.
//!
//! This module also holds what is common to the models: reading the file, architecture
//! selection, the shared decoder keys ([`DecoderConfig`]), RoPE parameters in both the hub
//! style (top-level `rope_theta`, `partial_rotary_factor`, `rope_scaling`) and the
//! transformers-v5 style (`rope_parameters`) ([`rope_params`]), and generation defaults.

use crate::error::{Context, Error, Result};
use crate::tensor::Device;
use crate::{bail, err};
pub use porter_kernels::cpu::Act;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::ops::RangeInclusive;
use std::path::Path;

mod rope;
pub use rope::{check_rotary_dim, rope_params, rope_params_with, RopeDefaults, RopeParams, RopeScaling};

/// Upper bounds on config counts, checked before anything is sized from them.
///
/// Each is far above every released model (the largest values in parentheses), so a real
/// checkpoint never meets them; they exist so that a malformed count (`2^63` layers, a
/// billion experts) is an error naming the key instead of a capacity overflow, a
/// multi-terabyte allocation or a multi-million-line error message.
pub mod limits {
    /// `num_hidden_layers` (Llama-3.1-405B: 126).
    pub const MAX_LAYERS: usize = 4096;
    /// `hidden_size` (Llama-3.1-405B: 16384).
    pub const MAX_HIDDEN: usize = 1 << 17;
    /// `intermediate_size`, `moe_intermediate_size`, `shared_expert_intermediate_size`
    /// (Llama-3.1-405B: 53248).
    pub const MAX_INTERMEDIATE: usize = 1 << 20;
    /// `vocab_size` (Gemma 3: 262144).
    pub const MAX_VOCAB: usize = 1 << 24;
    /// `num_attention_heads`, `num_key_value_heads`, `linear_num_*_heads` (128).
    pub const MAX_HEADS: usize = 4096;
    /// `head_dim`, `linear_key_head_dim`, `linear_value_head_dim` (Qwen3-Next: 256).
    pub const MAX_HEAD_DIM: usize = 4096;
    /// `num_experts` (Qwen3-Next: 512).
    pub const MAX_EXPERTS: usize = 1 << 14;
    /// `max_position_embeddings`, `sliding_window`, `original_max_position_embeddings`
    /// (Llama-4-Scout: 10485760).
    pub const MAX_POSITIONS: usize = 1 << 24;
    /// `linear_conv_kernel_dim` (Qwen3-Next: 4).
    pub const MAX_CONV_KERNEL: usize = 64;
    /// Strides and thresholds that size nothing (`decoder_sparse_step`,
    /// `full_attention_interval`, `max_window_layers`): any 32-bit value.
    pub const MAX_STRIDE: usize = u32::MAX as usize;
}

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

/// Deserializes a typed config (serde). Prefer [`Keys`], whose errors name the key.
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

/// A value for an error message: compact JSON, at most 80 characters.
pub fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() <= 80 {
        s
    } else {
        format!("{}…", s.chars().take(80).collect::<String>())
    }
}

/// The JSON type of a value, for "expected …, found a string" messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(n) if n.is_f64() => "a float",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn range_text(r: &RangeInclusive<usize>) -> String {
    match r.start() {
        0 => format!("a non-negative integer in 0..={}", r.end()),
        1 => format!("a positive integer in 1..={}", r.end()),
        lo => format!("an integer in {lo}..={}", r.end()),
    }
}

/// Typed, checked access to the keys of one JSON object (`config.json`, or a block inside
/// it such as `rope_parameters`).
///
/// Each getter takes the default that transformers uses when the key is *absent*; a key
/// that is present must have the right type. `null` is an error except in the `opt_*`
/// getters (transformers' `T | None` fields).
pub struct Keys<'a> {
    obj: &'a Map<String, Value>,
    /// Prefix for key names in errors (`rope_parameters.` inside that block).
    prefix: String,
}

impl<'a> Keys<'a> {
    /// The keys of `raw`, which must be a JSON object.
    pub fn new(raw: &'a Value) -> Result<Self> {
        match raw {
            Value::Object(obj) => Ok(Self { obj, prefix: String::new() }),
            other => bail!(Config, "config.json must contain a JSON object, found {}", kind(other)),
        }
    }

    /// The keys of a nested object; errors name keys as `{name}.{key}`.
    pub fn nested(obj: &'a Map<String, Value>, name: &str) -> Self {
        Self { obj, prefix: format!("{name}.") }
    }

    /// The full name of `key` for errors.
    pub fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The raw value of `key` (`Some(Null)` when present as `null`).
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key)
    }

    /// Whether `key` is present (even as `null`).
    pub fn has(&self, key: &str) -> bool {
        self.obj.contains_key(key)
    }

    /// An error for `key` = `value`, which must be `reason`.
    pub fn error(&self, key: &str, value: &Value, reason: impl Into<String>) -> Error {
        Error::key(self.name(key), show(value), reason)
    }

    /// The error for a required key that is absent (`what`: its allowed values).
    pub fn missing(&self, key: &str, what: &str) -> Error {
        Error::key(self.name(key), "(absent)", format!("is required: {what}"))
    }

    /// The value of a required key (no default in porter).
    fn required(&self, key: &str, what: &str) -> Result<&'a Value> {
        self.get(key).ok_or_else(|| self.missing(key, what))
    }

    fn to_count(&self, key: &str, v: &Value, range: &RangeInclusive<usize>) -> Result<usize> {
        match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) if range.contains(&n) => Ok(n),
            _ if v.is_i64() || v.is_u64() => Err(self.error(key, v, format!("must be {}", range_text(range)))),
            _ => Err(self.error(key, v, format!("must be {}, found {}", range_text(range), kind(v)))),
        }
    }

    /// An integer in `range`; `default` when absent (`None`: the key is required).
    pub fn count(&self, key: &str, default: Option<usize>, range: RangeInclusive<usize>) -> Result<usize> {
        match (self.get(key), default) {
            (Some(v), _) => self.to_count(key, v, &range),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(self.missing(key, &range_text(&range))),
        }
    }

    /// An `int | None` key: `default` when absent, `None` when `null`.
    pub fn opt_count(&self, key: &str, default: Option<usize>, range: RangeInclusive<usize>) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => self.to_count(key, v, &range).map(Some),
        }
    }

    /// A number; `default` when absent. `ok` says whether a value is allowed and `allowed`
    /// describes the allowed values for the error.
    pub fn float(&self, key: &str, default: f64, ok: impl Fn(f64) -> bool, allowed: &str) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => self.to_float(key, v, ok, allowed),
        }
    }

    /// A number that must be present.
    pub fn float_required(&self, key: &str, ok: impl Fn(f64) -> bool, allowed: &str) -> Result<f64> {
        let v = self.required(key, allowed)?;
        self.to_float(key, v, ok, allowed)
    }

    fn to_float(&self, key: &str, v: &Value, ok: impl Fn(f64) -> bool, allowed: &str) -> Result<f64> {
        match v.as_f64() {
            Some(x) if ok(x) => Ok(x),
            Some(_) => Err(self.error(key, v, format!("must be {allowed}"))),
            None => Err(self.error(key, v, format!("must be {allowed}, found {}", kind(v)))),
        }
    }

    /// A bool; `default` when absent.
    pub fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.error(key, v, format!("must be true or false, found {}", kind(v)))),
        }
    }

    /// A string; `default` when absent.
    pub fn string(&self, key: &str, default: &str) -> Result<String> {
        match self.get(key) {
            None => Ok(default.to_owned()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(self.error(key, v, format!("must be a string, found {}", kind(v)))),
        }
    }

    /// A `list[int] | None` key: `None` when absent or `null`; every entry in `range`.
    pub fn opt_count_list(&self, key: &str, range: RangeInclusive<usize>) -> Result<Option<Vec<usize>>> {
        let list = match self.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(a)) => a,
            Some(v) => {
                return Err(self.error(key, v, format!("must be a list of {}s, found {}", range_text(&range), kind(v))))
            }
        };
        let v = list.iter().map(|x| {
            self.to_count(key, x, &range).map_err(|_| {
                self.error(
                    key,
                    &Value::Array(list.clone()),
                    format!("entries must be {}s, found {}", range_text(&range), show(x)),
                )
            })
        });
        v.collect::<Result<Vec<_>>>().map(Some)
    }

    /// A `list[str] | None` key: `None` when absent or `null`.
    pub fn opt_string_list(&self, key: &str) -> Result<Option<Vec<String>>> {
        let list = match self.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(a)) => a,
            Some(v) => return Err(self.error(key, v, format!("must be a list of strings, found {}", kind(v)))),
        };
        list.iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                other => Err(self.error(
                    key,
                    &Value::Array(list.clone()),
                    format!("entries must be strings, found {}", show(other)),
                )),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// `x` is a positive, finite number that stays a positive normal `f32`.
pub fn positive_f32(x: f64) -> bool {
    x.is_finite() && x > 0.0 && (x as f32).is_normal()
}

/// The allowed range of [`positive_f32`], for messages.
pub const POSITIVE_F32: &str = "a positive finite number (a normal f32: 1.2e-38 to 3.4e38)";

/// Checks `layer_types` against the layer count and the types a model implements. With
/// `legacy`, transformers' renames apply first (`attention` → `full_attention`, `mamba` /
/// `conv` → `linear_attention`; Qwen3-Next's config does this). Returns the checked list.
pub fn check_layer_types(types: &[String], layers: usize, allowed: &[&str], legacy: bool) -> Result<Vec<String>> {
    let renamed: Vec<String> = types
        .iter()
        .map(|t| match t.as_str() {
            "attention" if legacy => "full_attention".to_owned(),
            "mamba" | "conv" if legacy => "linear_attention".to_owned(),
            other => other.to_owned(),
        })
        .collect();
    let value = || show(&serde_json::json!(types));
    if renamed.len() != layers {
        return Err(Error::key(
            "layer_types",
            value(),
            format!("must have one entry per layer (num_hidden_layers = {layers}), found {}", renamed.len()),
        ));
    }
    if let Some(bad) = renamed.iter().find(|t| !allowed.contains(&t.as_str())) {
        return Err(Error::key(
            "layer_types",
            value(),
            format!("entries must be one of {}, found `{bad}`", allowed.join(", ")),
        ));
    }
    Ok(renamed)
}

pub use crate::model::GenerationConfig;

/// A token-id key (`eos_token_id`: `int | list[int] | None`; `bos_token_id`: `int | None`):
/// the non-negative ids (transformers only warns about negative ones, which can never be
/// generated). `file` names the file for errors.
fn token_ids(file: &str, key: &str, v: Option<&Value>) -> Result<Vec<u32>> {
    let one = |x: &Value| -> Result<Option<u32>> {
        match x.as_i64() {
            Some(n) if n < 0 => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| Error::key(key, show(x), format!("must be token ids below 2^32 (in {file})"))),
            None => Err(Error::key(
                key,
                show(v.unwrap_or(&Value::Null)),
                format!("must be an integer token id or a list of them (in {file}), found {}", kind(x)),
            )),
        }
    };
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) if key == "eos_token_id" => {
            Ok(a.iter().map(one).collect::<Result<Vec<_>>>()?.into_iter().flatten().collect())
        }
        Some(x @ Value::Array(_)) => {
            Err(Error::key(key, show(x), format!("must be an integer token id or null (in {file}), found a list")))
        }
        Some(x) => Ok(one(x)?.into_iter().collect()),
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
    const G: &str = "generation_config.json";
    const C: &str = "config.json";
    // config.json's ids are checked even when generation_config.json has its own.
    let cfg_eos = token_ids(C, "eos_token_id", raw.get("eos_token_id"))?;
    let cfg_bos = token_ids(C, "bos_token_id", raw.get("bos_token_id"))?;
    let mut eos = token_ids(G, "eos_token_id", gen.get("eos_token_id"))?;
    if eos.is_empty() {
        eos = cfg_eos;
    }
    let bos = token_ids(G, "bos_token_id", gen.get("bos_token_id"))?.first().copied().or(cfg_bos.first().copied());
    let f = |k: &str| gen.get(k).and_then(Value::as_f64).map(|x| x as f32);
    Ok(GenerationConfig {
        eos_token_ids: eos,
        bos_token_id: bos,
        temperature: f("temperature"),
        top_p: f("top_p"),
        // transformers: top_k = 0 disables top-k filtering.
        top_k: gen.get("top_k").and_then(Value::as_u64).filter(|&k| k > 0).map(|x| x as usize),
    })
}

/// The `hidden_act` names porter implements (transformers' `ACT2FN` names without learned
/// parameters; see [`Act`]). The CUDA backend runs only `silu` / `swish`
/// ([`check_act_device`]).
pub const SUPPORTED_ACTS: [&str; 22] = Act::NAMES;

/// What [`check_dims`] asks of the attention heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadDims {
    /// RoPE rotates the whole head: `kv_heads` divides `heads` and `head_dim` is even.
    WholeHeadRope,
    /// Partial RoPE, whose width [`check_rotary_dim`] checks: `head_dim` may be odd
    /// (transformers rotates `2·ceil(int(head_dim·p)/2)` dims and passes the rest).
    PartialRope,
    /// No layer attends (a hybrid model of linear-attention layers only): transformers builds
    /// no attention, so the head relations are not checked (the counts keep their ranges).
    NoAttention,
}

/// Load-time checks shared by the attention models: the relations between the counts
/// (each count was range-checked when it was read).
pub fn check_dims(
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    layers: usize,
    what: HeadDims,
) -> Result<()> {
    for (key, v, max) in [
        ("hidden_size", hidden, limits::MAX_HIDDEN),
        ("num_attention_heads", heads, limits::MAX_HEADS),
        ("num_key_value_heads", kv_heads, limits::MAX_HEADS),
        ("vocab_size", vocab, limits::MAX_VOCAB),
        ("num_hidden_layers", layers, limits::MAX_LAYERS),
    ] {
        if v == 0 || v > max {
            return Err(Error::key(key, v, format!("must be a positive integer in 1..={max}")));
        }
    }
    if what == HeadDims::NoAttention {
        return if (1..=limits::MAX_HEAD_DIM).contains(&head_dim) {
            Ok(())
        } else {
            Err(Error::key("head_dim", head_dim, format!("must be in 1..={}", limits::MAX_HEAD_DIM)))
        };
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(Error::key(
            "num_key_value_heads",
            kv_heads,
            format!("must divide num_attention_heads = {heads} (which must be a multiple of it)"),
        ));
    }
    if what == HeadDims::PartialRope && !(1..=limits::MAX_HEAD_DIM).contains(&head_dim) {
        return Err(Error::key("head_dim", head_dim, format!("must be in 1..={}", limits::MAX_HEAD_DIM)));
    }
    if what == HeadDims::WholeHeadRope
        && (!(2..=limits::MAX_HEAD_DIM).contains(&head_dim) || !head_dim.is_multiple_of(2))
    {
        return Err(Error::key(
            "head_dim",
            head_dim,
            format!(
                "must be even and in 2..={} (RoPE pairs dimensions); without a `head_dim` key it is \
                 hidden_size / num_attention_heads = {hidden} / {heads}",
                limits::MAX_HEAD_DIM
            ),
        ));
    }
    Ok(())
}

/// Why a `hidden_act` name is refused: the reason of the config-key error.
fn act_unsupported(act: &str) -> String {
    let learned = if matches!(act, "prelu" | "xielu") { ": it has learned parameters" } else { "" };
    format!("is not supported{learned} (supported: {})", SUPPORTED_ACTS.join(", "))
}

/// The activation of a `hidden_act` name, or the config-key error naming the supported ones.
pub fn check_act(act: &str) -> Result<Act> {
    Act::from_name(act).ok_or_else(|| Error::key("hidden_act", format!("{act:?}"), act_unsupported(act)))
}

/// Reads `hidden_act` (default `"silu"`, transformers' default for every model porter runs).
pub fn read_act(k: &Keys) -> Result<Act> {
    let name = k.string("hidden_act", "silu")?;
    Act::from_name(&name).ok_or_else(|| k.error("hidden_act", &Value::String(name.clone()), act_unsupported(&name)))
}

/// Load-time check that `device` runs `act`: the CUDA kernels fuse SiLU into the gated MLPs,
/// the MoE experts and the Gated DeltaNet conv, so any other activation is refused on a GPU
/// (before a forward, never inside one).
pub fn check_act_device(act: Act, device: Device) -> Result<()> {
    match device {
        Device::Cuda(_) if !act.is_silu() => Err(Error::key(
            "hidden_act",
            format!("{:?}", act.name()),
            "runs on the CPU backend only (the CUDA kernels fuse silu); use --device cpu",
        )),
        _ => Ok(()),
    }
}

fn default_eps() -> f64 {
    1e-6
}

/// serde: a `hidden_act` string as an [`Act`].
fn de_act<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Act, D::Error> {
    let name = <String as serde::Deserialize>::deserialize(d)?;
    Act::from_name(&name)
        .ok_or_else(|| serde::de::Error::custom(format!("hidden_act {name:?} {}", act_unsupported(&name))))
}

/// What a model class defaults the shared keys to, and which of them it reads.
#[derive(Clone, Copy, Debug)]
pub struct DecoderDefaults {
    /// transformers' default `max_position_embeddings` of the class.
    pub max_position_embeddings: usize,
    /// Whether the class reads `attention_bias` (Mistral's does not).
    pub reads_attention_bias: bool,
    /// transformers' default `intermediate_size` of the class.
    pub intermediate_size: usize,
    /// transformers' defaults of `vocab_size`, `hidden_size`, `num_hidden_layers` and
    /// `num_attention_heads` (a checkpoint whose tensors disagree fails at load, naming them).
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
}

/// The `config.json` keys every decoder-only architecture shares, with HF's defaults.
///
/// Read it with [`DecoderConfig::read`] (checked, errors name the key). The serde derive is
/// kept for crates that embed it with `#[serde(flatten)]`; it checks types only.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct DecoderConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    #[serde(default)]
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// `hidden_act`: the activation of the gated MLPs and MoE experts (and of Qwen3-Next's
    /// Gated DeltaNet conv).
    #[serde(default, deserialize_with = "de_act")]
    pub hidden_act: Act,
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
    /// Reads and range-checks the shared keys.
    ///
    /// An absent key takes the class default, as in transformers (for the sizes, a default
    /// that does not fit the checkpoint fails at load with the tensor and shapes named).
    pub fn read(k: &Keys, d: &DecoderDefaults) -> Result<Self> {
        use limits::*;
        let hidden_act = read_act(k)?;
        Ok(Self {
            vocab_size: k.count("vocab_size", Some(d.vocab_size), 1..=MAX_VOCAB)?,
            hidden_size: k.count("hidden_size", Some(d.hidden_size), 1..=MAX_HIDDEN)?,
            intermediate_size: k.count("intermediate_size", Some(d.intermediate_size), 0..=MAX_INTERMEDIATE)?,
            num_hidden_layers: k.count("num_hidden_layers", Some(d.num_hidden_layers), 1..=MAX_LAYERS)?,
            num_attention_heads: k.count("num_attention_heads", Some(d.num_attention_heads), 1..=MAX_HEADS)?,
            hidden_act,
            max_position_embeddings: Some(k.count(
                "max_position_embeddings",
                Some(d.max_position_embeddings),
                1..=MAX_POSITIONS,
            )?),
            rms_norm_eps: k.float("rms_norm_eps", 1e-6, positive_f32, POSITIVE_F32)?,
            attention_bias: if d.reads_attention_bias { k.flag("attention_bias", false)? } else { false },
            tie_word_embeddings: k.flag("tie_word_embeddings", false)?,
        })
    }

    /// `head_dim` as transformers derives it when the key is absent or `null`:
    /// `hidden_size / num_attention_heads` (integer division).
    pub fn derived_head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// RoPE parameters of this config ([`rope_params`]) with the class's `default_theta` /
    /// `default_partial`, against this config's `max_position_embeddings`.
    pub fn rope(&self, raw: &Value, default_theta: f32, default_partial: f32) -> Result<RopeParams> {
        rope_params(raw, default_theta, default_partial, self.max_position_embeddings.unwrap_or(32_768))
    }

    /// Load-time checks of the shared keys, given the model's resolved KV heads and head dim
    /// (RoPE over the whole head: [`HeadDims::WholeHeadRope`]).
    pub fn check(&self, kv_heads: usize, head_dim: usize) -> Result<()> {
        self.check_as(kv_heads, head_dim, HeadDims::WholeHeadRope)
    }

    /// [`DecoderConfig::check`] with what the model asks of its heads.
    pub fn check_as(&self, kv_heads: usize, head_dim: usize, what: HeadDims) -> Result<()> {
        check_dims(
            self.hidden_size,
            self.num_attention_heads,
            kv_heads,
            head_dim,
            self.vocab_size,
            self.num_hidden_layers,
            what,
        )
    }
}

/// The MoE keys shared by Qwen3-MoE, Qwen3-Next and their drafts.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeKeys {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
}

/// transformers' defaults of [`MoeKeys`] for one class.
#[derive(Clone, Copy, Debug)]
pub struct MoeDefaults {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub norm_topk_prob: bool,
    /// A key the class's `attribute_map` reads `num_experts` from, winning when present
    /// (Qwen3-MoE: `num_local_experts`).
    pub num_experts_alias: Option<&'static str>,
}

impl MoeKeys {
    /// Reads and checks the MoE keys. `mlp_only_layers` entries past the last layer are
    /// ignored, as transformers' `layer_idx not in mlp_only_layers` ignores them.
    pub fn read(k: &Keys, d: &MoeDefaults) -> Result<Self> {
        use limits::*;
        let experts_key = match d.num_experts_alias {
            Some(alias) if k.has(alias) => alias,
            _ => "num_experts",
        };
        let num_experts = k.count(experts_key, Some(d.num_experts), 0..=MAX_EXPERTS)?;
        let top_k = k.count("num_experts_per_tok", Some(d.num_experts_per_tok), 0..=MAX_EXPERTS)?;
        if num_experts > 0 && !(1..=num_experts).contains(&top_k) {
            return Err(Error::key(
                "num_experts_per_tok",
                top_k,
                format!("must be in 1..={num_experts} (num_experts = {num_experts})"),
            ));
        }
        let width_range = if num_experts > 0 { 1..=MAX_INTERMEDIATE } else { 0..=MAX_INTERMEDIATE };
        let mlp_only_layers = k.opt_count_list("mlp_only_layers", 0..=MAX_LAYERS)?.unwrap_or_default();
        Ok(Self {
            num_experts,
            num_experts_per_tok: top_k,
            moe_intermediate_size: k.count("moe_intermediate_size", Some(d.moe_intermediate_size), width_range)?,
            norm_topk_prob: k.flag("norm_topk_prob", d.norm_topk_prob)?,
            decoder_sparse_step: k.count("decoder_sparse_step", Some(1), 1..=MAX_STRIDE)?,
            mlp_only_layers,
        })
    }

    /// transformers: layer `i` is MoE iff `i ∉ mlp_only_layers`, `num_experts > 0` and
    /// `(i + 1) % decoder_sparse_step == 0`.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        !self.mlp_only_layers.contains(&i)
            && self.num_experts > 0
            && (i + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }
}

#[cfg(test)]
mod tests;
