#!/usr/bin/env bash
# Session 12, last GPU call: main cb14e37 with this session's defaults (wgmma MoE prefill
# GEMMs, tc4 chunked delta rule, mma4 decode attention, swap-AB tensor-core routed experts for
# dense and FP8 weights at decode batches). The 24-layer bf16 bench, decode at 32k context,
# the model suites (defaults, graphs, forced fallback), FP8 48 layers, MTP, the prefill profile,
# serving C64. Carry .dev/porter, .dev/ptx.tgz, .dev/bin/gpu, .dev/bin/gpu_graphs.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 262 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 70 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
t gpu timeout 70 .dev/bin/gpu $T
t gpu_graphs timeout 50 .dev/bin/gpu_graphs $T
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 30 $P bench $F --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/fp8_48.json"
t ctx32k timeout 25 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16
t mtp_24 timeout 15 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
t profile_pf timeout 15 env PORTER_PROFILE=1 $P bench $G --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 4
t serve_c64 timeout 40 $P bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 --json "$L/serve_c64.json"
t gpu_fallback timeout 60 env PORTER_CUDA_FALLBACK=1 .dev/bin/gpu $T
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in bf16_24 ctx32k mtp_24 fp8_48; do echo "== $f"; grep -vE "^  (profile|CUDA graph|host)" "$L/$f.log" | grep -E "prefill|decode|mtp k=3|baseline|rror" | head -10; done
echo "== serve"; grep -iE "output|TTFT|TPOT" $L/serve_c64.log | head -6
echo "== profile_pf"; grep -E "profile" $L/profile_pf.log | head -8
tar czf $OUT/logs.tgz -C $OUT logs
