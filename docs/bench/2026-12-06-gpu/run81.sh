#!/usr/bin/env bash
# Session 22, GPU call 4, on an H200 (needs_h200: the FP8 48-layer model does not fit 78 GiB):
# the issues' H200 rows at main 8f28905 (not measured on an H200 since session 17): the model
# suites; decode attention at 32k keys (timing test); the GPU-speed issue's bench command and
# its MTP row (the oracle's host cost removed, the head's steps graphed, the argmax); the FP8
# issue's whole model (48 layers + the MTP layer) at batch 1, 8, 64 and its MTP row; decode
# at 32k context. Carry .dev/porter, .dev/ptx.tgz, .dev/k (gpu, gpu_graphs, cuda_attention).
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
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 90 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json $L/bench.json > $L/bench.log 2>&1; echo "[$SECONDS s] bench G rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue" $L/bench.log
timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp G rc=$?"
grep -E "^mtp (baseline|k=)|CUDA graphs" $L/mtp.log
timeout 120 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json $L/fp8.json > $L/fp8.log 2>&1; echo "[$SECONDS s] bench F rc=$?"
grep -E "^(device|HBM|prefill|decode)" $L/fp8.log
timeout 100 $P bench $F --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/fp8_mtp.log 2>&1; echo "[$SECONDS s] mtp F rc=$?"
grep -E "^mtp (baseline|k=)|CUDA graphs" $L/fp8_mtp.log
timeout 60 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16 > $L/ctx32k.log 2>&1; echo "[$SECONDS s] 32k context rc=$?"
grep -E "^decode" $L/ctx32k.log
timeout 90 .dev/k/cuda_attention $T --exact attention_decode_mma_timing > $L/att.log 2>&1; echo "[$SECONDS s] attention_decode_mma_timing rc=$?"
grep -E -A60 "DECODE-AB h16 kvh2 d256 batch 1 ctx 32768" $L/att.log | grep -E "Mma4 |Mma4N8|DECODE|combine" | head -12
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
