#!/usr/bin/env bash
# Session 33, GPU call 3 (H100): the tc4 wu launch built for 3 blocks an SM as the default at
# dk = 128 (no spills now that q / k / v come in the activation dtype). The 80B-layout timing
# with the default and with PORTER_GDN_WU_OCC=2, alternating; flash-linear-attention 0.6.0
# again (call 1 measured it far slower than session 32's machines); the chunk suite, `gpu`,
# `gpu_graphs`; the 24-layer prefill with both builds.
# Carry .dev/c (bins.tgz: .dev/g/cuda_gdn_chunk, .dev/t/gpu, gpu_graphs), .dev/porter,
# .dev/ptx.tgz, .dev/whl.
set -uo pipefail
tar xzf .dev/c/bins.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--nocapture --include-ignored --test-threads=1"
P="--exact cuda_gdn_chunked_seq_80b_prefill"
sel() { grep -E "\[tc6\]" "$1" | grep -E "t (4096|16384) spans 1|per launch" | head -4; }
for r in 1 2; do for o in 3 2; do
  PORTER_GDN_WU_OCC=$o timeout 60 .dev/g/cuda_gdn_chunk $T $P > $L/occ${o}_$r.log 2>&1; echo "[$SECONDS s] occ $o run $r rc=$?"; sel $L/occ${o}_$r.log
done; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl > $L/pip.log 2>&1
timeout 110 env PYTHONPATH=/tmp/site python3 scripts/fla_gdn_bench.py --tokens 4096,16384 > $L/fla.log 2>&1; echo "[$SECONDS s] fla rc=$?"; tail -2 $L/fla.log
timeout 120 .dev/g/cuda_gdn_chunk $T > $L/cuda_gdn_chunk.log 2>&1; echo "[$SECONDS s] cuda_gdn_chunk rc=$? $(grep -E '^test result' $L/cuda_gdn_chunk.log)"
timeout 150 .dev/t/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 60 .dev/t/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
grep -hE "panicked|FAILED|failed:" $L/*.log | head -12
gunzip -c .dev/porter/porter.gz > /tmp/p && chmod +x /tmp/p
B="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --prefill 4096,8192 --batch 1 --context 128 --steps 8"
for o in 3 2; do
  PORTER_GDN_WU_OCC=$o timeout 90 /tmp/p bench $B > $L/bench_occ$o.log 2>&1; echo "[$SECONDS s] bench occ $o rc=$? $(grep -E '^prefill' $L/bench_occ$o.log | tr '\n' ' ')"
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
