//! Model-building helpers: they take weight slots by the naming convention of the weight maps
//! (a linear layer `P` has its weight at slot `P` and an optional bias at `P.bias`) and return
//! the shared blocks of [`crate::nn`].

use crate::bail;
use crate::error::Result;
use crate::load::weight_map::Weights;
use crate::nn::*;

pub fn linear(w: &mut Weights, slot: &str) -> Result<Linear> {
    let weight = w.take(slot)?;
    let bias = w.take_opt(&format!("{slot}.bias"));
    Ok(Linear::new(weight, bias))
}

pub fn norm(w: &mut Weights, slot: &str, eps: f32, kind: NormKind) -> Result<RmsNorm> {
    Ok(RmsNorm::new(w.take(slot)?, eps, kind))
}

/// The feed-forward half of a layer whose slots start with `prefix` (e.g. `"layers.3."`):
/// the MoE at `{prefix}moe` when `moe` gives `(top_k, norm_topk_prob)`, else the dense
/// SwiGLU at `{prefix}mlp`.
pub fn feed_forward(w: &mut Weights, prefix: &str, moe: Option<(usize, bool)>) -> Result<FeedForward> {
    Ok(match moe {
        Some((top_k, norm_topk_prob)) => {
            FeedForward::Moe(Box::new(self::moe(w, &format!("{prefix}moe"), top_k, norm_topk_prob)?))
        }
        None => FeedForward::Dense(Box::new(swiglu(w, &format!("{prefix}mlp"))?)),
    })
}

/// `P.gate_proj`, `P.up_proj`, `P.down_proj`.
pub fn swiglu(w: &mut Weights, prefix: &str) -> Result<SwiGlu> {
    let gate = linear(w, &format!("{prefix}.gate_proj"))?;
    let up = linear(w, &format!("{prefix}.up_proj"))?;
    // Bias-free projections on a device are stacked into one GEMM.
    let gate_up = match (gate.w.is_cuda(), &gate.b, &up.b) {
        (true, None, None) => Some(crate::backend::cuda::stack_rows(&gate.w, &up.w)?),
        _ => None,
    };
    Ok(SwiGlu { gate, up, down: linear(w, &format!("{prefix}.down_proj"))?, gate_up })
}

/// `P.router` and the stacked experts `P.gate_proj`, `P.up_proj`, `P.down_proj`;
/// the shared expert at `P.shared_expert.*` and `P.shared_expert_gate` when present.
pub fn moe(w: &mut Weights, prefix: &str, top_k: usize, norm_topk_prob: bool) -> Result<Moe> {
    let shared = if w.contains(&format!("{prefix}.shared_expert_gate")) {
        Some(SharedExpert {
            mlp: swiglu(w, &format!("{prefix}.shared_expert"))?,
            gate: linear(w, &format!("{prefix}.shared_expert_gate"))?,
        })
    } else {
        None
    };
    let router = linear(w, &format!("{prefix}.router"))?;
    let stacked_in = match &shared {
        Some(s) if router.w.is_cuda() && router.b.is_none() && s.gate.b.is_none() => match &s.mlp.gate_up {
            Some(gu) => {
                Some(crate::backend::cuda::stack_rows(&crate::backend::cuda::stack_rows(&router.w, gu)?, &s.gate.w)?)
            }
            None => None,
        },
        _ => None,
    };
    let m = Moe {
        router,
        gate: w.take(&format!("{prefix}.gate_proj"))?,
        up: w.take(&format!("{prefix}.up_proj"))?,
        down: w.take(&format!("{prefix}.down_proj"))?,
        top_k,
        norm_topk_prob,
        shared,
        stacked_in,
    };
    m.check()?;
    Ok(m)
}

/// Gated DeltaNet at `P.in_proj_qkvz`, `P.in_proj_ba`, `P.conv1d` (`[C, 1, K]`),
/// `P.A_log`, `P.dt_bias`, `P.norm`, `P.out_proj`.
pub fn gated_delta_net(w: &mut Weights, prefix: &str, cfg: crate::nn::gdn::GdnConfig) -> Result<Mixer> {
    let conv_w = w.take(&format!("{prefix}.conv1d"))?.into_vec();
    let a_log = w.take(&format!("{prefix}.A_log"))?.into_vec();
    let dt_bias = w.take(&format!("{prefix}.dt_bias"))?.into_vec();
    let norm = w.take(&format!("{prefix}.norm"))?;
    let in_proj_qkvz = linear(w, &format!("{prefix}.in_proj_qkvz"))?;
    let in_proj_ba = linear(w, &format!("{prefix}.in_proj_ba"))?;
    let dev = match norm.gpu() {
        Some(_) if in_proj_qkvz.b.is_some() || in_proj_ba.b.is_some() => {
            bail!(Shape, "{prefix}: biases on the Gated DeltaNet in-projections are not supported on CUDA")
        }
        Some(gpu) => {
            let in_proj = crate::backend::cuda::stack_rows(&in_proj_qkvz.w, &in_proj_ba.w)?;
            Some(crate::backend::cuda::blocks::GdnDev::new(gpu, in_proj, &conv_w, &a_log, &dt_bias, norm.try_clone()?)?)
        }
        None => None,
    };
    let g = crate::nn::gdn::GatedDeltaNet {
        cfg,
        in_proj_qkvz,
        in_proj_ba,
        conv_w,
        a_log,
        dt_bias,
        norm_w: norm.into_vec(),
        out_proj: linear(w, &format!("{prefix}.out_proj"))?,
        dev,
    };
    g.check()?;
    Ok(Mixer::GatedDeltaNet(Box::new(g)))
}

/// Assembles a decoder-only model from its transformer layers: the embedding pre-layer
/// (`embed`), the final norm (`norm`) and the lm_head (`lm_head`, or the embedding when
/// `tie_word_embeddings`).
pub fn assemble(
    lc: &crate::load::registry::LoadContext,
    w: &mut Weights,
    architecture: &str,
    base: &crate::load::config::DecoderConfig,
    norm_kind: NormKind,
    layers: Vec<Box<dyn crate::layer::TransformerLayer>>,
) -> Result<crate::model::Model> {
    let embed = w.take("embed")?;
    let lm_head = if base.tie_word_embeddings { embed.try_clone()? } else { w.take("lm_head")? };
    let norm = norm(w, "norm", base.rms_norm_eps as f32, norm_kind)?;
    Ok(crate::model::Model {
        info: crate::model::ModelInfo {
            architecture: architecture.into(),
            vocab_size: base.vocab_size,
            hidden_size: base.hidden_size,
            num_layers: base.num_hidden_layers,
            dtype: lc.dtype,
            device: lc.device,
            max_position_embeddings: base.max_position_embeddings,
            generation: crate::load::config::generation_config(lc.dir, lc.config)?,
        },
        pre: Box::new(Embedding { table: embed }),
        layers,
        post: Box::new(NormHead { norm, lm_head }),
    })
}

/// `P.{q,k,v,o}_proj` and, when `qk_norm` is given, `P.q_norm` / `P.k_norm`.
pub fn attention(
    w: &mut Weights,
    prefix: &str,
    cfg: AttentionConfig,
    rope: Rope,
    qk_norm: Option<(f32, NormKind)>,
) -> Result<Mixer> {
    let (q_norm, k_norm) = match qk_norm {
        Some((eps, kind)) => (
            Some(norm(w, &format!("{prefix}.q_norm"), eps, kind)?),
            Some(norm(w, &format!("{prefix}.k_norm"), eps, kind)?),
        ),
        None => (None, None),
    };
    let a = Attention {
        cfg,
        q_proj: linear(w, &format!("{prefix}.q_proj"))?,
        k_proj: linear(w, &format!("{prefix}.k_proj"))?,
        v_proj: linear(w, &format!("{prefix}.v_proj"))?,
        o_proj: linear(w, &format!("{prefix}.o_proj"))?,
        q_norm,
        k_norm,
        rope,
    };
    a.check()?;
    Ok(Mixer::Attention(Box::new(a)))
}
