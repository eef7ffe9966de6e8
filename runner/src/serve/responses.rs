//! OpenAI's Responses API (`POST /v1/responses`, what the openai client's
//! `responses.create` and agent frameworks built on it call), as a translation over the chat
//! path: the request becomes a chat request (`input` items → messages, `instructions` → a
//! system message, function tools and `tool_choice`, `text.format` → `response_format`,
//! `max_output_tokens` → `max_tokens`), runs as one, and its result — or, streamed, its chat
//! chunks — becomes a `response` object (or the `response.*` events). Stateless: nothing is
//! stored, so `store: true`, `previous_response_id` and `background` are 400s naming them.

use super::api::ApiError;
use serde_json::{json, Map, Value};

/// Fields of a Responses request porter honours.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "store",
    "user",
    "truncation",
    "top_logprobs",
    // Not OpenAI's: the chat API's `seed`, for reproducible sampling (as vLLM accepts it).
    "seed",
];

/// What the `response` object repeats from the request.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub instructions: Value,
    pub max_output_tokens: Value,
    pub temperature: Value,
    pub top_p: Value,
    pub tools: Value,
    pub tool_choice: Value,
    pub parallel_tool_calls: Value,
    pub text: Value,
}

fn bad(k: &str, m: impl Into<String>) -> ApiError {
    ApiError::invalid(k, m)
}

/// The text of a content list of `input_text` / `output_text` / `text` parts, or a string.
fn text_of(c: &Value, at: &str) -> Result<String, ApiError> {
    match c {
        Value::String(t) => Ok(t.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => out.push_str(t),
                    (t, _) => {
                        return Err(bad(
                            "input",
                            format!("{at}: a content part of type {} is not supported (text only)", t.unwrap_or("?")),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(bad("input", format!("{at}: `content` must be a string or a list of text parts"))),
    }
}

/// The chat messages of `input` (a string, or a list of message / function_call /
/// function_call_output items) after the `instructions`' system message.
fn messages(v: &Value) -> Result<Vec<Value>, ApiError> {
    let mut msgs = Vec::new();
    match v.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(i)) => msgs.push(json!({"role": "system", "content": i})),
        Some(_) => return Err(bad("instructions", "`instructions` must be a string")),
    }
    match v.get("input") {
        Some(Value::String(t)) => msgs.push(json!({"role": "user", "content": t})),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, it) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                match it.get("type").and_then(Value::as_str).unwrap_or("message") {
                    "message" => {
                        let role = it
                            .get("role")
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad("input", format!("{at}: `role` is required")))?;
                        let content = text_of(it.get("content").unwrap_or(&Value::Null), &at)?;
                        msgs.push(json!({"role": role, "content": content}));
                    }
                    "function_call" => {
                        let (Some(id), Some(name), Some(args)) = (
                            it.get("call_id").and_then(Value::as_str),
                            it.get("name").and_then(Value::as_str),
                            it.get("arguments").and_then(Value::as_str),
                        ) else {
                            return Err(bad(
                                "input",
                                format!("{at}: a function_call needs `call_id`, `name` and `arguments`"),
                            ));
                        };
                        let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
                        // Calls of one turn go into one assistant message.
                        match msgs.last_mut() {
                            Some(m) if m["role"] == "assistant" && m.get("tool_calls").is_some() => {
                                if let Some(a) = m["tool_calls"].as_array_mut() {
                                    a.push(call);
                                }
                            }
                            _ => msgs.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                        }
                    }
                    "function_call_output" => {
                        let (Some(id), Some(out)) =
                            (it.get("call_id").and_then(Value::as_str), it.get("output").map(|o| text_of(o, &at)))
                        else {
                            return Err(bad(
                                "input",
                                format!("{at}: a function_call_output needs `call_id` and `output`"),
                            ));
                        };
                        msgs.push(json!({"role": "tool", "tool_call_id": id, "content": out?}));
                    }
                    t => return Err(bad("input", format!("{at}: items of type `{t}` are not supported"))),
                }
            }
        }
        _ => return Err(bad("input", "`input` must be a string or a non-empty list of items")),
    }
    Ok(msgs)
}

/// The chat request of a Responses request, and what its `response` repeats.
///
/// # Errors
/// An unknown or unimplemented field, or a malformed one (a 400 naming it).
pub fn to_chat(v: &Value) -> Result<(Value, Meta), ApiError> {
    let o = v.as_object().ok_or_else(|| bad("input", "the body must be a JSON object"))?;
    for (k, x) in o {
        if x.is_null() || FIELDS.contains(&k.as_str()) {
            continue;
        }
        let why = match k.as_str() {
            "previous_response_id" | "conversation" | "background" | "metadata" | "prompt" => {
                "porter stores nothing: send the whole conversation in `input`"
            }
            "reasoning" => "use a model's chat template switches through /v1/chat/completions",
            // The tokens' log-probabilities in the output text: the one inclusion porter has.
            "include" if x.as_array().is_some_and(|a| a.iter().all(|i| i == "message.output_text.logprobs")) => {
                continue
            }
            "include" => "porter can include `message.output_text.logprobs` only",
            _ => return Err(bad(k, format!("unknown field `{k}`: porter does not know it"))),
        };
        return Err(bad(k, format!("`{k}` is not supported ({why})")));
    }
    if o.get("store").is_some_and(|s| s.as_bool() != Some(false) && !s.is_null()) {
        return Err(bad("store", "`store` must be false: porter stores no responses"));
    }
    if o.get("truncation").is_some_and(|t| !t.is_null() && t != "disabled") {
        return Err(bad("truncation", "`truncation` must be \"disabled\": prompts are never truncated"));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages(v)?));
    for (from, to) in [
        ("model", "model"),
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("user", "user"),
        ("seed", "seed"),
    ] {
        if let Some(x) = o.get(from).filter(|x| !x.is_null()) {
            chat.insert(to.into(), x.clone());
        }
    }
    let include_lp = o.get("include").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    match o.get("top_logprobs") {
        None | Some(Value::Null) if include_lp => {
            chat.insert("logprobs".into(), json!(true));
        }
        None | Some(Value::Null) => {}
        Some(n) => {
            chat.insert("logprobs".into(), json!(true));
            chat.insert("top_logprobs".into(), n.clone());
        }
    }
    if o.get("stream") == Some(&json!(true)) {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    // Function tools: `{type, name, description, parameters}` → chat's `{type, function}`.
    if let Some(t) = o.get("tools").filter(|t| !t.is_null()) {
        let list = t.as_array().ok_or_else(|| bad("tools", "`tools` must be a list"))?;
        let mut tools = Vec::with_capacity(list.len());
        for (i, x) in list.iter().enumerate() {
            if x.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad("tools", format!("tools[{i}]: only `function` tools are supported")));
            }
            let mut f = Map::new();
            for k in ["name", "description", "parameters"] {
                if let Some(y) = x.get(k).filter(|y| !y.is_null()) {
                    f.insert(k.into(), y.clone());
                }
            }
            tools.push(json!({"type": "function", "function": f}));
        }
        if !tools.is_empty() {
            chat.insert("tools".into(), Value::Array(tools));
        }
    }
    match o.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(c @ Value::String(_)) => {
            chat.insert("tool_choice".into(), c.clone());
        }
        Some(c) => match (c.get("type").and_then(Value::as_str), c.get("name").and_then(Value::as_str)) {
            (Some("function"), Some(n)) => {
                chat.insert("tool_choice".into(), json!({"type": "function", "function": {"name": n}}));
            }
            _ => return Err(bad("tool_choice", format!("`tool_choice` {c} is not supported"))),
        },
    }
    // `text.format`: text, json_object, or json_schema {name, schema, strict}.
    if let Some(f) = o.get("text").and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        match f.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                chat.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let schema = f.get("schema").ok_or_else(|| bad("text", "`text.format.schema` is required"))?;
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"schema": schema}}),
                );
            }
            _ => return Err(bad("text", format!("`text.format` {f} is not supported"))),
        }
    }
    let get = |k: &str| o.get(k).cloned().unwrap_or(Value::Null);
    let meta = Meta {
        instructions: get("instructions"),
        max_output_tokens: get("max_output_tokens"),
        temperature: o.get("temperature").cloned().unwrap_or(json!(1.0)),
        top_p: o.get("top_p").cloned().unwrap_or(json!(1.0)),
        tools: o.get("tools").cloned().filter(|t| !t.is_null()).unwrap_or(json!([])),
        tool_choice: o.get("tool_choice").cloned().filter(|t| !t.is_null()).unwrap_or(json!("auto")),
        parallel_tool_calls: o.get("parallel_tool_calls").cloned().unwrap_or(json!(true)),
        text: o.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
    };
    Ok((Value::Object(chat), meta))
}

/// A chat request's error in the Responses request's terms: the fields it was translated
/// from (`max_tokens` → `max_output_tokens`, `response_format` → `text.format`, `messages` →
/// `input`), in the parameter and the message.
pub fn rename(mut e: ApiError) -> ApiError {
    const NAMES: [(&str, &str); 3] =
        [("max_tokens", "max_output_tokens"), ("response_format", "text.format"), ("messages", "input")];
    for (chat, ours) in NAMES {
        if e.param.as_deref() == Some(chat) {
            e.param = Some(ours.to_owned());
        }
        e.message = e.message.replace(&format!("`{chat}`"), &format!("`{ours}`"));
    }
    e
}

/// Responses `usage` from the chat counts `(prompt, completion, cached)`.
pub fn usage(u: (usize, usize, usize)) -> Value {
    json!({"input_tokens": u.0, "input_tokens_details": {"cached_tokens": u.2}, "output_tokens": u.1,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": u.0 + u.1})
}

/// The `response` object: `status` from the chat finish reason (`length`: incomplete).
pub fn response(id: &str, model: &str, meta: &Meta, output: Vec<Value>, finish: Option<&str>, usage: Value) -> Value {
    let (status, details) = match finish {
        None => ("in_progress", Value::Null),
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some(_) => ("completed", Value::Null),
    };
    json!({"id": id, "object": "response", "created_at": super::now(), "status": status, "error": null,
        "incomplete_details": details, "instructions": meta.instructions, "max_output_tokens": meta.max_output_tokens,
        "model": model, "output": output, "parallel_tool_calls": meta.parallel_tool_calls,
        "temperature": meta.temperature, "top_p": meta.top_p, "tool_choice": meta.tool_choice, "tools": meta.tools,
        "text": meta.text, "truncation": "disabled", "store": false, "metadata": {}, "usage": usage})
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed"})
}

fn message_item(id: &str, text: &str, status: &str, logprobs: &[Value]) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([text_part(text, logprobs)]) };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

/// An `output_text` part; `logprobs`: its tokens' (`{token, logprob, bytes, top_logprobs}`,
/// the chat API's entries; empty unless `top_logprobs` was asked for).
fn text_part(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

/// The token entries of a chat `logprobs` value (`{"content": [...]}`), or none.
fn entries(logprobs: &Value) -> &[Value] {
    logprobs.get("content").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments,
        "status": status})
}

/// The output items of a non-streamed chat choice (`message` and `logprobs` as `api::choice`
/// builds them): reasoning, the text (with its tokens' log-probabilities), then the calls.
pub fn output_of(id: &str, message: &Value, logprobs: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(r) = message.get("reasoning_content").and_then(Value::as_str) {
        out.push(reasoning_item(&format!("rs_{id}"), r));
    }
    if let Some(t) = message.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
        out.push(message_item(&format!("msg_{id}"), t, "completed", entries(logprobs)));
    }
    for (i, c) in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let f = &c["function"];
        let (name, args) = (f["name"].as_str().unwrap_or_default(), f["arguments"].as_str().unwrap_or_default());
        out.push(call_item(&format!("fc_{id}_{i}"), c["id"].as_str().unwrap_or_default(), name, args, "completed"));
    }
    out
}

/// One open output item of a stream.
#[derive(Debug)]
enum Open {
    Reasoning(String),
    /// A message: its text and its tokens' log-probabilities so far.
    Message(String, Vec<Value>),
    /// A call: its index among the chat deltas, call id, name and arguments so far.
    Call(usize, String, String, String),
}

/// The Responses events of a streamed request, translated from its chat chunks.
#[derive(Debug)]
pub struct Events {
    id: String,
    model: String,
    meta: Meta,
    seq: u64,
    open: Option<Open>,
    done: Vec<Value>,
    finish: Option<String>,
    /// Token log-probabilities that came before the text they belong with (the parsers hold
    /// text back): given to the next text delta, as the non-streamed message has them all.
    pending: Vec<Value>,
}

impl Events {
    pub fn new(id: String, model: String, meta: Meta) -> Self {
        Self { id, model, meta, seq: 0, open: None, done: Vec::new(), finish: None, pending: Vec::new() }
    }

    fn ev(&mut self, kind: &str, mut body: Value) -> (String, Value) {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        (kind.to_owned(), body)
    }

    fn snapshot(&self, finish: Option<&str>, usage: Value) -> Value {
        response(&self.id, &self.model, &self.meta, self.done.clone(), finish, usage)
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<(String, Value)> {
        let r = self.snapshot(None, Value::Null);
        vec![
            self.ev("response.created", json!({"response": r.clone()})),
            self.ev("response.in_progress", json!({"response": r})),
        ]
    }

    fn item_id(&self) -> String {
        format!("{}_{}", self.id, self.done.len())
    }

    /// Closes the open item, if any.
    fn close(&mut self) -> Vec<(String, Value)> {
        let (n, id) = (self.done.len(), self.item_id());
        let mut out = Vec::new();
        match self.open.take() {
            None => return out,
            Some(Open::Reasoning(t)) => {
                let id = format!("rs_{id}");
                out.push(self.ev(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": n, "content_index": 0, "text": t}),
                ));
                self.done.push(reasoning_item(&id, &t));
            }
            Some(Open::Message(t, mut lp)) => {
                let id = format!("msg_{id}");
                if !self.pending.is_empty() {
                    // Tokens after the last text: their log-probabilities still belong here.
                    let rest = std::mem::take(&mut self.pending);
                    lp.extend(rest.iter().cloned());
                    out.push(self.ev(
                        "response.output_text.delta",
                        json!({"item_id": id, "output_index": n, "content_index": 0, "delta": "", "logprobs": rest}),
                    ));
                }
                out.push(self.ev(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": n, "content_index": 0, "text": t, "logprobs": lp}),
                ));
                out.push(self.ev(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": n, "content_index": 0, "part": text_part(&t, &lp)}),
                ));
                self.done.push(message_item(&id, &t, "completed", &lp));
            }
            Some(Open::Call(_, call_id, name, args)) => {
                let id = format!("fc_{id}");
                out.push(self.ev(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": n, "name": name, "arguments": args}),
                ));
                self.done.push(call_item(&id, &call_id, &name, &args, "completed"));
            }
        }
        let item = self.done[n].clone();
        out.push(self.ev("response.output_item.done", json!({"output_index": n, "item": item})));
        out
    }

    /// The events of one chat chunk choice (`{"delta": …, "finish_reason": …}`).
    pub fn chunk(&mut self, c: &Value) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        let d = &c["delta"];
        let n = self.done.len();
        self.pending.extend(entries(&c["logprobs"]).iter().cloned());
        if let Some(r) = d.get("reasoning_content").and_then(Value::as_str).filter(|r| !r.is_empty()) {
            if !matches!(self.open, Some(Open::Reasoning(_))) {
                out.extend(self.close());
                let id = format!("rs_{}", self.item_id());
                let item = json!({"type": "reasoning", "id": id, "summary": [], "content": []});
                out.push(self.ev("response.output_item.added", json!({"output_index": self.done.len(), "item": item})));
                self.open = Some(Open::Reasoning(String::new()));
            }
            if let Some(Open::Reasoning(t)) = &mut self.open {
                t.push_str(r);
            }
            let id = format!("rs_{}", self.item_id());
            out.push(self.ev(
                "response.reasoning_text.delta",
                json!({"item_id": id, "output_index": self.done.len(), "content_index": 0, "delta": r}),
            ));
        }
        if let Some(t) = d.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            if !matches!(self.open, Some(Open::Message(..))) {
                out.extend(self.close());
                let id = format!("msg_{}", self.item_id());
                let n = self.done.len();
                out.push(self.ev(
                    "response.output_item.added",
                    json!({"output_index": n, "item": message_item(&id, "", "in_progress", &[])}),
                ));
                out.push(self.ev(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": n, "content_index": 0, "part": text_part("", &[])}),
                ));
                self.open = Some(Open::Message(String::new(), Vec::new()));
            }
            let lp = std::mem::take(&mut self.pending);
            if let Some(Open::Message(m, all)) = &mut self.open {
                m.push_str(t);
                all.extend(lp.iter().cloned());
            }
            let id = format!("msg_{}", self.item_id());
            out.push(self.ev(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": self.done.len(), "content_index": 0, "delta": t, "logprobs": lp}),
            ));
        }
        for call in d.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            let args = call["function"]["arguments"].as_str().unwrap_or_default();
            if !matches!(&self.open, Some(Open::Call(i, ..)) if *i == index) {
                out.extend(self.close());
                let call_id = call["id"].as_str().unwrap_or_default().to_owned();
                let name = call["function"]["name"].as_str().unwrap_or_default().to_owned();
                let id = format!("fc_{}", self.item_id());
                let item = call_item(&id, &call_id, &name, "", "in_progress");
                out.push(self.ev("response.output_item.added", json!({"output_index": self.done.len(), "item": item})));
                self.open = Some(Open::Call(index, call_id, name, String::new()));
            }
            if let Some(Open::Call(_, _, _, a)) = &mut self.open {
                a.push_str(args);
            }
            if !args.is_empty() {
                let id = format!("fc_{}", self.item_id());
                out.push(self.ev(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": self.done.len(), "delta": args}),
                ));
            }
        }
        let _ = n;
        if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
            out.extend(self.close());
            self.finish = Some(f.to_owned());
        }
        out
    }

    /// The last event: `response.completed` (or `response.incomplete` when cut by
    /// `max_output_tokens`) with the whole response and its usage.
    pub fn end(&mut self, u: (usize, usize, usize)) -> Vec<(String, Value)> {
        let mut out = self.close();
        let finish = self.finish.clone().unwrap_or_else(|| "stop".into());
        let r = self.snapshot(Some(&finish), usage(u));
        let kind = if finish == "length" { "response.incomplete" } else { "response.completed" };
        out.push(self.ev(kind, json!({"response": r})));
        out
    }

    /// An error after the stream began (`error` event).
    pub fn error(&mut self, message: &str) -> Vec<(String, Value)> {
        vec![self.ev("error", json!({"code": "server_error", "message": message, "param": null}))]
    }
}

#[cfg(test)]
mod tests;
