#!/usr/bin/env bash
# Session 27, last try: the model A/B of decode attention's early loads only
# (PORTER_ATTN_DECODE_EARLY=off|on, alternating, two rounds, batch 1, bf16 and FP8, 24 layers,
# context 128 and 4,096). Carry .dev/porter (porter.gz: this tree), .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for r in 1 2; do
  for c in 128 4096; do
  for e in off on; do
    for q in "" "--quantize fp8"; do
      s=$(PORTER_ATTN_DECODE_EARLY=$e timeout 60 $P bench $G $q --prefill 16 --batch 1 --context $c --steps 64 2>&1 | grep -E '^decode batch' | sed -E 's/.*batch +([0-9]+): +([0-9.]+) tok.*\(([0-9.]+) ms.*/b\1 \2 tok\/s \3 ms/' | tr '\n' ' ')
      echo "[$SECONDS s] round $r context $c early=$e ${q:-bf16}: $s"
    done
  done
  done
done
echo "[$SECONDS s] done"
