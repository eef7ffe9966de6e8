#!/usr/bin/env bash
# Session 11, first GPU call: the defaults of main (c7eee7a + this session's staging) measured
# again, the step's per-kernel profile at batch 1 (none was taken of the final kernels in
# session 9), and the kernel suites that never ran on the final kernels (cuda_moe,
# cuda_moe_decode, cuda_moe_shared, cuda_attention_mma, cuda_norm_gemv).
# Carry .dev (scripts/gpu-check.sh stage: porter, bin/*, ptx.tgz).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader;
  echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 560 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 150 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
echo "PTX cache after the first process: $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files" >> $S
G4="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4"
t bf16_4 timeout 40 $P bench $G4 --prefill 16 --batch 1,8 --context 128 --steps 64
t pf_mma timeout 60 env PORTER_ATTN_TC=mma $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 4
E4="$G4 --enforce-eager --prefill 16 --context 128 --steps 2"
N="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
t ncu_b1 timeout 90 $N --log-file $L/ncu_b1.csv $P bench $E4 --batch 1
python3 scripts/ncu_step.py --layers 4 $L/ncu_b1.csv > $L/step_b1.txt 2>&1
t k_norm_gemv timeout 45 .dev/bin/cuda_norm_gemv $T
t k_moe_decode timeout 60 .dev/bin/cuda_moe_decode $T
t k_moe_shared timeout 45 .dev/bin/cuda_moe_shared $T
t k_moe timeout 60 .dev/bin/cuda_moe $T
t k_attn_mma timeout 90 .dev/bin/cuda_attention_mma $T
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in bf16_24 bf16_4 pf_mma; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|roofline|host|rror" | head -14; done
head -40 $L/step_b1.txt
gzip $L/*.csv
