#!/usr/bin/env bash
# Session 13, check of the last default: dense routed experts direct up to 16 pairs, v1 to 40
# (the shared expert apart there). The model suites (batch invariance, graphs), then decode at
# batch 1..8 and MTP K = 3. Carry .dev/porter, .dev/ptx.tgz, .dev/bin/gpu, .dev/bin/gpu_graphs.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
T="--nocapture --include-ignored --test-threads=1 --skip nvrtc"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 60 .dev/bin/gpu $T > $L/gpu.log 2>&1; echo "gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 30 .dev/bin/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
timeout 40 $P bench $G --prefill 16 --batch 1,2,4,8 --context 128 --steps 32 > $L/dec.log 2>&1
timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1
timeout 40 $P bench --device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8 --prefill 16 --batch 1,4 --context 128 --steps 32 > $L/fp8.log 2>&1
grep -hE "panicked|FAILED|failed:" $L/*.log | head
for f in $L/dec.log $L/mtp.log $L/fp8.log; do echo "== $f"; grep -E "decode batch|mtp k=|baseline|rror" $f | grep -v random; done
