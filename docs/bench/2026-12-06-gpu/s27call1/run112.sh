#!/usr/bin/env bash
# Session 27, GPU call 1: decode attention's early loads (the V2 split kernel reads its spans,
# block table, Q and first K/V tiles before its PDL wait when the launch before it is the
# decode step's append: `append_attention`). Parity (cuda_attention: every attention case
# also through append_attention with the new rows poisoned, bit for bit; gpu; gpu_graphs),
# the kernel timing at 32k (early against not), the model at 32k context, the bench
# command, and on an H100 the FP8 48-layer model at batch 1 / 8 (80 GB of weights: it may not
# fit beside the KV pool), MTP K = 3.
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
timeout 240 .dev/k/cuda_attention $T --skip timing > $L/cuda_attention.log 2>&1; echo "[$SECONDS s] cuda_attention rc=$? $(grep -E '^test result' $L/cuda_attention.log)"
for t in gpu_graphs gpu; do
    timeout 200 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
grep -hE "panicked|FAILED" $L/*.log | head -6
timeout 200 .dev/k/cuda_attention $T --exact attention_decode_mma_timing > $OUT/timing.log 2>&1; echo "[$SECONDS s] timing rc=$?"
grep -E "DECODE-AB|Mma4 .*(env|early)" $OUT/timing.log | head -40
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 120 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 32 > $L/ctx32k.log 2>&1; echo "[$SECONDS s] 32k rc=$?"
grep -E "^(decode)" $L/ctx32k.log
timeout 150 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bench.log 2>&1; echo "[$SECONDS s] bench G rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bench.log
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 200 $P bench $F --prefill 16 --batch 1,8 --context 128 --steps 32 > $L/fp8_48.log 2>&1; echo "[$SECONDS s] FP8 48 rc=$?"
grep -E "^(device|HBM|weights|memory|prefill|decode)|in use|free|skipped|out of memory" $L/fp8_48.log | head -12
timeout 150 $P bench $F --prefill 16 --batch 1 --context 128 --steps 32 --mtp-step 3 > $L/fp8_48_mtp.log 2>&1; echo "[$SECONDS s] FP8 48 MTP rc=$?"
grep -E "^mtp (baseline|k=)|out of memory" $L/fp8_48_mtp.log | head -8
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
