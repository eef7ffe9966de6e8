#!/usr/bin/env bash
# Session 31, GPU call 9: the dense wgmma gate+up GEMM with its MMAs overlapped across k-steps
# (moe_wg_gu_ov_*, PORTER_MOE_WG_OVERLAP=on: wgmma.wait_group 1 instead of 0 between steps, the
# loads S - 2 steps ahead). Parity with it on (cuda_moe moe_wgmma_parity, moe_small_*; the
# model suite), the MoE timing at 4k tokens on and off, the bf16 prefill on and off.
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
export PORTER_MOE_WG_OVERLAP=on
t parity 120 .dev/k/cuda_moe $T --exact moe_wgmma_parity moe_small_bf16 moe_small_f16
t gpu 90 .dev/k/gpu $T
grep -hE "panicked|FAILED" $L/*.log | head -8
t tim_on 60 .dev/k/cuda_moe $T --exact moe_80b_timing
t tim_off 60 env PORTER_MOE_WG_OVERLAP=off .dev/k/cuda_moe $T --exact moe_80b_timing
grep -E "t=4096|prefill" $L/tim_on.log | head -8; echo "-- off"; grep -E "t=4096|prefill" $L/tim_off.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for r in 1 2; do
  echo "[$SECONDS s] r$r bf16 on:  $(timeout 60 $P bench $G --prefill 1024,4096 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill' | sed -E 's/ +/ /g' | tr '\n' ' ')"
  echo "[$SECONDS s] r$r bf16 off: $(PORTER_MOE_WG_OVERLAP=off timeout 60 $P bench $G --prefill 1024,4096 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill' | sed -E 's/ +/ /g' | tr '\n' ' ')"
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
