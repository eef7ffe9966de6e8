//! `mistral_mtp`: LightLLM's FFN-only MTP draft head (#1159) for Mistral. As
//! `qwen3_moe_mtp`, except that the main model's final norm is applied to the incoming
//! hidden before `hnorm`: `h' = RMS(RMS(h_p, main norm), mtp.hnorm)`; the FFN is a dense
//! SwiGLU of `intermediate_size`.

use porter_core::build as load;
use porter_core::draft::{DraftHead, FfnMtpHead};
use porter_core::nn::NormKind;
use porter_core::registry::{DraftEntry, DraftLoadContext};
use porter_core::Result;
use porter_core::{config, MapContext, Weights};

/// The weight map of the draft head.
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/mistral_mtp.toml");

/// The draft folder's config (a Mistral config; unknown keys ignored). Only the keys the
/// draft head reads are checked.
#[derive(Debug, Clone)]
pub struct Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    /// `hidden_act` of the draft folder's config (default `silu`): the FFN's gate activation.
    pub hidden_act: config::Act,
}

impl Config {
    /// Parses and validates the keys the draft reads (types, `null`, ranges).
    pub fn from_value(raw: &serde_json::Value) -> Result<Self> {
        use config::limits::*;
        let k = config::Keys::new(raw)?;
        k.opt_count("vocab_size", None, 1..=MAX_VOCAB)?;
        Ok(Config {
            hidden_size: k.count("hidden_size", None, 1..=MAX_HIDDEN)?,
            intermediate_size: k.count("intermediate_size", None, 1..=MAX_INTERMEDIATE)?,
            rms_norm_eps: k.float("rms_norm_eps", 1e-6, config::positive_f32, config::POSITIVE_F32)?,
            hidden_act: config::read_act(&k)?,
        })
    }
}

fn map_context(lc: &DraftLoadContext) -> Result<MapContext> {
    Config::from_value(lc.config)?;
    Ok(MapContext::from_config(lc.config, 1, 0))
}

fn build(lc: &DraftLoadContext, w: &mut Weights) -> Result<Box<dyn DraftHead>> {
    let c = Config::from_value(lc.config)?;
    // A non-SiLU `hidden_act` is refused on a GPU before any weight is placed there.
    config::check_act_device(c.hidden_act, w.device())?;
    let eps = c.rms_norm_eps as f32;
    Ok(Box::new(FfnMtpHead {
        name: "mistral_mtp".into(),
        eh_proj: load::linear(w, "eh_proj")?,
        enorm: load::norm(w, "enorm", eps, NormKind::Standard)?,
        hnorm: load::norm(w, "hnorm", eps, NormKind::Standard)?,
        main_norm_on_hidden: true,
        ffn_norm: load::norm(w, "ffn_norm", eps, NormKind::Standard)?,
        ffn: load::feed_forward(w, "", None, c.hidden_act)?,
    }))
}

porter_core::inventory::submit! {
    DraftEntry {
        name: "mistral_mtp",
        main_architectures: &["MistralForCausalLM"],
        signature: "mtp.eh_proj.weight",
        in_main_checkpoint: false,
        weight_map: WEIGHT_MAP,
        map_context,
        build,
    }
}
