#!/usr/bin/env bash
# Session 33, planned GPU call 4 (H100; NOT RUN: too little device time was left): where the tc4 wu launch (3 blocks an SM, 4k tokens of the 80B
# layout) stalls, instruction by instruction: Nsight Compute's warp-stall samples per SASS
# instruction (`--page source --print-source sass`), summed by opcode here afterwards.
# Carry .dev/c (bins.tgz).
set -uo pipefail
tar xzf .dev/c/bins.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 200 $NCU --clock-control none --kernel-name regex:'gdn_chunk_tc4_wu' --launch-count 1 \
  --section SourceCounters --section WarpStateStats -o $OUT/wu .dev/g/cuda_gdn_chunk --include-ignored \
  --exact --nocapture cuda_gdn_chunked_seq_80b_prefill > $OUT/ncu_run.txt 2>&1; echo "ncu rc=$?"
timeout 60 $NCU -i $OUT/wu.ncu-rep --page source --csv --print-source sass > $OUT/wu_sass.csv 2> $OUT/page.err; echo "page rc=$? $(wc -l < $OUT/wu_sass.csv) lines"
head -c 600 $OUT/wu_sass.csv; rm -f $OUT/wu.ncu-rep; gzip $OUT/wu_sass.csv
