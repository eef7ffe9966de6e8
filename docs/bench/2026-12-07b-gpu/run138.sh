#!/usr/bin/env bash
# Session 32, GPU call 3 (H100): call 2's tc6 was 4× slower than tc5 (518 against 127 µs at
# 4k) with stalls on membar (2.49 a issued instruction) and long scoreboard (5.24): each
# sweeping warp's arrival on the peers' `empty` barriers was release at cluster scope, which
# waits for its output stores. Now CUTLASS's consumer release: the default (release, CTA
# scope) remote arrival, and plain try_wait. Same checks; the PTX compiles on the device.
# Carry .dev/g (cuda_gdn_chunk).
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
T="--nocapture --include-ignored --test-threads=1"
G=.dev/g/cuda_gdn_chunk
timeout 200 $G $T --exact cuda_gdn_chunked_seq_tc cuda_gdn_chunked_seq_spans > $L/gdn_tc.log 2>&1; echo "[$SECONDS s] gdn_tc rc=$? $(grep -E '^test result' $L/gdn_tc.log)"
grep -E "bit for bit" $L/gdn_tc.log | sort | uniq -c
grep -E "panicked|FAILED|failed comparisons|differs|expected the" $L/gdn_tc.log | head -10
timeout 90 $G $T --exact cuda_gdn_chunked_seq_80b_prefill > $L/gdn_80b.log 2>&1; echo "[$SECONDS s] gdn_80b rc=$?"
grep -E "\[tc[56]\]|tc[56] vs|panicked" $L/gdn_80b.log | head -16
timeout 60 env PORTER_GDN_TC6_CLUSTER=2 $G $T --exact cuda_gdn_chunked_seq_80b_prefill > $L/gdn_80b_c2.log 2>&1; echo "[$SECONDS s] gdn_80b c2 rc=$?"
grep -E "\[tc6\]|tc6 vs" $L/gdn_80b_c2.log | head -8
M="--metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_bytes.sum,dram__bytes.sum.per_second,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
timeout 120 $NCU --clock-control none --kernel-name regex:'gdn_chunk_tc6_state' --launch-count 1 $M --section SpeedOfLight \
  $G --include-ignored --exact --nocapture cuda_gdn_chunked_seq_80b_prefill > $L/ncu.txt 2>&1
echo "[$SECONDS s] ncu rc=$?"
grep -vE "^\s*$|^    ---|^==PROF==" $L/ncu.txt | grep -E "gdn_chunk_tc|Duration|Throughput|lts__|dram__|hmma|stalled_(long|short|barrier|wait|mio|lg|math|membar|branch)" | head -30
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
