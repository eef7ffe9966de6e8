//! The top-level fields of `/v1/completions` and `/v1/chat/completions`. Each is one porter
//! honours, one it accepts only with the value that means "off" (the default of the server
//! that defines it), or a 400 naming it. OpenAI refuses unknown arguments; vLLM logs and
//! drops them, which hides a misspelling (`max_token`) or a feature the server lacks behind a
//! normal-looking answer. A field sent as `null` counts as absent.

use super::api::ApiError;
use serde_json::{json, Value};

/// Honoured by both endpoints (`user`, OpenAI's end-user id, is accepted and not used, as
/// in vLLM).
const COMMON: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "n",
    "best_of",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "include_stop_str_in_output",
    "logprobs",
    "return_token_ids",
    "response_format",
    "guided_json",
    "guided_choice",
    // Names vLLM's structured-output engine for `guided_json` / `guided_choice`: porter has one.
    "guided_decoding_backend",
    "add_special_tokens",
    "request_id",
    "cache_salt",
    "priority",
    "prompt_logprobs",
    "user",
];
/// Honoured by `/v1/completions` only.
const COMPLETIONS: &[&str] = &["prompt", "echo", "suffix"];
/// Honoured by `/v1/chat/completions` only.
const CHAT: &[&str] = &[
    "messages",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
];
/// Known (OpenAI's or vLLM's) and not implemented: any value but `null` is a 400 with the
/// reason.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("guided_regex", "no regular-expression constraint"),
    ("guided_grammar", "no grammar constraint"),
    ("guided_whitespace_pattern", "whitespace in structured output follows JSON"),
    ("structured_outputs", "use `response_format`, `guided_json` or `guided_choice`"),
    ("structural_tag", "use `response_format`, `guided_json` or `guided_choice`"),
    ("truncate_prompt_tokens", "prompts are never truncated"),
    ("allowed_token_ids", "use `logit_bias`"),
    ("logits_processors", "no custom logits processors"),
    ("kv_transfer_params", "no disaggregated prefill"),
    ("vllm_xargs", "vLLM's extension arguments"),
    ("mm_processor_kwargs", "text only"),
    ("documents", "no retrieval documents in the chat template"),
    ("chat_template", "the template is the model's or `--chat-template`"),
    ("reasoning_effort", "use `chat_template_kwargs` (e.g. `enable_thinking`)"),
    ("functions", "OpenAI's retired function calling: use `tools`"),
    ("function_call", "OpenAI's retired function calling: use `tool_choice`"),
    ("prediction", "no predicted outputs"),
    ("audio", "text only"),
    ("store", "nothing is stored"),
    ("metadata", "nothing is stored"),
    ("service_tier", "one tier"),
    ("web_search_options", "no web search"),
];

/// Accepted only with the value that means "off".
fn off_values(is_chat: bool) -> [(&'static str, Value, &'static str); 7] {
    [
        ("use_beam_search", json!(false), "no beam search"),
        ("length_penalty", json!(1.0), "no beam search"),
        ("skip_special_tokens", json!(true), "special tokens are always left out of the text"),
        ("spaces_between_special_tokens", json!(true), "special tokens are always left out of the text"),
        ("return_tokens_as_token_ids", json!(false), "use `return_token_ids`"),
        ("bad_words", json!([]), "use `logit_bias`"),
        // vLLM's chat `echo` (repeat the last message); the completions one is honoured.
        ("echo", json!(false), if is_chat { "the last message is not repeated" } else { "" }),
    ]
}

/// Checks every top-level field of a request body.
///
/// # Errors
/// A field porter does not know, a known one it does not implement (with why), or one of
/// those with a value other than "off".
pub fn check(v: &Value, is_chat: bool) -> Result<(), ApiError> {
    let Some(o) = v.as_object() else { return Ok(()) };
    let own = if is_chat { CHAT } else { COMPLETIONS };
    for (k, x) in o {
        if x.is_null() || COMMON.contains(&k.as_str()) || own.contains(&k.as_str()) {
            continue;
        }
        if let Some((_, why)) = UNSUPPORTED.iter().find(|(u, _)| u == k) {
            return Err(ApiError::invalid(k, format!("`{k}` is not supported ({why})")));
        }
        if let Some((_, off, why)) = off_values(is_chat).into_iter().find(|(u, _, _)| u == k) {
            let same = match (x.as_f64(), off.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => *x == off,
            };
            if same {
                continue;
            }
            return Err(ApiError::invalid(k, format!("`{k}` = {x} is not supported ({why})")));
        }
        if k == "modalities" {
            if *x == json!(["text"]) {
                continue;
            }
            return Err(ApiError::invalid(k, "only the `text` modality is supported"));
        }
        let other = if is_chat { "/v1/completions" } else { "/v1/chat/completions" };
        let hint = if (if is_chat { COMPLETIONS } else { CHAT }).contains(&k.as_str()) {
            format!(" (a field of {other})")
        } else {
            String::new()
        };
        return Err(ApiError::invalid(k, format!("unknown field `{k}`{hint}: porter does not know it")));
    }
    if !is_chat && o.get("suffix").is_some_and(|x| !x.is_null() && x.as_str() != Some("")) {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported (no fill-in-the-middle)"));
    }
    Ok(())
}

/// Checks that every field of `v` is one of `known` (a `null` counts as absent).
///
/// # Errors
/// The first other field, named.
pub fn check_fields(v: &Value, known: &[&str]) -> Result<(), ApiError> {
    let Some(o) = v.as_object() else { return Ok(()) };
    match o.iter().find(|(k, x)| !x.is_null() && !known.contains(&k.as_str())) {
        Some((k, _)) => Err(ApiError::invalid(k, format!("unknown field `{k}`: porter does not know it"))),
        None => Ok(()),
    }
}

/// The fields of `POST /tokenize` (vLLM's): a prompt, or messages rendered as a chat.
///
/// # Errors
/// A field of neither form.
pub fn check_tokenize(v: &Value) -> Result<(), ApiError> {
    const PROMPT: &[&str] = &["model", "prompt", "add_special_tokens", "return_token_strs"];
    const CHAT: &[&str] = &[
        "model",
        "messages",
        "add_special_tokens",
        "return_token_strs",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
        "tools",
    ];
    check_fields(v, if v.get("messages").is_some() { CHAT } else { PROMPT })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(v: Value, is_chat: bool) -> String {
        check(&v, is_chat).err().map(|e| e.message).unwrap_or_default()
    }

    #[test]
    fn fields_known_off_and_unknown() {
        let ok = json!({"model": "m", "prompt": "x", "max_tokens": 3, "user": "u", "priority": 0, "echo": true,
            "skip_special_tokens": true, "bad_words": [], "foo": null, "modalities": ["text"], "suffix": ""});
        assert_eq!(err(ok, false), "");
        assert_eq!(
            err(
                json!({"messages": [], "echo": false, "parallel_tool_calls": false, "continue_final_message": true}),
                true
            ),
            ""
        );
        for (v, is_chat, needle) in [
            (json!({"max_token": 3}), false, "unknown field `max_token`"),
            (json!({"messages": []}), false, "a field of /v1/chat/completions"),
            (json!({"prompt": "x"}), true, "a field of /v1/completions"),
            (json!({"top_logprobs": 2}), false, "unknown field"),
            (json!({"echo": true}), true, "not repeated"),
            (json!({"guided_regex": "a+"}), false, "`guided_regex` is not supported"),
            (json!({"use_beam_search": true}), false, "no beam search"),
            (json!({"suffix": "x"}), false, "fill-in-the-middle"),
            (json!({"modalities": ["audio"]}), true, "text"),
        ] {
            let e = err(v.clone(), is_chat);
            assert!(e.contains(needle), "{v}: {e}");
        }
    }
}
