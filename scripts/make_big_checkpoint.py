#!/usr/bin/env python3
"""Writes a random bf16 checkpoint of a real geometry, sharded like the hub's, for load tests.

    porter load --print-tensors qwen3-next-80b-a3b --layers 7 > spec.json
    python3 scripts/make_big_checkpoint.py spec.json OUT_DIR [--shard-gb 5]

`spec.json` is what `porter load --print-tensors` prints: the config and every tensor name
and shape the model's weight map reads. The values are constants per tensor; this exercises loading (throughput, host and
device memory), not the model's output.
"""
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file


def main():
    spec_path, out = sys.argv[1], sys.argv[2]
    shard_gb = float(sys.argv[sys.argv.index("--shard-gb") + 1]) if "--shard-gb" in sys.argv else 5.0
    spec = json.load(open(spec_path))
    os.makedirs(out, exist_ok=True)
    cfg = dict(spec["config"])
    cfg["torch_dtype"] = "bfloat16"
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    shard, shard_bytes, idx, weight_map, total = {}, 0, 0, {}, 0
    names = []
    t0 = time.time()

    def flush():
        nonlocal shard, shard_bytes, idx
        if not shard:
            return
        idx += 1
        name = f"model-{idx:05d}.safetensors"
        save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
        for k in shard:
            weight_map[k] = name
        names.append(name)
        shard, shard_bytes = {}, 0

    for name, shape in spec["tensors"]:
        # Cheap deterministic values (random normals take minutes for 20+ GB): loading does
        # not look at them.
        t = torch.full(shape, 0.01 * (1 + len(shard) % 7), dtype=torch.bfloat16)
        shard[name] = t
        shard_bytes += t.numel() * 2
        total += t.numel() * 2
        if shard_bytes >= shard_gb * 1e9:
            flush()
    flush()
    # Rename to the hub's "-of-N" pattern.
    n = len(names)
    final = {}
    for i, old in enumerate(names, 1):
        new = f"model-{i:05d}-of-{n:05d}.safetensors"
        os.rename(os.path.join(out, old), os.path.join(out, new))
        final[old] = new
    index = {"metadata": {"total_size": total}, "weight_map": {k: final[v] for k, v in weight_map.items()}}
    json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"))
    print(f"wrote {total / 1e9:.2f} GB in {n} shards to {out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
