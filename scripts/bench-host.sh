#!/usr/bin/env bash
# CPU-backend benchmarks on a bigger host (e.g. the GPU machine's 16 cores), from a binary
# built elsewhere and carried in .dev/bin. Writes logs and JSON under ${OUT:-bench-out}.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}
mkdir -p "$out"
bin=.dev/bin/porter
nproc | tee "$out/nproc.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$out/nproc.txt" || true
"$bin" bench --model tests/fixtures/qwen3_next_mtp --prefill 64,160 --batch 1,4 --mtp-step 3 --steps 64 --json "$out/tiny.json" 2>&1 | tee "$out/tiny.log"
"$bin" bench --config qwen3-next-mid --prefill 128,512,2048 --batch 1,8,64 --steps 16 --mtp-step 3 --json "$out/mid.json" 2>&1 | tee "$out/mid.log"
