#!/usr/bin/env bash
# Session 34, call 1. On an H200 (> 100 GB): run124.sh's rows (the FP8 issue's whole model,
# 48 layers + MTP built in memory: memory after load, decode batch 1 / 8 / 64, prefill 4k,
# MTP K = 1..3 with the oracle draft; decode attention at 32k; the GPU-speed issue's 24-layer
# bf16 bench). On an H100: run146.sh (the tc4 wu launch's stall samples per SASS instruction).
# Carry .dev/porter (porter.gz), .dev/c (bins.tgz: .dev/k/cuda_attention, cuda_gdn_chunk), .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/c/bins.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
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
  G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
  timeout 150 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] bench bf16 rc=$?"
  grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bf16.log | head -12
else
  NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  timeout 200 $NCU --clock-control none --kernel-name regex:'gdn_chunk_tc4_wu' --launch-count 1 \
    --section SourceCounters --section WarpStateStats -o $OUT/wu .dev/k/cuda_gdn_chunk --include-ignored \
    --exact --nocapture cuda_gdn_chunked_seq_80b_prefill > $L/ncu_run.txt 2>&1; echo "[$SECONDS s] ncu rc=$?"
  timeout 60 $NCU -i $OUT/wu.ncu-rep --page source --csv --print-source sass > $OUT/wu_sass.csv 2> $L/page.err; echo "page rc=$? $(wc -l < $OUT/wu_sass.csv) lines"
  head -c 600 $OUT/wu_sass.csv; rm -f $OUT/wu.ncu-rep; gzip $OUT/wu_sass.csv
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
