#!/usr/bin/env bash
# Session 18, GPU call 1: the tc5 state sweep (warp pairs) of the chunked Gated DeltaNet:
# correctness (every case against the CPU, tc5 against tc4 bit for bit), the 80B-layout timing
# of every form, flash-linear-attention's chunk_gated_delta_rule in the same run, and the
# 24-layer prefill with tc4 and tc5; the tc4 wu launch at 3 blocks an SM (PORTER_GDN_WU_OCC=3).
# (Session 18 got no GPU: `run` lent none; this is the plan for the next call.)
# Session 19 (no GPU either) added the hybrid prefix cache on CUDA: its tests run first.
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_gdn_chunk, cuda_gdn_seq), .dev/bin/gpu, .whl.
# Staging here: scripts/gpu-check.sh stage; mkdir -p .dev/k; mv .dev/bin/cuda_gdn_chunk
# .dev/bin/cuda_gdn_seq .dev/k/; keep only .dev/bin/gpu in .dev/bin (64 MiB a call);
# pip download --no-deps -d .whl fla-core flash-linear-attention (0.6.0 in sessions 12 and 18).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem --format=csv,noheader; echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 400 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t prefix 60 timeout 60 .dev/bin/gpu $T cuda_engine_hybrid_prefix_checkpoints cuda_engine_batch_invariance_hybrid
t window_at 30 timeout 30 .dev/k/cuda_gdn_seq $T cuda_gdn_window_at
t gdn_tc 90 timeout 90 .dev/k/cuda_gdn_chunk $T cuda_gdn_chunked_seq_tc cuda_gdn_chunked_seq_spans
t gdn_80b 90 timeout 90 .dev/k/cuda_gdn_chunk $T cuda_gdn_chunked_seq_80b_prefill
t gdn_tc_o3 60 timeout 60 env PORTER_GDN_WU_OCC=3 .dev/k/cuda_gdn_chunk $T cuda_gdn_chunked_seq_tc
t gdn_80b_o3 90 timeout 90 env PORTER_GDN_WU_OCC=3 .dev/k/cuda_gdn_chunk $T cuda_gdn_chunked_seq_80b_prefill
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
t fla 60 timeout 60 env PYTHONPATH=/tmp/site python3 scripts/fla_gdn_bench.py --tokens 4096,16384
t gpu_tc5 100 timeout 100 env PORTER_GDN_CHUNK=tc5 .dev/bin/gpu $T --skip bench_
t pf_tc4 60 timeout 60 env PORTER_GDN_CHUNK=tc4 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
t pf_tc5 60 timeout 60 env PORTER_GDN_CHUNK=tc5 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
t pf_tc5_o3 60 timeout 60 env PORTER_GDN_CHUNK=tc5 PORTER_GDN_WU_OCC=3 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
cat $S
grep -hE "panicked|FAILED|failed:|differs" $L/*.log | head -20
echo "== gdn_tc"; grep -E "bit for bit|form tc5" $L/gdn_tc.log | sort | uniq -c | head
for f in gdn_80b gdn_80b_o3; do echo "== $f"; grep -iE "µs|TFLOP|tc5" $L/$f.log | head -40; done
echo "== fla"; tail -5 $L/fla.log
for f in pf_tc4 pf_tc5 pf_tc5_o3; do echo "== $f"; grep -E "prefill|rror" "$L/$f.log" | head -6; done
tar czf $OUT/logs.tgz -C $OUT logs
