#!/usr/bin/env bash
# Session 28, GPU call 1: decode attention's last-block merge (PORTER_ATTN_DECODE=mma4-last:
# no combine launch) and the re-applied V2 combine reading its spans before its PDL wait.
# Parity (cuda_attention's decode forms, its other GPU tests, gpu and gpu_graphs at the
# default and gpu under mma4-last; the other cuda_attention tests left out for time), the kernel timing (every form, 32k at batch 1 first), then
# the model A/B mma4 | mma4-last at batch 1, context 4,096 and 32,768 (24 layers, bf16).
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
timeout 45 .dev/k/cuda_attention $T --exact attention_decode_mma_timing > $OUT/timing.log 2>&1; echo "[$SECONDS s] timing rc=$?"
grep -E "DECODE-AB|Mma4(Last)? .*(env|early) per call|Mma4 .*: alloc" $OUT/timing.log | head -40
timeout 160 .dev/k/cuda_attention $T attention_decode_mma_parity attention_decode_mma_batch_invariant > $L/attn_decode.log 2>&1; echo "[$SECONDS s] decode parity rc=$? $(grep -E '^test result' $L/attn_decode.log)"
for t in gpu_graphs gpu; do
    timeout 60 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
PORTER_ATTN_DECODE=mma4-last timeout 60 .dev/k/gpu $T > $L/gpu_last.log 2>&1; echo "[$SECONDS s] gpu mma4-last rc=$? $(grep -E '^test result' $L/gpu_last.log)"
grep -hE "panicked|FAILED" $L/*.log | head -6
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for r in 1 2; do
  for c in 32768 4096; do
    for a in mma4 mma4-last; do
      s=$(PORTER_ATTN_DECODE=$a timeout 60 $P bench $G --prefill 16 --batch 1 --context $c --steps 64 2>&1 | grep -E '^decode batch' | sed -E 's/.*batch +([0-9]+): +([0-9.]+) tok.*\(([0-9.]+) ms.*/b\1 \2 tok\/s \3 ms/' | tr '\n' ' ')
      echo "[$SECONDS s] round $r context $c $a: $s"
    done
  done
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
