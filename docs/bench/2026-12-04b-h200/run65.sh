#!/usr/bin/env bash
# Session 17, call 6 (call 5's binaries): (1) the one-launch Gated DeltaNet decode step
# (PORTER_GDN_FUSED=on, session 15) against the three launches, in whole steps and in place
# (knockouts); (2) the routed + shared experts in place at batch 1 (gate+up knockout with this
# binary, beside call 5's down); (3) FP8 batch 384 alone in a process, reach 5 and 8; (4) decode
# at 32k context, batch 1 and 8 (the paged attention in the model).
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
step() { grep -E 'decode batch' "$1" | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' '; }
one() { timeout 40 $P bench "$@" --prefill 16 --batch 1 --context 128 --steps 32; }
for m in bf16 fp8; do
  A=$G; [ $m = fp8 ] && A=$F
  one $A > $L/${m}_base.log 2>&1; echo "[$SECONDS s] $m base: $(step $L/${m}_base.log)"
  PORTER_KNOCKOUT=gdn_delta_seq,gdn_conv_gates,gated_norm_z one $A > $L/${m}_ko3.log 2>&1; echo "[$SECONDS s] $m -3 gdn: $(step $L/${m}_ko3.log)"
  PORTER_GDN_FUSED=on one $A > $L/${m}_fused.log 2>&1; echo "[$SECONDS s] $m fused: $(step $L/${m}_fused.log)"
  PORTER_GDN_FUSED=on PORTER_KNOCKOUT=gdn_fused one $A > $L/${m}_kof.log 2>&1; echo "[$SECONDS s] $m fused -fused: $(step $L/${m}_kof.log)"
  PORTER_KNOCKOUT=moe_dir_gu one $A > $L/${m}_kogu.log 2>&1; echo "[$SECONDS s] $m -gu: $(step $L/${m}_kogu.log)"
  PORTER_KNOCKOUT=moe_dir_gu,moe_dir_down one $A > $L/${m}_komoe.log 2>&1; echo "[$SECONDS s] $m -gu -down: $(step $L/${m}_komoe.log)"
done
grep -h "launch gdn_fused\|gdn_fused" $L/*fused*.log | head -3
for v in 5 8; do
  PORTER_MOE_DECODE_PER_EXPERT=$v timeout 60 $P bench $F --prefill 16 --batch 384 --context 128 --steps 16 > $L/fp8_384_pe$v.log 2>&1
  echo "[$SECONDS s] fp8 b384 reach $v: $(step $L/fp8_384_pe$v.log) $(grep -E 'error' $L/fp8_384_pe$v.log | head -1)"
done
timeout 90 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16 > $L/ctx32k.log 2>&1
echo "[$SECONDS s] 32k: $(step $L/ctx32k.log)"; grep -E "roofline" $L/ctx32k.log
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | sort | uniq -c | head
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
