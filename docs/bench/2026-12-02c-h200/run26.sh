#!/usr/bin/env bash
# Session 8, fourth GPU call: what call 3 left unrun for time: the fused shared expert's FP8
# parity with the new FP8 expert reader (cuda_moe_shared), the FP8 MoE / GEMV parity in f16 and
# f32 (cuda_fp8). Carry .dev (bin/{cuda_moe_shared,cuda_fp8}).
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T="--nocapture --include-ignored --test-threads=1"
timeout 170 .dev/bin/cuda_moe_shared $T > $L/k_moe_shared.log 2>&1; echo "k_moe_shared rc=$? $(grep -E '^test result' $L/k_moe_shared.log)" >> $S
timeout 120 .dev/bin/cuda_fp8 $T moe_fp8_f16 moe_fp8_f32 fp8_gemv_f16 fp8_gemv_f32 > $L/k_fp8.log 2>&1; echo "k_fp8 rc=$? $(grep -E '^test result' $L/k_fp8.log)" >> $S
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
grep -hE "us/call|costs|fused vs" $L/k_moe_shared.log | head -20
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
