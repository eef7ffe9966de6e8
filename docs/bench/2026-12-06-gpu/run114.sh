#!/usr/bin/env bash
# Session 27, H200 try (never ran): parity (cuda_attention without the NVRTC-only tests, gpu,
# gpu_graphs; written for the V2 combine's early spans, since reverted); the FP8 issue's whole model (48 layers, FP8 built in
# memory): memory after load, decode at batch 1 / 8 / 64, prefill 4k, MTP K = 1..3 (oracle);
# decode attention's timing at 32k on the H200; one A/B round of the early loads at batch 1.
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
L=$OUT/logs; mkdir -p $L
timeout 200 .dev/k/cuda_attention $T --skip timing --skip nvrtc > $L/cuda_attention.log 2>&1; echo "[$SECONDS s] cuda_attention rc=$? $(grep -E '^test result' $L/cuda_attention.log)"
for t in gpu_graphs gpu; do
    timeout 100 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
grep -hE "panicked|FAILED" $L/*.log | head -6
timeout 60 .dev/k/cuda_attention $T --exact attention_decode_mma_timing > $OUT/timing.log 2>&1; echo "[$SECONDS s] timing rc=$?"
grep -E "DECODE-AB|Mma4 .*(env|early) per call" $OUT/timing.log | head -12
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 200 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8.log 2>&1; echo "[$SECONDS s] bench F rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/fp8.log
timeout 100 $P bench $F --prefill 16 --batch 1 --context 128 --steps 32 --mtp-step 3 > $L/fp8_mtp.log 2>&1; echo "[$SECONDS s] mtp F rc=$?"
grep -E "^mtp (baseline|k=)" $L/fp8_mtp.log
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for e in off on; do
  s=$(PORTER_ATTN_DECODE_EARLY=$e timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 2>&1 | grep -E '^(HBM|decode batch)' | tr '\n' ' ')
  echo "[$SECONDS s] early=$e bf16: $s"
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
