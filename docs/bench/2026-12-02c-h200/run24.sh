#!/usr/bin/env bash
# Session 8, second GPU call: the helpers' kernels. Blockwise inverse in the chunked GDN
# (gdninv), the fused shared expert + warp top-k router (moeshared), the FP8 GEMV with the
# scale after the chunk (fp8gemv), the FP8 GDN ba read in place (gdn_seq), v1 MoE decode
# with the next item prefetched. Kernel tests only (timings + parity).
# Carry .dev (bin/{cuda_gdn_chunk,cuda_router,cuda_moe_shared,cuda_moe_decode,cuda_fp8,cuda_gdn_seq}).
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
date -u > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 575 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
t k_gdn_chunk timeout 150 .dev/bin/cuda_gdn_chunk $T
t k_router timeout 40 .dev/bin/cuda_router $T
t k_fp8 timeout 150 .dev/bin/cuda_fp8 $T
t k_moe_shared timeout 150 .dev/bin/cuda_moe_shared $T
t k_moe_decode timeout 120 .dev/bin/cuda_moe_decode $T
t k_gdn_seq timeout 60 .dev/bin/cuda_gdn_seq $T
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -30
grep -hE "80B|per launch|\[tc\]|\[f32\]" $L/k_gdn_chunk.log | head -20
grep -hE "µs|us " $L/k_router.log | head -10
grep -hE "GB/s|µs" $L/k_fp8.log | head -40
grep -hE "µs|costs" $L/k_moe_shared.log | head -20
grep -hE "µs" $L/k_moe_decode.log | head -30
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
