//! Model-building helpers: they take weight slots by the naming convention of the weight maps
//! (a linear layer `P` has its weight at slot `P` and an optional bias at `P.bias`) and return
//! the shared blocks of [`crate::nn`].

use crate::bail;
use crate::error::Result;
use crate::load::config::check_act_device;
use crate::load::shard::ShardAxis;
use crate::load::weight_map::Weights;
use crate::nn::*;
use crate::tensor::Tensor;

pub fn linear(w: &mut Weights, slot: &str) -> Result<Linear> {
    let reduce = row_parallel(w, slot);
    let weight = w.take(slot)?;
    let bias = w.take_opt(&format!("{slot}.bias"))?;
    Ok(Linear { reduce, ..Linear::new(weight, bias) })
}

/// The communicator that sums a row-parallel slot's partial products (`None` when the slot
/// is loaded whole on this rank).
fn row_parallel(w: &Weights, slot: &str) -> Option<std::sync::Arc<dyn crate::comm::Communicator>> {
    (w.shard_axis(slot) == Some(ShardAxis::Row)).then(|| w.comm()).flatten()
}

/// `n` split evenly over the `world` ranks of a tensor-parallel group (`what` names it in the
/// error when `world` does not divide it).
fn per_rank(n: usize, world: usize, what: &str) -> Result<usize> {
    if !n.is_multiple_of(world) {
        bail!(Config, "tensor-parallel size {world} does not divide {what} = {n}");
    }
    Ok(n / world)
}

/// Heads that are split over the ranks while there are at least as many as ranks, and
/// replicated (one per rank, shared by `world / n` ranks) when there are fewer.
fn per_rank_or_shared(n: usize, world: usize, what: &str) -> Result<usize> {
    if n >= world {
        per_rank(n, world, what)
    } else if world.is_multiple_of(n) {
        Ok(1)
    } else {
        bail!(Config, "tensor-parallel size {world} is not a multiple of {what} = {n}")
    }
}

pub fn norm(w: &mut Weights, slot: &str, eps: f32, kind: NormKind) -> Result<RmsNorm> {
    Ok(RmsNorm::new(w.take(slot)?, eps, kind))
}

/// The feed-forward half of a layer whose slots start with `prefix` (e.g. `"layers.3."`):
/// the MoE at `{prefix}moe` when `moe` gives `(top_k, norm_topk_prob)`, else the dense gated
/// MLP at `{prefix}mlp`; both with the gate activation `act` (the config's `hidden_act`).
///
/// # Errors
/// A non-SiLU `act` on a CUDA device ([`check_act_device`]), or the weights' errors.
pub fn feed_forward(w: &mut Weights, prefix: &str, moe: Option<(usize, bool)>, act: Act) -> Result<FeedForward> {
    Ok(match moe {
        Some((top_k, norm_topk_prob)) => {
            FeedForward::Moe(Box::new(self::moe(w, &format!("{prefix}moe"), top_k, norm_topk_prob, act)?))
        }
        None => FeedForward::Dense(Box::new(swiglu(w, &format!("{prefix}mlp"), act)?)),
    })
}

/// A linear layer packed from several slots stacked along the output rows (one GEMM for
/// all of them): the weights `[Σ out_i, in]`, and the biases likewise when every part has
/// one (a mix of biased and bias-free parts is an error).
pub fn packed_linear(w: &mut Weights, slots: &[String]) -> Result<Linear> {
    let biases: Vec<String> = slots.iter().map(|s| format!("{s}.bias")).collect();
    let with_bias = biases.iter().filter(|b| w.contains(b)).count();
    let weight = w.take_packed(slots)?;
    let bias = match with_bias {
        0 => None,
        n if n == slots.len() => Some(w.take_packed(&biases)?),
        _ => bail!(WeightMap, "packing {slots:?}: some parts have a bias and some do not"),
    };
    Ok(Linear::new(weight, bias))
}

/// `P.gate_proj`, `P.up_proj` (packed into one `[gate; up]` projection) and `P.down_proj`,
/// gated by `act`.
///
/// # Errors
/// A non-SiLU `act` on a CUDA device ([`check_act_device`]), or the weights' errors.
pub fn swiglu(w: &mut Weights, prefix: &str, act: Act) -> Result<SwiGlu> {
    check_act_device(act, w.device())?;
    let gate_up = packed_linear(w, &[format!("{prefix}.gate_proj"), format!("{prefix}.up_proj")])?;
    Ok(SwiGlu { gate_up, down: linear(w, &format!("{prefix}.down_proj"))?, act })
}

/// `P.router` and the stacked experts `P.gate_proj`, `P.up_proj`, `P.down_proj`; with a
/// shared expert (`P.shared_expert.*`, `P.shared_expert_gate`) the router, the shared
/// gate / up projections and the shared gate row are packed into one projection
/// `[router; gate; up; shared gate]`, served by one f32-output GEMM. Every expert and the
/// shared expert are gated by `act`.
///
/// # Errors
/// A non-SiLU `act` on a CUDA device ([`check_act_device`]), or the weights' errors.
pub fn moe(w: &mut Weights, prefix: &str, top_k: usize, norm_topk_prob: bool, act: Act) -> Result<Moe> {
    check_act_device(act, w.device())?;
    let router = format!("{prefix}.router");
    let experts = w.slot_shape(&router)?.first().copied().unwrap_or(0);
    let has_shared = w.contains(&format!("{prefix}.shared_expert_gate"));
    let mut parts = vec![router.clone()];
    let shared_gu = [format!("{prefix}.shared_expert.gate_proj"), format!("{prefix}.shared_expert.up_proj")];
    if has_shared {
        parts.extend(shared_gu.iter().cloned());
        parts.push(format!("{prefix}.shared_expert_gate"));
    }
    if let Some(b) = parts.iter().map(|p| format!("{p}.bias")).find(|b| w.contains(b)) {
        bail!(WeightMap, "{b}: biases on the MoE router / shared expert input projections are not supported");
    }
    // An FP8 shared expert next to a bf16 router cannot share one packed weight: the
    // shared gate / up projections are then held apart.
    let apart = has_shared && w.is_fp8(&shared_gu[0])? != w.is_fp8(&router)?;
    let (input, shared_in) = if apart {
        let input = w.take_packed(&[router, format!("{prefix}.shared_expert_gate")])?;
        (input, Some(w.take_packed(&shared_gu)?))
    } else {
        (w.take_packed(&parts)?, None)
    };
    let input = pad_rows(input, MOE_INPUT_ROW_ALIGN)?;
    // Tensor parallelism: the routed and shared partial outputs are summed once, by the MoE.
    let reduce = row_parallel(w, &format!("{prefix}.down_proj"));
    let shared = if has_shared {
        let mut down = linear(w, &format!("{prefix}.shared_expert.down_proj"))?;
        if down.reduce.take().is_some() && reduce.is_none() {
            bail!(WeightMap, "{prefix}: the shared expert is row-parallel but the routed experts are not");
        }
        Some(SharedExpert { inter: down.w.dim(1), down })
    } else {
        None
    };
    let m = Moe {
        input,
        shared_in,
        experts,
        gate: w.take(&format!("{prefix}.gate_proj"))?,
        up: w.take(&format!("{prefix}.up_proj"))?,
        down: w.take(&format!("{prefix}.down_proj"))?,
        top_k,
        norm_topk_prob,
        shared,
        reduce,
        act,
    };
    m.check()?;
    Ok(m)
}

/// `t` (`[n, ...]`) with zero rows appended up to a multiple of `align` rows. An FP8 weight
/// stays as it is (its blocks of 128 rows are scaled together).
fn pad_rows(t: Tensor, align: usize) -> Result<Tensor> {
    let n = t.dim(0);
    let pad = n.next_multiple_of(align) - n;
    if pad == 0 || t.is_fp8() {
        return Ok(t);
    }
    let mut shape = t.shape().to_vec();
    shape[0] = pad;
    let zeros = Tensor::zeros(shape, t.dtype()).into_device(t.device())?;
    Tensor::concat_rows(&[&t, &zeros])
}

/// Gated DeltaNet at `P.in_proj_qkvz` and `P.in_proj_ba` (packed into one projection),
/// `P.conv1d` (`[C, 1, K]`), `P.A_log`, `P.dt_bias` (f32), `P.norm`, `P.out_proj`; the conv
/// activation is `cfg.act`.
///
/// # Errors
/// A non-SiLU `cfg.act` on a CUDA device ([`check_act_device`]), tensor-parallel sizes that
/// do not divide the heads, or the weights' errors.
pub fn gated_delta_net(w: &mut Weights, prefix: &str, cfg: crate::nn::gdn::GdnConfig) -> Result<Mixer> {
    check_act_device(cfg.act, w.device())?;
    // Tensor parallelism: this rank's value heads, and the key heads they read (shared by
    // several ranks when there are more ranks than key heads).
    let world = w.tp().world;
    let cfg = crate::nn::gdn::GdnConfig {
        key_heads: per_rank_or_shared(cfg.key_heads, world, "linear_num_key_heads")?,
        value_heads: per_rank(cfg.value_heads, world, "linear_num_value_heads")?,
        ..cfg
    };
    let conv_w = w.take_f32(&format!("{prefix}.conv1d"))?;
    let conv_w =
        conv_w.reshape([cfg.conv_dim(), cfg.conv_kernel]).map_err(|e| crate::err!(Shape, "{prefix}.conv1d: {e}"))?;
    let (qkvz, ba) = (format!("{prefix}.in_proj_qkvz"), format!("{prefix}.in_proj_ba"));
    // An FP8 in_proj_qkvz next to a bf16 in_proj_ba is held apart (two GEMMs).
    let (in_proj, in_proj_ba) = if w.is_fp8(&qkvz)? != w.is_fp8(&ba)? {
        (linear(w, &qkvz)?, Some(linear(w, &ba)?))
    } else {
        (packed_linear(w, &[qkvz, ba])?, None)
    };
    let g = crate::nn::gdn::GatedDeltaNet {
        cfg,
        in_proj,
        in_proj_ba,
        conv_w,
        a_log: w.take_f32(&format!("{prefix}.A_log"))?,
        dt_bias: w.take_f32(&format!("{prefix}.dt_bias"))?,
        norm_w: w.take(&format!("{prefix}.norm"))?,
        out_proj: linear(w, &format!("{prefix}.out_proj"))?,
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
    let embed = std::sync::Arc::new(w.take("embed")?);
    // A tied lm_head shares the embedding table (one copy on the device); under tensor
    // parallelism it is this rank's rows of it (vocab-parallel).
    let tp = w.tp();
    let lm_head = match (base.tie_word_embeddings, tp.world) {
        (true, 1) => embed.clone(),
        (true, n) => {
            let rows = per_rank(base.vocab_size, n, "vocab_size")?;
            std::sync::Arc::new(embed.narrow_rows(tp.rank * rows, rows)?)
        }
        (false, _) => std::sync::Arc::new(w.take("lm_head")?),
    };
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
            kv_cache_dtype: Default::default(),
        },
        pre: Box::new(Embedding { table: embed }),
        layers,
        post: Box::new(NormHead { norm, lm_head }),
    })
}

/// Environment variable: `apart` loads an attention block's q / k / v projections as three
/// weights (three GEMMs; for A/B) instead of packed into one; `packed` or unset is the default
/// (read at each load; another value warns once and means the default).
pub const QKV_ENV: &str = "PORTER_QKV";

/// Whether [`QKV_ENV`] asks for the projections apart.
fn qkv_apart() -> bool {
    match std::env::var(QKV_ENV).as_deref().map(str::trim) {
        Err(_) | Ok("" | "packed") => false,
        Ok("apart") => true,
        Ok(other) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| eprintln!("warning: {QKV_ENV}={other:?} is not one of packed, apart; using packed"));
            false
        }
    }
}

/// `P.q_proj`, `P.k_proj`, `P.v_proj` packed into one `[q; k; v]` projection (one GEMM),
/// or apart where they cannot share one weight (an FP8 part beside dense ones, or a bias on
/// some parts only) or [`QKV_ENV`] asks for it.
fn qkv_proj(w: &mut Weights, prefix: &str) -> Result<crate::nn::QkvProj> {
    let slots = ["q_proj", "k_proj", "v_proj"].map(|p| format!("{prefix}.{p}"));
    let mut fp8 = Vec::with_capacity(3);
    for s in &slots {
        fp8.push(w.is_fp8(s)?);
    }
    let biased = slots.iter().filter(|s| w.contains(&format!("{s}.bias"))).count();
    if fp8.iter().all(|&f| f == fp8[0]) && (biased == 0 || biased == 3) && !qkv_apart() {
        return Ok(crate::nn::QkvProj::Packed(packed_linear(w, &slots)?));
    }
    let [q, k, v] = slots;
    Ok(crate::nn::QkvProj::Apart { q: linear(w, &q)?, k: Box::new(linear(w, &k)?), v: Box::new(linear(w, &v)?) })
}

/// `P.{q,k,v,o}_proj` (q / k / v as `qkv_proj` packs them) and, when `qk_norm` is given, `P.q_norm` / `P.k_norm`.
pub fn attention(
    w: &mut Weights,
    prefix: &str,
    cfg: AttentionConfig,
    rope: Rope,
    qk_norm: Option<(f32, NormKind)>,
) -> Result<Mixer> {
    // Tensor parallelism: this rank's query heads and the KV heads they read.
    let world = w.tp().world;
    let cfg = AttentionConfig {
        heads: per_rank(cfg.heads, world, "num_attention_heads")?,
        kv_heads: per_rank_or_shared(cfg.kv_heads, world, "num_key_value_heads")?,
        ..cfg
    };
    let (q_norm, k_norm) = match qk_norm {
        Some((eps, kind)) => (
            Some(norm(w, &format!("{prefix}.q_norm"), eps, kind)?),
            Some(norm(w, &format!("{prefix}.k_norm"), eps, kind)?),
        ),
        None => (None, None),
    };
    let a = Attention {
        cfg,
        qkv: qkv_proj(w, prefix)?,
        o_proj: linear(w, &format!("{prefix}.o_proj"))?,
        q_norm,
        k_norm,
        rope: rope.to_device(w.device())?,
    };
    a.check()?;
    Ok(Mixer::Attention(Box::new(a)))
}

/// How [`llama_decoder`] builds one layer.
#[derive(Debug, Clone)]
pub struct LlamaLayer {
    /// Heads, KV heads, head dim and sliding window of the attention.
    pub attn: AttentionConfig,
    /// Per-head RMSNorm of q and k before RoPE at `attn.q_norm` / `attn.k_norm` (Qwen3).
    pub qk_norm: bool,
    /// `(top_k, norm_topk_prob)`: a sparse MoE at `moe`; `None`: the SwiGLU at `mlp`.
    pub moe: Option<(usize, bool)>,
}

/// A Llama-style decoder (the slots of the `llama` weight-map layout): for each layer `i`,
/// `layers.{i}.input_norm`, the attention at `layers.{i}.attn` (biases when the map loads
/// them) with RoPE from `rope`, `layers.{i}.post_norm` and the feed-forward; then the
/// embedding, final norm and lm_head of [`assemble`]. Every norm is a standard RMSNorm with
/// `rms_norm_eps`; the feed-forward gate activation is `base.hidden_act`.
pub fn llama_decoder(
    lc: &crate::load::registry::LoadContext,
    w: &mut Weights,
    architecture: &str,
    base: &crate::load::config::DecoderConfig,
    rope: &crate::load::config::RopeParams,
    layers: Vec<LlamaLayer>,
) -> Result<crate::model::Model> {
    // Before any weight is placed on the device (the blocks' builders check again).
    check_act_device(base.hidden_act, w.device())?;
    let eps = base.rms_norm_eps as f32;
    let mut built: Vec<Box<dyn crate::layer::TransformerLayer>> = Vec::with_capacity(layers.len());
    for (i, l) in layers.into_iter().enumerate() {
        let p = format!("layers.{i}");
        let rope = Rope::new(rope, l.attn.head_dim)?;
        let qk_norm = l.qk_norm.then_some((eps, NormKind::Standard));
        built.push(Box::new(DecoderLayer {
            input_norm: norm(w, &format!("{p}.input_norm"), eps, NormKind::Standard)?,
            attn: attention(w, &format!("{p}.attn"), l.attn, rope, qk_norm)?,
            post_norm: norm(w, &format!("{p}.post_norm"), eps, NormKind::Standard)?,
            ffn: feed_forward(w, &format!("{p}."), l.moe, base.hidden_act)?,
        }));
    }
    assemble(lc, w, architecture, base, NormKind::Standard, built)
}
