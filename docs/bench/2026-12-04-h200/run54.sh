#!/usr/bin/env bash
# Session 15, call 5: the FP8 tensor-core GEMV over up to 64 rows (fp8_gemv_rows) for decode
# batches of 5-64 rows. Kernel tests (CPU reference, bit for bit against the 8-row launches,
# timing against the tile-dequant GEMM), model suites, FP8 decode at batch 1..64 (call 4 of
# this session: 255.3 / 848.6 / 2,556.9 tok/s at 1 / 8 / 64 before), bf16 unchanged.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 150 .dev/k/cuda_fp8_rows $T > $L/cuda_fp8_rows.log 2>&1; echo "cuda_fp8_rows rc=$? $(grep -E '^test result' $L/cuda_fp8_rows.log)"
# The m <= 8 FP8 GEMV tests (the kernel's indexing changed for the row groups).
timeout 150 .dev/k/cuda_fp8 $T fp8_gemv_bf16 fp8_gemv_f16 fp8_gemv_f32 > $L/cuda_fp8.log 2>&1; echo "cuda_fp8 gemv rc=$? $(grep -E '^test result' $L/cuda_fp8.log)"
grep -hE "rows GEMV|differ|panicked" $L/cuda_fp8_rows.log | head -20
timeout 90 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 40 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
timeout 120 $P bench $F --prefill 16 --batch 1,4,8,16,32,64 --context 128 --steps 32 > $L/fp8.log 2>&1
grep -E "decode batch" $L/fp8.log
timeout 120 $P bench $F --prefill 16 --batch 8,64 --context 128 --steps 32 > $L/fp8_2.log 2>&1
echo "fp8 again: $(grep -E 'decode batch' $L/fp8_2.log | sed 's/(.*of the HBM roofline)//' | tr -s ' ' | tr '\n' ' ')"
PORTER_FP8_GEMV=fma timeout 120 $P bench $F --prefill 16 --batch 8,64 --context 128 --steps 32 > $L/fp8_fma.log 2>&1
echo "fp8 PORTER_FP8_GEMV=fma (no tensor-core GEMV; batches > 4 on the tile-dequant GEMM as before): $(grep -E 'decode batch' $L/fp8_fma.log | sed 's/(.*of the HBM roofline)//' | tr -s ' ' | tr '\n' ' ')"
timeout 120 $P bench $F --prefill 4096 --batch 1 --context 128 --steps 8 > $L/fp8_pf.log 2>&1
grep -E "prefill" $L/fp8_pf.log
timeout 60 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1
grep -E "decode batch" $L/bf16.log
grep -hE "panicked|FAILED|failed:" $L/*.log | head
