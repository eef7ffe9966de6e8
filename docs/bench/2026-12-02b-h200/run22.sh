#!/usr/bin/env bash
# Session 7, spare device time: Nsight Compute details (full set) of the decode kernels that
# hold batch 1 back (direct MoE gate+up / down, the skinny GEMVs, the router), bf16, 4 layers,
# for the next session to read (occupancy, DRAM throughput, warp stall reasons).
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
mkdir -p $OUT/l
E4="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 4 --enforce-eager --prefill 16 --context 128 --steps 1 --batch 1"
timeout 150 ncu --clock-control none --set full -k 'regex:moe_dir|gemv_bf16_bf16_m1|moe_router' --launch-skip 60 --launch-count 8 \
  --csv --page details $P bench $E4 > $OUT/l/ncu_full.csv 2> $OUT/l/ncu_full.err
echo rc=$?
python3 - "$OUT/l/ncu_full.csv" <<'PY' | tee $OUT/l/ncu_full_summary.txt
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
want = ("Duration", "DRAM Throughput", "Memory Throughput", "Achieved Occupancy", "Registers Per Thread",
        "Theoretical Occupancy", "Compute (SM) Throughput", "Grid Size", "Block Size", "L2 Hit Rate",
        "Warp Cycles Per Issued Instruction", "Issue Slots Busy", "Executed Ipc Active")
cur = None
for r in csv.DictReader(lines):
    k = (r["ID"], r["Kernel Name"])
    if k != cur:
        cur = k
        print("==", r["ID"], r["Kernel Name"][:60])
    if r["Metric Name"] in want:
        print(f'   {r["Metric Name"]:<36} {r["Metric Value"]:>12} {r["Metric Unit"]}')
PY
tail -3 $OUT/l/ncu_full.err
