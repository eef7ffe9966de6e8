#!/usr/bin/env bash
# Session 26, H200 try (needs_h200: the FP8 48-layer model does not fit 78 GiB): the FP8 issue's
# whole model (48 layers, random weights built in memory and quantized on the device): memory
# after load, decode at batch 1 / 8 / 64, prefill 4k / 32k, MTP K = 1..3 with the oracle draft;
# the device timeline of its batch-1 step; then the GPU-speed issue's bench command (24 layers
# bf16) and its timeline. Carry .dev/porter (porter.gz: this tree), .dev/ptx.tgz.
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
PORTER_TIMELINE=1 timeout 120 $P bench $F --prefill 16 --batch 1 --context 128 --steps 32 > $OUT/tl_fp8_48.log 2>&1; echo "[$SECONDS s] timeline F rc=$?"
grep -E "^decode batch|timeline:|timeline by kernel" $OUT/tl_fp8_48.log | head -22
timeout 120 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bench.log 2>&1; echo "[$SECONDS s] bench G rc=$?"
grep -E "^(HBM|prefill|decode)|host issue|not captured" $L/bench.log
PORTER_TIMELINE=1 timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 > $OUT/tl_bf16.log 2>&1; echo "[$SECONDS s] timeline G rc=$?"
grep -E "^decode batch|timeline:|timeline by kernel" $OUT/tl_bf16.log | head -22
timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp G rc=$?"
grep -E "^mtp (baseline|k=)" $L/mtp.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
