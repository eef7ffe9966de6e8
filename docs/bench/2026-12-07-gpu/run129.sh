#!/usr/bin/env bash
# Session 31, GPU call 3: the FP8 dequantization of the prefill path (dense GEMMs above 1,024
# rows: dequantize into scratch + cuBLAS) with 16-byte stores (it was sixteen 2-byte stores a
# thread: 272 µs for [12288, 2048] on the H100, 277 GB/s). Bit-exactness and speed
# (cuda_fp8 fp8_dequant_and_quantize), the FP8 prefill at 4k against bf16 and against the
# tile-dequant path (PORTER_FP8_GEMM=tc), and a per-block profile of the FP8 prefill.
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
t dequant 60 .dev/k/cuda_fp8 $T --exact fp8_dequant_and_quantize
grep -E "fp8_dequant|panicked" $L/dequant.log | head -12
t gpu 90 .dev/k/gpu $T
grep -hE "panicked|FAILED" $L/*.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
pf() { local q=$1; shift; ok bench || return; timeout 60 env "$@" $P bench $G $q --prefill 4096 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill' | sed -E 's/ +/ /g' | tr '\n' ' '; }
for r in 1 2; do
  echo "[$SECONDS s] r$r fp8 (dequant + cuBLAS above 1,024 rows): $(pf "--quantize fp8" X=1)"
  echo "[$SECONDS s] r$r fp8 PORTER_FP8_GEMM=tc: $(pf "--quantize fp8" PORTER_FP8_GEMM=tc)"
  echo "[$SECONDS s] r$r bf16: $(pf "" X=1)"
done
if ok profile; then
  PORTER_PROFILE=1 timeout 90 $P bench $G --quantize fp8 --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 2 > $L/prof_fp8.log 2>&1; echo "[$SECONDS s] profile fp8 rc=$?"
  grep -vE "^\s*$" $L/prof_fp8.log | tail -45
fi
if ok profile_bf16; then
  PORTER_PROFILE=1 timeout 90 $P bench $G --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 2 > $L/prof_bf16.log 2>&1; echo "[$SECONDS s] profile bf16 rc=$?"
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
