#!/usr/bin/env python3
"""The serving benchmark of `porter bench --serve`, repeated through HTTP against a running
`porter serve` (or any OpenAI-compatible server that honours vLLM's `return_token_ids`).

It sends the *same* requests as `porter bench --serve` with the same flags: the prompts
(uniform random token ids below `--vocab`), the lengths and the Poisson arrivals come from
the same SplitMix64 streams and seed, so the two reports compare the engine with and
without the HTTP server, SSE framing and detokenisation in between. Each request is
`POST /v1/completions` with a token-id prompt, `stream: true`, greedy, `ignore_eos`,
`max_tokens` = its output length and `return_token_ids: true` (so every token is a frame
even when it adds no text, as random ids under a small tokenizer often do). Stdlib only
(asyncio sockets, HTTP/1.1, chunked SSE), loopback or any host:port.

    porter serve --config qwen3-next-80b-a3b --layers 24 --tokenizer tests/fixtures/tokenizer.json \\
        --device cuda --dtype bf16 --port 8000 &
    python3 scripts/bench_http.py --url http://127.0.0.1:8000 --vocab 151936 \\
        --num-requests 256 --input-len 512:2048 --output-len 128:256 --max-concurrency 64 --json http.json

Reported as `porter bench --serve` reports: duration (first send to last completion),
request / output-token / total-token throughput, TTFT (from sending), TPOT (per request,
after the first token), ITL (every gap between token frames; a frame carrying n tokens
counts as n - 1 zero gaps plus one) and end-to-end latency, mean / median / p99 in ms
(numpy's linear percentiles).
"""
import argparse
import asyncio
import json
import math
import sys
import time
import urllib.parse
import urllib.request

M64 = (1 << 64) - 1


class Rng:
    """SplitMix64, as runner/src/serve_bench.rs."""

    def __init__(self, seed):
        self.s = seed & M64

    def next_u64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next_u64() * n) >> 64

    def in_range(self, lo_hi):
        lo, hi = lo_hi
        return lo + self.below(hi - lo + 1)

    def unit(self):
        return (self.next_u64() >> 11) / float(1 << 53)


def make_requests(n, inp, out, vocab, rate, seed):
    rng, gaps = Rng(seed), Rng(seed ^ 0xA5A5A5A5A5A5A5A5)
    t, plans = 0.0, []
    for i in range(n):
        length = rng.in_range(inp)
        output_len = rng.in_range(out)
        prompt = [rng.below(vocab) for _ in range(length)]
        if i > 0 and math.isfinite(rate):
            t += -math.log(1.0 - gaps.unit()) / rate
        plans.append({"prompt": prompt, "output_len": output_len, "arrival": t})
    return plans


def length_range(s):
    a, _, b = s.partition(":")
    lo, hi = int(a), int(b or a)
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"`{s}`: expected A or A:B with 0 <= A <= B")
    return lo, hi


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stat(xs):
    return {"mean_ms": 1e3 * sum(xs) / len(xs) if xs else float("nan"),
            "median_ms": 1e3 * percentile(xs, 50), "p99_ms": 1e3 * percentile(xs, 99)}


async def post_stream(host, port, path, body, on_frame, headers=()):
    """POSTs `body` (JSON) and calls `on_frame(obj)` for every SSE `data:` JSON frame."""
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
            f"Content-Length: {len(data)}", "Accept: text/event-stream", "Connection: close", *headers]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    await writer.drain()
    status = await reader.readline()
    code = int(status.split()[1])
    hdrs = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode().partition(":")
        hdrs[k.strip().lower()] = v.strip()
    buf = b""
    done = False

    def frames():
        nonlocal buf, done
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data:"):
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                    elif payload:
                        on_frame(json.loads(payload))

    try:
        if code != 200:
            rest = await reader.read()
            raise RuntimeError(f"HTTP {code}: {rest[:400]!r}")
        chunked = hdrs.get("transfer-encoding", "").lower() == "chunked"
        while not done:
            if chunked:
                size_line = await reader.readline()
                if not size_line:
                    break
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                buf += await reader.readexactly(size)
                await reader.readexactly(2)
            else:
                piece = await reader.read(65536)
                if not piece:
                    break
                buf += piece
            frames()
    finally:
        writer.close()
    if not done:
        raise RuntimeError("the stream ended without [DONE]")


async def run_one(args, host, port, plan, t_start, sem, rec):
    await asyncio.sleep(max(0.0, t_start + plan["arrival"] - time.perf_counter()))
    wait0 = time.perf_counter()
    async with sem:
        sent = time.perf_counter()
        rec["queue_wait"] = sent - wait0
        rec["sent"] = sent - t_start
        times, ntok = [], [0]
        errors = []

        def on_frame(obj):
            if "error" in obj:
                errors.append(obj["error"])
                return
            now = time.perf_counter()
            for c in obj.get("choices", []):
                k = len(c.get("token_ids") or [])
                times.extend([now] * k)
                ntok[0] += k

        body = {"model": args.model, "prompt": plan["prompt"], "max_tokens": plan["output_len"], "temperature": 0,
                "ignore_eos": True, "stream": True, "return_token_ids": True}
        hdr = [f"Authorization: Bearer {args.api_key}"] if args.api_key else []
        await post_stream(host, port, "/v1/completions", body, on_frame, hdr)
        end = time.perf_counter()
        if errors:
            raise RuntimeError(f"error event: {errors[0]}")
        if ntok[0] != plan["output_len"]:
            raise RuntimeError(f"asked for {plan['output_len']} tokens, got {ntok[0]}")
        rec.update({"input_len": len(plan["prompt"]), "output_len": ntok[0], "ttft": times[0] - sent,
                    "e2e": end - sent, "itl": [b - a for a, b in zip(times, times[1:])], "end": end - t_start})


async def drive(args, host, port, plans, conc):
    sem = asyncio.Semaphore(conc or len(plans) or 1)
    recs = [dict() for _ in plans]
    t0 = time.perf_counter()
    await asyncio.gather(*(run_one(args, host, port, p, t0, sem, r) for p, r in zip(plans, recs)))
    return recs, max(r["end"] for r in recs) - min(r["sent"] for r in recs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    ap.add_argument("--api-key")
    ap.add_argument("--vocab", type=int, required=True, help="prompt ids are drawn below this (the model's vocab_size)")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--input-len", type=length_range, default=(128, 128))
    ap.add_argument("--output-len", type=length_range, default=(64, 64))
    ap.add_argument("--max-concurrency", type=int)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.input_len[0] < 1:
        sys.exit("--input-len: prompts need at least 1 token")
    if args.output_len[0] < 1:
        sys.exit("--output-len: at least 1 token per request")
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    if args.model is None:

        req = urllib.request.Request(args.url.rstrip("/") + "/v1/models")
        if args.api_key:
            req.add_header("Authorization", f"Bearer {args.api_key}")
        args.model = json.load(urllib.request.urlopen(req, timeout=30))["data"][0]["id"]
    plans = make_requests(args.num_requests, args.input_len, args.output_len, args.vocab, args.request_rate, args.seed)
    warm = make_requests(args.warmup, args.input_len, args.output_len, args.vocab, float("inf"), ~args.seed & M64)
    if warm:
        asyncio.run(drive(args, host, port, warm, None))
    recs, duration = asyncio.run(drive(args, host, port, plans, args.max_concurrency))
    out_toks = sum(r["output_len"] for r in recs)
    in_toks = sum(r["input_len"] for r in recs)
    ttft = [r["ttft"] for r in recs]
    tpot = [(r["e2e"] - r["ttft"]) / (r["output_len"] - 1) for r in recs if r["output_len"] > 1]
    itl = [g for r in recs for g in r["itl"]]
    e2e = [r["e2e"] for r in recs]
    summary = {"kind": "serve_http", "url": args.url, "model": args.model, "num_requests": len(recs),
               "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
               "max_concurrency": args.max_concurrency, "input_len": list(args.input_len),
               "output_len": list(args.output_len), "seed": args.seed, "duration_s": duration,
               "requests_per_s": len(recs) / duration, "output_tokens_per_s": out_toks / duration,
               "total_tokens_per_s": (in_toks + out_toks) / duration, "ttft": stat(ttft), "tpot": stat(tpot),
               "itl": stat(itl), "e2e": stat(e2e)}
    print(f"serve bench over HTTP {args.url} ({args.model}): {len(recs)} requests, rate "
          f"{summary['request_rate']}, max concurrency {args.max_concurrency}")
    print(f"duration {duration:.2f} s; {summary['requests_per_s']:.2f} req/s; "
          f"{summary['output_tokens_per_s']:.1f} output tok/s; {summary['total_tokens_per_s']:.1f} total tok/s")
    for name in ("ttft", "tpot", "itl", "e2e"):
        s = summary[name]
        print(f"{name.upper():>5} ms: mean {s['mean_ms']:.2f}  median {s['median_ms']:.2f}  p99 {s['p99_ms']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**summary, "requests": [{k: v for k, v in r.items() if k != "itl"} for r in recs]}, f, indent=1)


if __name__ == "__main__":
    main()
