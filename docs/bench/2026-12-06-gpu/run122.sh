#!/usr/bin/env bash
# Session 30, GPU call 1 (run121.sh with its guard at 450 s and run120.sh's H200 rows): fewer launches in the decode step. (1) PORTER_NORM_GEMV=
# small (the new default): the add + RMSNorm fused into the MoE input GEMV at one row; (2) q /
# k / v packed into one projection (PORTER_QKV=apart: the old three); (3) the attention's
# output gate in the decode attention's epilogue (PORTER_ATTN_GATE=apart: its own launch).
# Parity first (bit-for-bit kernel tests, gpu / gpu_graphs at the default and all apart), then
# the model A/B at batch 1 (24 layers, bf16 and FP8), the issue commands, a timeline. Every
# step is skipped once the script has run 450 s.
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
ok() { [ $SECONDS -lt 450 ] || { echo "[$SECONDS s] out of time: skipped $*"; return 1; }; }
APART="PORTER_NORM_GEMV=apart PORTER_QKV=apart PORTER_ATTN_GATE=apart"
t() { local name=$1 to=$2; shift 2; ok $name || return; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
t gpu 60 .dev/k/gpu $T
t gpu_graphs 40 .dev/k/gpu_graphs $T
t qk_prep 30 .dev/k/cuda_qk_prep $T
t norm_gemv 40 .dev/k/cuda_norm_gemv $T --skip timing
t gpu_apart 60 env $APART .dev/k/gpu $T
grep -hE "panicked|FAILED" $L/*.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
b() { local q=$1; shift; ok bench || return; timeout 40 env "$@" $P bench $G $q --prefill 16 --batch 1 --context $CTX --steps 64 2>&1 | grep -E '^decode batch' | sed -E 's/.*batch +([0-9]+): +([0-9.]+) tok.*\(([0-9.]+) ms.*/b\1 \2 tok\/s \3 ms/' | tr '\n' ' '; }
CTX=128
for r in 1 2; do
  for q in "" "--quantize fp8"; do
    echo "[$SECONDS s] r$r ${q:-bf16} ctx $CTX all apart: $(b "$q" $APART)"
    echo "[$SECONDS s] r$r ${q:-bf16} ctx $CTX default (all three): $(b "$q" X=1)"
  done
done
for q in "" "--quantize fp8"; do
  echo "[$SECONDS s] ${q:-bf16} norm small only: $(b "$q" PORTER_QKV=apart PORTER_ATTN_GATE=apart)"
  echo "[$SECONDS s] ${q:-bf16} qkv packed only: $(b "$q" PORTER_NORM_GEMV=apart PORTER_ATTN_GATE=apart)"
  echo "[$SECONDS s] ${q:-bf16} gate fused only: $(b "$q" PORTER_NORM_GEMV=apart PORTER_QKV=apart)"
done
CTX=4096
echo "[$SECONDS s] bf16 ctx $CTX all apart: $(b "" $APART)"
echo "[$SECONDS s] bf16 ctx $CTX default: $(b "" X=1)"
echo "[$SECONDS s] bf16 ctx $CTX gate apart: $(b "" PORTER_ATTN_GATE=apart)"
ok issue && { timeout 60 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] issue bench bf16 rc=$?"; grep -E "^(HBM|prefill|decode)|host issue" $L/bf16.log | head -12; }
ok issue_fp8 && { timeout 60 $P bench $G --quantize fp8 --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8.log 2>&1; echo "[$SECONDS s] issue bench fp8 rc=$?"; grep -E "^(prefill|decode)" $L/fp8.log | head -6; }
ok mtp && { timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp rc=$?"; grep -E "^mtp (baseline|k=)" $L/mtp.log; }
ok timeline && { PORTER_TIMELINE=1 timeout 40 $P bench $G --quantize fp8 --prefill 16 --batch 1 --context 128 --steps 64 > $OUT/tl_fp8.log 2>&1; echo "[$SECONDS s] timeline fp8 rc=$?"; }
CTX=128
echo "[$SECONDS s] bf16 norm fused everywhere: $(b "" PORTER_NORM_GEMV=fused)"
echo "[$SECONDS s] bf16 norm fused everywhere, 16 an SM: $(b "" PORTER_NORM_GEMV=fused PORTER_NORM_GEMV_BPS=16)"
t norm_gemv_timing 40 .dev/k/cuda_norm_gemv $T norm_gemv_80b_timing
grep -h "TIME" $L/norm_gemv_timing.log | head -8
t gpu_fallback 60 env PORTER_CUDA_FALLBACK=1 .dev/k/gpu $T
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem" -gt 100000 ] && ok fp8_48; then
  F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
  timeout 100 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8_48.log 2>&1; echo "[$SECONDS s] bench FP8 48 layers rc=$?"
  grep -E "^(device|HBM|memory|kv|prefill|decode)|host issue|free" $L/fp8_48.log | head -20
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
