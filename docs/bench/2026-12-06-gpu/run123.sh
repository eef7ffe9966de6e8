#!/usr/bin/env bash
# Session 30, GPU call 2: the defaults after call 1 (q / k / v packed; the norm and the
# attention gate apart again) against all three apart, the fused norm + MoE input GEMV
# (`small`) with its first weight rows prefetched into L2 before its PDL wait, the issue commands, the device
# timeline in bf16 and FP8 (its PTX staged beside the normal build's), the forced-fallback
# suite with room to finish, and on an H200 the FP8 48-layer rows of issue 12. Every step is
# skipped once the script has run 360 s.
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
T="--include-ignored --nocapture --test-threads=1"
L=$OUT/logs; mkdir -p $L
ok() { [ $SECONDS -lt 360 ] || { echo "[$SECONDS s] out of time: skipped $*"; return 1; }; }
APART="PORTER_NORM_GEMV=apart PORTER_QKV=apart PORTER_ATTN_GATE=apart"
t() { local name=$1 to=$2; shift 2; ok $name || return; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
if [ "$mem" -gt 100000 ] && ok fp8_48; then
  F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
  timeout 150 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8_48.log 2>&1; echo "[$SECONDS s] bench FP8 48 layers rc=$?"
  grep -E "^(device|HBM|memory|kv|prefill|decode)|host issue|free" $L/fp8_48.log | head -20
  timeout 90 $P bench $F --prefill 16 --batch 1 --context 128 --steps 32 --mtp-step 3 > $L/fp8_48_mtp.log 2>&1; echo "[$SECONDS s] mtp FP8 48 rc=$?"
  grep -E "^mtp (baseline|k=)" $L/fp8_48_mtp.log
fi
t gpu 60 .dev/k/gpu $T
t norm_gemv 40 .dev/k/cuda_norm_gemv $T --skip timing --skip nvrtc
b() { local q=$1; shift; ok bench || return; timeout 40 env "$@" $P bench $G $q --prefill 16 --batch 1 --context 128 --steps 64 2>&1 | grep -E '^decode batch' | sed -E 's/.*batch +([0-9]+): +([0-9.]+) tok.*\(([0-9.]+) ms.*/b\1 \2 tok\/s \3 ms/' | tr '\n' ' '; }
for r in 1 2; do
  for q in "" "--quantize fp8"; do
    echo "[$SECONDS s] r$r ${q:-bf16} all apart: $(b "$q" $APART)"
    echo "[$SECONDS s] r$r ${q:-bf16} default (qkv packed): $(b "$q" X=1)"
    echo "[$SECONDS s] r$r ${q:-bf16} default + norm small (its weights prefetched before the wait): $(b "$q" PORTER_NORM_GEMV=small)"
  done
  echo "[$SECONDS s] r$r bf16 default + norm fused everywhere (prefetched): $(b "" PORTER_NORM_GEMV=fused)"
done
ok issue && { timeout 60 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] issue bench bf16 rc=$?"; grep -E "^(HBM|prefill|decode)|host issue" $L/bf16.log | head -12; }
ok issue_fp8 && { timeout 60 $P bench $G --quantize fp8 --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8.log 2>&1; echo "[$SECONDS s] issue bench fp8 rc=$?"; grep -E "^(prefill|decode)" $L/fp8.log | head -6; }
ok timeline && { PORTER_TIMELINE=1 timeout 120 $P bench $G --quantize fp8 --prefill 16 --batch 1 --context 128 --steps 64 > $OUT/tl_fp8.log 2>&1; echo "[$SECONDS s] timeline fp8 rc=$?"; }
ok timeline && { PORTER_TIMELINE=1 timeout 90 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 > $OUT/tl_bf16.log 2>&1; echo "[$SECONDS s] timeline bf16 rc=$?"; }
t gpu_fallback 150 env PORTER_CUDA_FALLBACK=1 .dev/k/gpu $T
grep -hE "panicked|FAILED" $L/*.log | head -8
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
