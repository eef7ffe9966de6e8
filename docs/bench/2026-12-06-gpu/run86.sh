#!/usr/bin/env bash
# Session 23, GPU call 2 (H100): what the FP8 model's extra decode launches cost in place, by
# knock-in (each matching launch issued twice; kernels/src/cuda/knockout.rs): the router, the
# MoE input GEMV (bf16 rows: router + shared gate, n = 513 → grid 257 at split 4), the FP8
# shared gate/up GEMV, the bf16 in_proj_ba GEMV (n = 64 → grid 32). 24 layers (fits 80 GB).
# Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="$G --quantize fp8"
B="--prefill 16 --batch 1 --context 128 --steps 32"
PORTER_LAUNCH_TRACE=3000 timeout 60 $P bench $F --prefill 16 --batch 1 --context 128 --steps 2 --enforce-eager > $L/trace_fp8.log 2>&1
echo "[$SECONDS s] trace rc=$?"
run() { # label, env..., then the model flags
    local label=$1; shift
    env "$@" timeout 60 $P bench $MODEL $B > $L/$label.log 2>&1
    echo "[$SECONDS s] $label: $(grep -E '^decode batch' $L/$label.log)"
}
MODEL=$F
run fp8_base X=1
run fp8_router PORTER_KNOCKIN=moe_router_warp
run fp8_input PORTER_KNOCKIN=gemv_bf16_f32_m1@257
run fp8_shared PORTER_KNOCKIN=fp8_gemvx_bf16_f32_m1
run fp8_ba PORTER_KNOCKIN=gemv_bf16_bf16_m1@32
run fp8_base2 X=1
MODEL=$G
run bf16_base X=1
run bf16_router PORTER_KNOCKIN=moe_router_warp
run bf16_input PORTER_KNOCKIN=gemv_bf16_f32_m1@386
run bf16_base2 X=1
echo "[$SECONDS s] done"
