#!/usr/bin/env bash
# Session 36, call 1: tc7 (the chunked Gated DeltaNet on a lean scratch: K̂ / Q̂ once per key
# head, U in bf16, the decays applied in the sweep; 65,024 bytes a (chunk, value head) against
# tc6's 98,304) beside tc6 in one process (cuda_gdn_chunked_seq_80b_prefill times every form),
# three runs; tc7's wu launch at 2 blocks an SM once; correctness (cuda_gdn_chunk with tc7 among
# the forms; the gpu suite with PORTER_GDN_CHUNK=tc7); FLA 0.6.0 beside.
# On an H200, if time is left: the GPU-speed issue's command (default form, tc6) with its
# same-day peers (the serving benchmark with graphs on; transformers + FLA, hf_bench.py), and
# the prefill rows again with PORTER_GDN_CHUNK=tc7.
# Carry .dev/k (cuda_gdn_chunk, gpu), .dev/p (porter.gz of this tree), .dev/ptx.tgz, .dev/whl.
set -uo pipefail
mkdir -p /tmp/porter-ptx && tar xzf .dev/ptx.tgz -C /tmp/porter-ptx --strip-components=1 && export PORTER_KERNEL_CACHE=/tmp/porter-ptx
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
L=$OUT/logs; mkdir -p $L
B="--include-ignored --exact --nocapture cuda_gdn_chunked_seq_80b_prefill"
for i in 1 2 3; do
  timeout 90 .dev/k/cuda_gdn_chunk $B > $L/ab_$i.log 2>&1; echo "[$SECONDS s] run $i rc=$?"
  grep -E "\[tc7\]|\[tc6\]|tc7 vs tc6|FAIL|panicked" $L/ab_$i.log | head -16
done
PORTER_GDN_WU_OCC=2 timeout 90 .dev/k/cuda_gdn_chunk $B > $L/occ2.log 2>&1; echo "[$SECONDS s] occ2 rc=$?"
grep -E "\[tc7\]|tc7 vs tc6" $L/occ2.log | head -8
timeout 150 .dev/k/cuda_gdn_chunk $T --skip nvrtc > $L/chunk.log 2>&1; echo "[$SECONDS s] cuda_gdn_chunk rc=$?"
grep -E "test result|fails|failed comparisons|≡|panicked" $L/chunk.log | head -12
grep -E "tc[67] (out|state) vs CPU" $L/chunk.log | head -16
python3 -m pip install --no-index --no-deps .dev/whl/*.whl > $L/pip.log 2>&1
timeout 120 python3 scripts/fla_gdn_bench.py --tokens 4096,16384 2>&1 | tail -2
PORTER_GDN_CHUNK=tc7 timeout 180 .dev/k/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu (tc7) rc=$?"; grep -E "test result|FAILED|panicked" $L/gpu.log | head
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem" -gt 100000 ] && [ $SECONDS -lt 260 ]; then
  gunzip -c .dev/p/porter.gz > /tmp/porter && chmod +x /tmp/porter
  G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
  timeout 130 /tmp/porter bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] bench bf16 rc=$?"
  grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bf16.log | head -12
  PORTER_GDN_CHUNK=tc7 timeout 60 /tmp/porter bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8 > $L/bf16_tc7.log 2>&1; echo "[$SECONDS s] bench bf16 tc7 rc=$?"
  grep -E "^prefill" $L/bf16_tc7.log | head -4
  if [ $SECONDS -lt 420 ]; then
    timeout 100 /tmp/porter bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 > $L/serve.log 2>&1; echo "[$SECONDS s] serve rc=$?"
    grep -iE "output tok|ttft|tpot|request" $L/serve.log | head -8
  fi
  if [ $SECONDS -lt 440 ]; then
    timeout 140 python3 scripts/hf_bench.py --layers 24 --prefill 4096 --batch 1,8,64 --context 128 --steps 8 > $L/hf_24.log 2>&1; echo "[$SECONDS s] hf rc=$?"
    tail -8 $L/hf_24.log
  fi
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
