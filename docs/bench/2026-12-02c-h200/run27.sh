#!/usr/bin/env bash
# Session 8, last GPU call: per-kernel device time of one decode step on the final kernels
# (bf16 and FP8, batch 1, 4 layers, eager), summarised by scripts/ncu_step.py. Carry .dev/porter.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
E4="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2 --batch 1"
N="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
timeout 100 $N --log-file $L/ncu_bf16_b1.csv $P bench $E4 > $L/ncu_bf16_b1.log 2>&1; echo "bf16 rc=$?"
python3 scripts/ncu_step.py $L/ncu_bf16_b1.csv > $L/step_bf16_b1.txt 2>&1
timeout 100 $N --log-file $L/ncu_fp8_b1.csv $P bench $E4 --quantize fp8 > $L/ncu_fp8_b1.log 2>&1; echo "fp8 rc=$?"
python3 scripts/ncu_step.py $L/ncu_fp8_b1.csv > $L/step_fp8_b1.txt 2>&1
head -30 $L/step_bf16_b1.txt
head -30 $L/step_fp8_b1.txt
gzip $L/*.csv
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
