#!/usr/bin/env bash
# Session 20, GPU call 1: first GPU run since session 17. Session 19's hybrid prefix cache on
# CUDA (checkpoint rounds of the chunked delta rule, gdn_window_at, restore by copies) and
# session 18's tc5 state sweep of the chunked Gated DeltaNet, then the whole GPU suite and a
# 24-layer 80B baseline on this card (the card may be an H100: compare only within the call).
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_gdn_chunk, cuda_gdn_seq), .dev/gpu (64 MiB a call with the tree: gpu_graphs in the next call), .whl.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader; echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1 budget=$2; shift 2; local s=$(date +%s); [ $(( s - T0 + budget )) -gt 560 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t prefix 90 timeout 90 .dev/gpu $T cuda_engine_hybrid_prefix_checkpoints cuda_engine_batch_invariance_hybrid
t window_at 30 timeout 30 .dev/k/cuda_gdn_seq $T cuda_gdn_window_at
t gpu 120 timeout 120 .dev/gpu $T --skip cuda_engine_hybrid_prefix_checkpoints --skip cuda_engine_batch_invariance_hybrid
[ -x .dev/k/gpu_graphs ] && t gpu_graphs 45 timeout 45 .dev/k/gpu_graphs $T
t gdn_tc 90 timeout 90 .dev/k/cuda_gdn_chunk $T cuda_gdn_chunked_seq_tc cuda_gdn_chunked_seq_spans
t gdn_80b 60 timeout 60 .dev/k/cuda_gdn_chunk $T cuda_gdn_chunked_seq_80b_prefill
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
t fla 60 timeout 60 env PYTHONPATH=/tmp/site python3 scripts/fla_gdn_bench.py --tokens 4096,16384
t bench 90 timeout 90 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32
cat $S
grep -hE "panicked|FAILED|failed:|differs" $L/*.log | head -20
echo "== gdn_tc"; grep -E "bit for bit|form tc5" $L/gdn_tc.log | sort | uniq -c | head
echo "== gdn_80b"; grep -iE "µs|TFLOP|tc5" $L/gdn_80b.log | head -30
echo "== fla"; tail -5 $L/fla.log
echo "== bench"; grep -vE "^\s*$" $L/bench.log | tail -25
tar czf $OUT/logs.tgz -C $OUT logs
