#!/usr/bin/env bash
# Session 15, call 6: the session's final defaults (GDN fusion and router fusion opt-in, the FP8
# row-group GEMV for 5-32 rows). FP8 GEMV tests (the m = 1 assertion fixed), the model suites
# (also with the fallback kernels forced), the bench command, FP8 48 layers, MTP K = 3.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 100 .dev/k/cuda_fp8 $T fp8_gemv_bf16 fp8_gemv_f16 fp8_gemv_f32 > $L/cuda_fp8.log 2>&1; echo "cuda_fp8 gemv rc=$? $(grep -E '^test result' $L/cuda_fp8.log)"
grep -E "failures|differ" $L/cuda_fp8.log | head -5
timeout 60 .dev/k/cuda_fp8_rows $T fp8_gemv_rows_bf16 fp8_gemv_rows_f16 > $L/cuda_fp8_rows.log 2>&1; echo "cuda_fp8_rows rc=$? $(grep -E '^test result' $L/cuda_fp8_rows.log)"
timeout 90 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 40 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
PORTER_CUDA_FALLBACK=1 timeout 100 .dev/bin/gpu $T > $L/gpu_fallback.log 2>&1; echo "gpu fallback rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
timeout 120 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1
grep -E "prefill|decode batch|host issue" $L/bf16.log
timeout 150 $P bench $F --prefill 4096 --batch 1,8,16,32,64 --context 128 --steps 32 > $L/fp8.log 2>&1
grep -E "prefill|decode batch|memory after" $L/fp8.log
timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1
grep -E "forced|baseline" $L/mtp.log
grep -hE "panicked|FAILED|failed:" $L/*.log | head
