#!/usr/bin/env bash
# Session 26, GPU call 4: the timeline as a build of its own (the normal build carries none of
# it), and the FP8 FMA GEMV's first weight batch loaded before the PDL wait. Parity (cuda_fp8,
# gpu, gpu_graphs), the batch-1 A/B against session 25's binary, the timelines of the batch-1
# step, the GPU-speed issue's bench command and the FP8 rows.
# Carry .dev/porter (porter.gz: this tree; porter_s25.gz: session 25's), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
gunzip -c .dev/porter/porter_s25.gz > /tmp/porter_old && chmod +x /tmp/porter_old
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in cuda_fp8 gpu_graphs gpu; do
    timeout 200 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
grep -hE "panicked|FAILED" $L/*.log | head -6
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1 --context 128 --steps 64"
for r in 1 2; do
  for p in old new; do
    for q in "" "--quantize fp8"; do
      s=$(timeout 90 /tmp/porter_$p bench $G $q $B 2>&1 | grep -E '^decode batch' | sed -E 's/.*: +([0-9.]+) tok.*\(([0-9.]+) ms.*/\1 tok\/s \2 ms/')
      echo "ab round $r $p ${q:-bf16}: $s"
    done
  done
done
tl() { # label, flags
  PORTER_TIMELINE=1 timeout 120 /tmp/porter_new bench $2 > $OUT/tl_$1.log 2>&1; echo "[$SECONDS s] timeline $1 rc=$?"
  grep -E "^decode batch|timeline:|timeline by kernel" $OUT/tl_$1.log | head -24
}
tl fp8 "$G --quantize fp8 $B"
tl bf16 "$G $B"
timeout 150 /tmp/porter_new bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bench.log 2>&1; echo "[$SECONDS s] bench G rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bench.log
timeout 150 /tmp/porter_new bench $G --quantize fp8 --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8.log 2>&1; echo "[$SECONDS s] bench FP8 rc=$?"
grep -E "^(prefill|decode)" $L/fp8.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
