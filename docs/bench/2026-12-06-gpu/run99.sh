#!/usr/bin/env bash
# Session 24, GPU call 10 (H100): the router in the last block of the MoE input GEMV again
# (PORTER_MOE_ROUTER=gemv, re-applied with this session's order-key selection) against the
# separate router launch; parity (cuda_router incl. cuda_gemv_route, gpu with it on and off,
# gpu_graphs with it on, cuda_gdn_seq after its test's refactor).
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in cuda_router cuda_gdn_seq gpu gpu_graphs; do
    timeout 100 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
PORTER_MOE_ROUTER=gemv timeout 100 .dev/k/gpu $T > $L/gpu_gemv.log 2>&1; echo "[$SECONDS s] gpu (router in the GEMV) rc=$? $(grep -E '^test result' $L/gpu_gemv.log)"
PORTER_MOE_ROUTER=gemv timeout 100 .dev/k/gpu_graphs $T > $L/gpu_graphs_gemv.log 2>&1; echo "[$SECONDS s] gpu_graphs (router in the GEMV) rc=$? $(grep -E '^test result' $L/gpu_graphs_gemv.log)"
grep -E "panicked|gemv_route" $L/*.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1,2,4 --context 128 --steps 64"
one() { # label, env, model flags, bench flags
    env $2 timeout 90 $P bench $3 $4 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($2) rc=$?"
    grep -E "^decode batch" $L/$1.log | sed -E 's/ +/ /g'
}
for r in 1 2; do
    one apart_$r X=1 "$G" "$B"
    one gemv_$r PORTER_MOE_ROUTER=gemv "$G" "$B"
done
B1="--prefill 16 --batch 1 --context 128 --steps 64"
one fp8_apart X=1 "$G --quantize fp8" "$B1"
one fp8_gemv PORTER_MOE_ROUTER=gemv "$G --quantize fp8" "$B1"
one fp8_apart_2 X=1 "$G --quantize fp8" "$B1"
one fp8_gemv_2 PORTER_MOE_ROUTER=gemv "$G --quantize fp8" "$B1"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
