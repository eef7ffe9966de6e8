#!/usr/bin/env bash
# Session 28, never ran (too little device time left): after the reverts (the tree is session 27's kernels again), decode
# attention's timing in this session's machine, to set against call 1's (the combine with its
# early spans) and session 27's; then the model at 4k context, batch 1, once.
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
timeout 45 .dev/k/cuda_attention $T --exact attention_decode_mma_timing > $OUT/timing.log 2>&1; echo "[$SECONDS s] timing rc=$?"
grep -E "DECODE-AB|Mma4 .*(env|early) per call|Mma4 .*env( early)?: alloc" $OUT/timing.log | head -24
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
s=$(timeout 40 /tmp/porter_new bench $G --prefill 16 --batch 1 --context 4096 --steps 64 2>&1 | grep -E '^decode batch' | tr '\n' ' ')
echo "[$SECONDS s] context 4096: $s"
echo "[$SECONDS s] done"
