"""`porter serve` beyond the tiny model's basics: MTP speculative decoding, tensor parallelism,
random weights, operations (metrics, draining, limits), the Qwen3 template and the real
SmolLM2-135M-Instruct (target/smollm2), driven by the official openai client and raw HTTP with
the helpers of test_serve.py.

Run by runner/tests/serve.rs (part of `cargo test`) with the test venv of scripts/test-setup.sh:
    target/smollm2-venv/bin/python tests/python/test_serve_models.py PORTER_BIN
"""

import json
import os
import signal
import subprocess
import threading
import time
import unittest

import openai

from test_serve import PORTER, ROOT, SMOLLM2, Server, server_with_file, structured_draws  # pops PORTER_BIN


class Speculative(unittest.TestCase):
    """`--mtp-step 2` with the fixture's own MTP head: greedy answers equal the plain server's."""

    @classmethod
    def setUpClass(cls):
        cls.plain = Server()
        cls.spec = Server("--mtp-step", "2")

    @classmethod
    def tearDownClass(cls):
        assert cls.plain.stop() == 0
        assert cls.spec.stop() == 0

    def test_greedy_equal_and_spec_metrics(self):
        prompts = ["Beautiful is better than", "Simple is", "x", "Flat is better than nested."]
        for s in (self.plain, self.spec):
            s.answers = [s.client().completions.create(model="qwen3_next_mtp", prompt=p, max_tokens=20, temperature=0,
                                                       extra_body={"ignore_eos": True}).choices[0].text
                         for p in prompts]
        self.assertEqual(self.spec.answers, self.plain.answers)
        self.assertGreater(self.spec.metric("vllm:spec_decode_num_draft_tokens"), 0)
        self.assertGreater(self.spec.metric("mtp_avg_token_per_step_count"), 0)
        self.assertEqual(self.plain.metric("vllm:spec_decode_num_draft_tokens"), 0)

    def test_json_mode_with_drafts(self):
        # Drafts are drawn from the masked distribution and verified against it; a draw that
        # closes its object early stops inside a verify step's accepted drafts.
        n = structured_draws(self, self.spec.client(), "qwen3_next_mtp", {"type": "json_object"}, 48,
                             lambda obj: self.assertIsInstance(obj, dict))
        self.assertGreater(n, 0)
        self.assertEqual(self.spec.get("/health")[0], 200, "the engine survived")


class TensorParallel(unittest.TestCase):
    """`--tensor-parallel-size 2` (CPU ranks): greedy answers equal the plain server's, also with
    MTP; SmolLM2 at `-t 3` answers the chat question as at TP 1."""

    @classmethod
    def setUpClass(cls):
        cls.plain = Server()
        cls.tp = Server("--tensor-parallel-size", "2")
        cls.tp_spec = Server("--tensor-parallel-size", "2", "--mtp-step", "2")

    @classmethod
    def tearDownClass(cls):
        for s in (cls.plain, cls.tp, cls.tp_spec):
            assert s.stop() == 0

    def test_greedy_equal(self):
        prompts = ["Beautiful is better than", "Simple is", "Flat is better than nested."]
        for s in (self.plain, self.tp, self.tp_spec):
            s.answers = [s.client().completions.create(model="qwen3_next_mtp", prompt=p, max_tokens=16, temperature=0,
                                                       extra_body={"ignore_eos": True}).choices[0].text
                         for p in prompts]
        self.assertEqual(self.tp.answers, self.plain.answers)
        self.assertEqual(self.tp_spec.answers, self.plain.answers)
        self.assertGreater(self.tp_spec.metric("vllm:spec_decode_num_draft_tokens"), 0)

    def test_smollm2_tp3_chat(self):
        s = Server("--model", SMOLLM2, "-t", "3", "--served-model-name", "smollm2")
        try:
            r = s.client().chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_tokens=24, temperature=0)
            self.assertIn("Paris", r.choices[0].message.content)
            self.assertEqual(r.choices[0].finish_reason, "stop")
        finally:
            self.assertEqual(s.stop(), 0)


class RandomWeights(unittest.TestCase):
    """`--config FILE --tokenizer FILE`: a benchmark server on random weights."""

    def test_random_config_serves_and_needs_a_tokenizer(self):
        cfg = os.path.join(ROOT, "tests", "fixtures", "qwen3_next_a", "config.json")
        r = subprocess.run([PORTER, "serve", "--device", "cpu", "--config", cfg], capture_output=True, text=True,
                           timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--tokenizer", r.stderr)
        s = Server("--config", cfg, "--tokenizer", os.path.join(ROOT, "tests", "fixtures", "tokenizer.json"))
        try:
            model = s.client().models.list().data[0].id
            self.assertTrue(model.startswith("random-"), model)
            r = s.client().completions.create(model=model, prompt=[1, 2, 3], max_tokens=4, temperature=0,
                                              extra_body={"ignore_eos": True})
            self.assertEqual(r.usage.completion_tokens, 4)
        finally:
            self.assertEqual(s.stop(), 0)


class Operations(unittest.TestCase):
    """Backpressure and graceful shutdown on the bundled checkpoint."""

    def test_queue_limit_is_an_immediate_429(self):
        s = Server("--max-queued-requests", "2")
        try:
            c = s.client()
            streams = [c.completions.create(model="qwen3_next_mtp", prompt="x", max_tokens=3000, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}) for _ in range(2)]
            for st in streams:
                next(iter(st))
            t0 = time.time()
            with self.assertRaises(openai.RateLimitError):
                c.completions.create(model="qwen3_next_mtp", prompt="x", max_tokens=2)
            self.assertLess(time.time() - t0, 5.0)
            for st in streams:
                st.close()
            # Once the two are gone the server takes requests again.
            deadline = time.time() + 30
            while True:
                try:
                    r = c.completions.create(model="qwen3_next_mtp", prompt="x", max_tokens=2, temperature=0)
                    break
                except openai.RateLimitError:
                    self.assertLess(time.time(), deadline)
                    time.sleep(0.05)
            self.assertEqual(r.usage.completion_tokens, 2)
        finally:
            s.stop()

    def test_sigterm_drains_in_flight_requests_then_exits_0(self):
        s = Server("--shutdown-timeout", "60")
        c = s.client()
        got = {}
        def run():
            r = c.completions.create(model="qwen3_next_mtp", prompt="x", max_tokens=400, temperature=0,
                                     extra_body={"ignore_eos": True})
            got["r"] = r
        t = threading.Thread(target=run)
        t.start()
        # SIGTERM once the request is in the engine (bounded wait).
        deadline = time.time() + 30
        while time.time() < deadline and s.metric("vllm:num_requests_running") < 1:
            time.sleep(0.01)
        self.assertGreaterEqual(s.metric("vllm:num_requests_running"), 1)
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        while time.time() < deadline and s.get("/health")[0] != 503:
            time.sleep(0.02)
        t.join(timeout=60)
        self.assertEqual(s.stop(), 0)
        self.assertIn("r", got, "the in-flight request failed")
        self.assertEqual(got["r"].usage.completion_tokens, 400, "the in-flight request was finished, not cut")


class Qwen3Template(unittest.TestCase):
    """The real Qwen3 chat template (`--chat-template`) on the bundled checkpoint: the server's prompt
    for each golden case of tests/fixtures/chat_golden/qwen3.json (messages, tools, chat_template_kwargs,
    add_generation_prompt) tokenizes like transformers' rendering; `raise_exception` is a 400 naming
    the template's message."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(ROOT, "tests/fixtures/chat_golden/qwen3.jinja"), encoding="utf-8") as f:
            template = f.read()
        with open(os.path.join(ROOT, "tests/fixtures/chat_golden/qwen3.json"), encoding="utf-8") as f:
            cls.golden = json.load(f)
        # A guard in front that renders nothing unless the first message is "boom".
        guard = "{%- if messages[0].content == 'boom' %}{{ raise_exception('no boom, please') }}{%- endif %}"
        cls.s, cls.path = server_with_file("--chat-template", guard + template, ".jinja")

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0
        os.unlink(cls.path)

    def tokens(self, body):
        code, text = self.s.post("/tokenize", body)
        self.assertEqual(code, 200, text)
        return json.loads(text)["tokens"]

    def test_prompts_equal_transformers(self):
        self.assertEqual(len(self.golden["chats"]), 11)
        for i, c in enumerate(self.golden["chats"]):
            body = {"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
                    "chat_template_kwargs": c["kwargs"]}
            if c["tools"] is not None:
                body["tools"] = c["tools"]
            self.assertEqual(self.tokens(body), self.tokens({"prompt": c["rendered"]}), f"chat {i}")

    def test_raise_exception_is_a_400_with_its_message(self):
        msgs = [{"role": "user", "content": "boom"}]
        for path, body in [("/tokenize", {"messages": msgs}),
                           ("/v1/chat/completions", {"messages": msgs, "max_tokens": 2})]:
            code, text = self.s.post(path, body)
            self.assertEqual(code, 400, text)
            self.assertIn("no boom, please", json.loads(text)["error"]["message"])
        self.assertTrue(self.tokens({"messages": [{"role": "user", "content": "fine"}]}))

    def test_chat_prompt_logprobs(self):
        msgs = [{"role": "user", "content": "fine"}]
        code, body = self.s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "prompt_logprobs": 0})
        self.assertEqual(code, 200, body)
        r = json.loads(body)
        self.assertEqual(len(r["prompt_logprobs"]), r["usage"]["prompt_tokens"])
        self.assertIsNone(r["prompt_logprobs"][0])
        self.assertTrue(all(len(x) == 1 for x in r["prompt_logprobs"][1:]))

    def test_continue_final_message(self):
        # vLLM's continue_final_message: the prompt ends right after the assistant's partial
        # answer (transformers' apply_chat_template(continue_final_message=True)).
        msgs = [{"role": "user", "content": "fine"}, {"role": "assistant", "content": "The answer is"}]
        whole = self.tokens({"messages": msgs, "add_generation_prompt": False})
        cut = self.tokens({"messages": msgs, "add_generation_prompt": False, "continue_final_message": True})
        text = lambda ids: json.loads(self.s.post("/detokenize", {"tokens": ids})[1])["prompt"]
        self.assertTrue(text(cut).endswith("The answer is"), text(cut))
        self.assertTrue(text(whole).startswith(text(cut)))
        self.assertGreater(len(text(whole)), len(text(cut)))
        r = self.s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "add_generation_prompt": False,
                                                 "continue_final_message": True})
        self.assertEqual(r[0], 200, r[1])
        for body, needle in [({"continue_final_message": True}, "add_generation_prompt: false"),
                             ({"continue_final_message": True, "add_generation_prompt": False,
                               "messages": msgs[:1]}, "the assistant's")]:
            code, t = self.s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, **body})
            self.assertEqual(code, 400, t)
            self.assertIn(needle, t)


class SmolLM2(unittest.TestCase):
    """The real SmolLM2-135M-Instruct: a chat answer through its template."""

    @classmethod
    def setUpClass(cls):
        # The parsers are on: an answer without think tags or tool calls stays plain content.
        cls.s = Server("--model", SMOLLM2, "--api-key", "sekret", "--served-model-name", "smollm2",
                       "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes")
        cls.c = cls.s.client("sekret")

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def ask(self, **kw):
        return self.c.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24, temperature=0, **kw)

    def test_paris(self):
        r = self.ask()
        self.assertIn("Paris", r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertIsNone(getattr(r.choices[0].message, "reasoning_content", None))
        self.assertFalse(r.choices[0].message.tool_calls)
        chunks = list(self.ask(stream=True))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(text, r.choices[0].message.content)

    def test_json_mode(self):
        # Unconstrained, the model writes "JSON:" before the object; constrained, the object alone.
        q = [{"role": "user", "content": "Give the name and age of a person called Alice who is 30, as JSON."}]
        kw = {"model": "smollm2", "messages": q, "max_tokens": 60, "temperature": 0}
        free = self.c.chat.completions.create(**kw).choices[0].message.content
        self.assertFalse(free.lstrip().startswith("{"), free)
        r = self.c.chat.completions.create(response_format={"type": "json_object"}, **kw).choices[0]
        self.assertEqual(r.finish_reason, "stop")
        obj = json.loads(r.message.content)
        self.assertEqual((obj["name"], obj["age"]), ("Alice", 30), r.message.content)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in
                           self.c.chat.completions.create(response_format={"type": "json_object"}, stream=True, **kw)
                           if ch.choices)
        self.assertEqual(streamed, r.message.content)

    def test_json_schema(self):
        schema = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "hobbies"],
                  "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                 "city": {"enum": ["Paris", "London"]}, "hobbies": {"type": "array", "items": {"type": "string"}}}}
        q = [{"role": "user", "content": "Alice is 30 years old and lives in Paris. Describe her as JSON."}]
        r = self.c.chat.completions.create(
            model="smollm2", messages=q, max_tokens=80, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": schema}})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        obj = json.loads(r.choices[0].message.content)
        self.assertEqual(sorted(obj), ["age", "city", "hobbies", "name"], obj)
        self.assertEqual((obj["name"], obj["age"], obj["city"]), ("Alice", 30, "Paris"), obj)
        self.assertTrue(all(isinstance(h, str) for h in obj["hobbies"]), obj)
        # The openai client's own structured outputs: a pydantic model turned into a strict
        # schema ($defs / $ref, anyOf with null, additionalProperties false), parsed back.
        import pydantic
        from typing import List, Literal, Optional

        class Pet(pydantic.BaseModel):
            kind: Literal["cat", "dog"]
            name: str

        class Person(pydantic.BaseModel):
            name: str
            age: int
            city: Optional[str]
            pets: List[Pet]

        p = self.c.chat.completions.parse(
            model="smollm2", response_format=Person, temperature=0, max_tokens=150,
            messages=[{"role": "user", "content": "Alice is 30, lives in Paris and has a cat called Tom. "
                                                  "Describe her as JSON."}]).choices[0]
        self.assertEqual(p.finish_reason, "stop")
        got = p.message.parsed
        self.assertEqual((got.name, got.age, got.pets[0].name, got.pets[0].kind), ("Alice", 30, "Tom", "cat"), got)
        c = self.c.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
            max_tokens=8, temperature=0, extra_body={"guided_choice": ["yes", "no"]}).choices[0]
        self.assertEqual((c.message.content, c.finish_reason), ("yes", "stop"))
        # vLLM's guided_json, the same schema as text: the same answer.
        g = self.c.chat.completions.create(model="smollm2", messages=q, max_tokens=80, temperature=0,
                                           extra_body={"guided_json": json.dumps(schema)})
        self.assertEqual(g.choices[0].message.content, r.choices[0].message.content)

    def test_auth_and_open_endpoints(self):
        with self.assertRaises(openai.AuthenticationError):
            self.s.client("wrong").models.list()
        self.assertEqual(self.s.get("/health")[0], 200)
        self.assertEqual(self.s.get("/metrics")[0], 200)

    def test_stop_strings_and_chat_logprobs(self):
        r = self.ask(stop=["France"], logprobs=True, top_logprobs=2)
        self.assertNotIn("France", r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        # Cut by a stop string, the usage still reports the prefix-cache hit of the prompt
        # the answers above left cached (16-token blocks).
        again = self.ask(stop=["France"])
        self.assertGreaterEqual(again.usage.prompt_tokens_details.cached_tokens, 16)
        self.assertEqual(again.choices[0].message.content, r.choices[0].message.content)
        chunks = list(self.ask(stop=["France"], stream=True, stream_options={"include_usage": True}))
        self.assertGreaterEqual(chunks[-1].usage.prompt_tokens_details.cached_tokens, 16)
        self.assertEqual("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices),
                         r.choices[0].message.content)
        self.assertTrue(len(r.choices[0].logprobs.content) >= 1)
        code, text = self.s.post("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": "x"}],
                                                          "top_logprobs": 2}, {"authorization": "Bearer sekret"})
        self.assertEqual(code, 400)
        self.assertIn("top_logprobs", text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
