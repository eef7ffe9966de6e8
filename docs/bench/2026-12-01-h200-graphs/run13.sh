#!/usr/bin/env bash
# Session 5, GPU call 1: CUDA graphs. gpu_graphs tests (graph ≡ eager), then the 24-layer 80B
# bf16 bench with graphs (default) and with --enforce-eager, same session.
set -uo pipefail
cd "$(dirname "$0")/.."
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
date -u > "$OUT/date.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$OUT/date.txt" 2>&1
(timeout 200 .dev/bin/gpu_graphs --nocapture --include-ignored --test-threads=1) > "$OUT/gpu_graphs.log" 2>&1
echo "gpu_graphs rc=$?" >> "$OUT/date.txt"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
(timeout 190 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$OUT/graphs.json") > "$OUT/bench_graphs.txt" 2>&1
echo "bench graphs rc=$?" >> "$OUT/date.txt"
(timeout 170 $P bench $G --enforce-eager --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$OUT/eager.json") > "$OUT/bench_eager.txt" 2>&1
echo "bench eager rc=$?" >> "$OUT/date.txt"
cat "$OUT/date.txt"
grep -E "^test |panicked|graphs captured|Graph|replays" "$OUT/gpu_graphs.log" | cut -c1-220 | head -40
for f in bench_graphs bench_eager; do echo "== $f"; grep -vE "^  profile" "$OUT/$f.txt" | tail -16; done
