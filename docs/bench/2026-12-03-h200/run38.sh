#!/usr/bin/env bash
# Session 12, call 4 (early): the tensor-core FP8 routed experts for decode batches (helper
# fp8moe): parity against the CPU, the existing FP8 MoE tests, timing beside the GEMV forms.
# Carry .dev/early/cuda_fp8, .dev/ptx.tgz.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; S=$L/summary.txt; date -u > $S
T="--nocapture --include-ignored --test-threads=1"
r() { local n=$1; shift; timeout "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -E '^test result' $L/$n.log | tail -1)" >> $S; }
B=.dev/early/cuda_fp8
r speed 60 $B $T --exact moe_fp8_mma_speed
r mma 90 $B $T --exact moe_fp8_mma_bf16 moe_fp8_mma_f16
r old 90 $B $T --exact moe_fp8_bf16 moe_fp8_f16
cat $S; grep -hE "panicked|FAILED|failed|FAIL" $L/*.log | head -20
grep -vE "^\s*$" $L/speed.log | tail -30; grep -E "err|tol" $L/mma.log | tail -12
