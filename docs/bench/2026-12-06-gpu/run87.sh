#!/usr/bin/env bash
# Session 23, GPU call 4 (H100), main 9afac0e: the router in the MoE input GEMV's last block
# (PORTER_MOE_ROUTER=gemv: kernel test, the model suites with it, A/B at batch 1 / 8 / 64, FP8,
# MTP) and the chunked GDN's opt-in tc6 wu launch (tc6 ≡ tc5 bit for bit, 80B timing).
# Carry .dev/porter, .dev/ptx.tgz, .dev/k.tgz (gpu, gpu_graphs, cuda_router, cuda_gdn_chunk).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
tar xzf .dev/k.tgz -C .dev
T="--nocapture --include-ignored --test-threads=1"
res() { grep -E '^test result' $1 | tail -1; grep -E "FAILED|panicked" $1 | head -5; }
timeout 60 .dev/k/cuda_router $T > $L/router.log 2>&1; echo "[$SECONDS s] cuda_router rc=$? $(res $L/router.log)"
grep -E "bit for bit|80B MoE input" $L/router.log
PORTER_MOE_ROUTER=gemv timeout 100 .dev/k/gpu $T > $L/gpu_gemv.log 2>&1; echo "[$SECONDS s] gpu (gemv) rc=$? $(res $L/gpu_gemv.log)"
PORTER_MOE_ROUTER=gemv timeout 60 .dev/k/gpu_graphs $T > $L/graphs_gemv.log 2>&1; echo "[$SECONDS s] gpu_graphs (gemv) rc=$? $(res $L/graphs_gemv.log)"
timeout 150 .dev/k/cuda_gdn_chunk cuda_gdn_chunked_seq_tc cuda_gdn_chunked_seq_spans cuda_gdn_chunked_seq_80b_prefill $T > $L/gdn.log 2>&1
echo "[$SECONDS s] cuda_gdn_chunk rc=$? $(res $L/gdn.log)"
grep -E "tc6|tc5 ≡|≡ tc5|TFLOP" $L/gdn.log | head -30
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for r in apart gemv apart gemv; do
  PORTER_MOE_ROUTER=$r timeout 60 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32 > $L/g_$r.log 2>&1
  echo "[$SECONDS s] G $r: $(grep -E '^decode batch' $L/g_$r.log | sed -E 's/ +/ /g' | cut -d' ' -f3-5 | tr '\n' ' ')"
done
for r in apart gemv apart gemv; do
  PORTER_MOE_ROUTER=$r timeout 60 $P bench $G --quantize fp8 --prefill 16 --batch 1,4 --context 128 --steps 32 > $L/f_$r.log 2>&1
  echo "[$SECONDS s] FP8 $r: $(grep -E '^decode batch' $L/f_$r.log | sed -E 's/ +/ /g' | cut -d' ' -f3-5 | tr '\n' ' ')"
done
for r in apart gemv; do
  PORTER_MOE_ROUTER=$r timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$r.log 2>&1
  echo "[$SECONDS s] MTP $r:"; grep -E "^mtp (baseline|k=3 forced)" $L/mtp_$r.log
done
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
