#!/usr/bin/env bash
# Session 14, call 2: the fused RMSNorm + decode GEMV (PORTER_NORM_GEMV=fused) with its weight
# rows asked into L2 before the PDL wait, against the two-launch default. Parity (kernel test vs
# the CPU, model suites with the fused form), then decode batch 1..8, MTP K = 3 and FP8 batch 1
# with and without. Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 40 .dev/k/cuda_norm_gemv $T --skip timing > $L/norm_gemv.log 2>&1; echo "norm_gemv rc=$? $(grep -E '^test result' $L/norm_gemv.log)"
timeout 25 .dev/k/cuda_norm_gemv $T norm_gemv_80b_timing > $L/norm_gemv_timing.log 2>&1; grep TIME $L/norm_gemv_timing.log
PORTER_NORM_GEMV=fused timeout 60 .dev/bin/gpu $T > $L/gpu_fused.log 2>&1; echo "gpu fused rc=$? $(grep -E '^test result' $L/gpu_fused.log)"
PORTER_NORM_GEMV=fused timeout 30 .dev/bin/gpu_graphs $T > $L/gpu_graphs_fused.log 2>&1; echo "gpu_graphs fused rc=$? $(grep -E '^test result' $L/gpu_graphs_fused.log)"
for v in apart fused apart fused; do
  PORTER_NORM_GEMV=$v timeout 30 $P bench $G --prefill 16 --batch 1,2,4,8 --context 128 --steps 32 > $L/dec_$v.log 2>&1
  echo "$v: $(grep -E 'decode batch' $L/dec_$v.log | sed 's/(.*of the HBM roofline)//' | tr -s ' ' | tr '\n' ' ')"
done
for v in apart fused; do
  PORTER_NORM_GEMV=$v timeout 30 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$v.log 2>&1
  echo "mtp $v: $(grep -E 'mtp k=|baseline' $L/mtp_$v.log | tr -s ' ' | tr '\n' ' ')"
done
grep -hE "panicked|FAILED|failed:" $L/*.log | head
