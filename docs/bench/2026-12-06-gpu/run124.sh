#!/usr/bin/env bash
# Session 30 (run117.sh of session 28, which never ran): the issues' rows at this tree. On an H200 (> 100 GB): the FP8 issue's
# whole model (48 layers + MTP, FP8 built in memory): memory after load, decode at batch 1 / 8 /
# 64, prefill 4k, MTP K = 1..3 (oracle); decode attention's timing at 32k. On any card the
# GPU-speed issue's bench command (24 layers, bf16). ATTN=<form> sets PORTER_ATTN_DECODE.
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -n "${ATTN:-}" ] && export PORTER_ATTN_DECODE=$ATTN && echo "PORTER_ATTN_DECODE=$ATTN"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
T="--include-ignored --nocapture --test-threads=1"
L=$OUT/logs; mkdir -p $L
if [ "$mem" -gt 100000 ]; then
  F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
  timeout 200 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8.log 2>&1; echo "[$SECONDS s] bench FP8 48 layers rc=$?"
  grep -E "^(device|HBM|memory|kv|prefill|decode)|host issue|not captured|free" $L/fp8.log | head -20
  timeout 100 $P bench $F --prefill 16 --batch 1 --context 128 --steps 32 --mtp-step 3 > $L/fp8_mtp.log 2>&1; echo "[$SECONDS s] mtp FP8 rc=$?"
  grep -E "^mtp (baseline|k=)" $L/fp8_mtp.log
  timeout 60 .dev/k/cuda_attention $T --exact attention_decode_mma_timing > $L/timing.log 2>&1; echo "[$SECONDS s] timing rc=$?"
  grep -E "DECODE-AB|Mma4(Last)? .*(env|early) per call" $L/timing.log | head -12
fi
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 200 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] bench bf16 rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bf16.log | head -12
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
