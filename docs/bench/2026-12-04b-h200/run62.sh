#!/usr/bin/env bash
# Session 17, call 3: the FP8 MoE decode kernels with the affine scale-row map (no rs load) and
# the in-flight down kernel. Suites and kernel parity; benches batch 1 / 2 / 4 (bf16 24 layers,
# FP8 48 layers); the down kernel's cost in place again (knockout); and with PORTER_KNOCKIN
# (a launch issued twice) the cost in place of idempotent kernels: the router above all, whose
# knockout (call 1) also changed the experts read.
# Carry .dev/porter, .dev/ptx.tgz, .dev/bin, .dev/k.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
F="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --quantize fp8"
T="--test-threads=1 --skip bench_"
step() { grep -E 'decode batch' "$1" | sed 's/ms\/step.*/ms)/' | tr -s ' ' | tr '\n' ' '; }
timeout 150 .dev/bin/gpu $T --include-ignored > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu: $(grep -E '^test result' $L/gpu.log)"
timeout 60 .dev/bin/gpu_graphs $T --include-ignored > $L/gpu_graphs.log 2>&1; echo "[$SECONDS s] gpu_graphs: $(grep -E '^test result' $L/gpu_graphs.log)"
for b in cuda_moe_shared cuda_fp8; do
  timeout 150 .dev/k/$b --test-threads=1 --include-ignored --skip nvrtc --skip timing --skip speed --nocapture > $L/$b.log 2>&1
  echo "[$SECONDS s] $b: $(grep -E '^test result' $L/$b.log)"; grep -E "panicked|FAILED" $L/$b.log | head -5
done
b1() { timeout 60 $P bench "$@" --prefill 16 --batch 1,2,4 --context 128 --steps 32; }
for rep in 1 2; do
  b1 $G > $L/bf16_$rep.log 2>&1; echo "[$SECONDS s] bf16: $(step $L/bf16_$rep.log)"
  b1 $F > $L/fp8_$rep.log 2>&1; echo "[$SECONDS s] fp8: $(step $L/fp8_$rep.log)"
done
one() { timeout 40 $P bench "$@" --prefill 16 --batch 1 --context 128 --steps 32; }
PORTER_KNOCKOUT=moe_dir_down one $F > $L/ko_fp8_down.log 2>&1; echo "[$SECONDS s] fp8 -down: $(step $L/ko_fp8_down.log)"
PORTER_KNOCKOUT=moe_dir_gu one $F > $L/ko_fp8_gu.log 2>&1; echo "[$SECONDS s] fp8 -gu: $(step $L/ko_fp8_gu.log)"
for p in moe_router_warp_f32 gemv_bf16_f32_m1@772 moe_dir_gu_sh_bf16 moe_dir_downa_sh_bf16 gemv_bf16_bf16_m1@1544 gemv_bf16_bf16_m1@1024 attention_decode gdn_delta_seq gdn_conv_gates gated_norm_z add_rms_norm_bf16_bf16 add_rms_norm_f32y; do
  PORTER_KNOCKIN=$p one $G > $L/ki_bf16_$p.log 2>&1; echo "[$SECONDS s] bf16 +$p: $(step $L/ki_bf16_$p.log)"
done
for p in moe_router_warp_f32 moe_dir_downa_sh_fp8 moe_dir_gu_sh_fp8 fp8_gemvx fp8_gemvt_bf16_bf16@128; do
  PORTER_KNOCKIN=$p one $F > $L/ki_fp8_$p.log 2>&1; echo "[$SECONDS s] fp8 +$p: $(step $L/ki_fp8_$p.log)"
done
grep -hE "panicked|FAILED|failed:|Error" $L/*.log | sort | uniq -c | head
echo "[$SECONDS s] done"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
