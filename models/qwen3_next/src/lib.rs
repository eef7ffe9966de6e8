//! `Qwen3NextForCausalLM`: hybrid Gated DeltaNet linear attention + gated full attention
//! (3:1 in the released model), sparse MoE with a shared expert, zero-centred `(1 + w)`
//! RMSNorms (layer, final, q/k), partial NeoX RoPE.
//!
//! Config → layers → model, following candle-transformers' `qwen3.rs`. Checkpoint names
//! live only in `weight-maps/qwen3_next.toml`; the `mtp.*` tensors are left to the
//! `qwen3_next_mtp` draft crate.

use porter_core::build as load;
use porter_core::config::{self, DecoderConfig};
use porter_core::nn::GdnConfig;
use porter_core::nn::{AttentionConfig, DecoderLayer, NormKind, Rope};
use porter_core::{bail, Result};
use porter_core::{LoadContext, MapContext, Model, ModelEntry, TransformerLayer, Weights};
use serde::Deserialize;
use serde_json::Value;

/// The weight map (the single source of truth for checkpoint names).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/qwen3_next.toml");

fn one() -> usize {
    1
}
fn d_head() -> usize {
    256
}
fn d_interval() -> usize {
    4
}
fn d_conv() -> usize {
    4
}
fn d_lin_dim() -> usize {
    128
}
fn d_lin_k_heads() -> usize {
    16
}
fn d_lin_v_heads() -> usize {
    32
}
fn d_true() -> bool {
    true
}
fn d_kv() -> usize {
    2
}

/// The kind of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    LinearAttention,
    FullAttention,
}

/// `config.json` of a Qwen3-Next checkpoint (HF `Qwen3NextConfig` defaults; unknown keys
/// ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    /// Keys shared by every decoder-only architecture.
    #[serde(flatten)]
    pub base: DecoderConfig,
    #[serde(default = "d_kv")]
    pub num_key_value_heads: usize,
    #[serde(default = "d_head")]
    pub head_dim: usize,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "d_interval")]
    pub full_attention_interval: usize,
    #[serde(default = "d_conv")]
    pub linear_conv_kernel_dim: usize,
    #[serde(default = "d_lin_dim")]
    pub linear_key_head_dim: usize,
    #[serde(default = "d_lin_dim")]
    pub linear_value_head_dim: usize,
    #[serde(default = "d_lin_k_heads")]
    pub linear_num_key_heads: usize,
    #[serde(default = "d_lin_v_heads")]
    pub linear_num_value_heads: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    #[serde(default = "d_true")]
    pub norm_topk_prob: bool,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Option<Vec<usize>>,
}

impl Config {
    /// Parses and validates; every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        let c: Config = config::parse_typed(raw, "Qwen3-Next")?;
        c.base.check(c.num_key_value_heads, c.head_dim)?;
        config::rope_params(raw, 10_000.0, 0.25)?;
        if c.decoder_sparse_step == 0 {
            bail!(Config, "decoder_sparse_step must be >= 1");
        }
        if c.full_attention_interval == 0 {
            bail!(Config, "full_attention_interval must be >= 1");
        }
        if c.linear_num_key_heads == 0 || !c.linear_num_value_heads.is_multiple_of(c.linear_num_key_heads) {
            bail!(
                Config,
                "linear_num_value_heads ({}) must be a positive multiple of linear_num_key_heads ({})",
                c.linear_num_value_heads,
                c.linear_num_key_heads
            );
        }
        if c.linear_conv_kernel_dim == 0 || c.linear_key_head_dim == 0 || c.linear_value_head_dim == 0 {
            bail!(Config, "linear_conv_kernel_dim, linear_key_head_dim and linear_value_head_dim must be positive");
        }
        if c.num_experts > 0 && (c.num_experts_per_tok == 0 || c.num_experts_per_tok > c.num_experts) {
            bail!(Config, "num_experts_per_tok ({}) must be in 1..={}", c.num_experts_per_tok, c.num_experts);
        }
        c.layer_kinds()?;
        Ok(c)
    }

    /// HF: `layer_types` when present, else layer i is full attention iff
    /// `(i + 1) % full_attention_interval == 0`.
    pub fn layer_kinds(&self) -> Result<Vec<LayerType>> {
        match &self.layer_types {
            Some(t) => {
                if t.len() != self.base.num_hidden_layers {
                    bail!(
                        Config,
                        "layer_types has {} entries but num_hidden_layers is {}",
                        t.len(),
                        self.base.num_hidden_layers
                    );
                }
                t.iter()
                    .map(|s| match s.as_str() {
                        "linear_attention" => Ok(LayerType::LinearAttention),
                        "full_attention" => Ok(LayerType::FullAttention),
                        other => {
                            bail!(Config, "layer_types: unknown layer type `{other}` (expected linear_attention or full_attention)")
                        }
                    })
                    .collect()
            }
            None => Ok((0..self.base.num_hidden_layers)
                .map(|i| {
                    if (i + 1).is_multiple_of(self.full_attention_interval) {
                        LayerType::FullAttention
                    } else {
                        LayerType::LinearAttention
                    }
                })
                .collect()),
        }
    }

    /// HF: MoE iff `i ∉ mlp_only_layers` and `num_experts > 0` and `(i+1) % decoder_sparse_step == 0`.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        !self.mlp_only_layers.as_deref().unwrap_or(&[]).contains(&i)
            && self.num_experts > 0
            && (i + 1).is_multiple_of(self.decoder_sparse_step)
    }

    pub fn gdn(&self) -> GdnConfig {
        GdnConfig {
            key_heads: self.linear_num_key_heads,
            value_heads: self.linear_num_value_heads,
            key_dim: self.linear_key_head_dim,
            value_dim: self.linear_value_head_dim,
            conv_kernel: self.linear_conv_kernel_dim,
            eps: self.base.rms_norm_eps as f32,
        }
    }
}

fn map_context(raw: &Value) -> Result<MapContext> {
    let c = Config::from_value(raw)?;
    let kinds = c.layer_kinds()?;
    let g = c.gdn();
    let r = g.value_heads / g.key_heads;
    let mut ctx = MapContext::from_config(raw, c.base.num_hidden_layers, c.num_experts);
    ctx.set_dim("head_dim", c.head_dim)
        .set_dim("num_key_value_heads", c.num_key_value_heads)
        .set_dim("linear_conv_kernel_dim", g.conv_kernel)
        .set_dim("linear_key_head_dim", g.key_dim)
        .set_dim("linear_value_head_dim", g.value_dim)
        .set_dim("linear_num_key_heads", g.key_heads)
        .set_dim("linear_num_value_heads", g.value_heads)
        .set_dim("key_dim", g.key_heads * g.key_dim)
        .set_dim("value_dim", g.value_heads * g.value_dim)
        .set_dim("conv_dim", g.conv_dim())
        .set_dim("value_heads_per_key_head", r)
        .set_dim("value_dim_per_key_head", r * g.value_dim)
        .set_flag("tie_word_embeddings", c.base.tie_word_embeddings)
        .set_flag("attention_bias", c.base.attention_bias);
    for (i, k) in kinds.iter().enumerate() {
        ctx.set_layer_flag(i, "linear_layer", *k == LayerType::LinearAttention);
        ctx.set_layer_flag(i, "moe_layer", c.is_moe_layer(i));
    }
    Ok(ctx)
}

fn describe(raw: &Value) -> Result<String> {
    let c = Config::from_value(raw)?;
    let kinds: String = c
        .layer_kinds()?
        .iter()
        .map(|k| match k {
            LayerType::LinearAttention => 'L',
            LayerType::FullAttention => 'F',
        })
        .collect();
    let moe: Vec<usize> = (0..c.base.num_hidden_layers).filter(|&i| c.is_moe_layer(i)).collect();
    let rope = config::rope_params(raw, 10_000.0, 0.25)?;
    Ok(format!(
        "Qwen3-Next: {} layers [{kinds}] (L = Gated DeltaNet, F = gated attention), hidden {}, attention {} / {} KV heads of {} (rotary {:.2}, theta {}), GDN {} key heads of {} / {} value heads of {}, conv {}, MoE layers {:?}: {} experts top-{} of {} + shared {} (norm_topk_prob {}), vocab {}, tied embeddings: {}",
        c.base.num_hidden_layers,
        c.base.hidden_size,
        c.base.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        rope.partial_rotary_factor,
        rope.theta,
        c.linear_num_key_heads,
        c.linear_key_head_dim,
        c.linear_num_value_heads,
        c.linear_value_head_dim,
        c.linear_conv_kernel_dim,
        moe,
        c.num_experts,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
        c.shared_expert_intermediate_size,
        c.norm_topk_prob,
        c.base.vocab_size,
        c.base.tie_word_embeddings
    ))
}

/// Builds the model from loaded weight slots.
pub fn build(lc: &LoadContext, w: &mut Weights) -> Result<Model> {
    let c = Config::from_value(lc.config)?;
    let rope_params = config::rope_params(lc.config, 10_000.0, 0.25)?;
    let eps = c.base.rms_norm_eps as f32;
    let mut layers: Vec<Box<dyn TransformerLayer>> = Vec::with_capacity(c.base.num_hidden_layers);
    for (i, kind) in c.layer_kinds()?.into_iter().enumerate() {
        let p = format!("layers.{i}");
        let mixer = match kind {
            LayerType::LinearAttention => load::gated_delta_net(w, &format!("{p}.gdn"), c.gdn())?,
            LayerType::FullAttention => {
                let cfg = AttentionConfig {
                    heads: c.base.num_attention_heads,
                    kv_heads: c.num_key_value_heads,
                    head_dim: c.head_dim,
                    window: None,
                    output_gate: true,
                    scale: 1.0 / (c.head_dim as f32).sqrt(),
                };
                let rope = Rope::new(&rope_params, c.head_dim)?;
                load::attention(w, &format!("{p}.attn"), cfg, rope, Some((eps, NormKind::ZeroCentred)))?
            }
        };
        let ffn = load::feed_forward(
            w,
            &format!("{p}."),
            c.is_moe_layer(i).then_some((c.num_experts_per_tok, c.norm_topk_prob)),
        )?;
        layers.push(Box::new(DecoderLayer {
            input_norm: load::norm(w, &format!("{p}.input_norm"), eps, NormKind::ZeroCentred)?,
            attn: mixer,
            post_norm: load::norm(w, &format!("{p}.post_norm"), eps, NormKind::ZeroCentred)?,
            ffn,
        }));
    }
    load::assemble(lc, w, "Qwen3NextForCausalLM", &c.base, NormKind::ZeroCentred, layers)
}

porter_core::inventory::submit! {
    ModelEntry {
        architecture: "Qwen3NextForCausalLM",
        crate_name: "qwen3_next",
        weight_map: WEIGHT_MAP,
        map_context,
        describe,
        build,
    }
}
