//! The SSE response of a streaming request: every choice's engine request runs at once and
//! their deltas are interleaved in the order the engine produces them (as OpenAI and vLLM
//! stream `n > 1` and prompt lists); each choice has its own detokeniser, stop-string
//! matcher and parsers, and exactly one chunk per choice carries its `finish_reason`.

use super::request::Api;
use super::{api, finish_str, now, record, responses, stopped, text, InFlight, Running, Server};
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
    which: Api,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, std::convert::Infallible>>(64);
    let is_chat = which.is_chat();
    let events = match which {
        Api::Responses(meta) => Some(responses::Events::new(id.clone(), s.name.clone(), *meta)),
        _ => None,
    };
    let obj = if is_chat { "chat.completion.chunk" } else { "text_completion" };
    let continuous = plan.continuous_usage;
    let sink = Sink { tx, id: id.clone(), obj, created: now(), model: s.name.clone(), events, continuous };
    tokio::spawn(async move {
        let (_guards, mut sink) = (guards, sink);
        if !sink.start().await {
            return;
        }
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
                if !sink.chunk(c, (prompt.len(), 0)).await {
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
                    Event::Token(_) | Event::Prompt(_) => continue,
                };
                c.finished = true;
                usage = add(usage, &f);
                if !sink.chunk(finish_chunk(&s, &plan, c, i, "stop", &f, is_chat, &id), (f.prompt_tokens, ntok)).await {
                    return;
                }
                continue;
            }
            let (piece, toks, fin) = match ev {
                // Prompt log-probabilities come with `echo`, which is not streamed.
                Event::Prompt(_) => continue,
                Event::Token(t) => {
                    c.times.push(Instant::now());
                    c.ntok += 1;
                    (c.detok.push(t.id), vec![t], None)
                }
                Event::Done(f) => (c.detok.finish(), vec![], Some(f)),
                Event::Error(e) => {
                    sink.error(&e).await;
                    return;
                }
            };
            let (mut safe, hit) = c.stops.push(&piece);
            if fin.is_some() && !hit {
                safe.push_str(&c.stops.finish());
            }
            let last = fin.is_some() || hit;
            if let Some(delta) = delta_for(&s, &plan, c, i, &safe, &toks, last, is_chat) {
                if !sink.chunk(delta, (c.prompt_len, c.ntok)).await {
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
                    if !sink
                        .chunk(finish_chunk(&s, &plan, c, i, "stop", &f, is_chat, &id), (f.prompt_tokens, c.ntok))
                        .await
                    {
                        return;
                    }
                }
            } else if let Some(f) = fin {
                c.finished = true;
                usage = add(usage, &f);
                let reason = finish_str(f.reason);
                let u = (f.prompt_tokens, f.completion_tokens);
                if !sink.chunk(finish_chunk(&s, &plan, c, i, reason, &f, is_chat, &id), u).await {
                    return;
                }
            }
        }
        if choices.iter().any(|c| !c.finished) {
            sink.error("the engine stopped").await;
            return;
        }
        sink.end(usage, plan.include_usage).await;
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Where a stream's chunks go: as chat / completions chunks, or translated into the
/// Responses API's events.
struct Sink {
    tx: tokio::sync::mpsc::Sender<Result<SseEvent, std::convert::Infallible>>,
    id: String,
    obj: &'static str,
    created: u64,
    model: String,
    events: Option<responses::Events>,
    /// vLLM's `stream_options.continuous_usage_stats`: every chunk carries its choice's usage.
    continuous: bool,
}

impl Sink {
    /// Sends `events` (named when given); false once the client is gone.
    async fn send(&self, events: Vec<(Option<String>, String)>) -> bool {
        for (name, data) in events {
            let ev = SseEvent::default().data(data);
            let ev = match name {
                Some(n) => ev.event(n),
                None => ev,
            };
            if self.tx.send(Ok(ev)).await.is_err() {
                return false;
            }
        }
        true
    }

    fn named(evs: Vec<(String, Value)>) -> Vec<(Option<String>, String)> {
        evs.into_iter().map(|(k, v)| (Some(k), v.to_string())).collect()
    }

    /// The Responses API's `response.created` and `response.in_progress`.
    async fn start(&mut self) -> bool {
        let evs = self.events.as_mut().map(responses::Events::start).unwrap_or_default();
        self.send(Self::named(evs)).await
    }

    /// One chunk choice `c`; `u`: its choice's prompt and completion tokens so far.
    async fn chunk(&mut self, c: Value, u: (usize, usize)) -> bool {
        let evs = match &mut self.events {
            Some(e) => Self::named(e.chunk(&c)),
            None => {
                let mut v = json!({"id": self.id, "object": self.obj, "created": self.created, "model": self.model,
                    "choices": [c]});
                if self.continuous {
                    v["usage"] = json!({"prompt_tokens": u.0, "completion_tokens": u.1, "total_tokens": u.0 + u.1});
                }
                vec![(None, v.to_string())]
            }
        };
        self.send(evs).await
    }

    /// An error after the header, and the end of the stream.
    async fn error(&mut self, msg: &str) {
        let evs = match &mut self.events {
            Some(e) => Self::named(e.error(msg)),
            None => {
                let v = json!({"error": {"message": msg, "type": "server_error", "param": null, "code": 500}});
                vec![(None, v.to_string()), (None, "[DONE]".into())]
            }
        };
        self.send(evs).await;
    }

    /// The usage chunk (with `include_usage`) and `[DONE]`, or the Responses API's final
    /// `response.completed` / `response.incomplete`.
    async fn end(&mut self, u: (usize, usize, usize), include_usage: bool) {
        let evs = match &mut self.events {
            Some(e) => Self::named(e.end(u)),
            None => {
                let mut evs = Vec::new();
                if include_usage {
                    let v = json!({"id": self.id, "object": self.obj, "created": self.created, "model": self.model,
                        "choices": [], "usage": api::usage(u.0, u.1, u.2)});
                    evs.push((None, v.to_string()));
                }
                evs.push((None, "[DONE]".into()));
                evs
            }
        };
        self.send(evs).await;
    }
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
        return Some(api::parsed_delta(i, "", "", &d, Value::Null));
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
        // The tokens' log-probabilities go with the delta they made (also one whose text the
        // parsers still hold back, so that none is lost).
        let lp = plan.logprobs.filter(|_| !toks.is_empty()).map(|top| api::chat_logprobs(s, toks, top));
        let ids = plan.return_token_ids && !toks.is_empty();
        if r.reasoning.is_empty() && t.content.is_empty() && t.calls.is_empty() && lp.is_none() && !ids {
            return None;
        }
        let mut d = api::parsed_delta(i, &r.reasoning, &t.content, &t.calls, lp.unwrap_or(Value::Null));
        if plan.return_token_ids {
            d["token_ids"] = json!(toks.iter().map(|t| t.id).collect::<Vec<_>>());
        }
        return Some(d);
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
