#!/usr/bin/env bash
# Session 31, GPU call 4: the MoE prefill's wgmma grouped GEMMs with FP8 experts
# (moe_wg_{gu,down}_fp8_*: e4m3 weight chunks staged by cp.async, dequantized by the thread
# that staged them into the swizzled T tile, for step q + 1 while step q's MMAs run), now
# what FP8 experts take on sm_90 (PORTER_MOE_GEMM=pipe gives the former tile-dequant wmma
# GEMMs). Parity (cuda_fp8_gemm moe_fp8_prefill_*: partial 128-blocks, few-row experts, the
# 80B shape, against the CPU on the dequantized weights; the model suite), the kernel timing
# both ways, then the FP8 prefill in the model both ways, and bf16 beside it.
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
ok() { [ $SECONDS -lt 300 ] || { echo "[$SECONDS s] out of time: skipped $*"; return 1; }; }
t() { local name=$1 to=$2; shift 2; ok $name || return; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
t moe_prefill 120 .dev/k/cuda_fp8_gemm $T --exact moe_fp8_prefill_bf16 moe_fp8_prefill_f16
grep -E "panicked|err|max" $L/moe_prefill.log | head -16
t gpu 90 .dev/k/gpu $T
grep -hE "panicked|FAILED" $L/gpu.log | head -8
t bench_wg 120 .dev/k/cuda_fp8_gemm $T --exact fp8_gemm_bench
grep -E "moe t=" $L/bench_wg.log
t bench_tc 120 env PORTER_MOE_GEMM=pipe .dev/k/cuda_fp8_gemm $T --exact fp8_gemm_bench
grep -E "moe t=" $L/bench_tc.log | head -1
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
pf() { local q=$1; shift; ok bench || return; timeout 60 env "$@" $P bench $G $q --prefill 4096 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill' | sed -E 's/ +/ /g' | tr '\n' ' '; }
for r in 1 2; do
  echo "[$SECONDS s] r$r fp8 (wgmma): $(pf "--quantize fp8" X=1)"
  echo "[$SECONDS s] r$r fp8 PORTER_MOE_GEMM=pipe (tile-dequant wmma): $(pf "--quantize fp8" PORTER_MOE_GEMM=pipe)"
  echo "[$SECONDS s] r$r bf16: $(pf "" X=1)"
done
if ok profile; then
  PORTER_PROFILE=1 timeout 90 $P bench $G --quantize fp8 --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 2 > $L/prof_fp8.log 2>&1; echo "[$SECONDS s] profile fp8 rc=$?"
  grep -E "^prefill|profile .* ms  " $L/prof_fp8.log | head -10
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
