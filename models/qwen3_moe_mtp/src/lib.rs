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

/// The weight map of the draft head.
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/qwen3_moe_mtp.toml");

/// The draft folder's config (a Qwen3-MoE or Qwen3 config; unknown keys ignored). Only
/// the keys the draft head reads are checked; without `num_experts` the FFN is dense.
#[derive(Debug, Clone)]
pub struct Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub norm_topk_prob: bool,
    /// `hidden_act` of the draft folder's config (default `silu`): the FFN's gate activation.
    pub hidden_act: config::Act,
    pub decoder_sparse_step: usize,
    /// Module indices (bounded by `limits::MAX_LAYERS`: a draft module's index is not
    /// bounded by the main model's `num_hidden_layers`).
    pub mlp_only_layers: Vec<usize>,
}

impl Config {
    /// Parses and validates the keys the draft reads (types, `null`, ranges).
    pub fn from_value(raw: &serde_json::Value) -> Result<Self> {
        use config::limits::*;
        let k = config::Keys::new(raw)?;
        let moe_defaults = config::MoeDefaults {
            num_experts: 0,
            num_experts_per_tok: 0,
            moe_intermediate_size: 0,
            norm_topk_prob: false,
            num_experts_alias: None,
        };
        let moe = config::MoeKeys::read(&k, &moe_defaults)?;
        k.opt_count("vocab_size", None, 1..=MAX_VOCAB)?;
        Ok(Config {
            hidden_size: k.count("hidden_size", None, 1..=MAX_HIDDEN)?,
            intermediate_size: k.count("intermediate_size", Some(0), 0..=MAX_INTERMEDIATE)?,
            rms_norm_eps: k.float("rms_norm_eps", 1e-6, config::positive_f32, config::POSITIVE_F32)?,
            num_experts: moe.num_experts,
            num_experts_per_tok: moe.num_experts_per_tok,
            moe_intermediate_size: moe.moe_intermediate_size,
            norm_topk_prob: moe.norm_topk_prob,
            hidden_act: config::read_act(&k)?,
            decoder_sparse_step: moe.decoder_sparse_step,
            mlp_only_layers: moe.mlp_only_layers,
        })
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
    let moe = c.is_moe_layer(m).then_some((c.num_experts_per_tok, c.norm_topk_prob));
    let ffn = load::feed_forward(w, "", moe, c.hidden_act)?;
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
        in_main_checkpoint: false,
        weight_map: WEIGHT_MAP,
        map_context,
        build,
    }
}
