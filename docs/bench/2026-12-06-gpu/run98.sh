#!/usr/bin/env bash
# Session 24, GPU call 9 (H100): the batch-1 step of the final tree by knock-in (as session
# 23's run88.sh: each matching launch issued twice, the step's rise its cost in place), bf16
# and FP8, 24 layers, with this session's launch names (qk_prep; gdn_delta_seq with the norm).
# Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1 --context 128 --steps 64"
one() { # label, model flags, rule
    local s; s=$(env PORTER_KNOCKIN=$3 timeout 60 $P bench $2 $B 2>&1 | grep -E '^decode batch' | sed -E 's/.*\(([0-9.]+) ms\/step.*/\1/')
    echo "$1 $3 $s"
}
PORTER_LAUNCH_TRACE=400 timeout 60 $P bench $G $B > $OUT/trace_bf16.txt 2>&1
for k in NONE add_rms_norm_f32y add_rms_norm_bf16_bf16 rms_norm gemv_bf16_bf16_m1@1544 gdn_conv_gates gdn_delta_seq \
    gemv_bf16_bf16_m1@1024 gemv_bf16_f32_m1@772 moe_router_warp moe_dir_gu_sh moe_dir_downa_sh gemv_bf16_bf16_m1@2048 \
    gemv_bf16_bf16_m1@256 qk_prep kv_append attention_decode sigmoid_gate_mul gemv_bf16_f32_m1@18992 NONE; do
    one bf16 "$G" $k
done
for k in NONE gdn_delta_seq qk_prep moe_router_warp fp8_gemvx gemv_bf16_bf16_m1@32 fp8_gemvt_bf16_f32@64 moe_dir_gu_sh_fp8 moe_dir_downa_sh_fp8 NONE; do
    one fp8 "$G --quantize fp8" $k
done
echo "[$SECONDS s] done"
