#!/usr/bin/env bash
# Session 16, call 3: why FP8 decode at batch 128 (1,280 expert pairs: the grouped tiled MoE
# GEMMs, past the decode path's 2 pairs an expert) is slower than batch 64 (call 2: 2,350
# against 2,756 tok/s). A per-block profile (eager), then the decode path's reach
# (PORTER_MOE_DECODE_PER_EXPERT = 2, the default, 4, 8) at batch 96 / 128 / 256, FP8 and bf16.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
PORTER_PROFILE=1 timeout 40 $P bench $F --enforce-eager --prefill 16 --batch 128 --context 128 --steps 8 > $L/prof_fp8_128.log 2>&1
echo "[$SECONDS s] profile fp8 b128:"; grep -E "profile|decode batch" $L/prof_fp8_128.log | sort -k3 -t' ' | head -40
for v in 2 4 8; do
  PORTER_MOE_DECODE_PER_EXPERT=$v timeout 40 $P bench $F --prefill 16 --batch 96,128,256 --context 128 --steps 16 > $L/fp8_pe$v.log 2>&1
  echo "[$SECONDS s] fp8 per-expert $v: $(grep -E 'decode batch|not captured' $L/fp8_pe$v.log | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' ')"
  PORTER_MOE_DECODE_PER_EXPERT=$v timeout 40 $P bench $G --prefill 16 --batch 96,128,256 --context 128 --steps 16 > $L/bf16_pe$v.log 2>&1
  echo "[$SECONDS s] bf16 per-expert $v: $(grep -E 'decode batch|not captured' $L/bf16_pe$v.log | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' ')"
done
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | head
echo "[$SECONDS s] done"
