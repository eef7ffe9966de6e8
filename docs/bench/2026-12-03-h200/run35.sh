#!/usr/bin/env bash
# Session 12, first GPU call: the final tree of session 11 as a whole (run34.sh never got a GPU):
# the 24-layer bf16 bench, the model suite, paged decode attention at 32k context (#14 item 3),
# the chunked delta rule beside flash-linear-attention in the same run, the prefill profile by
# block, the 48-layer FP8 bench (#12), MTP K = 3.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin/{gpu,cuda_attention,cuda_gdn_chunk}, .whl.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem --format=csv,noheader; echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 450 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 120 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
t attn_dec timeout 40 .dev/bin/cuda_attention $T attention_qwen3_next_decode
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
t fla timeout 60 env PYTHONPATH=/tmp/site python3 scripts/fla_gdn_bench.py --tokens 4096,16384
t gdn_chunk timeout 60 .dev/bin/cuda_gdn_chunk $T cuda_gdn_chunked_seq_80b_prefill
t profile_pf timeout 50 env PORTER_PROFILE=1 $P bench $G --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 4
t gpu timeout 90 .dev/bin/gpu $T
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 150 $P bench $F --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/fp8_48.json"
t mtp_24 timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in bf16_24 mtp_24 fp8_48; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp|roofline|memory|rror" | head -16; done
echo "== attn_dec"; grep -E "TIME|batch" $L/attn_dec.log | head
echo "== fla"; tail -5 $L/fla.log; echo "== gdn_chunk"; grep -iE "us|TFLOP" $L/gdn_chunk.log | tail -12
echo "== profile_pf"; grep -E "profile|ms" $L/profile_pf.log | head -40
tar czf $OUT/logs.tgz -C $OUT logs
