//! `porter bench --serve`: an online-serving benchmark of the engine
//! ([`porter_core::engine::Engine`]), after vLLM's `benchmark_serving.py`.
//!
//! `--num-requests` requests with random prompts (uniform token ids) of `--input-len` tokens
//! and exactly `--output-len` generated tokens each (greedy, `ignore_eos`; both lengths drawn
//! uniformly from their ranges with `--seed`) arrive as a Poisson process of `--request-rate`
//! requests/s (all at once when absent or `inf`), at most `--max-concurrency` in flight. One
//! client thread per request sends it and timestamps every token it receives; a poller samples
//! the engine's counters for the peak KV blocks in use. `--warmup` requests run first and are
//! excluded. Reported: duration, request / output / total token throughput, TTFT, ITL, TPOT and
//! end-to-end latency (mean, median, p99), peak KV blocks, state slots, preemptions, steps and
//! the mean batch (rows per forward).

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use porter_core::engine::{Engine, EngineConfig, EngineStats, Event, SamplingParams, StopParams};
use porter_core::{Device, Model};
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default `--gpu-memory-utilization`: the share of the device memory free after the weights
/// that the KV cache and the state slots take.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// How often the poller samples the engine's counters.
const POLL: Duration = Duration::from_micros(200);

/// Flags of `porter bench --serve` (each needs `--serve`).
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Run the online-serving benchmark of the engine instead of the prefill / decode timings.
    #[arg(long)]
    pub serve: bool,
    /// Timed requests.
    #[arg(long, requires = "serve", default_value_t = 64)]
    pub num_requests: usize,
    /// Poisson arrival rate in requests/s; `inf` (the default) sends every request at once.
    #[arg(long, requires = "serve", value_parser = parse_rate, value_name = "R|inf", allow_negative_numbers = true)]
    pub request_rate: Option<f64>,
    /// Prompt length in tokens: A, or a uniform random range A:B (inclusive).
    #[arg(long, requires = "serve", default_value = "128", value_name = "A[:B]")]
    pub input_len: LenRange,
    /// Generated tokens per request (exact: eos is ignored): A, or a uniform range A:B.
    #[arg(long, requires = "serve", default_value = "64", value_name = "A[:B]")]
    pub output_len: LenRange,
    /// At most this many requests in flight; the client waits for one to finish.
    #[arg(long, requires = "serve")]
    pub max_concurrency: Option<usize>,
    /// Engine: requests running at once (default: 8 on the CPU, 64 on a GPU).
    #[arg(long, requires = "serve")]
    pub max_num_seqs: Option<usize>,
    /// Engine: rows per forward, prefill chunks + decode rows (default: 512 CPU, 8192 GPU).
    #[arg(long, requires = "serve")]
    pub max_num_batched_tokens: Option<usize>,
    /// KV cache size in bytes (suffixes KB/MB/GB decimal, KiB/MiB/GiB binary).
    #[arg(long, requires = "serve", value_parser = parse_bytes, conflicts_with = "gpu_memory_utilization")]
    pub kv_cache_memory: Option<usize>,
    /// CUDA only: the KV cache and state slots take this share of the device memory free
    /// after the weights (default 0.9). On the CPU the pool holds every sequence's whole
    /// context (host blocks are allocated when first written).
    #[arg(long, requires = "serve", value_parser = parse_fraction)]
    pub gpu_memory_utilization: Option<f64>,
    /// Engine: recurrent-state checkpoints of a hybrid model's prefix cache (see `porter serve
    /// --help`); 0 turns its prefix caching off.
    #[arg(long, requires = "serve")]
    pub state_checkpoints: Option<usize>,
    /// Engine: reuse the KV blocks of earlier prompts (on by default; vLLM's flag).
    #[arg(long, requires = "serve", overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Engine: turn prefix caching off.
    #[arg(long, requires = "serve", overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Untimed requests run before the timed ones (all at once, excluded from every figure).
    #[arg(long, requires = "serve", default_value_t = 2)]
    pub warmup: usize,
    /// Seed of the lengths, the prompts and the arrival times.
    #[arg(long, requires = "serve", default_value_t = 0)]
    pub seed: u64,
}

/// An inclusive range of lengths `lo..=hi` (`--input-len`, `--output-len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LenRange {
    /// Shortest and longest (inclusive).
    pub lo: usize,
    pub hi: usize,
}

impl FromStr for LenRange {
    type Err = String;

    /// `A` or `A:B` with `A <= B`.
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| {
            t.trim().parse::<usize>().map_err(|_| format!("`{t}` is not a length (expected a non-negative integer)"))
        };
        let (lo, hi) = match s.split_once(':') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(s)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(format!("the range {lo}:{hi} is empty (A must be <= B in A:B)"));
        }
        Ok(Self { lo, hi })
    }
}

impl std::fmt::Display for LenRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}:{}", self.lo, self.hi)
        }
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    if s.trim().eq_ignore_ascii_case("inf") {
        return Ok(f64::INFINITY);
    }
    match s.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && !r.is_nan() => Ok(r),
        _ => Err(format!("`{s}` must be a rate > 0 requests/s, or inf")),
    }
}

/// A fraction in (0, 1] (`--gpu-memory-utilization`).
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("`{s}` must be a fraction in (0, 1]")),
    }
}

/// Bytes, optionally with a unit: KB / MB / GB (10^3, 10^6, 10^9) or KiB / MiB / GiB (2^10..).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use bytes, KB/MB/GB or KiB/MiB/GiB)")),
    };
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a byte count"))?;
    let bytes = v * mult;
    if !(bytes >= 1.0 && bytes < usize::MAX as f64) {
        return Err(format!("`{s}` must be at least 1 byte"));
    }
    Ok(bytes as usize)
}

/// SplitMix64: a small seeded generator (lengths, prompts, arrival gaps).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n >= 1`).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `r.lo..=r.hi`.
    fn in_range(&mut self, r: LenRange) -> usize {
        r.lo + self.below((r.hi - r.lo) as u64 + 1) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One request to send.
struct Plan {
    prompt: Vec<u32>,
    output_len: usize,
    /// Seconds after the start.
    arrival: f64,
}

/// `n` requests: lengths from `input` / `output`, prompts of uniform ids below `vocab`,
/// Poisson arrivals at `rate` (all at 0 when infinite).
fn make_requests(n: usize, input: LenRange, output: LenRange, vocab: usize, rate: f64, seed: u64) -> Vec<Plan> {
    // Arrivals from their own stream: the rate does not change the requests.
    let (mut rng, mut gaps) = (Rng(seed), Rng(seed ^ 0xA5A5_A5A5_A5A5_A5A5));
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            let len = rng.in_range(input);
            let output_len = rng.in_range(output);
            let prompt = (0..len).map(|_| rng.below(vocab as u64) as u32).collect();
            if i > 0 && rate.is_finite() {
                // Exponential gaps: -ln(1 - u) / rate.
                t += -(1.0 - gaps.unit()).ln() / rate;
            }
            Plan { prompt, output_len, arrival: t }
        })
        .collect()
}

/// What a client saw of one request (times in seconds after the start).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Record {
    /// Prompt tokens.
    pub input_len: usize,
    /// Tokens asked for (and generated: a run fails otherwise).
    pub output_len: usize,
    /// When it was due (Poisson schedule) and when it was sent (after the concurrency wait).
    pub arrival: f64,
    pub sent: f64,
    /// Arrival time of every generated token.
    pub tokens: Vec<f64>,
    /// When its `Done` arrived.
    pub done: f64,
    /// Times the engine preempted (and recomputed) it.
    pub preemptions: usize,
}

/// Mean, median and 99th percentile (milliseconds when built by [`Summary::of`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stat {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

impl Stat {
    /// Of `xs` (0 for an empty list).
    pub fn of(xs: &[f64]) -> Self {
        if xs.is_empty() {
            return Self::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        Self { mean: v.iter().sum::<f64>() / v.len() as f64, p50: percentile(&v, 50.0), p99: percentile(&v, 99.0) }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"mean": self.mean, "p50": self.p50, "p99": self.p99})
    }
}

/// The `q`-th percentile of sorted `v` with linear interpolation between closest ranks
/// (numpy's default `method="linear"`).
pub fn percentile(v: &[f64], q: f64) -> f64 {
    match v.len() {
        0 => 0.0,
        1 => v[0],
        n => {
            let pos = q / 100.0 * (n - 1) as f64;
            let i = (pos.floor() as usize).min(n - 1);
            let j = (i + 1).min(n - 1);
            v[i] + (v[j] - v[i]) * (pos - i as f64)
        }
    }
}

/// The client-side figures of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Requests completed, the run's seconds (first arrival to last completion), and the
    /// prompt and generated tokens of the completed requests.
    pub completed: usize,
    pub duration: f64,
    pub input_tokens: usize,
    pub output_tokens: usize,
    /// Requests/s, generated tokens/s, prompt + generated tokens/s.
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_throughput: f64,
    /// Time to first token (from sending), inter-token latency (every gap between two
    /// consecutive tokens of a request), time per output token after the first (per request)
    /// and end-to-end latency (from sending), all in ms.
    pub ttft: Stat,
    pub itl: Stat,
    pub tpot: Stat,
    pub e2el: Stat,
    /// Mean delay from a request's due time to its sending (the wait for a concurrency slot,
    /// and the client thread's start), ms.
    pub queue_wait_mean: f64,
}

impl Summary {
    /// The figures of `records` over a run of `duration` seconds.
    pub fn of(records: &[Record], duration: f64) -> Self {
        let ms = 1e3;
        let first = |r: &Record| r.tokens.first().copied().unwrap_or(r.done);
        let ttft: Vec<f64> = records.iter().map(|r| (first(r) - r.sent) * ms).collect();
        let itl: Vec<f64> =
            records.iter().flat_map(|r| r.tokens.windows(2).map(|w| (w[1] - w[0]) * ms).collect::<Vec<_>>()).collect();
        let tpot: Vec<f64> = records
            .iter()
            .filter(|r| r.tokens.len() > 1)
            .map(|r| (r.tokens[r.tokens.len() - 1] - r.tokens[0]) * ms / (r.tokens.len() - 1) as f64)
            .collect();
        let e2el: Vec<f64> = records.iter().map(|r| (r.done - r.sent) * ms).collect();
        let input_tokens = records.iter().map(|r| r.input_len).sum();
        let output_tokens = records.iter().map(|r| r.tokens.len()).sum();
        let d = duration.max(f64::MIN_POSITIVE);
        let queue_wait_mean = if records.is_empty() {
            0.0
        } else {
            records.iter().map(|r| (r.sent - r.arrival).max(0.0) * ms).sum::<f64>() / records.len() as f64
        };
        Self {
            completed: records.len(),
            duration,
            input_tokens,
            output_tokens,
            request_throughput: records.len() as f64 / d,
            output_throughput: output_tokens as f64 / d,
            total_throughput: (input_tokens + output_tokens) as f64 / d,
            ttft: Stat::of(&ttft),
            itl: Stat::of(&itl),
            tpot: Stat::of(&tpot),
            e2el: Stat::of(&e2el),
            queue_wait_mean,
        }
    }
}

/// A counting semaphore (`--max-concurrency`).
struct Permits {
    free: Mutex<usize>,
    cv: Condvar,
}

impl Permits {
    fn acquire(&self) -> PermitGuard<'_> {
        let mut n = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *n == 0 {
            n = self.cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n -= 1;
        PermitGuard(self)
    }
}

/// Gives its permit back when dropped (the request finished, or failed).
struct PermitGuard<'a>(&'a Permits);

impl Drop for PermitGuard<'_> {
    fn drop(&mut self) {
        let mut n = self.0.free.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        self.0.cv.notify_one();
    }
}

/// Sends one request and records its tokens; fails unless exactly `output_len` tokens come.
fn client(engine: &Engine, p: &Plan, t0: Instant, permit: Option<PermitGuard<'_>>) -> Result<Record> {
    let stop = StopParams { max_tokens: Some(p.output_len), ignore_eos: true, ..Default::default() };
    let params = SamplingParams { stop, ..Default::default() };
    let sent = t0.elapsed().as_secs_f64();
    let stream = engine.add(p.prompt.clone(), params)?;
    let mut tokens = Vec::with_capacity(p.output_len);
    loop {
        match stream.recv() {
            Some(Event::Token(_)) => tokens.push(t0.elapsed().as_secs_f64()),
            // The benchmark's requests ask for no prompt log-probabilities.
            Some(Event::Prompt(_)) => {}
            Some(Event::Done(f)) => {
                let done = t0.elapsed().as_secs_f64();
                drop(permit);
                if tokens.len() != p.output_len || f.completion_tokens != p.output_len {
                    bail!(
                        "a request asked for {} tokens got {} ({} counted by the engine, finish: {})",
                        p.output_len,
                        tokens.len(),
                        f.completion_tokens,
                        f.reason.as_str()
                    );
                }
                return Ok(Record {
                    input_len: p.prompt.len(),
                    output_len: p.output_len,
                    arrival: p.arrival,
                    sent,
                    tokens,
                    done,
                    preemptions: f.preemptions,
                });
            }
            Some(Event::Error(e)) => bail!("the engine failed a request: {e}"),
            None => bail!("the engine closed a request's stream before it finished"),
        }
    }
}

/// Peaks of the engine's counters while the timed requests run.
#[derive(Clone, Copy, Debug, Default)]
struct Peaks {
    kv_blocks_used: usize,
    running: usize,
    waiting: usize,
}

impl Peaks {
    fn add(&mut self, s: &EngineStats) {
        self.kv_blocks_used = self.kv_blocks_used.max(s.kv_blocks_total.saturating_sub(s.kv_blocks_free));
        self.running = self.running.max(s.running);
        self.waiting = self.waiting.max(s.waiting);
    }
}

/// Runs `plans` through `engine` (arrivals, concurrency limit), polling its counters.
fn drive(engine: &Engine, plans: &[Plan], max_concurrency: Option<usize>) -> Result<(Vec<Record>, f64, Peaks)> {
    let permits = max_concurrency.map(|c| Permits { free: Mutex::new(c), cv: Condvar::new() });
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let poller = std::thread::Builder::new()
            .name("serve-bench-poll".into())
            .spawn_scoped(s, || {
                let mut peaks = Peaks::default();
                while !stop.load(Ordering::Relaxed) {
                    peaks.add(&engine.stats());
                    std::thread::sleep(POLL);
                }
                peaks.add(&engine.stats());
                peaks
            })
            .context("starting the stats poller")?;
        let mut clients = Vec::with_capacity(plans.len());
        let mut spawn_err = None;
        for (i, p) in plans.iter().enumerate() {
            let due = Duration::from_secs_f64(p.arrival);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
            let permit = permits.as_ref().map(Permits::acquire);
            match std::thread::Builder::new().spawn_scoped(s, move || client(engine, p, t0, permit)) {
                Ok(h) => clients.push((i, h)),
                Err(e) => {
                    spawn_err = Some(anyhow!("starting the client thread of request {i}: {e}"));
                    break;
                }
            }
        }
        let mut records = Vec::with_capacity(clients.len());
        let mut first_err = spawn_err;
        for (i, h) in clients {
            match h.join() {
                Ok(Ok(r)) => records.push(r),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e.context(format!("request {i}")));
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow!("the client thread of request {i} panicked"));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let peaks = poller.join().map_err(|_| anyhow!("the stats poller panicked"))?;
        if let Some(e) = first_err {
            return Err(e);
        }
        let duration = records.iter().map(|r| r.done).fold(0.0, f64::max);
        Ok((records, duration, peaks))
    })
}

/// The engine config of the run: the defaults of [`EngineConfig::for_model`] with the flags
/// applied, the KV pool sized from `--kv-cache-memory`, `--gpu-memory-utilization` (CUDA) or
/// the CPU default; and the KV bytes when a budget was given.
fn engine_config(model: &Model, a: &ServeArgs) -> Result<(EngineConfig, Option<usize>)> {
    let sizes = EngineSizes {
        max_num_seqs: a.max_num_seqs,
        max_num_batched_tokens: a.max_num_batched_tokens,
        kv_cache_memory: a.kv_cache_memory,
        gpu_memory_utilization: a.gpu_memory_utilization,
        state_checkpoints: a.state_checkpoints,
        prefix_caching: !a.no_enable_prefix_caching,
    };
    sized_engine_config(model, &sizes)
}

pub use crate::engine_sizes::{sized_engine_config, EngineSizes};

/// Flag checks that need no model (run before it is built or loaded; [`run`] repeats them).
///
/// # Errors
/// A zero count or length, or `--gpu-memory-utilization` for the CPU.
pub fn check_args(a: &ServeArgs, device: Device) -> Result<()> {
    let positive = |flag: &str, v: Option<usize>| match v {
        Some(0) => Err(anyhow!("{flag} 0: must be at least 1")),
        _ => Ok(()),
    };
    positive("--num-requests", Some(a.num_requests))?;
    positive("--max-concurrency", a.max_concurrency)?;
    positive("--max-num-seqs", a.max_num_seqs)?;
    positive("--max-num-batched-tokens", a.max_num_batched_tokens)?;
    if a.input_len.lo == 0 {
        bail!("--input-len {}: prompts need at least 1 token", a.input_len);
    }
    if a.output_len.lo == 0 {
        bail!("--output-len {}: requests generate at least 1 token", a.output_len);
    }
    if a.gpu_memory_utilization.is_some() && device == Device::Cpu {
        bail!("--gpu-memory-utilization applies to a CUDA device; on the CPU give --kv-cache-memory BYTES");
    }
    Ok(())
}

/// What the run was about (printed and written to the JSON).
pub struct Setup<'a> {
    /// The `--config` or model folder.
    pub label: &'a str,
    /// Where the weights come from (say "random" when they are).
    pub weights: &'a str,
    /// `--json PATH`.
    pub json: Option<&'a Path>,
}

/// `porter bench --serve` over `model` (see the module docs).
///
/// # Errors
/// Bad flags (zero counts, lengths beyond the context or the KV pool, a memory budget that
/// leaves no KV cache), an engine that cannot start, or a request that fails or does not
/// generate exactly its output length.
pub fn run(model: Model, a: &ServeArgs, setup: &Setup<'_>) -> Result<()> {
    check_args(a, model.info.device)?;
    let ctx = crate::checks::context(&model);
    let longest = a.input_len.hi.saturating_add(a.output_len.hi);
    if longest > ctx {
        bail!(
            "--input-len {} plus --output-len {} reach {longest} positions, beyond the model's context of \
             max_position_embeddings = {ctx}",
            a.input_len,
            a.output_len
        );
    }
    let (cfg, kv_bytes) = engine_config(&model, a)?;
    let kv_per_token = model.kv_bytes_per_token();
    let capacity = cfg.num_blocks.saturating_mul(cfg.block_size);
    if kv_per_token > 0 && longest > capacity {
        bail!(
            "--input-len {} plus --output-len {} reach {longest} positions, more than the whole KV cache holds \
             ({} blocks of {} = {capacity} positions); give it more memory (--kv-cache-memory / \
             --gpu-memory-utilization)",
            a.input_len,
            a.output_len,
            cfg.num_blocks,
            cfg.block_size
        );
    }
    let (info, device) = (model.info.clone(), model.info.device);
    let rate = a.request_rate.unwrap_or(f64::INFINITY);
    let plans = make_requests(a.num_requests, a.input_len, a.output_len, info.vocab_size, rate, a.seed);
    // Warm-up prompts from another stream, so they share no prefix with the timed ones.
    let warm = make_requests(a.warmup, a.input_len, a.output_len, info.vocab_size, f64::INFINITY, !a.seed);
    println!(
        "serve bench {}: {} layers, {}, {device}; weights: {}; prompts: random token ids; greedy, ignore_eos",
        setup.label, info.num_layers, info.dtype, setup.weights
    );
    let engine = Engine::start(model, cfg)?;
    if !warm.is_empty() {
        drive(&engine, &warm, None).context("warm-up")?;
    }
    let s0 = engine.stats();
    let (records, duration, peaks) = drive(&engine, &plans, a.max_concurrency)?;
    let s1 = engine.stats();
    engine.shutdown();
    let sum = Summary::of(&records, duration);
    let steps = s1.steps - s0.steps;
    let batched = s1.batched_tokens - s0.batched_tokens;
    let mean_batch = batched as f64 / steps.max(1) as f64;
    let preemptions = s1.preemptions - s0.preemptions;
    let hit = s1.prefix_hit_tokens - s0.prefix_hit_tokens;
    let rate_s = if rate.is_finite() { format!("{rate}") } else { "inf".into() };
    let conc = a.max_concurrency.map_or("none".into(), |c| c.to_string());
    let kv_mib = (cfg.num_blocks * cfg.block_size * kv_per_token) as f64 / (1 << 20) as f64;
    println!(
        "engine: max_num_seqs {}, max_num_batched_tokens {}, KV {} blocks x {} positions ({kv_mib:.1} MiB), {} state slots",
        cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.num_blocks, cfg.block_size, s1.state_slots_total
    );
    println!(
        "requests: {} (+{} warm-up, excluded), input {}, output {}, rate {rate_s} req/s, max concurrency {conc}, seed {}",
        a.num_requests, a.warmup, a.input_len, a.output_len, a.seed
    );
    print_table(
        &sum,
        &[
            ("Peak KV blocks used", format!("{} / {}", peaks.kv_blocks_used, s1.kv_blocks_total)),
            ("Peak running / waiting", format!("{} / {}", peaks.running, peaks.waiting)),
            ("Preemptions", preemptions.to_string()),
            ("Engine steps", steps.to_string()),
            ("Mean batch (rows per step)", format!("{mean_batch:.2}")),
            ("Prefix-cache hit tokens", hit.to_string()),
        ],
    );
    if let Some(p) = setup.json {
        let reqs: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                serde_json::json!({"input_len": r.input_len, "output_len": r.output_len, "arrival_s": r.arrival,
                    "sent_s": r.sent, "first_token_s": r.tokens.first(), "done_s": r.done,
                    "preemptions": r.preemptions})
            })
            .collect();
        let result = serde_json::json!({
            "kind": "serve", "num_requests": a.num_requests, "completed": sum.completed, "warmup": a.warmup,
            "input_len": [a.input_len.lo, a.input_len.hi], "output_len": [a.output_len.lo, a.output_len.hi],
            "request_rate": if rate.is_finite() { serde_json::json!(rate) } else { serde_json::json!("inf") },
            "max_concurrency": a.max_concurrency, "seed": a.seed,
            "duration_s": sum.duration, "total_input_tokens": sum.input_tokens,
            "total_output_tokens": sum.output_tokens, "request_throughput": sum.request_throughput,
            "output_tokens_per_s": sum.output_throughput, "total_tokens_per_s": sum.total_throughput,
            "ttft_ms": sum.ttft.json(), "itl_ms": sum.itl.json(), "tpot_ms": sum.tpot.json(),
            "e2el_ms": sum.e2el.json(), "queue_wait_ms_mean": sum.queue_wait_mean,
            "peak_kv_blocks_used": peaks.kv_blocks_used, "kv_blocks_total": s1.kv_blocks_total,
            "block_size": cfg.block_size, "kv_cache_bytes": kv_bytes, "peak_running": peaks.running,
            "peak_waiting": peaks.waiting, "state_slots_total": s1.state_slots_total,
            "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "preemptions": preemptions, "steps": steps, "batched_tokens": batched, "mean_batch_size": mean_batch,
            "prefix_hit_tokens": hit,
        });
        let v = serde_json::json!({"model": setup.label, "layers": info.num_layers, "dtype": info.dtype.to_string(),
            "device": device.to_string(), "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "weights": setup.weights, "prompts": "random token ids", "sampling": "greedy, ignore_eos",
            "results": [result], "requests": reqs});
        std::fs::write(p, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The human table (vLLM's `benchmark_serving.py` layout) and the engine's rows.
fn print_table(s: &Summary, engine_rows: &[(&str, String)]) {
    let line = |k: &str, v: String| println!("{k:<40}{v:>12}");
    let head = |t: &str| println!("{:-^52}", t);
    println!("{:=^52}", " Serving Benchmark Result ");
    line("Successful requests:", s.completed.to_string());
    line("Benchmark duration (s):", format!("{:.2}", s.duration));
    line("Total input tokens:", s.input_tokens.to_string());
    line("Total generated tokens:", s.output_tokens.to_string());
    line("Request throughput (req/s):", format!("{:.2}", s.request_throughput));
    line("Output token throughput (tok/s):", format!("{:.2}", s.output_throughput));
    line("Total token throughput (tok/s):", format!("{:.2}", s.total_throughput));
    line("Mean delay from due to sent (ms):", format!("{:.2}", s.queue_wait_mean));
    for (title, name, st) in [
        ("Time to First Token", "TTFT", s.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", s.tpot),
        ("Inter-token Latency", "ITL", s.itl),
        ("End-to-end Latency", "E2EL", s.e2el),
    ] {
        head(title);
        line(&format!("Mean {name} (ms):"), format!("{:.2}", st.mean));
        line(&format!("Median {name} (ms):"), format!("{:.2}", st.p50));
        line(&format!("P99 {name} (ms):"), format!("{:.2}", st.p99));
    }
    head("Engine");
    for (k, v) in engine_rows {
        line(&format!("{k}:"), v.clone());
    }
    println!("{}", "=".repeat(52));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_matches_numpy_linear() {
        // numpy: np.percentile([1, 2, 3, 4], [50, 99, 25]) = [2.5, 3.97, 1.75];
        // np.percentile([10, 7, 4, 3, 2, 1], 50) = 3.5 (numpy's documented example).
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&v, 25.0), 1.75);
        let s = Stat::of(&[10.0, 7.0, 4.0, 3.0, 2.0, 1.0]);
        assert_eq!(s.p50, 3.5);
        assert!((s.mean - 27.0 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn summary_of_two_requests() {
        let a = Record {
            input_len: 3,
            output_len: 3,
            arrival: 0.0,
            sent: 0.0,
            tokens: vec![0.1, 0.3, 0.4],
            done: 0.4,
            preemptions: 0,
        };
        let b = Record {
            input_len: 5,
            output_len: 1,
            arrival: 0.2,
            sent: 0.5,
            tokens: vec![0.7],
            done: 0.7,
            preemptions: 0,
        };
        let s = Summary::of(&[a, b], 1.0);
        assert_eq!((s.completed, s.input_tokens, s.output_tokens), (2, 8, 4));
        assert!((s.ttft.mean - 150.0).abs() < 1e-9); // (100 + 200) / 2 ms
        assert!((s.itl.mean - 150.0).abs() < 1e-9); // gaps 200, 100 ms
        assert!((s.tpot.mean - 150.0).abs() < 1e-9); // only a: 300 ms / 2
        assert!((s.e2el.p50 - 300.0).abs() < 1e-9); // 400, 200 ms
        assert!((s.queue_wait_mean - 150.0).abs() < 1e-9); // 0, 300 ms
        assert!((s.total_throughput - 12.0).abs() < 1e-12);
    }

    #[test]
    fn ranges_rates_and_bytes_parse() {
        assert_eq!("4:20".parse::<LenRange>(), Ok(LenRange { lo: 4, hi: 20 }));
        assert_eq!("7".parse::<LenRange>(), Ok(LenRange { lo: 7, hi: 7 }));
        assert!("9:3".parse::<LenRange>().unwrap_err().contains("empty"));
        assert!("x".parse::<LenRange>().is_err());
        assert_eq!(parse_rate("inf"), Ok(f64::INFINITY));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        for bad in ["0", "-1", "nan", "abc"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("0").is_err() && parse_bytes("3 parsecs").is_err());
        assert!(parse_fraction("0").is_err() && parse_fraction("1.5").is_err());
    }

    #[test]
    fn requests_follow_the_ranges_and_the_seed() {
        let r = LenRange { lo: 4, hi: 20 };
        let a = make_requests(200, r, LenRange { lo: 2, hi: 6 }, 100, 10.0, 7);
        let b = make_requests(200, r, LenRange { lo: 2, hi: 6 }, 100, 10.0, 7);
        assert!(a.iter().zip(&b).all(|(x, y)| x.prompt == y.prompt && x.arrival == y.arrival));
        assert!(a.iter().all(|p| (4..=20).contains(&p.prompt.len()) && (2..=6).contains(&p.output_len)));
        assert!(a.iter().flat_map(|p| &p.prompt).all(|&t| t < 100));
        // Both ends of each range are drawn.
        assert!(a.iter().any(|p| p.prompt.len() == 4) && a.iter().any(|p| p.prompt.len() == 20));
        assert!(a.windows(2).all(|w| w[1].arrival >= w[0].arrival));
        // Mean gap of a Poisson process at 10 req/s: 0.1 s (199 gaps; loose bound).
        let mean_gap = a[199].arrival / 199.0;
        assert!((0.07..0.13).contains(&mean_gap), "{mean_gap}");
        // The rate only moves the arrivals.
        let c = make_requests(200, r, LenRange { lo: 2, hi: 6 }, 100, f64::INFINITY, 7);
        assert!(c.iter().zip(&a).all(|(x, y)| x.prompt == y.prompt && x.output_len == y.output_len));
        assert!(c.iter().all(|p| p.arrival == 0.0));
    }
}
