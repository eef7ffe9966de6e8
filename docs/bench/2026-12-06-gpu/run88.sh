#!/usr/bin/env bash
# Session 23, GPU call 5 (H100): the whole batch-1 decode step by knock-in, every launch type of
# a graphed step (each matching launch issued twice; the step's rise is its cost in place),
# bf16 and FP8, 24 layers (the trace's names and grids: s23call2/knockin2.txt). Kernels that
# are not idempotent (residual adds, the recurrent state, the conv window) compute garbage
# the second time; their timing still holds, and the routed experts' may move (other ids).
# Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1 --context 128 --steps 64"
one() { # label, model flags, env assignment
    local s; s=$(env $3 timeout 60 $P bench $2 $B 2>&1 | grep -E '^decode batch' | sed -E 's/.*\(([0-9.]+) ms\/step.*/\1/')
    echo "$1 $3 $s"
}
for k in X=1 add_rms_norm_f32y add_rms_norm_bf16_bf16 rms_norm_f32_bf16 rms_norm_bf16_bf16 gemv_bf16_bf16_m1@1544 \
    gdn_conv_gates gdn_delta_seq gated_norm_z gemv_bf16_bf16_m1@1024 gemv_bf16_f32_m1@772 moe_router_warp \
    moe_dir_gu_sh moe_dir_downa_sh gemv_bf16_bf16_m1@2048 copy_cols gemv_bf16_bf16_m1@256 rope_neox kv_append \
    attention_decode sigmoid_gate_mul gemv_bf16_f32_m1@18992 embedding X=1; do
    [ "$k" = X=1 ] && one bf16 "$G" X=1 || one bf16 "$G" PORTER_KNOCKIN=$k
done
for k in X=1 add_rms_norm_f32y add_rms_norm_bf16_bf16 fp8_gemvx_bf16_bf16_m1_r4@384 gemv_bf16_bf16_m1@32 \
    gdn_conv_gates gdn_delta_seq gated_norm_z fp8_gemvt_bf16_bf16@128 gemv_bf16_f32_m1@260 fp8_gemvt_bf16_f32@64 \
    moe_router_warp moe_dir_gu_sh_fp8 moe_dir_downa_sh_fp8 fp8_gemvx_bf16_bf16_m1_r4@256 fp8_gemvt_bf16_bf16@32 \
    attention_decode gemv_bf16_f32_m1@18992 X=1; do
    [ "$k" = X=1 ] && one fp8 "$G --quantize fp8" X=1 || one fp8 "$G --quantize fp8" PORTER_KNOCKIN=$k
done
echo "[$SECONDS s] done"
