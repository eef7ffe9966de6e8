#!/usr/bin/env bash
# Session 22, GPU call 4 on an H100 (run81.sh, the issues' H200 rows, got no H200): main
# 8f28905 — the model suites (the engine's plain greedy MTP on the device, the draft graphs),
# the GPU-speed issue's bench command and its MTP row. Carry .dev/porter, .dev/ptx.tgz,
# .dev/k (gpu, gpu_graphs).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--nocapture --include-ignored --test-threads=1"
timeout 60 .dev/k/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
timeout 100 .dev/k/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
grep -E "FAILED|panicked" $L/gpu.log $L/gpu_graphs.log | head
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 90 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json $L/bench.json > $L/bench.log 2>&1; echo "[$SECONDS s] bench G rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue" $L/bench.log
timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp G rc=$?"
grep -E "^mtp (baseline|k=)|CUDA graphs" $L/mtp.log
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
