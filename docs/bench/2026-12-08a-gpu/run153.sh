#!/usr/bin/env bash
# Session 36, call 1: tc7 (the chunked Gated DeltaNet on a lean scratch: K̂ / Q̂ once per key
# head, U in bf16, the decays applied in the sweep; 65,024 bytes a (chunk, value head) against
# tc6's 98,304) beside tc6 in one process (cuda_gdn_chunked_seq_80b_prefill times every form),
# three runs; tc7's wu launch at 2 blocks an SM once; correctness (cuda_gdn_chunk with tc7 among
# the forms; the gpu suite with PORTER_GDN_CHUNK=tc7); FLA 0.6.0 beside.
# Carry .dev/k (cuda_gdn_chunk, gpu), .dev/ptx.tgz, .dev/whl.
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
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
