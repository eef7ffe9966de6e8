#!/usr/bin/env bash
# GPU check of porter's CUDA kernels, for a GPU machine that has no cargo.
#
# Two steps:
#   scripts/gpu-check.sh stage   # HERE (with cargo): builds the release test binaries of
#                                # porter-kernels (kernels vs CPU) and of tests/tests/gpu.rs
#                                # (every model's parity on CUDA) into .dev/bin/, and the
#                                # porter binary into .dev/porter/, and with NVRTC 13 in
#                                # target/nvrtc the cubin of every module for sm_90
#                                # (`porter kernels`) into .dev/ptx.tgz (all git-ignored)
#   scripts/gpu-check.sh         # THERE (repo root, .dev/ carried along): runs every binary
#                                # in .dev/bin/ with --nocapture --include-ignored (the GPU
#                                # and NVRTC tests are #[ignore]d elsewhere); logs under $OUT
#                                # (or .dev/out); .dev/ptx.tgz becomes the kernel cache
#
# On the GPU machine it finds libnvrtc.so.13 (CUDA toolkit or the nvidia-cuda-nvrtc wheel)
# and the CUDA headers (PORTER_CUDA_INCLUDE, else /usr/local/cuda/include, else the
# nvidia-cuda-runtime wheel), prints what it found, and exits non-zero if a binary fails.
# Pass extra test-harness arguments after the mode, e.g. `scripts/gpu-check.sh run cuda_rope`;
# GPU_CHECK_TIMEOUT=SECONDS bounds each binary (exit 124 when it ran out).
set -uo pipefail
cd "$(dirname "$0")/.."

mode=${1:-run}
[ $# -gt 0 ] && shift

if [ "$mode" = stage ]; then
    set -e
    mkdir -p .dev/bin
    rm -f .dev/bin/*
    mkdir -p .dev/porter
    cargo build -p runner --release
    cp target/release/porter .dev/porter/porter
    { cargo test -p porter-kernels --release --no-run --message-format=json;
      cargo test -p tests --test gpu --test gpu_graphs --release --no-run --message-format=json; } |
        python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        name = m["target"]["name"] + ("_lib" if "lib" in m["target"]["kind"] else "")
        shutil.copy2(m["executable"], ".dev/bin/" + name)
        print("staged .dev/bin/" + name)
'
    # Symbols stripped: a quarter fewer bytes (.dev must fit the device tool's 64 MiB).
    strip .dev/bin/* .dev/porter/porter || echo "warning: strip failed; .dev stays unstripped" >&2
    # The PTX of every module for the H200 (sm_90; with GPU_PTX_FALLBACK=1 the forced-fallback
    # build too, 4 MB more packed),
    # compiled here by NVRTC 13 (`.ci/run` installs it into target/nvrtc) into .dev/ptx.tgz:
    # the run below unpacks it as the on-disk PTX cache, so that the first process on a fresh
    # GPU machine skips NVRTC (about 80 s at 630 % CPU there, session 9). The cache key holds
    # the NVRTC version: with another version there, the cache misses and NVRTC runs as before.
    nv=target/nvrtc/nvidia/cu13
    # The last staging's PTX seeds the cache (GPU_PTX_KEEP=0: start empty), so only modules whose
    # text changed compile again; entries of older texts stay in it (a few MB packed).
    rm -rf .dev/ptx-cache
    if [ -f .dev/ptx.tgz ] && [ "${GPU_PTX_KEEP:-1}" != 0 ]; then
        tar xzf .dev/ptx.tgz -C .dev
    fi
    rm -f .dev/ptx.tgz
    if [ -f "$nv/lib/libnvrtc.so.13" ] && [ -f "$nv/include/cuda_bf16.h" ]; then
        LD_LIBRARY_PATH="$PWD/$nv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PORTER_CUDA_INCLUDE="$PWD/$nv/include" \
            .dev/porter/porter kernels --arch "${GPU_ARCH:-sm_90}" ${GPU_PTX_FALLBACK:+--with-fallback} \
            --cache-dir .dev/ptx-cache --prune | tail -n 1
        # GPU_PTX_TIMELINE=1: also the device timeline's build (PORTER_TIMELINE, its own text).
        if [ "${GPU_PTX_TIMELINE:-0}" = 1 ]; then
            PORTER_TIMELINE=1 LD_LIBRARY_PATH="$PWD/$nv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                PORTER_CUDA_INCLUDE="$PWD/$nv/include" .dev/porter/porter kernels --arch "${GPU_ARCH:-sm_90}" \
                --cache-dir .dev/ptx-cache | tail -n 1
        fi
        # Only the cubins travel: the GPU loads them as they are (no driver JIT of ~80 MB of
        # PTX, which took over 60 s on a fresh H200 in session 12); where the driver refused
        # one, NVRTC there rebuilds the PTX. The cubins seed the next staging.
        rm -f .dev/ptx-cache/*.ptx
        tar czf .dev/ptx.tgz -C .dev ptx-cache && rm -rf .dev/ptx-cache
    else
        echo "warning: no NVRTC 13 in $nv (run the NVRTC install step of .ci/run): no PTX staged" >&2
    fi
    ls -la .dev/bin .dev/ptx.tgz 2>/dev/null
    du -sh .dev
    exit 0
fi

if [ "$mode" != run ]; then
    echo "usage: $0 [stage|run] [test-harness args...]" >&2
    exit 2
fi

out=${OUT:-.dev/out}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

# --- NVRTC ---------------------------------------------------------------------------------
nvrtc_dir=""
py_nvidia=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) if hasattr(nvidia, "__path__") else "")' 2>/dev/null || true)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib ${py_nvidia:+$py_nvidia/nvidia/cu13/lib} \
    ${py_nvidia:+$py_nvidia/nvidia/cuda_nvrtc/lib}; do
    if [ -e "$d/libnvrtc.so.13" ]; then
        nvrtc_dir=$d
        break
    fi
done
if [ -z "$nvrtc_dir" ]; then
    f=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.13' 2>/dev/null | head -n 1)
    [ -n "$f" ] && nvrtc_dir=$(dirname "$f")
fi
if [ -n "$nvrtc_dir" ]; then
    export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The PTX that `stage` compiled (.dev/ptx.tgz) as the on-disk kernel cache, unless one is set.
if [ -f .dev/ptx.tgz ] && [ -z "${PORTER_KERNEL_CACHE:-}" ]; then
    mkdir -p /tmp/porter-ptx && tar xzf .dev/ptx.tgz -C /tmp/porter-ptx --strip-components=1 &&
        export PORTER_KERNEL_CACHE=/tmp/porter-ptx
fi
# cuBLAS (GEMMs of the model path): the toolkit's, else the nvidia-cublas wheel's.
cublas=$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null || find /usr/local /opt /usr/lib ${py_nvidia:+$py_nvidia} -name 'libcublas.so.13' 2>/dev/null | head -n 1)
if [ -n "$cublas" ]; then
    export LD_LIBRARY_PATH="$(dirname "$cublas"):$LD_LIBRARY_PATH"
fi

# NCCL (tensor parallelism): cudarc loads `libnccl.so`; the nvidia-nccl wheel ships only
# `libnccl.so.2`, so link it under that name in a scratch folder.
nccl=$(ls /usr/local/cuda/lib64/libnccl.so 2>/dev/null || find /usr/local /opt /usr/lib ${py_nvidia:+$py_nvidia} -name 'libnccl.so*' 2>/dev/null | head -n 1)
if [ -n "$nccl" ]; then
    mkdir -p /tmp/porter-nccl
    ln -sf "$nccl" /tmp/porter-nccl/libnccl.so
    export LD_LIBRARY_PATH="/tmp/porter-nccl:$LD_LIBRARY_PATH"
fi
export NCCL_NVLS_ENABLE=0

# --- headers -------------------------------------------------------------------------------
if [ -z "${PORTER_CUDA_INCLUDE:-}" ]; then
    for d in /usr/local/cuda/include ${py_nvidia:+$py_nvidia/nvidia/cu13/include}; do
        if [ -f "$d/cuda_bf16.h" ]; then
            export PORTER_CUDA_INCLUDE=$d
            break
        fi
    done
fi

say "== gpu-check $(date -u +%FT%TZ)"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
say "nvcc: $(nvcc --version 2>/dev/null | tail -n 1 || echo none)"
say "libnvrtc.so.13: ${nvrtc_dir:-NOT FOUND}"
say "libcublas.so.13: ${cublas:-NOT FOUND}"
say "libnccl: ${nccl:-NOT FOUND}"
say "PORTER_CUDA_INCLUDE: ${PORTER_CUDA_INCLUDE:-NOT FOUND}"
say "PORTER_KERNEL_CACHE: ${PORTER_KERNEL_CACHE:-default} ($(ls "${PORTER_KERNEL_CACHE:-/nonexistent}" 2>/dev/null | wc -l) files)"

# --- run -----------------------------------------------------------------------------------
shopt -s nullglob
bins=(.dev/bin/*)
if [ ${#bins[@]} -eq 0 ]; then
    say "no binaries in .dev/bin (run '$0 stage' where cargo is, and carry .dev)"
    exit 2
fi
# One test at a time: readable logs, and each source is compiled once. The CPU
# micro-benchmarks (`bench_*`, also #[ignore]d) are skipped unless asked for.
[ $# -eq 0 ] && set -- --test-threads=1 --skip bench_
status=0
for b in "${bins[@]}"; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    start=$(date +%s%N)
    timeout "${GPU_CHECK_TIMEOUT:-0}" "$b" --nocapture --include-ignored "$@" >"$out/$name.log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    say "$name: exit $rc, ${ms} ms, $(grep -E '^test result' "$out/$name.log" | tail -n 1)"
    grep -E '^test .* FAILED|panicked|skipped:|needs a CUDA GPU|needs NVRTC' "$out/$name.log" | head -n 40 | tee -a "$summary"
    [ $rc -ne 0 ] && status=1
done
say "== overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
