#!/usr/bin/env bash
# Session 6, GPU call 3: graphs on by default. The model suite (gpu.rs) and gpu_graphs with
# graphs on; the attention fallbacks at 96 KiB (forced fallback) and 64 KiB (a T4's limit,
# PORTER_CUDA_SMEM_LIMIT=64k) incl. the whole model suite there; the C64 serving benchmark
# with graphs and eager; MTP K=1..3 with graphs and the greedy verify on the device.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
t() { local name=$1; shift; local s=$(date +%s); "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
t gpu timeout 130 .dev/bin/gpu --nocapture --include-ignored --test-threads=1
export PORTER_CUDA_FALLBACK=1
t fb96_attention timeout 50 .dev/bin/cuda_attention --nocapture --include-ignored --test-threads=1 attention_chunked_prefill
t fb96_kv_quant timeout 30 .dev/bin/cuda_kv_quant --nocapture --include-ignored --test-threads=1
export PORTER_CUDA_SMEM_LIMIT=64k
t fb64_attention timeout 50 .dev/bin/cuda_attention --nocapture --include-ignored --test-threads=1 attention_chunked_prefill
t fb64_kv_quant timeout 30 .dev/bin/cuda_kv_quant --nocapture --include-ignored --test-threads=1
t fb64_gpu timeout 120 .dev/bin/gpu --nocapture --include-ignored --test-threads=1
unset PORTER_CUDA_FALLBACK PORTER_CUDA_SMEM_LIMIT
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
C64="--num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64"
t serve_graphs timeout 75 $P bench --serve $G $C64 --json "$L/serve_graphs.json"
t serve_eager timeout 65 $P bench --serve $G $C64 --enforce-eager --json "$L/serve_eager.json"
t mtp_graphs timeout 50 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 --json "$L/mtp_graphs.json"
cat $S
grep -hE "panicked|FAILED" $L/*.log | head -20
for f in serve_graphs serve_eager mtp_graphs; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | tail -22; done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
