//! `tool_choice` of a chat request. `auto` (or absent) lets the tool-call parser
//! (`--tool-call-parser hermes`) turn `<tool_call>` blocks into `tool_calls`; `none` leaves
//! the text as content. A *forced* call needs no parser; the answer is structured output
//! (`structured.rs`), as in vLLM:
//! - a named function (`{"type": "function", "function": {"name": …}}`): the answer is
//!   constrained to the function's `parameters` schema and is that call's `arguments`
//!   (finish_reason `stop`);
//! - `required`: the answer is a JSON array of one or more `{"name": …, "parameters": …}`,
//!   one object schema per tool (a union told apart by `name`, read first), and each element
//!   becomes a call (finish_reason `tool_calls`); streamed a call at a time, as each element
//!   closes.

use super::api::ApiError;
use super::Server;
use crate::serve_parsers::{tool_call_id, ToolCallDelta};
use porter_core::engine::sampling::JsonMode;
use serde_json::{json, Value};

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// Absent, `null` or `auto`: calls the parser finds become `tool_calls`.
    Auto,
    /// `none`: the text stays content.
    None,
    /// The answer is made of calls.
    Forced(Forced),
}

/// A forced call. `parameters`: a function's schema (`None`: any JSON object).
#[derive(Clone, Debug, PartialEq)]
pub enum Forced {
    /// A named function: the answer is its arguments.
    Named { name: String, parameters: Option<Value> },
    /// `required`: the answer is an array of calls of these tools.
    Required { tools: Vec<(String, Option<Value>)> },
}

impl Forced {
    /// The structured-output constraint of the answer; `one_call` (`parallel_tool_calls:
    /// false`): `required`'s array holds one call.
    ///
    /// # Errors
    /// A parameters schema porter cannot follow (a 400 naming the function).
    pub fn constraint(&self, s: &Server, one_call: bool) -> Result<JsonMode, ApiError> {
        let any = || json!({"type": "object"});
        let bad = |name: &str, e: String| {
            ApiError::invalid("tools", format!("the parameters of `{name}`: the schema is not supported: {e}"))
        };
        match self {
            Forced::Named { name, parameters: Some(p) } => s.json_schema(p).map_err(|e| bad(name, e)),
            Forced::Named { parameters: None, .. } => Ok(s.json_object()),
            Forced::Required { tools } => {
                let calls: Vec<Value> = tools
                    .iter()
                    .map(|(name, p)| {
                        json!({"type": "object", "properties": {"name": {"const": name},
                            "parameters": p.clone().unwrap_or_else(any)}, "required": ["name", "parameters"]})
                    })
                    .collect();
                let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
                if one_call {
                    schema["maxItems"] = json!(1);
                }
                s.json_schema_value(&schema).map_err(|e| bad(&tools[0].0, e))
            }
        }
    }

    /// The finish reason of a choice that ended with `reason`: a cut answer stays `length`.
    pub fn finish(&self, reason: &'static str) -> &'static str {
        match self {
            Forced::Required { .. } if reason != "length" => "tool_calls",
            _ => reason,
        }
    }

    /// The assistant message of a non-streamed choice `index` whose text is `text`.
    pub fn message(&self, index: usize, text: &str) -> Value {
        let calls: Vec<ToolCallDelta> = match self {
            Forced::Named { .. } => vec![self.named_delta(index, text, true)],
            Forced::Required { .. } => Calls::default().push(index, text),
        };
        let calls: Vec<Value> = calls
            .into_iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        json!({"role": "assistant", "content": "", "tool_calls": calls})
    }

    /// The streamed fragments of choice `index` for the new text `text`: a named function's
    /// arguments as they come (id and name on the `first` fragment), `required`'s calls as
    /// their elements close (`calls` keeps the scan).
    pub fn deltas(&self, index: usize, text: &str, first: bool, calls: &mut Calls) -> Vec<ToolCallDelta> {
        match self {
            Forced::Named { .. } if text.is_empty() => Vec::new(),
            Forced::Named { .. } => vec![self.named_delta(index, text, first)],
            Forced::Required { .. } => calls.push(index, text),
        }
    }

    fn named_delta(&self, index: usize, arguments: &str, first: bool) -> ToolCallDelta {
        let name = match self {
            Forced::Named { name, .. } => name.clone(),
            Forced::Required { .. } => String::new(),
        };
        ToolCallDelta {
            index: 0,
            id: first.then(|| tool_call_id(index as u64, 0)),
            name: first.then_some(name),
            arguments: arguments.to_owned(),
        }
    }
}

/// The scan of a `required` answer (`[{"name": …, "parameters": …}, …]`): each element, once
/// it closes, becomes a whole call fragment (id, name and the parameters as compact JSON).
#[derive(Debug, Default)]
pub struct Calls {
    text: String,
    /// Bytes scanned, bracket depth, inside a string, after a backslash there.
    at: usize,
    depth: u32,
    in_str: bool,
    escaped: bool,
    /// Where the open element starts, and the calls made so far.
    start: usize,
    made: usize,
}

impl Calls {
    /// The calls of the elements that `text` closes (choice `index`).
    pub fn push(&mut self, index: usize, text: &str) -> Vec<ToolCallDelta> {
        self.text.push_str(text);
        let mut out = Vec::new();
        let bytes = self.text.as_bytes();
        while self.at < bytes.len() {
            let (i, b) = (self.at, bytes[self.at]);
            self.at += 1;
            if self.in_str {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_str = true,
                b'[' | b'{' => {
                    self.depth += 1;
                    if self.depth == 2 {
                        self.start = i;
                    }
                }
                b']' | b'}' => {
                    if self.depth == 2 {
                        let call: Option<Value> = serde_json::from_slice(&bytes[self.start..=i]).ok();
                        let name = call.as_ref().and_then(|c| c.get("name")).and_then(Value::as_str);
                        if let (Some(name), Some(p)) = (name, call.as_ref().and_then(|c| c.get("parameters"))) {
                            out.push(ToolCallDelta {
                                index: self.made,
                                id: Some(tool_call_id(index as u64, self.made)),
                                name: Some(name.to_owned()),
                                arguments: p.to_string(),
                            });
                            self.made += 1;
                        }
                    }
                    self.depth = self.depth.saturating_sub(1);
                }
                _ => {}
            }
        }
        out
    }
}

/// The request's `tool_choice`, checked against its `tools`.
///
/// # Errors
/// A value that is not `auto` / `none` / `required` / a named function, a forced call
/// without `tools` or naming a function that is not among them, a tool without a name, two
/// tools of one name, parameters that are not a schema object.
pub fn tool_choice(v: &Value) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::invalid("tool_choice", m);
    let shape = |c: &Value| {
        bad(format!(
            "`tool_choice` must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": \
             {{\"name\": …}}}}, got {c}"
        ))
    };
    let listed = v.get("tools").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let mut tools: Vec<(String, Option<Value>)> = Vec::with_capacity(listed.len());
    for t in listed {
        let name = t
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid("tools", format!("a tool needs `function.name`: {t}")))?;
        if tools.iter().any(|(n, _)| n == name) {
            return Err(ApiError::invalid("tools", format!("`tools` names the function `{name}` twice")));
        }
        let parameters = match t.pointer("/function/parameters") {
            None | Some(Value::Null) => None,
            Some(p @ Value::Object(_)) => Some(p.clone()),
            Some(p) => {
                return Err(ApiError::invalid(
                    "tools",
                    format!("the parameters of `{name}` must be a JSON schema object, got {p}"),
                ))
            }
        };
        tools.push((name.to_owned(), parameters));
    }
    match v.get("tool_choice") {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(c)) if c == "auto" => Ok(ToolChoice::Auto),
        Some(Value::String(c)) if c == "none" => Ok(ToolChoice::None),
        Some(Value::String(c)) if c == "required" => {
            if tools.is_empty() {
                return Err(bad("`tool_choice` \"required\" needs `tools`".into()));
            }
            Ok(ToolChoice::Forced(Forced::Required { tools }))
        }
        Some(c @ Value::Object(_)) => {
            let name = match (c.get("type").and_then(Value::as_str), c.pointer("/function/name")) {
                (Some("function"), Some(Value::String(n))) => n.as_str(),
                _ => return Err(shape(c)),
            };
            if tools.is_empty() {
                return Err(bad(format!("`tool_choice` names the function `{name}` but there are no `tools`")));
            }
            let (_, parameters) = tools
                .into_iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| bad(format!("`tool_choice` names the function `{name}`, which is not in `tools`")))?;
            Ok(ToolChoice::Forced(Forced::Named { name: name.to_owned(), parameters }))
        }
        Some(c) => Err(shape(c)),
    }
}

#[cfg(test)]
mod tests;
