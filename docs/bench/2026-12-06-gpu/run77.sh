#!/usr/bin/env bash
# Session 21, GPU call 2 (H100; the H200 was not lent):
# (1) decode attention's 8-item form (the V2 kernel transposed where a block has at most 8
#     items: batch-1 decode at GQA group 8): the mma decode parity and batch-invariance tests
#     (every form, mma4-n8 = with it), the timing test (mma4 vs mma4-n8 side by side),
#     and the model suite `gpu`;
# (2) the bench after the memory-pool trim (call 1: a 32k prefill that ran out of memory left
#     3.9 GB in the pool and every decode row after it was skipped), decode at batch 1, 2, 4,
#     8, 64, and at 32k context with and without the 8-item form;
# (3) the MTP rows with the MoE decode form forced to direct (dense experts take v1 above 16
#     pairs by default, tuned on the H200) against the default, and the MoE decode forms at
#     t = 1, 2, 4, 8 on this card.
# Carry .dev/porter, .dev/ptx.tgz, .dev/k (cuda_attention, cuda_moe_decode, gpu).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.mem,memory.total --format=csv,noheader
T="--nocapture --include-ignored --test-threads=1"
timeout 150 .dev/k/cuda_attention $T attention_decode --skip attention_decode_timing --skip nvrtc > $L/att_tests.log 2>&1; echo "[$SECONDS s] cuda_attention attention_decode* rc=$?"
grep -E "^test |test result|panicked|FAILED" $L/att_tests.log | head -20
timeout 100 .dev/k/cuda_attention $T --exact attention_qwen3_next_decode > $L/att_q3n.log 2>&1; echo "[$SECONDS s] attention_qwen3_next_decode rc=$? $(grep -E '^test result' $L/att_q3n.log)"
grep -E -A60 "DECODE-AB h16 kvh2 d256 batch 1 ctx 32768" $L/att_tests.log | grep -E "Mma4 |Mma4N8|DECODE" | head -12
grep -E -A60 "DECODE-AB h16 kvh2 d256 batch 1 ctx 131072|DECODE-AB h32 kvh8 d128 batch 1 ctx 32768" $L/att_tests.log | grep -E "DECODE|Mma4 .*per call|Mma4N8 .*per call" | head -12
timeout 100 env PORTER_ATTN_DECODE=mma4-n8 .dev/k/gpu $T > $L/gpu_n8.log 2>&1; echo "[$SECONDS s] gpu, mma4-n8, rc=$? $(grep -E '^test result' $L/gpu_n8.log)"
grep -E "FAILED|panicked" $L/gpu_n8.log | head
timeout 100 .dev/k/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$? $(grep -E '^test result' $L/gpu.log)"
grep -E "FAILED|panicked" $L/gpu.log | head
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
timeout 170 $P bench $G --prefill 4096,32768 --batch 1,2,4,8,64 --context 128 --steps 32 --json $L/bench.json > $L/bench.log 2>&1; echo "[$SECONDS s] bench rc=$?"
grep -vE "^\s*$|profile" $L/bench.log | tail -24
for f in mma4 mma4-n8; do
  timeout 100 env PORTER_ATTN_DECODE=$f $P bench $G --prefill 16 --batch 1,4 --context 32768 --steps 16 > $L/ctx32k_$f.log 2>&1; echo "[$SECONDS s] 32k context, PORTER_ATTN_DECODE=$f rc=$?"
  grep -E "^decode" $L/ctx32k_$f.log
done
timeout 60 .dev/k/cuda_moe_decode --nocapture --include-ignored --exact moe_decode_small_t_timing > $L/moe_t.log 2>&1; echo "[$SECONDS s] moe_decode_small_t_timing rc=$?"
grep -vE "^\s*$" $L/moe_t.log | tail -24
for form in direct auto; do
  timeout 100 env PORTER_MOE_GEMV=$form $P bench $G --prefill 16 --batch 1,2,4 --context 128 --steps 32 > $L/b4_$form.log 2>&1; echo "[$SECONDS s] batch 1,2,4 PORTER_MOE_GEMV=$form rc=$?"
  grep -E "^decode" $L/b4_$form.log
  timeout 120 env PORTER_MOE_GEMV=$form $P bench $G --prefill 16 --batch 1 --context 128 --steps 64 --mtp-step 3 > $L/mtp_$form.log 2>&1; echo "[$SECONDS s] mtp PORTER_MOE_GEMV=$form rc=$?"
  grep -E "^mtp (baseline|k=. forced)" $L/mtp_$form.log
done
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs
