#!/usr/bin/env bash
# Session 31, GPU call 1: the direct MoE decode form in one launch (MoeGemv::DirectOne,
# PORTER_MOE_ONE=on: gate+up, then the in-flight down kernel's loads, a grid barrier, the down
# dots). Parity first (every decode form bit for bit, the shared-expert forms, the model suites
# with it on), then the model A/B at batch 1 (and FP8 batch 4) against the two launches, the
# kernel timing, and a device timeline with it on. Every step is skipped once the script has
# run 330 s.
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
L=$OUT/logs; mkdir -p $L
ok() { [ $SECONDS -lt 330 ] || { echo "[$SECONDS s] out of time: skipped $*"; return 1; }; }
t() { local name=$1 to=$2; shift 2; ok $name || return; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
t dec_small 60 .dev/k/cuda_moe_decode $T --exact moe_decode_small_bf16 moe_decode_small_f16 moe_decode_small_f32
t shared 60 .dev/k/cuda_moe_shared $T --exact moe_shared_small_bf16 moe_shared_small_f16 moe_shared_small_f32 moe_shared_fp8
t gpu_one 90 env PORTER_MOE_ONE=on .dev/k/gpu $T
t graphs_one 60 env PORTER_MOE_ONE=on .dev/k/gpu_graphs $T
grep -hE "panicked|FAILED" $L/*.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
b() { local q=$1 bs=$2; shift 2; ok bench || return; timeout 45 env "$@" $P bench $G $q --prefill 16 --batch $bs --context 128 --steps 64 2>&1 | grep -E '^decode batch' | sed -E 's/.*batch +([0-9]+): +([0-9.]+) tok.*\(([0-9.]+) ms.*/b\1 \2 tok\/s \3 ms/' | tr '\n' ' '; }
for r in 1 2; do
  echo "[$SECONDS s] r$r bf16 two launches: $(b "" 1 PORTER_MOE_ONE=off)"
  echo "[$SECONDS s] r$r bf16 one launch:   $(b "" 1 PORTER_MOE_ONE=on)"
  echo "[$SECONDS s] r$r fp8 two launches:  $(b "--quantize fp8" 1,4 PORTER_MOE_ONE=off)"
  echo "[$SECONDS s] r$r fp8 one launch:    $(b "--quantize fp8" 1,4 PORTER_MOE_ONE=on)"
done
t timing 90 .dev/k/cuda_moe_decode $T --exact moe_decode_small_t_timing
grep -E "^\| *t|^ *t =|DirectOne|Direct " $L/timing.log | head -30
if ok timeline; then
  PORTER_MOE_ONE=on PORTER_TIMELINE=1 timeout 60 $P bench $G --quantize fp8 --prefill 16 --batch 1 --context 128 --steps 64 > $L/tl_fp8_one.log 2>&1
  echo "[$SECONDS s] timeline rc=$?"; grep -E "moe_dir|router|step" $L/tl_fp8_one.log | head -12
fi
t dec_80b_fp8 120 .dev/k/cuda_moe_decode $T --exact moe_decode_80b_fp8
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
