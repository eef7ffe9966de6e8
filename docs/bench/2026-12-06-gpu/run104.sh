#!/usr/bin/env bash
# Session 25, GPU call 3 (H100): call 2's FP8 MTP rows diverged from plain greedy at token 5
# (verify vs decode numerics), so the oracle accepted ~1 %. Which change? FP8 MTP K = 1 with
# session 24's binary, this one, this one with PORTER_GDN_BA=apart, with PORTER_MOE_SHARED=apart
# (the notes say where the output left plain greedy's); then the MTP rows with the oracle's
# sequence found as the speculative path's own fixed point (bench_cmd.rs oracle_sequence).
# Carry .dev/porter, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
gunzip -c .dev/porter/porter_old.gz > /tmp/porter_old && chmod +x /tmp/porter_old
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --quantize fp8 --prefill 16 --batch 1 --context 128 --steps 32 --mtp-step 1"
one() { # label, binary, env
    env $3 timeout 60 $2 bench $F > $L/$1.log 2>&1; echo "[$SECONDS s] $1 ($3) rc=$?"
    grep -E "^mtp (baseline|k=1 forced 100)|note: k=1" $L/$1.log
}
one old /tmp/porter_old X=1
one new /tmp/porter_new X=1
one new_both_apart /tmp/porter_new "PORTER_MOE_SHARED=apart PORTER_GDN_BA=apart"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3"
timeout 120 /tmp/porter_new bench $G --quantize fp8 > $L/mtp_fp8.log 2>&1; echo "[$SECONDS s] mtp fp8 rc=$?"
grep -E "^mtp (baseline|k=)|note: k=[0-9]: the oracle" $L/mtp_fp8.log
timeout 90 /tmp/porter_new bench $G > $L/mtp.log 2>&1; echo "[$SECONDS s] mtp bf16 rc=$?"
grep -E "^mtp (baseline|k=)|note: k=[0-9]: the oracle" $L/mtp.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
