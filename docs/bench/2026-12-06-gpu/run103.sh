#!/usr/bin/env bash
# Session 25, GPU call 2 (H100): cuda_moe_shared_w after its test fix (row 0 alone got the
# batch's gate logits); cuda_gdn_ba, cuda_gdn_seq, gpu, gpu_graphs after the conv + gates
# launch's two argument lists became one; the final tree's figures: the GPU-speed issue's bench command, FP8
# (24 layers) at batch 1 / 8 / 64 with prefill 4k, MTP K = 3 (bf16 and FP8); and the FP8
# batch-1 step by knock-in (the fused launches' cost in place).
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in cuda_moe_shared_w cuda_gdn_ba cuda_gdn_seq gpu gpu_graphs; do
    timeout 120 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
grep -hE "panicked" $L/*.log | head -4
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 120 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bench.log 2>&1; echo "[$SECONDS s] bench G rc=$?"
grep -E "^(device|HBM|prefill|decode)|host issue|not captured|memory" $L/bench.log
timeout 120 $P bench $G --quantize fp8 --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/fp8.log 2>&1; echo "[$SECONDS s] bench FP8 rc=$?"
grep -E "^(prefill|decode)" $L/fp8.log
timeout 60 $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp rc=$?"
grep -E "^mtp (baseline|k=)" $L/mtp.log
timeout 60 $P bench $G --quantize fp8 --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_fp8.log 2>&1; echo "[$SECONDS s] mtp fp8 rc=$?"
grep -E "^mtp (baseline|k=)" $L/mtp_fp8.log
B="--prefill 16 --batch 1 --context 128 --steps 64"
one() { # label, model flags, rule
    local s; s=$(env PORTER_KNOCKIN=$3 timeout 60 $P bench $2 $B 2>&1 | grep -E '^decode batch' | sed -E 's/.*\(([0-9.]+) ms\/step.*/\1/')
    echo "$1 $3 $s"
}
PORTER_LAUNCH_TRACE=400 timeout 60 $P bench $G --quantize fp8 $B > $L/trace_fp8.txt 2>&1
for k in NONE moe_dir_gu_sh_fp8 moe_dir_downa_sh_fp8 gdn_conv_gates_proj gdn_conv_gates_seq gdn_delta_seq moe_router_warp fp8_gemvx NONE; do
    one fp8 "$G --quantize fp8" $k
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
