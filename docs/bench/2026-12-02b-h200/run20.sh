#!/usr/bin/env bash
# Session 7, third GPU call: the tensor-core chunked GDN (branch gdntc, merged) against the f32
# form and FLA's numbers of the first call, the direct MoE down with h in shared memory, the
# per-lane-head router, the split FP8 GEMV; kernel parity, the model suites, the 24-layer bf16 bench (TC GDN and
# PORTER_GDN_CHUNK=f32 for prefill), the 48-layer FP8 bench, the step profile.
# Also the fused conv + window + gates launch (branch gdnglue, merged).
# Carry .dev (porter + bin/{cuda_gdn_chunk,cuda_gdn_seq,cuda_moe_decode,cuda_kernels,cuda_fp8,gpu,gpu_graphs}).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 580 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
t k_gdn_chunk timeout 90 .dev/bin/cuda_gdn_chunk $T
t k_gdn_seq timeout 40 .dev/bin/cuda_gdn_seq $T cuda_gdn
t k_moe_decode timeout 60 .dev/bin/cuda_moe_decode $T
t k_kernels timeout 30 .dev/bin/cuda_kernels $T cuda_moe_router cuda_gemv
t k_fp8 timeout 90 .dev/bin/cuda_fp8 $T gemv moe
t gpu timeout 150 .dev/bin/gpu $T
t gpu_graphs timeout 30 .dev/bin/gpu_graphs $T
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 40 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
PORTER_GDN_CHUNK=f32 t bf16_24_f32gdn timeout 25 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
E4="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 2"
N="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
t ncu_bf16_b1 timeout 30 $N --log-file $L/ncu_bf16_b1.csv $P bench $E4 --batch 1
python3 scripts/ncu_step.py $L/ncu_bf16_b1.csv > $L/step_bf16_b1.txt 2>&1
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 220 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 --mtp-step 3 --json "$L/fp8_48.json"
cat $S
grep -hE "panicked|FAILED" $L/*.log | head -20
grep -hE "80B|per launch|form|max\|" $L/k_gdn_chunk.log | head -60
grep -hE "fused|old chain|µs" $L/k_gdn_seq.log | head -20
grep -hE "  t=|moe_experts_fp8 .*t=1 |fp8_gemv bf16 m=" $L/k_moe_decode.log $L/k_fp8.log | head -30
for f in bf16_24 bf16_24_f32gdn fp8_48; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|mtp base|roofline|memory" | head -20; done
head -24 $L/step_bf16_b1.txt
gzip $L/*.csv
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
