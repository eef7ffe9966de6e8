#!/usr/bin/env bash
# Session 11, second GPU call: programmatic dependent launch of the decode GEMVs (bf16 and FP8;
# weights prefetched into L2 while the norm before them runs) A/B against PORTER_PDL=0, with the
# mma attention now the default; the model suites on this build (gpu.rs: every model's parity,
# graphs, FP8, MTP; gpu_graphs.rs: graph ≡ eager: in run33.sh, right after); the moegemm helper's streamed MoE prefill GEMM
# (PORTER_MOE_GEMM=pipe) and the 48-row tile cap.
# Also the wgmma attention (PORTER_ATTN_TC=wgmma) and the async direct MoE decode kernels
# (PORTER_MOE_DOWN=async, PORTER_MOE_GU=async) and the fused Gated DeltaNet decode step
# (PORTER_GDN_DECODE=fused) of this session's helpers, with their kernel tests.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin/{gpu,gpu_graphs,cuda_moe,cuda_attention_mma,cuda_moe_decode,cuda_moe_shared,cuda_gdn_fused}.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L
S=$L/summary.txt
{ date -u; echo "PTX cache: ${PORTER_KERNEL_CACHE:-none} $(ls ${PORTER_KERNEL_CACHE:-/x} 2>/dev/null | wc -l) files"; } > $S
T0=$(date +%s)
t() { local name=$1; shift; local s=$(date +%s); [ $(( s - T0 + $2 )) -gt 570 ] && { echo "$name skipped (time)" >> $S; return; }; "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' "$L/$name.log" | tail -1)" >> $S; }
T="--nocapture --include-ignored --test-threads=1"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
t bf16_24 timeout 120 $P bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 --json "$L/bf16_24.json"
t bf16_nopdl timeout 50 env PORTER_PDL=0 $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t dec_gdn timeout 50 env PORTER_GDN_DECODE=fused $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t dec_async timeout 50 env PORTER_MOE_DOWN=async PORTER_MOE_GU=async $P bench $G --prefill 16 --batch 1,8,64 --context 128 --steps 32
t pf_pipe timeout 50 env PORTER_MOE_GEMM=pipe $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 4
t pf_wgmma timeout 50 env PORTER_ATTN_TC=wgmma $P bench $G --prefill 4096,32768 --batch 1 --context 128 --steps 4
t k_gdn_fused timeout 60 .dev/bin/cuda_gdn_fused $T
t k_attn timeout 60 .dev/bin/cuda_attention_mma $T
t k_moe timeout 60 .dev/bin/cuda_moe $T moe_small moe_uneven moe_80b_bf16 moe_80b_forms_timed
t k_moe_shared timeout 45 .dev/bin/cuda_moe_shared $T moe_shared_
t k_moe_dec timeout 80 .dev/bin/cuda_moe_decode $T moe_decode_
cat $S
grep -hE "panicked|FAILED|failed:" $L/*.log | head -20
for f in bf16_24 bf16_nopdl dec_gdn dec_async pf_pipe pf_wgmma; do echo "== $f"; grep -vE "^  profile" "$L/$f.log" | grep -E "prefill|decode|mtp|roofline|rror" | head -14; done
grep -E "forms|tiles|pipe" $L/k_moe.log | grep -v "max abs" | head -30
grep -E "TIME|wgmma|Wgmma" $L/k_attn.log | grep -v "max abs" | head -30
grep -E "80b t=1 |async" $L/k_moe_dec.log $L/k_moe_shared.log | grep -v "max abs" | head -30
grep -E "fused|chain|µs|us" $L/k_gdn_fused.log | grep -v "max abs" | head -20
tar czf $OUT/logs.tgz -C $OUT logs
