#!/usr/bin/env bash
# Session 13, first GPU call: main with programmatic dependent launch (PDL) on every kernel
# and cubins in the staged kernel cache (no driver JIT). Checks: the model suite and graphs
# with PDL on (default), the routed-expert / FP8 kernel parity after session 12's last
# refactor, then decode A/B PDL on vs off (24-layer bf16, 48-layer FP8), prefill, and an
# Nsight Compute per-kernel step of 4 layers at batch 1.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin/{gpu,gpu_graphs,cuda_moe_mma,cuda_fp8}.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "kernel cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 420 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t dec_pdl timeout 60 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t dec_nopdl timeout 45 env PORTER_PDL=off $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t gpu timeout 100 .dev/bin/gpu $T
t gpu_graphs timeout 40 .dev/bin/gpu_graphs $T
t moe_mma timeout 40 .dev/bin/cuda_moe_mma $T --skip speed
t fp8 timeout 60 .dev/bin/cuda_fp8 $T --skip speed --skip timed
t fp8_pdl timeout 40 $P bench $F --prefill 16 --batch 1,8,64 --context 128 --steps 32
t fp8_nopdl timeout 40 env PORTER_PDL=off $P bench $F --prefill 16 --batch 1,8,64 --context 128 --steps 32
t prefill timeout 40 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
t ncu_b1 timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $P bench --device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2 --batch 1
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in dec_pdl dec_nopdl fp8_pdl fp8_nopdl prefill; do echo "== $f"; grep -vE "^  (profile|CUDA graph)" "$L/$f.log" | grep -E "prefill|decode|host|rror" | head -10; done
[ -f scripts/ncu_step.py ] && python3 scripts/ncu_step.py --layers 4 $L/ncu_b1.log > $L/ncu_b1_step.txt 2>&1; tail -50 $L/ncu_b1_step.txt
tar czf $OUT/logs.tgz -C $OUT logs
