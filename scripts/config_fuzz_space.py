"""The config space of scripts/config_fuzz.py: a passing base config per architecture, the
samplers of legal values for every key transformers 5.24 honours, the keys an absent-key sweep
leaves out, and the known-finding tags of `--avoid`. Pure Python (no torch): imported by
config_fuzz.py."""

import copy
import json
import random

VOCAB = 512
DELETE = "__DELETE__"  # an override that removes the key from the base config

# ------------------------------------------------------------------------------------------
# Base configs (each passes) and samplers
# ------------------------------------------------------------------------------------------
def common(arch, model_type, **kw):
    d = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": VOCAB,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
    }
    d.update(kw)
    return d


BASES = {
    "llama": common("LlamaForCausalLM", "llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                    rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False, mlp_bias=False),
    "mistral": common("MistralForCausalLM", "mistral", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32768,
                      rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None),
    "qwen3": common("Qwen3ForCausalLM", "qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None, attention_bias=False,
                    use_sliding_window=False, sliding_window=None, max_window_layers=2),
    "qwen3_moe": common("Qwen3MoeForCausalLM", "qwen3_moe", hidden_size=64, intermediate_size=96,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
                        attention_bias=False, use_sliding_window=False, sliding_window=None,
                        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                        decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False,
                        router_aux_loss_coef=0.001),
    "qwen3_next": common("Qwen3NextForCausalLM", "qwen3_next", hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000000.0, rope_scaling=None,
                         partial_rotary_factor=0.25, attention_bias=False, full_attention_interval=2,
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                         linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, shared_expert_intermediate_size=32, norm_topk_prob=True,
                         decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False,
                         router_aux_loss_coef=0.001),
}
ARCH_CLASS = {k: v["architectures"][0] for k, v in BASES.items()}

ACTS_OTHER = ["swish", "gelu", "gelu_pytorch_tanh", "relu", "gelu_new", "tanh", "quick_gelu", "relu2", "mish"]


def pick(r, choices, weights=None):
    return r.choices(choices, weights=weights, k=1)[0]


def divisors(n, cap=8):
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def s_common(r, o, arch, T):
    """Keys every architecture shares."""
    H = pick(r, [32, 48, 64, 96, 128])
    o["hidden_size"] = H
    heads_choices = [h for h in [1, 2, 3, 4, 6, 8] if arch != "llama" or H % h == 0]
    heads = pick(r, heads_choices)
    o["num_attention_heads"] = heads
    o["num_hidden_layers"] = pick(r, [1, 2, 3, 4])
    o["intermediate_size"] = pick(r, [16, 40, 64, 96, 128, 200])
    o["rms_norm_eps"] = pick(r, [1e-6, 1e-5, 1e-3, 0.05, DELETE])
    o["tie_word_embeddings"] = pick(r, [False, True, DELETE])
    o["hidden_act"] = pick(r, ["silu"] * 50 + ACTS_OTHER)
    # max_position_embeddings: mostly large; sometimes small (some below the prompt length).
    o["max_position_embeddings"] = pick(r, [2048, 4096, 32768, 128, 64, 32, 8, DELETE],
                                        weights=[4, 4, 2, 2, 2, 2, 1, 2])
    kvs = divisors(heads)
    o["num_key_value_heads"] = pick(r, kvs + [DELETE, None], weights=[4] * len(kvs) + [1, 1])
    # head_dim: explicit (possibly != hidden/heads) or absent / null (class default).
    hd_explicit = [8, 16, 24, 32, 40, 64]
    if arch == "qwen3_next":
        hd_explicit += [20, 36, 44, 12, 30]
    o["head_dim"] = pick(r, hd_explicit + [DELETE, None], weights=[2] * len(hd_explicit) + [3, 1])
    return heads


def head_dim_of(arch, c):
    hd = c.get("head_dim", DELETE)
    if hd is None or hd == DELETE:
        if arch == "qwen3" and hd == DELETE:
            return 128
        if arch == "qwen3_next" and hd == DELETE:
            return 256
        return c["hidden_size"] // c.get("num_attention_heads", CLASS_HEADS[arch])
    return hd


def s_rope(r, o, arch, c):
    """rope_theta / rope_scaling / rope_parameters / partial_rotary_factor in either config style."""
    hd = head_dim_of(arch, c)
    maxpos = c.get("max_position_embeddings")
    theta = pick(r, [10000.0, 1000000.0, 500000.0, 100.0, 5e6, 10000, DELETE])
    kind = pick(r, ["default", "none", "linear", "yarn", "llama3", "dynamic", "longrope", "proportional"],
                weights=[14, 12, 16, 22, 16, 4, 3, 3])
    block = {}
    if kind == "default":
        block = {"rope_type": "default"}
    elif kind == "linear":
        block = {"rope_type": "linear", "factor": pick(r, [2.0, 4.0, 1.0, 2.5, 8, 0.5], weights=[4, 3, 2, 2, 2, 1])}
    elif kind == "yarn":
        block = {"rope_type": "yarn", "factor": pick(r, [2.0, 4.0, 8.0, 1.5, 32.0, None], weights=[3, 3, 2, 2, 1, 1])}
        om = pick(r, [DELETE, 4, 8, 16, 64, 4096], weights=[2, 2, 2, 2, 2, 1])
        if om != DELETE:
            block["original_max_position_embeddings"] = om
        for key, vals in [("beta_fast", [32, 16, 8, 64, 4]), ("beta_slow", [1, 2, 0.5, 1.5]),
                          ("attention_factor", [1.0, 0.8, 1.3]), ("truncate", [True, False])]:
            if r.random() < 0.3:
                block[key] = pick(r, vals)
        if r.random() < 0.25:
            block["mscale"], block["mscale_all_dim"] = pick(r, [(1, 1), (0.707, 1), (1, 0), (1.0, 0.5), (2, 1)])
    elif kind == "llama3":
        om = pick(r, [8, 16, 64, 1024, 8192, DELETE], weights=[3, 3, 3, 2, 1, 1])
        block = {"rope_type": "llama3", "factor": pick(r, [8.0, 4.0, 2.0, 32.0]),
                 "low_freq_factor": pick(r, [1.0, 2.0, 0.5]), "high_freq_factor": pick(r, [4.0, 8.0, 2.0, 1.0])}
        if om != DELETE:
            block["original_max_position_embeddings"] = om
    elif kind == "dynamic":
        block = {"rope_type": "dynamic", "factor": pick(r, [2.0, 4.0])}
    elif kind == "longrope":
        n = int(hd * 1.0) // 2
        block = {"rope_type": "longrope", "short_factor": [round(1 + 0.1 * i, 2) for i in range(n)],
                 "long_factor": [round(1 + 0.5 * i, 2) for i in range(n)],
                 "original_max_position_embeddings": pick(r, [8, 64, 1024])}
        if r.random() < 0.5:
            block["factor"] = pick(r, [2.0, 4.0])
    elif kind == "proportional":
        block = {"rope_type": "proportional", "partial_rotary_factor": pick(r, [0.5, 0.25, 1.0])}
        if r.random() < 0.5:
            block["factor"] = pick(r, [1.0, 2.0])
    # a top-level original_max_position_embeddings (Phi-3 style; transformers' standardize_rope_params
    # gives it priority over the block's for llama3 / yarn / longrope)
    if kind in ("yarn", "llama3", "longrope") and r.random() < 0.2:
        o["original_max_position_embeddings"] = pick(r, [8, 16, 64, 1024])
    # legacy "type" key instead of "rope_type" (hub configs of old checkpoints)
    if block and r.random() < 0.15:
        block["type"] = block.pop("rope_type")
    # partial_rotary_factor (Qwen3-Next applies it; the others' default RoPE ignores it)
    if arch == "qwen3_next":
        prf = pick(r, [DELETE, 0.25, 0.5, 1.0, 0.3, 0.75, 0.125, 0.4], weights=[3, 2, 2, 2, 2, 1, 1, 1])
    else:
        prf = pick(r, [DELETE, 0.5, 1.0], weights=[10, 1, 1])
    style = pick(r, ["hub", "hub", "v5", "both"], weights=[5, 5, 8, 2])
    if style == "hub":
        o["rope_theta"] = theta
        o["rope_scaling"] = block if block else pick(r, [None, DELETE, {}])
        o["rope_parameters"] = DELETE
        if block and r.random() < 0.15:  # rope_theta inside the block too (the block's wins in HF)
            o["rope_scaling"] = dict(block, rope_theta=pick(r, [100.0, 50000.0, 2e6]))
        if prf != DELETE:
            o["partial_rotary_factor"] = prf
            if arch == "qwen3_next" and r.random() < 0.3:  # in the block too, another value
                rs = o["rope_scaling"] if isinstance(o["rope_scaling"], dict) and o["rope_scaling"] else None
                o["rope_scaling"] = dict(rs or {"rope_type": "default"},
                                         partial_rotary_factor=pick(r, [0.5, 1.0, 0.25]))
        elif arch == "qwen3_next":
            o["partial_rotary_factor"] = DELETE
    elif style == "both":
        # rope_scaling (non-empty wins in HF) or an empty one next to a v5 rope_parameters block
        other = {"rope_type": "linear", "factor": 3.0, "rope_theta": 777.0}
        b = dict(block) if block else {"rope_type": "default"}
        if theta != DELETE:
            b["rope_theta"] = theta
        if r.random() < 0.5:
            o["rope_scaling"], o["rope_parameters"] = b, other
        else:
            o["rope_scaling"], o["rope_parameters"] = {}, b
        o["rope_theta"] = pick(r, [DELETE, 123456.0])
        if prf != DELETE:
            o["partial_rotary_factor"] = prf
        elif arch == "qwen3_next":
            o["partial_rotary_factor"] = DELETE
    else:
        b = dict(block) if block else {"rope_type": "default"}
        if theta != DELETE:
            b["rope_theta"] = theta
        if prf != DELETE:
            if r.random() < 0.7:
                b["partial_rotary_factor"] = prf
            else:
                o["partial_rotary_factor"] = prf
        elif arch == "qwen3_next":
            o["partial_rotary_factor"] = DELETE
        o["rope_parameters"] = b
        o["rope_theta"] = DELETE
        o["rope_scaling"] = DELETE


def s_moe(r, o, c, next_=False):
    L = c["num_hidden_layers"]
    E = pick(r, [2, 4, 6, 8, 1, 0], weights=[3, 4, 2, 3, 1, 1])
    o["num_experts"] = E
    o["num_experts_per_tok"] = pick(r, list(range(1, E + 1))) if E > 0 else pick(r, [1, 2])
    o["norm_topk_prob"] = pick(r, [True, False, DELETE])
    o["decoder_sparse_step"] = pick(r, [1, 1, 2, 3, DELETE])
    ml = [i for i in range(L) if r.random() < 0.3]
    if r.random() < 0.15:  # an index past the last layer (a truncated checkpoint): HF just never meets it
        ml = ml + [L + pick(r, [0, 1, 5])]
    o["mlp_only_layers"] = pick(r, [ml, ml, [], DELETE, None])
    o["moe_intermediate_size"] = pick(r, [16, 24, 32, 48])
    if next_:
        o["shared_expert_intermediate_size"] = pick(r, [16, 32, 48, 64])


def sample(arch, seed, T):
    """Overrides of BASES[arch] for case `seed` (ordered: the order bisection tries them in)."""
    r = random.Random(f"{arch}:{seed}")
    o = {}
    s_common(r, o, arch, T)
    c = dict(BASES[arch])
    c.update({k: v for k, v in o.items() if v != DELETE})
    for k, v in o.items():
        if v == DELETE:
            c.pop(k, None)
    if arch in ("llama", "qwen3", "qwen3_moe", "qwen3_next"):
        o["attention_bias"] = pick(r, [False, True, DELETE])
    # keys that must not change the logits
    o["vocab_size"] = pick(r, [VOCAB, VOCAB, VOCAB, 520, 640])
    if r.random() < 0.3:
        o["pad_token_id"] = pick(r, [0, 5, None])
    if r.random() < 0.2:
        o["attention_dropout"] = pick(r, [0.1, 0.0])
    if r.random() < 0.1:
        o["use_cache"] = False
    if arch == "llama":
        o["mlp_bias"] = pick(r, [False, True, DELETE])
        if r.random() < 0.1:
            o["pretraining_tp"] = pick(r, [1, 2])
    if arch == "mistral":
        o["sliding_window"] = pick(r, [None, DELETE, 2, 4, 7, 12, 15, 16, 40], weights=[3, 1, 2, 2, 2, 2, 1, 1, 1])
        if r.random() < 0.1:
            o["attention_bias"] = True  # not a MistralConfig key: HF ignores it
        if r.random() < 0.1:  # HF warns and ignores layer_types for Mistral
            o["layer_types"] = [pick(r, ["full_attention", "sliding_attention"])
                                for _ in range(c["num_hidden_layers"])]
    if arch in ("qwen3", "qwen3_moe"):
        o["use_sliding_window"] = pick(r, [False, True, True, DELETE])
        o["sliding_window"] = pick(r, [None, DELETE, 2, 4, 7, 12, 15, 40], weights=[2, 1, 2, 2, 2, 2, 1, 1])
        L = c["num_hidden_layers"]
        o["max_window_layers"] = pick(r, list(range(0, L + 1)) + [DELETE, 28, 100])
        if arch == "qwen3_moe" and r.random() < 0.15:  # not a Qwen3MoeConfig field: HF ignores it
            o["layer_types"] = [pick(r, ["full_attention", "sliding_attention"]) for _ in range(L)]
        if arch == "qwen3" and r.random() < 0.3:
            o["layer_types"] = [pick(r, ["full_attention", "sliding_attention"]) for _ in range(L)]
    if arch == "qwen3_moe":
        s_moe(r, o, c)
    if arch == "qwen3_next":
        s_moe(r, o, c, next_=True)
        L = c["num_hidden_layers"]
        if r.random() < 0.4:
            lt = [pick(r, ["linear_attention", "full_attention"]) for _ in range(L)]
            if r.random() < 0.2:
                lt = [{"linear_attention": "mamba", "full_attention": "attention"}[t] if r.random() < 0.5 else t
                      for t in lt]
            o["layer_types"] = lt
            o["full_attention_interval"] = pick(r, [DELETE, 1, 2, 3, 4])
        else:
            o["full_attention_interval"] = pick(r, [1, 2, 3, 4, DELETE])
        kh = pick(r, [1, 2, 4])
        o["linear_num_key_heads"] = kh
        o["linear_num_value_heads"] = kh * pick(r, [1, 2, 3])
        o["linear_key_head_dim"] = pick(r, [8, 16, 32, 12])
        o["linear_value_head_dim"] = pick(r, [8, 16, 24, 12])
        o["linear_conv_kernel_dim"] = pick(r, [2, 3, 4, 5, 1], weights=[2, 2, 3, 2, 1])
    # keys left out of config.json: the class default applies (in HF)
    if r.random() < 0.3:
        for k in r.sample(ABSENT[arch], k=pick(r, [1, 1, 2])):
            o[k] = DELETE
            c.pop(k, None)
    c.update({k: v for k, v in o.items() if v != DELETE})
    s_rope(r, o, arch, c)
    return o


# keys whose absence means a (tractable) class default in transformers
_ABS_COMMON = ["intermediate_size", "rms_norm_eps", "tie_word_embeddings", "hidden_act", "vocab_size",
               "num_key_value_heads", "max_position_embeddings", "num_attention_heads"]
_ABS_MOE = ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
            "mlp_only_layers"]
ABSENT = {
    "llama": _ABS_COMMON + ["attention_bias", "mlp_bias", "head_dim"],
    "mistral": _ABS_COMMON + ["head_dim", "sliding_window"],
    "qwen3": _ABS_COMMON + ["attention_bias", "head_dim", "use_sliding_window", "sliding_window",
                            "max_window_layers"],
    "qwen3_moe": _ABS_COMMON + _ABS_MOE + ["attention_bias", "head_dim", "use_sliding_window", "sliding_window"],
    "qwen3_next": _ABS_COMMON + _ABS_MOE + ["attention_bias", "head_dim", "shared_expert_intermediate_size",
                                            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                            "linear_value_head_dim", "linear_conv_kernel_dim",
                                            "full_attention_interval", "partial_rotary_factor"],
}


CLASS_HEADS = {"llama": 32, "mistral": 32, "qwen3": 32, "qwen3_moe": 32, "qwen3_next": 16}
CLASS_MAXPOS = {"llama": 2048, "mistral": 131072, "qwen3": 32768, "qwen3_moe": 32768, "qwen3_next": 32768}


def rope_block(c):
    b = c.get("rope_scaling")
    if not b:
        b = c.get("rope_parameters")
    return b if isinstance(b, dict) else {}


def known_features(arch, c, T):
    """Names of the already-reported failure triggers a config contains (see --avoid)."""
    f = set()
    b = rope_block(c)
    rt = b.get("rope_type", b.get("type", "default"))
    maxpos = c.get("max_position_embeddings", CLASS_MAXPOS[arch])
    if c.get("hidden_act", "silu") not in ("silu", "swish"):
        f.add("acts")
    if rt in ("dynamic", "longrope", "proportional"):
        f.add("rope_kinds")
    if maxpos < T:
        f.add("small_maxpos")
    if "original_max_position_embeddings" in c and rt in ("yarn", "llama3", "longrope"):
        f.add("omax_top")
    if arch == "mistral" and "layer_types" in c:
        f.add("mistral_layer_types")
    if rt in ("linear", "yarn", "dynamic") and isinstance(b.get("factor"), (int, float)) and b["factor"] < 1:
        f.add("factor_lt1")
    if rt == "llama3":
        om = b.get("original_max_position_embeddings", maxpos)
        if b.get("high_freq_factor", 0) <= b.get("low_freq_factor", 0) or om >= maxpos:
            f.add("llama3_edge")
    if rt == "yarn" and "max_position_embeddings" not in c and (
            b.get("factor", 0) is None or "original_max_position_embeddings" not in b):
        f.add("yarn_absent_maxpos")
    if rt == "yarn" and b.get("factor", 1) is None:
        om = b.get("original_max_position_embeddings", maxpos)
        if maxpos / om < 1:
            f.add("factor_lt1")
    if any(i >= c["num_hidden_layers"] for i in (c.get("mlp_only_layers") or [])):
        f.add("mlp_oob")
    if arch == "qwen3_next":
        prf = b.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
        hd = c.get("head_dim", 256)
        hd = hd if hd is not None else c["hidden_size"] // c.get("num_attention_heads", 16)
        if int(hd * prf) % 2:
            f.add("odd_rotary")
    return f


def apply(base, overrides):
    c = copy.deepcopy(base)
    for k, v in overrides.items():
        if v == DELETE:
            c.pop(k, None)
        else:
            c[k] = copy.deepcopy(v)
    return c


def diff_of(base, overrides):
    """The overrides that actually change the base config."""
    d = {}
    for k, v in overrides.items():
        if v == DELETE:
            if k in base:
                d[k] = DELETE
        elif k not in base or base[k] != v or type(base[k]) is not type(v):
            d[k] = v
    return d
