#!/usr/bin/env bash
# Session 24, GPU call 5 (H100): this session's tree after the output-gate revert (d064303).
# Parity (gpu_graphs, gpu, gpu with the fallback paths forced, the kernel tests this session
# touched); the issue's bench command's rows on this card (24 layers bf16: prefill 4k, decode
# batch 1 / 8 / 64), FP8 24 layers, MTP K = 3; the opt-in fused router again (now with the
# order-key selection; with it the down kernel is no longer the in-flight one); the batch-1
# step by knock-in for the launches this session changed.
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in gpu_graphs gpu cuda_gdn_seq cuda_moe_route cuda_qk_prep cuda_router; do
    timeout 100 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
PORTER_CUDA_FALLBACK=1 timeout 100 .dev/k/gpu $T > $L/gpu_fallback.log 2>&1; echo "[$SECONDS s] gpu (fallback forced) rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
one() { # label, env, model flags, bench flags
    env $2 timeout 90 $P bench $3 $4 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($2) rc=$?"
    grep -E "^(prefill|decode batch)|host issue" $L/$1.log | sed -E 's/ +/ /g'
}
one issue X=1 "$G" "--prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32"
one fp8 X=1 "$G --quantize fp8" "--prefill 4096 --batch 1,8,64 --context 128 --steps 32"
B1="--prefill 16 --batch 1,8 --context 128 --steps 64"
one router_fused PORTER_MOE_ROUTER=fused "$G" "$B1"
one router_apart X=1 "$G" "$B1"
one router_fused_fp8 PORTER_MOE_ROUTER=fused "$G --quantize fp8" "$B1"
one router_apart_fp8 X=1 "$G --quantize fp8" "$B1"
one mtp X=1 "$G" "--prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3"
grep -E "^mtp (baseline|k=)" $L/mtp.log
B="--prefill 16 --batch 1 --context 128 --steps 64"
kin() { # label, knock-in rule, model flags
    local s; s=$(env PORTER_KNOCKIN=$2 timeout 60 $P bench $3 $B 2>&1 | grep -E '^decode batch' | sed -E 's/.*\(([0-9.]+) ms\/step.*/\1/')
    echo "knockin $1 $2 $s"
}
for k in X moe_router_warp qk_prep gdn_delta_seq gdn_conv_gates kv_append attention_decode sigmoid_gate_mul add_rms_norm X; do
    if [ $k = X ]; then kin bf16 NONE_MATCHES "$G"; else kin bf16 $k "$G"; fi
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
