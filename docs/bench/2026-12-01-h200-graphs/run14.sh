#!/usr/bin/env bash
# Session 5, GPU call 2: CUDA graphs on a non-default stream. gpu_graphs tests, then the
# 24-layer 80B bf16 bench with graphs (default, + MTP oracle K=1..3) and with --enforce-eager
# (same session), and a per-block device-time profile of eager decode (PORTER_PROFILE=1).
set -uo pipefail
cd "$(dirname "$0")/.."
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
date -u > "$OUT/date.txt"
(timeout 200 .dev/bin/gpu_graphs --nocapture --include-ignored --test-threads=1) > "$OUT/gpu_graphs.log" 2>&1
echo "gpu_graphs rc=$?" >> "$OUT/date.txt"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
(timeout 200 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 64 --mtp-step 3 --json "$OUT/graphs.json") > "$OUT/bench_graphs.txt" 2>&1
echo "bench graphs rc=$?" >> "$OUT/date.txt"
(timeout 150 $P bench $G --enforce-eager --prefill 4096 --batch 1,8,64 --context 128 --steps 64 --mtp-step 3 --json "$OUT/eager.json") > "$OUT/bench_eager.txt" 2>&1
echo "bench eager rc=$?" >> "$OUT/date.txt"
(PORTER_PROFILE=1 timeout 100 $P bench $G --enforce-eager --prefill 16 --batch 1,64 --context 128 --steps 8) > "$OUT/profile.txt" 2>&1
echo "profile rc=$?" >> "$OUT/date.txt"
cat "$OUT/date.txt"
grep -E "^test |panicked|graphs captured|GraphStats|failed" "$OUT/gpu_graphs.log" | cut -c1-300 | head -40
for f in bench_graphs bench_eager; do echo "== $f"; grep -vE "^  profile" "$OUT/$f.txt" | tail -22; done
