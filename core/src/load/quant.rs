//! FP8 weights: the `quantization_config` of Qwen's block-FP8 checkpoints
//! (`Qwen/Qwen3-Next-80B-A3B-Instruct-FP8` and the other Qwen3 FP8 checkpoints), the naming
//! rule of their scale tensors, and which tensors stay in the model dtype — declared here once
//! for every model (vLLM's `Fp8Config` / `Fp8LinearMethod`), never in a weight map.
//!
//! A quantized linear `X.weight` is stored as `F8_E4M3` `[out, in]` next to
//! `X.weight_scale_inv`, `F32` `[ceil(out/128), ceil(in/128)]`; despite its name the scale
//! multiplies: `W = e4m3(q) · scale` of the weight's 128 × 128 block.

use crate::error::{Error, Result};
use serde_json::Value;

/// The suffix of a quantized weight's scale tensor (`X.weight` → `X.weight_scale_inv`).
pub const SCALE_SUFFIX: &str = "_scale_inv";

/// Side of a weight block sharing one scale.
pub const FP8_BLOCK: usize = porter_kernels::cpu::fp8::BLOCK;

/// Name fragments of tensors that are never quantized (embeddings, lm_head, every norm, the MoE
/// router `mlp.gate`, `shared_expert_gate`, Gated DeltaNet's `in_proj_ba` (64 rows, under one
/// block), `conv1d`, `A_log`, `dt_bias`, the MTP `mtp.fc`): what stays bf16 in Qwen's FP8
/// checkpoints, and what `--quantize fp8` leaves alone.
///
/// Draft heads follow the same rules (`--quantize fp8` applies to them as to the main model):
/// in Qwen3-Next's MTP layer `mtp.fc` and every norm stay dense, its attention and experts are
/// FP8, its router and `shared_expert_gate` stay dense as the main model's do. The FFN-only
/// heads' input projection (`mtp.eh_proj` of `mistral_mtp`, LightLLM's `model.layers.{m}.proj`
/// of `qwen3_moe_mtp`) is their `mtp.fc` and stays dense too: vLLM builds DeepSeek-style
/// `eh_proj` as a plain, never quantized `nn.Linear`.
pub const KEEP: &[&str] = &[
    "embed_tokens",
    "lm_head",
    "norm",
    ".mlp.gate.weight",
    "shared_expert_gate",
    "in_proj_ba",
    "conv1d",
    "A_log",
    "dt_bias",
    "mtp.fc",
    "eh_proj",
    ".proj.weight",
];

/// Online quantization requested at load (`--quantize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantize {
    /// Block-128 e4m3 weights, the layout of Qwen's FP8 checkpoints.
    Fp8,
}

impl std::str::FromStr for Quantize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "fp8" => Ok(Quantize::Fp8),
            other => Err(format!("unknown quantization `{other}` (expected fp8)")),
        }
    }
}

/// A checkpoint's `quantization_config` (only the block-FP8 scheme is supported).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantConfig {
    /// `quant_method`: `"fp8"`.
    pub quant_method: String,
    /// `fmt`: `"e4m3"`.
    pub fmt: String,
    /// `activation_scheme`: `"dynamic"` (weights-only here: activations stay in the model dtype).
    pub activation_scheme: String,
    /// `weight_block_size`: `[128, 128]`.
    pub weight_block_size: [usize; 2],
    /// `modules_to_not_convert`: name fragments kept unquantized in addition to [`KEEP`].
    pub modules_to_not_convert: Vec<String>,
}

impl QuantConfig {
    /// The configuration `--quantize fp8` applies (the checkpoint's `modules_to_not_convert`,
    /// if it has a `quantization_config`, is not consulted: a quantized checkpoint is loaded as
    /// it is).
    pub fn fp8() -> Self {
        Self {
            quant_method: "fp8".into(),
            fmt: "e4m3".into(),
            activation_scheme: "dynamic".into(),
            weight_block_size: [FP8_BLOCK, FP8_BLOCK],
            modules_to_not_convert: Vec::new(),
        }
    }

    /// Reads `quantization_config` from `config.json` (`None` when absent or null). Every key
    /// is checked; an unsupported value is an [`Error::ConfigKey`] naming the key.
    pub fn from_config(config: &Value) -> Result<Option<Self>> {
        let q = match config.get("quantization_config") {
            None | Some(Value::Null) => return Ok(None),
            Some(q) => q,
        };
        let key = |k: &str| format!("quantization_config.{k}");
        let obj = q.as_object().ok_or_else(|| Error::key("quantization_config", q, "must be an object"))?;
        let text = |k: &str, want: &str, required: bool| -> Result<String> {
            match obj.get(k) {
                None if !required => Ok(want.to_owned()),
                Some(Value::String(s)) if s.eq_ignore_ascii_case(want) => Ok(want.to_owned()),
                Some(v) => Err(Error::key(key(k), v, format!("porter supports only \"{want}\" (block-128 FP8)"))),
                None => Err(Error::key(key(k), "missing", format!("required; porter supports \"{want}\""))),
            }
        };
        let quant_method = text("quant_method", "fp8", true)?;
        let fmt = text("fmt", "e4m3", false)?;
        let activation_scheme = text("activation_scheme", "dynamic", false)?;
        let block = obj.get("weight_block_size").ok_or_else(|| {
            Error::key(key("weight_block_size"), "missing", "required: porter supports block-wise FP8 [128, 128]")
        })?;
        let ok =
            block.as_array().is_some_and(|a| a.len() == 2 && a.iter().all(|v| v.as_u64() == Some(FP8_BLOCK as u64)));
        if !ok {
            return Err(Error::key(key("weight_block_size"), block, "porter supports only [128, 128]"));
        }
        let modules_to_not_convert = match obj.get("modules_to_not_convert") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| Error::key(key("modules_to_not_convert"), v, "must be a list of strings"))
                })
                .collect::<Result<_>>()?,
            Some(v) => return Err(Error::key(key("modules_to_not_convert"), v, "must be a list of strings")),
        };
        Ok(Some(Self {
            quant_method,
            fmt,
            activation_scheme,
            weight_block_size: [FP8_BLOCK, FP8_BLOCK],
            modules_to_not_convert,
        }))
    }

    /// Whether checkpoint tensor `name` of `shape` is quantized by online quantization: a 2-D
    /// `*.weight` none of whose name fragments is in [`KEEP`] or `modules_to_not_convert`.
    pub fn quantizes(&self, name: &str, shape: &[usize]) -> bool {
        shape.len() == 2
            && name.ends_with(".weight")
            && !KEEP.iter().any(|k| name.contains(k))
            && !self.modules_to_not_convert.iter().any(|k| !k.is_empty() && name.contains(k.as_str()))
    }

    /// One line for `porter inspect`.
    pub fn describe(&self) -> String {
        format!(
            "{} {} weights, {}x{} blocks, activations {} (computed in the model dtype), {} modules_to_not_convert",
            self.quant_method,
            self.fmt,
            self.weight_block_size[0],
            self.weight_block_size[1],
            self.activation_scheme,
            self.modules_to_not_convert.len()
        )
    }
}

/// What a model's linear weights become: counts and bytes (for `porter inspect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantSummary {
    /// 2-D `*.weight` checkpoint tensors loaded as FP8.
    pub fp8_linears: usize,
    /// 2-D `*.weight` checkpoint tensors kept dense (embeddings, lm_head, router, …).
    pub kept_linears: usize,
    /// Bytes of the FP8 tensors: e4m3 bytes plus f32 scales.
    pub fp8_bytes: usize,
    /// Bytes of the dense 2-D weights as stored in the checkpoint.
    pub kept_bytes: usize,
}

/// Counts the linear weights of `map` that load as FP8 from `ckpt` (stored FP8, or quantized
/// online by `online`) and those kept dense.
pub fn summary(
    map: &crate::load::weight_map::ResolvedMap,
    ckpt: &crate::load::checkpoint::Checkpoint,
    online: Option<&QuantConfig>,
) -> QuantSummary {
    let mut s = QuantSummary::default();
    for slot in &map.slots {
        for (src, shape) in slot.sources.iter().zip(&slot.source_shapes) {
            if shape.len() != 2 || !src.ends_with(".weight") {
                continue;
            }
            let n: usize = shape.iter().product();
            if ckpt.is_fp8(src) || online.is_some_and(|q| q.quantizes(src, shape)) {
                s.fp8_linears += 1;
                s.fp8_bytes += n + 4 * scale_shape(shape).iter().product::<usize>();
            } else {
                s.kept_linears += 1;
                s.kept_bytes += ckpt.get(src).map_or(2 * n, |i| i.end - i.start);
            }
        }
    }
    s
}

/// The `quantization :` line of `porter inspect`: the checkpoint's scheme and what it loads
/// as, or what `--quantize fp8` would do to a dense checkpoint.
pub fn inspect_line(p: &crate::load::registry::Prepared) -> String {
    inspect_line_for(&p.map, &p.checkpoint, p.quant.as_ref())
}

/// [`inspect_line`] for any resolved map (a draft head's too): `quant` is the checkpoint's
/// `quantization_config` (`None`: dense, and the line says what `--quantize fp8` would make
/// of it).
pub fn inspect_line_for(
    map: &crate::load::weight_map::ResolvedMap,
    ckpt: &crate::load::checkpoint::Checkpoint,
    quant: Option<&QuantConfig>,
) -> String {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    match quant {
        Some(q) => {
            let s = summary(map, ckpt, None);
            format!(
                "{}; {} linears FP8 ({:.2} MiB with scales), {} kept dense ({:.2} MiB)",
                q.describe(),
                s.fp8_linears,
                mib(s.fp8_bytes),
                s.kept_linears,
                mib(s.kept_bytes)
            )
        }
        None => {
            let s = summary(map, ckpt, Some(&QuantConfig::fp8()));
            format!(
                "none (dense); --quantize fp8 would make {} linears FP8 ({:.2} MiB with scales) and keep {} dense ({:.2} MiB)",
                s.fp8_linears,
                mib(s.fp8_bytes),
                s.kept_linears,
                mib(s.kept_bytes)
            )
        }
    }
}

/// The scale tensor of quantized weight `name`.
pub fn scale_name(name: &str) -> String {
    format!("{name}{SCALE_SUFFIX}")
}

/// The scale shape of a `[out, in]` weight: `[ceil(out/128), ceil(in/128)]`.
pub fn scale_shape(shape: &[usize]) -> Vec<usize> {
    shape.iter().map(|d| d.div_ceil(FP8_BLOCK)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_qwens_config_and_rejects_the_rest_naming_the_key() {
        let ok = json!({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]}});
        let q = QuantConfig::from_config(&ok).unwrap().unwrap();
        assert_eq!(q.modules_to_not_convert.len(), 2);
        assert!(QuantConfig::from_config(&json!({})).unwrap().is_none());
        for (k, v) in [
            ("quant_method", json!("gptq")),
            ("fmt", json!("e5m2")),
            ("activation_scheme", json!("static")),
            ("weight_block_size", json!([64, 64])),
            ("weight_block_size", json!(null)),
            ("modules_to_not_convert", json!("lm_head")),
        ] {
            let mut c = ok.clone();
            c["quantization_config"][k] = v.clone();
            let e = QuantConfig::from_config(&c).unwrap_err();
            assert!(
                matches!(&e, Error::ConfigKey { key, .. } if key == &format!("quantization_config.{k}")),
                "{k}={v}: {e}"
            );
        }
        assert!(QuantConfig::from_config(&json!({"quantization_config": 3})).is_err());
    }

    #[test]
    fn keeps_the_bf16_modules() {
        let q = QuantConfig { modules_to_not_convert: vec!["layers.1.mlp".into()], ..QuantConfig::fp8() };
        for (name, quant) in [
            ("model.layers.0.self_attn.q_proj.weight", true),
            ("model.layers.0.mlp.experts.3.down_proj.weight", true),
            ("model.layers.0.mlp.shared_expert.up_proj.weight", true),
            ("model.layers.0.linear_attn.in_proj_qkvz.weight", true),
            ("model.layers.0.mlp.gate.weight", false),
            ("model.layers.0.mlp.gate_proj.weight", true),
            ("model.layers.0.mlp.shared_expert_gate.weight", false),
            ("model.layers.0.linear_attn.in_proj_ba.weight", false),
            ("model.embed_tokens.weight", false),
            ("lm_head.weight", false),
            ("mtp.fc.weight", false),
            ("mtp.layers.0.self_attn.q_proj.weight", true),
            ("mtp.layers.0.mlp.experts.1.up_proj.weight", true),
            ("mtp.layers.0.mlp.shared_expert.down_proj.weight", true),
            ("mtp.layers.0.mlp.gate.weight", false),
            ("mtp.layers.0.mlp.shared_expert_gate.weight", false),
            ("mtp.eh_proj.weight", false),
            ("mtp.layers.0.mlp.gate_proj.weight", true),
            ("model.layers.0.proj.weight", false),
            ("model.layers.0.mlp.experts.0.down_proj.weight", true),
            ("model.layers.1.mlp.down_proj.weight", false),
            ("model.layers.0.self_attn.q_proj.bias", false),
        ] {
            assert_eq!(q.quantizes(name, &[256, 64]), quant, "{name}");
        }
        assert!(!q.quantizes("model.layers.0.input_layernorm.weight", &[64]));
        assert_eq!(scale_shape(&[576, 1536]), vec![5, 12]);
    }
}
