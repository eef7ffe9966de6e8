//! `Qwen3ForCausalLM`: dense Qwen3 (GQA with per-head q/k RMSNorm before RoPE, SwiGLU MLP,
//! tied or untied embeddings, optional sliding-window layers).
//!
//! Config → layers → model, following candle-transformers' `qwen3.rs`. Checkpoint names
//! live only in `weight-maps/qwen3.toml`.

use porter_core::build as load;
use porter_core::config::{self, DecoderConfig};
use porter_core::nn::AttentionConfig;
use porter_core::Result;
use porter_core::{LoadContext, MapContext, Model, ModelEntry, Weights};
use serde_json::Value;

/// The weight map (the single source of truth for checkpoint names).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/qwen3.toml");

/// `config.json` of a Qwen3 checkpoint (HF `Qwen3Config`; unknown keys ignored).
#[derive(Debug, Clone)]
pub struct Config {
    /// Keys shared by every decoder-only architecture.
    pub base: DecoderConfig,
    /// HF: 32 when absent, `num_attention_heads` when `null`.
    pub num_key_value_heads: Option<usize>,
    /// HF: 128 when absent (not hidden / heads); `null` is rejected (an `int` field).
    pub head_dim: Option<usize>,
    pub use_sliding_window: bool,
    /// HF: 4096 when absent, no window when `null`; only used with `use_sliding_window`.
    pub sliding_window: Option<usize>,
    /// HF: 28 when absent.
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
}

impl Config {
    /// Parses and validates every key `Qwen3Config` honours (types, `null`, ranges);
    /// every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        use config::limits::*;
        let k = config::Keys::new(raw)?;
        let defaults = config::DecoderDefaults {
            max_position_embeddings: 32768,
            reads_attention_bias: true,
            intermediate_size: 22016,
            vocab_size: 151936,
            hidden_size: 4096,
            num_hidden_layers: 32,
            num_attention_heads: 32,
        };
        let base = DecoderConfig::read(&k, &defaults)?;
        let c = Config {
            num_key_value_heads: k.opt_count("num_key_value_heads", Some(32), 1..=MAX_HEADS)?,
            head_dim: Some(k.count("head_dim", Some(128), 1..=MAX_HEAD_DIM)?),
            use_sliding_window: k.flag("use_sliding_window", false)?,
            sliding_window: k.opt_count("sliding_window", Some(4096), 1..=MAX_POSITIONS)?,
            max_window_layers: Some(k.count("max_window_layers", Some(28), 0..=MAX_STRIDE)?),
            layer_types: k.opt_string_list("layer_types")?,
            base,
        };
        c.base.check(c.kv_heads(), c.head_dim())?;
        c.base.rope(raw, 10_000.0, 1.0)?;
        c.windows()?;
        Ok(c)
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.base.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        // HF Qwen3Config defaults head_dim to 128 (not hidden / heads).
        self.head_dim.unwrap_or(128)
    }

    /// Sliding window of each layer (HF: `layer_types`, else `use_sliding_window` with
    /// `max_window_layers`).
    pub fn windows(&self) -> Result<Vec<Option<usize>>> {
        // HF Qwen3Config: sliding_window only counts with use_sliding_window; layer_types
        // defaults to sliding for layers i >= max_window_layers (default 28).
        let sw = if self.use_sliding_window { self.sliding_window } else { None };
        match &self.layer_types {
            Some(types) => {
                let types = config::check_layer_types(
                    types,
                    self.base.num_hidden_layers,
                    &["full_attention", "sliding_attention"],
                    false,
                )?;
                Ok(types.iter().map(|t| if t == "sliding_attention" { sw } else { None }).collect())
            }
            None => {
                let first = self.max_window_layers.unwrap_or(28);
                Ok((0..self.base.num_hidden_layers).map(|i| if i >= first { sw } else { None }).collect())
            }
        }
    }
}

fn map_context(raw: &Value) -> Result<MapContext> {
    let c = Config::from_value(raw)?;
    Ok(MapContext::decoder(raw, &c.base, c.kv_heads(), c.head_dim(), 0))
}

fn describe(raw: &Value) -> Result<String> {
    let c = Config::from_value(raw)?;
    Ok(format!(
        "Qwen3: {} layers, hidden {}, {} heads / {} KV heads of {}, MLP {}, vocab {}, tied embeddings: {}, sliding windows: {:?}",
        c.base.num_hidden_layers,
        c.base.hidden_size,
        c.base.num_attention_heads,
        c.kv_heads(),
        c.head_dim(),
        c.base.intermediate_size,
        c.base.vocab_size,
        c.base.tie_word_embeddings,
        c.windows()?
    ))
}

/// Builds the model from loaded weight slots (the shared Llama-style decoder).
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let c = Config::from_value(lc.config)?;
    let attn = |win| AttentionConfig::gqa(c.base.num_attention_heads, c.kv_heads(), c.head_dim(), win);
    let layers = c.windows()?.into_iter().map(|win| load::LlamaLayer { attn: attn(win), qk_norm: true, moe: None });
    let rope = c.base.rope(lc.config, 10_000.0, 1.0)?;
    load::llama_decoder(lc, w, "Qwen3ForCausalLM", &c.base, &rope, layers.collect())
}

porter_core::inventory::submit! {
    ModelEntry {
        architecture: "Qwen3ForCausalLM",
        crate_name: "qwen3",
        weight_map: WEIGHT_MAP,
        map_context,
        describe,
        build,
    }
}
