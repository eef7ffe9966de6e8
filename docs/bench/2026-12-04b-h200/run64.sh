#!/usr/bin/env bash
# Session 17, call 5: the in-flight down kernel with h staged conflict-free. Suites and MoE kernel
# parity (cuda_moe_decode: bit for bit against v1, stacked FP8 experts with a row map;
# cuda_moe_shared); ncu of the FP8 down again; batch 1 / 2 / 4 benches; the down kernel's cost in
# place (knockout); then the issue's commands at the session's final defaults.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
T="--test-threads=1 --skip bench_"
step() { grep -E 'decode batch|prefill  *[0-9]+ tokens' "$1" | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' '; }
timeout 150 .dev/bin/gpu $T --include-ignored > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu: $(grep -E '^test result' $L/gpu.log)"
timeout 60 .dev/bin/gpu_graphs $T --include-ignored > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs: $(grep -E '^test result' $L/gpu_graphs.log)"
for b in cuda_moe_decode cuda_moe_shared; do
  timeout 150 .dev/k/$b --test-threads=1 --include-ignored --skip nvrtc --skip timing --nocapture > $L/$b.log 2>&1
  echo "[$SECONDS s] $b: $(grep -E '^test result' $L/$b.log)"; grep -E "panicked|FAILED" $L/$b.log | head -5
done
grep -E "80b (fp8|bf16).*t=1:" $L/cuda_moe_shared.log | cut -c1-300
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 100 $NCU --clock-control none --kernel-name regex:'moe_dir_downa_sh_fp8' --launch-skip 2 --launch-count 1 --section SpeedOfLight --section SourceCounters --section WarpStateStats \
  .dev/k/cuda_moe_shared moe_shared_80b_fp8 --include-ignored --exact --nocapture > $L/ncu_fp8.txt 2>&1
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|excessive" $L/ncu_fp8.txt | head
one() { timeout 40 $P bench "$@" --prefill 16 --batch 1 --context 128 --steps 32; }
for rep in 1 2; do
  timeout 60 $P bench $G --prefill 16 --batch 1,2,4 --context 128 --steps 32 > $L/bf16_$rep.log 2>&1; echo "[$SECONDS s] bf16: $(step $L/bf16_$rep.log)"
  timeout 60 $P bench $F --prefill 16 --batch 1,2,4 --context 128 --steps 32 > $L/fp8_$rep.log 2>&1; echo "[$SECONDS s] fp8: $(step $L/fp8_$rep.log)"
done
PORTER_KNOCKOUT=moe_dir_down one $F > $L/ko_fp8_down.log 2>&1; echo "[$SECONDS s] fp8 -down: $(step $L/ko_fp8_down.log)"
PORTER_KNOCKOUT=moe_dir_down one $G > $L/ko_bf16_down.log 2>&1; echo "[$SECONDS s] bf16 -down: $(step $L/ko_bf16_down.log)"
timeout 120 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/issue_bf16.log 2>&1
echo "[$SECONDS s] issue bf16: $(step $L/issue_bf16.log)"; grep -E "host issue|roofline" $L/issue_bf16.log | head -8
timeout 150 $P bench $F --prefill 4096 --batch 1,8,16,32,64,128 --context 128 --steps 32 > $L/issue_fp8.log 2>&1
echo "[$SECONDS s] issue fp8: $(step $L/issue_fp8.log)"; grep -E "roofline|in use|after load" $L/issue_fp8.log | head -10
timeout 90 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1
echo "[$SECONDS s] mtp:"; grep -E "forced|baseline" $L/mtp.log | cut -c1-200
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | sort | uniq -c | head
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
