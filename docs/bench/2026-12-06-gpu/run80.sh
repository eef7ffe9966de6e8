#!/usr/bin/env bash
# Session 22, GPU call 3: the greedy argmax kernel reading float4, four loads in flight a
# thread (one block a row read the 608 KB vocabulary row one dependent load at a time): its
# test (ties, NaN, unaligned rows, tails) and its time for one 151,936-entry row; the model
# suites; the MTP rows and the engine's plain greedy decode against call 2 (396.2 / 389.1 tok/s).
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_router, gpu, gpu_graphs).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--nocapture --include-ignored --test-threads=1"
timeout 60 .dev/k/cuda_router $T > $L/router.log 2>&1; echo "[$SECONDS s] cuda_router rc=$? $(grep -E '^test result' $L/router.log)"
grep -E "argmax|FAILED|panicked" $L/router.log | head
timeout 60 .dev/k/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
timeout 100 .dev/k/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
grep -E "FAILED|panicked" $L/gpu.log $L/gpu_graphs.log | head
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for i in 1 2; do
  timeout 150 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 --json $L/mtp$i.json > $L/mtp$i.log 2>&1; echo "[$SECONDS s] mtp run $i rc=$?"
  grep -E "^(decode|mtp)" $L/mtp$i.log
done
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
