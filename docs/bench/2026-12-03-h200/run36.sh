#!/usr/bin/env bash
# Session 12, call 2 (early): the wgmma grouped MoE prefill GEMMs (helper moewg) alone:
# parity against the CPU, then the 80B timing beside mma and pipe. Carry .dev/early/cuda_moe, .dev/ptx.tgz.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; S=$L/summary.txt; date -u > $S
T="--nocapture --include-ignored --test-threads=1"
B=.dev/early/cuda_moe
timeout 100 $B $T moe_wgmma_parity > $L/parity.log 2>&1; echo "parity rc=$? $(grep -E '^test result' $L/parity.log)" >> $S
timeout 80 env PORTER_TEST_MOE_FORMS=mma,pipe,wgmma $B $T --exact moe_80b_forms_timed > $L/timed.log 2>&1; echo "timed rc=$? $(grep -E '^test result' $L/timed.log)" >> $S
timeout 60 $B $T --exact moe_small_bf16 moe_uneven_bf16 moe_80b_bf16 > $L/sweep.log 2>&1; echo "sweep rc=$? $(grep -E '^test result' $L/sweep.log)" >> $S
cat $S; grep -hE "panicked|FAILED|failed|mismatch" $L/*.log | head -20
grep -E "wgmma|pipe|mma" $L/timed.log | head -30; tail -30 $L/parity.log
