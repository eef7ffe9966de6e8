#!/usr/bin/env python3
"""Golden chat-template renderings from transformers' `apply_chat_template` (tokenize=False),
checked by the tests of runner/src/chat/. transformers renders templates without torch
(a throwaway venv with `pip install transformers jinja2` is enough).

    python3 tests/gen_chat_golden.py target/smollm2 > tests/fixtures/chat_golden/smollm2.json
    python3 tests/gen_chat_golden.py qwen3 > tests/fixtures/chat_golden/qwen3.json

`qwen3` renders tests/fixtures/chat_golden/qwen3.jinja, the hub chat template of Qwen/Qwen3-0.6B
(Apache-2.0, Qwen), committed verbatim from llama.cpp's copy of it:
`models/templates/Qwen-Qwen3-0.6B.jinja` in github.com/ye-NX/llama.cpp (a fork of ggml-org/llama.cpp;
commit 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e, file added upstream by e121edc4 "server: add
--reasoning-budget 0 ..." from the hub's tokenizer_config.json). The template output does not depend
on the vocabulary, so the tokenizer is tests/fixtures/tokenizer.json with that template set.
Each case also carries its `tools` (null when absent) and extra template `kwargs` (what a request's
`chat_template_kwargs` carries). The `tojson` list renders small templates through the same
transformers environment (`tojson` = `json.dumps(ensure_ascii=False, ...)`), and `strftime` is
`strftime_now`'s formatting at fixed instants.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

CHATS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken…"},
                  {"role": "user", "content": "Another one, with ünïcödé 🙂"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "No prompt after me"}], "add_generation_prompt": False},
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city. Uses <b>live</b> data & 'quotes'; naïve façade, 東京.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number", "minimum": -1.5e-05, "maximum": 1e16},
            "b": {"type": "integer", "multipleOf": 1, "examples": [0, 2.0, -3]}},
            "required": ["a", "b"], "additionalProperties": False}}},
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}

TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris and Tokyo, and what is 2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"東京\"}"}},
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "content": "{\"temperature\": 18, \"sky\": \"clear\"}"},
    {"role": "tool", "content": "{\"temperature\": 24, \"sky\": \"rain\"}"},
    {"role": "tool", "content": "5"},
]

QWEN3 = [
    # 0: user only (no system turn, enable_thinking absent)
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "add_generation_prompt": True},
    # 1-3: system + user with enable_thinking false / true / absent
    {"messages": [SYSTEM, {"role": "user", "content": "Hi"}], "add_generation_prompt": True,
     "kwargs": {"enable_thinking": False}},
    {"messages": [SYSTEM, {"role": "user", "content": "Hi"}], "add_generation_prompt": True,
     "kwargs": {"enable_thinking": True}},
    {"messages": [SYSTEM, {"role": "user", "content": "Hi"}], "add_generation_prompt": True},
    # 4: multi-turn; the old assistant turn's <think> in content is dropped before the last query
    {"messages": [{"role": "user", "content": "Say hello."},
                  {"role": "assistant", "content": "<think>\nThe user wants a greeting.\n</think>\n\nHello!"},
                  {"role": "user", "content": "Now in French."}], "add_generation_prompt": True},
    # 5: reasoning_content on the final assistant turn (after the last query: kept), no generation prompt
    {"messages": [{"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "<think>old</think>ignored split", "reasoning_content": "Two plus two.\n"},
                  {"role": "user", "content": "And 3+3?"},
                  {"role": "assistant", "content": "\n6", "reasoning_content": "\nThree plus three is six.\n"}],
     "add_generation_prompt": False},
    # 6: tools + tool_calls (dict and string arguments) + consecutive tool responses + a final user turn
    {"messages": [SYSTEM] + TOOL_TURNS + [{"role": "assistant", "content": "Paris 18°C, Tokyo 24°C; 2+3=5."},
                                          {"role": "user", "content": "Thanks! Which is warmer?"}],
     "tools": TOOLS, "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
    # 7: multi-step tool use (no final user turn): the assistant turns after the last real query keep
    #    their reasoning; tools without a system message; null fields are dropped; `reasoning` aliases
    {"messages": TOOL_TURNS + [{"role": "assistant", "content": "Done.", "reasoning": "All tools answered.",
                                "tool_calls": None}],
     "tools": TOOLS[:1], "add_generation_prompt": False},
    # 8: the same with a generation prompt and thinking on
    {"messages": TOOL_TURNS, "tools": TOOLS, "add_generation_prompt": True, "kwargs": {"enable_thinking": True}},
    # 9: assistant text before its tool call; a second system message mid-chat; non-ASCII
    {"messages": [{"role": "user", "content": "Погода в Москве? 🌧"},
                  {"role": "assistant", "content": "Проверю.", "tool_calls": [
                      {"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Москва", "note": "ünïcödé \"q\" \\ \n\t"}}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": -3}"},
                  {"role": "system", "content": "Answer in Russian."},
                  {"role": "user", "content": "Спасибо"}],
     "tools": TOOLS, "add_generation_prompt": True},
    # 10: no generation prompt, enable_thinking false has no effect then
    {"messages": [{"role": "user", "content": "No prompt after me"}], "add_generation_prompt": False,
     "kwargs": {"enable_thinking": False}},
]

TOJSON_VALUE = {"name": "f", "nested": {"list": [1, 2.5, -0.0, 1e-05, 1e16, 123456789012345678, True, None],
                                        "empty_list": [], "empty_dict": {}},
                "text": "ünïcödé 🙂 <b>&'\"\\\n\t\u0001\u007f\u2028", "z": "last", "a": "first"}

TOJSON = [
    "{{ x | tojson }}",
    "{{ x | tojson(indent=2) }}",
    "{{ x | tojson(indent=0) }}",
    "{{ x | tojson(ensure_ascii=true) }}",
    "{{ x | tojson(sort_keys=true) }}",
    "{{ x | tojson(separators=(',', ':')) }}",
    "{{ x | tojson(indent=4, separators=(', ', ' = ')) }}",
    "{{ x.nested.list | tojson(indent=1) }}",
    "{{ 'a\"b' | tojson }}{{ 3 | tojson }}{{ [] | tojson(indent=2) }}",
]


# strftime_now(format) is `datetime.now().strftime(format)` (a naive local time, so %Z and %z are
# empty); these are the same formats applied to fixed UTC instants, as naive datetimes.
STRFTIME = ["%d %b %Y", "%Y-%m-%d %H:%M:%S", "%A, %B %d, %y %I:%M %p %j", "%-d %-m %e|%%|%F %T|%Z|%z", "%a %b %-H:%-M:%-S"]
INSTANTS = [0, 1764597225, 951825600, 4102444799]


def strftime_cases():
    from datetime import datetime, timezone
    return [{"format": f, "timestamp": t,
             "rendered": datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None).strftime(f)}
            for f in STRFTIME for t in INSTANTS]


def qwen3():
    path = os.path.join(HERE, "fixtures/chat_golden/qwen3.jinja")
    with open(path, encoding="utf-8") as f:
        template = f.read()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(HERE, "fixtures/tokenizer.json"))
    tok.chat_template = template
    out = []
    for c in QWEN3:
        kwargs = c.get("kwargs", {})
        tools = c.get("tools")
        text = tok.apply_chat_template(c["messages"], tools=tools, tokenize=False,
                                       add_generation_prompt=c["add_generation_prompt"], **kwargs)
        out.append({"messages": c["messages"], "tools": tools, "kwargs": kwargs,
                    "add_generation_prompt": c["add_generation_prompt"], "rendered": text})
    from transformers.utils.chat_template_utils import _compile_jinja_template
    tojson = [{"template": t, "x": TOJSON_VALUE, "rendered": _compile_jinja_template(t).render(x=TOJSON_VALUE)}
              for t in TOJSON]
    return {"template": "tests/fixtures/chat_golden/qwen3.jinja", "chats": out, "tojson": tojson,
            "strftime": strftime_cases()}


def smollm2(folder):
    tok = AutoTokenizer.from_pretrained(folder)
    out = []
    for c in CHATS:
        text = tok.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=c["add_generation_prompt"])
        out.append({**c, "rendered": text})
    return {"chats": out}


def main():
    import transformers
    body = qwen3() if sys.argv[1] == "qwen3" else smollm2(sys.argv[1])
    json.dump({"transformers": transformers.__version__, **body}, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
