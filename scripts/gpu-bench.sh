#!/usr/bin/env bash
# GPU benchmarks for docs/benchmarks.md, on the GPU machine (no cargo there).
#
#   HERE:  scripts/gpu-check.sh stage            # builds .dev/porter/porter (and test binaries)
#          python3 -m pip download ... -d .whl flash-linear-attention fla-core   # optional, for FLA
#   THERE: scripts/gpu-bench.sh [porter|hf|all]  # carry .dev (and .whl); logs + JSON under $OUT
#
# porter: the Qwen3-Next-80B-A3B geometry (runner/presets/qwen3-next-80b-a3b.json) with 24 of
# its 48 layers in bf16 and random weights generated on the device; prefill 1k/4k/32k, decode
# batch 1/8/64. hf: transformers' Qwen3NextForCausalLM on the same geometry and GPU
# (scripts/hf_bench.py), with the flash-linear-attention kernels when the wheels are carried.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.dev/out}
mkdir -p "$out"
what=${1:-all}
for f in libnvrtc.so.13 libcublas.so.13; do
    p=$(ls /usr/local/cuda/lib64/$f 2>/dev/null || find /usr/local /opt /usr/lib -name "$f" 2>/dev/null | head -n 1)
    [ -n "$p" ] && export LD_LIBRARY_PATH="$(dirname "$p")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export PORTER_CUDA_INCLUDE=${PORTER_CUDA_INCLUDE:-/usr/local/cuda/include}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.mem --format=csv,noheader | tee "$out/gpu.txt"
layers=${LAYERS:-24}
if [ "$what" = porter ] || [ "$what" = all ]; then
    .dev/porter/porter bench --device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers "$layers" \
        --prefill "${PREFILL:-1024,4096,32768}" --batch "${BATCH:-1,8,64}" --context "${CONTEXT:-128}" \
        --steps "${STEPS:-32}" ${PORTER_EXTRA:-} --json "$out/porter-80b-${layers}l.json" 2>&1 | tee "$out/porter.log"
fi
if [ "$what" = hf ] || [ "$what" = all ]; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            && export PYTHONPATH=/tmp/site
    fi
    PYTHONUNBUFFERED=1 python3 scripts/hf_bench.py --layers "$layers" --prefill "${HF_PREFILL:-1024,4096}" \
        --batch "${BATCH:-1,8,64}" --context "${CONTEXT:-128}" --steps "${HF_STEPS:-8}" \
        --json "$out/hf-80b-${layers}l.json" 2>&1 | tee "$out/hf.log"
fi
