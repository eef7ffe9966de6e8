#!/usr/bin/env bash
# GPU call 5: where the host's issue time of a decode step goes (PORTER_PROFILE=host), batch 1 / 8 / 64.
set -uo pipefail
cd "$(dirname "$0")/.."
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
date -u > "$OUT/date.txt"
(timeout 150 env PORTER_PROFILE=host $P bench $G --prefill 128 --batch 1,8,64 --context 128 --steps 16) > "$OUT/host_profile.txt" 2>&1
(timeout 100 $P bench $G --prefill 128 --batch 1,64 --context 128 --steps 32) > "$OUT/plain.txt" 2>&1
cat "$OUT/host_profile.txt"; grep -E "decode|host issue" "$OUT/plain.txt"
