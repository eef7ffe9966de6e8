"""`porter serve`'s tool calls forced by `tool_choice`, the Responses API and special tokens,
driven by the official openai client (the helpers of test_serve.py).

Run by runner/tests/serve.rs (part of `cargo test`) with the test venv of scripts/test-setup.sh:
    target/smollm2-venv/bin/python tests/python/test_serve_tools.py PORTER_BIN
"""

import json
import os
import unittest

from test_serve import ROOT, Server, server_with_file  # pops PORTER_BIN from sys.argv


class Qwen3Parsers(unittest.TestCase):
    """A server of the bundled checkpoint with the real Qwen3 template (which renders `tools`) and
    both parsers on."""

    @classmethod
    def setUpClass(cls):
        cls.s = Server("--chat-template", os.path.join(ROOT, "tests/fixtures/chat_golden/qwen3.jinja"),
                       "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")
        cls.c = cls.s.client()
        cls.model = cls.c.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0


class ForcedToolCalls(Qwen3Parsers):
    """`tool_choice` forcing a call: the forced path bypasses the parsers."""

    TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
        "required": ["city"]}}}
    OTHER = {"type": "function", "function": {"name": "count", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    MSGS = [{"role": "user", "content": "Weather in Paris?"}]

    def streamed_calls(self, kw):
        """The streamed tool-call fragments merged per index, and the finish reason."""
        calls, finish = {}, None
        for ch in self.c.chat.completions.create(stream=True, **kw):
            for c in ch.choices:
                self.assertFalse(c.delta.content, "a forced call streams no content")
                for tc in c.delta.tool_calls or []:
                    d = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                    for k, v in [("id", tc.id), ("name", tc.function.name)]:
                        if v:
                            self.assertIsNone(d[k], "id and name come once")
                            d[k] = v
                    d["arguments"] += tc.function.arguments or ""
                finish = c.finish_reason or finish
        return [calls[i] for i in sorted(calls)], finish

    def check_args(self, name, args):
        if name == "get_weather":
            self.assertIsInstance(args["city"], str)
            self.assertLessEqual(len(args["city"]), 12)
            self.assertLessEqual(set(args), {"city", "days"})
        else:
            self.assertEqual(name, "count")
            self.assertIsInstance(args["n"], int)
            self.assertEqual(set(args), {"n"})

    def test_named_function(self):
        # The answer is constrained to the function's parameters and returned as the call's
        # arguments, streamed or not. Random weights: count the draws that close it.
        closed = 0
        for seed in range(6):
            kw = dict(model=self.model, messages=self.MSGS, tools=[self.TOOL, self.OTHER], max_tokens=60,
                      temperature=1.0, seed=seed, tool_choice={"type": "function", "function": {"name": "get_weather"}})
            r = self.c.chat.completions.create(**kw).choices[0]
            self.assertEqual(len(r.message.tool_calls), 1, r)
            call = r.message.tool_calls[0]
            self.assertEqual((call.type, call.function.name), ("function", "get_weather"))
            self.assertTrue(call.id.startswith("call_"), call.id)
            if r.finish_reason != "length":
                self.assertEqual(r.finish_reason, "stop")
                self.check_args("get_weather", json.loads(call.function.arguments))
                closed += 1
            got = self.streamed_calls(kw)
            self.assertEqual(got, ([{"id": call.id, "name": "get_weather", "arguments": call.function.arguments}],
                                   r.finish_reason))
        self.assertGreater(closed, 0, "no draw closed the arguments")

    def test_required(self):
        # An array of calls, one schema per tool told apart by `name`; finish_reason tool_calls.
        closed = 0
        for seed in range(6):
            kw = dict(model=self.model, messages=self.MSGS, tools=[self.TOOL, self.OTHER], max_tokens=120,
                      temperature=1.0, seed=seed, tool_choice="required")
            r = self.c.chat.completions.create(**kw).choices[0]
            calls = r.message.tool_calls or []
            for call in calls:
                self.check_args(call.function.name, json.loads(call.function.arguments))
            if r.finish_reason != "length":
                self.assertEqual(r.finish_reason, "tool_calls")
                self.assertGreaterEqual(len(calls), 1)
                closed += 1
            got = self.streamed_calls(kw)
            self.assertEqual(got, ([{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                                    for c in calls], r.finish_reason))
        self.assertGreater(closed, 0, "no draw closed the array of calls")
        # parallel_tool_calls: false — at most one call.
        for seed in range(4):
            r = self.c.chat.completions.create(model=self.model, messages=self.MSGS, tools=[self.TOOL, self.OTHER],
                                               max_tokens=120, temperature=1.0, seed=seed, tool_choice="required",
                                               parallel_tool_calls=False).choices[0]
            self.assertLessEqual(len(r.message.tool_calls or []), 1)

    def test_refusals(self):
        for body, needle in [
            ({"tools": [self.TOOL, self.TOOL], "tool_choice": "required"}, "`get_weather` twice"),
            ({"tools": [self.TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
             "not in `tools`"),
            ({"tool_choice": "required"}, "needs `tools`"),
            ({"tools": [self.TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
              "response_format": {"type": "json_object"}}, "cannot be combined"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
              "properties": {"a": {"type": "string", "pattern": "x"}}}}}], "tool_choice": "required"}, "pattern"),
        ]:
            code, text = self.s.post("/v1/chat/completions", {"model": self.model, "messages": self.MSGS, **body})
            self.assertEqual(code, 400, text)
            self.assertIn(needle, text)


class ResponsesApi(Qwen3Parsers):
    """`POST /v1/responses` through the openai client's `responses.create`: text, streamed events,
    forced function calls, and a conversation carrying a call and its output."""

    def test_text_streamed_or_not(self):
        kw = dict(model=self.model, input="Say hello.", instructions="Be brief.", max_output_tokens=12,
                  temperature=0)
        r = self.c.responses.create(**kw)
        self.assertTrue(r.id.startswith("resp"), r.id)
        self.assertEqual(r.object, "response")
        self.assertIn(r.status, ("completed", "incomplete"))
        self.assertEqual(r.usage.output_tokens, 12 if r.status == "incomplete" else r.usage.output_tokens)
        self.assertEqual(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens)
        kinds, text, seqs, final = [], "", [], None
        for ev in self.c.responses.create(stream=True, **kw):
            kinds.append(ev.type)
            seqs.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
        self.assertEqual(kinds[:2], ["response.created", "response.in_progress"])
        self.assertEqual(seqs, list(range(len(seqs))))
        self.assertEqual(final.status, r.status)
        self.assertEqual(text, r.output_text)
        self.assertEqual(final.output_text, r.output_text)
        self.assertEqual(final.usage.output_tokens, r.usage.output_tokens)
        # The output text's tokens with their log-probabilities, streamed or not.
        kw.update(top_logprobs=2, include=["message.output_text.logprobs"])
        r = self.c.responses.create(**kw)
        parts = [p for o in r.output if o.type == "message" for p in o.content]
        lps = [e for p in parts for e in p.logprobs]
        self.assertTrue(lps)
        self.assertTrue(all(e.logprob <= 0 and len(e.top_logprobs) <= 2 for e in lps))
        streamed = [e for ev in self.c.responses.create(stream=True, **kw)
                    if ev.type == "response.output_text.delta" for e in ev.logprobs]
        self.assertEqual([(e.token, e.logprob) for e in streamed], [(e.token, e.logprob) for e in lps])

    def test_forced_function_call_and_its_output(self):
        tool = {"type": "function", "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}
        closed = 0
        for seed in range(6):
            # `seed` is porter's extension of the Responses API (as of the chat API).
            r = self.c.responses.create(model=self.model, input="Weather in Paris?", tools=[tool],
                                        tool_choice={"type": "function", "name": "get_weather"},
                                        max_output_tokens=60, temperature=1.0, extra_body={"seed": seed})
            calls = [o for o in r.output if o.type == "function_call"]
            self.assertEqual(len(calls), 1, r.output)
            self.assertEqual(calls[0].name, "get_weather")
            if r.status == "completed":
                self.assertIsInstance(json.loads(calls[0].arguments)["city"], str)
                closed += 1
        self.assertGreater(closed, 0)
        # The call and its output sent back: a new turn.
        call = calls[0]
        r = self.c.responses.create(model=self.model, tools=[tool], max_output_tokens=8, temperature=0, input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
        self.assertIn(r.status, ("completed", "incomplete"))
        self.assertGreater(r.usage.input_tokens, 10)

    def test_refusals(self):
        for body, needle in [
            ({"input": "x", "previous_response_id": "resp_1"}, "stores nothing"),
            ({"input": "x", "store": True}, "`store` must be false"),
            ({"input": "x", "max_tokens": 3}, "unknown field `max_tokens`"),
            ({"input": "x", "tools": [{"type": "web_search"}]}, "only `function` tools"),
        ]:
            code, text = self.s.post("/v1/responses", {"model": self.model, **body})
            self.assertEqual(code, 400, text)
            self.assertIn(needle, json.loads(text)["error"]["message"])


class SpecialTokens(unittest.TestCase):
    """A tokenizer whose post-processor adds a BOS (as Llama's and Mistral's do): a completions
    prompt gets it (vLLM's `add_special_tokens`, on by default there), unless turned off."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(ROOT, "tests/fixtures/qwen3_next_mtp/tokenizer.json"), encoding="utf-8") as f:
            tok = json.load(f)
        bos = tok["added_tokens"][0]
        cls.bos = bos["id"]
        tok["post_processor"] = {"type": "TemplateProcessing",
                                 "single": [{"SpecialToken": {"id": bos["content"], "type_id": 0}},
                                            {"Sequence": {"id": "A", "type_id": 0}}],
                                 "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                          {"Sequence": {"id": "B", "type_id": 1}}],
                                 "special_tokens": {bos["content"]: {"id": bos["content"], "ids": [bos["id"]],
                                                                     "tokens": [bos["content"]]}}}
        cls.s, cls.path = server_with_file("--tokenizer", json.dumps(tok), ".json")

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0
        os.unlink(cls.path)

    def prompt_ids(self, **extra):
        body = {"prompt": "Beautiful is better", "max_tokens": 1, "return_token_ids": True, **extra}
        code, text = self.s.post("/v1/completions", body)
        self.assertEqual(code, 200, text)
        return json.loads(text)["choices"][0]["prompt_token_ids"]

    def test_completions_add_the_bos_unless_told_not_to(self):
        with_bos, without = self.prompt_ids(), self.prompt_ids(add_special_tokens=False)
        self.assertEqual(with_bos, [self.bos] + without)
        code, text = self.s.post("/tokenize", {"prompt": "Beautiful is better"})
        self.assertEqual(json.loads(text)["tokens"], with_bos)
        code, text = self.s.post("/tokenize", {"prompt": "Beautiful is better", "add_special_tokens": False})
        self.assertEqual(json.loads(text)["tokens"], without)



class NamesAndKeys(unittest.TestCase):
    """Several `--served-model-name`s (a request may name any; responses carry the first) and
    several `--api-key`s (any is accepted, the scheme in any case), as vLLM."""

    @classmethod
    def setUpClass(cls):
        cls.s = Server("--served-model-name", "tiny", "alias", "--api-key", "k1", "k2")

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def test_names_and_keys(self):
        for key in ["k1", "k2"]:
            c = self.s.client(key)
            self.assertEqual([m.id for m in c.models.list().data], ["tiny", "alias"])
            r = c.completions.create(model="alias", prompt="x", max_tokens=2)
            self.assertEqual(r.model, "tiny")
            self.assertEqual(c.models.retrieve("alias").id, "alias")
        code, _ = self.s.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, {"authorization": "bearer k2"})
        self.assertEqual(code, 200)
        for auth in ["Bearer k3", "k1", "Basic k1"]:
            code, _ = self.s.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, {"authorization": auth})
            self.assertEqual(code, 401, auth)
        code, text = self.s.post("/v1/completions", {"model": "other", "prompt": "x"}, {"authorization": "Bearer k1"})
        self.assertEqual(code, 404, text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
