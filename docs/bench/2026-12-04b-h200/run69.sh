#!/usr/bin/env bash
# Session 17, call 10 (main 6a8ebe8, the final tree): FP8 batch 64 (the FP8 issue's >= 70 % target;
# call 5 gave 69.9 %, session 16 70.6 / 71.3 %) three times, each alone in its process, and batch 1
# once more.
# Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
for rep in 1 2 3; do
  timeout 60 $P bench $F --prefill 16 --batch 64 --context 128 --steps 32 > $L/b64_$rep.log 2>&1
  echo "[$SECONDS s] fp8 b64 run $rep: $(grep -E 'decode batch' $L/b64_$rep.log)"
done
timeout 60 $P bench $F --prefill 16 --batch 1 --context 128 --steps 32 > $L/b1.log 2>&1
echo "[$SECONDS s] fp8 b1: $(grep -E 'decode batch' $L/b1.log)"
echo "[$SECONDS s] done"
