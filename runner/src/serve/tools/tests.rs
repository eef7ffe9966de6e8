use super::*;

fn tools(names: &[&str]) -> Value {
    let t: Vec<Value> = names
        .iter()
        .map(|n| json!({"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}))
        .collect();
    Value::Array(t)
}

fn choice(tc: Value, names: &[&str]) -> Result<ToolChoice, String> {
    let mut v = json!({"tool_choice": tc});
    if !names.is_empty() {
        v["tools"] = tools(names);
    }
    tool_choice(&v).map_err(|e| e.message)
}

#[test]
fn choices_and_their_refusals() {
    assert_eq!(choice(Value::Null, &[]), Ok(ToolChoice::Auto));
    assert_eq!(choice(json!("auto"), &["f"]), Ok(ToolChoice::Auto));
    assert_eq!(choice(json!("none"), &["f"]), Ok(ToolChoice::None));
    let named = choice(json!({"type": "function", "function": {"name": "g"}}), &["f", "g"]);
    let Ok(ToolChoice::Forced(f)) = named else { panic!("{named:?}") };
    assert_eq!(f, Forced::Named { name: "g".into(), parameters: Some(json!({"type": "object"})) });
    assert_eq!(f.finish("stop"), "stop");
    let Ok(ToolChoice::Forced(r)) = choice(json!("required"), &["f", "g"]) else { panic!("required") };
    assert!(matches!(&r, Forced::Required { tools } if tools.len() == 2));
    assert_eq!((r.finish("stop"), r.finish("length")), ("tool_calls", "length"));
    for (tc, names, needle) in [
        (json!("required"), &[][..], "needs `tools`"),
        (json!("required"), &["f", "f"][..], "`f` twice"),
        (json!({"type": "function", "function": {"name": "h"}}), &["f"][..], "`h`, which is not in `tools`"),
        (json!({"type": "function", "function": {"name": "h"}}), &[][..], "there are no `tools`"),
        (json!({"type": "function"}), &["f"][..], "must be"),
        (json!("any"), &["f"][..], "must be"),
        (json!(3), &["f"][..], "must be"),
    ] {
        let e = choice(tc.clone(), names).expect_err(&tc.to_string());
        assert!(e.contains(needle), "{tc}: {e}");
    }
}

#[test]
fn named_messages_and_deltas() {
    let f = Forced::Named { name: "get".into(), parameters: None };
    let m = f.message(2, "{\"a\":1}");
    assert_eq!(m["tool_calls"][0]["function"], json!({"name": "get", "arguments": "{\"a\":1}"}));
    assert_eq!(m["tool_calls"][0]["id"], json!(tool_call_id(2, 0)));
    assert_eq!(m["content"], json!(""));
    let mut calls = Calls::default();
    let d = f.deltas(2, "{", true, &mut calls);
    assert_eq!(
        (d[0].id.clone(), d[0].name.as_deref(), d[0].arguments.as_str()),
        (Some(tool_call_id(2, 0)), Some("get"), "{")
    );
    let d = f.deltas(2, "}", false, &mut calls);
    assert_eq!((d[0].id.clone(), d[0].name.clone()), (None, None));
    assert!(f.deltas(2, "", false, &mut calls).is_empty());
}

/// `required`'s answer, streamed in pieces that cut anywhere (inside strings with brackets and
/// escaped quotes too), gives each call once its element closes, the same as the whole text.
#[test]
fn required_calls_stream_as_their_elements_close() {
    let f = Forced::Required { tools: vec![("f".into(), None), ("g".into(), None)] };
    let text =
        r#" [ {"name": "f", "parameters": {"s": "a]}\"{[", "n": [1, {"x": 2}]}} , {"parameters":{},"name":"g"} ]"#;
    let whole = f.message(1, text);
    let calls = whole["tool_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["function"], json!({"name": "f", "arguments": r#"{"s":"a]}\"{[","n":[1,{"x":2}]}"#}));
    assert_eq!(calls[1]["function"], json!({"name": "g", "arguments": "{}"}));
    assert_eq!(calls[1]["id"], json!(tool_call_id(1, 1)));
    for step in [1, 2, 3, 7, 50] {
        let mut scan = Calls::default();
        let mut got = Vec::new();
        let b = text.as_bytes();
        for chunk in b.chunks(step) {
            got.extend(f.deltas(1, std::str::from_utf8(chunk).expect("ascii"), false, &mut scan));
        }
        let got: Vec<(usize, String, String)> =
            got.into_iter().map(|d| (d.index, d.name.unwrap_or_default(), d.arguments)).collect();
        let want: Vec<(usize, String, String)> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    i,
                    c["function"]["name"].as_str().unwrap_or_default().to_owned(),
                    c["function"]["arguments"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        assert_eq!(got, want, "pieces of {step}");
    }
    // Cut before the second element closes: only the first call.
    assert_eq!(f.message(0, &text[..75])["tool_calls"].as_array().map(Vec::len), Some(1));
}
