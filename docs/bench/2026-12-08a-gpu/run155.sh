#!/usr/bin/env bash
# Session 36, call 2 (the last device seconds, ≈ 190 s of command): the 80B-layout chunked Gated
# DeltaNet (tc7 beside tc6) with FLA 0.6.0 beside; then on an H200 the GPU-speed issue's command
# (tc7 the default), on a smaller card the prefill rows with tc7 and with tc6 (the model-level
# A/B). Carry .dev/k (cuda_gdn_chunk), .dev/p (porter.gz of `9c269a1`), .dev/ptx.tgz, .dev/whl.
set -uo pipefail
mkdir -p /tmp/porter-ptx && tar xzf .dev/ptx.tgz -C /tmp/porter-ptx --strip-components=1 && export PORTER_KERNEL_CACHE=/tmp/porter-ptx
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
L=$OUT/logs; mkdir -p $L
timeout 60 .dev/k/cuda_gdn_chunk --include-ignored --exact --nocapture cuda_gdn_chunked_seq_80b_prefill > $L/gdn.log 2>&1; echo "[$SECONDS s] gdn rc=$?"
grep -E "tc7 vs tc6|gdn_chunked_seq \[tc[67]\]" $L/gdn.log | head -9
python3 -m pip install --no-index --no-deps .dev/whl/*.whl > $L/pip.log 2>&1
timeout 60 python3 scripts/fla_gdn_bench.py --tokens 4096,16384 2>&1 | tail -2
gunzip -c .dev/p/porter.gz > /tmp/porter && chmod +x /tmp/porter
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem" -gt 100000 ]; then
  timeout 130 /tmp/porter bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] bench bf16 rc=$?"
  grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bf16.log | head -12
else
  for f in tc7 tc6; do
    PORTER_GDN_CHUNK=$f timeout 60 /tmp/porter bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8 > $L/bf16_$f.log 2>&1; echo "[$SECONDS s] bench bf16 $f rc=$?"
    grep -E "^prefill" $L/bf16_$f.log | head -4
  done
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
