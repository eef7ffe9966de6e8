#!/usr/bin/env bash
# Session 15, call 1: the fused Gated DeltaNet decode / verify step (gdn_fused_seq:
# conv + gates + delta rule + gated RMSNorm in one launch, PORTER_GDN_FUSED=on|off).
# Kernel tests (bit for bit against the three launches, refused spans, timing), the model
# suites with it on (default), off, and with the fallback kernels forced; then decode batch
# 1..8, MTP K = 3 and FP8 batch 1 with it on and off. Carry .dev/porter, .dev/ptx.tgz,
# .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 60 .dev/k/cuda_gdn_fused $T > $L/gdn_fused.log 2>&1; echo "gdn_fused rc=$? $(grep -E '^test result' $L/gdn_fused.log)"
grep -E "decode step|differ|panicked" $L/gdn_fused.log | head -8
timeout 90 .dev/k/cuda_gdn_seq $T > $L/gdn_seq.log 2>&1; echo "gdn_seq rc=$? $(grep -E '^test result' $L/gdn_seq.log)"
timeout 90 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 40 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
PORTER_GDN_FUSED=off timeout 90 .dev/bin/gpu $T > $L/gpu_off.log 2>&1; echo "gpu off rc=$? $(grep -E '^test result' $L/gpu_off.log)"
PORTER_CUDA_FALLBACK=1 timeout 90 .dev/bin/gpu $T > $L/gpu_fallback.log 2>&1; echo "gpu fallback rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
for v in on off on off; do
  PORTER_GDN_FUSED=$v timeout 40 $P bench $G --prefill 16 --batch 1,2,4,8,64 --context 128 --steps 32 > $L/dec_$v.log 2>&1
  echo "$v: $(grep -E 'decode batch' $L/dec_$v.log | sed 's/(.*of the HBM roofline)//' | tr -s ' ' | tr '\n' ' ')"
done
grep -E "decode batch" $L/dec_on.log
for v in on off; do
  PORTER_GDN_FUSED=$v timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$v.log 2>&1
  echo "mtp $v: $(grep -E 'mtp k=|baseline' $L/mtp_$v.log | tr -s ' ' | tr '\n' ' ')"
done
for v in on off; do
  PORTER_GDN_FUSED=$v timeout 60 $P bench --device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8 --prefill 16 --batch 1,8,64 --context 128 --steps 32 > $L/fp8_$v.log 2>&1
  echo "fp8 $v: $(grep -E 'decode batch' $L/fp8_$v.log | sed 's/(.*of the HBM roofline)//' | tr -s ' ' | tr '\n' ' ')"
done
grep -hE "panicked|FAILED|failed:" $L/*.log | head
