#!/usr/bin/env bash
# Session 26, GPU call 3 (H100): the device timeline (PORTER_TIMELINE: every launch's PDL wait
# time stamped by %globaltimer in block 0, so consecutive stamps are each launch's cost on the
# critical path). First the parity suites and an A/B of the batch-1 step against session 25's
# binary (the stamp's check is in every kernel's prologue); then the timelines of the graphed
# batch-1 step: bf16 and FP8 (24 layers, context 128), bf16 at 32k context, bf16 batch 8.
# Carry .dev/porter (porter.gz: this tree; porter_s25.gz: session 25's), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
gunzip -c .dev/porter/porter_s25.gz > /tmp/porter_old && chmod +x /tmp/porter_old
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in gpu_graphs gpu; do
    timeout 150 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
grep -hE "panicked" $L/*.log | head -4
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1 --context 128 --steps 64"
for r in 1 2; do
  for p in old new; do
    for q in "" "--quantize fp8"; do
      s=$(timeout 60 /tmp/porter_$p bench $G $q $B 2>&1 | grep -E '^decode batch' | sed -E 's/.*: +([0-9.]+) tok.*\(([0-9.]+) ms.*/\1 tok\/s \2 ms/')
      echo "ab round $r $p ${q:-bf16}: $s"
    done
  done
done
tl() { # label, flags
  PORTER_TIMELINE=1 timeout 90 /tmp/porter_new bench $2 > $L/tl_$1.log 2>&1; echo "[$SECONDS s] timeline $1 rc=$?"
  grep -E "^decode batch|timeline:|timeline by kernel" $L/tl_$1.log | head -40
}
tl bf16 "$G $B"
tl fp8 "$G --quantize fp8 $B"
tl bf16_32k "$G --prefill 16 --batch 1 --context 32768 --steps 32"
tl bf16_b8 "$G --prefill 16 --batch 8 --context 128 --steps 32"
cp $L/tl_*.log $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
