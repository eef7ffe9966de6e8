#!/usr/bin/env bash
# GPU call 4: the FP8 MoE path choice on the 48-layer 80B FP8 geometry: dequantize-all + grouped
# GEMM (default) vs the FP8 GEMVs for every row count, at decode batch 64 and prefill 4096;
# the bf16 KV vs fp8 KV serving capacity line on the FP8 model.
set -uo pipefail
cd "$(dirname "$0")/.."
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
date -u > "$OUT/date.txt"
(PORTER_FP8_MOE_GEMV_MAX_PAIRS=100000000 timeout 150 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 16 --json "$OUT/gemv_all.json") > "$OUT/gemv_all.txt" 2>&1
(timeout 100 $P bench $G --kv-cache-dtype fp8 --prefill 4096 --batch 64 --context 1024 --steps 8) > "$OUT/kvfp8.txt" 2>&1
for f in gemv_all kvfp8; do echo "== $f"; grep -vE "^  profile" "$OUT/$f.txt" | tail -14; done
