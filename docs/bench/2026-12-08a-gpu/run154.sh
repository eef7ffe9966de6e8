#!/usr/bin/env bash
# Session 36, call 2: the GPU-speed issue's command with tc7 as the default (main `9c269a1`),
# its prefill rows again with PORTER_GDN_CHUNK=tc6 (the model-level A/B), and the 80B-layout
# chunked Gated DeltaNet (tc7 beside tc6) with FLA 0.6.0 beside; on an H200, if time is left,
# the same-day peers: the serving benchmark with graphs on and transformers + FLA
# (hf_bench.py); the tc6 prefill A/B last, if time is left. Carry .dev/k (cuda_gdn_chunk), .dev/p (porter.gz), .dev/ptx.tgz, .dev/whl.
set -uo pipefail
mkdir -p /tmp/porter-ptx && tar xzf .dev/ptx.tgz -C /tmp/porter-ptx --strip-components=1 && export PORTER_KERNEL_CACHE=/tmp/porter-ptx
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
L=$OUT/logs; mkdir -p $L
B="--include-ignored --exact --nocapture cuda_gdn_chunked_seq_80b_prefill"
for i in 1; do
  timeout 90 .dev/k/cuda_gdn_chunk $B > $L/ab_$i.log 2>&1; echo "[$SECONDS s] gdn run $i rc=$?"
  grep -E "tc7 vs tc6|\[tc7\] [0-9]|gdn_chunked_seq \[tc[67]\]" $L/ab_$i.log | head -9
done
python3 -m pip install --no-index --no-deps .dev/whl/*.whl > $L/pip.log 2>&1
timeout 120 python3 scripts/fla_gdn_bench.py --tokens 4096,16384 2>&1 | tail -2
gunzip -c .dev/p/porter.gz > /tmp/porter && chmod +x /tmp/porter
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 150 /tmp/porter bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] bench bf16 rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bf16.log | head -12
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem" -gt 100000 ]; then
  if [ $SECONDS -lt 240 ]; then
    timeout 90 /tmp/porter bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 > $L/serve.log 2>&1; echo "[$SECONDS s] serve rc=$?"
    grep -iE "output tok|ttft|tpot|request" $L/serve.log | head -8
  fi
  if [ $SECONDS -lt 280 ]; then
    timeout 120 python3 scripts/hf_bench.py --layers 24 --prefill 4096 --batch 1,8,64 --context 128 --steps 8 > $L/hf_24.log 2>&1; echo "[$SECONDS s] hf rc=$?"
    tail -8 $L/hf_24.log
  fi
fi
if [ $SECONDS -lt 330 ]; then
  PORTER_GDN_CHUNK=tc6 timeout 70 /tmp/porter bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8 > $L/bf16_tc6.log 2>&1; echo "[$SECONDS s] bench bf16 tc6 rc=$?"
  grep -E "^prefill" $L/bf16_tc6.log | head -4
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
