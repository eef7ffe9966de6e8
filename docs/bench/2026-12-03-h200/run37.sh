#!/usr/bin/env bash
# Session 12, call 3 (early): the tensor-core paged decode attention (helper attndec) and the
# chunked GDN forms tc2 / tc3 (helper gdntc), kernel tests only: parity, batch invariance,
# timings beside the old kernels. Carry .dev/early/{cuda_attention,cuda_gdn_chunk}, .dev/ptx.tgz.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; S=$L/summary.txt; date -u > $S
T="--nocapture --include-ignored --test-threads=1"
r() { local n=$1; shift; timeout "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -E '^test result' $L/$n.log | tail -1)" >> $S; }
A=.dev/early/cuda_attention; G=.dev/early/cuda_gdn_chunk
r dec_timing 90 $A $T --exact attention_decode_mma_timing
r dec_parity 90 $A $T --exact attention_decode_mma_parity
r dec_inv 60 $A $T --exact attention_decode_mma_batch_invariant
r gdn 150 $G $T cuda_gdn_chunked_seq
r gdn_bv16 60 env PORTER_GDN_TC2_BV=16 $G $T --exact cuda_gdn_chunked_seq_80b_prefill
r dec_legacy_tests 60 env PORTER_ATTN_DECODE=mma $A $T attention_decode_batch attention_sliding_window
cat $S; grep -hE "panicked|FAILED|failed|FAIL" $L/*.log | head -20
grep -E "TIME|us|GB/s" $L/dec_timing.log | head -40
grep -E "µs|TFLOP" $L/gdn.log | grep -E "80B|launch|total|call" | tail -30
grep -E "µs|TFLOP" $L/gdn_bv16.log | grep -E "80B" | tail -10
tar czf $OUT/logs.tgz -C $OUT logs
