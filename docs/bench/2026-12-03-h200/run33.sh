#!/usr/bin/env bash
# Session 11, call 2b (right after run32.sh, same machine): the model suites on the new defaults
# (PDL decode GEMVs, mma attention, 48-row MoE tiles): gpu_graphs.rs (graph ≡ eager, every
# architecture), gpu.rs (every model's parity, FP8, MTP, quantized KV), and gpu.rs's
# Qwen3-Next tests with the opt-in fused GDN decode and async MoE decode kernels.
# Carry .dev/ptx.tgz, .dev/bin/{gpu,gpu_graphs}.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 570 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
t gpu_graphs timeout 120 .dev/bin/gpu_graphs $T
t gpu timeout 260 .dev/bin/gpu $T
t gpu_next_opt timeout 120 env PORTER_GDN_DECODE=fused PORTER_MOE_DOWN=async PORTER_MOE_GU=async .dev/bin/gpu $T qwen3_next
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
grep -E "^test " $L/gpu.log $L/gpu_graphs.log $L/gpu_next_opt.log | head -50
tar czf $OUT/logs.tgz -C $OUT logs
