//! `Qwen3MoeForCausalLM`: Qwen3 attention (per-head q/k RMSNorm before RoPE) with sparse
//! MoE feed-forward layers (softmax router → top-k → optional renormalisation); dense
//! SwiGLU on `mlp_only_layers` and on layers where `(i+1) % decoder_sparse_step != 0`.
//!
//! Checkpoint names live only in `weight-maps/qwen3_moe.toml`.

use porter_core::build as load;
use porter_core::config::{self, DecoderConfig};
use porter_core::nn::AttentionConfig;
use porter_core::Result;
use porter_core::{LoadContext, MapContext, Model, ModelEntry, Weights};
use serde_json::Value;

/// The weight map (the single source of truth for checkpoint names).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/qwen3_moe.toml");

/// `config.json` of a Qwen3-MoE checkpoint (HF `Qwen3MoeConfig`; unknown keys ignored).
#[derive(Debug, Clone)]
pub struct Config {
    /// Keys shared by every decoder-only architecture.
    pub base: DecoderConfig,
    /// HF: 4 when absent; `null` is rejected (an `int` field).
    pub num_key_value_heads: Option<usize>,
    /// Not a `Qwen3MoeConfig` field: the attention reads it when present, else
    /// hidden / heads; `null` is rejected (transformers would build a `None`-wide head).
    pub head_dim: Option<usize>,
    pub use_sliding_window: bool,
    /// HF: 4096 when absent, no window when `null`; only used with `use_sliding_window`.
    pub sliding_window: Option<usize>,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
}

impl Config {
    /// Parses and validates every key `Qwen3MoeConfig` honours (types, `null`, ranges);
    /// every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        use config::limits::*;
        let k = config::Keys::new(raw)?;
        let defaults = config::DecoderDefaults {
            max_position_embeddings: 32768,
            reads_attention_bias: true,
            intermediate_size: 6144,
            vocab_size: 151936,
            hidden_size: 2048,
            num_hidden_layers: 24,
            num_attention_heads: 32,
        };
        let base = DecoderConfig::read(&k, &defaults)?;
        let moe_defaults = config::MoeDefaults {
            num_experts: 128,
            num_experts_per_tok: 8,
            moe_intermediate_size: 768,
            norm_topk_prob: false,
            num_experts_alias: Some("num_local_experts"),
        };
        let moe = config::MoeKeys::read(&k, &moe_defaults)?;
        let head_dim = match k.get("head_dim") {
            None => None,
            Some(_) => Some(k.count("head_dim", None, 1..=MAX_HEAD_DIM)?),
        };
        let c = Config {
            num_key_value_heads: Some(k.count("num_key_value_heads", Some(4), 1..=MAX_HEADS)?),
            head_dim,
            use_sliding_window: k.flag("use_sliding_window", false)?,
            sliding_window: k.opt_count("sliding_window", Some(4096), 1..=MAX_POSITIONS)?,
            num_experts: moe.num_experts,
            num_experts_per_tok: moe.num_experts_per_tok,
            moe_intermediate_size: moe.moe_intermediate_size,
            norm_topk_prob: moe.norm_topk_prob,
            decoder_sparse_step: moe.decoder_sparse_step,
            mlp_only_layers: moe.mlp_only_layers,
            base,
        };
        c.base.check(c.kv_heads(), c.head_dim())?;
        c.base.rope(raw, 10_000.0, 1.0)?;
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
    let mut ctx = MapContext::decoder(raw, &c.base, c.kv_heads(), c.head_dim(), c.num_experts);
    ctx.set_dim("num_experts", c.num_experts).set_dim("moe_intermediate_size", c.moe_intermediate_size);
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

/// Builds the model from loaded weight slots (the shared Llama-style decoder).
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let c = Config::from_value(lc.config)?;
    let attn = AttentionConfig::gqa(c.base.num_attention_heads, c.kv_heads(), c.head_dim(), c.window());
    let moe = |i: usize| c.is_moe_layer(i).then_some((c.num_experts_per_tok, c.norm_topk_prob));
    let layers =
        (0..c.base.num_hidden_layers).map(|i| load::LlamaLayer { attn: attn.clone(), qk_norm: true, moe: moe(i) });
    let rope = c.base.rope(lc.config, 10_000.0, 1.0)?;
    load::llama_decoder(lc, w, "Qwen3MoeForCausalLM", &c.base, &rope, layers.collect())
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
