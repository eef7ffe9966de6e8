#!/usr/bin/env bash
# Session 6, GPU call 1: CUDA graphs on their own stream (never run on a GPU before). gpu_graphs
# tests, then the 24-layer 80B bf16 bench with graphs (PORTER_CUDA_GRAPHS=1, + MTP oracle
# K=1..3) and with --enforce-eager in the same session, and a per-block device-time profile
# of eager decode (PORTER_PROFILE=1). Run from the repo root with .dev/ carried.
set -uo pipefail
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > "$OUT/date.txt"
python3 - >> "$OUT/date.txt" 2>&1 <<'PY'
import torch, os, glob
print("torch", torch.__version__, "cuda", torch.version.cuda)
import nvidia; d = os.path.dirname(nvidia.__path__[0])
print(sorted(set(os.path.basename(p) for p in glob.glob(d + "/nvidia/**/lib*.so.1[23]*", recursive=True))))
PY
(RUST_BACKTRACE=1 timeout 190 .dev/bin/gpu_graphs --nocapture --include-ignored --test-threads=1) > "$OUT/gpu_graphs.log" 2>&1
echo "gpu_graphs rc=$?" >> "$OUT/date.txt"
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
(PORTER_CUDA_GRAPHS=1 timeout 170 $P bench $G --prefill 4096 --batch 1,8,64 --context 128 --steps 64 --mtp-step 3 --json "$OUT/graphs.json") > "$OUT/bench_graphs.txt" 2>&1
echo "bench graphs rc=$?" >> "$OUT/date.txt"
(timeout 120 $P bench $G --enforce-eager --prefill 4096 --batch 1,8,64 --context 128 --steps 64 --mtp-step 3 --json "$OUT/eager.json") > "$OUT/bench_eager.txt" 2>&1
echo "bench eager rc=$?" >> "$OUT/date.txt"
(PORTER_PROFILE=1 timeout 70 $P bench $G --enforce-eager --prefill 16 --batch 1,64 --context 128 --steps 8) > "$OUT/profile.txt" 2>&1
echo "profile rc=$?" >> "$OUT/date.txt"
cat "$OUT/date.txt"
grep -E "^test |panicked|graphs captured|GraphStats|failed|error" "$OUT/gpu_graphs.log" | cut -c1-400 | head -40
for f in bench_graphs bench_eager; do echo "== $f"; grep -vE "^  profile" "$OUT/$f.txt" | tail -24; done
