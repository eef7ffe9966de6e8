#!/usr/bin/env bash
# Session 8, first GPU call: programmatic dependent launch (PDL) on every kernel (sm_90),
# the one-read norm kernels. PDL chain test, the norm tests, the model suites with PDL on,
# and the 24-layer bf16 bench with PDL on and off (A/B), plus the FP8 48-layer bench (PDL on).
# Carry .dev (porter + bin/{cuda_pdl,cuda_kernels,gpu,gpu_graphs}).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 560 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
t k_pdl timeout 60 .dev/bin/cuda_pdl $T
t k_norm timeout 60 .dev/bin/cuda_kernels $T norm
t gpu timeout 170 .dev/bin/gpu $T
t gpu_graphs timeout 30 .dev/bin/gpu_graphs $T
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 4096 --batch 1,8,64 --context 128 --steps 32"
t bf16_pdl timeout 60 $P bench $G $B --mtp-step 3 --json "$L/bf16_pdl.json"
t bf16_nopdl timeout 60 env PORTER_PDL=0 $P bench $G $B --json "$L/bf16_nopdl.json"
t bf16_pdl2 timeout 60 $P bench $G $B --json "$L/bf16_pdl2.json"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 90 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$L/fp8_48.json"
cat $S
grep -hE "panicked|FAILED" $L/*.log | head -20
grep -hE "PDL|µs a launch" $L/k_pdl.log
for f in bf16_pdl bf16_nopdl bf16_pdl2 fp8_48; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|mtp base|roofline|programmatic" | head -20; done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
