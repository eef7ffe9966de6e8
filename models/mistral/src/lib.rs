//! `MistralForCausalLM`: Llama-style GQA (no q/k norm, no biases), `head_dim` possibly
//! different from `hidden_size / num_attention_heads`, optional `sliding_window` on every
//! layer, SwiGLU MLP. HF (NeoX-ordered) weights.
//!
//! Checkpoint names live only in `weight-maps/mistral.toml`.

use porter_core::build as load;
use porter_core::config::{self, DecoderConfig};
use porter_core::nn::AttentionConfig;
use porter_core::Result;
use porter_core::{LoadContext, MapContext, Model, ModelEntry, Weights};
use serde_json::Value;

/// The weight map (the single source of truth for checkpoint names).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/mistral.toml");

/// `config.json` of a Mistral checkpoint (HF `MistralConfig`; unknown keys ignored).
#[derive(Debug, Clone)]
pub struct Config {
    /// Keys shared by every decoder-only architecture (`attention_bias` is not read:
    /// Mistral's projections have no bias).
    pub base: DecoderConfig,
    /// HF `MistralConfig` defaults this to 8 when absent; `null` is rejected (an `int`).
    pub num_key_value_heads: Option<usize>,
    /// `null` or absent: hidden / heads.
    pub head_dim: Option<usize>,
    /// Applied to every layer when set (HF `create_sliding_window_causal_mask`); HF
    /// defaults it to 4096 when the key is absent (`null` disables it).
    pub sliding_window: Option<usize>,
}

impl Config {
    /// Parses and validates every key `MistralConfig` honours (types, `null`, ranges);
    /// every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        use config::limits::*;
        let k = config::Keys::new(raw)?;
        let defaults = config::DecoderDefaults { max_position_embeddings: 4096 * 32, reads_attention_bias: false };
        let base = DecoderConfig::read(&k, &defaults)?;
        let c = Config {
            num_key_value_heads: Some(k.count("num_key_value_heads", Some(8), 1..=MAX_HEADS)?),
            head_dim: k.opt_count("head_dim", None, 1..=MAX_HEAD_DIM)?,
            sliding_window: k.opt_count("sliding_window", Some(4096), 1..=MAX_POSITIONS)?,
            base,
        };
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
        .set_flag("tie_word_embeddings", c.base.tie_word_embeddings);
    Ok(ctx)
}

fn describe(raw: &Value) -> Result<String> {
    let c = Config::from_value(raw)?;
    Ok(format!(
        "Mistral: {} layers, hidden {}, {} heads / {} KV heads of {}, MLP {}, vocab {}, sliding window: {:?}, tied embeddings: {}",
        c.base.num_hidden_layers,
        c.base.hidden_size,
        c.base.num_attention_heads,
        c.kv_heads(),
        c.head_dim(),
        c.base.intermediate_size,
        c.base.vocab_size,
        c.sliding_window,
        c.base.tie_word_embeddings
    ))
}

/// Builds the model from loaded weight slots (the shared Llama-style decoder).
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let c = Config::from_value(lc.config)?;
    let attn = AttentionConfig::gqa(c.base.num_attention_heads, c.kv_heads(), c.head_dim(), c.sliding_window);
    let layers = vec![load::LlamaLayer { attn, qk_norm: false, moe: None }; c.base.num_hidden_layers];
    let rope = config::rope_params(lc.config, 10_000.0, 1.0)?;
    load::llama_decoder(lc, w, "MistralForCausalLM", &c.base, &rope, layers)
}

porter_core::inventory::submit! {
    ModelEntry {
        architecture: "MistralForCausalLM",
        crate_name: "mistral",
        weight_map: WEIGHT_MAP,
        map_context,
        describe,
        build,
    }
}
