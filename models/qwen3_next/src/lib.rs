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
use porter_core::Result;
use porter_core::{LoadContext, MapContext, Model, ModelEntry, TransformerLayer, Weights};
use serde_json::Value;

/// The weight map (the single source of truth for checkpoint names).
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/qwen3_next.toml");

/// The kind of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    LinearAttention,
    FullAttention,
}

/// `config.json` of a Qwen3-Next checkpoint (HF `Qwen3NextConfig` defaults; unknown keys
/// ignored).
#[derive(Debug, Clone)]
pub struct Config {
    /// Keys shared by every decoder-only architecture.
    pub base: DecoderConfig,
    /// HF: 2 when absent; `null` is rejected (an `int` field), as for every count below.
    pub num_key_value_heads: usize,
    /// HF: 256 when absent.
    pub head_dim: usize,
    /// After transformers' legacy renames (`attention`, `mamba`).
    pub layer_types: Option<Vec<String>>,
    /// HF: 4 when absent; read only without `layer_types` (transformers ignores it then).
    pub full_attention_interval: usize,
    pub linear_conv_kernel_dim: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Option<Vec<usize>>,
}

impl Config {
    /// Parses and validates every key `Qwen3NextConfig` honours (types, `null`, ranges);
    /// every unsupported value is rejected here, never in forward.
    pub fn from_value(raw: &Value) -> Result<Self> {
        use config::limits::*;
        let k = config::Keys::new(raw)?;
        let defaults = config::DecoderDefaults {
            max_position_embeddings: 32768,
            reads_attention_bias: true,
            intermediate_size: 5632,
            vocab_size: 151936,
            hidden_size: 2048,
            num_hidden_layers: 48,
            num_attention_heads: 16,
        };
        let base = DecoderConfig::read(&k, &defaults)?;
        let layers = base.num_hidden_layers;
        let moe_defaults = config::MoeDefaults {
            num_experts: 512,
            num_experts_per_tok: 10,
            moe_intermediate_size: 512,
            norm_topk_prob: true,
            num_experts_alias: None,
        };
        let moe = config::MoeKeys::read(&k, &moe_defaults)?;
        let layer_types = match k.opt_string_list("layer_types")? {
            Some(t) => Some(config::check_layer_types(&t, layers, &["linear_attention", "full_attention"], true)?),
            None => None,
        };
        let full_attention_interval = match layer_types {
            Some(_) => 4,
            None => k.count("full_attention_interval", Some(4), 1..=MAX_STRIDE)?,
        };
        let c = Config {
            num_key_value_heads: k.count("num_key_value_heads", Some(2), 1..=MAX_HEADS)?,
            head_dim: k.count("head_dim", Some(256), 1..=MAX_HEAD_DIM)?,
            layer_types,
            full_attention_interval,
            linear_conv_kernel_dim: k.count("linear_conv_kernel_dim", Some(4), 1..=MAX_CONV_KERNEL)?,
            linear_key_head_dim: k.count("linear_key_head_dim", Some(128), 1..=MAX_HEAD_DIM)?,
            linear_value_head_dim: k.count("linear_value_head_dim", Some(128), 1..=MAX_HEAD_DIM)?,
            linear_num_key_heads: k.count("linear_num_key_heads", Some(16), 1..=MAX_HEADS)?,
            linear_num_value_heads: k.count("linear_num_value_heads", Some(32), 1..=MAX_HEADS)?,
            num_experts: moe.num_experts,
            num_experts_per_tok: moe.num_experts_per_tok,
            moe_intermediate_size: moe.moe_intermediate_size,
            shared_expert_intermediate_size: k.count(
                "shared_expert_intermediate_size",
                Some(512),
                1..=MAX_INTERMEDIATE,
            )?,
            norm_topk_prob: moe.norm_topk_prob,
            decoder_sparse_step: moe.decoder_sparse_step,
            mlp_only_layers: Some(moe.mlp_only_layers),
            base,
        };
        // Partial RoPE: an odd head_dim is legal; a model of linear-attention layers only builds
        // no attention, so its head counts and rotary width are not checked (as transformers).
        let attends = c.layer_kinds()?.contains(&LayerType::FullAttention);
        let heads = if attends { config::HeadDims::PartialRope } else { config::HeadDims::NoAttention };
        c.base.check_as(c.num_key_value_heads, c.head_dim, heads)?;
        let rope = c.base.rope(raw, 10_000.0, 0.25)?;
        if attends {
            config::check_rotary_dim(&rope, c.head_dim)?;
        }
        if !c.linear_num_value_heads.is_multiple_of(c.linear_num_key_heads) {
            return Err(porter_core::Error::key(
                "linear_num_value_heads",
                c.linear_num_value_heads,
                format!("must be a multiple of linear_num_key_heads = {}", c.linear_num_key_heads),
            ));
        }
        Ok(c)
    }

    /// HF: `layer_types` when present, else layer i is full attention iff
    /// `(i + 1) % full_attention_interval == 0`.
    pub fn layer_kinds(&self) -> Result<Vec<LayerType>> {
        match &self.layer_types {
            Some(t) => {
                let t = config::check_layer_types(
                    t,
                    self.base.num_hidden_layers,
                    &["linear_attention", "full_attention"],
                    true,
                )?;
                Ok(t.iter()
                    .map(|s| if s == "full_attention" { LayerType::FullAttention } else { LayerType::LinearAttention })
                    .collect())
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
            // transformers: `self.activation = config.hidden_act` (the conv's activation).
            act: self.base.hidden_act,
        }
    }
}

fn map_context(raw: &Value) -> Result<MapContext> {
    let c = Config::from_value(raw)?;
    let kinds = c.layer_kinds()?;
    let g = c.gdn();
    let r = g.value_heads / g.key_heads;
    let mut ctx = MapContext::decoder(raw, &c.base, c.num_key_value_heads, c.head_dim, c.num_experts);
    ctx.set_dim("num_experts", c.num_experts)
        .set_dim("moe_intermediate_size", c.moe_intermediate_size)
        .set_dim("shared_expert_intermediate_size", c.shared_expert_intermediate_size)
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
    let rope = c.base.rope(raw, 10_000.0, 0.25)?;
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
    // A non-SiLU `hidden_act` is refused on a GPU before any weight is placed there.
    config::check_act_device(c.base.hidden_act, w.device())?;
    let rope_params = c.base.rope(lc.config, 10_000.0, 0.25)?;
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
            c.base.hidden_act,
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
