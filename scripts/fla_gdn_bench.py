#!/usr/bin/env python3
"""The peer of porter's chunked Gated DeltaNet kernel: flash-linear-attention's
`chunk_gated_delta_rule` at the Qwen3-Next-80B head layout, timed on the GPU.

Same layout and call as transformers' Qwen3-Next (q and k repeated from 16 to the 32 value
heads, head dim 128, L2 norm of q / k in the kernel, f32 log-decay g, bf16 q / k / v / beta),
one sequence of T tokens, no initial state, the final state returned. Each length runs once
untimed (Triton compiles and autotunes per shape), then the best of `--reps` timed runs
(CUDA events). TFLOP/s uses the count of kernels/tests/cuda_gdn_chunk.rs: per 64-token chunk
and value head 10·C²·d + 6·C·d² (the products K·Kᵀ, A·K, A·V, Q·Kᵀ, (Q·Kᵀ)·V', Q·S, W·S,
Kᵀ·V'; the triangular solve not counted), i.e. T·Hv·(10·64·d + 6·d²).

Needs the flash-linear-attention and fla-core wheels (carried: nothing is fetched there):
    python3 scripts/fla_gdn_bench.py --tokens 4096,16384
"""
import argparse
import json

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    hk, hv, d = 16, 32, 128
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for t in [int(x) for x in a.tokens.split(",")]:
        q = torch.randn(1, t, hk, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, t, hk, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, t, hv, d, device=dev, dtype=torch.bfloat16)
        # log-decay in (-1, 0) and beta in (0, 1), as the model's gates give them
        g = -torch.rand(1, t, hv, device=dev, dtype=torch.float32)
        beta = torch.rand(1, t, hv, device=dev, dtype=torch.bfloat16)
        rep = hv // hk
        qr, kr = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)

        def run():
            return chunk_gated_delta_rule(
                qr, kr, v, g=g, beta=beta, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True
            )

        run()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(a.reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            run()
            e1.record()
            torch.cuda.synchronize()
            best = min(best, e0.elapsed_time(e1) * 1e3)
        flop = t * hv * (10 * 64 * d + 6 * d * d)
        tf = flop / best * 1e-6
        print(f"fla chunk_gated_delta_rule bf16 t {t}: {best:.1f} µs ({tf:.1f} TFLOP/s)", flush=True)
        rows.append({"tokens": t, "us": best, "tflops": tf})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
