#!/usr/bin/env bash
# Session 13, third GPU call: loads before the PDL wait (direct down kernel's L2 prefetch,
# the recurrent delta rule's state, conv + gates' tables and weights), the call-2 defaults
# (direct routed experts with the legacy down kernel, FP8 GEMV fma for one row of a large
# weight), and the helper's bf16 GEMV with its first weight loads before the wait (gemvw) and
# the norms' gamma / residual preload. Parity of the touched kernels, the suites, A/B runs.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin/gpu, .dev/bin/gpu_graphs, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "kernel cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 400 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
K=.dev/k
t gpu timeout 60 .dev/bin/gpu $T
t gpu_graphs timeout 30 .dev/bin/gpu_graphs $T
t gdn_seq timeout 50 $K/cuda_gdn_seq $T --skip timed --skip speed
t gemv_par timeout 40 $K/cuda_gemv $T gemv_kinds norm_preload
t gemv_timed timeout 40 $K/cuda_gemv $T decode_gemv_norm_timed
t moe_par timeout 40 $K/cuda_moe_decode $T moe_decode_small moe_decode_80b --skip timing
t moe_small timeout 40 $K/cuda_moe_decode $T moe_decode_small_t_timing
t dec timeout 40 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t dec_stream timeout 30 env PORTER_MOE_DOWN=stream $P bench $G --prefill 16 --batch 1 --context 128 --steps 32
t dec_block timeout 30 env PORTER_GEMV=block PORTER_NORM_PRELOAD=off $P bench $G --prefill 16 --batch 1,8 --context 128 --steps 32
t dec_nopdl timeout 30 env PORTER_PDL=off $P bench $G --prefill 16 --batch 1,8 --context 128 --steps 32
t fp8_48 timeout 40 $P bench $F --prefill 16 --batch 1,8,64 --context 128 --steps 32
t fp8_stream timeout 30 env PORTER_MOE_DOWN=stream $P bench $F --prefill 16 --batch 1 --context 128 --steps 32
t ncu_b1 timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $P bench --device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2 --batch 1
t ncu_fp8 timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $P bench --device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8 --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2 --batch 1
t mtp timeout 25 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in dec dec_stream dec_block dec_nopdl fp8_48 fp8_stream mtp; do echo "== $f"; grep -vE "^  (profile|CUDA graph)" "$L/$f.log" | grep -E "prefill|decode|mtp|rror" | head -10; done
grep -E "summary|^  t=" $L/moe_small.log | head -40
grep -iE "µs|us |TB/s" $L/gemv_timed.log | tail -30
python3 scripts/ncu_step.py --layers 4 $L/ncu_b1.log > $L/ncu_b1_step.txt 2>&1; head -30 $L/ncu_b1_step.txt
python3 scripts/ncu_step.py --layers 4 $L/ncu_fp8.log > $L/ncu_fp8_step.txt 2>&1; head -30 $L/ncu_fp8_step.txt
tar czf $OUT/logs.tgz -C $OUT logs
