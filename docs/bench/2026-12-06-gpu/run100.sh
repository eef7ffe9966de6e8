#!/usr/bin/env bash
# Session 24, last GPU call (run89.sh with the gzipped porter of call 10, whose defaults are the final tree's), on an H200 (needs_h200: the FP8 48-layer model does not fit
# 78 GiB): run81.sh's rows, most wanted first, within the session's last device seconds: the
# FP8 issue's whole model (48 layers + MTP layer) at batch 1, 8, 64; the GPU-speed issue's
# bench command and its MTP row; the FP8 MTP row. Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 120 $P bench $F --prefill 16 --batch 1,8,64 --context 128 --steps 32 > $L/fp8.log 2>&1; echo "[$SECONDS s] bench F rc=$?"
grep -E "^(device|HBM|prefill|decode)" $L/fp8.log
timeout 60 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bench.log 2>&1; echo "[$SECONDS s] bench G rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bench.log
timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp G rc=$?"
grep -E "^mtp (baseline|k=)|CUDA graphs" $L/mtp.log
echo "[$SECONDS s] done"
