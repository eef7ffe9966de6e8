#!/usr/bin/env bash
# Session 20, GPU call 4, on an H200 (the card of the issues' targets): the issue commands at
# this session's defaults (tc5, the chunk-offset scan), the decode rows at batch 1, 4, 8, 64,
# and the MTP rows with their steady-state rates (K = 1..3, oracle and random draft head).
# Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader; } > $S
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 150 $P bench $G --prefill 4096,32768 --batch 1,4,8,64 --context 128 --steps 32 --json $L/bench.json > $L/bench.log 2>&1; echo "bench rc=$?" >> $S
timeout 120 $P bench $G --prefill 16 --batch 1,4 --context 128 --steps 64 --mtp-step 3 --json $L/mtp.json > $L/mtp.log 2>&1; echo "mtp rc=$?" >> $S
cat $S
for f in bench mtp; do echo "== $f"; grep -vE "^\s*$|profile" $L/$f.log | tail -22; done
tar czf $OUT/logs.tgz -C $OUT logs
