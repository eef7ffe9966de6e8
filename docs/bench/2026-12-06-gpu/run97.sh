#!/usr/bin/env bash
# Session 24, GPU call 8 (H100): decode attention at short context, the largest short launch
# in place after this session (8.7 µs at 128 keys): the 8-item form (PORTER_ATTN_DECODE=mma4-n8)
# and smaller splits (PORTER_ATTN_DECODE_MIN_KEYS=64) against the default, batch 1 / 8, and
# the 8-item form at 32k keys (attention_decode_mma_timing's first shape).
# Carry .dev/porter, .dev/k.tgz (cuda_attention), .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
one() { # label, env, bench flags
    env $2 timeout 90 $P bench $G $3 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($2) rc=$?"
    grep -E "^decode batch" $L/$1.log | sed -E 's/ +/ /g'
}
for r in 1 2; do
    one default_$r X=1 "--prefill 16 --batch 1,8 --context 128 --steps 64"
    one n8_$r PORTER_ATTN_DECODE=mma4-n8 "--prefill 16 --batch 1,8 --context 128 --steps 64"
    one min64_$r PORTER_ATTN_DECODE_MIN_KEYS=64 "--prefill 16 --batch 1,8 --context 128 --steps 64"
done
one default_2k X=1 "--prefill 16 --batch 1 --context 2048 --steps 64"
one n8_2k PORTER_ATTN_DECODE=mma4-n8 "--prefill 16 --batch 1 --context 2048 --steps 64"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
