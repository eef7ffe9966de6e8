#!/usr/bin/env bash
# Session 30, GPU call 4: the issue commands at the final defaults (q / k / v packed, the gate
# fused in the decode attention; the staged porter predates the default's flip, so
# PORTER_ATTN_GATE=fused is set here, which is what the default now does).
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PORTER_ATTN_GATE=fused
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 60 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $OUT/bf16.log 2>&1; echo "[$SECONDS s] issue bench bf16 rc=$?"
grep -E "^(HBM|prefill|decode)|host issue" $OUT/bf16.log | head -12
timeout 60 $P bench $G --quantize fp8 --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $OUT/fp8.log 2>&1; echo "[$SECONDS s] issue bench fp8 rc=$?"
grep -E "^(prefill|decode)" $OUT/fp8.log | head -6
echo "[$SECONDS s] done"
