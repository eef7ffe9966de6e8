#!/usr/bin/env bash
# Session 24, GPU call 4 (H100): the output gate in the decode kernel's write (92c7e7a).
# Parity: cuda_attention's decode tests (every mma form: the gated launch bit for bit against
# attention + sigmoid_gate_mul, on every parity case), gpu_graphs, gpu, gpu with the fallback
# paths forced; the decode attention timing (32k); then the model A/B against call 3's porter
# (porter_prev), bf16 24 layers and FP8.
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
gunzip -c .dev/porter/porter_prev.gz > /tmp/porter_prev && chmod +x /tmp/porter_prev
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in gpu_graphs gpu; do
    timeout 100 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
PORTER_CUDA_FALLBACK=1 timeout 100 .dev/k/gpu $T > $L/gpu_fallback.log 2>&1; echo "[$SECONDS s] gpu (fallback forced) rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
timeout 60 .dev/k/cuda_attention $T attention_decode_batch attention_sliding_window attention_qwen3_next_decode > $L/attn_misc.log 2>&1; echo "[$SECONDS s] attention misc rc=$? $(grep -E '^test result' $L/attn_misc.log)"
timeout 240 .dev/k/cuda_attention $T --exact attention_decode_mma_parity > $L/attn_parity.log 2>&1; echo "[$SECONDS s] attention_decode_mma_parity rc=$? $(grep -E '^test result' $L/attn_parity.log)"
grep -E "took the output gate|panicked" $L/attn_parity.log | head
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1,8,64 --context 128 --steps 32"
one() { # label, binary, model flags, bench flags
    timeout 90 $2 bench $3 $4 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 rc=$?"
    grep -E "^decode batch" $L/$1.log | sed -E 's/ +/ /g'
}
one new /tmp/porter_new "$G" "$B"
one prev /tmp/porter_prev "$G" "$B"
one new_2 /tmp/porter_new "$G" "$B"
one prev_2 /tmp/porter_prev "$G" "$B"
F="$G --quantize fp8"; B1="--prefill 16 --batch 1 --context 128 --steps 64"
one fp8_new /tmp/porter_new "$F" "$B1"
one fp8_prev /tmp/porter_prev "$F" "$B1"
one ctx32k_new /tmp/porter_new "$G" "--prefill 16 --batch 1,8 --context 32768 --steps 16"
timeout 60 .dev/k/cuda_attention $T --exact attention_decode_mma_timing > $L/adec.log 2>&1; echo "[$SECONDS s] adec timing rc=$?"
sed -n '/batch 1 ctx 32768 (67/,/Mma4W2 attention/p' $L/adec.log | grep -E "Mma4 " | head -4
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
