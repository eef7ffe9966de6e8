#!/usr/bin/env bash
# GPU call 4: the step token budget (--max-num-batched-tokens) against TTFT and throughput.
set -uo pipefail
cd "$(dirname "$0")/.."
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
TTFT="--num-requests 96 --input-len 1024 --output-len 64 --max-concurrency 32"
C64="--num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64"
MIX="--num-requests 256 --request-rate 8 --input-len 512:2048 --output-len 128:256 --max-concurrency 64"
date -u > "$OUT/date.txt"
for b in 4096 8192 16384; do
  (timeout 60 $P bench --serve $G $TTFT --max-num-batched-tokens $b --json "$OUT/ttft_$b.json") > "$OUT/ttft_$b.txt" 2>&1
done
(timeout 60 $P bench --serve $G $C64 --max-num-batched-tokens 8192 --json "$OUT/c64_8192.json") > "$OUT/c64_8192.txt" 2>&1
(timeout 90 $P bench --serve $G $MIX --max-num-batched-tokens 8192 --json "$OUT/mix_8192.json") > "$OUT/mix_8192.txt" 2>&1
for f in ttft_4096 ttft_8192 ttft_16384 c64_8192 mix_8192; do echo "== $f"; grep -E "Output token|TTFT|TPOT|ITL|Mean batch" "$OUT/$f.txt"; done
