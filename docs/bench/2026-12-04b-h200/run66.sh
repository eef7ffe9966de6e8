#!/usr/bin/env bash
# Session 17, call 7: (1) the down-L2 form (PORTER_MOE_GEMV=direct-l2: the gate+up launch asks the
# down rows into L2 with evict_last) now with the in-flight down kernel, against the default;
# (2) decode attention forms at short context (PORTER_ATTN_DECODE) in the model step.
# Suites and the MoE decode kernel parity first (every direct form bit for bit against v1).
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
T="--test-threads=1 --skip bench_"
step() { grep -E 'decode batch' "$1" | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' '; }
timeout 150 .dev/bin/gpu $T --include-ignored > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu: $(grep -E '^test result' $L/gpu.log)"
timeout 60 .dev/bin/gpu_graphs $T --include-ignored > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs: $(grep -E '^test result' $L/gpu_graphs.log)"
timeout 150 .dev/k/cuda_moe_decode --test-threads=1 --include-ignored --skip nvrtc --skip timing --nocapture > $L/cuda_moe_decode.log 2>&1
echo "[$SECONDS s] cuda_moe_decode: $(grep -E '^test result' $L/cuda_moe_decode.log)"; grep -E "panicked|FAILED" $L/cuda_moe_decode.log | head -5
for rep in 1 2; do
  for v in auto direct-l2; do
    PORTER_MOE_GEMV=$v timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 32 > $L/bf16_$v$rep.log 2>&1; echo "[$SECONDS s] bf16 $v: $(step $L/bf16_$v$rep.log)"
    PORTER_MOE_GEMV=$v timeout 60 $P bench $F --prefill 16 --batch 1,2,4 --context 128 --steps 32 > $L/fp8_$v$rep.log 2>&1; echo "[$SECONDS s] fp8 $v: $(step $L/fp8_$v$rep.log)"
  done
done
for a in mma4 mma4w2 mma legacy; do
  PORTER_ATTN_DECODE=$a timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 32 > $L/attn_$a.log 2>&1; echo "[$SECONDS s] attn $a ctx 128: $(step $L/attn_$a.log)"
done
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | sort | uniq -c | head
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
