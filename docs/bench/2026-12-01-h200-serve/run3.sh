#!/usr/bin/env bash
# GPU call 3: every GPU test binary (after the Gated DeltaNet path rule change).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
mkdir -p /tmp/gc
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 540 scripts/gpu-check.sh > "$OUT_SAVE/check.txt" 2>&1
echo "gpu-check exit $?" >> "$OUT_SAVE/check.txt"
tar czf "$OUT_SAVE/gc-logs.tgz" -C /tmp gc
tail -30 "$OUT_SAVE/check.txt"
