#!/usr/bin/env python3
"""Transformers references for config variants of the parity fixtures.

Each variant is an existing fixture (its bf16 weights, unchanged) with a few config keys
edited to a legal value that changes the computation without changing any tensor shape:
RoPE widths and scaling rules, `layer_types`, key aliases. transformers computes float32
logits of the edited checkpoint on the CPU (eager attention, pure torch); porter must match
them (tests/tests/config_variants.rs). The variants come from the config fuzzer
(scripts/config_fuzz.py), which found porter computing or refusing them differently.

Usage (the reference venv of scripts/test-setup.sh --reference, or any torch + transformers):
    python3 tests/gen_config_variants.py

Writes tests/fixtures/config_variants/variants.json (name, fixture, edit, token count, versions,
std of the logits) and one NAME.safetensors per variant (`ids` i64 [T], `logits` f32 [T, vocab]).
"""

import importlib.abc
import importlib.util
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# transformers must take its pure-torch paths (as gen_fixtures.py requires): hide the optional
# kernel packages from its availability checks and from `import`.
BLOCKED = {"fla", "causal_conv1d", "kernels"}
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.split(".")[0] in BLOCKED else _find_spec(name, package)
)


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} hidden (pure-torch reference)")
        return None


sys.meta_path.insert(0, _Block())

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
OUT = os.path.join(FIXTURES, "config_variants")
DELETE = "<delete>"

# (name, fixture, edit, tokens, what it pins down). An edit value DELETE removes the key.
VARIANTS = [
    ("qwen3_next_odd_rotary_dim", "qwen3_next_a", {"partial_rotary_factor": 0.22}, 24,
     "int(32 * 0.22) = 7 rotary dims: 4 frequencies 1/θ^(2i/7), 8 dims rotated"),
    ("qwen3_next_one_rotary_dim", "qwen3_next_a", {"partial_rotary_factor": 0.04}, 24,
     "int(32 * 0.04) = 1: one frequency (1), 2 dims rotated"),
    ("qwen3_yarn_top_level_original", "qwen3",
     {"original_max_position_embeddings": 64,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}}, 24,
     "standardize_rope_params: a top-level original_max_position_embeddings overwrites the block's"),
    ("qwen3_llama3_top_level_original", "qwen3",
     {"original_max_position_embeddings": 64,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 16}}, 24,
     "the same for llama3"),
    ("qwen3_yarn_null_factor_class_default_max", "qwen3",
     {"max_position_embeddings": DELETE,
      "rope_scaling": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096}}, 24,
     "a null yarn factor is max_position_embeddings / original with the class default 32768 (factor 8)"),
    ("qwen3_llama3_equal_band_original_at_max", "qwen3",
     {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
                       "original_max_position_embeddings": 4096}}, 24,
     "high_freq_factor == low_freq_factor and original == max_position_embeddings: warnings only"),
    ("qwen3_linear_factor_below_one", "qwen3", {"rope_scaling": {"rope_type": "linear", "factor": 0.5}}, 24,
     "a linear factor below 1: a warning only"),
    # head_dim given: Ministral's attention reads `config.head_dim` as is (null would fail there).
    ("mistral_swa_layer_types", "mistral_swa",
     {"layer_types": ["full_attention", "sliding_attention"], "head_dim": "<derived_head_dim>"}, 48,
     "model_type mistral + layer_types is read as Ministral: the window on sliding_attention layers only"),
    ("qwen3_proportional_rope", "qwen3",
     {"rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0}}, 24,
     "proportional RoPE: a whole-head table, the first int(p*head_dim//2) angles over head_dim, zeros after, / factor"),
    ("qwen3_next_proportional_rope", "qwen3_next_a", {"rope_parameters": {"rope_type": "proportional"}}, 24,
     "proportional RoPE with Qwen3-Next's default partial 0.25 (top-level key) on a whole-head table"),
    ("qwen3_moe_mlp_only_layers_past_the_end", "qwen3_moe", {"mlp_only_layers": [1, 7]}, 24,
     "layer_idx not in mlp_only_layers: an entry past the last layer is ignored"),
    ("qwen3_moe_num_local_experts", "qwen3_moe", {"num_local_experts": "<num_experts>", "num_experts": 999}, 24,
     "Qwen3MoeConfig.attribute_map: num_local_experts wins over num_experts"),
]


def edited_config(fixture, edit):
    with open(os.path.join(FIXTURES, fixture, "config.json")) as f:
        cfg = json.load(f)
    for k, v in edit.items():
        if v == DELETE:
            cfg.pop(k, None)
        elif v == "<num_experts>":
            cfg[k] = cfg["num_experts"]
        elif v == "<derived_head_dim>":
            cfg[k] = cfg["hidden_size"] // cfg["num_attention_heads"]
        else:
            cfg[k] = v
    return cfg


def main():
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(OUT, exist_ok=True)
    listing = []
    for name, fixture, edit, tokens, why in VARIANTS:
        src = os.path.join(FIXTURES, fixture)
        ref = load_file(os.path.join(src, "reference.safetensors"))
        ids = ref["ids_long"][:tokens].to(torch.int64)
        assert ids.numel() == tokens, f"{fixture}: ids_long has {ids.numel()} < {tokens} tokens"
        cfg = edited_config(fixture, edit)
        with tempfile.TemporaryDirectory() as tmp:
            for f in os.listdir(src):
                if f.endswith(".safetensors") and not f.startswith("model"):
                    continue
                if f.endswith(".json") and f not in ("config.json", "generation_config.json", "tokenizer.json",
                                                     "model.safetensors.index.json"):
                    continue
                shutil.copy(os.path.join(src, f), tmp)
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f)
            model = AutoModelForCausalLM.from_pretrained(
                tmp, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
            model.eval()
            with torch.no_grad():
                logits = model(ids.view(1, -1)).logits[0].float().contiguous()
        assert torch.isfinite(logits).all(), name
        save_file({"ids": ids, "logits": logits}, os.path.join(OUT, f"{name}.safetensors"), metadata={"format": "pt"})
        std = float(logits.std(unbiased=False))
        # The unedited fixture's logits of the same tokens (causal: a prefix of logits_long):
        # how far the edit moves them, i.e. what a porter ignoring the edit would miss by.
        base = ref["logits_long"].view(-1, logits.shape[-1])[:tokens]
        moved = float((logits - base).abs().max()) / std
        listing.append({"name": name, "fixture": fixture, "edit": {k: (None if v is None else v) for k, v in edit.items()},
                        "tokens": tokens, "why": why, "model_class": type(model).__name__, "logits_std": std,
                        "max_abs_diff_from_unedited_over_std": moved})
        print(f"{name}: {type(model).__name__}, {tokens} tokens, std {std:.4f}, moved {moved:.3f} std by the edit")
    meta = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "delete_marker": DELETE, "num_experts_marker": "<num_experts>", "head_dim_marker": "<derived_head_dim>",
            "code_path": "pure torch (fla, causal_conv1d, kernels hidden); eager attention; float32 CPU",
            "variants": listing}
    with open(os.path.join(OUT, "variants.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
