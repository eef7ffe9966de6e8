//! `LlamaForCausalLM` (Llama 2 / 3 / 3.1 / 3.2, SmolLM2): GQA with RoPE (`rope_scaling` via `rope_params`),
//! q/k/v/o biases with `attention_bias`, gate/up/down biases with `mlp_bias`, SwiGLU, tied or untied
//! embeddings; `pretraining_tp` is ignored, as HF ignores it at inference. Names: `weight-maps/llama.toml`.

use porter_core::config::{self, DecoderConfig, RopeParams};
use porter_core::{build as load, nn::AttentionConfig, LoadContext, MapContext, Model, ModelEntry, Result, Weights};
use serde_json::Value;

/// The weight map (the shared Llama layout as is).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/llama.toml");

/// `config.json` of a Llama checkpoint (HF `LlamaConfig`; unknown keys ignored).
#[derive(Debug, Clone)]
pub struct Config {
    /// Keys shared by every decoder-only architecture.
    pub base: DecoderConfig,
    /// HF (`int | None`): `num_attention_heads` when absent or `null`.
    pub num_key_value_heads: Option<usize>,
    /// HF (`int | None`): `hidden_size / num_attention_heads` when absent or `null`.
    pub head_dim: Option<usize>,
    /// Biases on `gate_proj`, `up_proj` and `down_proj`.
    pub mlp_bias: bool,
}

impl Config {
    /// Parses and validates every key `LlamaConfig` honours (types, `null`, ranges), with the
    /// RoPE parameters; every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<(Self, RopeParams)> {
        use config::limits::*;
        let k = config::Keys::new(raw)?;
        let defaults = config::DecoderDefaults {
            max_position_embeddings: 2048,
            reads_attention_bias: true,
            intermediate_size: 11008,
            vocab_size: 32000,
            hidden_size: 4096,
            num_hidden_layers: 32,
            num_attention_heads: 32,
        };
        let base = DecoderConfig::read(&k, &defaults)?;
        // LlamaConfig.validate_architecture.
        if !base.hidden_size.is_multiple_of(base.num_attention_heads) {
            return Err(porter_core::Error::key(
                "hidden_size",
                base.hidden_size,
                format!("must be a multiple of num_attention_heads = {}", base.num_attention_heads),
            ));
        }
        // Read for its type only: transformers ignores it at inference, and so does porter.
        k.opt_count("pretraining_tp", Some(1), 1..=MAX_HEADS)?;
        let c = Config {
            num_key_value_heads: k.opt_count("num_key_value_heads", None, 1..=MAX_HEADS)?,
            head_dim: k.opt_count("head_dim", None, 1..=MAX_HEAD_DIM)?,
            mlp_bias: k.flag("mlp_bias", false)?,
            base,
        };
        c.base.check(c.kv_heads(), c.head_dim())?;
        let rope = c.base.rope(raw, 10_000.0, 1.0)?;
        Ok((c, rope))
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.base.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.base.hidden_size / self.base.num_attention_heads.max(1))
    }
}

fn map_context(raw: &Value) -> Result<MapContext> {
    let c = Config::from_value(raw)?.0;
    let mut ctx = MapContext::decoder(raw, &c.base, c.kv_heads(), c.head_dim(), 0);
    ctx.set_flag("mlp_bias", c.mlp_bias);
    Ok(ctx)
}

fn describe(raw: &Value) -> Result<String> {
    let (c, rope) = Config::from_value(raw)?;
    Ok(format!("Llama: {c:?}; {} KV heads of {}; {rope:?}", c.kv_heads(), c.head_dim()))
}

/// Builds the model from loaded weight slots (the shared Llama-style decoder).
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let (c, rope) = Config::from_value(lc.config)?;
    let attn = AttentionConfig::gqa(c.base.num_attention_heads, c.kv_heads(), c.head_dim(), None);
    let layers = vec![load::LlamaLayer { attn, qk_norm: false, moe: None }; c.base.num_hidden_layers];
    load::llama_decoder(lc, w, "LlamaForCausalLM", &c.base, &rope, layers)
}

porter_core::inventory::submit! {
    ModelEntry { architecture: "LlamaForCausalLM", crate_name: "llama", weight_map: WEIGHT_MAP, map_context, describe, build }
}
