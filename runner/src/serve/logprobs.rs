//! Log-probabilities in the API's shapes: the chat API's `{content: [{token, logprob, bytes,
//! top_logprobs}]}`, the completions API's `{tokens, token_logprobs, top_logprobs}` (with the
//! prompt's tokens first for `echo`), and vLLM's `prompt_logprobs`.

use super::Server;
use porter_core::engine::{PromptToken, TokenOut};
use serde_json::{json, Map, Value};

pub(super) fn token_text(s: &Server, id: u32) -> String {
    s.tok.decode(&[id], false).unwrap_or_default()
}

/// Chat-style `logprobs.content` entries of some tokens.
pub(super) fn chat_logprobs(s: &Server, toks: &[TokenOut], top: usize) -> Value {
    let entry = |id: u32, lp: f32| {
        let t = token_text(s, id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = toks
        .iter()
        .map(|t| {
            let mut e = entry(t.id, t.logprob.unwrap_or(f32::NAN));
            e["top_logprobs"] = Value::Array(t.top.iter().take(top).map(|&(i, lp)| entry(i, lp)).collect());
            e
        })
        .collect();
    json!({"content": content})
}

/// vLLM's `prompt_logprobs`: per prompt token (`null` for the first) an object from token ids
/// to `{logprob, rank, decoded_token}`: the prompt token's own, then the top `n`'s.
pub fn vllm_prompt_logprobs(s: &Server, ids: &[u32], lp: &[Option<PromptToken>], n: usize) -> Value {
    let entry = |id: u32, logprob: f32, rank: u32| json!({"logprob": logprob, "rank": rank, "decoded_token": token_text(s, id)});
    let list: Vec<Value> = (0..ids.len())
        .map(|p| match lp.get(p).and_then(Option::as_ref) {
            None => Value::Null,
            Some(t) => {
                let mut m = Map::new();
                m.insert(t.id.to_string(), entry(t.id, t.logprob, t.rank));
                for (r, &(i, l)) in t.top.iter().take(n).enumerate() {
                    m.entry(i.to_string()).or_insert_with(|| entry(i, l, r as u32 + 1));
                }
                Value::Object(m)
            }
        })
        .collect();
    Value::Array(list)
}

/// Completions-style `logprobs`; with `prompt` (`echo`), the prompt's tokens come first, the
/// first one with `null`s (OpenAI's legacy shape, what lm-evaluation-harness reads).
pub(super) fn completion_logprobs(
    s: &Server,
    prompt: Option<(&[u32], &[Option<PromptToken>])>,
    toks: &[TokenOut],
    top: usize,
) -> Value {
    let (mut tokens, mut lps, mut tops) = (Vec::new(), Vec::new(), Vec::new());
    let top_of = |t: &[(u32, f32)]| {
        let m: Map<String, Value> = t.iter().take(top).map(|&(i, lp)| (token_text(s, i), json!(lp))).collect();
        Value::Object(m)
    };
    if let Some((ids, lp)) = prompt {
        for (p, &id) in ids.iter().enumerate() {
            tokens.push(token_text(s, id));
            let e = lp.get(p).and_then(Option::as_ref);
            lps.push(e.map_or(Value::Null, |t| json!(t.logprob)));
            tops.push(e.map_or(Value::Null, |t| top_of(&t.top)));
        }
    }
    for t in toks {
        tokens.push(token_text(s, t.id));
        lps.push(json!(t.logprob));
        tops.push(top_of(&t.top));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops})
}
