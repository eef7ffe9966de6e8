#!/usr/bin/env bash
# Session 32, GPU calls 7 and 8 (H100, inline on call 6's warm machine): the 80B-layout timing
# beside flash-linear-attention 0.6.0 on the same machine. Call 7 ran the cuda_gdn_chunk binary
# of 12:33, whose tc6 default was still clusters of 4; call 8 the same with
# PORTER_GDN_TC6_CLUSTER=2 (this tree's default). Carry .dev/ptx.tgz, .dev/g, .dev/whl.
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
# call 7
timeout 60 .dev/g/cuda_gdn_chunk --nocapture --include-ignored --test-threads=1 --exact cuda_gdn_chunked_seq_80b_prefill > $OUT/gdn_80b.log 2>&1; echo "gdn rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl > /dev/null 2>&1
timeout 100 env PYTHONPATH=/tmp/site python3 scripts/fla_gdn_bench.py --tokens 4096,16384 > $OUT/fla.log 2>&1; echo "fla rc=$?"
# call 8
PORTER_GDN_TC6_CLUSTER=2 timeout 60 .dev/g/cuda_gdn_chunk --nocapture --include-ignored --test-threads=1 --exact cuda_gdn_chunked_seq_80b_prefill > $OUT/gdn_80b_c2.log 2>&1; echo "gdn rc=$?"
