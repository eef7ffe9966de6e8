#!/usr/bin/env bash
# Session 31, GPU call 5: fp8_dequant as a block per (row, run of 2,048 columns), 8 elements a
# thread (8-byte loads, 16-byte stores, the row's scale row once); bit-exactness and speed;
# the forced-fallback suite and the graphs suite on this tree (FP8 prefill kernels changed);
# the FP8 issue command with 32k prefill (24 FP8 layers fit beside it on the H100), bf16 4k
# beside it.
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
ok() { [ $SECONDS -lt 330 ] || { echo "[$SECONDS s] out of time: skipped $*"; return 1; }; }
t() { local name=$1 to=$2; shift 2; ok $name || return; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
t dequant 60 .dev/k/cuda_fp8 $T --exact fp8_dequant_and_quantize
grep -E "fp8_dequant bf16|panicked" $L/dequant.log | head -4
t fallback 120 env PORTER_CUDA_FALLBACK=1 .dev/k/gpu $T
t graphs 60 .dev/k/gpu_graphs $T
grep -hE "panicked|FAILED" $L/*.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
pf() { local q=$1; shift; ok bench || return; timeout 60 env "$@" $P bench $G $q --prefill 4096 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill' | sed -E 's/ +/ /g' | tr '\n' ' '; }
for r in 1 2; do
  echo "[$SECONDS s] r$r fp8: $(pf "--quantize fp8" X=1)"
  echo "[$SECONDS s] r$r bf16: $(pf "" X=1)"
done
if ok issue_fp8; then
  timeout 90 $P bench $G --quantize fp8 --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/issue_fp8.log 2>&1; echo "[$SECONDS s] issue bench fp8 rc=$?"
  grep -E "^(HBM|prefill|decode)|host issue" $L/issue_fp8.log | head -10
fi
if ok profile; then
  PORTER_PROFILE=1 timeout 90 $P bench $G --quantize fp8 --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 2 > $L/prof_fp8.log 2>&1; echo "[$SECONDS s] profile fp8 rc=$?"
  grep -E "^prefill|profile .* ms  " $L/prof_fp8.log | head -10
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
