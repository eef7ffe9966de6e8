//! `MistralForCausalLM`: Llama-style GQA (no q/k norm, no biases), `head_dim` possibly
//! different from `hidden_size / num_attention_heads`, optional `sliding_window` on every
//! layer — or, with `layer_types`, on the `sliding_attention` layers only (transformers then
//! reads the config as Ministral's: `AutoConfig` turns `model_type: mistral` with a
//! `layer_types` key into `ministral`, as Ministral-8B's checkpoint has it) — SwiGLU MLP.
//! HF (NeoX-ordered) weights.
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
    /// Applied to every layer when set (HF `create_sliding_window_causal_mask`), or to the
    /// `sliding_attention` layers of `layer_types`; HF defaults it to 4096 when the key is
    /// absent (`null` disables it).
    pub sliding_window: Option<usize>,
    /// `full_attention` / `sliding_attention` per layer (Ministral's reading); `None` when
    /// absent or `null` (every layer then has `sliding_window`).
    pub layer_types: Option<Vec<String>>,
}

impl Config {
    /// Parses and validates every key `MistralConfig` honours (types, `null`, ranges);
    /// every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        use config::limits::*;
        let k = config::Keys::new(raw)?;
        let defaults = config::DecoderDefaults {
            max_position_embeddings: 4096 * 32,
            reads_attention_bias: false,
            intermediate_size: 14336,
            vocab_size: 32000,
            hidden_size: 4096,
            num_hidden_layers: 32,
            num_attention_heads: 32,
        };
        let base = DecoderConfig::read(&k, &defaults)?;
        let c = Config {
            num_key_value_heads: Some(k.count("num_key_value_heads", Some(8), 1..=MAX_HEADS)?),
            head_dim: k.opt_count("head_dim", None, 1..=MAX_HEAD_DIM)?,
            sliding_window: k.opt_count("sliding_window", Some(4096), 1..=MAX_POSITIONS)?,
            layer_types: k.opt_string_list("layer_types")?,
            base,
        };
        c.base.check(c.kv_heads(), c.head_dim())?;
        c.base.rope(raw, 10_000.0, 1.0)?;
        c.windows()?;
        Ok(c)
    }

    /// Sliding window of each layer: `sliding_window` on every layer, or with `layer_types`
    /// on its `sliding_attention` layers only (transformers' `MinistralAttention`).
    pub fn windows(&self) -> Result<Vec<Option<usize>>> {
        let n = self.base.num_hidden_layers;
        match &self.layer_types {
            Some(types) => {
                let types = config::check_layer_types(types, n, &["full_attention", "sliding_attention"], false)?;
                Ok(types.iter().map(|t| if t == "sliding_attention" { self.sliding_window } else { None }).collect())
            }
            None => Ok(vec![self.sliding_window; n]),
        }
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
    Ok(MapContext::decoder(raw, &c.base, c.kv_heads(), c.head_dim(), 0))
}

fn describe(raw: &Value) -> Result<String> {
    let c = Config::from_value(raw)?;
    Ok(format!(
        "Mistral: {} layers, hidden {}, {} heads / {} KV heads of {}, MLP {}, vocab {}, sliding window: {:?} (layers: {:?}), tied embeddings: {}",
        c.base.num_hidden_layers,
        c.base.hidden_size,
        c.base.num_attention_heads,
        c.kv_heads(),
        c.head_dim(),
        c.base.intermediate_size,
        c.base.vocab_size,
        c.sliding_window,
        c.windows()?,
        c.base.tie_word_embeddings
    ))
}

/// Builds the model from loaded weight slots (the shared Llama-style decoder).
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let c = Config::from_value(lc.config)?;
    let attn = |win| AttentionConfig::gqa(c.base.num_attention_heads, c.kv_heads(), c.head_dim(), win);
    let layers = c.windows()?.into_iter().map(|win| load::LlamaLayer { attn: attn(win), qk_norm: false, moe: None });
    let rope = c.base.rope(lc.config, 10_000.0, 1.0)?;
    load::llama_decoder(lc, w, "MistralForCausalLM", &c.base, &rope, layers.collect())
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
