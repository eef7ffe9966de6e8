#!/usr/bin/env bash
# Session 24, GPU call 7 (H100): the final tree (the whole-head norm the default up to 4
# sequences). Parity: gpu_graphs, gpu, gpu with the fallback forced, the kernel tests this
# session touched. The issue's bench command's rows on this card, FP8, MTP K = 3; then session
# 15's one-launch GDN step at 2 and 4 lanes a column beside the default.
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in gpu_graphs gpu cuda_gdn_seq cuda_moe_route cuda_qk_prep cuda_router; do
    timeout 100 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
PORTER_CUDA_FALLBACK=1 timeout 100 .dev/k/gpu $T > $L/gpu_fallback.log 2>&1; echo "[$SECONDS s] gpu (fallback forced) rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
grep -E "panicked" $L/*.log | head -5
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
one() { # label, env, model flags, bench flags
    env $2 timeout 90 $P bench $3 $4 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($2) rc=$?"
    grep -E "^(prefill|decode batch)|host issue" $L/$1.log | sed -E 's/ +/ /g'
}
one issue X=1 "$G" "--prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32"
one fp8 X=1 "$G --quantize fp8" "--prefill 4096 --batch 1,8,64 --context 128 --steps 32"
one mtp X=1 "$G" "--prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3"
grep -E "^mtp (baseline|k=)" $L/mtp.log
B="--prefill 16 --batch 1,2,4 --context 128 --steps 64"
one default X=1 "$G" "$B"
one fused2 "PORTER_GDN_FUSED=on PORTER_GDN_FUSED_LANES=2" "$G" "$B"
one fused4 "PORTER_GDN_FUSED=on PORTER_GDN_FUSED_LANES=4" "$G" "$B"
one default_2 X=1 "$G" "$B"
one fused2_fp8 "PORTER_GDN_FUSED=on PORTER_GDN_FUSED_LANES=2" "$G --quantize fp8" "--prefill 16 --batch 1 --context 128 --steps 64"
one default_fp8 X=1 "$G --quantize fp8" "--prefill 16 --batch 1 --context 128 --steps 64"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
