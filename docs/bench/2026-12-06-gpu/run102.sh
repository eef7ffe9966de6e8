#!/usr/bin/env bash
# Session 25, GPU call 1: the two folds of the FP8 model's extra launches (the shared expert's
# gate / up in the direct gate+up launch, 9e63ab9; in_proj_ba in the conv + gates launch,
# 4d464f6), their kernel tests and the model suites, then FP8 / bf16 batch-1 steps against
# session 24's binary (porter_old) and with PORTER_GDN_BA=apart.
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
gunzip -c .dev/porter/porter_old.gz > /tmp/porter_old && chmod +x /tmp/porter_old
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in cuda_moe_shared_w cuda_gdn_ba cuda_moe_shared cuda_moe_route cuda_router cuda_gdn_seq gpu gpu_graphs; do
    timeout 120 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
PORTER_CUDA_FALLBACK=1 timeout 120 .dev/k/gpu $T > $L/gpu_fallback.log 2>&1; echo "[$SECONDS s] gpu (fallback) rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
grep -hE "panicked|FAILED|failed" $L/*.log | head -12
grep -hE "weights vs columns|proj_timed|us/call|µs" $L/cuda_moe_shared_w.log $L/cuda_gdn_ba.log | head -40
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B1="--prefill 16 --batch 1 --context 128 --steps 64"
one() { # label, binary, env, model flags, bench flags
    env $3 timeout 90 $2 bench $4 $5 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($3) rc=$?"
    grep -E "^decode batch" $L/$1.log | sed -E 's/ +/ /g'
}
for r in 1 2; do
    one fp8_old_$r /tmp/porter_old X=1 "$G --quantize fp8" "$B1"
    one fp8_new_$r /tmp/porter_new X=1 "$G --quantize fp8" "$B1"
    one fp8_ba_apart_$r /tmp/porter_new PORTER_GDN_BA=apart "$G --quantize fp8" "$B1"
done
one bf16_old /tmp/porter_old X=1 "$G" "$B1"
one bf16_new /tmp/porter_new X=1 "$G" "$B1"
one fp8_new_b /tmp/porter_new X=1 "$G --quantize fp8" "--prefill 16 --batch 1,8,64 --context 128 --steps 32"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
