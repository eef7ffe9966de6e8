#!/usr/bin/env bash
# Session 35, call 2: the tc4 wu launch with Tu = T diag(β) and Tw = T diag(β e^G) rounded in
# one pass after the inverse (swizzled [64][64] in Qb's place) and −W / U from them by ldmatrix,
# the kk loop unrolled (new: .dev/n, main `1d317f1`), against `88db060` (old: .dev/o), alternating on
# one machine; FLA beside them; correctness (cuda_gdn_chunk and gpu of new); on an H200 also the
# GPU-speed issue's command, the serving benchmark and transformers + FLA (hf_bench.py) on the
# same geometry; then the new wu launch's stalls by SASS instruction if time is left.
# Carry .dev/n, .dev/o, .dev/p (porter.gz), .dev/ptx.tgz (both trees' cubins), .dev/whl.
set -uo pipefail
mkdir -p /tmp/porter-ptx && tar xzf .dev/ptx.tgz -C /tmp/porter-ptx --strip-components=1 && export PORTER_KERNEL_CACHE=/tmp/porter-ptx
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
L=$OUT/logs; mkdir -p $L
B="--include-ignored --exact --nocapture cuda_gdn_chunked_seq_80b_prefill"
for i in 1 2 3; do
  for v in n o; do
    timeout 60 .dev/$v/cuda_gdn_chunk $B > $L/ab_${v}_$i.log 2>&1; echo "[$SECONDS s] $v run $i rc=$?"
    grep -E "\[tc6\]|≡" $L/ab_${v}_$i.log | head -8
  done
done
for v in n; do
  timeout 150 .dev/$v/cuda_gdn_chunk $T --skip nvrtc > $L/chunk_$v.log 2>&1; echo "[$SECONDS s] cuda_gdn_chunk $v rc=$?"
  grep -E "test result|FAIL|fails|≡|panicked|max" $L/chunk_$v.log | head -20
done
python3 -m pip install --no-index --no-deps .dev/whl/*.whl > $L/pip.log 2>&1
timeout 120 python3 scripts/fla_gdn_bench.py --tokens 4096,16384 2>&1 | tail -2
timeout 180 .dev/n/gpu $T > $L/gpu.log 2>&1; echo "[$SECONDS s] gpu rc=$?"; grep -E "test result|FAILED|panicked" $L/gpu.log | head
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem" -gt 100000 ]; then
  # On an H200: the GPU-speed issue's command with this tree, and its peers on the same day and
  # GPU: transformers + FLA on the same geometry, and the serving benchmark with graphs on.
  gunzip -c .dev/p/porter.gz > /tmp/porter && chmod +x /tmp/porter
  G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
  timeout 150 /tmp/porter bench $G --prefill 4096,32768 --batch 1,8,64 --context 128 --steps 32 > $L/bf16.log 2>&1; echo "[$SECONDS s] bench bf16 rc=$?"
  grep -E "^(device|HBM|prefill|decode)|host issue|not captured" $L/bf16.log | head -12
  timeout 120 /tmp/porter bench --serve $G --num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64 > $L/serve.log 2>&1; echo "[$SECONDS s] serve rc=$?"
  grep -iE "output tok|ttft|tpot|request" $L/serve.log | head -8
  timeout 200 python3 scripts/hf_bench.py --layers 24 --prefill 4096 --batch 1,8,64 --context 128 --steps 8 > $L/hf_24.log 2>&1; echo "[$SECONDS s] hf rc=$?"
  tail -8 $L/hf_24.log
fi
if [ $SECONDS -lt 380 ]; then
  NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  timeout 120 $NCU --clock-control none --kernel-name regex:'gdn_chunk_tc4_wu' --launch-count 1 \
    --section SourceCounters --section WarpStateStats -o $OUT/wu .dev/n/cuda_gdn_chunk $B > $L/ncu_run.txt 2>&1; echo "[$SECONDS s] ncu rc=$?"
  timeout 40 $NCU -i $OUT/wu.ncu-rep --page source --csv --print-source sass > $OUT/wu_sass.csv 2> $L/page.err; echo "page rc=$?"
  rm -f $OUT/wu.ncu-rep; gzip $OUT/wu_sass.csv
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
