#!/usr/bin/env bash
# Session 26, GPU call 5 (H100, when no H200 comes): the device timeline of the batch-1 step at
# 32k context (12 layers, so that the KV pool fits beside the weights on 80 GB): decode
# attention's split kernel and combine in place, against the bytes. Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 12"
for c in 128 32768; do
  PORTER_TIMELINE=1 timeout 150 $P bench $G --prefill 16 --batch 1 --context $c --steps 32 > $OUT/tl_ctx$c.log 2>&1; echo "[$SECONDS s] timeline context $c rc=$?"
  grep -E "^decode batch|timeline:|timeline by kernel" $OUT/tl_ctx$c.log | head -24
done
timeout 100 $P bench $G --prefill 16 --batch 1 --context 32768 --steps 32 > $OUT/plain_ctx32768.log 2>&1; echo "[$SECONDS s] plain rc=$?"
grep -E "^decode batch" $OUT/plain_ctx32768.log
echo "[$SECONDS s] done"
