#!/usr/bin/env bash
# GPU call 7: engine + MoE + FP8 + GEMM-path tests after the review refactor.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/gc
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 300 scripts/gpu-check.sh run cuda_ > "$OUT_SAVE/check.txt" 2>&1
echo "gpu-check exit $?" >> "$OUT_SAVE/check.txt"
tail -14 "$OUT_SAVE/check.txt"
