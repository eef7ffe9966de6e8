#!/usr/bin/env bash
# Session 17, call 1. (1) The suites on main (gpu, gpu_graphs). (2) Where a graphed batch-1
# decode step's time goes, kernel by kernel, *in place*: PORTER_LAUNCH_TRACE lists one eager
# step's launches; then for every (entry point, grid x) pair of that step a bench run with
# PORTER_KNOCKOUT=name@gx (that launch left out; outputs wrong, timing only): the drop of the
# step time is the kernel's marginal cost in the PDL-chained graph. bf16 24 layers; FP8 48
# layers for the MoE kernels. (3) Batch 384 with the MoE decode reach 5 (default) and 8.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
step() { grep -E 'decode batch' "$1" | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' '; }
timeout 120 .dev/bin/gpu --include-ignored > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu: $(grep -E '^test result' $L/gpu.log)"
timeout 60 .dev/bin/gpu_graphs --include-ignored > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs: $(grep -E '^test result' $L/gpu_graphs.log)"
# (2) trace: eager, a 16-token prefill then 1 and 2 decode steps; the difference of the two
# launch counts is one step's, the last that many launches of the second trace are its launches.
for m in bf16 fp8; do
  A=$G; [ $m = fp8 ] && A=$F
  for s in 1 2; do
    PORTER_LAUNCH_TRACE=100000 timeout 60 $P bench $A --enforce-eager --prefill 16 --batch 1 --context 128 --steps $s > $L/trace_${m}_$s.log 2>&1
  done
  n1=$(grep -c '^launch' $L/trace_${m}_1.log); n2=$(grep -c '^launch' $L/trace_${m}_2.log); d=$((n2 - n1))
  grep '^launch' $L/trace_${m}_2.log | tail -n $d > $L/step_$m.txt
  grep '^launch' $L/step_$m.txt | awk '{g=$4; gsub(/[(,]/,"",g); print $2"@"g}' | sort | uniq -c | sort -rn > $L/pairs_$m.txt
  echo "[$SECONDS s] $m: $n1 / $n2 launches, a step $d, $(wc -l < $L/pairs_$m.txt) kinds"
done
base() { timeout 40 $P bench "$@" --prefill 16 --batch 1 --context 128 --steps 32; }
base $G > $L/ko_bf16_base.log 2>&1; echo "[$SECONDS s] bf16 base: $(step $L/ko_bf16_base.log)"
while read -r n p; do
  f=$L/ko_bf16_$(echo $p | tr '@' '_').log
  PORTER_KNOCKOUT=$p base $G > $f 2>&1; echo "[$SECONDS s] bf16 -$p (x$n): $(step $f)"
done < $L/pairs_bf16.txt
base $F > $L/ko_fp8_base.log 2>&1; echo "[$SECONDS s] fp8 base: $(step $L/ko_fp8_base.log)"
while read -r n p; do
  f=$L/ko_fp8_$(echo $p | tr '@' '_').log
  PORTER_KNOCKOUT=$p base $F > $f 2>&1; echo "[$SECONDS s] fp8 -$p (x$n): $(step $f)"
done < $L/pairs_fp8.txt
# (3) batch 384.
for v in 5 8; do
  PORTER_MOE_DECODE_PER_EXPERT=$v timeout 60 $P bench $F --prefill 16 --batch 256,384 --context 128 --steps 16 > $L/fp8_384_pe$v.log 2>&1
  echo "[$SECONDS s] fp8 reach $v: $(step $L/fp8_384_pe$v.log)"
  PORTER_MOE_DECODE_PER_EXPERT=$v timeout 60 $P bench $G --prefill 16 --batch 256,384 --context 128 --steps 16 > $L/bf16_384_pe$v.log 2>&1
  echo "[$SECONDS s] bf16 reach $v: $(step $L/bf16_384_pe$v.log)"
done
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | sort | uniq -c | head
echo "[$SECONDS s] done"
