#!/usr/bin/env bash
# Session 9, third GPU call (call 2 lost to an NVRTC error in the new norm kernels, since
# fixed): the fused norm + GEMV kernels, every model on CUDA (the norm fusion and the deferred
# residual add in core), the benches with A/B knobs, the helpers' mma.sync prefill attention /
# MoE GEMM timings and the MoE decode kernels. Carry .dev (porter, bin).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 470 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
# The first process compiles every module (NVRTC, ~1 min); the others read the PTX cache.
t bf16_24 timeout 150 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
t bf16_apart timeout 30 env PORTER_NORM_GEMV=apart $P bench $G --prefill 16 --batch 1,8 --context 128 --steps 32
t pf_mma timeout 30 env PORTER_ATTN_TC=mma $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 4
t pf_mma2 timeout 30 env PORTER_ATTN_TC=mma2 $P bench $G --prefill 4096 --batch 1 --context 128 --steps 4
t pf_wmma timeout 30 env PORTER_MOE_GEMM=wmma $P bench $G --prefill 4096 --batch 1 --context 128 --steps 4
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 60 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --json "$L/fp8_48.json"
t k_norm_gemv timeout 60 .dev/bin/cuda_norm_gemv $T
t gpu timeout 150 .dev/bin/gpu $T
t gpu_graphs timeout 40 .dev/bin/gpu_graphs $T
t k_moe_dec timeout 90 .dev/bin/cuda_moe_decode $T --skip nvrtc
t k_moe_sh timeout 60 .dev/bin/cuda_moe_shared $T --skip nvrtc
t k_attn_mma timeout 100 .dev/bin/cuda_attention_mma $T attention_mma_vs_wmma_timing
t k_moe timeout 40 .dev/bin/cuda_moe $T moe_80b_forms_timed moe_80b_bf16
t mtp_24 timeout 30 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
grep -hE "TIME|TFLOP|GB/s" $L/k_norm_gemv.log $L/k_attn_mma.log $L/k_moe.log $L/k_moe_dec.log $L/k_moe_sh.log | head -60
for f in bf16_24 bf16_apart pf_mma pf_mma2 pf_wmma fp8_48 mtp_24; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|roofline|host|×" | head -14; done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
