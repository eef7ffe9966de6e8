use super::*;

#[test]
fn requests_become_chat_requests() {
    let v = json!({
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 9, "stream": true, "top_logprobs": 2,
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"a\":1}"},
            {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is "}, {"type": "output_text", "text": "sunny."}]}
        ],
        "tools": [{"type": "function", "name": "get", "description": "d", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "get"},
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}},
        "store": false, "include": [], "truncation": "disabled"
    });
    let (chat, meta) = to_chat(&v).expect("translated");
    let m = chat["messages"].as_array().expect("messages");
    assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(m[1], json!({"role": "user", "content": "Weather?"}));
    assert_eq!(m[2]["tool_calls"].as_array().map(Vec::len), Some(2), "one assistant turn with both calls");
    assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}));
    assert_eq!(m[4], json!({"role": "assistant", "content": "It is sunny."}));
    assert_eq!(chat["max_tokens"], json!(9));
    assert_eq!((chat["logprobs"].clone(), chat["top_logprobs"].clone()), (json!(true), json!(2)));
    assert_eq!(chat["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        chat["tools"][0],
        json!({"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object"}}})
    );
    assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "get"}}));
    assert_eq!(chat["response_format"], json!({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}));
    assert_eq!(meta.max_output_tokens, json!(9));
    // A plain string input.
    let (chat, _) = to_chat(&json!({"input": "hi"})).expect("string input");
    assert_eq!(chat["messages"], json!([{"role": "user", "content": "hi"}]));
    for (v, needle) in [
        (json!({"input": "x", "previous_response_id": "r1"}), "stores nothing"),
        (json!({"input": "x", "store": true}), "`store` must be false"),
        (json!({"input": "x", "max_output_token": 3}), "unknown field `max_output_token`"),
        (json!({"input": []}), "non-empty list"),
        (json!({"input": [{"type": "image", "url": "u"}]}), "`image` are not supported"),
        (json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}), "text only"),
        (json!({"input": "x", "tools": [{"type": "web_search"}]}), "only `function` tools"),
        (json!({"input": "x", "reasoning": {"effort": "low"}}), "`reasoning` is not supported"),
        (json!({"input": "x", "truncation": "auto"}), "never truncated"),
        (json!({"input": "x", "include": ["reasoning.encrypted_content"]}), "output_text.logprobs` only"),
    ] {
        let e = to_chat(&v).err().map(|e| e.message).unwrap_or_default();
        assert!(e.contains(needle), "{v}: {e}");
    }
}

/// A stream's events, from the chat chunks of reasoning, text and two calls: each item is
/// added, filled and done in order, sequence numbers count up, and the final response holds
/// the same output items as the non-streamed translation of the same message.
#[test]
fn chat_chunks_become_response_events() {
    let mut e = Events::new("resp_1".into(), "m".into(), Meta::default());
    let mut evs = e.start();
    for c in [
        json!({"index": 0, "delta": {"role": "assistant", "content": ""}}),
        json!({"index": 0, "delta": {"reasoning_content": "think"}}),
        json!({"index": 0, "delta": {"content": "Hello"}}),
        json!({"index": 0, "delta": {"content": " there"}}),
        json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\""}}]}}),
        json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}}),
        json!({"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}}),
        json!({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
    ] {
        evs.extend(e.chunk(&c));
    }
    evs.extend(e.end((5, 7, 0)));
    let kinds: Vec<&str> = evs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (k, v)) in evs.iter().enumerate() {
        assert_eq!((v["type"].as_str(), v["sequence_number"].as_u64()), (Some(k.as_str()), Some(i as u64)));
    }
    let done = &evs.last().expect("completed").1["response"];
    assert_eq!(done["status"], json!("completed"));
    assert_eq!(done["usage"]["total_tokens"], json!(12));
    let out = done["output"].as_array().expect("output");
    assert_eq!(out.len(), 4);
    assert_eq!(out[1]["content"][0]["text"], json!("Hello there"));
    assert_eq!((out[2]["call_id"].clone(), out[2]["arguments"].clone()), (json!("call_a"), json!("{\"x\":1}")));
    // The same message, not streamed: the same items (ids aside).
    let message = json!({"role": "assistant", "reasoning_content": "think", "content": "Hello there", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]});
    let strip = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().map(|o| o.remove("id"));
        v
    };
    let whole: Vec<Value> = output_of("resp_1", &message, &Value::Null).iter().map(strip).collect();
    assert_eq!(whole, out.iter().map(strip).collect::<Vec<_>>());
    // Cut by max_output_tokens: incomplete.
    let mut e = Events::new("resp_2".into(), "m".into(), Meta::default());
    e.chunk(&json!({"index": 0, "delta": {"content": "a"}}));
    e.chunk(&json!({"index": 0, "delta": {}, "finish_reason": "length"}));
    let last = e.end((1, 1, 0)).pop().expect("end");
    assert_eq!(last.0, "response.incomplete");
    assert_eq!(last.1["response"]["incomplete_details"], json!({"reason": "max_output_tokens"}));
}

#[test]
fn chat_errors_name_the_responses_fields() {
    let e = rename(ApiError::invalid("max_tokens", "`max_tokens` must be >= 1, got 0"));
    assert_eq!(
        (e.param.as_deref(), e.message.as_str()),
        (Some("max_output_tokens"), "`max_output_tokens` must be >= 1, got 0")
    );
    let e = rename(ApiError::invalid("response_format", "`response_format`: the schema is not supported: x"));
    assert_eq!(e.param.as_deref(), Some("text.format"));
    assert!(e.message.starts_with("`text.format`"), "{}", e.message);
}

/// A small deterministic generator of JSON values drawn from a palette of the request's own
/// field names and edge values.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn value(&mut self, depth: usize) -> Value {
        const KEYS: [&str; 16] = [
            "type",
            "role",
            "content",
            "name",
            "call_id",
            "arguments",
            "output",
            "text",
            "format",
            "schema",
            "function",
            "parameters",
            "input",
            "tools",
            "x",
            "",
        ];
        match self.below(if depth == 0 { 7 } else { 9 }) {
            0 => Value::Null,
            1 => json!(self.below(2) == 0),
            2 => json!([-1i64, 0, 1, 3, i64::MAX][self.below(5)]),
            3 => json!([0.5f64, -2.5, 1e300][self.below(3)]),
            4 => json!(
                ["", "x", "message", "function_call", "function_call_output", "json_schema", "auto"][self.below(7)]
            ),
            5 => json!("function"),
            6 => json!({}),
            7 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
            _ => {
                let mut m = Map::new();
                for _ in 0..self.below(5) {
                    let k = KEYS[self.below(KEYS.len())];
                    m.insert(k.to_owned(), self.value(depth - 1));
                }
                Value::Object(m)
            }
        }
    }
}

/// Thousands of malformed Responses requests (and `tool_choice` / field checks on chat
/// ones): never a panic; every refusal names a parameter.
#[test]
fn malformed_requests_are_named_refusals() {
    const FIELDS_TRIED: [&str; 12] = [
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "text",
        "max_output_tokens",
        "store",
        "include",
        "truncation",
        "top_logprobs",
        "model",
        "stream",
    ];
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        let mut v = json!({"input": "hi"});
        for _ in 0..1 + g.below(3) {
            let k = FIELDS_TRIED[g.below(FIELDS_TRIED.len())];
            v[k] = g.value(3);
        }
        if let Err(e) = to_chat(&v) {
            assert!(e.param.is_some(), "{v}: {}", e.message);
        }
        let chat = json!({"messages": [], "tools": v.get("tools").cloned().unwrap_or(Value::Null),
            "tool_choice": v.get("tool_choice").cloned().unwrap_or(Value::Null)});
        if let Err(e) = super::super::tools::tool_choice(&chat) {
            assert!(e.param.is_some(), "{chat}: {}", e.message);
        }
        if let Err(e) = super::super::fields::check(&v, g.below(2) == 0) {
            assert!(e.param.is_some(), "{v}: {}", e.message);
        }
    }
}
