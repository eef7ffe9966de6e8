#!/usr/bin/env bash
# Session 21, GPU call 1 (an H200 asked for: the card of the issues' targets): the issue
# commands at main a85065c (tc5, the bench's out-of-memory skips), the MTP rows with their
# steady rates, and paged decode attention's timing test (every form and split count at 32k keys), plus Nsight Compute
# on the split kernel at 32k x 1.
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_attention).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 170 $P bench $G --prefill 4096,32768 --batch 1,4,8,64 --context 128 --steps 32 --json $L/bench.json > $L/bench.log 2>&1; echo "[$SECONDS s] bench rc=$?"
grep -vE "^\s*$|profile" $L/bench.log | tail -24
timeout 130 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 --json $L/mtp.json > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp rc=$?"
grep -vE "^\s*$|profile" $L/mtp.log | tail -20
T="--nocapture --include-ignored --exact attention_decode_mma_timing"
timeout 150 .dev/k/cuda_attention $T > $L/att.log 2>&1; echo "[$SECONDS s] attention timing rc=$?"
grep -A18 -E "DECODE-AB h16 kvh2 d256 batch 1 ctx 32768" $L/att.log | head -40
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section LaunchStats --section Occupancy"
[ -n "$NCU" ] && timeout 120 $NCU --clock-control none --kernel-name regex:'attention_decode_(bf16_d256_s3_v2|combine2_bf16_d256)' --launch-count 2 $S \
  env PORTER_ATTN_DECODE=mma4 .dev/k/cuda_attention $T > $L/ncu.txt 2>&1
echo "[$SECONDS s] ncu rc=$?"
grep -vE "^\s*$|^    ---|^==PROF==" $L/ncu.txt | grep -E "attention_decode|Duration|Throughput|Registers|Occupancy|Warp Cycles|Issued|Eligible|Active Warps|Executed Ipc|L2 Hit|Stall|stalled|No Eligible|est\. speedup" | head -80
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
