#!/usr/bin/env bash
# Session 15, call 7: the FP8 tensor-core GEMV with two row groups a block beyond 8 rows (bf16
# x). Kernel tests (bit for bit against the 8-row launches, CPU), its speed against the
# tile-dequant GEMM, the model suite, and FP8 decode at 16 / 32 / 64 rows with the row-group
# GEMV up to 32 rows (default) and up to 64 (PORTER_FP8_GEMV_ROWS=64).
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 150 .dev/k/cuda_fp8_rows $T > $L/cuda_fp8_rows.log 2>&1; echo "cuda_fp8_rows rc=$? $(grep -E '^test result' $L/cuda_fp8_rows.log)"
grep -hE "rows GEMV|differ|panicked" $L/cuda_fp8_rows.log | head -16
timeout 100 .dev/k/cuda_fp8 $T fp8_gemv_bf16 fp8_gemv_f16 > $L/cuda_fp8.log 2>&1; echo "cuda_fp8 gemv rc=$? $(grep -E '^test result' $L/cuda_fp8.log)"
timeout 90 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
for v in 32 64 32 64; do
  PORTER_FP8_GEMV_ROWS=$v timeout 120 $P bench $F --prefill 16 --batch 8,16,32,64 --context 128 --steps 32 > $L/fp8_$v.log 2>&1
  echo "rows<=$v: $(grep -E 'decode batch' $L/fp8_$v.log | sed 's/(\([0-9.]*\) ms\/step.*/(\1 ms)/;s/decode batch//' | tr -s ' ' | tr '\n' ' ')"
done
grep -hE "panicked|FAILED|failed:" $L/*.log | head
