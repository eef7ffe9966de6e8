#!/usr/bin/env bash
# Session 33, GPU call 1 (H100): the Gated DeltaNet conv output (q | k | v) in the activation
# dtype (6392705) — correctness and speed.
# 1. The chunked delta rule at the 80B layout, 4k / 16k tokens: this tree (tc6, and with
#    PORTER_GDN_WU_OCC=3: the 3-blocks-an-SM wu build, spill-free now) against session 32's
#    binary (f32 q / k / v; .dev/g/cuda_gdn_chunk_old, clusters of 2), and flash-linear-attention
#    0.6.0, all on this machine.
# 2. The GDN kernel suites (every test checks against the CPU on rounded inputs, and the fused /
#    three-launch forms bit for bit), then `gpu` (every model against its references) and
#    `gpu_graphs`.
# 3. The 24-layer 80B prefill at 4k / 8k (porter bench).
# Carry .dev/c (bins.tgz: .dev/g = cuda_gdn_chunk, _old, cuda_gdn_seq, cuda_gdn_fused, cuda_gdn_ba;
# .dev/t = gpu, gpu_graphs), .dev/porter, .dev/ptx.tgz, .dev/whl.
set -uo pipefail
tar xzf .dev/c/bins.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--nocapture --include-ignored --test-threads=1"
P="--exact cuda_gdn_chunked_seq_80b_prefill"
sel() { grep -E "gdn_chunked_seq \[|per launch|FLOP/s\)" "$1" | grep -E "t (4096|16384) spans 1|per launch" | head -8; }
timeout 60 .dev/g/cuda_gdn_chunk $T $P > $L/new.log 2>&1; echo "[$SECONDS s] new rc=$?"; sel $L/new.log
PORTER_GDN_WU_OCC=3 timeout 60 .dev/g/cuda_gdn_chunk $T $P > $L/new_o3.log 2>&1; echo "[$SECONDS s] new o3 rc=$?"; sel $L/new_o3.log
PORTER_GDN_TC6_CLUSTER=2 timeout 120 .dev/g/cuda_gdn_chunk_old $T $P > $L/old.log 2>&1; echo "[$SECONDS s] old rc=$?"; sel $L/old.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl > $L/pip.log 2>&1
timeout 100 env PYTHONPATH=/tmp/site python3 scripts/fla_gdn_bench.py --tokens 4096,16384 > $L/fla.log 2>&1; echo "[$SECONDS s] fla rc=$?"; tail -2 $L/fla.log
timeout 60 .dev/g/cuda_gdn_chunk $T $P > $L/new2.log 2>&1; echo "[$SECONDS s] new (again) rc=$?"; sel $L/new2.log
for b in cuda_gdn_chunk cuda_gdn_seq cuda_gdn_fused cuda_gdn_ba; do
  timeout 120 .dev/g/$b $T > $L/$b.log 2>&1; echo "[$SECONDS s] $b rc=$? $(grep -E '^test result' $L/$b.log)"
done
timeout 150 .dev/t/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
timeout 60 .dev/t/gpu_graphs $T > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs rc=$? $(grep -E '^test result' $L/gpu_graphs.log)"
grep -hE "panicked|FAILED|failed:" $L/*.log | head -12
gunzip -c .dev/porter/porter.gz > /tmp/p && chmod +x /tmp/p
B="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --prefill 4096,8192 --batch 1 --context 128 --steps 8"
timeout 90 /tmp/p bench $B > $L/bench.log 2>&1; echo "[$SECONDS s] bench rc=$? $(grep -E '^prefill' $L/bench.log | tr '\n' ' ')"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
