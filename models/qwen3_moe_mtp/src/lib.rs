//! `qwen3_moe_mtp`: LightLLM's FFN-only MTP draft head (#1159) for Qwen3-MoE and dense
//! Qwen3 main models. For draft position p, with `h_p` the main hidden *before* its final
//! norm:
//! `x = proj([RMS(embed(x_{p+1}), norm_after_embedding) | RMS(h_p, norm_before_output)])`,
//! `x += FFN(RMS(x, post_attention_layernorm))`, `logits = lm_head(RMS(x, main norm))`.
//! All norms are standard (Llama-style). The FFN is MoE or dense by Qwen3-MoE rules
//! applied to the draft module's layer index, from the draft folder's config.

use porter_core::build as load;
use porter_core::draft::{DraftHead, FfnMtpHead};
use porter_core::nn::NormKind;
use porter_core::registry::{DraftEntry, DraftLoadContext};
use porter_core::{bail, Result};
use porter_core::{config, MapContext, Weights};
use serde::Deserialize;

/// The weight map of the draft head.
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/qwen3_moe_mtp.toml");

fn default_eps() -> f64 {
    1e-6
}
fn one() -> usize {
    1
}

/// The draft folder's config (a Qwen3-MoE or Qwen3 config; unknown keys ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    #[serde(default)]
    pub intermediate_size: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub num_experts: usize,
    #[serde(default)]
    pub num_experts_per_tok: usize,
    #[serde(default)]
    pub moe_intermediate_size: usize,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
}

impl Config {
    fn from_value(raw: &serde_json::Value) -> Result<Self> {
        let c: Config = config::parse_typed(raw, "qwen3_moe_mtp draft")?;
        if c.decoder_sparse_step == 0 {
            bail!(Config, "decoder_sparse_step must be >= 1");
        }
        if c.num_experts > 0 && (c.num_experts_per_tok == 0 || c.num_experts_per_tok > c.num_experts) {
            bail!(Config, "num_experts_per_tok ({}) must be in 1..={}", c.num_experts_per_tok, c.num_experts);
        }
        Ok(c)
    }

    fn is_moe_layer(&self, m: usize) -> bool {
        !self.mlp_only_layers.contains(&m) && self.num_experts > 0 && (m + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// The draft module index m: the single `model.layers.{m}.post_attention_layernorm.weight`.
fn module_index(lc: &DraftLoadContext) -> Result<usize> {
    let found: Vec<usize> = lc
        .checkpoint
        .tensors()
        .keys()
        .filter_map(|n| n.strip_prefix("model.layers.")?.strip_suffix(".post_attention_layernorm.weight")?.parse().ok())
        .collect();
    match found.as_slice() {
        [m] => Ok(*m),
        [] => bail!(Config, "qwen3_moe_mtp draft has no model.layers.{{m}}.post_attention_layernorm.weight"),
        _ => bail!(Config, "qwen3_moe_mtp draft holds several FFN modules {found:?}; pass one folder per module"),
    }
}

fn map_context(lc: &DraftLoadContext) -> Result<MapContext> {
    let c = Config::from_value(lc.config)?;
    let m = module_index(lc)?;
    let mut ctx = MapContext::from_config(lc.config, m + 1, c.num_experts);
    for i in 0..=m {
        ctx.set_layer_flag(i, "draft_layer", i == m).set_layer_flag(i, "moe_layer", c.is_moe_layer(i));
    }
    Ok(ctx)
}

fn build(lc: &DraftLoadContext, w: &mut Weights) -> Result<Box<dyn DraftHead>> {
    let c = Config::from_value(lc.config)?;
    let m = module_index(lc)?;
    let eps = c.rms_norm_eps as f32;
    let ffn = load::feed_forward(w, "", c.is_moe_layer(m).then_some((c.num_experts_per_tok, c.norm_topk_prob)))?;
    Ok(Box::new(FfnMtpHead {
        name: "qwen3_moe_mtp".into(),
        eh_proj: load::linear(w, "eh_proj")?,
        enorm: load::norm(w, "enorm", eps, NormKind::Standard)?,
        hnorm: load::norm(w, "hnorm", eps, NormKind::Standard)?,
        main_norm_on_hidden: false,
        ffn_norm: load::norm(w, "ffn_norm", eps, NormKind::Standard)?,
        ffn,
    }))
}

porter_core::inventory::submit! {
    DraftEntry {
        name: "qwen3_moe_mtp",
        main_architectures: &["Qwen3MoeForCausalLM", "Qwen3ForCausalLM"],
        signature: "model.layers.0.proj.weight",
        weight_map: WEIGHT_MAP,
        map_context,
        build,
    }
}
