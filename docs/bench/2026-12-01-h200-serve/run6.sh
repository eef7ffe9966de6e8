#!/usr/bin/env bash
# GPU call 6: every GPU test binary after the FP8 merge (incl. FP8 fixtures on CUDA), then the decode benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
mkdir -p /tmp/gc
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 400 scripts/gpu-check.sh > "$OUT_SAVE/check.txt" 2>&1
echo "gpu-check exit $?" >> "$OUT_SAVE/check.txt"
OUT=$OUT_SAVE
tar czf "$OUT/gc-logs.tgz" -C /tmp gc
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
(timeout 120 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$OUT/bench.json") > "$OUT/bench.txt" 2>&1
tail -14 "$OUT/check.txt"; grep -E "prefill|decode" "$OUT/bench.txt"
