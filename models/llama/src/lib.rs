//! `LlamaForCausalLM` (Llama 2 / 3 / 3.1 / 3.2, SmolLM2): GQA with RoPE (`rope_scaling` via
//! `config::rope_params`), q/k/v/o biases with `attention_bias`, gate/up/down biases with
//! `mlp_bias`, SwiGLU, tied or untied embeddings. `pretraining_tp` is ignored, as HF ignores
//! it at inference. Checkpoint names: `weight-maps/llama.toml` (the shared Llama layout).

use porter_core::build as load;
use porter_core::config::{self, DecoderConfig};
use porter_core::nn::AttentionConfig;
use porter_core::Result;
use porter_core::{LoadContext, MapContext, Model, ModelEntry, Weights};
use serde::Deserialize;
use serde_json::Value;

/// The weight map (the single source of truth for checkpoint names).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/llama.toml");

/// `config.json` of a Llama checkpoint (HF `LlamaConfig`; unknown keys ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    /// Keys shared by every decoder-only architecture.
    #[serde(flatten)]
    pub base: DecoderConfig,
    /// HF default: `num_attention_heads`.
    pub num_key_value_heads: Option<usize>,
    /// HF default: `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub mlp_bias: bool,
}

impl Config {
    /// Parses and validates; every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        let c: Config = config::parse_typed(raw, "Llama")?;
        c.base.check(c.kv_heads(), c.head_dim())?;
        config::rope_params(raw, 10_000.0, 1.0)?;
        Ok(c)
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.base.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.base.hidden_size / self.base.num_attention_heads.max(1))
    }
}

fn map_context(raw: &Value) -> Result<MapContext> {
    let c = Config::from_value(raw)?;
    let mut ctx = MapContext::from_config(raw, c.base.num_hidden_layers, 0);
    ctx.set_dim("head_dim", c.head_dim())
        .set_dim("num_key_value_heads", c.kv_heads())
        .set_flag("tie_word_embeddings", c.base.tie_word_embeddings)
        .set_flag("attention_bias", c.base.attention_bias)
        .set_flag("mlp_bias", c.mlp_bias);
    Ok(ctx)
}

fn describe(raw: &Value) -> Result<String> {
    let c = Config::from_value(raw)?;
    let b = &c.base;
    Ok(format!(
        "Llama: {} layers, hidden {}, {} heads / {} KV heads of {}, MLP {}, vocab {}, tied embeddings: {}, biases: attention {} / MLP {}, RoPE {:?}",
        b.num_hidden_layers, b.hidden_size, b.num_attention_heads, c.kv_heads(), c.head_dim(), b.intermediate_size,
        b.vocab_size, b.tie_word_embeddings, b.attention_bias, c.mlp_bias, config::rope_params(raw, 10_000.0, 1.0)?
    ))
}

/// Builds the model from loaded weight slots.
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let c = Config::from_value(lc.config)?;
    let attn = AttentionConfig::gqa(c.base.num_attention_heads, c.kv_heads(), c.head_dim(), None);
    let layers = vec![load::LlamaLayer { attn, qk_norm: false, moe: None }; c.base.num_hidden_layers];
    load::llama_decoder(lc, w, "LlamaForCausalLM", &c.base, &config::rope_params(lc.config, 10_000.0, 1.0)?, layers)
}

porter_core::inventory::submit! {
    ModelEntry { architecture: "LlamaForCausalLM", crate_name: "llama", weight_map: WEIGHT_MAP, map_context, describe, build }
}
