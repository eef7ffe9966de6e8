#!/usr/bin/env bash
# GPU call 3: gpu.rs FP8 / KV / NCCL tests (after the fixes); the whole 48-layer
# Qwen3-Next-80B-A3B geometry in FP8 (random weights quantized on the device): prefill 4k/32k,
# decode 1/8/64, MTP K=1..3 (oracle draft); an FP8 prefill profile; the FP8 serving benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/gc
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 170 scripts/gpu-check.sh run --test-threads=1 cuda_fp8 cuda_quantized cuda_nccl cuda_engine_quantized > "$OUT_SAVE/check.txt" 2>&1
echo "gpu-check exit $?" >> "$OUT_SAVE/check.txt"
OUT=$OUT_SAVE
grep -hE "ratio|panicked|test result|nccl|^test " /tmp/gc/gpu.log | tail -70 > "$OUT/gpu_tests.txt"
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
date -u > "$OUT/date.txt"
(timeout 230 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$OUT/fp8_48.json") > "$OUT/fp8_48.txt" 2>&1
(PORTER_PROFILE=1 timeout 100 $P bench $G --prefill 4096 --batch 1 --context 128 --steps 8) > "$OUT/fp8_48_profile.txt" 2>&1
(timeout 120 $P bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 --json "$OUT/fp8_serve_c64.json") > "$OUT/fp8_serve_c64.txt" 2>&1
tail -4 "$OUT/check.txt"; grep -E "^test |panicked" "$OUT/gpu_tests.txt" | tail -12
for f in fp8_48 fp8_48_profile fp8_serve_c64; do echo "== $f"; tail -45 "$OUT/$f.txt"; done
