#!/usr/bin/env bash
# Session 12, last GPU call: main with this session's defaults (wgmma MoE prefill GEMMs,
# tensor-core decode attention, tc3 chunked delta rule, tensor-core FP8 experts), plus the
# follow-up helpers' forms as A/B (env). The 24-layer bf16 bench, long-context decode, the
# suites (defaults, forced fallback, graphs), the follow-ups' kernel tests, FP8 48 layers, MTP,
# the prefill profile, serving C64, and transformers + FLA beside it.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin/{gpu,gpu_graphs,cuda_gdn_chunk,cuda_attention,cuda_moe_mma}, .whl.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 575 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 100 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
t pf_tc4 timeout 40 env PORTER_GDN_CHUNK=tc4 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
t ctx32k timeout 40 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16
t ctx32k_legacy timeout 40 env PORTER_ATTN_DECODE=legacy $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16
t ctx32k_mma4 timeout 40 env PORTER_ATTN_DECODE=mma4 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16
t gpu timeout 80 .dev/bin/gpu $T
t gpu_graphs timeout 60 .dev/bin/gpu_graphs $T
t k_gdn timeout 50 .dev/bin/cuda_gdn_chunk $T cuda_gdn_chunked_seq
t k_dec timeout 60 .dev/bin/cuda_attention $T attention_decode_mma
t k_moe_mma timeout 60 .dev/bin/cuda_moe_mma $T
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
t fp8_48 timeout 60 $P bench $F --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/fp8_48.json"
t mtp_24 timeout 40 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3
t profile_pf timeout 40 env PORTER_PROFILE=1 $P bench $G --enforce-eager --prefill 4096 --batch 1 --context 128 --steps 4
t serve_c64 timeout 60 $P bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 --json "$L/serve_c64.json"
t gpu_fallback timeout 90 env PORTER_CUDA_FALLBACK=1 .dev/bin/gpu $T
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
t hf timeout 150 env PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 scripts/hf_bench.py --layers 24 --prefill 4096 --batch 1,8,64 --context 128 --steps 8 --json "$L/hf.json"
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in bf16_24 pf_tc4 ctx32k ctx32k_legacy ctx32k_mma4 mtp_24 fp8_48; do echo "== $f"; grep -vE "^  (profile|CUDA graph)" "$L/$f.log" | grep -E "prefill|decode|mtp|rror" | head -12; done
echo "== serve"; grep -iE "output tok|TTFT|TPOT" $L/serve_c64.log | head -6
echo "== hf"; tail -8 $L/hf.log
echo "== profile_pf"; grep -E "profile" $L/profile_pf.log | head -8
echo "== k_gdn"; grep -E "80B bf16 t (4096|16384) spans 1|tc4 vs tc3" $L/k_gdn.log | head -16
echo "== k_dec"; grep -E "DECODE-AB|env:" $L/k_dec.log | head -40
echo "== k_moe_mma"; grep -E "t= *[0-9]+|TB/s" $L/k_moe_mma.log | head -12
tar czf $OUT/logs.tgz -C $OUT logs
