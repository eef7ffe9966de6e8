//! Golden renderings from transformers (tests/gen_chat_golden.py) and the template helpers.

use super::*;

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn golden(name: &str) -> Value {
    let text = std::fs::read_to_string(root().join("tests/fixtures/chat_golden").join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The `tools` and `kwargs` of a golden case as the server passes them (`tools` plus the
/// request's `chat_template_kwargs` in one map).
fn extra_of(case: &Value) -> Map<String, Value> {
    let mut extra = Map::new();
    if let Some(t) = case.get("tools").filter(|t| !t.is_null()) {
        extra.insert("tools".into(), t.clone());
    }
    if let Some(k) = case.get("kwargs").and_then(Value::as_object) {
        extra.extend(k.clone());
    }
    extra
}

/// Renderings equal transformers' `apply_chat_template` for SmolLM2's template (the hub
/// files of tests/fixtures/smollm2_ref/hub): default system message, explicit system,
/// multi-turn with an assistant turn and non-ASCII text, no generation prompt.
#[test]
fn smollm2_renderings_equal_transformers() {
    let dir = root().join("tests/fixtures/smollm2_ref/hub");
    let golden = golden("smollm2.json");
    let chats = golden["chats"].as_array().unwrap();
    assert_eq!(chats.len(), 4);
    for (i, c) in chats.iter().enumerate() {
        let add = c["add_generation_prompt"].as_bool().unwrap();
        let got = render_messages(&dir, None, &c["messages"], add, &Map::new()).unwrap();
        assert_eq!(got, c["rendered"].as_str().unwrap(), "chat {i}");
    }
}

/// Renderings equal transformers' for the hub template of Qwen/Qwen3-0.6B: system, multi-turn
/// with `<think>` in content and `reasoning_content` (old reasoning dropped before the last
/// query), tools with dict and string arguments, consecutive tool responses, multi-step tool
/// use, `enable_thinking` true/false/absent, no generation prompt, non-ASCII, null fields and the
/// `reasoning` alias.
#[test]
fn qwen3_renderings_equal_transformers() {
    let template = std::fs::read_to_string(root().join("tests/fixtures/chat_golden/qwen3.jinja")).unwrap();
    for needle in ["enable_thinking", "reasoning_content", "<tool_call>", "<tool_response>", "messages[::-1]"] {
        assert!(template.contains(needle), "{needle}");
    }
    // A folder without tokenizer_config.json: the template comes as the override, as with
    // `porter serve --chat-template`.
    let dir = root().join("tests/fixtures/chat_golden");
    let golden = golden("qwen3.json");
    let chats = golden["chats"].as_array().unwrap();
    assert_eq!(chats.len(), 11);
    for (i, c) in chats.iter().enumerate() {
        let add = c["add_generation_prompt"].as_bool().unwrap();
        let got = render_messages(&dir, Some(&template), &c["messages"], add, &extra_of(c)).unwrap();
        assert_eq!(got, c["rendered"].as_str().unwrap(), "chat {i}");
    }
}

/// `tojson` equals transformers' (`json.dumps`) for nested dicts and lists, unicode, control
/// characters, floats, `indent` (int), `ensure_ascii`, `sort_keys` and `separators`.
#[test]
fn tojson_equals_python_json_dumps() {
    let dir = root().join("tests/fixtures/chat_golden");
    let golden = golden("qwen3.json");
    let cases = golden["tojson"].as_array().unwrap();
    assert_eq!(cases.len(), 9);
    for c in cases {
        let tmpl = c["template"].as_str().unwrap();
        let mut extra = Map::new();
        extra.insert("x".into(), c["x"].clone());
        let got = render_messages(&dir, Some(tmpl), &Value::Array(vec![]), false, &extra).unwrap();
        assert_eq!(got, c["rendered"].as_str().unwrap(), "{tmpl}");
    }
}

/// Python's float repr, as `json.dumps` prints floats.
#[test]
fn float_repr_is_python_repr() {
    let cases = [
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (2.0, "2.0"),
        (0.1, "0.1"),
        (1e-4, "0.0001"),
        (1.5e-5, "1.5e-05"),
        (123456789012345.6, "123456789012345.6"),
        (1e15, "1000000000000000.0"),
        (1e16, "1e+16"),
        (-2.5e300, "-2.5e+300"),
        (f64::INFINITY, "Infinity"),
        (f64::NAN, "NaN"),
    ];
    for (f, want) in cases {
        assert_eq!(pyjson::float_repr(f), want, "{f}");
    }
}

/// `strftime_now`'s formatting equals Python's `datetime.strftime` at fixed instants (the
/// generator's `strftime` cases).
#[test]
fn strftime_equals_python() {
    let golden = golden("qwen3.json");
    let cases = golden["strftime"].as_array().unwrap();
    assert_eq!(cases.len(), 20);
    for c in cases {
        let fmt = c["format"].as_str().unwrap();
        let ts = c["timestamp"].as_i64().unwrap();
        assert_eq!(strftime::strftime(fmt, ts).unwrap(), c["rendered"].as_str().unwrap(), "{fmt} at {ts}");
    }
    assert!(strftime::strftime("%Q", 0).unwrap_err().contains("%Q"));
    assert!(strftime::strftime("50%", 0).is_err());
    // Through the template: today's date in the %Y-%m-%d shape.
    let dir = root().join("tests/fixtures/chat_golden");
    let got = render_messages(&dir, Some("{{ strftime_now('%F') }}"), &Value::Array(vec![]), false, &Map::new());
    let got = got.unwrap();
    assert_eq!(got.len(), 10);
    assert!(got.starts_with("20") && got.as_bytes()[4] == b'-' && got.as_bytes()[7] == b'-', "{got}");
}

/// `raise_exception(msg)` fails the rendering with `msg` in the error (the server answers 400
/// with it).
#[test]
fn raise_exception_reaches_the_error() {
    let dir = root().join("tests/fixtures/chat_golden");
    let t = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok";
    let msgs = serde_json::json!([{"role": "assistant", "content": "x"}]);
    let err = render_messages(&dir, Some(t), &msgs, true, &Map::new()).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("the chat template raised an exception: Conversation roles must alternate user/assistant/user/assistant/..."),
        "{text}"
    );
    let msgs = serde_json::json!([{"role": "user", "content": "x"}]);
    assert_eq!(render_messages(&dir, Some(t), &msgs, true, &Map::new()).unwrap(), "ok");
}

/// Named templates in tokenizer_config.json: `tool_use` when tools are given and it exists,
/// else `default`; an error naming the templates when there is no `default`.
#[test]
fn named_templates_pick_tool_use_with_tools() {
    let both = serde_json::json!([
        {"name": "default", "template": "D{{ messages|length }}"},
        {"name": "tool_use", "template": "T{{ tools|length }}"},
        {"name": "rag", "template": "R"}
    ]);
    let list = both.as_array().unwrap();
    assert_eq!(select_named(list, false).unwrap(), "D{{ messages|length }}");
    assert_eq!(select_named(list, true).unwrap(), "T{{ tools|length }}");
    let only_default = &list[..1];
    assert_eq!(select_named(only_default, true).unwrap(), "D{{ messages|length }}");
    let err = select_named(&list[1..], false).unwrap_err().to_string();
    assert!(err.contains("none called `default`") && err.contains("\"rag\", \"tool_use\""), "{err}");
    assert_eq!(select_named(&list[1..], true).unwrap(), "T{{ tools|length }}");

    // Through render_messages and a model folder's tokenizer_config.json.
    let dir = std::env::temp_dir().join(format!("porter-chat-named-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({"chat_template": both, "eos_token": "</s>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    let mut extra = Map::new();
    assert_eq!(render_messages(&dir, None, &msgs, true, &extra).unwrap(), "D1");
    extra.insert("tools".into(), serde_json::json!([{"type": "function"}, {"type": "function"}]));
    assert_eq!(render_messages(&dir, None, &msgs, true, &extra).unwrap(), "T2");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Null fields are dropped and the reasoning names alias each other, in transformers' key order.
#[test]
fn messages_are_normalized_like_transformers() {
    let msgs = serde_json::json!([
        {"role": "assistant", "content": null, "reasoning": "r", "tool_calls": null},
        {"role": "assistant", "thinking": "t", "reasoning_content": "rc"},
        {"role": "user", "content": "u"}
    ]);
    let got = normalize_messages(&msgs).to_string();
    assert_eq!(
        got,
        r#"[{"thinking":"r","role":"assistant","reasoning":"r","reasoning_content":"r"},{"thinking":"t","role":"assistant","reasoning_content":"rc"},{"role":"user","content":"u"}]"#
    );
}

/// Negative slice steps and ranges work natively in minijinja 3 (no `|reverse` rewrite): the
/// same output as transformers' jinja2 (`cba|ca|210|cba`).
#[test]
fn negative_steps_equal_jinja2() {
    let dir = root().join("tests/fixtures/chat_golden");
    let t = "{% for m in messages[::-1] %}{{ m.content }}{% endfor %}|{{ (messages|map(attribute='content')|list)[::-2]|join }}|{% for i in range(2, -1, -1) %}{{ i }}{% endfor %}|{{ 'abc'[::-1] }}";
    let msgs = serde_json::json!([{"content": "a"}, {"content": "b"}, {"content": "c"}]);
    assert_eq!(render_messages(&dir, Some(t), &msgs, false, &Map::new()).unwrap(), "cba|ca|210|cba");
}
