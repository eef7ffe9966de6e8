#!/usr/bin/env bash
# Session 24, H200 try with the last device seconds (needs_h200): the FP8 issue's whole model
# (48 layers + the MTP layer, random weights built in memory): memory after load, decode at
# batch 1 / 8 / 64, prefill 4k. Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
timeout 150 $P bench $F --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $OUT/fp8.log 2>&1; echo "[$SECONDS s] bench F rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $OUT/fp8.log
