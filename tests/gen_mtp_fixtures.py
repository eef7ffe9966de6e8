#!/usr/bin/env python3
"""Generate porter's draft-head (MTP) fixtures and float32 draft-logit references.

Usage:
    python3 tests/gen_mtp_fixtures.py

This script only READS the main fixtures written by tests/gen_fixtures.py (config.json, weights,
reference.safetensors::ids_long) and is cheap to re-run after they are regenerated (~10 s).

It writes
  * three draft checkpoints (bf16, random, hub-style names; config.json / tokenizer.json /
    generation_config.json copied verbatim from the main fixture):
        tests/fixtures/qwen3_moe_mtp_draft/    LightLLM `qwen3_moe_mtp` layout, for main `qwen3_moe`
        tests/fixtures/qwen3_dense_mtp_draft/  same layout with a dense FFN, for main `qwen3`
        tests/fixtures/mistral_mtp_draft/      LightLLM `mistral_mtp` layout, for main `mistral`
  * for each of the main fixtures qwen3_moe, qwen3, mistral, qwen3_next_mtp:
        tests/fixtures/<main>/mtp_reference.safetensors   ids i64 [T], mtp_logits f32 [T-1, vocab]
        tests/fixtures/<main>/mtp_reference.json          versions, seeds, checks, stats
    (qwen3_next_mtp uses the mtp.* tensors already inside its own checkpoint; no draft folder.)

Row convention: ids = the main fixture's ids_long (T tokens).  Row p (0 <= p <= T-2) of mtp_logits is
the draft's prediction made from the main model's hidden at position p and the token x_{p+1}; it is a
prediction for token p+2 (the main model's row p+1 predicts the same token).

Draft semantics (shared/reference/models.md section 5), all in float32 on CPU:
  qwen3_moe_mtp (qwen3_moe, qwen3):  h_p = main hidden BEFORE model.norm (output of the last decoder layer)
      x = proj(cat(RMS(emb[x_{p+1}], norm_after_embedding), RMS(h_p, norm_before_output)))
      x = x + FFN(RMS(x, post_attention_layernorm))          (Qwen3-MoE MoE or dense SwiGLU)
      logits = lm_head(RMS(x, main model.norm))
  mistral_mtp (mistral): as above with hidden_in = RMS(RMS(h_p, main model.norm), mtp.hnorm),
      tensors mtp.eh_proj / mtp.enorm / mtp.hnorm / mtp.layers.0.*; dense FFN.
  qwen3_next_mtp (vLLM Qwen3NextMTP): hh_p = main hidden AFTER model.norm
      u = fc(cat(ZRMS(emb[x_{p+1}], pre_fc_norm_embedding), ZRMS(hh_p, pre_fc_norm_hidden)))
      u = Qwen3NextDecoderLayer[full attention, layer index 0](u, positions 0..T-2, causal over draft rows)
      logits = lm_head(ZRMS(u, mtp.norm))
  RMS(x, w) = w * x * rsqrt(mean(x^2) + eps);  ZRMS(x, w) = x * rsqrt(mean(x^2) + eps) * (1 + w).
"""

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
TV = transformers.__version__
OUT_GAIN = 0.5  # init gain of down_proj (residual-branch output), as in gen_fixtures.py

torch.set_default_dtype(torch.float32)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_num_threads(1)
torch.manual_seed(0)

# draft name -> (main fixture, layout, weight seed)
DRAFTS = {
    "qwen3_moe_mtp_draft": dict(main="qwen3_moe", layout="qwen3_moe_mtp", seed=2001),
    "qwen3_dense_mtp_draft": dict(main="qwen3", layout="qwen3_moe_mtp", seed=2002),
    "mistral_mtp_draft": dict(main="mistral", layout="mistral_mtp", seed=2003),
}
NEXT_MTP_MAIN = "qwen3_next_mtp"


def check_pure_torch():
    import importlib.util
    found = [p for p in ("fla", "causal_conv1d", "kernels") if importlib.util.find_spec(p) is not None]
    assert not found, f"kernel packages importable ({found}); uninstall them so HF uses its torch fallback"
    return "pure torch (fla, causal_conv1d, kernels not importable); eager attention; eager experts; float32 CPU"


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
def dump_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main_fingerprint(main_dir):
    """sha256 of the main fixture's weight files, config and reference (to detect stale MTP references)."""
    out = {}
    for fn in sorted(os.listdir(main_dir)):
        if fn.endswith(".safetensors") and not fn.startswith("mtp_reference") or fn == "config.json":
            out[fn] = sha256_file(os.path.join(main_dir, fn))[:16]
    return out


def rms(x, w, eps):
    """Standard (Llama-style) RMSNorm; for float32 inputs exactly w * x * rsqrt(mean(x^2) + eps)."""
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * n.to(x.dtype)


def zrms(x, w, eps):
    """Zero-centred RMSNorm (Qwen3-Next): x * rsqrt(mean(x^2) + eps) * (1 + w), all in f32, rounded once."""
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (n * (1.0 + w.float())).to(x.dtype)


def swiglu(x, g, u, d):
    return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)


def moe_qwen3(x, router, experts, top_k, norm_topk_prob):
    """Qwen3-MoE sparse block (no shared expert). x [N, H]; experts: list of (gate, up, down).
    Router softmax in f32 BEFORE top-k; renormalise iff norm_topk_prob; hit experts in ascending id."""
    logits = F.linear(x, router)
    p = torch.softmax(logits.float(), dim=-1)
    w, idx = torch.topk(p, top_k, dim=-1)
    if norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    w = w.to(x.dtype)
    out = torch.zeros_like(x)
    for e in range(len(experts)):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        y = swiglu(x[tok], *experts[e]) * w[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def moe_layer_rule(cfg, layer_idx=0):
    """Qwen3-MoE / Qwen3-Next decoder-layer rule: MoE iff idx not in mlp_only_layers, num_experts > 0
    and (idx + 1) % decoder_sparse_step == 0."""
    ne = cfg.get("num_experts", 0) or 0
    return (layer_idx not in (cfg.get("mlp_only_layers") or [])) and ne > 0 and \
        (layer_idx + 1) % cfg.get("decoder_sparse_step", 1) == 0


# --------------------------------------------------------------------------------------------
# random draft weights (same scheme as gen_fixtures.py: one PCG64 stream per tensor name)
# --------------------------------------------------------------------------------------------
def draw(shapes, seed):
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        sub = int.from_bytes(name.encode(), "little") % (2**61)
        rng = np.random.Generator(np.random.PCG64([seed, sub]))
        n = rng.standard_normal(size=shape)
        parent = name.split(".")[-2]
        if len(shape) == 1 and "norm" in parent:
            w = 1.0 + 0.1 * n                       # standard RMSNorm weight: 1 + N(0, 0.01)
        elif len(shape) == 2:
            w = n / math.sqrt(shape[1])             # Linear [out, in]: N(0, 1/in)
            if parent == "down_proj":
                w = OUT_GAIN * w
        else:
            raise ValueError(f"no init rule for {name} {shape}")
        out[name] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).to(torch.bfloat16).contiguous()
    return out


def draft_shapes(layout, cfg):
    H = cfg["hidden_size"]
    s = {}
    if layout == "qwen3_moe_mtp":
        p = "model.layers.0."
        s[p + "proj.weight"] = (H, 2 * H)
        for n in ("norm_after_embedding", "norm_before_output", "post_attention_layernorm"):
            s[p + n + ".weight"] = (H,)
        if moe_layer_rule(cfg, 0):
            E, I = cfg["num_experts"], cfg["moe_intermediate_size"]
            s[p + "mlp.gate.weight"] = (E, H)
            for e in range(E):
                s[p + f"mlp.experts.{e}.gate_proj.weight"] = (I, H)
                s[p + f"mlp.experts.{e}.up_proj.weight"] = (I, H)
                s[p + f"mlp.experts.{e}.down_proj.weight"] = (H, I)
        else:
            I = cfg["intermediate_size"]
            s[p + "mlp.gate_proj.weight"] = (I, H)
            s[p + "mlp.up_proj.weight"] = (I, H)
            s[p + "mlp.down_proj.weight"] = (H, I)
    elif layout == "mistral_mtp":
        I = cfg["intermediate_size"]
        s["mtp.eh_proj.weight"] = (H, 2 * H)
        for n in ("mtp.enorm", "mtp.hnorm", "mtp.layers.0.post_attention_layernorm"):
            s[n + ".weight"] = (H,)
        s["mtp.layers.0.mlp.gate_proj.weight"] = (I, H)
        s["mtp.layers.0.mlp.up_proj.weight"] = (I, H)
        s["mtp.layers.0.mlp.down_proj.weight"] = (H, I)
    else:
        raise ValueError(layout)
    return s


def natural_key(name):
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split(".")]


# --------------------------------------------------------------------------------------------
# main model: hiddens before / after the final norm
# --------------------------------------------------------------------------------------------
def load_main(main_dir, dtype=torch.float32):
    with contextlib.redirect_stderr(io.StringIO()):
        model = AutoModelForCausalLM.from_pretrained(main_dir, dtype=dtype, attn_implementation="eager",
                                                     experts_implementation="eager")
    model.eval()
    return model


@torch.no_grad()
def main_hiddens(model, ids):
    """(pre_norm [T,H], post_norm [T,H], logits [T,V], note).  pre = output of the last decoder layer
    (forward hook), post = output of model.model.norm (forward hook).  Checked against HF's
    output_hidden_states and against the logits."""
    got = {}

    def hook(name):
        def f(_m, _inp, out):
            got[name] = (out[0] if isinstance(out, tuple) else out).detach()
        return f

    hs = [model.model.layers[-1].register_forward_hook(hook("pre")),
          model.model.norm.register_forward_hook(hook("post"))]
    try:
        out = model(input_ids=ids[None, :], use_cache=False, output_hidden_states=True)
    finally:
        for h in hs:
            h.remove()
    pre, post = got["pre"][0], got["post"][0]
    logits = out.logits[0]
    # consistency checks
    assert torch.equal(model.model.norm(pre[None])[0], post)
    assert torch.allclose(model.lm_head(post), logits, atol=1e-5, rtol=0)
    hsl = out.hidden_states
    L = len(model.model.layers)
    assert len(hsl) == L + 1, len(hsl)
    last_is_post = torch.equal(hsl[-1][0], post)
    last_is_pre = torch.equal(hsl[-1][0], pre)
    assert last_is_post != last_is_pre
    note = (f"HF output_hidden_states has {len(hsl)} entries (embeddings + {L} layers); its LAST entry is the "
            f"{'POST-final-norm (model.norm output)' if last_is_post else 'PRE-final-norm (last layer output)'} "
            f"hidden; pre-norm hidden taken with a forward hook on model.model.layers[-1], post-norm with a "
            f"hook on model.model.norm; model.norm(pre) == post and lm_head(post) == logits checked")
    return pre, post, logits.float(), note


def main_params(model):
    cfg = model.config
    emb = model.model.embed_tokens.weight.detach()
    head = model.lm_head.weight.detach()
    return dict(emb=emb, head=head, norm=model.model.norm.weight.detach(), eps=cfg.rms_norm_eps,
                tied=head.data_ptr() == emb.data_ptr())


# --------------------------------------------------------------------------------------------
# FFN-only drafts (qwen3_moe_mtp, mistral_mtp)
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def ffn_draft_logits(layout, cfg, W, mp, ids, pre, dtype=torch.float32):
    """W: draft weights (hub names), mp: main params; returns [T-1, V] in dtype."""
    g = {k: v.to(dtype) for k, v in W.items()}
    emb, head, mnorm, eps = mp["emb"].to(dtype), mp["head"].to(dtype), mp["norm"].to(dtype), mp["eps"]
    e = emb[ids[1:]]                    # embedding of x_{p+1}
    h = pre[:-1].to(dtype)              # main hidden at p (pre final norm)
    if layout == "qwen3_moe_mtp":
        p = "model.layers.0."
        en = rms(e, g[p + "norm_after_embedding.weight"], eps)
        hn = rms(h, g[p + "norm_before_output.weight"], eps)
        x = F.linear(torch.cat([en, hn], -1), g[p + "proj.weight"])
        xn = rms(x, g[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.gate.weight" in g:
            E = cfg["num_experts"]
            ex = [(g[p + f"mlp.experts.{i}.gate_proj.weight"], g[p + f"mlp.experts.{i}.up_proj.weight"],
                   g[p + f"mlp.experts.{i}.down_proj.weight"]) for i in range(E)]
            y = moe_qwen3(xn, g[p + "mlp.gate.weight"], ex, cfg["num_experts_per_tok"], cfg["norm_topk_prob"])
        else:
            y = swiglu(xn, g[p + "mlp.gate_proj.weight"], g[p + "mlp.up_proj.weight"], g[p + "mlp.down_proj.weight"])
    else:  # mistral_mtp
        en = rms(e, g["mtp.enorm.weight"], eps)
        hn = rms(rms(h, mnorm, eps), g["mtp.hnorm.weight"], eps)  # main final norm first, then hnorm
        x = F.linear(torch.cat([en, hn], -1), g["mtp.eh_proj.weight"])
        xn = rms(x, g["mtp.layers.0.post_attention_layernorm.weight"], eps)
        y = swiglu(xn, g["mtp.layers.0.mlp.gate_proj.weight"], g["mtp.layers.0.mlp.up_proj.weight"],
                   g["mtp.layers.0.mlp.down_proj.weight"])
    x = x + y
    return F.linear(rms(x, mnorm, eps), head), (xn, y)


@torch.no_grad()
def hf_ffn_check(layout, cfg, main_model, W, xn, y):
    """Run the draft FFN through HF's own module class (fresh instance, draft weights) and compare."""
    mlp_cls = type(main_model.model.layers[0].mlp)
    is_moe = any(".mlp.experts." in k for k in W)
    if is_moe:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        mod = Qwen3MoeSparseMoeBlock(main_model.config)
        p = "model.layers.0.mlp."
        E = cfg["num_experts"]
        sd = {
            "gate.weight": W[p + "gate.weight"].float(),
            "experts.gate_up_proj": torch.stack([torch.cat([W[p + f"experts.{e}.gate_proj.weight"],
                                                            W[p + f"experts.{e}.up_proj.weight"]]).float()
                                                 for e in range(E)]),
            "experts.down_proj": torch.stack([W[p + f"experts.{e}.down_proj.weight"].float() for e in range(E)]),
        }
        assert mod.experts.config._experts_implementation == "eager"
    else:
        # the dense MLP class of the main model (Qwen3MLP / MistralMLP)
        dense = [l.mlp for l in main_model.model.layers if not hasattr(l.mlp, "experts")][0]
        mlp_cls = type(dense)
        mod = mlp_cls(main_model.config)
        p = "model.layers.0.mlp." if layout == "qwen3_moe_mtp" else "mtp.layers.0.mlp."
        sd = {f"{n}.weight": W[p + f"{n}.weight"].float() for n in ("gate_proj", "up_proj", "down_proj")}
    mod.load_state_dict(sd, strict=True)
    mod.eval()
    out = mod(xn[None])
    out = out[0] if isinstance(out, tuple) else out
    d = float((out[0] - y).abs().max())
    assert d < 1e-5, d
    return f"draft FFN == HF {type(mod).__name__} (fresh module, draft weights) max |diff| {d:.1e}"


# --------------------------------------------------------------------------------------------
# Qwen3-Next MTP (vLLM Qwen3NextMTP)
# --------------------------------------------------------------------------------------------
def read_checkpoint(main_dir):
    out = {}
    for fn in sorted(os.listdir(main_dir)):
        if fn.endswith(".safetensors") and fn.startswith("model"):
            out.update(load_file(os.path.join(main_dir, fn)))
    return out


def build_next_mtp_layer(main_model, mtp, dtype=torch.float32):
    """HF Qwen3NextDecoderLayer at layer index 0 forced to full attention, loaded with mtp.layers.0.*."""
    import copy
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextRotaryEmbedding
    cfg = copy.deepcopy(main_model.config)
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    assert cfg._attn_implementation == "eager" and cfg._experts_implementation == "eager"
    layer = Qwen3NextDecoderLayer(cfg, 0)
    rope = Qwen3NextRotaryEmbedding(cfg)
    p = "mtp.layers.0."
    sd = {}
    fused = {}
    for k, v in mtp.items():
        if not k.startswith(p):
            continue
        r = k[len(p):]
        if r.startswith("mlp.experts."):
            e, proj = r.split(".")[2], r.split(".")[3]
            fused.setdefault(proj, {})[int(e)] = v.float()
        else:
            sd[r] = v.float()
    if fused:
        E = len(fused["gate_proj"])
        sd["mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([fused["gate_proj"][e], fused["up_proj"][e]]) for e in range(E)])
        sd["mlp.experts.down_proj"] = torch.stack([fused["down_proj"][e] for e in range(E)])
    layer.load_state_dict(sd, strict=True)
    layer.eval()
    layer.to(dtype)
    return layer, rope, cfg


def causal_mask(n, dtype):
    m = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return m[None, None]


@torch.no_grad()
def next_mtp_logits(main_model, mtp, ids, post, dtype=torch.float32):
    cfg0 = main_model.config
    eps = cfg0.rms_norm_eps
    emb = main_model.model.embed_tokens.weight.detach().to(dtype)
    head = main_model.lm_head.weight.detach().to(dtype)
    g = {k: v.to(dtype) for k, v in mtp.items()}
    e = emb[ids[1:]]
    hh = post[:-1].to(dtype)
    u = F.linear(torch.cat([zrms(e, g["mtp.pre_fc_norm_embedding.weight"], eps),
                            zrms(hh, g["mtp.pre_fc_norm_hidden.weight"], eps)], -1), g["mtp.fc.weight"])
    layer, rope, cfg = build_next_mtp_layer(main_model, mtp, dtype)
    n = u.shape[0]
    pos = torch.arange(n)[None]
    cos_sin = rope(u[None], pos)
    v = layer(u[None], position_embeddings=cos_sin, attention_mask=causal_mask(n, dtype), position_ids=pos)[0]
    logits = F.linear(zrms(v, g["mtp.norm.weight"], eps), head)
    return logits, u, v, layer


@torch.no_grad()
def next_mtp_layer_by_hand(cfg, mtp, u):
    """Hand-written Qwen3-Next decoder layer (gated full attention + MoE with shared expert), f32."""
    p = "mtp.layers.0."
    g = {k[len(p):]: v.float() for k, v in mtp.items() if k.startswith(p)}
    eps = cfg.rms_norm_eps
    T, H = u.shape
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    theta = cfg.rope_parameters["rope_theta"]
    prf = cfg.rope_parameters.get("partial_rotary_factor", 1.0)
    rot = int(D * prf)
    x = zrms(u, g["input_layernorm.weight"], eps)
    qg = F.linear(x, g["self_attn.q_proj.weight"]).view(T, Hq, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(T, Hq * D)      # per-head q / gate split
    q = zrms(q, g["self_attn.q_norm.weight"], eps)
    k = zrms(F.linear(x, g["self_attn.k_proj.weight"]).view(T, Hkv, D), g["self_attn.k_norm.weight"], eps)
    vv = F.linear(x, g["self_attn.v_proj.weight"]).view(T, Hkv, D)
    inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
    fr = torch.arange(T, dtype=torch.float)[:, None] * inv[None]
    cos, sin = torch.cat([fr, fr], -1).cos()[:, None], torch.cat([fr, fr], -1).sin()[:, None]

    def rope(t):
        a, b = t[..., :rot], t[..., rot:]
        rh = torch.cat([-a[..., rot // 2:], a[..., :rot // 2]], -1)
        return torch.cat([a * cos + rh * sin, b], -1)

    q, k = rope(q), rope(k)
    rep = Hq // Hkv
    k = k.repeat_interleave(rep, dim=1)
    vv = vv.repeat_interleave(rep, dim=1)
    s = torch.einsum("thd,shd->hts", q, k) * D ** -0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1)[None], float("-inf"))
    o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), vv).reshape(T, Hq * D)
    o = o * torch.sigmoid(gate)
    h1 = u + F.linear(o, g["self_attn.o_proj.weight"])
    xn = zrms(h1, g["post_attention_layernorm.weight"], eps)
    if "mlp.gate.weight" in g:
        E = cfg.num_experts
        ex = [(g[f"mlp.experts.{e}.gate_proj.weight"], g[f"mlp.experts.{e}.up_proj.weight"],
               g[f"mlp.experts.{e}.down_proj.weight"]) for e in range(E)]
        y = moe_qwen3(xn, g["mlp.gate.weight"], ex, cfg.num_experts_per_tok, cfg.norm_topk_prob)
        sh = swiglu(xn, g["mlp.shared_expert.gate_proj.weight"], g["mlp.shared_expert.up_proj.weight"],
                    g["mlp.shared_expert.down_proj.weight"])
        y = y + torch.sigmoid(F.linear(xn, g["mlp.shared_expert_gate.weight"])) * sh
    else:
        y = swiglu(xn, g["mlp.gate_proj.weight"], g["mlp.up_proj.weight"], g["mlp.down_proj.weight"])
    return h1 + y


# --------------------------------------------------------------------------------------------
# statistics + writing
# --------------------------------------------------------------------------------------------
def stats(mtp_logits, main_logits, ids):
    T = ids.numel()
    top = torch.topk(mtp_logits, 2, dim=-1)
    margin = (top.values[:, 0] - top.values[:, 1]) / mtp_logits.std(dim=-1)
    a1 = top.indices[:, 0]
    agree_main = float((a1 == main_logits[1:].argmax(-1)).float().mean())
    agree_ids = float((a1[:T - 2] == ids[2:]).float().mean())
    return {
        "mtp_logits_shape": list(mtp_logits.shape),
        "mtp_logits_std": round(float(mtp_logits.std()), 6),
        "mtp_logits_abs_max": round(float(mtp_logits.abs().max()), 6),
        "top1_agreement_with_main_argmax_row_p_plus_1": round(agree_main, 6),
        "top1_agreement_with_ids_p_plus_2": round(agree_ids, 6),
        "top1_top2_margin_over_row_std_min": round(float(margin.min()), 6),
        "top1_top2_margin_over_row_std_frac_below_0.01": round(float((margin < 0.01).float().mean()), 6),
    }


def write_reference(main, ids, mtp_logits, info):
    T = ids.numel()
    assert mtp_logits.shape == (T - 1, mtp_logits.shape[1]) and mtp_logits.dtype == torch.float32
    folder = os.path.join(FIXTURES, main)
    save_file({"ids": ids.contiguous(), "mtp_logits": mtp_logits.contiguous()},
              os.path.join(folder, "mtp_reference.safetensors"), metadata={"format": "pt"})
    dump_json(os.path.join(folder, "mtp_reference.json"), info)


def bf16_ratio(x_bf16, ref):
    return round(float((x_bf16.float() - ref).abs().max() / ref.std(unbiased=False)), 6)


# --------------------------------------------------------------------------------------------
def run_ffn_draft(name, spec, path_desc):
    main = spec["main"]
    main_dir = os.path.join(FIXTURES, main)
    with open(os.path.join(main_dir, "config.json")) as f:
        cfg = json.load(f)
    ref = load_file(os.path.join(main_dir, "reference.safetensors"))
    ids = ref["ids_long"].to(torch.int64)
    T = ids.numel()
    assert T >= 160, T

    # ---- draft folder
    folder = os.path.join(FIXTURES, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    for fn in ("config.json", "generation_config.json", "tokenizer.json"):
        shutil.copyfile(os.path.join(main_dir, fn), os.path.join(folder, fn))
    W = draw(draft_shapes(spec["layout"], cfg), spec["seed"])
    save_file({k: W[k] for k in sorted(W, key=natural_key)}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        for k in f.keys():
            assert torch.equal(f.get_tensor(k), W[k])
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    assert size < 1024 * 1024, size

    # ---- references
    model = load_main(main_dir)
    pre, post, logits, hs_note = main_hiddens(model, ids)
    d_main = float((logits - ref["logits_long"]).abs().max())
    assert d_main < 1e-4, f"{main}: HF logits differ from its reference.safetensors by {d_main}"
    mp = main_params(model)
    Wf = {k: v.float() for k, v in W.items()}
    mtp_logits, (xn, y) = ffn_draft_logits(spec["layout"], cfg, Wf, mp, ids, pre)
    mtp_logits = mtp_logits.float()
    assert mtp_logits.shape[0] == T - 1
    notes = [hs_note, hf_ffn_check(spec["layout"], cfg, model, W, xn, y)]
    is_moe = any(".mlp.experts." in k for k in W)
    notes.append(f"draft FFN: {'MoE (Qwen3-MoE rule for layer index 0 with the main config)' if is_moe else 'dense SwiGLU'}"
                 + (f", E={cfg['num_experts']}, top_k={cfg['num_experts_per_tok']}, norm_topk_prob="
                    f"{cfg['norm_topk_prob']}, I={cfg['moe_intermediate_size']}" if is_moe else
                    f", intermediate_size={cfg['intermediate_size']}"))
    if spec["layout"] == "qwen3_moe_mtp":
        notes.append("hidden into norm_before_output = main hidden BEFORE model.norm (pre-final-norm)")
    else:
        notes.append("hidden into mtp.hnorm = RMS(main pre-norm hidden, main model.norm), i.e. the POST-final-norm hidden")
    notes.append(f"embedding / lm_head / final norm: the main model's (tied={mp['tied']})")

    # informative: the same computation in bf16 (HF bf16 main model + draft in bf16, HF-style RMSNorm)
    mb = load_main(main_dir, torch.bfloat16)
    pre_b, _, _, _ = main_hiddens(mb, ids)
    lb, _ = ffn_draft_logits(spec["layout"], cfg, W, main_params(mb), ids, pre_b, torch.bfloat16)
    r_bf16 = bf16_ratio(lb, mtp_logits)
    del mb

    st = stats(mtp_logits, logits, ids)
    write_reference(main, ids, mtp_logits, {
        "transformers_version": TV,
        "torch_version": torch.__version__,
        "path": path_desc,
        "draft_layout": spec["layout"],
        "draft_folder": f"tests/fixtures/{name}",
        "draft_weight_seed": spec["seed"],
        "draft_init": "Linear N(0, 1/in) (down_proj x 0.5); RMSNorm weights 1 + N(0, 0.01); bf16",
        "draft_size_bytes": size,
        "ids": "= reference.safetensors::ids_long of this fixture",
        "row_convention": "row p (0..T-2) = draft prediction for token p+2 from main hidden at p and token ids[p+1]",
        "main_fingerprint_sha256_16": main_fingerprint(main_dir),
        "main_logits_vs_reference_long_max_abs_diff": d_main,
        "bf16_ratio": r_bf16,
        "bf16_ratio_meaning": "max|draft logits (HF bf16 main model + draft in bf16) - f32 reference| / std_pop(reference)",
        **st,
        "checks": notes,
    })
    print(f"== {name} (main {main}, layout {spec['layout']}): {len(W)} tensors, {size} bytes; "
          f"mtp_logits {tuple(mtp_logits.shape)}, std {st['mtp_logits_std']:.3f}, bf16 ratio {r_bf16:.4f}, "
          f"top1 agree main {st['top1_agreement_with_main_argmax_row_p_plus_1']:.3f}, ids {st['top1_agreement_with_ids_p_plus_2']:.3f}")
    for n in notes:
        print(f"   - {n}")
    return st


def run_next_mtp(path_desc):
    main = NEXT_MTP_MAIN
    main_dir = os.path.join(FIXTURES, main)
    with open(os.path.join(main_dir, "config.json")) as f:
        cfg = json.load(f)
    ref = load_file(os.path.join(main_dir, "reference.safetensors"))
    ids = ref["ids_long"].to(torch.int64)
    T = ids.numel()
    assert T >= 160, T
    ck = read_checkpoint(main_dir)
    mtp = {k: v for k, v in ck.items() if k.startswith("mtp.")}
    assert mtp, "no mtp.* tensors in the qwen3_next_mtp checkpoint"
    model = load_main(main_dir)
    pre, post, logits, hs_note = main_hiddens(model, ids)
    d_main = float((logits - ref["logits_long"]).abs().max())
    assert d_main < 1e-4, f"{main}: HF logits differ from its reference.safetensors by {d_main}"
    mtp_f = {k: v.float() for k, v in mtp.items()}
    mtp_logits, u, v, layer = next_mtp_logits(model, mtp_f, ids, post)
    mtp_logits = mtp_logits.float()
    assert mtp_logits.shape[0] == T - 1
    notes = [hs_note]
    is_moe = type(layer.mlp).__name__.endswith("SparseMoeBlock")
    assert is_moe == moe_layer_rule(cfg, 0) == any(k.startswith("mtp.layers.0.mlp.experts.") for k in mtp)
    assert hasattr(layer, "self_attn")
    # hand-written layer: all rows
    vh = next_mtp_layer_by_hand(layer.self_attn.config, mtp_f, u)
    d_hand = float((vh - v).abs().max())
    assert d_hand < 1e-4, d_hand
    # row-wise recomputation with growing prefixes (row p sees draft rows 0..p only)
    d_pref = 0.0
    for n in (1, 2, 7, 64, u.shape[0] - 1):
        _, _, vp, _ = next_mtp_logits(model, mtp_f, ids[: n + 1], post[: n + 1])
        d_pref = max(d_pref, float((vp - v[:n]).abs().max()))
    assert d_pref < 1e-4, d_pref
    # RoPE is relative: a constant position offset changes nothing beyond rounding (so this reference pins
    # the draft rows' relative positions and causality, not porter's absolute position offset)
    n = u.shape[0]
    pos1 = torch.arange(n)[None] + 1
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding
    v_shift = layer(u[None], position_embeddings=Qwen3NextRotaryEmbedding(layer.self_attn.config)(u[None], pos1),
                    attention_mask=causal_mask(n, torch.float32), position_ids=pos1)[0]
    d_shift = float((v_shift - v).abs().max())
    notes.append(
        "hidden into pre_fc_norm_hidden = main hidden AFTER model.norm (post-final-norm, vLLM semantics)")
    notes.append(
        f"MTP layer = transformers Qwen3NextDecoderLayer(config copy with layer_types all 'full_attention', "
        f"layer_idx=0) loaded strictly with mtp.layers.0.* (experts fused as gate_up_proj [E,2I,H] gate rows first, "
        f"down_proj [E,H,I]); mlp={type(layer.mlp).__name__}; eager attention, eager experts; run once over the "
        f"T-1 draft rows with position_ids 0..T-2, additive causal mask (finfo.min above the diagonal), "
        f"Qwen3NextRotaryEmbedding(rope_theta={layer.self_attn.config.rope_parameters['rope_theta']}, "
        f"partial_rotary_factor={layer.self_attn.config.rope_parameters.get('partial_rotary_factor')})")
    notes.append(f"HF layer == hand-written layer (per-head q/gate split, ZRMS q/k norms, partial NeoX RoPE at "
                 f"position p, causal GQA softmax, sigmoid(gate), MoE + sigmoid-gated shared expert) on all rows: "
                 f"max |diff| {d_hand:.1e}")
    notes.append(f"prefix consistency: recomputing with ids[:n+1] for n in (1,2,7,64,T-2) gives the same first n rows "
                 f"(max |diff| {d_pref:.1e}): row p depends only on draft rows 0..p")
    notes.append(f"positions 1..T-1 instead of 0..T-2 change the MTP layer output by only {d_shift:.1e} (RoPE is "
                 f"relative): the reference pins relative positions + causality, not the absolute offset")
    notes.append("concat order [ZRMS(embedding), ZRMS(hidden)]; final ZRMS(mtp.norm); embedding and lm_head of the main model")

    mb = load_main(main_dir, torch.bfloat16)
    _, post_b, _, _ = main_hiddens(mb, ids)
    lb, _, _, _ = next_mtp_logits(mb, {k: v for k, v in mtp.items()}, ids, post_b, torch.bfloat16)
    r_bf16 = bf16_ratio(lb, mtp_logits)
    del mb

    st = stats(mtp_logits, logits, ids)
    write_reference(main, ids, mtp_logits, {
        "transformers_version": TV,
        "torch_version": torch.__version__,
        "path": path_desc,
        "draft_layout": "qwen3_next_mtp (vLLM Qwen3NextMTP)",
        "draft_folder": None,
        "draft_weights": f"{len(mtp)} mtp.* tensors inside this fixture's own checkpoint",
        "ids": "= reference.safetensors::ids_long of this fixture",
        "row_convention": "row p (0..T-2) = draft prediction for token p+2 from main hidden at p and token ids[p+1]; "
                          "draft attention position p, causal over draft rows 0..p",
        "main_fingerprint_sha256_16": main_fingerprint(main_dir),
        "main_logits_vs_reference_long_max_abs_diff": d_main,
        "bf16_ratio": r_bf16,
        "bf16_ratio_meaning": "max|draft logits (HF bf16 main model + MTP (HF layer) in bf16) - f32 reference| / std_pop(reference)",
        **st,
        "checks": notes,
    })
    print(f"== {main} (qwen3_next_mtp): {len(mtp)} mtp tensors; mtp_logits {tuple(mtp_logits.shape)}, "
          f"std {st['mtp_logits_std']:.3f}, bf16 ratio {r_bf16:.4f}, "
          f"top1 agree main {st['top1_agreement_with_main_argmax_row_p_plus_1']:.3f}, ids {st['top1_agreement_with_ids_p_plus_2']:.3f}")
    for n in notes:
        print(f"   - {n}")
    return st


def main():
    path_desc = check_pure_torch()
    transformers.logging.set_verbosity_error()
    print(f"transformers {TV}, torch {torch.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    for name, spec in DRAFTS.items():
        run_ffn_draft(name, spec, path_desc)
    run_next_mtp(path_desc)


if __name__ == "__main__":
    main()
