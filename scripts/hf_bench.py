#!/usr/bin/env python3
"""transformers' Qwen3-Next on the same GPU and geometry as `porter bench` (the side-by-side
numbers of docs/benchmarks.md).

Builds Qwen3NextForCausalLM from porter's preset (runner/presets/qwen3-next-80b-a3b.json)
with --layers of its 48 layers (layer types cycled as porter does), random bf16 weights
created directly on the GPU, and measures prefill tokens/s (one prompt per length) and
decode tokens/s at the given batch sizes after a prompt of --context tokens, with
torch.cuda.synchronize() around each timed region. Reports whether flash-linear-attention
(FLA) kernels were importable (carry the fla-core / flash-linear-attention wheels; see
scripts/gpu-bench.sh).

usage: python3 scripts/hf_bench.py --layers 24 --prefill 1024,4096 --batch 1,8,64 --json out.json
"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="runner/presets/qwen3-next-80b-a3b.json")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--prefill", default="1024,4096")
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import transformers
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    try:
        import fla  # noqa: F401

        fla_ok = True
    except Exception as e:  # noqa: BLE001
        fla_ok = f"not importable: {e}"
    raw = json.load(open(a.preset))
    raw["num_hidden_layers"] = a.layers
    cfg = Qwen3NextConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3NextForCausalLM(cfg)
    model.eval()
    torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, FLA: {fla_ok}, "
          f"{a.layers} layers, {params / 1e9:.2f} B params, {torch.cuda.get_device_name()}", flush=True)
    vocab = cfg.vocab_size
    tok = lambda n, off=0: (torch.arange(n, device="cuda") * 7919 + 3 + off) % vocab  # noqa: E731
    results = []
    with torch.inference_mode():
        model(tok(64)[None], use_cache=True)  # warm-up (Triton autotuning, cuBLAS)
        torch.cuda.synchronize()
        for n in [int(x) for x in a.prefill.split(",") if x]:
            ids = tok(n)[None]
            # Untimed run at the same length: Triton (FLA) compiles and autotunes per shape.
            model(ids, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            s = time.perf_counter() - t0
            print(f"prefill {n:>6} tokens: {n / s:>10.1f} tok/s ({s:.3f} s)", flush=True)
            results.append({"kind": "prefill", "tokens": n, "seconds": s, "tokens_per_s": n / s})
        for b in [int(x) for x in a.batch.split(",") if x]:
            ids = torch.stack([tok(a.context, j) for j in range(b)])
            out = model(ids, use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            # one untimed step (warm-up of the decode kernels)
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            s = time.perf_counter() - t0
            tps = b * a.steps / s
            print(f"decode batch {b:>4}: {tps:>10.1f} tok/s ({s * 1e3 / a.steps:.2f} ms/step)", flush=True)
            results.append({"kind": "decode", "batch": b, "steps": a.steps, "context": a.context,
                            "tokens_per_s": tps, "ms_per_step": s * 1e3 / a.steps})
            del past, out
            torch.cuda.empty_cache()
    if a.json:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "fla": fla_ok,
                   "layers": a.layers, "results": results}, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
