#!/usr/bin/env bash
# Session 20, GPU call 2 (H100): why the chunked Gated DeltaNet's wu launch runs at the same
# 172 µs on the H100 as on the H200 (so not bandwidth-bound): Nsight Compute on the tc4 wu and
# tc5 state launches of cuda_gdn_chunked_seq_80b_prefill (4k tokens, 80B layout; the test's
# first calls are tc5's), the wu launch at 3 blocks an SM (PORTER_GDN_WU_OCC=3), and the
# CUDA-graph suite (gpu_graphs) that call 1 could not carry.
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_gdn_chunk, cuda_gdn_seq, gpu_graphs).
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
T="--nocapture --include-ignored --test-threads=1"
timeout 60 .dev/k/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
timeout 60 env PORTER_GDN_WU_OCC=3 .dev/k/cuda_gdn_chunk $T cuda_gdn_chunked_seq_80b_prefill > $L/o3.log 2>&1; echo "[$SECONDS s] o3 rc=$?"
grep -E "\[tc[45]\] per launch|tc5 vs tc4" $L/o3.log
S="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis --section InstructionStats"
timeout 240 $NCU --clock-control none --kernel-name regex:'gdn_chunk_tc4_wu|gdn_chunk_tc5_state' --launch-count 2 $S \
  .dev/k/cuda_gdn_chunk cuda_gdn_chunked_seq_80b_prefill --include-ignored --exact --nocapture > $L/ncu.txt 2>&1
echo "[$SECONDS s] ncu rc=$?"
grep -vE "^\s*$|^    ---|^==PROF==" $L/ncu.txt | grep -E "gdn_chunk|Duration|Throughput|Registers|Occupancy|Warp Cycles|Stall|Issued|Block Limit|Shared Memory|Eligible|Active Warps|Pipe|Executed Ipc|L1|L2|Bank|Uncoalesced|One or More|No Eligible|Barrier|est\. speedup|ncu|stalled" | head -200
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
