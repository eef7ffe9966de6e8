#!/usr/bin/env bash
# Session 31, GPU call 2: call 1's one-launch MoE form lost in the model (FP8 batch 1 526.6 /
# 527.8 against 567.6 tok/s; bf16 439.8 / 439.4 against 449.1 / 449.2). This build issues the
# FP8 kernels' first down block weight loads right after the PDL wait, before the gate+up
# turns (dense: after them, as in call 1: early loads spill there). Parity of the FP8 forms,
# the model A/B, the kernel timing; then the issue commands at the defaults (the fused gate
# in the decode attention, q / k / v packed). Every step is skipped once the script has run
# 400 s.
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
ok() { [ $SECONDS -lt 400 ] || { echo "[$SECONDS s] out of time: skipped $*"; return 1; }; }
t() { local name=$1 to=$2; shift 2; ok $name || return; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
t shared 60 .dev/k/cuda_moe_shared $T --exact moe_shared_fp8
t dec_80b_fp8 60 .dev/k/cuda_moe_decode $T --exact moe_decode_80b_fp8
t gpu_one 90 env PORTER_MOE_ONE=on .dev/k/gpu $T
grep -hE "panicked|FAILED" $L/*.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
b() { local q=$1 bs=$2; shift 2; ok bench || return; timeout 45 env "$@" $P bench $G $q --prefill 16 --batch $bs --context 128 --steps 64 2>&1 | grep -E '^decode batch' | sed -E 's/.*batch +([0-9]+): +([0-9.]+) tok.*\(([0-9.]+) ms.*/b\1 \2 tok\/s \3 ms/' | tr '\n' ' '; }
for r in 1 2; do
  echo "[$SECONDS s] r$r fp8 two launches:  $(b "--quantize fp8" 1,4 PORTER_MOE_ONE=off)"
  echo "[$SECONDS s] r$r fp8 one launch:    $(b "--quantize fp8" 1,4 PORTER_MOE_ONE=on)"
done
t timing 90 .dev/k/cuda_moe_decode $T --exact moe_decode_small_t_timing
grep -E "^  t=[0-9]+ fp8" $L/timing.log | head -30
if ok issue; then
  timeout 70 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/issue_bf16.log 2>&1; echo "[$SECONDS s] issue bench bf16 rc=$?"
  grep -E "^(HBM|prefill|decode)|host issue" $L/issue_bf16.log | head -12
fi
if ok issue_fp8; then
  timeout 70 $P bench $G --quantize fp8 --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/issue_fp8.log 2>&1; echo "[$SECONDS s] issue bench fp8 rc=$?"
  grep -E "^(prefill|decode)" $L/issue_fp8.log | head -6
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
