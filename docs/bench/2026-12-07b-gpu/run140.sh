#!/usr/bin/env bash
# Session 32, GPU call 4 (H100): tc6 with one bulk copy a tile. Calls 2-3: tc6 moved the
# stages in 320 row-sized bulk copies a chunk and block (the scratch rows are unpadded, the
# stage rows padded) and was 4× slower than tc5 (8 µs a chunk at clusters of 4, 5.6 at 2),
# whatever the barrier semantics. Now the wu launch writes the scratch in the stage layout
# (`_pad` entries) and a rank sends its share in 4 multicast copies + 1 own (5 a chunk).
# Correctness (tc6 ≡ tc5 bit for bit), the 80B timing at clusters of 4, 2 and 1 (no sharing),
# the 24-layer prefill with tc6 and tc5, Nsight Compute on tc6.
# Carry .dev/porter, .dev/ptx.tgz (the gdn_chunk module compiles on the device), .dev/g.
set -uo pipefail
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
gunzip -c .dev/porter/porter.gz > /tmp/porter_new && chmod +x /tmp/porter_new; P=/tmp/porter_new
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
T0=$(date +%s); left() { echo $(( 560 - $(date +%s) + T0 )); }
T="--nocapture --include-ignored --test-threads=1"
G=.dev/g/cuda_gdn_chunk
timeout 200 $G $T --exact cuda_gdn_chunked_seq_tc cuda_gdn_chunked_seq_spans > $L/gdn_tc.log 2>&1; echo "[$SECONDS s] gdn_tc rc=$? $(grep -E '^test result' $L/gdn_tc.log)"
grep -E "bit for bit" $L/gdn_tc.log | sort | uniq -c
grep -E "panicked|FAILED|failed comparisons|differs|expected the" $L/gdn_tc.log | head -10
for cl in 4 2 1; do
  timeout 60 env PORTER_GDN_TC6_CLUSTER=$cl $G $T --exact cuda_gdn_chunked_seq_80b_prefill > $L/gdn_80b_c$cl.log 2>&1; echo "[$SECONDS s] 80b c$cl rc=$?"
  grep -E "\[tc[56]\] per|tc6 vs|panicked" $L/gdn_80b_c$cl.log | head -8
done
B="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --prefill 4096 --batch 1 --context 128 --steps 8"
for f in tc6 tc5; do
  [ $(left) -gt 130 ] || { echo "bench $f skipped (time)"; continue; }
  timeout 110 env PORTER_GDN_CHUNK=$f $P bench $B > $L/bench_$f.log 2>&1; echo "[$SECONDS s] bench $f rc=$? $(grep -E '^prefill' $L/bench_$f.log | head -2 | tr '\n' ' ')"
done
M="--metrics lts__t_bytes.sum.per_second,lts__t_bytes.sum,dram__bytes.sum.per_second,regex:smsp__average_warps_issue_stalled_(long_scoreboard|wait|barrier|membar|short_scoreboard)_per_issue_active\.ratio"
if [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 10 )) $NCU --clock-control none --kernel-name regex:'gdn_chunk_tc6_state' --launch-count 1 $M --section SpeedOfLight \
    $G --include-ignored --exact --nocapture cuda_gdn_chunked_seq_80b_prefill > $L/ncu.txt 2>&1
  echo "[$SECONDS s] ncu rc=$?"
  grep -vE "^\s*$|^    ---|^==PROF==" $L/ncu.txt | grep -E "gdn_chunk_tc|Duration|Throughput|lts__|dram__|stalled" | head -20
fi
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
echo "[$SECONDS s] done"
