#!/usr/bin/env python3
"""Config fuzzer: porter vs transformers on random *legal* small configs.

For each architecture it draws random small configs (seeded), keeps only those that
transformers itself accepts (config class + model build + a finite forward), writes a hub-layout
bf16 checkpoint (random weights, as tests/gen_fixtures.py draws them), computes transformers'
float32 eager full-sequence logits on random ids, runs

    porter logits --model DIR --ids ... --out F --dtype f32 --device cpu [--incremental]

and compares: a case passes iff max|porter - HF| <= TOL * std(HF logits) for both the one-shot
prefill and the token-by-token (--incremental) run.  Failures are classified as

    rejected  porter refused the config (non-zero exit, an error message, no panic)
    crash     porter panicked / was killed by a signal / timed out
    mismatch  porter ran but its logits differ (confirmed with a second weight seed)

and, with --bisect, reduced to a minimal set of keys changed from the architecture's base config
(which passes).  Results go to WORKDIR/results.jsonl, reproducers to WORKDIR/repro/.

Usage (run with the reference venv):
    target/ref-venv/bin/python scripts/config_fuzz.py                       # all archs, 40 cases each
    target/ref-venv/bin/python scripts/config_fuzz.py --only qwen3_next --cases 60 --bisect
    target/ref-venv/bin/python scripts/config_fuzz.py --only llama --case-seeds 7,12   # re-run cases
    target/ref-venv/bin/python scripts/config_fuzz.py --config my_config.json      # one explicit config
    target/ref-venv/bin/python scripts/config_fuzz.py --list-keys                   # keys sampled per arch
    target/ref-venv/bin/python scripts/config_fuzz.py --avoid all --bisect        # skip already-found triggers
    target/ref-venv/bin/python scripts/config_fuzz.py --absent-sweep              # each optional key left out
    target/ref-venv/bin/python scripts/config_fuzz.py --tokens 80 --avoid all     # longer prompts

Archs: llama, mistral, qwen3, qwen3_moe, qwen3_next.

A rejected case is re-run with the key porter's error names put back to the base value (up to 3
times), so that the rest of the config is still tested (`repaired` in the results).  --avoid
re-draws configs that contain failure triggers found earlier (see known_features()), so that a run
looks past them.  The optional kernel packages (fla, causal_conv1d, kernels) are hidden from
transformers in this process so that it takes its pure-torch paths, as tests/gen_fixtures.py requires.
"""

import argparse
import contextlib
import copy
import importlib.machinery
import importlib.util
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# HF must take its pure-torch paths (as tests/gen_fixtures.py requires): hide the optional
# kernel packages from transformers' availability checks and from `import`.
BLOCKED = {"fla", "causal_conv1d", "kernels"}
_orig_find_spec = importlib.util.find_spec


def _find_spec(name, package=None):
    if name.split(".")[0] in BLOCKED:
        return None
    return _orig_find_spec(name, package)


importlib.util.find_spec = _find_spec


class _Block:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} hidden by config_fuzz.py (pure-torch reference)")
        return None


sys.meta_path.insert(0, _Block)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "tests", "fixtures", "tokenizer.json")

# tests/gen_fixtures.py: hub names/shapes from an HF model, the random-weight rules, the writer.
_spec = importlib.util.spec_from_file_location("gen_fixtures", os.path.join(REPO, "tests", "gen_fixtures.py"))
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)
torch.set_num_threads(1)

VOCAB = 512
TOL = 1e-3          # pass iff max|delta| <= TOL * std(ref)
T_DEFAULT = 16
DELETE = "__DELETE__"  # an override that removes the key from the base config

transformers.logging.set_verbosity_error()


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


# ------------------------------------------------------------------------------------------
# Running one config
# ------------------------------------------------------------------------------------------
def draw_ids(seed, T):
    rng = np.random.Generator(np.random.PCG64([seed, 11]))
    return torch.from_numpy(rng.integers(3, VOCAB, size=T).astype(np.int64))


class HfIllegal(Exception):
    pass


@torch.no_grad()
def hf_reference(folder, cfg, weight_seed, ids):
    """Writes config + weights into folder, returns HF float32 eager logits [T, V]."""
    os.makedirs(folder, exist_ok=True)
    for f in os.listdir(folder):
        os.remove(os.path.join(folder, f))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shutil.copy(TOKENIZER, os.path.join(folder, "tokenizer.json"))
    tied = bool(cfg.get("tie_word_embeddings", False))
    is_next = cfg["model_type"] == "qwen3_next"
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            hf_cfg = transformers.AutoConfig.from_pretrained(folder)
            skel = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
            tied = skel.config.tie_word_embeddings
            shapes = gen.hub_shapes_from_model(skel, tied)
            del skel
    except Exception as e:  # noqa: BLE001
        raise HfIllegal(f"{type(e).__name__}: {e}")
    if sum(math.prod(s) for s in shapes.values()) > 60_000_000:
        raise HfIllegal("too big")
    weights = gen.draw_weights(shapes, {"hidden_size": cfg["hidden_size"], "tie_word_embeddings": tied},
                               weight_seed, zero_centred_norms=is_next, out_gain=gen.OUT_GAIN)
    gen.write_weights(folder, weights, 1)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            model, info = AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
                output_loading_info=True)
            model.eval()
            bad = info["missing_keys"] or info["unexpected_keys"] or info.get("mismatched_keys")
            if bad:
                raise RuntimeError(f"harness: HF loading info {info}")
            logits = model(input_ids=ids[None, :], use_cache=False).logits[0].float()
    except RuntimeError as e:
        if str(e).startswith("harness:"):
            raise
        raise HfIllegal(f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001
        raise HfIllegal(f"{type(e).__name__}: {e}")
    if not torch.isfinite(logits).all():
        raise HfIllegal("non-finite HF logits")
    if float(logits.std()) < 1e-6:
        raise HfIllegal("degenerate HF logits")
    # what HF made of the config (for the record)
    hc = model.config
    facts = {
        "head_dim": getattr(hc, "head_dim", None),
        "num_key_value_heads": getattr(hc, "num_key_value_heads", None),
        "rope_parameters": getattr(hc, "rope_parameters", None),
        "layer_types": getattr(hc, "layer_types", None),
        "sliding_window": getattr(hc, "sliding_window", None),
        "tie": hc.tie_word_embeddings,
    }
    return logits, facts


def porter_logits(porter, folder, ids, incremental, timeout):
    out = os.path.join(folder, "porter_inc.safetensors" if incremental else "porter.safetensors")
    if os.path.exists(out):
        os.remove(out)
    cmd = [porter, "logits", "--model", folder, "--ids", ",".join(str(int(i)) for i in ids), "--out", out,
           "--dtype", "f32", "--device", "cpu"]
    if incremental:
        cmd.append("--incremental")
    env = dict(os.environ, RUST_BACKTRACE="0", NO_COLOR="1")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "crash", "error": f"timeout after {timeout}s"}
    err = p.stderr.strip()
    if p.returncode != 0:
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("loading ") and "\r" not in ln]
        if "panicked" in err or p.returncode < 0 or p.returncode == 101:
            status = "crash"
            msg = next((ln for ln in lines if "panicked" in ln), lines[-1] if lines else f"rc={p.returncode}")
            # the panic message is on the line after "panicked at file:line:col:"
            i = lines.index(msg) if msg in lines else -1
            if i >= 0 and i + 1 < len(lines):
                msg = msg + " " + lines[i + 1]
        else:
            status = "rejected"
            msg = " | ".join(lines[-4:]) if lines else f"rc={p.returncode}"
            msg = re.sub(r"^error: loading model from \S+: ", "", msg)
            msg = re.sub(r"invalid (\w+) config in \S+: ", r"\1: ", msg)
        return {"status": status, "error": msg, "rc": p.returncode}
    with safe_open(out, "pt") as f:
        t = f.get_tensor("logits")
    return {"status": "ok", "logits": t}


def compare(ref, got):
    if got.shape != ref.shape:
        return {"status": "mismatch", "ratio": float("inf"), "note": f"shape {tuple(got.shape)} vs {tuple(ref.shape)}"}
    d = (got - ref).abs()
    std = float(ref.std())
    ratio = float(d.max()) / std
    if not math.isfinite(ratio):
        return {"status": "mismatch", "ratio": float("inf"), "note": "non-finite porter logits"}
    row_ratio = (d.max(dim=1).values / std).tolist()
    first_bad = next((i for i, x in enumerate(row_ratio) if x > TOL), None)
    res = {"status": "pass" if ratio <= TOL else "mismatch", "ratio": ratio}
    if first_bad is not None:
        res["first_bad_pos"] = first_bad
        res["row_ratio"] = [round(x, 5) for x in row_ratio]
    return res


def run_config(args, cfg, folder, weight_seed, ids):
    """-> dict(verdict, hf=..., prefill=..., incremental=...). verdict: pass/mismatch/rejected/crash/hf_illegal."""
    try:
        ref, facts = hf_reference(folder, cfg, weight_seed, ids)
    except HfIllegal as e:
        return {"verdict": "hf_illegal", "hf_error": str(e)[:400]}
    res = {"hf_facts": facts, "std": float(ref.std())}
    kinds = []
    for mode, inc in (("prefill", False), ("incremental", True)):
        p = porter_logits(args.porter, folder, ids, inc, args.timeout)
        if p["status"] == "ok":
            c = compare(ref, p["logits"])
            res[mode] = c
            kinds.append(c["status"])
        else:
            res[mode] = {"status": p["status"], "error": p["error"]}
            kinds.append(p["status"])
    for k in ("crash", "mismatch", "rejected"):
        if k in kinds:
            res["verdict"] = k
            break
    else:
        res["verdict"] = "pass"
    return res


def signature(res):
    """What a failure looks like, for dedup and for bisection (same signature = same failure)."""
    v = res["verdict"]
    if v in ("rejected", "crash"):
        for mode in ("prefill", "incremental"):
            e = res.get(mode, {})
            if e.get("status") == v:
                msg = e["error"]
                m = re.search(r"config key `([^`]+)`", msg)
                if m:
                    return f"{v}:key:{m.group(1)}"
                msg = re.sub(r"/tmp/\S+", "DIR", msg)
                msg = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", msg)
                return f"{v}:{msg[-160:]}"
    if v == "mismatch":
        modes = [m for m in ("prefill", "incremental") if res.get(m, {}).get("status") == "mismatch"]
        return "mismatch:" + "+".join(modes)
    return v


def brief(res):
    v = res["verdict"]
    if v == "hf_illegal":
        return f"hf_illegal ({res['hf_error'][:120]})"
    parts = []
    for mode in ("prefill", "incremental"):
        e = res.get(mode, {})
        if "ratio" in e:
            parts.append(f"{mode} {e['ratio']:.2e}")
        elif "error" in e:
            parts.append(f"{mode} {e['status']}: {e['error'][:200]}")
    return f"{v}: " + "; ".join(parts)


# ------------------------------------------------------------------------------------------
# Bisection
# ------------------------------------------------------------------------------------------
def bisect(args, arch, overrides, sig, weight_seed, ids, folder, log):
    """Greedy minimisation: revert one override (then one sub-key of a dict override) at a time
    to the base; keep the reversion when transformers still accepts the config and the failure
    has the same signature."""
    base = BASES[arch]
    cur = diff_of(base, overrides)
    tries = 0

    def still_fails(ov):
        nonlocal tries
        tries += 1
        cfg = apply(base, ov)
        r = run_config(args, cfg, folder, weight_seed, ids)
        ok = r["verdict"] != "hf_illegal" and signature(r) == sig
        log(f"      bisect try {tries}: {sorted(ov)} -> {r['verdict']}{' (same)' if ok else ''}")
        return ok, r

    last = None
    changed = True
    while changed and tries < args.max_bisect_tries:
        changed = False
        for k in list(cur):
            if tries >= args.max_bisect_tries:
                break
            trial = {kk: vv for kk, vv in cur.items() if kk != k}
            ok, r = still_fails(trial)
            if ok:
                cur, last, changed = trial, r, True
    # sub-keys of dict-valued overrides (rope blocks)
    for k in list(cur):
        v = cur[k]
        if not isinstance(v, dict):
            continue
        for sk in list(v):
            if tries >= args.max_bisect_tries:
                break
            if sk in ("rope_type", "type"):
                continue
            trial = dict(cur)
            trial[k] = {kk: vv for kk, vv in v.items() if kk != sk}
            ok, r = still_fails(trial)
            if ok:
                cur, last, v = trial, r, trial[k]
    if last is None:
        cfg = apply(base, cur)
        last = run_config(args, cfg, folder, weight_seed, ids)
    return cur, last, tries


# ------------------------------------------------------------------------------------------
# Main loop
# ------------------------------------------------------------------------------------------
def show_diff(d):
    return json.dumps({k: ("<absent>" if v == DELETE else v) for k, v in d.items()}, sort_keys=True)


def offending_key(res):
    """The config key porter's rejection names (None if it names none)."""
    for mode in ("prefill", "incremental"):
        e = res.get(mode, {})
        if e.get("status") != "rejected":
            continue
        m = re.search(r"config key `([^`]+)`", e["error"])
        if m:
            return m.group(1)
        if "max_position_embeddings" in e["error"]:
            return "max_position_embeddings"
    return None


def revert_key(overrides, key):
    """Overrides with `key` (possibly `block.sub`) back at the base value; None if nothing changes."""
    ov = copy.deepcopy(overrides)
    top = key.split(".")[0]
    changed = False
    if key == "partial_rotary_factor" or key.endswith(".partial_rotary_factor"):
        for b in ("rope_scaling", "rope_parameters"):
            if isinstance(ov.get(b), dict) and "partial_rotary_factor" in ov[b]:
                ov[b].pop("partial_rotary_factor")
                changed = True
    if top in ov:
        del ov[top]
        changed = True
        if top in ("rope_scaling", "rope_parameters"):
            ov.pop("original_max_position_embeddings", None)
    return ov if changed else None


def run_case(args, arch, seed, log):
    T = args.tokens
    folder = os.path.join(args.workdir, "cases", f"{arch}_{seed}")
    ids = draw_ids(seed, T)
    weight_seed = 1000 + seed
    for attempt in range(args.max_resample):
        case_seed = seed if attempt == 0 else f"{seed}.{attempt}"
        overrides = sample(arch, case_seed, T)
        cfg = apply(BASES[arch], overrides)
        hit = known_features(arch, cfg, T) & args.avoid
        if hit:
            log(f"   [{arch} {case_seed}] contains avoided trigger(s) {sorted(hit)} -> resample")
            continue
        t0 = time.time()
        res = run_config(args, cfg, folder, weight_seed, ids)
        if res["verdict"] != "hf_illegal":
            break
        log(f"   [{arch} {case_seed}] transformers rejects: {res['hf_error'][:150]} -> resample")
    else:
        return {"arch": arch, "seed": seed, "verdict": "hf_illegal", "hf_error": "no legal draw"}
    rec = {"arch": arch, "seed": seed, "case_seed": str(case_seed), "T": T, "weight_seed": weight_seed,
           "diff": diff_of(BASES[arch], overrides), "config": cfg, **res, "secs": round(time.time() - t0, 2)}
    if res["verdict"] == "mismatch":
        # confirm with another weight draw (a MoE routing tie could flip one token's experts)
        r2 = run_config(args, cfg, folder, weight_seed + 500_000, ids)
        rec["confirm"] = {"verdict": r2["verdict"], "brief": brief(r2)}
        if r2["verdict"] == "pass":
            rec["verdict"] = "flaky"
    log(f"   [{arch} {case_seed}] {brief(rec) if rec['verdict'] != 'flaky' else 'FLAKY ' + brief(res)}  "
        f"({rec['secs']}s)  diff={show_diff(rec['diff'])[:600]}")
    # a rejection hides what the rest of the config does: put the named key back to the base
    # value and run again (up to 3 times); the outcome is recorded as `repaired`.
    ov, r = overrides, res
    rec["repairs"] = []
    while r["verdict"] == "rejected" and len(rec["repairs"]) < 3:
        key = offending_key(r)
        ov2 = revert_key(ov, key) if key else None
        if ov2 is None:
            break
        r = run_config(args, apply(BASES[arch], ov2), folder, weight_seed, ids)
        if r["verdict"] == "hf_illegal":
            rec["repairs"].append({"reverted": key, "verdict": "hf_illegal"})
            break
        ov = ov2
        rec["repairs"].append({"reverted": key, "verdict": r["verdict"], "brief": brief(r)})
        log(f"      repaired `{key}` -> {brief(r)[:300]}")
    if rec["repairs"] and rec["repairs"][-1]["verdict"] not in ("hf_illegal",):
        rec["repaired"] = {"verdict": r["verdict"], "diff": diff_of(BASES[arch], ov), "result": r}
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="comma-separated archs (llama,mistral,qwen3,qwen3_moe,qwen3_next)")
    ap.add_argument("--cases", type=int, default=40, help="cases per arch")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--case-seeds", default=None, help="comma-separated case seeds to (re-)run instead of a range")
    ap.add_argument("--tokens", type=int, default=T_DEFAULT, help="prompt length")
    ap.add_argument("--workdir", default="/tmp/fuzz")
    ap.add_argument("--porter", default=os.path.join(REPO, "target", "release", "porter"))
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--max-resample", type=int, default=25)
    ap.add_argument("--bisect", action="store_true", help="minimise failures (one per signature, mismatches: each)")
    ap.add_argument("--max-bisect", type=int, default=30, help="at most this many bisections in the run")
    ap.add_argument("--max-bisect-tries", type=int, default=60)
    ap.add_argument("--time-budget", type=float, default=0, help="stop starting new cases after this many seconds")
    ap.add_argument("--config", default=None, help="run one explicit config.json (arch from `architectures`)")
    ap.add_argument("--weight-seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="results file (default WORKDIR/results.jsonl)")
    ap.add_argument("--list-keys", action="store_true")
    ap.add_argument("--absent-sweep", action="store_true", help="leave each optional key out of the base config")
    ap.add_argument("--avoid", default="",
                    help="re-draw configs containing these already-found triggers (comma list, or `all`): "
                         "acts, rope_kinds, small_maxpos, omax_top, mistral_layer_types, factor_lt1, llama3_edge, "
                         "yarn_absent_maxpos, odd_rotary, mlp_oob")
    args = ap.parse_args()
    ALL = {"acts", "rope_kinds", "small_maxpos", "omax_top", "mistral_layer_types", "factor_lt1", "llama3_edge",
           "yarn_absent_maxpos", "odd_rotary", "mlp_oob"}
    args.avoid = ALL if args.avoid == "all" else set(filter(None, args.avoid.split(",")))
    if args.avoid - ALL:
        sys.exit(f"unknown --avoid names {sorted(args.avoid - ALL)}")

    os.makedirs(args.workdir, exist_ok=True)
    logf = open(os.path.join(args.workdir, "fuzz.log"), "a")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    if args.list_keys:
        for arch in BASES:
            keys = set()
            for s in range(200):
                keys |= set(sample(arch, s, args.tokens))
            print(arch, sorted(keys))
        return

    if not os.path.exists(args.porter):
        sys.exit(f"porter binary not found: {args.porter} (cargo build --release -p runner)")

    if args.config:
        with open(args.config) as f:
            cfg = json.load(f)
        arch = next(a for a, c in ARCH_CLASS.items() if c == cfg["architectures"][0])
        ids = draw_ids(args.weight_seed, args.tokens)
        folder = os.path.join(args.workdir, "single")
        res = run_config(args, cfg, folder, 1000 + args.weight_seed, ids)
        print(json.dumps({k: v for k, v in res.items()}, indent=1, default=str)[:6000])
        print(brief(res))
        return

    archs = args.only.split(",") if args.only else list(BASES)
    for a in archs:
        if a not in BASES:
            sys.exit(f"unknown arch {a}; known: {', '.join(BASES)}")
    if args.absent_sweep:
        # each optional key of the base config left out on its own: transformers' class default applies
        ids = draw_ids(0, args.tokens)
        for arch in archs:
            for key in ABSENT[arch] + ["rope_theta", "rope_scaling"]:
                if key not in BASES[arch]:
                    continue
                cfg = apply(BASES[arch], {key: DELETE})
                r = run_config(args, cfg, os.path.join(args.workdir, "cases", f"{arch}_absent_{key}"), 1000, ids)
                log(f"   [{arch} without `{key}`] {brief(r)[:400]}")
        return
    out_path = args.out or os.path.join(args.workdir, "results.jsonl")
    outf = open(out_path, "a")
    log(f"== config_fuzz: transformers {transformers.__version__}, torch {torch.__version__}, porter {args.porter}, "
        f"T={args.tokens}, tol={TOL}, archs={archs}, avoid={sorted(args.avoid)}, started {time.strftime('%H:%M:%S')}")
    t_start = time.time()
    summary = {}
    bisected_sigs = set()
    n_bisect = 0
    for arch in archs:
        # the base config must pass
        ids0 = draw_ids(0, args.tokens)
        r0 = run_config(args, BASES[arch], os.path.join(args.workdir, "cases", f"{arch}_base"), 1000, ids0)
        log(f"-- {arch}: base config {brief(r0)}")
        seeds = ([int(s) for s in args.case_seeds.split(",")] if args.case_seeds else
                 list(range(args.first_seed, args.first_seed + args.cases)))
        st = summary.setdefault(arch, {"run": 0, "pass": 0, "mismatch": 0, "rejected": 0, "crash": 0,
                                       "flaky": 0, "hf_illegal": 0})
        for seed in seeds:
            if args.time_budget and time.time() - t_start > args.time_budget:
                log(f"   time budget reached; stopping {arch} at seed {seed}")
                break
            rec = run_case(args, arch, seed, log)
            st["run"] += 1
            st[rec["verdict"]] = st.get(rec["verdict"], 0) + 1
            if rec["verdict"] in ("mismatch", "rejected", "crash"):
                sig = signature(rec)
                rec["signature"] = sig
                want = args.bisect and n_bisect < args.max_bisect and (
                    (arch, sig) not in bisected_sigs or rec["verdict"] == "mismatch")
                if want:
                    n_bisect += 1
                    bisected_sigs.add((arch, sig))
                    folder = os.path.join(args.workdir, "cases", f"{arch}_{seed}_bisect")
                    ov = {k: v for k, v in rec["diff"].items()}
                    mini, last, tries = bisect(args, arch, ov, sig, rec["weight_seed"],
                                               draw_ids(seed, args.tokens), folder, log)
                    rec["minimal_diff"] = mini
                    rec["minimal_result"] = {"verdict": last["verdict"], "brief": brief(last)}
                    rec["bisect_tries"] = tries
                    rdir = os.path.join(args.workdir, "repro", f"{arch}_{seed}")
                    os.makedirs(rdir, exist_ok=True)
                    with open(os.path.join(rdir, "config.json"), "w") as f:
                        json.dump(apply(BASES[arch], mini), f, indent=2)
                    log(f"   [{arch} {seed}] MINIMAL ({tries} tries): {show_diff(mini)} -> {brief(last)}")
            rep = rec.get("repaired")
            if rep and rep["verdict"] in ("mismatch", "crash"):
                sig = signature(rep["result"])
                st["repaired_" + rep["verdict"]] = st.get("repaired_" + rep["verdict"], 0) + 1
                if args.bisect and n_bisect < args.max_bisect:
                    n_bisect += 1
                    folder = os.path.join(args.workdir, "cases", f"{arch}_{seed}_bisect")
                    mini, last, tries = bisect(args, arch, dict(rep["diff"]), sig, rec["weight_seed"],
                                               draw_ids(seed, args.tokens), folder, log)
                    rep["minimal_diff"] = mini
                    rep["minimal_result"] = {"verdict": last["verdict"], "brief": brief(last)}
                    rdir = os.path.join(args.workdir, "repro", f"{arch}_{seed}_repaired")
                    os.makedirs(rdir, exist_ok=True)
                    with open(os.path.join(rdir, "config.json"), "w") as f:
                        json.dump(apply(BASES[arch], mini), f, indent=2)
                    log(f"   [{arch} {seed}] MINIMAL after repair ({tries} tries): {show_diff(mini)} -> {brief(last)}")
            elif rep and rep["verdict"] == "pass":
                st["repaired_pass"] = st.get("repaired_pass", 0) + 1
            if rep:
                rep.pop("result", None)
            rec.pop("config", None) if rec["verdict"] == "pass" else None
            outf.write(json.dumps(rec, default=str) + "\n")
            outf.flush()
    log("\n== summary (cases run / pass / mismatch / rejected / crash / flaky)")
    for arch, st in summary.items():
        log(f"   {arch:<11} {st['run']:>4} {st['pass']:>5} {st['mismatch']:>9} {st['rejected']:>9} {st['crash']:>6}"
            f" {st['flaky']:>6}   (hf-illegal after resampling: {st['hf_illegal']}; rejected cases after reverting "
            f"the named key: pass {st.get('repaired_pass', 0)}, mismatch {st.get('repaired_mismatch', 0)}, "
            f"crash {st.get('repaired_crash', 0)})")
    log(f"   total time {time.time() - t_start:.0f}s; results in {out_path}")


if __name__ == "__main__":
    main()
