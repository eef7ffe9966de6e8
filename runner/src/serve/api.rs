//! OpenAI request validation and response shapes.

use super::logprobs::completion_logprobs;
pub(super) use super::logprobs::{chat_logprobs, vllm_prompt_logprobs};
use super::{Output, Server};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use porter_core::engine::sampling::JsonMode;
use porter_core::engine::{SamplingParams, StopParams, TokenOut};
use serde_json::{json, Map, Value};

/// Largest request body accepted.
pub const MAX_BODY: usize = 8 << 20;

/// What went wrong, by HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Invalid,
    NotFound,
    Auth,
    TooMany,
    Unavailable,
    Media,
    TooLarge,
    Server,
}

/// An OpenAI error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub kind: Kind,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(kind: Kind, message: impl Into<String>, param: Option<&str>) -> Self {
        Self { kind, message: message.into(), param: param.map(str::to_owned) }
    }

    pub(super) fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(Kind::Invalid, message, Some(param))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, ty) = match self.kind {
            Kind::Invalid => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            Kind::NotFound => (StatusCode::NOT_FOUND, "not_found_error"),
            Kind::Auth => (StatusCode::UNAUTHORIZED, "authentication_error"),
            Kind::TooMany => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            Kind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable"),
            Kind::Media => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request_error"),
            Kind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error"),
            Kind::Server => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        let body =
            json!({"error": {"message": self.message, "type": ty, "param": self.param, "code": status.as_u16()}});
        (status, axum::Json(body)).into_response()
    }
}

/// A validated request.
pub struct Plan {
    /// Token ids of each prompt (one for chat).
    pub prompts: Vec<Vec<u32>>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// vLLM's `stream_options.continuous_usage_stats`.
    pub continuous_usage: bool,
    pub params: SamplingParams,
    pub stop_strings: Vec<String>,
    /// Top alternatives per token when log-probabilities were asked for.
    pub logprobs: Option<usize>,
    pub echo: bool,
    /// vLLM's `return_token_ids`: every choice (and every streamed token, even one that
    /// adds no text yet) carries its `token_ids`, the response its `prompt_token_ids`.
    pub return_token_ids: bool,
    /// The chat template opened a `<think>` block in the prompt (the output starts inside it).
    pub think_open: bool,
    /// vLLM's `include_stop_str_in_output`: a matched stop string stays at the end of the text.
    pub include_stop: bool,
    /// `<tool_call>` blocks become `tool_calls` (`--tool-call-parser` given, a chat request,
    /// `tool_choice` not `none`).
    pub parse_tools: bool,
    /// OpenAI `parallel_tool_calls: false`: at most one call (the first).
    pub one_call: bool,
    /// vLLM's `request_id`: the response id is `cmpl-` / `chatcmpl-` and it.
    pub request_id: Option<String>,
    /// vLLM's `prompt_logprobs` (top-N): the prompt tokens' log-probabilities in its format.
    pub prompt_logprobs: Option<usize>,
    /// A forced call (`tool_choice` naming a function, or `required` with one tool): the
    /// answer, constrained to its parameters, is that call's `arguments`.
    pub forced_tool: Option<super::tools::Forced>,
}

impl Plan {
    /// The reasoning parser's mode for this request.
    pub fn think_mode(&self) -> crate::serve_parsers::ThinkMode {
        if self.think_open {
            crate::serve_parsers::ThinkMode::Open
        } else {
            crate::serve_parsers::ThinkMode::Detect
        }
    }
}

/// The body as JSON, after the content-type and size checks.
pub fn parse_json(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    if let Some(ct) = headers.get("content-type").and_then(|v| v.to_str().ok()) {
        if !ct.to_ascii_lowercase().starts_with("application/json") {
            return Err(ApiError::new(Kind::Media, format!("content-type must be application/json, got `{ct}`"), None));
        }
    }
    if body.len() > MAX_BODY {
        return Err(ApiError::new(Kind::TooLarge, format!("the body exceeds {MAX_BODY} bytes"), None));
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::new(Kind::Invalid, format!("the body is not UTF-8: {e}"), None))?;
    let v: Value =
        serde_json::from_str(text).map_err(|e| ApiError::new(Kind::Invalid, format!("malformed JSON: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::new(Kind::Invalid, "the body must be a JSON object", None));
    }
    Ok(v)
}

/// Field `key` of `v` when given (absent and `null` alike mean not given).
fn given<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn num(v: &Value, key: &str) -> Result<Option<f64>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(Some).ok_or_else(|| ApiError::invalid(key, format!("`{key}` must be a number"))),
    }
}

fn int(v: &Value, key: &str) -> Result<Option<i64>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_i64().map(Some).ok_or_else(|| ApiError::invalid(key, format!("`{key}` must be an integer"))),
    }
}

fn boolean(v: &Value, key: &str) -> Result<Option<bool>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_bool().map(Some).ok_or_else(|| ApiError::invalid(key, format!("`{key}` must be a boolean"))),
    }
}

fn in_range(key: &str, x: f64, lo: f64, hi: f64, lo_open: bool, what: &str) -> Result<(), ApiError> {
    let ok = x.is_finite() && (if lo_open { x > lo } else { x >= lo }) && x <= hi;
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(key, format!("`{key}` must be in {what}, got {x}")))
    }
}

/// A list of token ids (`None` when absent).
pub fn token_ids(v: Option<&Value>, key: &str, vocab: usize) -> Result<Option<Vec<u32>>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    let arr = v.as_array().ok_or_else(|| ApiError::invalid(key, format!("`{key}` must be a list of token ids")))?;
    arr.iter()
        .map(|x| match x.as_u64() {
            Some(i) if (i as usize) < vocab => Ok(i as u32),
            _ => Err(ApiError::invalid(key, format!("`{key}` holds {x}, not a token id in 0..{vocab}"))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Token ids of a text; `special`: with the tokenizer's special tokens (its post-processor's
/// BOS, for instance), as vLLM's `add_special_tokens` (on for a completions prompt, off for a
/// rendered chat, whose template carries its own).
pub fn encode(s: &Server, text: &str, special: bool) -> Result<Vec<u32>, ApiError> {
    let enc = s.tok.encode(text, special).map_err(|e| ApiError::new(Kind::Server, format!("tokenizing: {e}"), None))?;
    Ok(enc.get_ids().to_vec())
}

/// The chat prompt rendered with the chat template.
pub fn render_chat(s: &Server, body: &Value, messages: &Value) -> Result<String, ApiError> {
    let list = messages.as_array().ok_or_else(|| ApiError::invalid("messages", "`messages` must be a list"))?;
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` must not be empty"));
    }
    let mut msgs = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid("messages", format!("messages[{i}].role must be a string")))?;
        if !["system", "user", "assistant", "tool", "developer"].contains(&role) {
            return Err(ApiError::invalid("messages", format!("messages[{i}].role `{role}` is not a known role")));
        }
        let mut out = m.clone();
        // Content parts [{"type": "text", "text": ...}] become one string.
        match m.get("content") {
            Some(Value::String(_)) | Some(Value::Null) | None => {}
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                "messages",
                                format!("messages[{i}].content: only text parts are supported"),
                            ))
                        }
                    }
                }
                out["content"] = Value::String(text);
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("messages[{i}].content must be a string or a list of parts"),
                ))
            }
        }
        msgs.push(out);
    }
    let mut extra = Map::new();
    if let Some(t) = given(body, "tools") {
        match t.as_array() {
            Some(a) if !a.is_empty() => {
                extra.insert("tools".into(), t.clone());
            }
            _ => return Err(ApiError::invalid("tools", "`tools` must be a non-empty list (leave it out for none)")),
        }
    }
    match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => extra.extend(o.clone()),
        Some(_) => return Err(ApiError::invalid("chat_template_kwargs", "`chat_template_kwargs` must be an object")),
    }
    let add_gen = boolean(body, "add_generation_prompt")?.unwrap_or(true);
    // vLLM's `continue_final_message`: the output continues the last (assistant) message —
    // the rendering cut right after its content, as transformers' apply_chat_template does.
    let cont = boolean(body, "continue_final_message")?.unwrap_or(false);
    let last = msgs.last().cloned().unwrap_or_default();
    if cont {
        if add_gen {
            return Err(ApiError::invalid(
                "continue_final_message",
                "`continue_final_message` needs `add_generation_prompt: false` (as in vLLM)",
            ));
        }
        if last["role"] != "assistant" {
            return Err(ApiError::invalid("continue_final_message", "the last message must be the assistant's"));
        }
    }
    let text = crate::chat::render_messages(&s.dir, s.chat_template.as_deref(), &Value::Array(msgs), add_gen, &extra)
        .map_err(|e| ApiError::invalid("messages", format!("{e:#}")))?;
    if !cont {
        return Ok(text);
    }
    let content = last["content"].as_str().unwrap_or_default().trim();
    match text.rfind(content).filter(|_| !content.is_empty()) {
        Some(at) => Ok(text[..at + content.len()].to_owned()),
        None => Err(ApiError::invalid(
            "continue_final_message",
            "the chat template does not render the final message's content as it is",
        )),
    }
}

/// Validates a completions / chat request into a [`Plan`].
pub fn plan(s: &Server, headers: &HeaderMap, body: &[u8], is_chat: bool) -> Result<Plan, ApiError> {
    let v = parse_json(headers, body)?;
    super::fields::check(&v, is_chat)?;
    let tool_choice = if is_chat { super::tools::tool_choice(&v)? } else { super::tools::ToolChoice::Auto };
    let one_call = is_chat && !boolean(&v, "parallel_tool_calls")?.unwrap_or(true);
    let mut json = structured(s, &v)?;
    let tool_auto = is_chat && tool_choice == super::tools::ToolChoice::Auto;
    let request_id = match given(&v, "request_id") {
        None => None,
        Some(Value::String(r)) if !r.is_empty() && r.len() <= 128 && r.bytes().all(|b| b.is_ascii_graphic()) => {
            Some(r.clone())
        }
        Some(r) => {
            return Err(ApiError::invalid(
                "request_id",
                format!("`request_id` must be 1 to 128 printable ASCII characters without spaces, got {r}"),
            ))
        }
    };
    let forced_tool = match tool_choice {
        super::tools::ToolChoice::Forced(f) => {
            if json.is_some() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "a `tool_choice` that forces a call constrains the answer to the tools' parameters: it \
                     cannot be combined with `response_format`, `guided_json` or `guided_choice`",
                ));
            }
            json = Some(f.constraint(s, one_call)?);
            Some(f)
        }
        _ => None,
    };
    if tool_auto && !s.tool_calls && given(&v, "tools").is_some() {
        // As vLLM: tools the answer could call need a parser to turn the calls into `tool_calls`.
        return Err(ApiError::invalid(
            "tools",
            "`tools` with `tool_choice` auto need the server started with `--tool-call-parser hermes` \
             (or send `tool_choice: \"none\"` to leave calls in the text)",
        ));
    }
    let parse_tools = tool_auto && s.tool_calls;
    if let Some(m) = given(&v, "model") {
        let m = m.as_str().ok_or_else(|| ApiError::invalid("model", "`model` must be a string"))?;
        if m != s.name && !s.aliases.iter().any(|a| a == m) {
            return Err(ApiError::new(
                Kind::NotFound,
                format!("the model `{m}` does not exist (serving `{}`)", s.name),
                Some("model"),
            ));
        }
    }
    let mut think_open = false;
    let special = boolean(&v, "add_special_tokens")?.unwrap_or(!is_chat);
    let prompts: Vec<Vec<u32>> = if is_chat {
        let m = v.get("messages").ok_or_else(|| ApiError::invalid("messages", "`messages` is required"))?;
        let text = render_chat(s, &v, m)?;
        think_open = text.trim_end().ends_with("<think>");
        vec![encode(s, &text, special)?]
    } else {
        match v.get("prompt") {
            Some(Value::String(p)) => vec![encode(s, p, special)?],
            Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => {
                a.iter().map(|p| encode(s, p.as_str().unwrap_or_default(), special)).collect::<Result<_, _>>()?
            }
            Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_array) => a
                .iter()
                .map(|p| token_ids(Some(p), "prompt", s.vocab).map(Option::unwrap_or_default))
                .collect::<Result<_, _>>()?,
            Some(a @ Value::Array(_)) => vec![token_ids(Some(a), "prompt", s.vocab)?.unwrap_or_default()],
            _ => return Err(ApiError::invalid("prompt", "`prompt` must be a string, a list of strings or token ids")),
        }
    };
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid(if is_chat { "messages" } else { "prompt" }, "the prompt is empty"));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest >= s.ctx {
        return Err(ApiError::invalid(
            if is_chat { "messages" } else { "prompt" },
            format!("the prompt has {longest} tokens; the context is {} (max_model_len)", s.ctx),
        ));
    }
    let max_tokens = match (int(&v, "max_completion_tokens")?, int(&v, "max_tokens")?) {
        (Some(a), _) | (None, Some(a)) => {
            if a < 1 {
                return Err(ApiError::invalid("max_tokens", format!("`max_tokens` must be >= 1, got {a}")));
            }
            a as usize
        }
        (None, None) => {
            if is_chat {
                s.ctx - longest
            } else {
                16
            }
        }
    };
    if longest + max_tokens > s.ctx {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "the prompt ({longest} tokens) plus max_tokens = {max_tokens} exceed the context of {} tokens",
                s.ctx
            ),
        ));
    }
    let d = &s.defaults;
    let temperature = num(&v, "temperature")?.or(d.temperature.map(f64::from)).unwrap_or(1.0);
    in_range("temperature", temperature, 0.0, 2.0, false, "[0, 2]")?;
    let top_p = num(&v, "top_p")?.or(d.top_p.map(f64::from)).unwrap_or(1.0);
    in_range("top_p", top_p, 0.0, 1.0, true, "(0, 1]")?;
    let top_k = match int(&v, "top_k")? {
        Some(k) if k == -1 || k == 0 => None,
        Some(k) if k >= 1 => Some(k as usize),
        Some(k) => return Err(ApiError::invalid("top_k", format!("`top_k` must be -1 or 0 (off) or >= 1, got {k}"))),
        None => d.top_k.filter(|&k| k > 0),
    };
    let min_p = num(&v, "min_p")?.unwrap_or(0.0);
    in_range("min_p", min_p, 0.0, 1.0, false, "[0, 1]")?;
    let presence = num(&v, "presence_penalty")?.unwrap_or(0.0);
    in_range("presence_penalty", presence, -2.0, 2.0, false, "[-2, 2]")?;
    let frequency = num(&v, "frequency_penalty")?.unwrap_or(0.0);
    in_range("frequency_penalty", frequency, -2.0, 2.0, false, "[-2, 2]")?;
    let repetition = num(&v, "repetition_penalty")?.unwrap_or(1.0);
    in_range("repetition_penalty", repetition, 0.0, 2.0, true, "(0, 2]")?;
    let seed = int(&v, "seed")?.map(|x| x as u64);
    let logit_bias = logit_bias(&v, s.vocab)?;
    let n = match int(&v, "n")? {
        Some(n) if (1..=16).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::invalid("n", format!("`n` must be in 1..=16, got {n}"))),
        None => 1,
    };
    if n > 1 && temperature == 0.0 {
        return Err(ApiError::invalid("n", "`n` > 1 needs temperature > 0 (greedy choices would all be equal)"));
    }
    if let Some(b) = int(&v, "best_of")?.filter(|&b| b as usize != n) {
        return Err(ApiError::invalid(
            "best_of",
            format!("`best_of` = {b} is not supported (only equal to `n`, {n}): porter returns every sampled choice"),
        ));
    }
    let stop_strings: Vec<String> = match v.get("stop") {
        None | Some(Value::Null) => vec![],
        Some(Value::String(x)) => vec![x.clone()],
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect()
        }
        Some(_) => return Err(ApiError::invalid("stop", "`stop` must be a string or a list of strings")),
    };
    if stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "`stop` strings must not be empty"));
    }
    if stop_strings.len() > 16 {
        return Err(ApiError::invalid("stop", "at most 16 `stop` strings"));
    }
    let stop_token_ids = token_ids(v.get("stop_token_ids"), "stop_token_ids", s.vocab)?.unwrap_or_default();
    let logprobs = if is_chat {
        let on = boolean(&v, "logprobs")?.unwrap_or(false);
        let top = int(&v, "top_logprobs")?;
        match (on, top) {
            (false, Some(_)) => return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
            (true, Some(t)) if !(0..=20).contains(&t) => {
                return Err(ApiError::invalid("top_logprobs", format!("`top_logprobs` must be in 0..=20, got {t}")))
            }
            (true, t) => Some(t.unwrap_or(0) as usize),
            (false, None) => None,
        }
    } else {
        match int(&v, "logprobs")? {
            Some(t) if (0..=20).contains(&t) => Some(t as usize),
            Some(t) => return Err(ApiError::invalid("logprobs", format!("`logprobs` must be in 0..=20, got {t}"))),
            None => None,
        }
    };
    let stream = boolean(&v, "stream")?.unwrap_or(false);
    // `include_usage` (OpenAI: a last chunk with the usage) and vLLM's
    // `continuous_usage_stats` (every chunk with its choice's usage so far).
    let (include_usage, continuous_usage) = match v.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(_) if !stream => {
            return Err(ApiError::invalid("stream_options", "`stream_options` is only allowed with `stream: true`"))
        }
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "include_usage" | "continuous_usage_stats")) {
                return Err(ApiError::invalid("stream_options", format!("unknown field `stream_options.{k}`")));
            }
            let flag = |k: &str| match o.get(k) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(ApiError::invalid("stream_options", format!("`stream_options.{k}` must be a boolean"))),
            };
            (flag("include_usage")?, flag("continuous_usage_stats")?)
        }
        Some(_) => return Err(ApiError::invalid("stream_options", "`stream_options` must be an object")),
    };
    let echo = !is_chat && boolean(&v, "echo")?.unwrap_or(false);
    if echo && stream {
        return Err(ApiError::invalid("echo", "`echo` is not supported with `stream`"));
    }
    let min_tokens = int(&v, "min_tokens")?.unwrap_or(0);
    if min_tokens < 0 || min_tokens as usize > max_tokens {
        return Err(ApiError::invalid("min_tokens", format!("`min_tokens` must be in 0..=max_tokens ({max_tokens})")));
    }
    let ignore_eos = boolean(&v, "ignore_eos")?.unwrap_or(false);
    let include_stop = boolean(&v, "include_stop_str_in_output")?.unwrap_or(false);
    let return_token_ids = boolean(&v, "return_token_ids")?.unwrap_or(false);
    // vLLM's `cache_salt`: the prefix cache's hash chain starts from the salt's hash (FNV-1a).
    let cache_salt = match given(&v, "cache_salt") {
        None => None,
        Some(Value::String(t)) if !t.is_empty() => {
            Some(t.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)))
        }
        Some(x) => {
            return Err(ApiError::invalid("cache_salt", format!("`cache_salt` must be a non-empty string, got {x}")))
        }
    };
    let vllm_prompt_lp = match int(&v, "prompt_logprobs")? {
        None => None,
        Some(_) if stream => {
            return Err(ApiError::invalid("prompt_logprobs", "`prompt_logprobs` is not supported with `stream`"))
        }
        Some(n) if (0..=20).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::invalid("prompt_logprobs", format!("`prompt_logprobs` must be in 0..=20, got {n}")))
        }
    };
    let priority = int(&v, "priority")?.unwrap_or(0);
    if priority != 0 && !s.priority {
        return Err(ApiError::invalid(
            "priority",
            format!("`priority` = {priority} needs the server started with --scheduling-policy priority (it serves first come, first served)"),
        ));
    }
    let params = SamplingParams {
        temperature: temperature as f32,
        top_k,
        top_p: if top_p < 1.0 { Some(top_p as f32) } else { None },
        min_p: if min_p > 0.0 { Some(min_p as f32) } else { None },
        repetition_penalty: repetition as f32,
        presence_penalty: presence as f32,
        frequency_penalty: frequency as f32,
        logit_bias,
        json,
        seed,
        logprobs: logprobs.map(|t| t.max(1)),
        stop: StopParams { max_tokens: Some(max_tokens), min_tokens: min_tokens as usize, ignore_eos, stop_token_ids },
        cache_salt,
        // OpenAI's `echo` with `logprobs`, and vLLM's `prompt_logprobs`: the prompt's tokens
        // are scored too.
        prompt_logprobs: if echo { logprobs.max(vllm_prompt_lp) } else { vllm_prompt_lp },
        priority,
    };
    params.validate().map_err(|e| ApiError::new(Kind::Invalid, e.to_string(), None))?;
    Ok(Plan {
        prompts,
        n,
        stream,
        include_usage,
        continuous_usage,
        params,
        stop_strings,
        logprobs,
        echo,
        return_token_ids,
        think_open,
        include_stop,
        parse_tools,
        forced_tool,
        one_call,
        request_id,
        prompt_logprobs: vllm_prompt_lp,
    })
}

/// The structured-output constraint of a request: OpenAI `response_format` (`text`,
/// `json_object`, `json_schema` with its `schema`), vLLM's `guided_json` (a schema, or its
/// JSON text) or `guided_choice` (a list of texts). A schema porter cannot follow is a 400 naming what it does not support.
fn structured(s: &Server, v: &Value) -> Result<Option<JsonMode>, ApiError> {
    let (rf, guided, choice) = (given(v, "response_format"), given(v, "guided_json"), given(v, "guided_choice"));
    if [rf.is_some(), guided.is_some(), choice.is_some()].iter().filter(|&&x| x).count() > 1 {
        let k = if choice.is_some() { "guided_choice" } else { "guided_json" };
        return Err(ApiError::invalid(k, "send one of `response_format`, `guided_json`, `guided_choice`"));
    }
    let bad = |k: &str, m: String| ApiError::invalid(k, m);
    if let Some(c) = choice {
        let list: Option<Vec<String>> =
            c.as_array().and_then(|a| a.iter().map(|x| x.as_str().map(str::to_owned)).collect());
        let list = list.ok_or_else(|| bad("guided_choice", "`guided_choice` must be a list of strings".into()))?;
        return s.json_choice(&list).map(Some).map_err(|e| bad("guided_choice", format!("`guided_choice`: {e}")));
    }
    let schema = |k: &str, x: &Value| -> Result<Option<JsonMode>, ApiError> {
        s.json_schema(x).map(Some).map_err(|e| bad(k, format!("`{k}`: the schema is not supported: {e}")))
    };
    if let Some(g) = guided {
        return match g {
            Value::String(t) => {
                let x: Value =
                    serde_json::from_str(t).map_err(|e| bad("guided_json", format!("`guided_json`: {e}")))?;
                schema("guided_json", &x)
            }
            x => schema("guided_json", x),
        };
    }
    let Some(r) = rf else { return Ok(None) };
    match r.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(s.json_object())),
        Some("json_schema") => match r.get("json_schema").and_then(|j| j.get("schema")) {
            Some(x) => schema("response_format", x),
            None => Err(bad("response_format", "`response_format.json_schema.schema` is required".into())),
        },
        _ => Err(bad(
            "response_format",
            format!("`response_format` must be {{\"type\": \"text\" | \"json_object\" | \"json_schema\"}}, got {r}"),
        )),
    }
}

/// OpenAI `logit_bias`: an object from token ids (decimal strings) to biases in [−100, 100],
/// as `(id, bias)` sorted by id.
fn logit_bias(v: &Value, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid("logit_bias", m);
    let o = match v.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("`logit_bias` must be an object mapping token ids to biases".into())),
    };
    let mut out = Vec::with_capacity(o.len());
    for (k, x) in o {
        let id = k.trim().parse::<u32>().ok().filter(|&id| (id as usize) < vocab).ok_or_else(|| {
            bad(format!("`logit_bias` key `{k}` is not a token id below the vocabulary size {vocab}"))
        })?;
        let b = x
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| bad(format!("`logit_bias` of token {id} must be a number in [-100, 100], got {x}")))?;
        out.push((id, b as f32));
    }
    out.sort_by_key(|e| e.0);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(format!("`logit_bias` names token {} twice", w[0].0)));
    }
    Ok(out)
}

/// OpenAI `usage`.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// One non-streamed choice.
pub fn choice(s: &Server, plan: &Plan, index: usize, out: &Output, is_chat: bool) -> Value {
    let prompt = out.prompt.as_deref().map(|lp| (&plan.prompts[index / plan.n][..], lp));
    let lp = plan.logprobs.map(|top| {
        if is_chat {
            chat_logprobs(s, &out.tokens, top)
        } else {
            completion_logprobs(s, prompt, &out.tokens, top)
        }
    });
    if is_chat {
        if let Some(f) = &plan.forced_tool {
            let mut c = json!({"index": index, "message": f.message(index, &out.text), "logprobs": lp,
                "finish_reason": f.finish(out.reason)});
            with_token_ids(plan, index, out, &mut c);
            return c;
        }
        let mut reason = out.reason;
        let (reasoning, content) = if s.reasoning {
            crate::serve_parsers::ReasoningParser::new(plan.think_mode()).parse(&out.text)
        } else {
            (None, out.text.clone())
        };
        let mut message = json!({"role": "assistant", "content": content});
        if let Some(r) = reasoning {
            message["reasoning_content"] = json!(r);
            message["reasoning"] = json!(r);
        }
        if plan.parse_tools {
            let mut parsed = crate::serve_parsers::ToolParser::new(index as u64).parse(&content);
            if plan.one_call {
                parsed.calls.truncate(1);
            }
            if !parsed.calls.is_empty() {
                message["content"] = json!(parsed.content);
                message["tool_calls"] = Value::Array(
                    parsed
                        .calls
                        .iter()
                        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                        .collect(),
                );
                reason = "tool_calls";
            }
        }
        let mut c = json!({"index": index, "message": message, "logprobs": lp, "finish_reason": reason});
        with_token_ids(plan, index, out, &mut c);
        c
    } else {
        let text = if plan.echo {
            let p = &plan.prompts[index / plan.n];
            format!("{}{}", s.tok.decode(p, false).unwrap_or_default(), out.text)
        } else {
            out.text.clone()
        };
        let mut c = json!({"index": index, "text": text, "logprobs": lp, "finish_reason": out.reason});
        if let (Some(n), Some(p)) = (plan.prompt_logprobs, out.prompt.as_deref()) {
            c["prompt_logprobs"] = vllm_prompt_logprobs(s, &plan.prompts[index / plan.n], p, n);
        }
        with_token_ids(plan, index, out, &mut c);
        c
    }
}

/// `token_ids` and `prompt_token_ids` of a choice when the request set `return_token_ids`.
fn with_token_ids(plan: &Plan, index: usize, out: &Output, c: &mut Value) {
    if plan.return_token_ids {
        c["token_ids"] = json!(out.tokens.iter().map(|t| t.id).collect::<Vec<_>>());
        c["prompt_token_ids"] = json!(plan.prompts[index / plan.n]);
    }
}

/// One streamed delta of choice `index`.
pub fn delta(s: &Server, plan: &Plan, index: usize, text: &str, toks: &[TokenOut], is_chat: bool) -> Value {
    let lp =
        plan.logprobs
            .map(|top| if is_chat { chat_logprobs(s, toks, top) } else { completion_logprobs(s, None, toks, top) });
    let mut c = if is_chat {
        json!({"index": index, "delta": {"content": text}, "logprobs": lp, "finish_reason": null})
    } else {
        json!({"index": index, "text": text, "logprobs": lp, "finish_reason": null})
    };
    if plan.return_token_ids {
        c["token_ids"] = json!(toks.iter().map(|t| t.id).collect::<Vec<_>>());
    }
    c
}

/// A streamed chat delta after the reasoning / tool-call parsers, with the log-probabilities
/// of the tokens it came from (`Value::Null`: none asked for).
pub fn parsed_delta(
    index: usize,
    reasoning: &str,
    content: &str,
    calls: &[crate::serve_parsers::ToolCallDelta],
    logprobs: Value,
) -> Value {
    let mut delta = Map::new();
    if !reasoning.is_empty() {
        delta.insert("reasoning_content".into(), json!(reasoning));
        delta.insert("reasoning".into(), json!(reasoning));
    }
    if !content.is_empty() {
        delta.insert("content".into(), json!(content));
    }
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let mut f = Map::new();
                if let Some(n) = &c.name {
                    f.insert("name".into(), json!(n));
                }
                f.insert("arguments".into(), json!(c.arguments));
                let mut v = json!({"index": c.index, "type": "function", "function": Value::Object(f)});
                if let Some(id) = &c.id {
                    v["id"] = json!(id);
                }
                v
            })
            .collect();
        delta.insert("tool_calls".into(), Value::Array(calls));
    }
    json!({"index": index, "delta": Value::Object(delta), "logprobs": logprobs, "finish_reason": null})
}
