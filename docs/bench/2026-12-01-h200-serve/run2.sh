#!/usr/bin/env bash
# GPU call 2: engine tests again (serialised deterministic mode), the mixed and the Poisson TTFT
# serving benchmarks in-process, then all of them through HTTP (porter serve + scripts/bench_http.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
mkdir -p /tmp/gc
OUT_SAVE=$OUT
OUT=/tmp/gc timeout 150 scripts/gpu-check.sh run cuda_engine > "$OUT_SAVE/check.txt" 2>&1
echo "gpu-check exit $?" >> "$OUT_SAVE/check.txt"
OUT=$OUT_SAVE
tar czf "$OUT/gc-logs.tgz" -C /tmp gc
P=.dev/porter/porter
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
G="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24"
MIX="--num-requests 256 --request-rate 8 --input-len 512:2048 --output-len 128:256 --max-concurrency 64"
C64="--num-requests 128 --input-len 128 --output-len 256 --max-concurrency 64"
TTFT="--num-requests 96 --input-len 1024 --output-len 64 --max-concurrency 32"
TTFTR="--num-requests 160 --request-rate 12 --input-len 1024 --output-len 64 --max-concurrency 32"
date -u > "$OUT/date.txt"
(timeout 120 $P bench --serve $G $MIX --json "$OUT/serve_mix.json") > "$OUT/serve_mix.txt" 2>&1
(timeout 60 $P bench --serve $G $TTFTR --json "$OUT/serve_ttftr.json") > "$OUT/serve_ttftr.txt" 2>&1
$P serve $G --tokenizer tests/fixtures/tokenizer.json --port 8011 --max-queued-requests 1024 > "$OUT/server.txt" 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
echo "server up after ~${i}s" >> "$OUT/server.txt"
for w in C64 TTFT TTFTR MIX; do
  (timeout 120 python3 scripts/bench_http.py --url http://127.0.0.1:8011 --vocab 151936 ${!w} --json "$OUT/http_$w.json") > "$OUT/http_$w.txt" 2>&1
done
curl -s http://127.0.0.1:8011/metrics > "$OUT/metrics.txt"
kill -TERM $SP; wait $SP; echo "server exit $?" >> "$OUT/server.txt"
tail -12 "$OUT/check.txt"
for f in serve_mix serve_ttftr http_C64 http_TTFT http_TTFTR http_MIX server; do echo "== $f"; tail -28 "$OUT/$f.txt"; done
