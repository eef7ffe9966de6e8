#!/usr/bin/env bash
# Session 7, last GPU call: the final defaults. The chunked GDN's forward substitution with a
# compile-time stride (the run-time stride had doubled the f32 wu launch), the block router
# back (the one-warp router measured no faster), the FP8 GEMV without the split (slower at one
# row), direct MoE decode up to 40 pairs. GDN chunk timing, the router test, the model suites,
# the 24-layer bf16 and 48-layer FP8 benches with MTP, the FP8 step profile.
# Carry .dev (porter + bin/{cuda_gdn_chunk,cuda_kernels,gpu,gpu_graphs}).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 320 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
t k_gdn_chunk timeout 60 .dev/bin/cuda_gdn_chunk $T 80b_prefill
t k_kernels timeout 30 .dev/bin/cuda_kernels $T cuda_moe_router
t gpu timeout 130 .dev/bin/gpu $T
t gpu_graphs timeout 20 .dev/bin/gpu_graphs $T
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 30 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$L/bf16_24.json"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 60 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$L/fp8_48.json"
E4="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2 --batch 1"
N="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
t ncu_fp8_b1 timeout 30 $N --log-file $L/ncu_fp8_b1.csv $P bench $E4 --quantize fp8
python3 scripts/ncu_step.py $L/ncu_fp8_b1.csv > $L/step_fp8_b1.txt 2>&1
cat $S
grep -hE "panicked|FAILED" $L/*.log | head -20
grep -hE "80B|per launch" $L/k_gdn_chunk.log | head -20
for f in bf16_24 fp8_48; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|mtp base|roofline" | head -20; done
head -26 $L/step_fp8_b1.txt
gzip $L/*.csv
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
