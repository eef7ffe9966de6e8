#!/usr/bin/env bash
# Session 13, last GPU call: main with this session's final defaults (PDL with loads before
# the wait, one-warp router, padded MoE input GEMM, warp-per-row gated norm, tensor-core FP8
# GEMV but for one row of a large weight, norms' gamma / residual preload; the block GEMV and
# the direct routed experts' legacy down kernel kept). The suites (default, graphs, forced
# fallback), then one 24-layer bench of every issue target, FP8 48 layers, MTP, 32k context,
# serving C64. Carry .dev/porter, .dev/ptx.tgz, .dev/bin/gpu, .dev/bin/gpu_graphs.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "kernel cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 420 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t bf16_24 timeout 60 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
t gpu timeout 60 .dev/bin/gpu $T
t gpu_graphs timeout 30 .dev/bin/gpu_graphs $T
t gpu_fallback timeout 90 env PORTER_CUDA_FALLBACK=1 .dev/bin/gpu $T
t fp8_48 timeout 50 $P bench $F --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/fp8_48.json"
t mtp timeout 25 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
t ctx32k timeout 30 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16
t serve_c64 timeout 45 $P bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 --json "$L/serve_c64.json"
t profile_pf timeout 20 env PORTER_PROFILE=1 $P bench $G --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 4
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in bf16_24 fp8_48 mtp ctx32k; do echo "== $f"; grep -vE "^  (profile|CUDA graph)" "$L/$f.log" | grep -E "prefill|decode|mtp k=3|baseline|host|rror" | head -12; done
echo "== serve"; grep -iE "output|TTFT|TPOT" $L/serve_c64.log | head -6
echo "== profile_pf"; grep -E "profile" $L/profile_pf.log | head -10
tar czf $OUT/logs.tgz -C $OUT logs
