#!/usr/bin/env bash
# Session 13, second GPU call: main with the helpers' kernels merged (down-L2 direct routed
# experts, tensor-core FP8 GEMV, padded MoE input GEMM, warp-per-row gated norm) and the
# one-warp router. Parity and timing tests of each, the model suite, then the benches.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin/gpu, .dev/k (kernel test binaries).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "kernel cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 440 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
K=.dev/k
t gpu timeout 60 .dev/bin/gpu $T
t router timeout 20 $K/cuda_router $T cuda_moe_router
t gnorm timeout 30 $K/cuda_kernels $T cuda_gated_norm_z
t glue timeout 40 $K/cuda_glue_timed $T
t moe_small timeout 60 $K/cuda_moe_decode $T moe_decode_small_t_timing
t moe_par timeout 60 $K/cuda_moe_decode $T moe_decode_small moe_decode_80b --skip timing
t fp8_gemv timeout 60 $K/cuda_fp8 $T fp8_gemv_bf16 fp8_gemv_f16 fp8_gemv_f32
t fp8_speed timeout 50 $K/cuda_fp8 $T fp8_gemv_tc_speed
t dec timeout 45 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t fp8_48 timeout 45 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32
t prefill timeout 40 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
t norm_gemv timeout 40 $K/cuda_norm_gemv $T norm_fp8_gemv_all
t moe_fp8 timeout 60 $K/cuda_fp8 $T moe_fp8 --skip speed
t shared timeout 40 $K/cuda_moe_shared $T
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in dec fp8_48 prefill; do echo "== $f"; grep -vE "^  (profile|CUDA graph)" "$L/$f.log" | grep -E "prefill|decode|rror" | head -10; done
for f in moe_small fp8_speed glue; do echo "== $f"; grep -iE "µs|us |TB/s|GB/s" "$L/$f.log" | tail -40; done
tar czf $OUT/logs.tgz -C $OUT logs
