#!/usr/bin/env bash
# Session 22, GPU call 2: (1) the Qwen3-Next MTP head's steps from CUDA graphs: the new
# gpu_graphs test (graph ≡ eager bit for bit, f32) and the rest of gpu_graphs and gpu;
# (2) the MTP rows after the oracle's host cost was removed, with the row "forced, head's
# compute" (the random MTP head runs for its cost, the oracle proposes), K = 1..3, twice
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (gpu, gpu_graphs).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--nocapture --include-ignored --test-threads=1"
timeout 150 .dev/k/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
grep -E "^test |draft|FAILED|panicked" $L/gpu_graphs.log | head -20
timeout 100 .dev/k/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
grep -E "FAILED|panicked" $L/gpu.log | head
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for i in 1 2; do
  timeout 150 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 --json $L/mtp$i.json > $L/mtp$i.log 2>&1; echo "[$SECONDS s] mtp run $i rc=$?"
  grep -E "^(decode|mtp)" $L/mtp$i.log
done
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
