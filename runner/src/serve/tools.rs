//! `tool_choice` of a chat request. `auto` (or absent) lets the tool-call parser
//! (`--tool-call-parser hermes`) turn `<tool_call>` blocks into `tool_calls`; `none` leaves
//! the text as content. A *forced* call — a named function (`{"type": "function",
//! "function": {"name": …}}`), or `required` when there is one tool — constrains the whole
//! answer to that function's `parameters` schema (structured output, `structured.rs`) and
//! returns it as the call's `arguments`, as vLLM does; no parser is needed for it.
//!
//! `required` with several tools would need one schema per name told apart after the name
//! is written (a union of objects the JSON-schema engine cannot branch on by first byte):
//! refused with a 400 that says to name the function.

use super::api::ApiError;
use crate::serve_parsers::{tool_call_id, ToolCallDelta};
use serde_json::{json, Value};

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// Absent, `null` or `auto`: calls the parser finds become `tool_calls`.
    Auto,
    /// `none`: the text stays content.
    None,
    /// The answer is the arguments of one call.
    Forced(Forced),
}

/// A forced call: its function and how the choice ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Forced {
    pub name: String,
    /// The function's `parameters` schema (`None`: any JSON object).
    pub parameters: Option<Value>,
    /// `required` (finish_reason `tool_calls`) rather than a named function (`stop`, as
    /// vLLM reports it).
    pub required: bool,
}

impl Forced {
    /// The finish reason of a choice that ended with `reason`: a cut answer stays `length`.
    pub fn finish(&self, reason: &'static str) -> &'static str {
        if self.required && reason != "length" {
            "tool_calls"
        } else {
            reason
        }
    }

    /// The assistant message of a non-streamed choice `index` whose text is `arguments`.
    pub fn message(&self, index: usize, arguments: &str) -> Value {
        json!({"role": "assistant", "content": "", "tool_calls": [{
            "id": tool_call_id(index as u64, 0),
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }]})
    }

    /// The streamed fragment of choice `index` carrying `arguments` (the id and the name on
    /// the `first` one).
    pub fn delta(&self, index: usize, arguments: &str, first: bool) -> ToolCallDelta {
        ToolCallDelta {
            index: 0,
            id: first.then(|| tool_call_id(index as u64, 0)),
            name: first.then(|| self.name.clone()),
            arguments: arguments.to_owned(),
        }
    }
}

/// The request's `tool_choice`, checked against its `tools`.
///
/// # Errors
/// A value that is not `auto` / `none` / `required` / a named function, a forced call
/// without `tools` or naming a function that is not among them, `required` with several
/// tools.
pub fn tool_choice(v: &Value) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::invalid("tool_choice", m);
    let tools: &[Value] = v.get("tools").and_then(Value::as_array).map_or(&[], Vec::as_slice);
    let function = |name: &str| -> Result<Option<Value>, ApiError> {
        let t = tools
            .iter()
            .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
            .ok_or_else(|| bad(format!("`tool_choice` names the function `{name}`, which is not in `tools`")))?;
        match t.pointer("/function/parameters") {
            None | Some(Value::Null) => Ok(None),
            Some(p @ Value::Object(_)) => Ok(Some(p.clone())),
            Some(p) => Err(ApiError::invalid(
                "tools",
                format!("the parameters of `{name}` must be a JSON schema object, got {p}"),
            )),
        }
    };
    match v.get("tool_choice") {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(c)) if c == "auto" => Ok(ToolChoice::Auto),
        Some(Value::String(c)) if c == "none" => Ok(ToolChoice::None),
        Some(Value::String(c)) if c == "required" => match tools {
            [] => Err(bad("`tool_choice` \"required\" needs `tools`".into())),
            [t] => {
                let name = t
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid("tools", "a tool needs `function.name`"))?;
                Ok(ToolChoice::Forced(Forced { name: name.to_owned(), parameters: function(name)?, required: true }))
            }
            many => Err(bad(format!(
                "`tool_choice` \"required\" with {} tools is not supported: porter constrains the answer to one \
                 function's parameters; name it with {{\"type\": \"function\", \"function\": {{\"name\": …}}}}",
                many.len()
            ))),
        },
        Some(c @ Value::Object(_)) => {
            let name = match (c.get("type").and_then(Value::as_str), c.pointer("/function/name")) {
                (Some("function"), Some(Value::String(n))) => n.as_str(),
                _ => {
                    return Err(bad(format!(
                        "`tool_choice` must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \
                         \"function\": {{\"name\": …}}}}, got {c}"
                    )))
                }
            };
            if tools.is_empty() {
                return Err(bad(format!("`tool_choice` names the function `{name}` but there are no `tools`")));
            }
            Ok(ToolChoice::Forced(Forced { name: name.to_owned(), parameters: function(name)?, required: false }))
        }
        Some(c) => Err(bad(format!(
            "`tool_choice` must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": \
             {{\"name\": …}}}}, got {c}"
        ))),
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!((f.name.as_str(), f.required, f.finish("stop")), ("g", false, "stop"));
        assert_eq!(f.parameters, Some(json!({"type": "object"})));
        let Ok(ToolChoice::Forced(r)) = choice(json!("required"), &["f"]) else { panic!("required") };
        assert_eq!((r.required, r.finish("stop"), r.finish("length")), (true, "tool_calls", "length"));
        for (tc, names, needle) in [
            (json!("required"), &[][..], "needs `tools`"),
            (json!("required"), &["f", "g"][..], "with 2 tools is not supported"),
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
    fn forced_messages_and_deltas() {
        let f = Forced { name: "get".into(), parameters: None, required: false };
        let m = f.message(2, "{\"a\":1}");
        assert_eq!(m["tool_calls"][0]["function"], json!({"name": "get", "arguments": "{\"a\":1}"}));
        assert_eq!(m["tool_calls"][0]["id"], json!(tool_call_id(2, 0)));
        assert_eq!(m["content"], json!(""));
        let d = f.delta(2, "{", true);
        assert_eq!((d.id, d.name.as_deref(), d.arguments.as_str()), (Some(tool_call_id(2, 0)), Some("get"), "{"));
        let d = f.delta(2, "}", false);
        assert_eq!((d.id, d.name), (None, None));
    }
}
