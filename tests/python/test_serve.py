"""`porter serve` driven by the official openai client (max_retries=0) and raw HTTP.

Run by runner/tests/serve.rs (part of `cargo test`) with the test venv of scripts/test-setup.sh:
    target/smollm2-venv/bin/python tests/python/test_serve.py PORTER_BIN
Starts `porter serve` on free loopback ports: the bundled tiny Qwen3-Next checkpoint (random
weights, no chat template: text completions) and the real SmolLM2-135M-Instruct (target/smollm2,
chat). Every wait is bounded. Its helpers serve test_serve_models.py (speculative decoding,
tensor parallelism, operations, templates, SmolLM2) and test_serve_tools.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import openai

PORTER = sys.argv.pop(1) if len(sys.argv) > 1 else "target/debug/porter"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SMOLLM2 = os.environ.get("PORTER_SMOLLM2", os.path.join(ROOT, "target", "smollm2"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [PORTER, "serve", "--device", "cpu", "--port", str(self.port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("porter serve exited: " + self.proc.stdout.read())
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError("porter serve did not come up in 120 s")

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=120)

    def get(self, path, headers=None):
        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, body, headers=None):
        h = {"content-type": "application/json", **(headers or {})}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, headers=h, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name):
        _, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        finally:
            self.proc.stdout.close()


def server_with_file(flag, text, suffix):
    """A server given `flag` and a temporary file holding `text`; returns it and the file's path."""
    tmp = tempfile.NamedTemporaryFile("w", suffix=suffix, encoding="utf-8", delete=False)
    tmp.write(text)
    tmp.close()
    return Server(flag, tmp.name), tmp.name


def structured_draws(test, client, model, response_format, max_tokens, check):
    """Random weights: whatever the draw, the text is one JSON value the `check` accepts or
    (cut by max_tokens) a prefix of one. Returns how many of 8 seeded draws closed it."""
    dec, completed = json.JSONDecoder(), 0
    for seed in range(8):
        r = client.completions.create(model=model, prompt="Beautiful is better than", max_tokens=max_tokens,
                                      temperature=1.0, seed=seed,
                                      extra_body={"response_format": response_format}).choices[0]
        text = r.text.lstrip()
        test.assertTrue(text.startswith("{"), (seed, r.text))
        try:
            obj, end = dec.raw_decode(text)
        except json.JSONDecodeError:
            test.assertEqual(r.finish_reason, "length", (seed, r.text))
            continue
        test.assertEqual(text[end:].strip(), "", (seed, r.text))
        check(obj)
        completed += 1
    return completed


class TinyModel(unittest.TestCase):
    """The bundled fixture (random weights: the text is gibberish, the mechanics are real)."""

    @classmethod
    def setUpClass(cls):
        cls.s = Server("--max-queued-requests", "64")
        cls.c = cls.s.client()
        cls.model = cls.c.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0, "porter serve did not exit 0 on SIGTERM"

    def complete(self, prompt="Beautiful is better than", **kw):
        kw = {"max_tokens": 12, "temperature": 0, **kw}
        return self.c.completions.create(model=self.model, prompt=prompt, **kw)

    def test_models_and_health(self):
        self.assertEqual(self.s.get("/health")[0], 200)
        self.assertEqual(self.model, "qwen3_next_mtp")
        card = self.c.models.retrieve(self.model)
        self.assertEqual((card.id, card.owned_by), (self.model, "porter"))
        with self.assertRaises(openai.NotFoundError):
            self.c.models.retrieve("gpt-4")

    def test_stream_equals_non_stream_and_usage(self):
        full = self.complete()
        self.assertEqual(full.choices[0].finish_reason, "length")
        self.assertEqual(full.usage.completion_tokens, 12)
        chunks = list(self.complete(stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        self.assertEqual(text, full.choices[0].text)
        finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        self.assertEqual(len(finals), 1)
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)

    def test_32_concurrent_greedy_requests_equal_the_single_answer(self):
        want = self.complete().choices[0].text
        got = [None] * 32
        def run(i):
            if i % 2:
                got[i] = "".join(ch.choices[0].text for ch in self.complete(stream=True) if ch.choices)
            else:
                got[i] = self.complete().choices[0].text
        threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        self.assertEqual(got, [want] * 32)

    def test_logprobs_and_token_ids(self):
        r = self.complete(logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.token_logprobs), 12)
        self.assertTrue(all(len(t) <= 3 for t in lp.top_logprobs))
        self.assertTrue(all(v <= 0.0 for v in lp.token_logprobs))
        r2 = self.c.completions.create(model=self.model, prompt=[5, 77, 300], max_tokens=3, temperature=0)
        self.assertEqual(r2.usage.prompt_tokens, 3)

    def test_bad_requests_are_4xx_naming_the_field(self):
        cases = [
            ({"temperature": 3}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -5}, "top_k"),
            ({"min_p": 2}, "min_p"), ({"presence_penalty": 9}, "presence_penalty"), ({"max_tokens": 0}, "max_tokens"),
            ({"max_tokens": 10 ** 7}, "max_tokens"), ({"n": 2, "temperature": 0}, "n"), ({"stop": [""]}, "stop"),
            ({"stream_options": {"include_usage": True}}, "stream_options"), ({"logprobs": 99}, "logprobs"),
            ({"temperature": "hot"}, "temperature"),
            # What porter does not implement is refused, not ignored.
            ({"logit_bias": {"abc": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
            ({"logit_bias": {"99999999": 1}}, "logit_bias"), ({"logit_bias": [5]}, "logit_bias"),
            ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
            ({"response_format": "json"}, "response_format"),
            ({"suffix": " end"}, "suffix"), ({"best_of": 3}, "best_of"), ({"guided_json": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}, "pattern"),
            ({"use_beam_search": True}, "use_beam_search"), ({"skip_special_tokens": False}, "skip_special_tokens"),
            ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
        ]
        for extra, field in cases:
            body = {"model": self.model, "prompt": "hi", "max_tokens": 4, **extra}
            code, text = self.s.post("/v1/completions", body)
            self.assertEqual(code, 400, (extra, text))
            err = json.loads(text)["error"]
            self.assertIn(field, err["message"], extra)
            self.assertEqual(set(err), {"message", "type", "param", "code"})
        with self.assertRaises(openai.NotFoundError):
            self.c.completions.create(model="nope", prompt="hi", max_tokens=2)
        self.assertEqual(self.s.post("/v1/completions", b"{not json")[0], 400)
        self.assertEqual(self.s.post("/v1/completions", b"\xff\xfe")[0], 400)
        self.assertEqual(self.s.post("/v1/completions", {"prompt": "x"}, {"content-type": "text/plain"})[0], 415)
        # Their "off" values are accepted and change nothing.
        off = {"response_format": {"type": "text"}, "logit_bias": {}, "best_of": 1, "suffix": "",
               "use_beam_search": False, "skip_special_tokens": True}
        want = self.complete().choices[0].text
        self.assertEqual(self.complete(extra_body=off).choices[0].text, want)
        # Chat: `required` without tools, and tools without a parser to return the calls (as vLLM).
        chat = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        for extra, field in [({"tool_choice": "required"}, "tool_choice"), ({"tools": tools}, "tools"),
                             ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format")]:
            code, text = self.s.post("/v1/chat/completions", {**chat, **extra})
            self.assertEqual(code, 400, (extra, text))
            self.assertIn(field, json.loads(text)["error"]["message"], extra)
        # Still serving the same answers.
        self.assertEqual(self.complete().usage.completion_tokens, 12)

    def test_include_stop_str_in_output(self):
        kw = {"max_tokens": 16, "extra_body": {"ignore_eos": True}}
        text = self.complete(**kw).choices[0].text
        self.assertGreaterEqual(len(text), 4, text)
        stop = text[len(text) // 2:len(text) // 2 + 2]
        at = text.find(stop)
        cut = self.complete(stop=[stop], **kw).choices[0]
        self.assertEqual((cut.text, cut.finish_reason), (text[:at], "stop"))
        inc = {"max_tokens": 16, "stop": [stop], "extra_body": {"ignore_eos": True, "include_stop_str_in_output": True}}
        self.assertEqual(self.complete(**inc).choices[0].text, text[:at + len(stop)])
        streamed = "".join(c.choices[0].text for c in self.complete(stream=True, **inc) if c.choices)
        self.assertEqual(streamed, text[:at + len(stop)])

    def test_json_mode(self):
        n = structured_draws(self, self.c, self.model, {"type": "json_object"}, 48,
                             lambda obj: self.assertIsInstance(obj, dict))
        print(f"json mode: {n} of 8 draws closed their object")

    def test_json_schema_random_draws(self):
        schema = {"type": "object", "required": ["k", "n"],
                  "properties": {"k": {"enum": ["a", "b"]}, "n": {"type": "integer"}, "f": {"type": "boolean"}}}

        def check(obj):
            self.assertIn(obj["k"], ["a", "b"])
            self.assertIsInstance(obj["n"], int)
            self.assertTrue(set(obj) <= {"k", "n", "f"} and isinstance(obj.get("f", True), bool), obj)

        n = structured_draws(self, self.c, self.model,
                             {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}, 40, check)
        print(f"json schema: {n} of 8 draws closed their object")

    def test_guided_choice(self):
        choices = ["alpha", "alpha beta", "gamma"]
        for seed in range(6):
            r = self.complete(max_tokens=16, temperature=1.0, seed=seed, extra_body={"guided_choice": choices}).choices[0]
            self.assertIn(r.text, choices, seed)
            self.assertEqual(r.finish_reason, "stop")
        code, text = self.s.post("/v1/completions", {"model": self.model, "prompt": "x", "guided_choice": [""]})
        self.assertEqual(code, 400, text)
        self.assertIn("guided_choice", text)

    def test_logit_bias(self):
        body = {"model": self.model, "prompt": "hi", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        ids = lambda extra: json.loads(self.s.post("/v1/completions", {**body, **extra})[1])["choices"][0]["token_ids"]
        base = ids({})
        self.assertEqual(ids({"logit_bias": {"7": 100}}), [7] * 6)
        self.assertNotEqual(ids({"logit_bias": {str(base[0]): -100}})[0], base[0])
        self.assertEqual(ids({"logit_bias": {"7": 0}}), base)

    def test_tokenize_roundtrip(self):
        code, text = self.s.post("/tokenize", {"prompt": "Beautiful is better than"})
        self.assertEqual(code, 200)
        toks = json.loads(text)["tokens"]
        code, text = self.s.post("/detokenize", {"tokens": toks})
        self.assertEqual(json.loads(text)["prompt"], "Beautiful is better than")
        # vLLM's return_token_strs: the vocabulary's spelling of each id.
        strs = json.loads(self.s.post("/tokenize", {"prompt": "Beautiful is", "return_token_strs": True})[1])
        self.assertEqual(len(strs["token_strs"]), len(strs["tokens"]))
        self.assertTrue(all(isinstance(t, str) for t in strs["token_strs"]))
        for path, body in [("/tokenize", {"prompt": "x", "add_generation_prompt": True}),
                           ("/detokenize", {"tokens": [1], "skip": 1})]:
            code, text = self.s.post(path, body)
            self.assertEqual(code, 400, (path, text))
            self.assertIn("unknown field", text)
        code, text = self.s.get("/version")
        self.assertEqual((code, "version" in json.loads(text)), (200, True))

    def test_disconnect_frees_the_request(self):
        stream = self.c.completions.create(model=self.model, prompt="x", max_tokens=3000, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
        deadline = time.time() + 30
        while time.time() < deadline and self.s.metric("vllm:num_requests_running") > 0:
            time.sleep(0.05)
        self.assertEqual(self.s.metric("vllm:num_requests_running"), 0)
        self.assertEqual(self.s.metric("vllm:kv_cache_usage_perc"), 0)

    def test_metrics_count_what_was_served(self):
        before = self.s.metric("vllm:generation_tokens_total")
        queued = self.s.metric("vllm:request_queue_time_seconds_count")
        r = self.complete()
        after = self.s.metric("vllm:generation_tokens_total")
        self.assertEqual(after - before, r.usage.completion_tokens)
        self.assertEqual(self.s.metric("vllm:request_queue_time_seconds_count") - queued, 1)

    def test_unknown_and_unimplemented_fields_are_named(self):
        for path, body, needle in [
            ("/v1/completions", {"prompt": "x", "max_token": 3}, "unknown field `max_token`"),
            ("/v1/completions", {"prompt": "x", "messages": []}, "a field of /v1/chat/completions"),
            ("/v1/completions", {"prompt": "x", "priority": 2}, "first come, first served"),
            ("/v1/completions", {"prompt": "x", "cache_salt": ""}, "cache_salt"),
            ("/v1/completions", {"prompt": "x", "request_id": "has space"}, "request_id"),
        ]:
            code, text = self.s.post(path, {"model": self.model, **body})
            self.assertEqual(code, 400, text)
            self.assertIn(needle, json.loads(text)["error"]["message"])
        # Fields sent as null, and "off" values of vLLM's, are accepted.
        r = self.complete(extra_body={"priority": 0, "foo": None, "spaces_between_special_tokens": True})
        self.assertEqual(r.usage.completion_tokens, 12)

    def test_echo_with_logprobs_scores_the_prompt(self):
        # lm-evaluation-harness's loglikelihood request: the prompt echoed with its tokens'
        # log-probabilities (the first has none), then the generated one's.
        text = "Beautiful is better than ugly"
        r = self.complete(prompt=text, max_tokens=1, echo=True, logprobs=2)
        lp, n = r.choices[0].logprobs, r.usage.prompt_tokens
        self.assertTrue(r.choices[0].text.startswith(text))
        self.assertEqual(len(lp.tokens), n + 1)
        self.assertEqual("".join(lp.tokens[:n]), text)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs[1:]))
        self.assertTrue(all(len(t) <= 2 for t in lp.top_logprobs[1:]))
        # vLLM's prompt_logprobs: {id: {logprob, rank, decoded_token}} per prompt token.
        code, body = self.s.post("/v1/completions", {"prompt": text, "max_tokens": 1, "prompt_logprobs": 2})
        self.assertEqual(code, 200, body)
        plp = json.loads(body)["choices"][0]["prompt_logprobs"]
        ids = json.loads(self.s.post("/tokenize", {"prompt": text})[1])["tokens"]
        self.assertEqual(len(plp), len(ids))
        self.assertIsNone(plp[0])
        for p in range(1, len(ids)):
            own = plp[p][str(ids[p])]
            self.assertAlmostEqual(own["logprob"], lp.token_logprobs[p], places=5)
            self.assertGreaterEqual(own["rank"], 1)
            self.assertLessEqual(len(plp[p]), 3)
            self.assertTrue(all(1 <= e["rank"] <= 2 for k, e in plp[p].items() if k != str(ids[p])))
        code, body = self.s.post("/v1/completions", {"prompt": text, "stream": True, "prompt_logprobs": 1})
        self.assertEqual(code, 400, body)
        # The same prompt scores the same whatever else the request asks for.
        again = self.complete(prompt=text, max_tokens=3, echo=True, logprobs=1, temperature=0.7, seed=3)
        self.assertEqual(again.choices[0].logprobs.token_logprobs[:n], lp.token_logprobs[:n])

    def test_continuous_usage_stats(self):
        # vLLM's stream_options.continuous_usage_stats: every chunk carries its usage so far.
        chunks = list(self.complete(stream=True, max_tokens=5, extra_body={"ignore_eos": True},
                                    stream_options={"include_usage": True, "continuous_usage_stats": True}))
        counts = [ch.usage.completion_tokens for ch in chunks if ch.choices]
        self.assertEqual(counts, sorted(counts))
        self.assertEqual(counts[-1], 5)
        self.assertTrue(all(ch.usage.total_tokens == ch.usage.prompt_tokens + ch.usage.completion_tokens
                            for ch in chunks))
        self.assertEqual(chunks[-1].choices, [])
        code, text = self.s.post("/v1/completions", {"prompt": "x", "stream": True,
                                                     "stream_options": {"include_usage": True, "x": 1}})
        self.assertEqual(code, 400, text)
        self.assertIn("stream_options.x", text)

    def test_request_id_names_the_response(self):
        r = self.complete(extra_body={"request_id": "abc-123"})
        self.assertEqual(r.id, "cmpl-abc-123")
        ids = {ch.id for ch in self.complete(stream=True, extra_body={"request_id": "s1"})}
        self.assertEqual(ids, {"cmpl-s1"})

    def test_prefix_cache_on_the_hybrid_and_its_metrics(self):
        # 200 token ids twice: the second resumes from the state checkpoint at 192 (64-token
        # blocks on a hybrid model), with the same greedy text; the metrics say so.
        prompt = [(i * 37 + 11) % 250 for i in range(200)]
        hits = self.s.metric("vllm:prefix_cache_hits_total")
        unresumed = self.s.metric("porter:prefix_cache_unresumed_tokens_total")
        a = self.complete(prompt=prompt, max_tokens=4)
        self.assertGreater(self.s.metric("porter:state_checkpoints_cached"), 0)
        self.assertGreaterEqual(self.s.metric("porter:state_checkpoints_total"),
                                self.s.metric("porter:state_checkpoints_cached"))
        b = self.complete(prompt=prompt, max_tokens=4)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertEqual(self.s.metric("vllm:prefix_cache_hits_total") - hits, 192)
        self.assertEqual(self.s.metric("porter:prefix_cache_unresumed_tokens_total") - unresumed, 0)
        # vLLM's cache_salt: only requests with the same salt share the cached prefix.
        cached = lambda r: r.usage.prompt_tokens_details.cached_tokens
        self.assertEqual(cached(self.complete(prompt=prompt, max_tokens=2, extra_body={"cache_salt": "t1"})), 0)
        self.assertEqual(cached(self.complete(prompt=prompt, max_tokens=2, extra_body={"cache_salt": "t2"})), 0)
        self.assertEqual(cached(self.complete(prompt=prompt, max_tokens=2, extra_body={"cache_salt": "t1"})), 192)
        self.assertEqual(cached(self.complete(prompt=prompt, max_tokens=2)), 192)

    def test_n_choices_stream_interleaved_and_equal_non_stream(self):
        kw = dict(n=3, temperature=0.9, seed=11, max_tokens=16, extra_body={"ignore_eos": True})
        full = self.complete(**kw)
        self.assertEqual(sorted(c.index for c in full.choices), [0, 1, 2])
        texts = {c.index: c.text for c in full.choices}
        self.assertEqual(len(set(texts.values())), 3, "seeded choices should differ (seed + index)")
        chunks = list(self.complete(stream=True, **kw))
        got, first, final = {0: "", 1: "", 2: ""}, {}, {}
        for pos, ch in enumerate(chunks):
            for c in ch.choices:
                got[c.index] += c.text
                first.setdefault(c.index, pos)
                if c.finish_reason:
                    self.assertNotIn(c.index, final, "two finish_reason chunks for one choice")
                    final[c.index] = pos
        self.assertEqual(got, texts)
        self.assertEqual(set(final), {0, 1, 2})
        # Interleaved: the last choice starts before the first one ends.
        self.assertLess(first[2], final[0])

    def test_return_token_ids(self):
        body = {"model": self.model, "prompt": [5, 77, 300], "max_tokens": 6, "temperature": 0,
                "return_token_ids": True}
        code, text = self.s.post("/v1/completions", body)
        self.assertEqual(code, 200, text)
        c = json.loads(text)["choices"][0]
        self.assertEqual(c["prompt_token_ids"], [5, 77, 300])
        self.assertEqual(len(c["token_ids"]), 6)
        chunks = list(self.c.completions.create(model=self.model, prompt=[5, 77, 300], max_tokens=6, temperature=0,
                                                stream=True, extra_body={"return_token_ids": True}))
        streamed = [t for ch in chunks for c2 in ch.choices for t in (getattr(c2, "token_ids", None) or [])]
        self.assertEqual(streamed, c["token_ids"])


class ParsersThroughTheServer(unittest.TestCase):
    """`--reasoning-parser qwen3` and `--tool-call-parser hermes` on real model output: the
    bundled fixture's (seeded) tokens for a fixed prompt, read through a word-level tokenizer
    (made here) whose words for exactly those ids spell a think block, an answer and a
    hermes tool call. The model really generates the ids; the server detokenises, parses and
    streams them."""

    PIECES = ["<think>", "plan", "</think>", "Sure", "<tool_call>", '{"name":', '"get_weather",',
              '"arguments":', '{"city":', '"Paris"}}', "</tool_call>"]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        vocab = 512
        n = len(cls.PIECES)
        plain = Server()
        try:
            # The prompt "w5 w9 w17" below is ids [5, 9, 17] under the word-level tokenizer. Greedy
            # output of the random fixture repeats ids, so the tokens are sampled (a seeded request
            # reproduces them): the first seed whose first n ids are distinct.
            for seed in range(1, 64):
                code, text = plain.post("/v1/completions", {"model": "qwen3_next_mtp", "prompt": [5, 9, 17],
                                                            "max_tokens": n, "temperature": 1.0, "seed": seed,
                                                            "ignore_eos": True, "return_token_ids": True})
                assert code == 200, text
                out = json.loads(text)["choices"][0]["token_ids"]
                if len(set(out)) == n:
                    break
            else:
                raise AssertionError("no seed in 1..63 gives distinct sampled ids")
        finally:
            assert plain.stop() == 0
        cls.seed = seed
        words = {i: f"w{i}" for i in range(vocab)}
        for i, piece in zip(out[:n], cls.PIECES):
            words[i] = piece
        tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
               "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
               "model": {"type": "WordLevel", "vocab": {w: i for i, w in words.items()}, "unk_token": "w0"}}
        cls.tok = os.path.join(cls.tmp.name, "tokenizer.json")
        with open(cls.tok, "w") as f:
            json.dump(tok, f)
        tmpl = os.path.join(cls.tmp.name, "chat.jinja")
        with open(tmpl, "w") as f:
            f.write("{% for m in messages %}{{ m.content }}{% endfor %}")
        cls.n = n
        cls.s = Server("--tokenizer", cls.tok, "--chat-template", tmpl, "--reasoning-parser", "qwen3",
                       "--tool-call-parser", "hermes")

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0
        cls.tmp.cleanup()

    def ask(self, **kw):
        return self.s.client().chat.completions.create(
            model="qwen3_next_mtp", messages=[{"role": "user", "content": "w5 w9 w17"}], max_tokens=self.n,
            temperature=1.0, seed=self.seed, extra_body={"ignore_eos": True}, **kw)

    def test_reasoning_content_and_tool_call(self):
        code, text = self.s.post("/tokenize", {"messages": [{"role": "user", "content": "w5 w9 w17"}]})
        self.assertEqual(json.loads(text)["tokens"], [5, 9, 17])
        r = self.ask()
        m = r.choices[0].message
        self.assertEqual(m.reasoning_content.strip(), "plan")
        self.assertEqual((m.content or "").strip(), "Sure")
        self.assertEqual(len(m.tool_calls), 1)
        call = m.tool_calls[0]
        self.assertEqual(call.function.name, "get_weather")
        self.assertEqual(json.loads(call.function.arguments), {"city": "Paris"})
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        # Streamed: the same split; the name comes first, the argument deltas join to valid JSON.
        reasoning, content, name, args, finals = "", "", None, "", []
        for ch in self.ask(stream=True):
            for c in ch.choices:
                d = c.delta
                reasoning += getattr(d, "reasoning_content", None) or ""
                content += d.content or ""
                for tc in d.tool_calls or []:
                    if tc.function.name:
                        self.assertIsNone(name)
                        self.assertEqual(args, "", "arguments before the name")
                        name = tc.function.name
                    args += tc.function.arguments or ""
                if c.finish_reason:
                    finals.append(c.finish_reason)
        self.assertEqual(reasoning.strip(), "plan")
        self.assertEqual(content.strip(), "Sure")
        self.assertEqual(name, "get_weather")
        self.assertEqual(json.loads(args), {"city": "Paris"})
        self.assertEqual(finals, ["tool_calls"])
        # tool_choice none: the call stays in the text, streamed or not.
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        m = self.ask(tool_choice="none", tools=tools).choices[0].message
        self.assertFalse(m.tool_calls)
        self.assertIn("<tool_call>", m.content)
        self.assertIn('"get_weather"', m.content)
        text = "".join(c.delta.content or "" for ch in self.ask(tool_choice="none", stream=True) for c in ch.choices)
        self.assertEqual(text, m.content)


if __name__ == "__main__":
    unittest.main(verbosity=2)
