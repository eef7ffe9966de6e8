#!/usr/bin/env bash
# Session 25, H200 try, trimmed to the FP8 rows (device time left; needs_h200: the FP8 48-layer model does not fit 78 GiB): the FP8 issue's
# whole model (48 layers + the MTP layer, random weights built in memory) with this session's
# binary: memory after load, decode at batch 1 / 8 / 64, prefill 4k / 32k; MTP K = 1..3 with the
# oracle draft; then the GPU-speed issue's bench command (24 layers bf16) and its MTP row.
# Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 200 $P bench $F --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/fp8.log 2>&1; echo "[$SECONDS s] bench F rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/fp8.log
timeout 120 $P bench $F --prefill 16 --batch 1 --context 128 --steps 32 --mtp-step 3 > $L/fp8_mtp.log 2>&1; echo "[$SECONDS s] mtp F rc=$?"
grep -E "^mtp (baseline|k=)|note: k=[0-9]: the oracle" $L/fp8_mtp.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
