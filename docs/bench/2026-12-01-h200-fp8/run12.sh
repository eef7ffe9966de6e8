#!/usr/bin/env bash
# GPU call 5: the whole gpu.rs binary after the quantized-KV tolerance fix (the kernel test
# binaries passed in call 1 and are set aside).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/gc /tmp/aside
mv .dev/bin/cuda_* .dev/bin/porter_kernels_lib /tmp/aside/
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 280 scripts/gpu-check.sh run --test-threads=1 > /dev/null 2>&1
cp /tmp/gc/summary.txt "$OUT_SAVE/summary.txt"
grep -hE "ratio|panicked|test result|^test " /tmp/gc/gpu.log > "$OUT_SAVE/gpu_tests.txt"
cat "$OUT_SAVE/summary.txt"; grep -E "^test |panicked" "$OUT_SAVE/gpu_tests.txt" | cut -c1-160 | tail -40
