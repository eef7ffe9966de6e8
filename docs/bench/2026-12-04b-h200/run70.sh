#!/usr/bin/env bash
# Session 17, call 11: the review's refactors (row readers' dot_acc through dot_side, the launch
# count of the diagnostics, the on/off switch helper): suites and the MoE kernel parity (every
# form bit for bit against v1), and the diagnostics once each.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
T="--test-threads=1 --skip bench_"
step() { grep -E 'decode batch' "$1" | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' '; }
timeout 150 .dev/bin/gpu $T --include-ignored > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu: $(grep -E '^test result' $L/gpu.log)"
timeout 60 .dev/bin/gpu_graphs $T --include-ignored > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs: $(grep -E '^test result' $L/gpu_graphs.log)"
for b in cuda_moe_decode cuda_moe_shared; do
  timeout 150 .dev/k/$b --test-threads=1 --include-ignored --skip nvrtc --skip timing --nocapture > $L/$b.log 2>&1
  echo "[$SECONDS s] $b: $(grep -E '^test result' $L/$b.log)"; grep -E "panicked|FAILED" $L/$b.log | head -5
done
one() { timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 32; }
one > $L/base.log 2>&1; echo "[$SECONDS s] base: $(step $L/base.log)"
PORTER_KNOCKOUT=moe_dir_down one > $L/ko.log 2>&1; echo "[$SECONDS s] -down: $(step $L/ko.log)"
PORTER_KNOCKIN=moe_router_warp_f32 one > $L/ki.log 2>&1; echo "[$SECONDS s] +router: $(step $L/ki.log)"
PORTER_GDN_FUSED=maybe one > $L/bad.log 2>&1; echo "[$SECONDS s] PORTER_GDN_FUSED=maybe: $(step $L/bad.log) $(grep -m1 warning $L/bad.log)"
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | sort | uniq -c | head
echo "[$SECONDS s] done"
