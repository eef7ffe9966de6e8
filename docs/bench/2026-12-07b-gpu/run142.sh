#!/usr/bin/env bash
# Session 32, GPU call 6 (H100): the GPU suites with tc6 (clusters of 2) as the default form of
# the chunked delta rule on sm_90: `gpu` (every model on CUDA against its references) and
# `gpu_graphs`. Carry .dev/ptx.tgz (the gdn_chunk module compiles on the device), .dev/t.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--nocapture --include-ignored --test-threads=1"
timeout 200 .dev/t/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 80 .dev/t/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
grep -hE "panicked|FAILED|failed:" $L/*.log | head -10
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
