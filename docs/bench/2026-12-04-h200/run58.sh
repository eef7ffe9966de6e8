#!/usr/bin/env bash
# Session 16, call 2: the defaults after call 1 (graphs of >= 32 spans captured again, the FP8
# row-group GEMV with two groups a block up to 64 rows by default). The model suites, the
# issue's bf16 command, FP8 48 layers at batch 1-128, MTP K = 3, and where the host waits at
# FP8 batch 64 with the tile-dequant GEMM in the graph (call 1: 15 ms of host issue a step).
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
B=${B:-240}
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
left() { echo $((B - SECONDS)); }
step() { if [ $(left) -lt $(($1 / 2)) ]; then echo "skipped (budget): $2"; return 1; fi; return 0; }
timeout 60 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 40 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
step 60 bf16 && { timeout 60 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1
  echo "[$SECONDS s] bf16:"; grep -E "HBM copy|prefill|decode batch|not captured|host issue" $L/bf16.log; }
step 60 fp8 && { timeout 60 $P bench $F --prefill 4096 --batch 1,8,16,32,64,128 --context 128 --steps 32 > $L/fp8.log 2>&1
  echo "[$SECONDS s] fp8:"; grep -E "HBM copy|prefill|decode batch|not captured|host issue|memory after" $L/fp8.log; }
step 40 mtp && { timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1
  echo "[$SECONDS s] mtp: $(grep -E 'forced|baseline' $L/mtp.log | tr '\n' ' ')"; }
for e in tc dequant; do
  step 30 "fp8 b64 rows<=32 $e" && { PORTER_FP8_GEMV_ROWS=32 PORTER_FP8_GEMM=$e timeout 30 $P bench $F --prefill 16 --batch 64 --context 128 --steps 32 > $L/fp8_32_$e.log 2>&1
    echo "[$SECONDS s] fp8 b64 rows<=32 PORTER_FP8_GEMM=$e: $(grep -E 'host issue|decode batch' $L/fp8_32_$e.log | tr '\n' ' ')"; }
done
step 30 "bf16 b128" && { timeout 30 $P bench $G --prefill 16 --batch 128 --context 128 --steps 32 > $L/bf16_128.log 2>&1
  echo "[$SECONDS s] bf16 b128: $(grep -E 'not captured|host issue|decode batch' $L/bf16_128.log | tr '\n' ' ')"; }
grep -hE "panicked|FAILED|failed:" $L/*.log | head
echo "[$SECONDS s] done"
