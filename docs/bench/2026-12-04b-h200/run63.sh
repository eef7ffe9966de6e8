#!/usr/bin/env bash
# Session 17, call 4: why the FP8 direct down kernel is slow on its own (cuda_moe_shared: 12.6 µs
# for 10.5 MB at t = 1, where the bf16 one takes 9.0 µs for 21 MB). Nsight Compute on the
# 80B-shape t = 1 calls of moe_shared_80b_fp8 / _bf16: speed of light, warp stall reasons,
# memory workload, for the down (in-flight) and gate+up kernels.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
S="--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters"
for t in fp8 bf16; do
  timeout 200 $NCU --clock-control none --kernel-name regex:'moe_dir_(downa_sh|gu_sh)' --launch-skip 4 --launch-count 4 $S \
    .dev/k/cuda_moe_shared moe_shared_80b_$t --include-ignored --exact --nocapture > $L/ncu_$t.txt 2>&1
  echo "[$SECONDS s] ncu $t rc=$?"
  grep -E "moe_dir_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Stall|Issued Ipc|Block Limit" $L/ncu_$t.txt | head -80
done
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
