#!/usr/bin/env bash
# Session 11, last GPU call: the final defaults (wgmma prefill attention, MoE prefill GEMM auto,
# no PDL / fused GDN decode / async MoE decode: measured no gain in call 2 and reverted):
# the 24-layer bf16 bench, the 48-layer FP8 bench (#12), MTP K = 3, the prefill profile by
# block, the model suites with the defaults and with the forced fallback.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin/{gpu,gpu_graphs}.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 360 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 120 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
t gpu timeout 90 .dev/bin/gpu $T
t gpu_graphs timeout 60 .dev/bin/gpu_graphs $T
t gpu_fallback timeout 120 env PORTER_CUDA_FALLBACK=1 .dev/bin/gpu $T
t profile_pf timeout 60 env PORTER_PROFILE=1 $P bench $G --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 4
t mtp_24 timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 150 $P bench $F --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/fp8_48.json"
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in bf16_24 mtp_24 fp8_48; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp|roofline|memory|rror" | head -16; done
echo "== profile_pf"; grep -E "profile|ms" $L/profile_pf.log | head -30
tar czf $OUT/logs.tgz -C $OUT logs
