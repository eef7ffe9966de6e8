#!/usr/bin/env bash
# Session 22, GPU call 2: the MTP rows after the oracle's host cost was removed (greedy host
# draft tokens by one argmax; the oracle builds one row a token), with the new row "forced,
# head's compute" (the random MTP head runs for its cost, the oracle proposes), K = 1..3,
# twice; decode batch 1 beside it. Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for i in 1 2; do
  timeout 200 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 --json $L/mtp$i.json > $L/mtp$i.log 2>&1; echo "[$SECONDS s] mtp run $i rc=$?"
  grep -E "^(decode|mtp)" $L/mtp$i.log
done
echo "[$SECONDS s] done"
