//! `porter serve`: an OpenAI-compatible HTTP server (axum + tokio) over the serving engine.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (both streaming with SSE or
//! not), `GET /v1/models`, `GET /health` (503 while draining), `GET /metrics` (Prometheus
//! text, vLLM's names), `POST /tokenize`, `POST /detokenize`. Requests are validated into
//! [`porter_core::engine::SamplingParams`] by [`api`]; each accepted request is one engine
//! request whose events a blocking task forwards to the async handler; a client that goes
//! away drops the receiver, and the forwarder aborts the engine request at its next event.

pub mod api;
mod fields;
mod logprobs;
pub mod page;
mod request;
mod responses;
mod stream;
mod structured;
mod tools;
pub use structured::Structured;
pub mod text;

use anyhow::{Context, Result};
use api::{ApiError, Kind};
use axum::body::Bytes;
use axum::extract::State as AxState;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use porter_core::engine::{Engine, Event};
use request::{chat, completions, finish_str, now, record, responses_api, stopped, InFlight, Output, Running};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokenizers::Tokenizer;

/// What the handlers share.
pub struct Server {
    pub engine: Arc<Engine>,
    pub tok: Tokenizer,
    pub name: String,
    pub dir: PathBuf,
    /// Accepted API keys (none: no authentication).
    pub api_keys: Vec<String>,
    /// Other names of the served model (`--served-model-name` after the first).
    pub aliases: Vec<String>,
    pub chat_template: Option<String>,
    pub ctx: usize,
    pub vocab: usize,
    pub defaults: porter_core::model::GenerationConfig,
    pub draining: AtomicBool,
    pub in_flight: AtomicUsize,
    pub max_queued: usize,
    pub metrics: Mutex<Metrics>,
    pub next_id: AtomicU64,
    pub created: u64,
    /// `--reasoning-parser qwen3`: `<think>…</think>` goes to `reasoning_content`.
    pub reasoning: bool,
    /// `--tool-call-parser hermes`: `<tool_call>` blocks become `tool_calls`.
    pub tool_calls: bool,
    /// `--mtp-step K`: draft tokens per step.
    pub spec_k: Option<usize>,
    /// `--scheduling-policy priority`: requests' `priority` orders them.
    pub priority: bool,
    /// Structured output: the token bytes (built from the tokenizer on the first request
    /// that asks for them) and the compiled schemas (`json_object`'s and recent requests').
    pub structured: Structured,
}

/// Request counters and latency sums for `/metrics`.
pub struct Metrics {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub success: std::collections::BTreeMap<&'static str, u64>,
    pub ttft: Histogram,
    pub e2e: Histogram,
    pub itl: Histogram,
    pub queue: Histogram,
    /// LightLLM's `mtp_avg_token_per_step`: per request, tokens per verify step.
    pub mtp_tokens_per_step: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            prompt_tokens: 0,
            generation_tokens: 0,
            success: Default::default(),
            ttft: Histogram::default(),
            e2e: Histogram::default(),
            itl: Histogram::default(),
            queue: Histogram::default(),
            mtp_tokens_per_step: Histogram::with(&TOKEN_BUCKETS),
        }
    }
}

/// A Prometheus histogram with fixed buckets (seconds unless made [`Histogram::with`]).
#[derive(Clone)]
pub struct Histogram {
    pub buckets: &'static [f64],
    pub counts: Vec<u64>,
    pub sum: f64,
    pub n: u64,
}

const BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Buckets of `mtp_avg_token_per_step` (tokens per verify step: 1 ..= K + 1, K ≤ 15).
const TOKEN_BUCKETS: [f64; 17] =
    [1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 14.0, 16.0];

impl Default for Histogram {
    fn default() -> Self {
        Self::with(&BUCKETS)
    }
}

impl Histogram {
    /// An empty histogram over `buckets` (ascending upper bounds).
    pub fn with(buckets: &'static [f64]) -> Self {
        Self { buckets, counts: vec![0; buckets.len()], sum: 0.0, n: 0 }
    }

    pub fn observe(&mut self, v: f64) {
        for (i, b) in self.buckets.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.n += 1;
    }

    fn render(&self, name: &str, label: &str, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (i, b) in self.buckets.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{label},le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {}", self.n);
        let _ = writeln!(out, "{name}_sum{{{label}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{label}}} {}", self.n);
    }
}

/// Flags of `porter serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to bind (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name(s) clients use (default: the model folder's name). With several, a
    /// request may name any; responses carry the first (as vLLM).
    #[arg(long, num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Require `Authorization: Bearer KEY` on /v1/* (also from $PORTER_API_KEY); several keys
    /// may be given, any of them is accepted.
    #[arg(long, num_args = 1..)]
    pub api_key: Vec<String>,
    /// Context limit for requests (at most the model's max_position_embeddings).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Requests the engine runs at once; more wait in the queue (default: 8 on the CPU, 64
    /// on a GPU).
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Rows per forward step: prefill chunks plus one row per decoding request (default: 512
    /// on the CPU, 8192 on a GPU). Long prompts are prefilled in chunks of at most this.
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Requests in flight (running + waiting) before new ones get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queued_requests: usize,
    /// A jinja chat template file replacing the model folder's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Seconds in-flight requests may take to finish after SIGTERM / SIGINT.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// KV cache size in bytes (suffixes KB/MB/GB decimal, KiB/MiB/GiB binary).
    #[arg(long, value_parser = crate::serve_bench::parse_bytes, conflicts_with = "gpu_memory_utilization")]
    pub kv_cache_memory: Option<usize>,
    /// CUDA only: the KV cache and state slots take this share of the device memory free
    /// after the weights (default 0.9). On the CPU the pool holds every sequence's whole context.
    #[arg(long, value_parser = crate::serve_bench::parse_fraction)]
    pub gpu_memory_utilization: Option<f64>,
    /// How waiting requests are ordered: `fcfs` (first come, first served) or `priority` (each
    /// request's `priority`, lower first, then arrival; preemption takes the lowest first).
    #[arg(long, default_value = "fcfs")]
    pub scheduling_policy: String,
    /// Reuse the KV blocks (and a hybrid model's state checkpoints) of earlier prompts that
    /// share a prefix (on by default; vLLM's flag).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off: every prompt is computed whole.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Hybrid models (Gated DeltaNet): recurrent-state checkpoints the prefix cache keeps, so
    /// that a prompt sharing a prefix with an earlier one resumes there (default: 8 per
    /// sequence on the CPU; on a GPU 2 per sequence, at most a tenth of the memory share).
    /// 0 turns prefix caching off for hybrid models.
    #[arg(long)]
    pub state_checkpoints: Option<usize>,
    /// Split reasoning from the answer in chat responses: `qwen3` (`<think>…</think>`).
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// Parse tool calls in chat responses: `hermes` (`<tool_call>{json}</tool_call>`).
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// A tokenizer.json to use instead of the model folder's (needed with `--config`).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

/// Where the served model came from.
pub struct Source {
    /// The model folder (chat template, tokenizer); with `random`, the tokenizer's folder.
    pub dir: PathBuf,
    /// `Some(config)` for random weights built from `--config` (benchmarks).
    pub random: Option<String>,
    /// Speculative decoding with MTP draft heads (`--mtp-step`).
    pub spec: Option<porter_core::engine::SpecConfig>,
}

/// Loads the tokenizer, starts the engine and serves until SIGTERM / SIGINT.
pub fn run(model: porter_core::Model, src: Source, a: &ServeArgs) -> Result<()> {
    let Source { dir, random, spec } = src;
    let tok_path = a.tokenizer.clone().unwrap_or_else(|| dir.join("tokenizer.json"));
    let tok = Tokenizer::from_file(&tok_path)
        .map_err(|e| anyhow::anyhow!("porter serve needs {}: {e}", tok_path.display()))?;
    let chat_template = match &a.chat_template {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("--chat-template {}", p.display()))?),
        None => None,
    };
    let model_ctx = model.info.max_position_embeddings.unwrap_or(usize::MAX);
    let ctx = match a.max_model_len {
        Some(0) => anyhow::bail!("--max-model-len must be >= 1"),
        Some(n) if n > model_ctx => {
            anyhow::bail!("--max-model-len {n} exceeds the model's max_position_embeddings = {model_ctx}")
        }
        Some(n) => n,
        None => model_ctx,
    };
    let reasoning = match a.reasoning_parser.as_deref() {
        None => false,
        Some("qwen3") => true,
        Some(o) => anyhow::bail!("--reasoning-parser `{o}` is not supported (supported: qwen3)"),
    };
    let tool_calls = match a.tool_call_parser.as_deref() {
        None => false,
        Some("hermes") => true,
        Some(o) => anyhow::bail!("--tool-call-parser `{o}` is not supported (supported: hermes)"),
    };
    if a.max_queued_requests == 0 {
        anyhow::bail!("--max-queued-requests must be >= 1");
    }
    if a.gpu_memory_utilization.is_some() && model.info.device == porter_core::Device::Cpu {
        anyhow::bail!("--gpu-memory-utilization applies to a CUDA device (use --kv-cache-memory on the CPU)");
    }
    for (flag, v) in [("--max-num-seqs", a.max_num_seqs), ("--max-num-batched-tokens", a.max_num_batched_tokens)] {
        if v == Some(0) {
            anyhow::bail!("{flag} 0: must be at least 1");
        }
    }
    let sizes = crate::serve_bench::EngineSizes {
        max_num_seqs: a.max_num_seqs,
        max_num_batched_tokens: a.max_num_batched_tokens,
        kv_cache_memory: a.kv_cache_memory,
        gpu_memory_utilization: a.gpu_memory_utilization,
        state_checkpoints: a.state_checkpoints,
        prefix_caching: !a.no_enable_prefix_caching,
    };
    let (mut cfg, _) = crate::serve_bench::sized_engine_config(&model, &sizes)?;
    cfg.priority_scheduling = match a.scheduling_policy.as_str() {
        "fcfs" => false,
        "priority" => true,
        o => anyhow::bail!("--scheduling-policy `{o}` is not supported (supported: fcfs, priority)"),
    };
    tracing::info!(
        prefix_caching = cfg.prefix_caching,
        state_checkpoints = cfg.state_checkpoints,
        max_num_seqs = cfg.max_num_seqs,
        max_num_batched_tokens = cfg.max_num_batched_tokens,
        kv_blocks = cfg.num_blocks,
        block_size = cfg.block_size,
        "engine configured"
    );
    if let Some(n) = a.served_model_name.iter().find(|n| n.is_empty()) {
        anyhow::bail!("--served-model-name `{n}`: a name must not be empty");
    }
    let name = a.served_model_name.first().cloned().unwrap_or_else(|| match &random {
        Some(c) => format!("random-{c}"),
        None => dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "porter".into()),
    });
    let aliases = a.served_model_name.iter().skip(1).cloned().collect();
    let vocab = model.info.vocab_size;
    let defaults = model.info.generation.clone();
    let spec_k = spec.as_ref().map(|sp| sp.k);
    // The engine captures its CUDA graphs as it starts: a progress bar on stderr.
    fn graph_bar(done: usize, total: usize) {
        let w = 30 * done / total.max(1);
        eprint!("\rcapturing CUDA graphs [{}{}] {done}/{total}", "#".repeat(w), " ".repeat(30 - w));
        if done == total {
            eprintln!();
        }
    }
    porter_core::backend::cuda::graph::set_progress(Some(graph_bar));
    let engine = Arc::new(Engine::start_with_spec(model, cfg, spec).context("starting the engine")?);
    porter_core::backend::cuda::graph::set_progress(None);
    warm_up(&engine, vocab, ctx).context("warming up the engine")?;
    let mut api_keys: Vec<String> = a.api_key.iter().filter(|k| !k.is_empty()).cloned().collect();
    if api_keys.is_empty() {
        api_keys.extend(std::env::var("PORTER_API_KEY").ok().filter(|k| !k.is_empty()));
    }
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let state = Arc::new(Server {
        engine,
        tok,
        name,
        dir,
        api_keys,
        aliases,
        chat_template,
        ctx,
        vocab,
        defaults,
        draining: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        max_queued: a.max_queued_requests,
        metrics: Mutex::new(Metrics::default()),
        next_id: AtomicU64::new(1),
        created,
        reasoning,
        tool_calls,
        spec_k,
        priority: cfg.priority_scheduling,
        structured: Structured::default(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let addr = format!("{}:{}", a.host, a.port);
    let timeout = Duration::from_secs(a.shutdown_timeout);
    rt.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr} (--host / --port)"))?;
        tracing::info!(model = %state.name, dir = %state.dir.display(), "porter serve listening on http://{addr}");
        let app = router(state.clone());
        let st = state.clone();
        let shutdown = async move {
            wait_for_signal().await;
            st.draining.store(true, Ordering::SeqCst);
            tracing::info!(
                in_flight = st.in_flight.load(Ordering::SeqCst),
                timeout_s = timeout.as_secs(),
                "draining: new requests get 503"
            );
            let t0 = Instant::now();
            while st.in_flight.load(Ordering::SeqCst) > 0 && t0.elapsed() < timeout {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        axum::serve(listener, app).with_graceful_shutdown(shutdown).await.context("serving")?;
        // Whatever is still running ends with finish reason `abort`.
        state.engine.shutdown();
        tracing::info!("stopped");
        Ok(())
    })
}

/// Logs (`tracing`) to stderr; the level from `PORTER_LOG` or `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter = std::env::var("PORTER_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Runs a few short requests through the engine before the port opens (the first forward
/// of each shape compiles kernels on a GPU), with a progress bar.
fn warm_up(engine: &Engine, vocab: usize, ctx: usize) -> Result<()> {
    use porter_core::engine::{SamplingParams, StopParams};
    // A prefill alone, then two requests together (batched prefill and decode rows).
    let runs: [&[usize]; 2] = [&[16], &[16, 9]];
    let bar = indicatif::ProgressBar::new(runs.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("warming up {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    for lens in runs {
        let streams = lens
            .iter()
            .map(|&len| {
                let len = len.min(ctx.saturating_sub(5)).max(1);
                let prompt: Vec<u32> = (0..len).map(|i| ((i * 7919 + 3) % vocab.max(1)) as u32).collect();
                let stop = StopParams { max_tokens: Some(4), ignore_eos: true, ..Default::default() };
                engine.add(prompt, SamplingParams { stop, ..Default::default() })
            })
            .collect::<porter_core::Result<Vec<_>>>()?;
        for st in streams {
            match st.collect().1 {
                Some(Event::Done(_)) => {}
                Some(Event::Error(e)) => anyhow::bail!("warm-up request failed: {e}"),
                other => anyhow::bail!("warm-up request ended without finishing: {other:?}"),
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    tracing::info!(seconds = (t0.elapsed().as_secs_f64() * 100.0).round() / 100.0, "warmed up");
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// The routes.
pub fn router(state: Arc<Server>) -> Router {
    Router::new()
        .route("/", get(page::page))
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model_card))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses_api))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn health(AxState(s): AxState<Arc<Server>>) -> Response {
    if s.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
    } else {
        (StatusCode::OK, "").into_response()
    }
}

fn check_auth(s: &Server, headers: &HeaderMap) -> Result<(), ApiError> {
    if s.api_keys.is_empty() {
        return Ok(());
    }
    // `Bearer` in any case (as vLLM), then the key.
    let got = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
        .map(|(_, k)| k.trim());
    // Constant-time comparison with each key (length first, then every byte).
    let ok = got.is_some_and(|g| {
        s.api_keys.iter().fold(false, |hit, key| {
            hit | (g.len() == key.len() && g.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0)
        })
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(Kind::Auth, "missing or wrong API key (Authorization: Bearer ...)", None))
    }
}

/// `GET /version` (as vLLM's): porter's version.
async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// The served model's card.
fn card(s: &Server) -> Value {
    card_named(s, &s.name)
}

fn card_named(s: &Server, name: &str) -> Value {
    json!({"id": name, "object": "model", "created": s.created, "owned_by": "porter", "max_model_len": s.ctx})
}

async fn models(AxState(s): AxState<Arc<Server>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_auth(&s, &headers) {
        return e.into_response();
    }
    let mut data = vec![card(&s)];
    data.extend(s.aliases.iter().map(|a| card_named(&s, a)));
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{model}` (OpenAI's retrieve): the card, or 404 naming the served model.
async fn model_card(
    AxState(s): AxState<Arc<Server>>,
    axum::extract::Path(model): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = check_auth(&s, &headers) {
        return e.into_response();
    }
    if model != s.name && !s.aliases.contains(&model) {
        let msg = format!("the model `{model}` does not exist (serving `{}`)", s.name);
        return ApiError::new(Kind::NotFound, msg, Some("model")).into_response();
    }
    axum::Json(card_named(&s, &model)).into_response()
}

async fn tokenize(AxState(s): AxState<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        check_auth(&s, &headers)?;
        let v = api::parse_json(&headers, &body)?;
        fields::check_tokenize(&v)?;
        let ids = if let Some(m) = v.get("messages") {
            let text = api::render_chat(&s, &v, m)?;
            api::encode(&s, &text, v.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(false))?
        } else {
            let p = v.get("prompt").and_then(Value::as_str).ok_or_else(|| {
                ApiError::new(Kind::Invalid, "`prompt` (a string) or `messages` is required", Some("prompt"))
            })?;
            api::encode(&s, p, v.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true))?
        };
        let mut out = json!({"tokens": ids, "count": ids.len(), "max_model_len": s.ctx});
        if v.get("return_token_strs").and_then(Value::as_bool) == Some(true) {
            // vLLM's: each id's token as the vocabulary spells it.
            let strs: Vec<Value> = ids.iter().map(|&i| s.tok.id_to_token(i).map_or(Value::Null, Value::from)).collect();
            out["token_strs"] = Value::Array(strs);
        }
        Ok::<_, ApiError>(out)
    })();
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn detokenize(AxState(s): AxState<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        check_auth(&s, &headers)?;
        let v = api::parse_json(&headers, &body)?;
        fields::check_fields(&v, &["model", "tokens"])?;
        let ids = api::token_ids(v.get("tokens"), "tokens", s.vocab)?.ok_or_else(|| {
            ApiError::new(Kind::Invalid, "`tokens` (a list of token ids) is required", Some("tokens"))
        })?;
        let text =
            s.tok.decode(&ids, false).map_err(|e| ApiError::new(Kind::Invalid, e.to_string(), Some("tokens")))?;
        Ok::<_, ApiError>(json!({"prompt": text}))
    })();
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(AxState(s): AxState<Arc<Server>>) -> Response {
    use std::fmt::Write;
    let st = s.engine.stats();
    let label = format!("model_name=\"{}\"", s.name.replace('"', "'"));
    let mut out = String::new();
    let mut gauge = |name: &str, v: f64| {
        let _ = writeln!(out, "# TYPE {name} gauge\n{name}{{{label}}} {v}");
    };
    gauge("vllm:num_requests_running", st.running as f64);
    gauge("vllm:num_requests_waiting", st.waiting as f64);
    let used = st.kv_blocks_total.saturating_sub(st.kv_blocks_free) as f64;
    gauge("vllm:kv_cache_usage_perc", if st.kv_blocks_total > 0 { used / st.kv_blocks_total as f64 } else { 0.0 });
    gauge("porter:state_checkpoints_total", st.state_checkpoints_total as f64);
    gauge("porter:state_checkpoints_cached", st.state_checkpoints_cached as f64);
    let mut counter = |name: &str, v: u64| {
        let _ = writeln!(out, "# TYPE {name} counter\n{name}{{{label}}} {v}");
    };
    let m = s.metrics.lock().map(|m| (m.prompt_tokens, m.generation_tokens, m.success.clone())).unwrap_or_default();
    counter("vllm:prompt_tokens_total", m.0);
    counter("vllm:generation_tokens_total", m.1);
    counter("vllm:num_preemptions_total", st.preemptions);
    counter("vllm:prefix_cache_queries_total", st.prefix_query_tokens);
    counter("vllm:prefix_cache_hits_total", st.prefix_hit_tokens);
    counter("porter:prefix_cache_unresumed_tokens_total", st.prefix_unresumed_tokens);
    counter("vllm:spec_decode_num_drafts", st.spec_steps);
    counter("vllm:spec_decode_num_draft_tokens", st.spec_drafted);
    counter("vllm:spec_decode_num_accepted_tokens", st.spec_accepted);
    let _ = writeln!(out, "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter");
    for (pos, n) in st.spec_accepted_at.iter().enumerate() {
        let _ = writeln!(out, "vllm:spec_decode_num_accepted_tokens_per_pos{{{label},position=\"{pos}\"}} {n}");
    }
    let _ = writeln!(out, "# TYPE vllm:request_success_total counter");
    for (reason, n) in &m.2 {
        let _ = writeln!(out, "vllm:request_success_total{{{label},finished_reason=\"{reason}\"}} {n}");
    }
    if let Ok(mm) = s.metrics.lock() {
        mm.ttft.render("vllm:time_to_first_token_seconds", &label, &mut out);
        mm.itl.render("vllm:inter_token_latency_seconds", &label, &mut out);
        mm.e2e.render("vllm:e2e_request_latency_seconds", &label, &mut out);
        mm.queue.render("vllm:request_queue_time_seconds", &label, &mut out);
        if s.spec_k.is_some() {
            mm.mtp_tokens_per_step.render("mtp_avg_token_per_step", &label, &mut out);
        }
    }
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}
