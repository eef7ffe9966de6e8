#!/usr/bin/env bash
# Session 16, the one call of its 500 s of device time: (a) the graph-recording fix (the Gated
# DeltaNet tables grew to 15 words a span in session 15 while the recording was sized for 9,
# so decode graphs of >= 32 spans failed to capture and ran eagerly), (b) the FP8 tensor-core
# GEMV with two row groups a block (bf16 x, 9-64 rows), bit for bit against the 8-row launches.
# Steps run while the call's own budget (B seconds) lasts, most valuable first.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
B=${B:-300}
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
left() { echo $((B - SECONDS)); }
step() { local t=$1; shift; if [ $(left) -lt $((t / 2)) ]; then echo "skipped (budget): $*"; return 1; fi; return 0; }
timeout 80 .dev/k/cuda_fp8_rows $T > $L/cuda_fp8_rows.log 2>&1; echo "[$SECONDS s] cuda_fp8_rows rc=$? $(grep -E '^test result' $L/cuda_fp8_rows.log)"
grep -hE "rows GEMV|differ|panicked" $L/cuda_fp8_rows.log | head -16
step 110 fp8 && { timeout 110 $P bench $F --prefill 16 --batch 1,8,16,32,64 --context 128 --steps 32 > $L/fp8.log 2>&1
  echo "[$SECONDS s] fp8:"; grep -E "decode batch|not captured|host issue|memory after" $L/fp8.log; }
step 60 bf16 && { timeout 60 $P bench $G --prefill 16 --batch 64 --context 128 --steps 32 > $L/bf16.log 2>&1
  echo "[$SECONDS s] bf16:"; grep -E "decode batch|not captured|host issue" $L/bf16.log; }
step 40 graphs && { timeout 40 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"; }
step 70 rows64 && { PORTER_FP8_GEMV_ROWS=64 timeout 70 $P bench $F --prefill 16 --batch 64 --context 128 --steps 32 > $L/fp8_64.log 2>&1
  echo "[$SECONDS s] fp8 rows<=64: $(grep -E 'decode batch' $L/fp8_64.log)"; }
step 80 gpu && { timeout $(( $(left) < 90 ? $(left) : 90 )) .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"; }
grep -hE "panicked|FAILED|failed:" $L/*.log | head
echo "[$SECONDS s] done"
