//! The SSE response of a streaming request: every choice's engine request runs at once and
//! their deltas are interleaved in the order the engine produces them (as OpenAI and vLLM
//! stream `n > 1` and prompt lists); each choice has its own detokeniser, stop-string
//! matcher and parsers, and exactly one chunk per choice carries its `finish_reason`.

use super::{api, finish_str, now, record, stopped, text, InFlight, Running, Server};
use crate::serve_parsers::{ReasoningDelta, ReasoningParser, ToolDelta, ToolParser};
use api::Plan;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use porter_core::engine::{Event, Finish, Finished, RequestId};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;

/// One choice's streaming state.
struct Choice<'t> {
    id: RequestId,
    prompt_len: usize,
    t0: Instant,
    detok: text::Detok<'t>,
    stops: text::StopMatcher,
    think: ReasoningParser,
    tools: ToolParser,
    /// A forced call's first fragment (its id and name) has been sent, and `required`'s scan.
    forced_sent: bool,
    calls: super::tools::Calls,
    times: Vec<Instant>,
    ntok: usize,
    /// A stop string matched after this many tokens: the engine request was aborted and its
    /// `Done` (which carries the cached-token count) ends the choice.
    stopped_at: Option<usize>,
    finished: bool,
}

/// The streamed response of `runs` (one per choice, in choice order).
pub(super) fn stream_response(
    s: Arc<Server>,
    plan: Plan,
    id: String,
    runs: Vec<Running>,
    guards: Vec<InFlight>,
    is_chat: bool,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        let _guards = guards;
        let created = now();
        let obj = if is_chat { "chat.completion.chunk" } else { "text_completion" };
        let frame = |c: Value| {
            let v = json!({"id": id, "object": obj, "created": created, "model": s.name, "choices": [c]});
            Ok(SseEvent::default().data(v.to_string()))
        };
        let error = |msg: &str| {
            let v = json!({"error": {"message": msg, "type": "server_error", "param": null, "code": 500}});
            Ok(SseEvent::default().data(v.to_string()))
        };
        let done = || Ok(SseEvent::default().data("[DONE]"));
        let mut usage = (0usize, 0usize, 0usize);
        let mut choices = Vec::with_capacity(runs.len());
        let mut events = tokio_stream::StreamMap::new();
        for (i, run) in runs.into_iter().enumerate() {
            let prompt = &plan.prompts[i / plan.n];
            choices.push(Choice {
                id: run.id,
                prompt_len: prompt.len(),
                t0: Instant::now(),
                detok: text::Detok::new(&s.tok, prompt),
                stops: text::StopMatcher::new(plan.stop_strings.clone(), plan.include_stop),
                think: ReasoningParser::new(plan.think_mode()),
                tools: ToolParser::new(i as u64),
                forced_sent: false,
                calls: Default::default(),
                times: Vec::new(),
                ntok: 0,
                stopped_at: None,
                finished: false,
            });
            events.insert(i, tokio_stream::wrappers::UnboundedReceiverStream::new(run.rx));
            if is_chat {
                let c = json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                if tx.send(frame(c)).await.is_err() {
                    return;
                }
            }
        }
        while let Some((i, ev)) = events.next().await {
            let c = &mut choices[i];
            if c.finished {
                continue;
            }
            if let Some(ntok) = c.stopped_at {
                // Cut by a stop string: wait for the aborted request's final counts.
                let f = match ev {
                    Event::Done(f) => Finished { reason: Finish::Stop, completion_tokens: ntok, ..f },
                    Event::Error(_) => stopped(c.prompt_len, ntok),
                    Event::Token(_) => continue,
                };
                c.finished = true;
                usage = add(usage, &f);
                if tx.send(frame(finish_chunk(&s, &plan, c, i, "stop", &f, is_chat, &id))).await.is_err() {
                    return;
                }
                continue;
            }
            let (piece, toks, fin) = match ev {
                Event::Token(t) => {
                    c.times.push(Instant::now());
                    c.ntok += 1;
                    (c.detok.push(t.id), vec![t], None)
                }
                Event::Done(f) => (c.detok.finish(), vec![], Some(f)),
                Event::Error(e) => {
                    let _ = tx.send(error(&e)).await;
                    let _ = tx.send(done()).await;
                    return;
                }
            };
            let (mut safe, hit) = c.stops.push(&piece);
            if fin.is_some() && !hit {
                safe.push_str(&c.stops.finish());
            }
            let last = fin.is_some() || hit;
            if let Some(delta) = delta_for(&s, &plan, c, i, &safe, &toks, last, is_chat) {
                if tx.send(frame(delta)).await.is_err() {
                    return;
                }
            }
            if hit {
                c.stopped_at = Some(c.ntok);
                let _ = s.engine.abort(c.id);
                if let Some(f) = fin {
                    // It ended in the same event: no other `Done` comes.
                    let f = Finished { reason: Finish::Stop, completion_tokens: c.ntok, ..f };
                    c.finished = true;
                    usage = add(usage, &f);
                    if tx.send(frame(finish_chunk(&s, &plan, c, i, "stop", &f, is_chat, &id))).await.is_err() {
                        return;
                    }
                }
            } else if let Some(f) = fin {
                c.finished = true;
                usage = add(usage, &f);
                let reason = finish_str(f.reason);
                if tx.send(frame(finish_chunk(&s, &plan, c, i, reason, &f, is_chat, &id))).await.is_err() {
                    return;
                }
            }
        }
        if choices.iter().any(|c| !c.finished) {
            let _ = tx.send(error("the engine stopped")).await;
            let _ = tx.send(done()).await;
            return;
        }
        if plan.include_usage {
            let v = json!({"id": id, "object": obj, "created": created, "model": s.name, "choices": [],
                "usage": api::usage(usage.0, usage.1, usage.2)});
            let _ = tx.send(Ok(SseEvent::default().data(v.to_string()))).await;
        }
        let _ = tx.send(done()).await;
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The delta chunk for the text `safe` that is now final (after stop-string hold-back), or
/// `None` when there is nothing to send.
#[allow(clippy::too_many_arguments)]
fn delta_for(
    s: &Server,
    plan: &Plan,
    c: &mut Choice<'_>,
    i: usize,
    safe: &str,
    toks: &[porter_core::engine::TokenOut],
    last: bool,
    is_chat: bool,
) -> Option<Value> {
    if let Some(f) = plan.forced_tool.as_ref().filter(|_| is_chat) {
        // The whole answer is the forced call's arguments.
        let d = f.deltas(i, safe, !c.forced_sent, &mut c.calls);
        if d.is_empty() {
            return None;
        }
        c.forced_sent = true;
        return Some(api::parsed_delta(i, "", "", &d));
    }
    if is_chat && (s.reasoning || plan.parse_tools) {
        // Reasoning first, then tool calls in what remains as content.
        let mut r = if s.reasoning {
            c.think.push(safe)
        } else {
            ReasoningDelta { reasoning: String::new(), content: safe.to_owned() }
        };
        if last && s.reasoning {
            let f = c.think.finish();
            r.reasoning.push_str(&f.reasoning);
            r.content.push_str(&f.content);
        }
        let mut t =
            if plan.parse_tools { c.tools.push(&r.content) } else { ToolDelta { content: r.content, calls: vec![] } };
        if last && plan.parse_tools {
            let f = c.tools.finish();
            t.content.push_str(&f.content);
            t.calls.extend(f.calls);
        }
        if plan.one_call {
            t.calls.retain(|d| d.index == 0);
        }
        if r.reasoning.is_empty() && t.content.is_empty() && t.calls.is_empty() {
            return None;
        }
        return Some(api::parsed_delta(i, &r.reasoning, &t.content, &t.calls));
    }
    if !safe.is_empty() || (!toks.is_empty() && (plan.logprobs.is_some() || plan.return_token_ids)) {
        return Some(api::delta(s, plan, i, safe, toks, is_chat));
    }
    None
}

/// The chunk that ends choice `i` (and its metrics and log line).
#[allow(clippy::too_many_arguments)]
fn finish_chunk(
    s: &Server,
    plan: &Plan,
    c: &Choice<'_>,
    i: usize,
    reason: &'static str,
    f: &Finished,
    is_chat: bool,
    id: &str,
) -> Value {
    let reason = match &plan.forced_tool {
        Some(f) if is_chat => f.finish(reason),
        _ if is_chat && s.tool_calls && c.tools.has_calls() => "tool_calls",
        _ => reason,
    };
    record(s, &format!("{id}-{i}"), f, reason, c.t0, &c.times);
    if is_chat {
        json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": reason})
    } else {
        json!({"index": i, "text": "", "logprobs": null, "finish_reason": reason})
    }
}

/// Usage totals plus one finished choice.
fn add(u: (usize, usize, usize), f: &Finished) -> (usize, usize, usize) {
    (u.0 + f.prompt_tokens, u.1 + f.completion_tokens, u.2 + f.cached_tokens)
}
