#!/usr/bin/env bash
# Session 15, call 4: per-block device time of a decode step at batch 1 and 64, bf16 (24
# layers) and FP8 (48 layers), eager with a sync per block (PORTER_PROFILE=1), to say what
# holds the batch-64 FP8 target (>= 70 %) and batch 1 back; then the graphed numbers of the
# final defaults. Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
# The staged binary (main 4ddf4d3) still has the fused router as its default; 8d161c4 made it apart.
export PORTER_MOE_ROUTER=apart
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
PORTER_PROFILE=1 timeout 60 $P bench $G --enforce-eager --prefill 16 --batch 1,64 --context 128 --steps 8 > $L/prof_bf16.log 2>&1; echo "prof bf16 rc=$?"
PORTER_PROFILE=1 timeout 90 $P bench $F --enforce-eager --prefill 16 --batch 1,64 --context 128 --steps 8 > $L/prof_fp8.log 2>&1; echo "prof fp8 rc=$?"
timeout 60 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32 > $L/dec_bf16.log 2>&1
grep -E "decode batch" $L/dec_bf16.log
timeout 90 $P bench $F --prefill 16 --batch 1,8,64 --context 128 --steps 32 > $L/dec_fp8.log 2>&1
grep -E "decode batch" $L/dec_fp8.log
echo "== bf16 profile"; grep -vE "^\s*$" $L/prof_bf16.log | tail -40
echo "== fp8 profile"; grep -vE "^\s*$" $L/prof_fp8.log | tail -40
