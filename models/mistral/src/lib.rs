//! `MistralForCausalLM`: Llama-style GQA (no q/k norm, no biases), `head_dim` possibly
//! different from `hidden_size / num_attention_heads`, optional `sliding_window` on every
//! layer, SwiGLU MLP. HF (NeoX-ordered) weights.
//!
//! Checkpoint names live only in `weight-maps/mistral.toml`.

use anyhow::Result;
use porter_core::config;
use porter_core::nn::{self, load, AttentionConfig, DecoderLayer, Embedding, FeedForward, NormHead, NormKind, Rope};
use porter_core::{LoadContext, MapContext, Model, ModelEntry, ModelInfo, TransformerLayer, Weights};
use serde::Deserialize;
use serde_json::Value;

/// The weight map (the single source of truth for checkpoint names).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/mistral.toml");

fn default_eps() -> f64 {
    1e-6
}
fn default_act() -> String {
    "silu".into()
}
fn default_kv_heads() -> Option<usize> {
    Some(8)
}
fn default_window() -> Option<usize> {
    Some(4096)
}

/// `config.json` of a Mistral checkpoint (HF `MistralConfig`; unknown keys ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// HF `MistralConfig` defaults this to 8 when absent.
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Applied to every layer when set (HF `create_sliding_window_causal_mask`); HF
    /// defaults it to 4096 when the key is absent (`null` disables it).
    #[serde(default = "default_window")]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

impl Config {
    /// Parses and validates; every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        let c: Config = config::parse_typed(raw, "Mistral")?;
        nn::check_dims(
            c.hidden_size,
            c.num_attention_heads,
            c.kv_heads(),
            c.head_dim(),
            c.vocab_size,
            c.num_hidden_layers,
        )?;
        nn::check_act(&c.hidden_act)?;
        config::rope_params(raw, 10_000.0, 1.0)?;
        if c.sliding_window == Some(0) {
            anyhow::bail!("sliding_window must be positive or null");
        }
        Ok(c)
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }
}

fn map_context(raw: &Value) -> Result<MapContext> {
    let c = Config::from_value(raw)?;
    let mut ctx = MapContext::from_config(raw, c.num_hidden_layers, 0);
    ctx.set_dim("head_dim", c.head_dim())
        .set_dim("num_key_value_heads", c.kv_heads())
        .set_flag("tie_word_embeddings", c.tie_word_embeddings);
    Ok(ctx)
}

fn describe(raw: &Value) -> Result<String> {
    let c = Config::from_value(raw)?;
    Ok(format!(
        "Mistral: {} layers, hidden {}, {} heads / {} KV heads of {}, MLP {}, vocab {}, sliding window: {:?}, tied embeddings: {}",
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.kv_heads(),
        c.head_dim(),
        c.intermediate_size,
        c.vocab_size,
        c.sliding_window,
        c.tie_word_embeddings
    ))
}

/// Builds the model from loaded weight slots.
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let c = Config::from_value(lc.config)?;
    let rope_params = config::rope_params(lc.config, 10_000.0, 1.0)?;
    let eps = c.rms_norm_eps as f32;
    let mut layers: Vec<Box<dyn TransformerLayer>> = Vec::with_capacity(c.num_hidden_layers);
    for i in 0..c.num_hidden_layers {
        let p = format!("layers.{i}");
        let cfg = AttentionConfig {
            heads: c.num_attention_heads,
            kv_heads: c.kv_heads(),
            head_dim: c.head_dim(),
            window: c.sliding_window,
            output_gate: false,
            scale: 1.0 / (c.head_dim() as f32).sqrt(),
        };
        layers.push(Box::new(DecoderLayer {
            input_norm: load::norm(w, &format!("{p}.input_norm"), eps, NormKind::Standard)?,
            attn: load::attention(w, &format!("{p}.attn"), cfg, Rope::new(&rope_params, c.head_dim())?, None)?,
            post_norm: load::norm(w, &format!("{p}.post_norm"), eps, NormKind::Standard)?,
            ffn: FeedForward::Dense(Box::new(load::swiglu(w, &format!("{p}.mlp"))?)),
        }));
    }
    let embed = w.take("embed")?;
    let lm_head = if c.tie_word_embeddings { embed.clone() } else { w.take("lm_head")? };
    Ok(Model {
        info: ModelInfo {
            architecture: "MistralForCausalLM".into(),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            num_layers: c.num_hidden_layers,
            dtype: lc.dtype,
            max_position_embeddings: c.max_position_embeddings,
            generation: config::generation_config(lc.dir, lc.config)?,
        },
        pre: Box::new(Embedding { table: embed }),
        layers,
        post: Box::new(NormHead { norm: load::norm(w, "norm", eps, NormKind::Standard)?, lm_head }),
    })
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
