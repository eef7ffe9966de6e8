#!/usr/bin/env bash
# Session 12, call 5: the follow-up helpers' forms, kernel tests and model A/B (env), and the
# peer (transformers + flash-linear-attention) on the same GPU the same day.
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_gdn_chunk, cuda_attention, cuda_moe_mma, cuda_fp8), .whl.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 560 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
K=.dev/k
t k_gdn timeout 60 $K/cuda_gdn_chunk $T cuda_gdn_chunked_seq
t k_moe_mma timeout 70 $K/cuda_moe_mma $T
t k_fp8 timeout 60 $K/cuda_fp8 $T moe_fp8_mma
t k_dec_t timeout 60 $K/cuda_attention $T --exact attention_decode_mma_timing
t k_dec_p timeout 60 $K/cuda_attention $T --exact attention_decode_mma_parity attention_decode_mma_batch_invariant
t pf timeout 40 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
t pf_tc4 timeout 40 env PORTER_GDN_CHUNK=tc4 $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 8
t dec timeout 40 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t dec_moemma timeout 40 env PORTER_MOE_DEC=mma $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t ctx32k timeout 40 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16
t ctx32k_legacy timeout 40 env PORTER_ATTN_DECODE=legacy $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16
t ctx32k_mma4 timeout 40 env PORTER_ATTN_DECODE=mma4 $P bench $G --prefill 16 --batch 1,8 --context 32768 --steps 16
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
t hf timeout 100 env PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 scripts/hf_bench.py --layers 24 --prefill 4096 --batch 1,8,64 --context 128 --steps 8 --json "$L/hf.json"
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in pf pf_tc4 dec dec_moemma ctx32k ctx32k_legacy ctx32k_mma4 hf; do echo "== $f"; grep -vE "^  (profile|CUDA graph|host)" "$L/$f.log" | grep -E "prefill|decode|rror" | head -8; done
echo "== k_gdn"; grep -E "80B bf16 t (4096|16384) spans 1|tc4 vs tc3" $L/k_gdn.log | head -16
echo "== k_dec"; grep -E "DECODE-AB|env|prealloc|split" $L/k_dec_t.log | head -50
echo "== k_moe_mma"; grep -E "t= *[0-9]+ \(" $L/k_moe_mma.log | head -8; grep -E "t= *[0-9]+ \(" $L/k_fp8.log | head -6
tar czf $OUT/logs.tgz -C $OUT logs
