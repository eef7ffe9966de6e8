#!/usr/bin/env python3
"""Golden chat-template renderings from transformers' `apply_chat_template` (tokenize=False),
for runner/tests/chat_golden.rs. transformers renders templates without torch.

    python3 tests/gen_chat_golden.py target/smollm2 > tests/fixtures/chat_golden/smollm2.json
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoTokenizer  # noqa: E402

CHATS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken…"},
                  {"role": "user", "content": "Another one, with ünïcödé 🙂"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "No prompt after me"}], "add_generation_prompt": False},
]


def main():
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    out = []
    for c in CHATS:
        text = tok.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=c["add_generation_prompt"])
        out.append({**c, "rendered": text})
    import transformers
    json.dump({"transformers": transformers.__version__, "chats": out}, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
