#!/usr/bin/env bash
# Session 9, fourth GPU call. Call 3 timed out in every process right after the weights were
# loaded (first kernels: NVRTC + the driver's JIT of ~30 MB of PTX, or a hang?): this call
# samples the GPU and the CPU while the first bench runs, gives it 240 s, and then runs what
# the PTX cache makes cheap. Carry .dev (porter, bin/{gpu_graphs,cuda_norm_gemv}).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 180 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
( for i in 1 2 3 4 5 6 7; do sleep 20; { date -u +%T; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; top -bn1 | sed -n 7,10p; ls -la $HOME/.cache/porter/ptx 2>/dev/null | tail -n +2 | awk '{print $5, $9}'; } >> $L/sample.txt 2>&1; done ) &
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 165 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
t bf16_apart timeout 40 env PORTER_NORM_GEMV=apart $P bench $G --prefill 16 --batch 1,8 --context 128 --steps 32
t gpu_graphs timeout 60 .dev/bin/gpu_graphs --nocapture --include-ignored --test-threads=1
t mtp_24 timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
t pf_mma timeout 90 env PORTER_ATTN_TC=mma $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 4
cat $S
cat $L/sample.txt | head -60
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in bf16_24 bf16_apart mtp_24 pf_mma; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp k|roofline|host|×|rror" | head -14; done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
