#!/usr/bin/env bash
# Session 35, call 3 (only on an H200; on a smaller card it stops at once): the GPU-speed
# issue's command at main (the kernels of `88db060`), and beside it on the same GPU and day the
# serving benchmark with graphs on and transformers + flash-linear-attention on the same
# geometry (hf_bench.py). Carry .dev/p (porter.gz), .dev/ptx.tgz, .dev/whl.
set -uo pipefail
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$mem" -lt 100000 ]; then echo "not an H200: nothing run"; exit 0; fi
mkdir -p /tmp/porter-ptx && tar xzf .dev/ptx.tgz -C /tmp/porter-ptx --strip-components=1 && export PORTER_KERNEL_CACHE=/tmp/porter-ptx
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
gunzip -c .dev/p/porter.gz > /tmp/porter && chmod +x /tmp/porter
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 150 /tmp/porter bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] bench bf16 rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bf16.log | head -12
timeout 120 /tmp/porter bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 > $L/serve.log 2>&1; echo "[$SECONDS s] serve rc=$?"
grep -iE "output tok|ttft|tpot|request" $L/serve.log | head -8
python3 -m pip install --no-index --no-deps .dev/whl/*.whl > $L/pip.log 2>&1
timeout 150 python3 scripts/hf_bench.py --layers 24 --prefill 4096 --batch 1,8,64 --context 128 --steps 8 > $L/hf_24.log 2>&1; echo "[$SECONDS s] hf rc=$?"
tail -8 $L/hf_24.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
