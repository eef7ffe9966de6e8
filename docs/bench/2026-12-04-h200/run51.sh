#!/usr/bin/env bash
# Session 15, call 2: the fused Gated DeltaNet step with the separate delta rule's lanes per
# column by batch (8 at one span … 1 from eight), conv channels looped over the threads.
# Kernel tests (bit for bit against the three launches at every lane count, other lanes within
# tolerance, timing at 8 / 4 / 2 / 1 lanes), model suites, then decode batch 1..64 with the
# fusion off, on (default lanes) and each lane count forced; MTP K = 3; FP8.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 90 .dev/k/cuda_gdn_fused $T > $L/gdn_fused.log 2>&1; echo "gdn_fused rc=$? $(grep -E '^test result' $L/gdn_fused.log)"
grep -E "decode step|differ|panicked" $L/gdn_fused.log | head -8
timeout 90 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 40 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
run() { # name, env...
  local n=$1; shift
  env "$@" timeout 40 $P bench $G --prefill 16 --batch 1,2,4,8,64 --context 128 --steps 32 > $L/dec_$n.log 2>&1
  echo "$n: $(grep -E 'decode batch' $L/dec_$n.log | sed 's/(.*of the HBM roofline)//;s/decode batch//' | tr -s ' ' | tr '\n' ' ')"
}
run off PORTER_GDN_FUSED=off
run on PORTER_GDN_FUSED=on
run l1 PORTER_GDN_FUSED_LANES=1
run l2 PORTER_GDN_FUSED_LANES=2
run l4 PORTER_GDN_FUSED_LANES=4
run off2 PORTER_GDN_FUSED=off
run on2 PORTER_GDN_FUSED=on
grep -E "decode batch" $L/dec_on.log
for v in on off; do
  PORTER_GDN_FUSED=$v timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$v.log 2>&1
  echo "mtp $v: $(grep -E 'forced|baseline' $L/mtp_$v.log | tr -s ' ' | tr '\n' ' ')"
done
for v in on off; do
  PORTER_GDN_FUSED=$v timeout 60 $P bench --device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8 --prefill 16 --batch 1,8,64 --context 128 --steps 32 > $L/fp8_$v.log 2>&1
  echo "fp8 $v: $(grep -E 'decode batch' $L/fp8_$v.log | sed 's/(.*of the HBM roofline)//' | tr -s ' ' | tr '\n' ' ')"
done
PORTER_CUDA_FALLBACK=1 timeout 90 .dev/bin/gpu $T > $L/gpu_fallback.log 2>&1; echo "gpu fallback rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
grep -hE "panicked|FAILED|failed:" $L/*.log | head
