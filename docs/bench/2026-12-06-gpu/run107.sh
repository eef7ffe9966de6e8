#!/usr/bin/env bash
# Session 26, GPU call 1 (H100): the batch-1 step split by knock-OUT into its weight-streaming
# launches and its short launches (PORTER_KNOCKOUT leaves matching launches out of the graph;
# the outputs are wrong, the timing is what is read). 24 layers, bf16 and FP8, session 25's
# final binary (.dev/porter/porter.gz). Carry .dev/porter, .dev/ptx.tgz. R108=1: call 2's
# variants (the short launches out but the router kept, so that the expert ids stay live).
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1 --context 128 --steps 64"
SHORT="gdn_delta_seq,moe_router_warp,gdn_conv_gates,rms_norm,qk_prep,kv_append,attention_decode,sigmoid_gate_mul"
WEIGHTS="fp8_gemv,gemv_,moe_dir_"
# The router left in: without it the expert ids go stale (one expert read ten times, from L2).
SHORT_KR="gdn_delta_seq,gdn_conv_gates,rms_norm,qk_prep,kv_append,attention_decode,sigmoid_gate_mul"
one() { # label, model flags, rules
    local s; s=$(env PORTER_KNOCKOUT=$3 timeout 90 $P bench $2 $B 2>$L/err_$1.txt | tee $L/$1.log | grep -E '^decode batch' | sed -E 's/.*\(([0-9.]+) ms\/step.*/\1/')
    echo "$1 $3 $s"
}
PORTER_LAUNCH_TRACE=1200 timeout 60 $P bench $G --quantize fp8 $B 2>&1 | grep -v fill_uniform | grep -v fp8_quantize | head -400 > $L/trace_fp8.txt
for m in fp8 bf16; do
  F="$G"; [ $m = fp8 ] && F="$G --quantize fp8"
  one ${m}_none "$F" NONE
  if [ "${R108:-}" = 1 ]; then
    one ${m}_short_keep_router "$F" $SHORT_KR
    one ${m}_short_keep_router_weights_only_moe "$F" $SHORT_KR,fp8_gemv,gemv_
    one ${m}_conv "$F" gdn_conv_gates
    one ${m}_attn "$F" qk_prep,kv_append,attention_decode,sigmoid_gate_mul
  else
    one ${m}_short "$F" $SHORT
    one ${m}_weights "$F" $WEIGHTS
    one ${m}_all "$F" "$SHORT,$WEIGHTS,embedding,argmax,lm_head"
    one ${m}_delta "$F" gdn_delta_seq
    one ${m}_router "$F" moe_router_warp
    one ${m}_norms "$F" rms_norm
  fi
  one ${m}_none2 "$F" NONE
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
