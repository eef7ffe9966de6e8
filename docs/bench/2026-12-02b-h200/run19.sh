#!/usr/bin/env bash
# Session 7, second GPU call: the new decode kernels (MoE decode direct form, one-warp router,
# split-K skinny GEMV, FP8 shared expert in place): kernel parity + timings, the model suites
# (gpu.rs, gpu_graphs.rs), the 24-layer bf16 bench and its per-kernel step profile.
# Carry .dev (porter + bin/{cuda_moe_decode,cuda_kernels,cuda_fp8,gpu,gpu_graphs}).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 575 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
t k_moe_decode timeout 100 .dev/bin/cuda_moe_decode $T
t k_kernels timeout 60 .dev/bin/cuda_kernels $T cuda_moe_router cuda_gemv
t k_fp8 timeout 60 .dev/bin/cuda_fp8 $T
t gpu timeout 160 .dev/bin/gpu $T
t gpu_graphs timeout 60 .dev/bin/gpu_graphs $T
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 50 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
E4="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2"
N="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
t ncu_bf16_b1 timeout 40 $N --log-file $L/ncu_bf16_b1.csv $P bench $E4 --batch 1
python3 scripts/ncu_step.py $L/ncu_bf16_b1.csv > $L/step_bf16_b1.txt 2>&1
t mtp_24 timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
cat $S
grep -hE "panicked|FAILED" $L/*.log | head -20
grep -hE "summary|  t=|moe decode 80b|moe_experts_fp8 .*t=1 |us," $L/k_moe_decode.log $L/k_fp8.log | head -40
for f in bf16_24 mtp_24; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|roofline|host|×" | head -20; done
head -30 $L/step_bf16_b1.txt
gzip $L/*.csv
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
