#!/usr/bin/env bash
# Session 24, GPU call 3 (H100): the gated norm inside the delta rule's launch (3a395cf) and
# the fixed fused-router down form (cuda_moe_route). Parity: cuda_gdn_seq (the delta rule with
# the norm taken in, bit for bit against gdn_delta_seq + gated_norm_z, over decode, verify,
# snapshot and refused spans), cuda_moe_route, cuda_qk_prep, cuda_router, gpu_graphs, gpu, and
# gpu with the fallback paths forced. Then the A/B in the model (24 layers, bf16 and FP8):
# default against PORTER_GDN_NORM=apart and PORTER_GDN_FUSED=on.
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in cuda_gdn_seq cuda_moe_route cuda_qk_prep cuda_router gpu_graphs gpu; do
    timeout 150 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
PORTER_CUDA_FALLBACK=1 timeout 150 .dev/k/gpu $T > $L/gpu_fallback.log 2>&1; echo "[$SECONDS s] gpu (fallback forced) rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
grep -E "panicked|differ" $L/*.log | head -10
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1,8,64 --context 128 --steps 32"
one() { # label, env, model flags, bench flags
    env $2 timeout 90 $P bench $3 $4 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($2) rc=$?"
    grep -E "^decode batch" $L/$1.log | sed -E 's/ +/ /g'
}
one bf16 X=1 "$G" "$B"
one bf16_norm_apart PORTER_GDN_NORM=apart "$G" "$B"
one bf16_gdn_fused PORTER_GDN_FUSED=on "$G" "$B"
one bf16_2 X=1 "$G" "$B"
one bf16_norm_apart_2 PORTER_GDN_NORM=apart "$G" "$B"
F="$G --quantize fp8"; B1="--prefill 16 --batch 1 --context 128 --steps 64"
one fp8 X=1 "$F" "$B1"
one fp8_norm_apart PORTER_GDN_NORM=apart "$F" "$B1"
one fp8_2 X=1 "$F" "$B1"
one mtp X=1 "$G" "--prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3"
grep -E "^mtp (baseline|k=3)" $L/mtp.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
