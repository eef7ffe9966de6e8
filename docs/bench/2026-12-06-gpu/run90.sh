#!/usr/bin/env bash
# Session 24, GPU call 1 (H100): the router's order-key selection (ecbf780) and the one-launch
# q / k preparation (37034f4). Parity first (cuda_router incl. NaN rows, cuda_moe_route: the
# fused router bit for bit, cuda_qk_prep: bit for bit against the six launches, gpu_graphs,
# gpu), then the A/B in the model: session 23's porter (porter_old) against this one, and this
# one with PORTER_QK_PREP=apart, bf16 and FP8, 24 layers; the router's knock-in.
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
P=/tmp/porter_new
gunzip -c .dev/porter/porter_old.gz > /tmp/porter_old && chmod +x /tmp/porter_old
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in cuda_router cuda_moe_route cuda_qk_prep gpu_graphs gpu; do
    timeout 120 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
grep -E "router \[1|bit for bit" $L/cuda_router.log $L/cuda_qk_prep.log | head -30
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1,8,64 --context 128 --steps 32"
one() { # label, binary, env, model flags, bench flags
    env $3 timeout 90 $2 bench $4 $5 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($3) rc=$?"
    grep -E "^decode batch" $L/$1.log | sed -E 's/ +/ /g'
}
one old_bf16 /tmp/porter_old X=1 "$G" "$B"
one new_bf16 $P X=1 "$G" "$B"
one new_bf16_apart $P PORTER_QK_PREP=apart "$G" "$B"
one old_bf16_2 /tmp/porter_old X=1 "$G" "$B"
one new_bf16_2 $P X=1 "$G" "$B"
F="$G --quantize fp8"; B1="--prefill 16 --batch 1 --context 128 --steps 64"
one old_fp8 /tmp/porter_old X=1 "$F" "$B1"
one new_fp8 $P X=1 "$F" "$B1"
one old_knockin_router /tmp/porter_old PORTER_KNOCKIN=moe_router_warp "$G" "$B1"
one new_knockin_router $P PORTER_KNOCKIN=moe_router_warp "$G" "$B1"
one new_b1 $P X=1 "$G" "$B1"
one old_b1 /tmp/porter_old X=1 "$G" "$B1"
echo "[$SECONDS s] done"
