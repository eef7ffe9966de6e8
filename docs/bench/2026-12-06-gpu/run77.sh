#!/usr/bin/env bash
# Session 21, GPU call 2 (H100): (1) the bench after the memory-pool trim (call 1: a 32k
# prefill that ran out of memory left 3.9 GB in the pool, and every decode row after it was
# skipped for want of free memory), with decode at batch 1, 2, 4, 8, 64 (a K = 3 verify step
# is 4 rows of one sequence: batch 4's neighbour); (2) the MTP rows with the MoE decode form
# forced to direct (dense experts take v1 above 16 pairs by default, tuned on the H200) and
# the default; (3) the MoE decode forms at t = 1, 2, 4, 8 on this card.
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_moe_decode).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 170 $P bench $G --prefill 4096,32768 --batch 1,2,4,8,64 --context 128 --steps 32 --json $L/bench.json > $L/bench.log 2>&1; echo "[$SECONDS s] bench rc=$?"
grep -vE "^\s*$|profile" $L/bench.log | tail -24
timeout 60 .dev/k/cuda_moe_decode --nocapture --include-ignored --exact moe_decode_small_t_timing > $L/moe_t.log 2>&1; echo "[$SECONDS s] moe_decode_small_t_timing rc=$?"
grep -vE "^\s*$" $L/moe_t.log | tail -30
for form in direct auto; do
  timeout 100 env PORTER_MOE_GEMV=$form $P bench $G --prefill 16 --batch 1,2,4 --context 128 --steps 32 > $L/b4_$form.log 2>&1; echo "[$SECONDS s] batch 1,2,4 PORTER_MOE_GEMV=$form rc=$?"
  grep -E "^decode" $L/b4_$form.log
  timeout 120 env PORTER_MOE_GEMV=$form $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$form.log 2>&1; echo "[$SECONDS s] mtp PORTER_MOE_GEMV=$form rc=$?"
  grep -E "^mtp (baseline|k=. forced)" $L/mtp_$form.log
done
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
