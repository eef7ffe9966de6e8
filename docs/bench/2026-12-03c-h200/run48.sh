#!/usr/bin/env bash
# Session 14, one call: decode attention's L2 prefetch before the PDL wait
# (PORTER_ATTN_DECODE_PREFETCH). Parity of every decode form with the prefetch on (kernel
# tests vs the CPU, and the model suites under graphs), the timing table (batch 1/2/4/8 at
# 32k keys, prefetch 0/1/2/4), then the model at 32k context with the prefetch off and on.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin/gpu, .dev/bin/gpu_graphs, .dev/k/cuda_attention.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
PORTER_ATTN_DECODE_PREFETCH=2 timeout 70 .dev/k/cuda_attention $T attention_decode_batch attention_qwen3_next_decode attention_decode_mma_batch_invariant > $L/attn_pf2.log 2>&1; echo "attn pf2 rc=$? $(grep -E '^test result' $L/attn_pf2.log)"
timeout 50 .dev/k/cuda_attention $T attention_decode_mma_timing > $L/attn_timing.log 2>&1; echo "attn timing rc=$?"
PORTER_ATTN_DECODE_PREFETCH=2 timeout 60 .dev/bin/gpu $T > $L/gpu_pf2.log 2>&1; echo "gpu pf2 rc=$? $(grep -E '^test result' $L/gpu_pf2.log)"
PORTER_ATTN_DECODE_PREFETCH=2 timeout 30 .dev/bin/gpu_graphs $T > $L/gpu_graphs_pf2.log 2>&1; echo "gpu_graphs pf2 rc=$? $(grep -E '^test result' $L/gpu_graphs_pf2.log)"
for pf in 0 2 0 2; do
  PORTER_ATTN_DECODE_PREFETCH=$pf timeout 30 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 32 > $L/ctx32k_pf$pf.log 2>&1
  echo "pf=$pf: $(grep -E 'decode batch' $L/ctx32k_pf$pf.log | tr '\n' ' ')"
done
grep -hE "panicked|FAILED|failed:" $L/*.log | head
grep -E "DECODE-AB|Mma4 .*pf|Mma4W2 .*pf +2" $L/attn_timing.log | grep -E "DECODE-AB|per call|split kernel" | head -80
