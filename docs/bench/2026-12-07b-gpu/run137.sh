#!/usr/bin/env bash
# Session 32, GPU call 2 (H100; run136.sh never got a machine): the tc6 state sweep of the
# chunked Gated DeltaNet (gdn_chunk_tc6.cu: tc5's sweep with its −W / K̃ / Qg / Pb stages
# multicast across a cluster of the head's column blocks, bulk copies + mbarriers, a producer
# warp) — correctness (every case against the CPU, tc6 ≡ tc5 bit for bit), the 80B-layout
# timing (clusters of 4, then 2), flash-linear-attention 0.6.0 beside it, Nsight Compute on
# the tc5 and tc6 sweeps (is tc5 bound by L2 → SM traffic?), the 24-layer prefill with tc6.
# Carry .dev/porter, .dev/ptx.tgz, .dev/g (cuda_gdn_chunk), .dev/whl.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new; P=/tmp/porter_new
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
T0=$(date +%s)
left() { echo $(( 560 - $(date +%s) + T0 )); }
T="--nocapture --include-ignored --test-threads=1"
G=.dev/g/cuda_gdn_chunk
timeout 150 $G $T --exact cuda_gdn_chunked_seq_tc cuda_gdn_chunked_seq_spans > $L/gdn_tc.log 2>&1; echo "[$SECONDS s] gdn_tc rc=$? $(grep -E '^test result' $L/gdn_tc.log)"
grep -E "bit for bit" $L/gdn_tc.log | sort | uniq -c
grep -E "panicked|FAILED|failed comparisons|differs|expected the" $L/gdn_tc.log | head -10
timeout 90 $G $T --exact cuda_gdn_chunked_seq_80b_prefill > $L/gdn_80b.log 2>&1; echo "[$SECONDS s] gdn_80b rc=$?"
grep -E "\[tc[56]\]|tc[56] vs|panicked" $L/gdn_80b.log | head -16
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl > $L/pip.log 2>&1
timeout 100 env PYTHONPATH=/tmp/site python3 scripts/fla_gdn_bench.py --tokens 4096,16384 > $L/fla.log 2>&1; echo "[$SECONDS s] fla rc=$?"; tail -3 $L/fla.log
B="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --prefill 4096 --batch 1 --context 128 --steps 8"
for f in tc6 tc5; do
  [ $(left) -gt 150 ] || { echo "bench $f skipped (time)"; continue; }
  timeout 120 env PORTER_GDN_CHUNK=$f $P bench $B > $L/bench_$f.log 2>&1; echo "[$SECONDS s] bench $f rc=$? $(grep -E '^prefill' $L/bench_$f.log | head -2 | tr '\n' ' ')"
done
if [ $(left) -gt 100 ]; then
  timeout 60 env PORTER_GDN_TC6_CLUSTER=2 $G $T --exact cuda_gdn_chunked_seq_80b_prefill > $L/gdn_80b_c2.log 2>&1; echo "[$SECONDS s] gdn_80b c2 rc=$?"
  grep -E "\[tc6\]|tc6 vs" $L/gdn_80b_c2.log | head -8
fi
M="--metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_bytes.sum,dram__bytes.sum.per_second,lts__t_sector_hit_rate.pct,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
S="--section SpeedOfLight --section WarpStateStats"
if [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 15 )) $NCU --clock-control none --kernel-name regex:'gdn_chunk_tc[56]_state' --launch-count 2 $M $S \
    $G --include-ignored --exact --nocapture cuda_gdn_chunked_seq_80b_prefill > $L/ncu.txt 2>&1
  echo "[$SECONDS s] ncu rc=$?"
  grep -vE "^\s*$|^    ---|^==PROF==" $L/ncu.txt | grep -E "gdn_chunk_tc|Duration|Throughput|lts__|dram__|hmma|Hit Rate|stalled_(long|short|barrier|wait|mio|lg|math|not_sel|membar|sleep|branch)" | head -60
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
