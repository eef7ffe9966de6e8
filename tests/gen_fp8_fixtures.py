#!/usr/bin/env python3
"""Quantize porter's tiny bf16 fixtures into Qwen's block-128 FP8 checkpoint format, with references.

Usage:
    python3 tests/gen_fp8_fixtures.py            # qwen3_next_a and qwen3 -> tests/fixtures/<name>_fp8/

For every source fixture NAME (written by tests/gen_fixtures.py) it writes tests/fixtures/NAME_fp8/:
    config.json            the source config plus the `quantization_config` of
                           Qwen/Qwen3-Next-80B-A3B-Instruct-FP8 (fp8, e4m3, dynamic, [128, 128])
    model.safetensors      every quantized linear as `X.weight` (F8_E4M3, torch.float8_e4m3fn) and
                           `X.weight_scale_inv` (F32, [ceil(out/128), ceil(in/128)]); the rest bf16 as stored
    reference.safetensors  ids_short, logits_short (HF float32 forward on the *dequantized* weights),
                           greedy_prompt, greedy_ids, e4m3_in / e4m3_out (torch's f32 -> e4m3 bytes of
                           edge values, as i64), e4m3_table (torch's decode of all 256 bytes, f32)
    reference.json         provenance and the HF bf16 ratio on the dequantized weights

Quantization (the same rules porter's `--quantize fp8` applies, core/src/load/quant.rs):
  * a tensor is quantized iff it is a 2-D `*.weight` and none of `embed_tokens`, `lm_head`, `norm`,
    `.mlp.gate.weight` (the router), `shared_expert_gate`, `in_proj_ba`, `conv1d`, `A_log`, `dt_bias`,
    `mtp.fc` occurs in its name;
  * per 128x128 block (partial blocks at the edges): scale = amax(|w|) / 448 in f32 (amax 0 -> 1);
    q = (w.float() / scale).to(torch.float8_e4m3fn) (round to nearest even; |w/scale| <= 448);
  * dequantized weight W = q.float() * scale of its block (the scale multiplies despite its name).
"""

import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
BLOCK = 128
FP8_MAX = 448.0
KEEP = ("embed_tokens", "lm_head", "norm", ".mlp.gate.weight", "shared_expert_gate", "in_proj_ba", "conv1d",
        "A_log", "dt_bias", "mtp.fc")
N_GREEDY = 8
QUANT_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [BLOCK, BLOCK],
    "modules_to_not_convert": ["lm_head"],
}


def quantized(name, t):
    return t.dim() == 2 and name.endswith(".weight") and not any(k in name for k in KEEP)


def quantize(w):
    """[out, in] -> (e4m3 [out, in], f32 scales [ceil(out/128), ceil(in/128)])."""
    w = w.float()
    out, inp = w.shape
    so, si = math.ceil(out / BLOCK), math.ceil(inp / BLOCK)
    q = torch.empty(out, inp, dtype=torch.float8_e4m3fn)
    s = torch.empty(so, si, dtype=torch.float32)
    for i in range(so):
        for j in range(si):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = blk.abs().max()
            sc = amax / FP8_MAX if float(amax) > 0 else torch.tensor(1.0)
            s[i, j] = sc
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (blk / sc).to(torch.float8_e4m3fn)
    return q, s


def dequantize(q, s):
    rows = s.repeat_interleave(BLOCK, 0)[: q.shape[0]]
    full = rows.repeat_interleave(BLOCK, 1)[:, : q.shape[1]]
    return q.float() * full


@torch.no_grad()
def logits_of(model, ids):
    return model(input_ids=ids[None, :], use_cache=False).logits[0].float()


@torch.no_grad()
def greedy(model, prompt, n):
    ids = prompt.clone()
    margins = []
    for _ in range(n):
        row = logits_of(model, ids)[-1]
        top = torch.topk(row, 2)
        margins.append(float((top.values[0] - top.values[1]) / row.std()))
        ids = torch.cat([ids, top.indices[:1]])
    return ids[len(prompt):], min(margins)


def load_hf(folder, dtype):
    with contextlib.redirect_stderr(io.StringIO()):
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, attn_implementation="eager", experts_implementation="eager",
            output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def e4m3_edges():
    """f32 values around every e4m3 rounding edge (subnormals, ties, saturation) and torch's bytes."""
    vals = [0.0, -0.0, 448.0, -448.0, 447.9, 464.0, -464.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -6,
            0.0009765625, 0.0029296875, 1.0625, 1.1875, 240.0, 248.0, 256.0, 1e-5, -3e-3]
    g = torch.Generator().manual_seed(12)
    vals += (torch.randn(4000, generator=g) * torch.exp2(torch.randint(-12, 9, (4000,), generator=g).float())) \
        .clamp(-FP8_MAX, FP8_MAX).tolist()
    x = torch.tensor(vals, dtype=torch.float32)
    out = x.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)
    table = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return x, out, table


def make(name):
    src = os.path.join(FIXTURES, name)
    dst = os.path.join(FIXTURES, f"{name}_fp8")
    os.makedirs(dst, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    files = sorted(f for f in os.listdir(src) if f.startswith("model") and f.endswith(".safetensors"))
    assert files == ["model.safetensors"], files
    hub = {}
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
        for k in f.keys():
            hub[k] = f.get_tensor(k)
    fp8, deq = {}, {}
    n_q = n_keep = 0
    for k, t in hub.items():
        if quantized(k, t):
            q, s = quantize(t)
            fp8[k] = q
            fp8[k + "_scale_inv"] = s
            deq[k] = dequantize(q, s)
            n_q += 1
        else:
            fp8[k] = t
            deq[k] = t.float()
            n_keep += 1
    save_file(fp8, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    qcfg = dict(cfg, quantization_config=QUANT_CONFIG)
    json.dump(qcfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in ("generation_config.json", "tokenizer.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))

    # references: HF float32 on the dequantized weights (a plain f32 checkpoint in a scratch folder)
    ref_src = safe_open(os.path.join(src, "reference.safetensors"), "pt")
    ids_short = ref_src.get_tensor("ids_short")
    prompt = ref_src.get_tensor("greedy_prompt")
    with tempfile.TemporaryDirectory() as tmp:
        json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
        save_file({k: v.contiguous() for k, v in deq.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        m32 = load_hf(tmp, torch.float32)
        logits_short = logits_of(m32, ids_short)
        gids, margin = greedy(m32, prompt, N_GREEDY)
        mbf = load_hf(tmp, torch.bfloat16)
        r_bf = float((logits_of(mbf, ids_short) - logits_short).abs().max() / logits_short.std(unbiased=False))
    x, out, table = e4m3_edges()
    ref = {"ids_short": ids_short, "logits_short": logits_short.contiguous(), "greedy_prompt": prompt,
           "greedy_ids": gids, "e4m3_in": x, "e4m3_out": out, "e4m3_table": table}
    save_file(ref, os.path.join(dst, "reference.safetensors"), metadata={"format": "pt"})
    json.dump({
        "source": f"tests/fixtures/{name} (tests/gen_fixtures.py)",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "path": "HF float32 eager forward (CPU) on the dequantized weights, use_cache=False",
        "quantized_tensors": n_q,
        "kept_tensors": n_keep,
        "greedy_min_margin_over_std": margin,
        "hf_bf16_ratio_short": r_bf,
    }, open(os.path.join(dst, "reference.json"), "w"), indent=2)
    print(f"{name}_fp8: {n_q} quantized, {n_keep} kept; greedy margin {margin:.4f}; HF bf16 ratio {r_bf:.4f}")


def main():
    for name in sys.argv[1:] or ["qwen3_next_a", "qwen3"]:
        make(name)


if __name__ == "__main__":
    main()
