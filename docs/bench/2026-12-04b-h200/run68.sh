#!/usr/bin/env bash
# Session 17, call 9: the FP8 direct gate+up kernel with x staged (weights loaded before the staging barrier) in shared memory (permuted) against
# x from global memory (PORTER_MOE_STAGE_X=off). Suites and the MoE kernel parity first (every direct
# form bit for bit against v1), then FP8 batch 1 / 2 / 4 twice each, the gate+up's cost in place
# (knockout), and ncu of the kernel.
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
for b in cuda_moe_decode cuda_moe_shared; do
  timeout 150 .dev/k/$b --test-threads=1 --include-ignored --skip nvrtc --skip timing --nocapture > $L/$b.log 2>&1
  echo "[$SECONDS s] $b: $(grep -E '^test result' $L/$b.log)"; grep -E "panicked|FAILED" $L/$b.log | head -5
done
grep -E "80b fp8.*t=1:" $L/cuda_moe_shared.log | cut -c1-300
for rep in 1 2; do
  for v in on off; do
    PORTER_MOE_STAGE_X=$v timeout 60 $P bench $F --prefill 16 --batch 1,2,4 --context 128 --steps 32 > $L/fp8_$v$rep.log 2>&1; echo "[$SECONDS s] fp8 stage x $v: $(step $L/fp8_$v$rep.log)"
  done
done
for v in on off; do
  PORTER_MOE_STAGE_X=$v PORTER_KNOCKOUT=moe_dir_gu timeout 40 $P bench $F --prefill 16 --batch 1 --context 128 --steps 32 > $L/ko_gu_$v.log 2>&1; echo "[$SECONDS s] fp8 stage x $v, -gu: $(step $L/ko_gu_$v.log)"
done
timeout 60 $P bench $G --prefill 16 --batch 1,2,4 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] bf16: $(step $L/bf16.log)"
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 100 $NCU --clock-control none --kernel-name regex:'moe_dir_gu_sh_fp8' --launch-skip 2 --launch-count 1 --section SpeedOfLight --section SourceCounters --section WarpStateStats \
  .dev/k/cuda_moe_shared moe_shared_80b_fp8 --include-ignored --exact --nocapture > $L/ncu_gu.txt 2>&1
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|excessive" $L/ncu_gu.txt | head
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | sort | uniq -c | head
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
