#!/usr/bin/env bash
# Session 23, GPU call 1 on an H100 (the H200 of run84.sh was not lent): main at staging
# (session 22's final review refactors: graph.rs, batcher.rs, every_row — first GPU run), the
# issue's bench command, the FP8 path at 24 layers (per-layer cost on this card), MTP, and
# decode attention at 32k × 1 with 128 splits on the two-blocks-an-SM form. Carry
# .dev/porter, .dev/ptx.tgz, .dev/k (gpu, gpu_graphs, cuda_attention).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--nocapture --include-ignored --test-threads=1"
timeout 60 .dev/k/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
timeout 100 .dev/k/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
grep -E "FAILED|panicked" $L/gpu.log $L/gpu_graphs.log | head
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 80 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bench.log 2>&1; echo "[$SECONDS s] bench G rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bench.log
timeout 60 $P bench $G --quantize fp8 --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8_24.log 2>&1; echo "[$SECONDS s] bench G fp8 rc=$?"
grep -E "^(device|HBM|prefill|decode|weights|memory)|host issue|not captured" $L/fp8_24.log
timeout 50 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp G rc=$?"
grep -E "^mtp (baseline|k=)|CUDA graphs" $L/mtp.log
timeout 60 .dev/k/cuda_attention attention_decode_mma_timing $T > $L/adec.log 2>&1; echo "[$SECONDS s] adec rc=$?"
PORTER_ATTN_DECODE=mma4w2 PORTER_ATTN_DECODE_SPLITS=128 timeout 60 .dev/k/cuda_attention attention_decode_mma_timing $T > $L/adec_w2_128.log 2>&1; echo "[$SECONDS s] adec w2/128 rc=$?"
grep -E "32768|131072" $L/adec.log $L/adec_w2_128.log | head -20
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
