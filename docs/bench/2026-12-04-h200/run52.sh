#!/usr/bin/env bash
# Session 15, call 3: the MoE router's top-k inside the direct gate+up kernels
# (PORTER_MOE_ROUTER=fused|apart; helper commit 4c00157). Kernel tests (fused vs apart bit for
# bit), the model suites with the router fused (default) and apart, then decode batch 1..64,
# MTP K = 3 and FP8 with each. Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for b in .dev/k/*; do
  n=$(basename $b); timeout 120 $b $T > $L/$n.log 2>&1; echo "$n rc=$? $(grep -E '^test result' $L/$n.log)"
done
timeout 90 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 40 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
PORTER_MOE_ROUTER=apart timeout 90 .dev/bin/gpu $T > $L/gpu_apart.log 2>&1; echo "gpu apart rc=$? $(grep -E '^test result' $L/gpu_apart.log)"
run() { # name, env...
  local n=$1; shift
  env "$@" timeout 40 $P bench $G --prefill 16 --batch 1,2,4,8,64 --context 128 --steps 32 > $L/dec_$n.log 2>&1
  echo "$n: $(grep -E 'decode batch' $L/dec_$n.log | sed 's/(.*of the HBM roofline)//;s/decode batch//' | tr -s ' ' | tr '\n' ' ')"
}
run fused PORTER_MOE_ROUTER=fused
run apart PORTER_MOE_ROUTER=apart
run fused2 PORTER_MOE_ROUTER=fused
run apart2 PORTER_MOE_ROUTER=apart
grep -E "decode batch" $L/dec_fused.log
for v in fused apart fused apart; do
  PORTER_MOE_ROUTER=$v timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$v.log 2>&1
  echo "mtp $v: $(grep -E 'forced|baseline' $L/mtp_$v.log | sed 's/acceptance.*//' | tr -s ' ' | tr '\n' ' ')"
done
for v in fused apart; do
  PORTER_MOE_ROUTER=$v timeout 60 $P bench --device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8 --prefill 16 --batch 1,4,8,64 --context 128 --steps 32 > $L/fp8_$v.log 2>&1
  echo "fp8 $v: $(grep -E 'decode batch' $L/fp8_$v.log | sed 's/(.*of the HBM roofline)//' | tr -s ' ' | tr '\n' ' ')"
done
grep -hE "panicked|FAILED|failed:" $L/*.log | head
