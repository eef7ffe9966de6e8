#!/usr/bin/env bash
# Session 8, third GPU call: the model suites on the merged kernels (gpu.rs, gpu_graphs),
# the forced-fallback suite (PORTER_CUDA_FALLBACK=1), the 24-layer bf16 bench (fused shared
# expert on / PORTER_MOE_SHARED=apart), the 48-layer FP8 bench, and a per-block prefill profile.
# Carry .dev (porter + bin/{gpu,gpu_graphs}).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 585 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32"
t bf16_24 timeout 40 $P bench $G $B --mtp-step 3 --json "$L/bf16_24.json"
t bf16_apart timeout 30 env PORTER_MOE_SHARED=apart $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_apart.json"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 90 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$L/fp8_48.json"
t prof_prefill timeout 40 env PORTER_PROFILE=1 $P bench $G --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 4
t gpu timeout 200 .dev/bin/gpu $T
t gpu_graphs timeout 30 .dev/bin/gpu_graphs $T
t gpu_fallback timeout 200 env PORTER_CUDA_FALLBACK=1 .dev/bin/gpu $T
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -30
for f in bf16_24 bf16_apart fp8_48; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|mtp base|roofline" | head -20; done
grep -E "profile" $L/prof_prefill.log | head -40
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
