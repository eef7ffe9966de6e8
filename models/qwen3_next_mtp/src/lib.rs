//! `qwen3_next_mtp`: the multi-token-prediction head inside Qwen3-Next checkpoints
//! (vLLM `Qwen3NextMTP` semantics). For draft position p:
//! `u = fc([ZRMS(embed(x_{p+1})) | ZRMS(main_norm(h_p))])` (embedding first), one gated
//! full-attention decoder layer with its own KV cache and the full MoE, then
//! `logits = lm_head(ZRMS(u, mtp.norm))`; chained steps feed the post-`mtp.norm` hidden.
//! Embedding and lm_head are shared with the main model.

use porter_core::build as load;
use porter_core::draft::{AttentionMtpHead, DraftHead};
use porter_core::nn::{AttentionConfig, DecoderLayer, NormKind, Rope};
use porter_core::registry::{DraftEntry, DraftLoadContext};
use porter_core::Result;
use porter_core::{MapContext, Weights};
use qwen3_next::Config;

/// The weight map of the draft head.
pub const WEIGHT_MAP: &str = include_str!("../../../weight-maps/qwen3_next_mtp.toml");

/// vLLM builds the MTP layer with layer index 0: MoE iff 0 ∉ mlp_only_layers and
/// (0 + 1) % decoder_sparse_step == 0.
fn is_moe(c: &Config) -> bool {
    c.is_moe_layer(0)
}

fn map_context(lc: &DraftLoadContext) -> Result<MapContext> {
    let c = Config::from_value(lc.main_config)?;
    let mut ctx = MapContext::from_config(lc.main_config, 1, c.num_experts);
    ctx.set_dim("head_dim", c.head_dim)
        .set_dim("num_key_value_heads", c.num_key_value_heads)
        .set_flag("attention_bias", c.base.attention_bias)
        .set_layer_flag(0, "moe_layer", is_moe(&c));
    Ok(ctx)
}

fn build(lc: &DraftLoadContext, w: &mut Weights) -> Result<Box<dyn DraftHead>> {
    let c = Config::from_value(lc.main_config)?;
    let rope_params = c.base.rope(lc.main_config, 10_000.0, 0.25)?;
    let eps = c.base.rms_norm_eps as f32;
    let cfg = AttentionConfig {
        heads: c.base.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        window: None,
        output_gate: true,
        scale: 1.0 / (c.head_dim as f32).sqrt(),
    };
    // The MTP layer is a main-model decoder layer: the main config's `hidden_act`.
    let moe = is_moe(&c).then_some((c.num_experts_per_tok, c.norm_topk_prob));
    let ffn = load::feed_forward(w, "layers.0.", moe, c.base.hidden_act)?;
    let layer = DecoderLayer {
        input_norm: load::norm(w, "layers.0.input_norm", eps, NormKind::ZeroCentred)?,
        attn: load::attention(
            w,
            "layers.0.attn",
            cfg,
            Rope::new(&rope_params, c.head_dim)?,
            Some((eps, NormKind::ZeroCentred)),
        )?,
        post_norm: load::norm(w, "layers.0.post_norm", eps, NormKind::ZeroCentred)?,
        ffn,
    };
    Ok(Box::new(AttentionMtpHead {
        name: "qwen3_next_mtp".into(),
        fc: load::linear(w, "fc")?,
        norm_embedding: load::norm(w, "pre_fc_norm_embedding", eps, NormKind::ZeroCentred)?,
        norm_hidden: load::norm(w, "pre_fc_norm_hidden", eps, NormKind::ZeroCentred)?,
        layer,
        norm: load::norm(w, "norm", eps, NormKind::ZeroCentred)?,
    }))
}

porter_core::inventory::submit! {
    DraftEntry {
        name: "qwen3_next_mtp",
        main_architectures: &["Qwen3NextForCausalLM"],
        signature: "mtp.fc.weight",
        in_main_checkpoint: true,
        weight_map: WEIGHT_MAP,
        map_context,
        build,
    }
}
