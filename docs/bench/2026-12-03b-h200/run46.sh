#!/usr/bin/env bash
# Session 13, extra call on call 4's binaries: the routed experts' v1 form against the direct
# one at 11..40 pairs (the MTP verify's 4 rows x top-10; batch 2..4), by environment only.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for v in auto v1; do
  timeout 40 env PORTER_MOE_GEMV=$v $P bench $G --prefill 16 --batch 1,2,4 --context 128 --steps 32 > $L/dec_$v.log 2>&1
  timeout 40 env PORTER_MOE_GEMV=$v $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$v.log 2>&1
done
for f in $L/*.log; do echo "== $f"; grep -E "decode batch|mtp k=|baseline|rror" $f | grep -v random; done
