#!/usr/bin/env bash
# Session 24, GPU call 6 (H100): the delta rule's norm in its whole-head form
# (PORTER_GDN_NORM=head) against the column blocks with a count (delta, the default) and the
# separate launch (apart); the last block's state store after the norm and the z prefetch.
# Parity: cuda_gdn_seq (both forms), gpu_graphs, gpu, gpu with the fallback forced and with
# PORTER_GDN_NORM=head.
# Carry .dev/porter, .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in cuda_gdn_seq gpu_graphs gpu; do
    timeout 100 .dev/k/$t $T > $L/$t.log 2>&1; echo "[$SECONDS s] $t rc=$? $(grep -E '^test result' $L/$t.log)"
done
PORTER_CUDA_FALLBACK=1 timeout 100 .dev/k/gpu $T > $L/gpu_fallback.log 2>&1; echo "[$SECONDS s] gpu (fallback forced) rc=$? $(grep -E '^test result' $L/gpu_fallback.log)"
PORTER_GDN_NORM=head timeout 100 .dev/k/gpu $T > $L/gpu_head.log 2>&1; echo "[$SECONDS s] gpu (PORTER_GDN_NORM=head) rc=$? $(grep -E '^test result' $L/gpu_head.log)"
PORTER_GDN_NORM=head timeout 100 .dev/k/gpu_graphs $T > $L/gpu_graphs_head.log 2>&1; echo "[$SECONDS s] gpu_graphs (head) rc=$? $(grep -E '^test result' $L/gpu_graphs_head.log)"
grep -E "panicked" $L/*.log | head -5
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
B="--prefill 16 --batch 1,2,4,8 --context 128 --steps 64"
one() { # label, env, model flags, bench flags
    env $2 timeout 90 $P bench $3 $4 > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($2) rc=$?"
    grep -E "^decode batch" $L/$1.log | sed -E 's/ +/ /g'
}
for r in 1 2; do
    one delta_$r X=1 "$G" "$B"
    one head_$r PORTER_GDN_NORM=head "$G" "$B"
    one apart_$r PORTER_GDN_NORM=apart "$G" "$B"
done
F="$G --quantize fp8"; B1="--prefill 16 --batch 1 --context 128 --steps 64"
one fp8_delta X=1 "$F" "$B1"
one fp8_head PORTER_GDN_NORM=head "$F" "$B1"
one fp8_apart PORTER_GDN_NORM=apart "$F" "$B1"
one mtp_head PORTER_GDN_NORM=head "$G" "--prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3"
grep -E "^mtp (baseline|k=3)" $L/mtp_head.log
for m in delta head; do
    s=$(env PORTER_GDN_NORM=$m PORTER_KNOCKIN=gdn_delta_seq timeout 60 $P bench $G $B1 2>&1 | grep -E '^decode batch' | sed -E 's/.*\(([0-9.]+) ms\/step.*/\1/')
    echo "knockin gdn_delta_seq ($m) $s"
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
