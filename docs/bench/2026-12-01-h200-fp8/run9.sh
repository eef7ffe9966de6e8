#!/usr/bin/env bash
# GPU call 2: the gpu.rs tests after the two test fixes, the bf16 peer (24 layers), and the whole
# 48-layer Qwen3-Next-80B-A3B geometry in FP8 (random weights quantized on the device).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/gc
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 60 scripts/gpu-check.sh run --test-threads=1 cuda_fp8 cuda_quantized cuda_nccl > "$OUT_SAVE/check.txt" 2>&1
echo "gpu-check exit $?" >> "$OUT_SAVE/check.txt"
OUT=$OUT_SAVE
grep -hE "ratio|panicked|test result|nccl" /tmp/gc/gpu.log | tail -60 > "$OUT/gpu_tests.txt"
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b"
date -u > "$OUT/date.txt"; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/date.txt"
(timeout 150 $P bench $G --layers 24 --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$OUT/peer_bf16_24.json") > "$OUT/peer_bf16_24.txt" 2>&1
(timeout 330 $P bench $G --quantize fp8 --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$OUT/fp8_48.json") > "$OUT/fp8_48.txt" 2>&1
nvidia-smi --query-gpu=memory.used --format=csv >> "$OUT/date.txt"
cat "$OUT/check.txt" | tail -8; cat "$OUT/gpu_tests.txt" | tail -40
for f in peer_bf16_24 fp8_48; do echo "== $f"; grep -vE "^  profile" "$OUT/$f.txt" | tail -30; done
