#!/usr/bin/env bash
# Session 31, GPU call 7: the final tree (fp8_dequant 16-byte runs, FP8 experts on the wgmma
# grouped GEMMs, dense FP8 GEMMs above 64 rows through dequantize + cuBLAS): the model suites,
# the FP8 prefill at 256 ... 32k tokens, the issue commands (FP8 and bf16).
# Carry .dev/porter (porter.gz), .dev/k.tgz, .dev/ptx.tgz.
set -uo pipefail
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new
P=/tmp/porter_new
tar xzf .dev/k.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
L=$OUT/logs; mkdir -p $L
ok() { [ $SECONDS -lt 300 ] || { echo "[$SECONDS s] out of time: skipped $*"; return 1; }; }
t() { local name=$1 to=$2; shift 2; ok $name || return; timeout $to "$@" > $L/$name.log 2>&1; echo "[$SECONDS s] $name rc=$? $(grep -E '^test result' $L/$name.log | tr '\n' ' ')"; }
t gpu 90 .dev/k/gpu $T
t graphs 60 .dev/k/gpu_graphs $T
grep -hE "panicked|FAILED" $L/*.log | head -8
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
for r in 1 2; do
  echo "[$SECONDS s] r$r fp8: $(timeout 60 $P bench $G --quantize fp8 --prefill 256,512,1024,2048,4096 --batch 1 --context 128 --steps 4 2>&1 | grep -E '^prefill' | sed -E 's/ +/ /g;s/prefill //;s/ tokens:/:/' | tr '\n' ' ')"
done
if ok issue_fp8; then
  timeout 90 $P bench $G --quantize fp8 --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/issue_fp8.log 2>&1; echo "[$SECONDS s] issue bench fp8 rc=$?"
  grep -E "^(HBM|prefill|decode)|host issue" $L/issue_fp8.log | head -10
fi
if ok issue_bf16; then
  timeout 90 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 32 > $L/issue_bf16.log 2>&1; echo "[$SECONDS s] issue bench bf16 rc=$?"
  grep -E "^(HBM|prefill|decode)|host issue|memory after" $L/issue_bf16.log | head -10
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
