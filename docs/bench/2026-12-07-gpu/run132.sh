#!/usr/bin/env bash
# Session 31, GPU call 6: with fp8_dequant 8.8x faster, where does dequantize + cuBLAS beat the
# tile-dequant GEMM for dense FP8 weights (today from 1,025 rows: DENSE_TC_MAX_ROWS)?
# fp8_gemm_bench (every path at [m, 2048] x [12288, 2048]^T and [m, 4096] x [2048, 4096]^T), then
# the FP8 prefill at 256 / 512 / 1,024 tokens with the default and with PORTER_FP8_GEMM=dequant.
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
timeout 120 .dev/k/cuda_fp8_gemm $T --exact fp8_gemm_bench > $L/bench.log 2>&1; echo "[$SECONDS s] fp8_gemm_bench rc=$?"
grep -vE "^\s*$|^running|^test " $L/bench.log | head -40
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --quantize fp8"
for r in 1 2; do
  echo "[$SECONDS s] r$r default: $(timeout 60 $P bench $G --prefill 256,512,1024,2048 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill' | sed -E 's/ +/ /g' | tr '\n' ' ')"
  echo "[$SECONDS s] r$r dequant: $(PORTER_FP8_GEMM=dequant timeout 60 $P bench $G --prefill 256,512,1024,2048 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill' | sed -E 's/ +/ /g' | tr '\n' ' ')"
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
