#!/usr/bin/env bash
# Session 17, call 2: the in-flight direct down kernel (moe_dir_downa_*: every weight load of a
# warp issued before its PDL wait). Suites (gpu, gpu_graphs) and the MoE decode kernel tests with
# it on (the default); the 80B kernel timings on / off; the model benches on / off (bf16 24
# layers, FP8 48 layers, batch 1 / 2 / 4, MTP K = 3); its cost in place by knockout.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
T="--test-threads=1 --skip bench_"
step() { grep -E 'decode batch|MTP|mtp' "$1" | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' '; }
timeout 150 .dev/bin/gpu $T --include-ignored > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu: $(grep -E '^test result' $L/gpu.log)"
timeout 60 .dev/bin/gpu_graphs $T --include-ignored > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs: $(grep -E '^test result' $L/gpu_graphs.log)"
for b in cuda_moe_decode cuda_moe_shared; do
  timeout 150 .dev/k/$b --test-threads=1 --include-ignored --skip nvrtc --nocapture > $L/$b.log 2>&1
  echo "[$SECONDS s] $b: $(grep -E '^test result' $L/$b.log)"; grep -E "panicked|FAILED" $L/$b.log | head -5
done
for t in moe_shared_80b_bf16 moe_shared_80b_fp8; do
  PORTER_MOE_DOWNA=off timeout 100 .dev/k/cuda_moe_shared $t --include-ignored --exact --nocapture > $L/${t}_off.log 2>&1
  echo "[$SECONDS s] $t off: $(grep -E '^test result' $L/${t}_off.log)"
done
b1() { timeout 60 $P bench "$@" --prefill 16 --batch 1,2,4 --context 128 --steps 32; }
for rep in 1 2; do
  for v in on off; do
    PORTER_MOE_DOWNA=$v b1 $G > $L/bf16_$v$rep.log 2>&1; echo "[$SECONDS s] bf16 downa $v: $(step $L/bf16_$v$rep.log)"
    PORTER_MOE_DOWNA=$v b1 $F > $L/fp8_$v$rep.log 2>&1; echo "[$SECONDS s] fp8 downa $v: $(step $L/fp8_$v$rep.log)"
  done
done
for v in on off; do
  PORTER_MOE_DOWNA=$v timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$v.log 2>&1
  echo "[$SECONDS s] mtp downa $v: $(grep -iE 'mtp|oracle|speedup|×' $L/mtp_$v.log | tr -s ' ' | tr '\n' ' ' | cut -c1-400)"
done
for m in bf16 fp8; do
  A=$G; [ $m = fp8 ] && A=$F
  PORTER_KNOCKOUT=moe_dir_down timeout 40 $P bench $A --prefill 16 --batch 1 --context 128 --steps 32 > $L/ko_${m}_down.log 2>&1
  echo "[$SECONDS s] $m -moe_dir_down(a): $(step $L/ko_${m}_down.log)"
done
# Decode attention at short contexts: 2 blocks (one split of the 128 keys per KV head); smaller
# splits (PORTER_ATTN_DECODE_MIN_KEYS) spread the keys over more blocks, plus a combine.
for mk in 256 64 32; do
  for ctx in 128 4096; do
    PORTER_ATTN_DECODE_MIN_KEYS=$mk timeout 40 $P bench $G --prefill 16 --batch 1 --context $ctx --steps 32 > $L/attn_mk${mk}_$ctx.log 2>&1
    echo "[$SECONDS s] min keys $mk, context $ctx: $(step $L/attn_mk${mk}_$ctx.log)"
  done
done
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | sort | uniq -c | head
echo "[$SECONDS s] done"
