#!/usr/bin/env bash
# Session 16, call 4: the session's final defaults (graphs of >= 32 spans captured, the FP8
# row-group GEMV up to 64 rows, the MoE decode kernels up to 8 pairs an expert). The suites
# (also with the fallback kernels forced), cuda_moe (its path assertions), the bf16
# command, FP8 48 layers at batch 1-256, and batch 384 (3,840 pairs, the new reach's edge)
# against the old reach (PORTER_MOE_DECODE_PER_EXPERT=2).
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 40 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 20 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
PORTER_CUDA_FALLBACK=1 timeout 60 .dev/bin/gpu $T > $L/gpu_fallback.log 2>&1; echo "[$SECONDS s] gpu fallback rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
timeout 60 .dev/k/cuda_moe $T > $L/cuda_moe.log 2>&1; echo "[$SECONDS s] cuda_moe rc=$? $(grep -E '^test result' $L/cuda_moe.log)"
timeout 40 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1
echo "[$SECONDS s] bf16:"; grep -E "HBM copy|prefill|decode batch|not captured|host issue" $L/bf16.log
timeout 50 $P bench $F --prefill 4096 --batch 1,8,16,32,64,128,256 --context 128 --steps 32 > $L/fp8.log 2>&1
echo "[$SECONDS s] fp8:"; grep -E "HBM copy|prefill|decode batch|not captured|memory after" $L/fp8.log
for v in 8 2; do
  PORTER_MOE_DECODE_PER_EXPERT=$v timeout 30 $P bench $F --prefill 16 --batch 384 --context 128 --steps 16 > $L/fp8_384_$v.log 2>&1
  echo "[$SECONDS s] fp8 b384 per-expert $v: $(grep -E 'decode batch|not captured' $L/fp8_384_$v.log | tr '\n' ' ')"
  PORTER_MOE_DECODE_PER_EXPERT=$v timeout 30 $P bench $G --prefill 16 --batch 128,256,384 --context 128 --steps 16 > $L/bf16_384_$v.log 2>&1
  echo "[$SECONDS s] bf16 per-expert $v: $(grep -E 'decode batch|not captured' $L/bf16_384_$v.log | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' ')"
done
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | head
echo "[$SECONDS s] done"
