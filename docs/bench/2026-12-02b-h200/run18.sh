#!/usr/bin/env bash
# Session 7, first GPU call (commit in the summary): the FP8 defaults of c4a59e0 end to end
# (dense FP8 GEMMs of 5–1,024 rows on the tile-dequant TC GEMM, MoE decode v1), the 24-layer
# bf16 peer, per-kernel device time of one decode step from Nsight Compute (eager, 4 layers:
# every layer's kernels are the full model's), the chunked GDN kernel against FLA's
# chunk_gated_delta_rule at 4k / 16k tokens, and transformers + FLA on the 24-layer geometry.
# Carry .dev (porter, bin/cuda_gdn_chunk, wheels/ with flash-linear-attention + fla-core 0.6.0).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 575 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 120 $P bench $F --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$L/fp8_48.json"
t bf16_24 timeout 45 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
N="ncu --clock-control none --metrics gpu__time_duration.sum --csv"
E4="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2"
for b in 1 64; do
  t ncu_bf16_b$b timeout 60 $N --log-file $L/ncu_bf16_b$b.csv $P bench $E4 --batch $b
  python3 scripts/ncu_step.py $L/ncu_bf16_b$b.csv > $L/step_bf16_b$b.txt 2>&1
done
for b in 1 8; do
  t ncu_fp8_b$b timeout 60 $N --log-file $L/ncu_fp8_b$b.csv $P bench $E4 --quantize fp8 --batch $b
  python3 scripts/ncu_step.py $L/ncu_fp8_b$b.csv > $L/step_fp8_b$b.txt 2>&1
done
t k_gdn_chunk timeout 90 .dev/bin/cuda_gdn_chunk --nocapture --include-ignored --test-threads=1 80b_prefill
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev/wheels/*.whl > $L/pip.log 2>&1
PYTHONPATH=/tmp/site t fla_gdn timeout 90 python3 scripts/fla_gdn_bench.py --tokens 4096,16384 --json $L/fla_gdn.json
PYTHONPATH=/tmp/site t hf_24 timeout 120 python3 scripts/hf_bench.py --layers 24 --prefill 4096 --batch 1,8,64 --context 128 --steps 8 --json $L/hf_24.json
cat $S
grep -hE "panicked|FAILED|Error|error" $L/*.log | head -20
for f in bf16_24 fp8_48; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|memory|roofline|host" | head -20; done
for f in $L/step_*.txt; do echo "== $f"; head -24 $f; done
grep -h "µs\|TFLOP\|tok/s" $L/k_gdn_chunk.log $L/fla_gdn.log $L/hf_24.log | head -30
rm -f $L/*.csv.gz; gzip $L/*.csv
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
