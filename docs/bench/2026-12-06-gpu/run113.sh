#!/usr/bin/env bash
# Session 27, GPU call 2: the model A/B of decode attention's early loads
# (PORTER_ATTN_DECODE_EARLY=off|on, alternating, three rounds) at batch 1 and 8, bf16 and FP8
# (24 layers, context 128), then the kernel timing at 32k again (early against not).
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for r in 1 2 3; do
  for e in off on; do
    for q in "" "--quantize fp8"; do
      s=$(PORTER_ATTN_DECODE_EARLY=$e timeout 100 $P bench $G $q --prefill 16 --batch 1,8 --context 128 --steps 64 2>&1 | grep -E '^decode batch' | sed -E 's/.*batch +([0-9]+): +([0-9.]+) tok.*\(([0-9.]+) ms.*/b\1 \2 tok\/s \3 ms/' | tr '\n' ' ')
      echo "[$SECONDS s] round $r early=$e ${q:-bf16}: $s"
    done
  done
done
T="--include-ignored --nocapture --test-threads=1"
timeout 120 .dev/k/cuda_attention $T --exact attention_decode_mma_timing > $OUT/timing.log 2>&1; echo "[$SECONDS s] timing rc=$?"
grep -E "DECODE-AB|Mma4 .*(env|early) per call" $OUT/timing.log | head -12
echo "[$SECONDS s] done"
