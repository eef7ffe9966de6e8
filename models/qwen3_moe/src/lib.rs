//! `Qwen3MoeForCausalLM`: Qwen3 attention (per-head q/k RMSNorm before RoPE) with sparse
//! MoE feed-forward layers (softmax router → top-k → optional renormalisation); dense
//! SwiGLU on `mlp_only_layers` and on layers where `(i+1) % decoder_sparse_step != 0`.
//!
//! Checkpoint names live only in `weight-maps/qwen3_moe.toml`.

use porter_core::build as load;
use porter_core::config::{self, DecoderConfig};
use porter_core::nn::{AttentionConfig, DecoderLayer, NormKind, Rope};
use porter_core::{bail, Result};
use porter_core::{LoadContext, MapContext, Model, ModelEntry, TransformerLayer, Weights};
use serde::Deserialize;
use serde_json::Value;

/// The weight map (the single source of truth for checkpoint names).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/qwen3_moe.toml");

fn one() -> usize {
    1
}

/// `config.json` of a Qwen3-MoE checkpoint (HF `Qwen3MoeConfig`; unknown keys ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    /// Keys shared by every decoder-only architecture.
    #[serde(flatten)]
    pub base: DecoderConfig,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub use_sliding_window: bool,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
}

impl Config {
    /// Parses and validates; every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        let c: Config = config::parse_typed(raw, "Qwen3-MoE")?;
        c.base.check(c.kv_heads(), c.head_dim())?;
        config::rope_params(raw, 10_000.0, 1.0)?;
        if c.decoder_sparse_step == 0 {
            bail!(Config, "decoder_sparse_step must be >= 1");
        }
        if c.num_experts > 0 && (c.num_experts_per_tok == 0 || c.num_experts_per_tok > c.num_experts) {
            bail!(Config, "num_experts_per_tok ({}) must be in 1..={}", c.num_experts_per_tok, c.num_experts);
        }
        Ok(c)
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.base.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.base.hidden_size / self.base.num_attention_heads.max(1))
    }

    /// HF: MoE iff `i ∉ mlp_only_layers` and `num_experts > 0` and `(i+1) % decoder_sparse_step == 0`.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        !self.mlp_only_layers.contains(&i) && self.num_experts > 0 && (i + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// HF Qwen3MoeConfig applies `sliding_window` (when `use_sliding_window`) to every layer.
    pub fn window(&self) -> Option<usize> {
        if self.use_sliding_window {
            self.sliding_window
        } else {
            None
        }
    }
}

fn map_context(raw: &Value) -> Result<MapContext> {
    let c = Config::from_value(raw)?;
    let mut ctx = MapContext::from_config(raw, c.base.num_hidden_layers, c.num_experts);
    ctx.set_dim("head_dim", c.head_dim())
        .set_dim("num_key_value_heads", c.kv_heads())
        .set_flag("tie_word_embeddings", c.base.tie_word_embeddings)
        .set_flag("attention_bias", c.base.attention_bias);
    for i in 0..c.base.num_hidden_layers {
        ctx.set_layer_flag(i, "moe_layer", c.is_moe_layer(i));
    }
    Ok(ctx)
}

fn describe(raw: &Value) -> Result<String> {
    let c = Config::from_value(raw)?;
    let moe: Vec<usize> = (0..c.base.num_hidden_layers).filter(|&i| c.is_moe_layer(i)).collect();
    Ok(format!(
        "Qwen3-MoE: {} layers (MoE layers {:?}), hidden {}, {} heads / {} KV heads of {}, {} experts top-{} of width {} (norm_topk_prob {}), dense MLP {}, vocab {}, tied embeddings: {}",
        c.base.num_hidden_layers,
        moe,
        c.base.hidden_size,
        c.base.num_attention_heads,
        c.kv_heads(),
        c.head_dim(),
        c.num_experts,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
        c.norm_topk_prob,
        c.base.intermediate_size,
        c.base.vocab_size,
        c.base.tie_word_embeddings
    ))
}

/// Builds the model from loaded weight slots.
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let c = Config::from_value(lc.config)?;
    let rope_params = config::rope_params(lc.config, 10_000.0, 1.0)?;
    let eps = c.base.rms_norm_eps as f32;
    let mut layers: Vec<Box<dyn TransformerLayer>> = Vec::with_capacity(c.base.num_hidden_layers);
    for i in 0..c.base.num_hidden_layers {
        let p = format!("layers.{i}");
        let cfg = AttentionConfig::gqa(c.base.num_attention_heads, c.kv_heads(), c.head_dim(), c.window());
        let ffn = load::feed_forward(
            w,
            &format!("{p}."),
            c.is_moe_layer(i).then_some((c.num_experts_per_tok, c.norm_topk_prob)),
        )?;
        layers.push(Box::new(DecoderLayer {
            input_norm: load::norm(w, &format!("{p}.input_norm"), eps, NormKind::Standard)?,
            attn: load::attention(
                w,
                &format!("{p}.attn"),
                cfg,
                Rope::new(&rope_params, c.head_dim())?,
                Some((eps, NormKind::Standard)),
            )?,
            post_norm: load::norm(w, &format!("{p}.post_norm"), eps, NormKind::Standard)?,
            ffn,
        }));
    }
    load::assemble(lc, w, "Qwen3MoeForCausalLM", &c.base, NormKind::Standard, layers)
}

porter_core::inventory::submit! {
    ModelEntry {
        architecture: "Qwen3MoeForCausalLM",
        crate_name: "qwen3_moe",
        weight_map: WEIGHT_MAP,
        map_context,
        describe,
        build,
    }
}
