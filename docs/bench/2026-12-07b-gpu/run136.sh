#!/usr/bin/env bash
# Session 32, GPU call 1 (H100): what bounds the chunked Gated DeltaNet's state sweep (tc5)?
# Hypothesis: L2 → SM bandwidth. Its 128 blocks each read a 64 KiB stage a chunk (−W, K̃, Qg,
# Pb shared by the 4 column blocks of a head, U's 32 columns): 8.4 MB a chunk step, every
# 1.86 µs at 16k (4.5 TB/s). Nsight Compute on the first tc5 state launch (4k tokens) and
# the wu launch, the 80B-layout timing, flash-linear-attention 0.6.0 beside it.
# Carry .dev/porter, .dev/ptx.tgz, .dev/g (cuda_gdn_chunk), .dev/whl.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
T="--nocapture --include-ignored --test-threads=1"
timeout 90 .dev/g/cuda_gdn_chunk $T --exact cuda_gdn_chunked_seq_80b_prefill > $L/gdn_80b.log 2>&1; echo "[$SECONDS s] gdn_80b rc=$?"
grep -E "\[tc5\]|tc5 vs|FLOP" $L/gdn_80b.log | head -12
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl > $L/pip.log 2>&1
timeout 120 env PYTHONPATH=/tmp/site python3 scripts/fla_gdn_bench.py --tokens 4096,16384 > $L/fla.log 2>&1; echo "[$SECONDS s] fla rc=$?"; tail -4 $L/fla.log
M="--metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_bytes.sum,dram__bytes.sum.per_second,dram__bytes.sum,lts__t_sector_hit_rate.pct,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy"
timeout 240 $NCU --clock-control none --kernel-name regex:'gdn_chunk_tc5_state|gdn_chunk_tc4_wu' --launch-count 2 $M $S \
  .dev/g/cuda_gdn_chunk --include-ignored --exact --nocapture cuda_gdn_chunked_seq_80b_prefill > $L/ncu.txt 2>&1
echo "[$SECONDS s] ncu rc=$?"
grep -vE "^\s*$|^    ---|^==PROF==" $L/ncu.txt | grep -E "gdn_chunk|Duration|Throughput|lts__|dram__|hmma|l1tex|Hit|Occupancy|Eligible|Issued|stalled_(long|short|barrier|wait|mio|lg|math|not_sel|tex)" | head -80
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
