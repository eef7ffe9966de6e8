#!/usr/bin/env bash
# GPU call 1 (2026-12-01, third session): engine tests on CUDA, the decode peer, the serving benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
mkdir -p /tmp/gc
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 200 scripts/gpu-check.sh run cuda_engine cuda_moe > "$OUT_SAVE/check.txt" 2>&1
echo "gpu-check exit $?" >> "$OUT_SAVE/check.txt"
OUT=$OUT_SAVE
tar czf "$OUT/gc-logs.tgz" -C /tmp gc
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
date -u > "$OUT/date.txt"; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/date.txt"
(timeout 130 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$OUT/bench.json") > "$OUT/bench.txt" 2>&1
(timeout 100 $P bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 --json "$OUT/serve_c64.json") > "$OUT/serve_c64.txt" 2>&1
(timeout 100 $P bench --serve $G --num-requests 96 --input-len 1024 --output-len 64 --max-concurrency 32 --json "$OUT/serve_ttft.json") > "$OUT/serve_ttft.txt" 2>&1
tail -25 "$OUT/check.txt"; for f in bench serve_c64 serve_ttft; do echo "== $f"; tail -32 "$OUT/$f.txt"; done
