//! The generation endpoints (`/v1/completions`, `/v1/chat/completions`, `/v1/responses`): a
//! validated request's engine requests, their collection into a response, or the stream.

use super::api::{self, ApiError, Kind, Plan};
use super::{check_auth, responses, stream, text, Server};
use axum::body::Bytes;
use axum::extract::State as AxState;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use porter_core::engine::{Event, Finish, Finished, TokenOut};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which API a request came through (how its response is written).
pub(super) enum Api {
    Completions,
    Chat,
    /// `/v1/responses`, with what the `response` object repeats from the request.
    Responses(Box<responses::Meta>),
}

impl Api {
    /// Chat and Responses run as chat requests.
    pub(super) fn is_chat(&self) -> bool {
        !matches!(self, Api::Completions)
    }
}

pub(super) async fn chat(AxState(s): AxState<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    serve_request(s, headers, body, Api::Chat).await
}

pub(super) async fn completions(AxState(s): AxState<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    serve_request(s, headers, body, Api::Completions).await
}

/// `POST /v1/responses`: the request translated to a chat request (`responses.rs`).
pub(super) async fn responses_api(AxState(s): AxState<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    let translated = api::parse_json(&headers, &body).and_then(|v| responses::to_chat(&v));
    match translated {
        Ok((chat, meta)) => match serde_json::to_vec(&chat) {
            Ok(b) => serve_request(s, headers, Bytes::from(b), Api::Responses(Box::new(meta))).await,
            Err(e) => ApiError::new(Kind::Server, e.to_string(), None).into_response(),
        },
        Err(e) => e.into_response(),
    }
}

/// One accepted request's events, forwarded from the engine's blocking stream.
pub(super) struct Running {
    pub(super) rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    pub(super) id: porter_core::engine::RequestId,
}

impl Running {
    /// Ends a request that a stop string cut short after `completion_tokens` tokens: aborts
    /// it in the engine and waits (one engine step) for its final counts, so the usage
    /// keeps its cached prompt tokens; the tokens it made after the stop are not counted.
    async fn stop_by_string(&mut self, s: &Server, prompt_len: usize, completion_tokens: usize) -> Finished {
        let _ = s.engine.abort(self.id);
        while let Some(ev) = self.rx.recv().await {
            if let Event::Done(f) = ev {
                return Finished { reason: Finish::Stop, completion_tokens, ..f };
            }
            if let Event::Error(_) = ev {
                break;
            }
        }
        stopped(prompt_len, completion_tokens)
    }
}

/// The end of a stop-string request whose final counts never came (the engine failed).
pub(super) fn stopped(prompt_len: usize, completion_tokens: usize) -> Finished {
    Finished {
        reason: Finish::Stop,
        prompt_tokens: prompt_len,
        completion_tokens,
        cached_tokens: 0,
        preemptions: 0,
        drafted: 0,
        accepted: 0,
        queue_time: Duration::ZERO,
    }
}

/// Submits one engine request and forwards its events (aborting it when the handler is gone).
pub(super) async fn submit(s: &Arc<Server>, ids: Vec<u32>, plan: &Plan, choice: usize) -> Result<Running, ApiError> {
    let engine = s.engine.clone();
    let mut params = plan.params.clone();
    // `n` samples of one seeded request differ: choice j draws with seed + j (as vLLM's
    // parallel sampling does).
    params.seed = params.seed.map(|x| x.wrapping_add(choice as u64));
    let stream = tokio::task::spawn_blocking(move || engine.add(ids, params))
        .await
        .map_err(|e| ApiError::new(Kind::Server, format!("engine task failed: {e}"), None))?
        .map_err(|e| ApiError::new(Kind::Invalid, format!("{e}"), None))?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let engine = s.engine.clone();
    let id = stream.id;
    tokio::task::spawn_blocking(move || {
        while let Some(ev) = stream.recv() {
            let end = ev.is_end();
            if tx.send(ev).is_err() {
                // The client went away: free the request's blocks and slot now.
                let _ = engine.abort(stream.id);
                return;
            }
            if end {
                return;
            }
        }
    });
    Ok(Running { rx, id })
}

/// Releases the in-flight count when a request's handler ends, however it ends.
pub(super) struct InFlight(Arc<Server>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve_request(s: Arc<Server>, headers: HeaderMap, body: Bytes, which: Api) -> Response {
    let is_chat = which.is_chat();
    if let Err(e) = check_auth(&s, &headers) {
        return e.into_response();
    }
    if s.draining.load(Ordering::SeqCst) {
        return ApiError::new(Kind::Unavailable, "the server is shutting down", None).into_response();
    }
    let plan = match api::plan(&s, &headers, &body, is_chat) {
        Ok(p) => p,
        Err(e) if matches!(which, Api::Responses(_)) => return responses::rename(e).into_response(),
        Err(e) => return e.into_response(),
    };
    let n_req = plan.prompts.len() * plan.n;
    if s.in_flight.fetch_add(n_req, Ordering::SeqCst) + n_req > s.max_queued {
        s.in_flight.fetch_sub(n_req, Ordering::SeqCst);
        return ApiError::new(
            Kind::TooMany,
            format!("too many requests in flight (--max-queued-requests = {}); retry later", s.max_queued),
            None,
        )
        .into_response();
    }
    let guards: Vec<InFlight> = (0..n_req).map(|_| InFlight(s.clone())).collect();
    let kind = match which {
        Api::Completions => "cmpl",
        Api::Chat => "chatcmpl",
        Api::Responses(_) => "resp",
    };
    // OpenAI's shapes: `cmpl-…`, `chatcmpl-…`, `resp_…`.
    let sep = if kind == "resp" { "_" } else { "-" };
    let id = match &plan.request_id {
        Some(r) => format!("{kind}{sep}{r}"),
        None => format!("{kind}{sep}{}", s.next_id.fetch_add(1, Ordering::Relaxed)),
    };
    let mut runs = Vec::with_capacity(n_req);
    for p in &plan.prompts {
        for j in 0..plan.n {
            match submit(&s, p.clone(), &plan, j).await {
                Ok(r) => runs.push(r),
                Err(e) => return e.into_response(),
            }
        }
    }
    if plan.stream {
        stream::stream_response(s, plan, id, runs, guards, which)
    } else {
        let mut choices = Vec::new();
        let mut outputs_prompt = None;
        let (mut prompt_tokens, mut completion_tokens, mut cached) = (0, 0, 0);
        for (i, run) in runs.into_iter().enumerate() {
            let p = &plan.prompts[i / plan.n];
            let out = match collect(&s, run, p, &plan, &format!("{id}-{i}")).await {
                Ok(o) => o,
                Err(e) => return e.into_response(),
            };
            prompt_tokens += out.fin.prompt_tokens;
            completion_tokens += out.fin.completion_tokens;
            cached += out.fin.cached_tokens;
            choices.push(api::choice(&s, &plan, i, &out, is_chat));
            if i == 0 {
                outputs_prompt = out.prompt.map(|p| (plan.prompts[0].clone(), p));
            }
        }
        drop(guards);
        if let Api::Responses(meta) = &which {
            // One choice (`n` is not a Responses field).
            let c = choices.first().cloned().unwrap_or_default();
            let output = responses::output_of(&id, &c["message"], &c["logprobs"]);
            let usage = responses::usage((prompt_tokens, completion_tokens, cached));
            let r = responses::response(&id, &s.name, meta, output, c["finish_reason"].as_str(), usage);
            return axum::Json(r).into_response();
        }
        let usage = api::usage(prompt_tokens, completion_tokens, cached);
        // vLLM's chat `prompt_logprobs` is the response's (its choices share the prompt).
        let prompt_lp = match (&which, plan.prompt_logprobs) {
            (Api::Chat, Some(n)) => outputs_prompt.map(|(ids, p)| api::vllm_prompt_logprobs(&s, &ids, &p, n)),
            _ => None,
        };
        let obj = if is_chat { "chat.completion" } else { "text_completion" };
        let mut r =
            json!({"id": id, "object": obj, "created": now(), "model": s.name, "choices": choices, "usage": usage});
        if let Some(p) = prompt_lp {
            r["prompt_logprobs"] = p;
        }
        axum::Json(r).into_response()
    }
}

pub(super) fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A finished choice.
pub struct Output {
    pub text: String,
    pub tokens: Vec<TokenOut>,
    /// The prompt's log-probabilities, when asked for (`echo` with `logprobs`, or vLLM's
    /// `prompt_logprobs`).
    pub prompt: Option<Vec<Option<porter_core::engine::PromptToken>>>,
    pub fin: Finished,
    /// `stop` when a stop string matched (the engine request was aborted then).
    pub reason: &'static str,
}

pub(super) fn finish_str(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::Abort => "abort",
    }
}

/// Counts a finished request in the metrics and writes its log line.
pub(super) fn record(s: &Server, rid: &str, fin: &Finished, reason: &str, t0: Instant, times: &[Instant]) {
    let first = times.first().copied();
    let e2e = t0.elapsed().as_secs_f64();
    let ttft = first.map(|f| (f - t0).as_secs_f64());
    // Decode speed after the first token (what a user of the stream sees).
    let tok_s = match (first, times.last()) {
        (Some(a), Some(b)) if times.len() > 1 && *b > a => (times.len() - 1) as f64 / (*b - a).as_secs_f64(),
        _ => 0.0,
    };
    tracing::info!(
        request = rid,
        prompt_tokens = fin.prompt_tokens,
        cached_tokens = fin.cached_tokens,
        completion_tokens = fin.completion_tokens,
        ttft_ms = ttft.map_or(-1.0, |t| (t * 1e4).round() / 10.0),
        tokens_per_s = (tok_s * 10.0).round() / 10.0,
        e2e_ms = (e2e * 1e4).round() / 10.0,
        queue_ms = (fin.queue_time.as_secs_f64() * 1e4).round() / 10.0,
        preemptions = fin.preemptions,
        finish_reason = reason,
        "request finished"
    );
    if let Ok(mut m) = s.metrics.lock() {
        m.prompt_tokens += fin.prompt_tokens as u64;
        m.generation_tokens += fin.completion_tokens as u64;
        let key: &'static str = match reason {
            "stop" => "stop",
            "length" => "length",
            "abort" => "abort",
            _ => "error",
        };
        *m.success.entry(key).or_default() += 1;
        if let Some(t) = ttft {
            m.ttft.observe(t);
        }
        for w in times.windows(2) {
            m.itl.observe((w[1] - w[0]).as_secs_f64());
        }
        m.e2e.observe(e2e);
        m.queue.observe(fin.queue_time.as_secs_f64());
        if let Some(k) = s.spec_k.filter(|_| fin.drafted > 0) {
            // drafted / K verify steps, each emitting its accepted drafts plus one token.
            let steps = fin.drafted.div_ceil(k) as f64;
            m.mtp_tokens_per_step.observe((fin.accepted as f64 + steps) / steps);
        }
    }
}

/// Runs one request to its end (non-streaming).
pub(super) async fn collect(
    s: &Arc<Server>,
    mut run: Running,
    prompt: &[u32],
    plan: &Plan,
    rid: &str,
) -> Result<Output, ApiError> {
    let t0 = Instant::now();
    let mut detok = text::Detok::new(&s.tok, prompt);
    let mut stops = text::StopMatcher::new(plan.stop_strings.clone(), plan.include_stop);
    let (mut textout, mut tokens, mut times) = (String::new(), Vec::new(), Vec::new());
    let mut prompt_lp = None;
    while let Some(ev) = run.rx.recv().await {
        let (fin, hit) = match ev {
            Event::Prompt(p) => {
                prompt_lp = Some(p);
                continue;
            }
            Event::Token(t) => {
                times.push(Instant::now());
                let piece = detok.push(t.id);
                tokens.push(t);
                let (safe, hit) = stops.push(&piece);
                textout.push_str(&safe);
                (None, hit)
            }
            Event::Done(fin) => {
                let (safe, hit) = stops.push(&detok.finish());
                textout.push_str(&safe);
                if !hit {
                    textout.push_str(&stops.finish());
                }
                (Some(fin), hit)
            }
            Event::Error(e) => return Err(ApiError::new(Kind::Server, e, None)),
        };
        if hit || fin.is_some() {
            let (fin, reason) = match fin {
                Some(f) if !hit => {
                    let r = finish_str(f.reason);
                    (f, r)
                }
                Some(f) => (f, "stop"),
                None => (run.stop_by_string(s, prompt.len(), tokens.len()).await, "stop"),
            };
            record(s, rid, &fin, reason, t0, &times);
            return Ok(Output { text: textout, tokens, prompt: prompt_lp, fin, reason });
        }
    }
    Err(ApiError::new(Kind::Server, "the engine stopped before the request finished", None))
}
