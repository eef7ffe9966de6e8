#!/usr/bin/env bash
# Session 30, GPU call 3: the decode attention's output gate (opt-in PORTER_ATTN_GATE=fused)
# with the gate's L1 prefetch moved before the PDL wait (where Q is read, ADEC_PRE): parity
# (the gated kernels bit for bit, the model suite with the gate fused), then the model A/B at
# batch 1 against the default (the gate's own launch), bf16 and FP8, 128 and 4,096 keys. Every
# step is skipped once the script has run 150 s.
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
ok() { [ $SECONDS -lt 150 ] || { echo "[$SECONDS s] out of time: skipped $*"; return 1; }; }
t() { local name=$1 to=$2; shift 2; ok $name || return; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
t gated 60 .dev/k/cuda_attention $T attention_decode_gated_bit_exact
t gpu_gate 60 env PORTER_ATTN_GATE=fused .dev/k/gpu $T
grep -hE "panicked|FAILED" $L/*.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
b() { local q=$1; shift; ok bench || return; timeout 40 env "$@" $P bench $G $q --prefill 16 --batch 1 --context $CTX --steps 64 2>&1 | grep -E '^decode batch' | sed -E 's/.*batch +([0-9]+): +([0-9.]+) tok.*\(([0-9.]+) ms.*/b\1 \2 tok\/s \3 ms/' | tr '\n' ' '; }
for r in 1 2; do
  for CTX in 128 4096; do
    for q in "" "--quantize fp8"; do
      echo "[$SECONDS s] r$r ${q:-bf16} ctx $CTX default (gate apart): $(b "$q" X=1)"
      echo "[$SECONDS s] r$r ${q:-bf16} ctx $CTX gate fused: $(b "$q" PORTER_ATTN_GATE=fused)"
    done
  done
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
