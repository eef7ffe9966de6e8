#!/usr/bin/env bash
# Session 9, first GPU call: where the time goes now, on main eb62d94 (no kernel changes):
# per-kernel device time of one decode step (bf16 b1 / b64, FP8 b1; ncu, caches not flushed)
# and Nsight Compute sections of the prefill MoE grouped GEMMs and the tensor-core attention
# at 4k (for the helpers rewriting them). Carry .dev (porter).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 575 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s" >> $S; }
E4="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2"
N="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
t ncu_bf16_b1 timeout 60 $N --log-file $L/ncu_bf16_b1.csv $P bench $E4 --batch 1
python3 scripts/ncu_step.py --layers 4 $L/ncu_bf16_b1.csv > $L/step_bf16_b1.txt 2>&1
t ncu_fp8_b1 timeout 60 $N --log-file $L/ncu_fp8_b1.csv $P bench $E4 --quantize fp8 --batch 1
python3 scripts/ncu_step.py --layers 4 $L/ncu_fp8_b1.csv > $L/step_fp8_b1.txt 2>&1
t ncu_bf16_b64 timeout 60 $N --log-file $L/ncu_bf16_b64.csv $P bench $E4 --batch 64
python3 scripts/ncu_step.py --layers 4 $L/ncu_bf16_b64.csv > $L/step_bf16_b64.txt 2>&1
PF="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 1"
SEC="--section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
t ncu_moe_gu timeout 90 ncu --kernel-name regex:moe_gemm_gu_tc --launch-count 1 $SEC $P bench $PF
t ncu_moe_down timeout 90 ncu --kernel-name regex:moe_gemm_down_tc --launch-count 1 $SEC $P bench $PF
t ncu_attn timeout 90 ncu --kernel-name regex:attention_tc --launch-count 1 $SEC $P bench $PF
cat $S
for f in step_bf16_b1 step_fp8_b1 step_bf16_b64; do echo "== $f"; head -45 $L/$f.txt; done
for f in ncu_moe_gu ncu_moe_down ncu_attn; do echo "== $f"; grep -E "moe_gemm|attention_tc|Duration|Throughput|Stall|Warp Cycles|Occupancy|Registers|Shared Memory|Block Limit|Issued|Pipe" $L/$f.log | head -40; done
gzip $L/*.csv
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
