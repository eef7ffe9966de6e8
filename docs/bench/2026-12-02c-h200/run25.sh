#!/usr/bin/env bash
# Session 8, third GPU call: the FP8 expert reader with the scale after the chunk and the FP8
# GEMV rows-per-warp rule (cuda_moe_shared, cuda_fp8), the model suites on the merged kernels
# (gpu.rs, gpu_graphs), the 24-layer bf16 bench (fused shared expert on / PORTER_MOE_SHARED=apart),
# the 48-layer FP8 bench, a per-block prefill profile, the forced-fallback suite.
# Carry .dev (porter + bin/{cuda_moe_shared,cuda_fp8,cuda_gdn_chunk,gpu,gpu_graphs}).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 585 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
t k_moe_shared timeout 70 .dev/bin/cuda_moe_shared $T
t k_fp8 timeout 90 .dev/bin/cuda_fp8 $T fp8_gemv_bf16 fp8_gemv_speed moe_fp8_bf16
t gpu timeout 200 .dev/bin/gpu $T
t gpu_graphs timeout 30 .dev/bin/gpu_graphs $T
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32"
t bf16_24 timeout 40 $P bench $G $B --mtp-step 3 --json "$L/bf16_24.json"
t bf16_apart timeout 30 env PORTER_MOE_SHARED=apart $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_apart.json"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 90 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$L/fp8_48.json"
t prof_prefill timeout 40 env PORTER_PROFILE=1 $P bench $G --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 4
t ncu_wu timeout 90 ncu --kernel-name regex:gdn_chunk_tc_wu --launch-count 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis .dev/bin/cuda_gdn_chunk $T 80b_prefill
t gpu_fallback timeout 200 env PORTER_CUDA_FALLBACK=1 .dev/bin/gpu $T
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -30
for f in bf16_24 bf16_apart fp8_48; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|mtp base|roofline" | head -20; done
grep -E "profile" $L/prof_prefill.log | head -40
grep -hE "GB/s|costs|us/call" $L/k_fp8.log $L/k_moe_shared.log | head -30
grep -E "Duration|Throughput|Stall|Warp Cycles|Occupancy|Registers|Shared Memory|Block Limit|Issued" $L/ncu_wu.log | head -40
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
