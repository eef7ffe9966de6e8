#!/usr/bin/env bash
# Session 31, GPU call 8: after the clean-up (one pack2_rn in common.cuh for the 16-bit pair
# packing that fp8.cu, fp8_gemm.cu, moe_wgmma.cu and PMma each had; moe_wgmma.cu's token-row
# and L2-policy set-up shared by both forms): the kernel tests the change touches, the model
# suites, and the FP8 prefill once more.
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
t() { local name=$1 to=$2; shift 2; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
t fp8 120 .dev/k/cuda_fp8 $T
t fp8_gemm 120 .dev/k/cuda_fp8_gemm $T --exact fp8_gemm_tc_bf16 fp8_gemm_tc_f16 fp8_gemm_mma8_bf16 fp8_gemm_mma8_f16 moe_fp8_prefill_bf16 moe_fp8_prefill_f16
t shared 60 .dev/k/cuda_moe_shared $T --exact moe_shared_fp8 moe_shared_small_bf16
t gpu 90 .dev/k/gpu $T
t graphs 60 .dev/k/gpu_graphs $T
grep -hE "panicked|FAILED" $L/*.log | head -8
grep -E "fp8_dequant bf16" $L/fp8.log
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --quantize fp8"
echo "[$SECONDS s] fp8 prefill: $(timeout 60 $P bench $G --prefill 1024,4096 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill|^decode' | sed -E 's/ +/ /g' | tr '\n' ' ')"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
