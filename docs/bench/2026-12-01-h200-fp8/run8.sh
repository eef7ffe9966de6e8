#!/usr/bin/env bash
# GPU call 1 (2026-12-01, fourth session): every GPU test binary after the FP8-kernel, KV-quant
# and tensor-parallel merges.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/gc
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 560 scripts/gpu-check.sh > "$OUT_SAVE/check.txt" 2>&1
echo "gpu-check exit $?" >> "$OUT_SAVE/check.txt"
tar czf "$OUT_SAVE/gc-logs.tgz" -C /tmp gc
cat "$OUT_SAVE/check.txt"
echo "=== fp8 kernel timings"; grep -hE "GB/s|µs|us/|ms" /tmp/gc/cuda_fp8.log | head -40
echo "=== kv quant"; grep -hE "max|ratio|GB/s|ms" /tmp/gc/cuda_kv_quant.log | head -30
echo "=== gpu.rs fp8/kv/nccl"; grep -hE "fp8|kv|nccl|ratio" /tmp/gc/gpu.log | grep -vE "^test .* ok$" | head -60
