#!/usr/bin/env bash
# Session 20, GPU call 3, main with tc5 the default chunked-GDN form, the bench's
# decode rows sized to free memory, and the MTP rows' steady-state rates:
#  1. every GPU test (gpu: 25, the hybrid prefix cache on CUDA among them) and the whole suite
#     on the forced fallback paths (PORTER_CUDA_FALLBACK=1; its PTX staged with GPU_PTX_FALLBACK=1);
#  2. decode attention at 32k keys, every form and split size (attention_decode_mma_timing);
#  3. the issue's bench rows on the 24-layer 80B geometry (bf16), the MTP rows (K = 1..3, oracle);
#  4. transformers + flash-linear-attention on the same geometry (16 layers for both on an H100).
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_attention, cuda_gdn_chunk), .dev/gpu, .whl.
# Also the new chunk-offset scan of gdn_chunk_prep (its prep launch took 14 µs a call).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader; } > $S
T0=$(date +%s)
t() { local name=$1 budget=$2; shift 2; local s=$(date +%s); [ $(( s - T0 + budget )) -gt 500 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
H="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 16"
t gpu 60 timeout 60 .dev/gpu $T
t gdn 60 timeout 60 .dev/k/cuda_gdn_chunk $T cuda_gdn_chunked_seq_tc cuda_gdn_chunked_seq_spans cuda_gdn_chunked_seq_80b_prefill
t bench 100 timeout 100 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json $L/bench.json
t mtp 90 timeout 90 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 --json $L/mtp.json
t fallback 100 timeout 100 env PORTER_CUDA_FALLBACK=1 .dev/gpu $T
[ -x .dev/k/cuda_attention ] && t attn 60 timeout 60 .dev/k/cuda_attention $T attention_decode_mma_timing
# The peer: on an H100 (80 GB) 16 layers for both, on an H200 the 24 layers of the rows above.
NL=24; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ] && NL=16
[ $NL = 16 ] && t bench16 60 timeout 60 $P bench $H --prefill 4096 --batch 1,8,64 --context 128 --steps 32
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
t hf 150 timeout 150 env PYTHONPATH=/tmp/site python3 scripts/hf_bench.py --layers $NL --prefill 4096 --batch 1,8,64 --context 128 --steps 8 --json $L/hf.json
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
echo "== gdn"; grep -E "\[tc5\] per launch|\[tc5\] [0-9.]+ µs|gdn_chunked_seq \[tc5\]" $L/gdn.log | head -6
echo "== attn"; grep -A22 -E "DECODE-AB h16 kvh2 d256 batch 1 ctx 32768" $L/attn.log | head -24
for f in bench mtp bench16 hf; do echo "== $f"; grep -vE "^\s*$|profile" $L/$f.log | tail -16; done
tar czf $OUT/logs.tgz -C $OUT logs
