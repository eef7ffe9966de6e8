#!/usr/bin/env bash
# Session 6, last GPU call: the FP8 tensor-core GEMMs (branch fp8tc) and the one-launch MoE
# decode GEMV (branch moegemv), merged. Kernel parity + timings, the FP8/MoE model tests in
# each FP8 GEMM form, the 24-layer bf16 bench (MoE decode v1, the default since, vs v2; graphs on), and the
# 48-layer FP8 80B bench with graphs (dense / MoE GEMM forms for prefill and batch 64).
# Carry only .dev, with .dev/bin holding just cuda_fp8, cuda_fp8_gemm, cuda_moe, cuda_moe_decode and
# gpu (the tracked tree is ~21 MB; the carry limit is 64 MiB in all).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
# Each step runs only if the call has time left for it (its timeout) before 570 s.
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 570 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
t k_fp8_gemm timeout 130 .dev/bin/cuda_fp8_gemm $T
t k_moe_decode timeout 60 .dev/bin/cuda_moe_decode $T
t k_fp8 timeout 50 .dev/bin/cuda_fp8 $T
t k_moe timeout 25 .dev/bin/cuda_moe $T
t gpu_fp8 timeout 40 .dev/bin/gpu $T cuda_fp8 cuda_qwen3_moe cuda_qwen3_next_a
for p in tc mma8; do PORTER_FP8_GEMM=$p t gpu_fp8_$p timeout 20 .dev/bin/gpu $T cuda_fp8_kernels_match; done
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 110 $P bench $F --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$L/fp8_48.json"
t bf16_24 timeout 45 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
PORTER_FP8_GEMM=tc t fp8_48_tc timeout 50 $P bench $F --prefill 4096 --batch 8,64 --context 128 --steps 16 --json "$L/fp8_48_tc.json"
PORTER_FP8_GEMM=mma8 t fp8_48_mma8 timeout 50 $P bench $F --prefill 4096 --batch 8,64 --context 128 --steps 16 --json "$L/fp8_48_mma8.json"
PORTER_MOE_GEMV=v2 t bf16_24_v2 timeout 35 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24_v2.json"
cat $S
grep -hE "panicked|FAILED" $L/*.log | head -20
for f in bf16_24 bf16_24_v2 fp8_48 fp8_48_tc fp8_48_mma8; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|memory|roofline" | head -16; done
grep -hE "us|TFLOP|GB/s" $L/k_fp8_gemm.log | head -40
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
