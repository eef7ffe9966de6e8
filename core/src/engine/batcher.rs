//! The engine core: owns the model and its paged cache, runs continuous-batching steps.
//!
//! Each [`EngineCore::step`] asks the [`Scheduler`] for a plan (who runs, how many rows),
//! lays the rows out in one [`Batch`] (prefill chunks and decode rows together), runs one
//! forward, samples the next token of every request whose rows reached its last known token
//! (each with its own sampler: a seeded request reproduces whatever else runs), applies the
//! stopping rules and registers full blocks in the prefix cache. Synchronous and
//! single-threaded; [`crate::engine::handle::Engine`] runs it on its own thread.

use crate::backend::cuda::profile::host_span;
use crate::bail;
use crate::batch::Batch;
use crate::engine::generate::FinishReason;
use crate::engine::request::{EngineStats, Event, Finish, Finished, RequestId, TokenOut};
use crate::engine::sampling::{SamplingParams, SeqSampler};
use crate::engine::scheduler::{SchedConfig, SchedSeq, Scheduler};
use crate::engine::speculative::MtpMode;
use crate::error::Result;
use crate::model::draft::DraftHead;
use crate::model::Model;
use crate::state::{CacheConfig, ModelCache, SeqId, StateCache};
use std::collections::HashMap;
use std::ops::Deref;

mod drafting;

/// Chunk of the chunked delta rule (prefill chunks of recurrent models align to it).
const DELTA_CHUNK: usize = 64;

/// Spans of at most this many rows take the CUDA attention kernels' decode path (keys split
/// at fixed positions); longer spans the prefill path. A row's bits depend on the path, so
/// the scheduler never moves a row from one to the other (see `SchedConfig::decode_rows`).
const DECODE_ROWS: usize = 8;

/// The most rows of one prefill piece of a request with prompt log-probabilities: every row's
/// logits come to the host (`rows × vocab` f32: 600 MB at 151k ids).
pub const PROMPT_LOGPROBS_ROWS: usize = 1024;

/// Engine limits and pool sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Rows per forward (prefill chunks + decode rows).
    pub max_num_batched_tokens: usize,
    /// Requests running at once (state slots).
    pub max_num_seqs: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// KV blocks in the pool.
    pub num_blocks: usize,
    /// What the KV pools store K and V as (`auto`: the model dtype).
    pub kv_dtype: crate::state::KvDtype,
    /// Recurrent-state checkpoints of a hybrid model's prefix cache (0: no prefix caching for
    /// models with recurrent layers; see [`CacheConfig::checkpoints`]).
    pub state_checkpoints: usize,
    /// Positions between the checkpoints saved inside one prefill span
    /// ([`CacheConfig::checkpoint_stride`]).
    pub checkpoint_stride: usize,
    /// Whether prompts reuse the KV blocks (and a hybrid's state checkpoints) of earlier ones.
    pub prefix_caching: bool,
    /// vLLM's `--scheduling-policy priority`: requests run in order of their
    /// [`SamplingParams::priority`](crate::engine::SamplingParams::priority) (lower first), then of arrival, and
    /// preemption takes the lowest priority first; off: first come, first served.
    pub priority_scheduling: bool,
}

impl EngineConfig {
    /// Defaults sized for `model`: on the CPU 8 sequences, a budget of 512 rows and room for
    /// every sequence's whole context (host blocks are allocated when first written); on a
    /// GPU, 64 sequences, 8192 rows (vLLM's API-server default on large GPUs; on the H200 it
    /// brings the TTFT p99 of a burst of 32 1k-token prompts under 1 s, docs/benchmarks.md) and
    /// as many blocks as `kv_cache_bytes` hold. A hybrid model keeps recurrent-state
    /// checkpoints for its prefix cache: on the CPU 8 per sequence, saved every 64 positions
    /// (host memory, allocated when written); on a GPU 2 per sequence, saved every
    /// [`GPU_CHECKPOINT_STRIDE`](crate::state::GPU_CHECKPOINT_STRIDE) positions (allocated
    /// up front: `porter serve` sizes them from memory).
    pub fn for_model(model: &Model, kv_cache_bytes: Option<usize>) -> Self {
        // Hybrid models: blocks as long as the recurrent checkpoint interval, so a prefix-cache
        // hit is within one block of the shared prefix.
        let recurrent = model.layers.iter().any(|l| matches!(l.kind(), crate::state::LayerKind::Recurrent { .. }));
        let block_size = if recurrent { crate::state::CHECKPOINT_INTERVAL } else { crate::state::DEFAULT_BLOCK_SIZE };
        let (max_num_seqs, max_num_batched_tokens) = match model.info.device {
            crate::tensor::Device::Cpu => (8, 512),
            crate::tensor::Device::Cuda(_) => (64, 8192),
        };
        let kv_dtype = model.info.kv_cache_dtype;
        let per_block = (model.kv_bytes_per_token_as(kv_dtype) * block_size).max(1);
        let num_blocks = match kv_cache_bytes {
            Some(b) => b / per_block,
            None => CacheConfig::for_tokens(max_num_seqs, 0, model.default_cache_tokens()).num_blocks,
        };
        let (state_checkpoints, checkpoint_stride) = Self::default_checkpoints(model, max_num_seqs);
        Self {
            max_num_batched_tokens,
            max_num_seqs,
            block_size,
            num_blocks,
            kv_dtype,
            state_checkpoints,
            checkpoint_stride,
            prefix_caching: true,
            priority_scheduling: false,
        }
    }

    /// The default recurrent-state checkpoints of `model`'s prefix cache for `max_num_seqs`
    /// sequences and the stride they are saved at (see [`EngineConfig::for_model`]): none
    /// without recurrent layers.
    pub fn default_checkpoints(model: &Model, max_num_seqs: usize) -> (usize, usize) {
        let recurrent = model.checkpoint_bytes(0) > 0;
        match (recurrent, model.info.device) {
            (false, _) => (0, crate::state::CHECKPOINT_INTERVAL),
            (true, crate::tensor::Device::Cpu) => (8 * max_num_seqs, crate::state::CHECKPOINT_INTERVAL),
            (true, crate::tensor::Device::Cuda(_)) => (2 * max_num_seqs, crate::state::GPU_CHECKPOINT_STRIDE),
        }
    }
}

/// One request inside the engine.
struct Live {
    sampler: SeqSampler,
    prompt_len: usize,
    generated: usize,
    /// The request's end: its `max_tokens` (at most what the context and the pool hold).
    max_tokens: usize,
    /// The request's slot in each draft cache (speculative decoding), while admitted.
    dseqs: Vec<SeqId>,
    /// Draft tokens to verify next step and the distributions they were drawn from.
    proposal: Vec<u32>,
    dists: Vec<Vec<f32>>,
    drafted: usize,
    accepted: usize,
    /// When the request arrived, and how long it waited for its first scheduling.
    arrived: std::time::Instant,
    queued: Option<std::time::Duration>,
    /// Prompt log-probabilities: the top-N asked for, each prompt position's report, and
    /// whether they were sent (a preempted request's recomputed prompt sends none again).
    prompt_lp: Option<(usize, Vec<Option<crate::engine::PromptToken>>, bool)>,
}

/// Speculative decoding inside the batch: MTP draft heads and how they are chained.
pub struct SpecConfig {
    pub drafts: Vec<Box<dyn DraftHead>>,
    /// Draft tokens per step.
    pub k: usize,
    pub mode: MtpMode,
}

struct Drafting {
    spec: SpecConfig,
    caches: Vec<ModelCache>,
}

/// One request's share of a step's draft work: the draft catches up over the main rows
/// `hid_start..hid_start + ids.len()` (tokens `ids` at positions `pos0..`), then, when
/// `propose`, drafts K tokens.
struct CatchUp {
    id: RequestId,
    pos0: usize,
    ids: Vec<u32>,
    hid_start: usize,
    propose: bool,
}

/// The synchronous engine (see the module docs), over an owned (`Box<Model>`, `Arc<Model>`)
/// or borrowed (`&Model`) model.
pub struct EngineCore<M: Deref<Target = Model>> {
    model: M,
    cache: ModelCache,
    sched: Scheduler,
    seqs: HashMap<RequestId, SchedSeq>,
    live: HashMap<RequestId, Live>,
    stats: EngineStats,
    eos: Vec<u32>,
    ctx: usize,
    capacity_tokens: usize,
    drafting: Option<Drafting>,
    /// Requests added so far (each one's arrival order).
    arrivals: u64,
}

impl<M: Deref<Target = Model>> EngineCore<M> {
    /// An engine over `model` with the pools `cfg` describes (allocated now on a GPU).
    ///
    /// # Errors
    /// A config that cannot make progress (zero sizes; a budget below `max_num_seqs` plus one
    /// aligned chunk for recurrent models), or a device allocation error.
    pub fn new(model: M, cfg: EngineConfig) -> Result<Self> {
        Self::with_spec(model, cfg, None)
    }

    /// [`EngineCore::new`] with speculative decoding: every request drafts `spec.k` tokens
    /// per step with the draft heads, one verify forward covers every sequence, and each
    /// keeps its own accepted prefix and rolls its own KV and recurrent state back.
    pub fn with_spec(model: M, cfg: EngineConfig, spec: Option<SpecConfig>) -> Result<Self> {
        if let Some(sp) = &spec {
            crate::engine::speculative::check_config(&sp.drafts, sp.k, sp.mode)?;
        }
        let k = spec.as_ref().map_or(0, |s| s.k);
        if cfg.max_num_seqs == 0 || cfg.max_num_batched_tokens == 0 || cfg.block_size == 0 {
            bail!(Input, "engine sizes must be > 0: {cfg:?}");
        }
        let cache_cfg = CacheConfig {
            max_seqs: cfg.max_num_seqs,
            spec: k,
            block_size: cfg.block_size,
            num_blocks: cfg.num_blocks,
            kv_dtype: cfg.kv_dtype,
            checkpoints: cfg.state_checkpoints,
            checkpoint_stride: cfg.checkpoint_stride,
        };
        let mut cache = model.new_cache_with(&cache_cfg)?;
        if !cfg.prefix_caching {
            cache.disable_prefix_caching();
        }
        // Warm-up: the decode (and verify) graphs of every batch-size bucket, for contexts of
        // up to 16 blocks (longer ones are captured when first reached).
        let rows: &[usize] = if k > 0 { &[1, k + 1] } else { &[1] };
        let buckets = crate::backend::cuda::graph::span_buckets(cfg.max_num_seqs);
        let shapes: Vec<(usize, usize)> = rows.iter().flat_map(|&r| buckets.iter().map(move |&b| (b, r))).collect();
        model.capture_graphs(&mut cache, &shapes, 0, &mut crate::backend::cuda::graph::report_progress)?;
        let drafting = match spec {
            Some(spec) => {
                let dcfg = CacheConfig { spec: 0, ..cache_cfg };
                let caches = spec.drafts.iter().map(|d| d.new_cache(&dcfg)).collect::<Result<Vec<_>>>()?;
                Some(Drafting { spec, caches })
            }
            None => None,
        };
        if cache.has_kv() && cfg.num_blocks == 0 {
            bail!(Input, "the KV cache has 0 blocks: give it more memory");
        }
        let align = if cache.has_recurrent() { DELTA_CHUNK } else { 1 };
        let min_budget = cfg.max_num_seqs * (1 + k) + if align > 1 { align } else { 0 };
        if cfg.max_num_batched_tokens < min_budget {
            bail!(
                Input,
                "max_num_batched_tokens = {} is too small: it needs at least {min_budget} (one decode row{} per running \
                 request{})",
                cfg.max_num_batched_tokens,
                if k > 0 { format!(" plus {k} draft rows") } else { String::new() },
                if align > 1 { format!(" plus one aligned prefill chunk of {align}") } else { String::new() }
            );
        }
        let sched = Scheduler::new(SchedConfig {
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            max_num_seqs: cfg.max_num_seqs,
            align,
            // A final prefill piece of at most `k + 1` tokens would take the per-token
            // (snapshot) delta rule instead of the chunked one.
            align_tail: k + 1,
            decode_rows: DECODE_ROWS,
            // Generated tokens recomputed after a preemption: one per step through the
            // recurrent layers (the per-token delta rule they were first computed with),
            // decode-sized pieces otherwise.
            replay_piece: if align > 1 { 1 } else { DECODE_ROWS },
            priority: cfg.priority_scheduling,
        });
        let g = &model.info.generation;
        let eos = g.eos_token_ids.clone();
        let ctx = model.info.max_position_embeddings.unwrap_or(usize::MAX);
        let capacity_tokens = if cache.has_kv() { cfg.num_blocks * cfg.block_size } else { usize::MAX };
        let stats = EngineStats {
            kv_blocks_total: cache.blocks().total,
            spec_accepted_at: vec![0; k],
            block_size: cfg.block_size,
            state_slots_total: cfg.max_num_seqs,
            state_checkpoints_total: cache.checkpoints().0,
            ..Default::default()
        };
        let mut e = Self {
            model,
            cache,
            sched,
            seqs: HashMap::new(),
            live: HashMap::new(),
            stats,
            eos,
            ctx,
            capacity_tokens,
            drafting,
            arrivals: 0,
        };
        e.refresh_stats();
        Ok(e)
    }

    /// Replaces the model's end-of-sequence ids (config.json and generation_config.json)
    /// for the requests added from now on.
    pub fn set_eos(&mut self, eos: Vec<u32>) {
        self.eos = eos;
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.live.is_empty()
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        self.stats.clone()
    }

    fn refresh_stats(&mut self) {
        let b = self.cache.blocks();
        self.stats.running = self.sched.running.len();
        self.stats.waiting = self.sched.waiting.len();
        self.stats.kv_blocks_free = b.free;
        self.stats.kv_blocks_cached = b.cached;
        self.stats.state_slots_free = self.cache.free_slots();
        self.stats.state_checkpoints_cached = self.cache.checkpoints_cached();
    }

    /// Admits a request (queued; it runs from the next step).
    ///
    /// # Errors
    /// Bad parameters, an empty prompt, ids outside the vocabulary, a request that needs
    /// more positions than the context or the whole KV pool holds, or a duplicate id.
    pub fn add_request(&mut self, id: RequestId, prompt: Vec<u32>, params: SamplingParams) -> Result<()> {
        let vocab = self.model.info.vocab_size;
        crate::engine::request::validate(&params, vocab)?;
        if self.live.contains_key(&id) {
            bail!(Input, "request id {id} is already in use");
        }
        if prompt.is_empty() {
            bail!(Input, "the prompt is empty: at least one token id is needed");
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            bail!(Input, "token id {bad} is out of range: the vocabulary has {vocab} entries");
        }
        let k = self.drafting.as_ref().map_or(0, |d| d.spec.k);
        // Without max_tokens a request runs until the context or the whole pool is full.
        let room = self.ctx.min(self.capacity_tokens).saturating_sub(prompt.len() + k);
        let max_tokens = params.stop.max_tokens.unwrap_or(room.max(1));
        let need = prompt.len().saturating_add(max_tokens).saturating_add(k);
        if prompt.len() >= self.ctx {
            bail!(Input, "the prompt ({} tokens) does not fit the context of {} positions", prompt.len(), self.ctx);
        }
        if need > self.capacity_tokens {
            bail!(
                Input,
                "the prompt ({} tokens) plus max_tokens = {} need {need} KV positions, more than the whole KV cache \
                 holds ({} positions); lower max_tokens or give the cache more memory",
                prompt.len(),
                max_tokens,
                self.capacity_tokens
            );
        }
        if params.priority != 0 && !self.sched.cfg.priority {
            bail!(
                Input,
                "`priority` = {} needs priority scheduling (porter serve --scheduling-policy priority); requests are \
                 served first come, first served",
                params.priority
            );
        }
        let (salt, priority) = (params.cache_salt, params.priority);
        let prompt_lp = params.prompt_logprobs.map(|n| (n, vec![None; prompt.len()], false));
        let max_rows = if prompt_lp.is_some() { PROMPT_LOGPROBS_ROWS } else { usize::MAX };
        let mut sampler = SeqSampler::new(params)?;
        sampler.observe_prompt(&prompt);
        let prompt_len = prompt.len();
        let r = SchedSeq {
            tokens: prompt,
            computed: 0,
            seq: None,
            cached: 0,
            prompt_len,
            preemptions: 0,
            lookahead: 0,
            salt,
            max_rows,
            priority,
            arrival: self.arrivals,
        };
        self.arrivals += 1;
        self.seqs.insert(id, r);
        let live = Live {
            sampler,
            prompt_len,
            generated: 0,
            max_tokens,
            dseqs: Vec::new(),
            proposal: Vec::new(),
            dists: Vec::new(),
            drafted: 0,
            accepted: 0,
            arrived: std::time::Instant::now(),
            queued: None,
            prompt_lp,
        };
        self.live.insert(id, live);
        self.sched.enqueue(id, &self.seqs);
        self.refresh_stats();
        Ok(())
    }

    /// Aborts a request (waiting or running); its slot and blocks are freed now. Returns its
    /// final event, or `None` when the id is unknown (already finished).
    pub fn abort(&mut self, id: RequestId) -> Result<Option<Event>> {
        if !self.live.contains_key(&id) {
            return Ok(None);
        }
        let ev = self.finish(id, Finish::Abort)?;
        self.stats.aborted += 1;
        Ok(Some(ev))
    }

    fn finish(&mut self, id: RequestId, reason: Finish) -> Result<Event> {
        let (cached, preemptions) = self.seqs.get(&id).map_or((0, 0), |s| (s.cached, s.preemptions));
        self.sched.remove(id, &mut self.seqs, &mut self.cache)?;
        self.drop_drafts(id)?;
        let l = self.live.remove(&id);
        self.stats.finished += 1;
        self.refresh_stats();
        Ok(Event::Done(Finished {
            reason,
            prompt_tokens: l.as_ref().map_or(0, |l| l.prompt_len),
            completion_tokens: l.as_ref().map_or(0, |l| l.generated),
            cached_tokens: cached,
            preemptions,
            drafted: l.as_ref().map_or(0, |l| l.drafted),
            accepted: l.as_ref().map_or(0, |l| l.accepted),
            queue_time: l
                .as_ref()
                .map_or(std::time::Duration::ZERO, |l| l.queued.unwrap_or_else(|| l.arrived.elapsed())),
        }))
    }

    /// Frees a request's draft-cache slots and its pending proposal.
    fn drop_drafts(&mut self, id: RequestId) -> Result<()> {
        let (Some(d), Some(l)) = (self.drafting.as_mut(), self.live.get_mut(&id)) else { return Ok(()) };
        for (c, s) in d.caches.iter_mut().zip(l.dseqs.drain(..)) {
            c.free_seq(s)?;
        }
        l.proposal.clear();
        l.dists.clear();
        Ok(())
    }

    /// Runs one step; returns the events it produced, in order.
    ///
    /// # Errors
    /// A model or device error. The requests of the failed step are then finished with an
    /// [`Event::Error`] each (returned by [`EngineCore::fail_running`]), never left hanging.
    pub fn step(&mut self) -> Result<Vec<(RequestId, Event)>> {
        let span = host_span("engine: schedule + batch");
        let plan = self.sched.schedule(&mut self.seqs, &mut self.cache)?;
        self.stats.preemptions += plan.preempted.len() as u64;
        for &(id, asked, hit) in &plan.admitted {
            self.stats.prefix_query_tokens += asked as u64;
            self.stats.prefix_hit_tokens += hit.cached as u64;
            self.stats.prefix_unresumed_tokens += (hit.matched - hit.cached) as u64;
            if let Some(l) = self.live.get_mut(&id) {
                l.queued.get_or_insert_with(|| l.arrived.elapsed());
            }
        }
        for &id in &plan.preempted {
            self.drop_drafts(id)?;
        }
        let mut out = Vec::new();
        if plan.items.is_empty() {
            self.refresh_stats();
            return Ok(out);
        }
        // [T] rows: each request's next known tokens, then its draft tokens to verify.
        let mut batch = Batch::default();
        // Rows that need logits: every row of a verify span, the last row of a span that
        // reaches the request's last known token; none for a prefill chunk.
        let mut rows = Vec::new();
        let mut first_row = Vec::with_capacity(plan.items.len());
        // Prompt log-probabilities: the span's first row in `rows` (every row of it is there).
        let mut lp_row = Vec::with_capacity(plan.items.len());
        for it in &plan.items {
            let r = &self.seqs[&it.id];
            let seq = r.seq.ok_or_else(|| crate::err!(Internal, "scheduled request {} has no slot", it.id))?;
            let known = it.n - r.lookahead;
            let mut ids = r.tokens[r.computed..r.computed + known].to_vec();
            if r.lookahead > 0 {
                ids.extend_from_slice(&self.live[&it.id].proposal);
            }
            let start = batch.len();
            let lp = self.live[&it.id].prompt_lp.as_ref().is_some_and(|p| !p.2) && r.computed < r.prompt_len;
            if lp {
                // Every row; the last one is also the sampled row when the span ends the prompt.
                lp_row.push(Some(rows.len()));
                rows.extend(start..start + it.n);
                first_row.push(rows.len() - 1);
            } else {
                lp_row.push(None);
                first_row.push(rows.len());
                if r.lookahead > 0 {
                    rows.extend(start..start + it.n);
                } else if r.computed + it.n == r.tokens.len() {
                    rows.push(start + it.n - 1);
                }
            }
            batch.push(seq, r.computed, &ids);
        }
        drop(span);
        let span = host_span("engine: forward (issue)");
        let fwd = self.model.forward_rows(&batch, &mut self.cache, &rows)?;
        drop(span);
        let span = host_span("engine: sample (wait)");
        self.stats.steps += 1;
        self.stats.batched_tokens += batch.len() as u64;
        let eos = self.eos.clone();
        // On a GPU, a decode row whose request needs only temperature / top-k / top-p is
        // sampled on the device (only its id comes back); the [R, vocab] logits come to the
        // host only when some row needs them (penalties, logprobs, min_tokens, the verification
        // of a request that is not plain greedy).
        let mut dev_tok: Vec<Option<u32>> = vec![None; plan.items.len()];
        // A plain greedy request's verify: the argmaxes of its K + 1 rows, from the device.
        let mut dev_verify: Vec<Option<Vec<u32>>> = vec![None; plan.items.len()];
        let mut need_host = !fwd.logits.is_cuda() || lp_row.iter().any(Option::is_some);
        if !need_host {
            let vocab = fwd.logits.last_dim();
            let mut params = vec![[0.0f32; 4]; rows.len()];
            // Items sampled on the device, and verified there.
            let mut on_dev = Vec::new();
            let mut verify_dev = Vec::new();
            for (i, it) in plan.items.iter().enumerate() {
                let r = &self.seqs[&it.id];
                if r.lookahead > 0 {
                    let l = &self.live[&it.id];
                    if (0..=r.lookahead).all(|j| l.sampler.greedy_plain(l.generated + j)) {
                        // Greedy rows already: the parameters' default is temperature 0.
                        verify_dev.push(i);
                    } else {
                        need_host = true;
                    }
                } else if r.computed + it.n == r.tokens.len() {
                    let l =
                        self.live.get_mut(&it.id).ok_or_else(|| crate::err!(Internal, "request {} vanished", it.id))?;
                    match l.sampler.device_params(l.generated, vocab) {
                        Some(p) => {
                            params[first_row[i]] = p;
                            on_dev.push(i);
                        }
                        None => need_host = true,
                    }
                }
            }
            if !on_dev.is_empty() || !verify_dev.is_empty() {
                // Rows sampled on the host get greedy parameters here; their ids are unused.
                let ids = crate::backend::cuda::blocks::sample_rows(&fwd.logits, &params)?;
                for i in on_dev {
                    let id = ids.get(first_row[i]).copied();
                    dev_tok[i] = Some(id.ok_or_else(|| crate::err!(Internal, "the device sampler returned no id"))?);
                }
                for i in verify_dev {
                    let k = self.seqs[&plan.items[i].id].lookahead;
                    let got = ids.get(first_row[i]..first_row[i] + k + 1);
                    dev_verify[i] =
                        Some(got.ok_or_else(|| crate::err!(Internal, "the device sampler returned no ids"))?.to_vec());
                }
            }
        }
        // [R, vocab] logits of the selected rows, on the host when a row needs them.
        let logits = if need_host { Some(fwd.logits.to_host()?) } else { None };
        drop(span);
        let _span = host_span("engine: tokens + events");
        let spec_k = self.drafting.as_ref().map_or(0, |d| d.spec.k);
        let mut catchups = Vec::new();
        for (i, it) in plan.items.iter().enumerate() {
            let span = batch.spans[i];
            let r = self.seqs.get_mut(&it.id).ok_or_else(|| crate::err!(Internal, "request {} vanished", it.id))?;
            let l = self.live.get_mut(&it.id).ok_or_else(|| crate::err!(Internal, "request {} vanished", it.id))?;
            let seq = span.seq;
            let pos0 = r.computed;
            if let (Some(base), Some((n_top, lps, sent))) = (lp_row[i], l.prompt_lp.as_mut()) {
                // Row j predicts token pos0 + j + 1: its raw log-probability, while in the prompt.
                let host = logits.as_ref().ok_or_else(|| crate::err!(Internal, "prompt logits not on the host"))?;
                for j in 0..it.n {
                    let p = pos0 + j + 1;
                    if p < r.prompt_len {
                        let row = host.row(base + j);
                        lps[p] = Some(crate::engine::sampling::SeqSampler::raw_report(row, r.tokens[p], *n_top)?);
                    }
                }
                if pos0 + it.n >= r.prompt_len {
                    *sent = true;
                    out.push((it.id, Event::Prompt(lps.clone())));
                }
            }
            if r.lookahead == 0 && pos0 + it.n < r.tokens.len() {
                // A prefill chunk: the drafts catch up over it, nothing is sampled.
                r.computed += it.n;
                self.cache.register_prefix(seq, &r.tokens[..r.computed])?;
                let ids = r.tokens[pos0 + 1..=r.computed].to_vec();
                catchups.push(CatchUp { id: it.id, pos0, ids, hid_start: span.start, propose: false });
                continue;
            }
            // The tokens this step emits: a sampled one, or the accepted drafts plus a bonus.
            // Row j is scored with the tokens before it counted (penalties, min_tokens).
            let host = logits.as_ref();
            let lrow = |j: usize| {
                host.map(|h| h.row(first_row[i] + j))
                    .ok_or_else(|| crate::err!(Internal, "row {j} of request {} not on the host", it.id))
            };
            let mut emitted: Vec<crate::engine::sampling::Sampled> = Vec::new();
            if let Some(token) = dev_tok[i] {
                l.sampler.accept(token);
                emitted.push(crate::engine::sampling::Sampled { token, logprob: None, top: Vec::new() });
            } else if r.lookahead == 0 {
                let sd = l.sampler.sample(lrow(0)?, l.generated, &eos)?;
                l.sampler.accept(sd.token);
                emitted.push(sd);
            } else {
                let k = r.lookahead;
                let accepted = if let Some(ids) = &dev_verify[i] {
                    // Plain greedy: accepted exactly while the draft is its row's argmax.
                    let toks = drafting::greedy_verdict(&l.proposal, ids);
                    for &token in &toks {
                        l.sampler.accept(token);
                        emitted.push(crate::engine::sampling::Sampled { token, logprob: None, top: Vec::new() });
                    }
                    toks.len() - 1
                } else {
                    let mut rejected = false;
                    for j in 0..k {
                        let out_len = l.generated + j;
                        let p = l.sampler.probs(lrow(j)?, out_len, &eos)?;
                        let (d, q) = (l.proposal[j], &l.dists[j]);
                        let tok = if drafting::draft_accepted(&mut l.sampler, &p, q, d) {
                            d
                        } else {
                            rejected = true;
                            drafting::resample_rejected(&mut l.sampler, &p, q, d)
                        };
                        emitted.push(l.sampler.report_for(lrow(j)?, out_len, &eos, tok)?);
                        l.sampler.accept(tok);
                        if rejected {
                            break;
                        }
                    }
                    let accepted = emitted.len() - usize::from(rejected);
                    if !rejected {
                        let sd = l.sampler.sample(lrow(k)?, l.generated + k, &eos)?;
                        l.sampler.accept(sd.token);
                        emitted.push(sd);
                    }
                    accepted
                };
                // Drafts are accepted as a prefix: positions 0 .. accepted.
                for a in self.stats.spec_accepted_at.iter_mut().take(accepted) {
                    *a += 1;
                }
                l.drafted += k;
                l.accepted += accepted;
                self.stats.spec_drafted += k as u64;
                self.stats.spec_accepted += accepted as u64;
                self.stats.spec_steps += 1;
            }
            // Main cache: the known token(s) and the accepted drafts stay, the rest rolls back.
            let kept = it.n - r.lookahead + emitted.len() - 1;
            r.computed = pos0 + kept;
            if kept < it.n {
                self.cache.truncate(seq, r.computed)?;
            }
            r.lookahead = 0;
            l.proposal.clear();
            l.dists.clear();
            let mut reason = None;
            for sd in emitted {
                let tok = sd.token;
                r.tokens.push(tok);
                l.generated += 1;
                self.stats.generated_tokens += 1;
                out.push((it.id, Event::Token(TokenOut { id: tok, logprob: sd.logprob, top: sd.top })));
                reason = match l.sampler.params().stop.finish(tok, l.generated, &eos) {
                    Some(FinishReason::Eos) => Some(Finish::Stop),
                    Some(FinishReason::Length) => Some(Finish::Length),
                    None if l.generated >= l.max_tokens
                        || r.tokens.len() >= self.ctx
                        || r.tokens.len() + spec_k >= self.capacity_tokens =>
                    {
                        Some(Finish::Length)
                    }
                    None => None,
                };
                if reason.is_some() {
                    break;
                }
            }
            if reason.is_some() && r.computed >= r.tokens.len() {
                // A stop among the accepted drafts: the drafts after it are not output, so the
                // cache keeps only what the emitted tokens computed (as after any step, the
                // last token's row is not computed).
                r.computed = r.tokens.len() - 1;
                self.cache.truncate(seq, r.computed)?;
            }
            self.cache.register_prefix(seq, &r.tokens[..r.computed])?;
            if let Some(reason) = reason {
                let ev = self.finish(it.id, reason)?;
                out.push((it.id, ev));
                continue;
            }
            if self.drafting.is_some() {
                // The drafts consume tokens pos0+1..=computed (the last one just emitted) with
                // the main hidden rows of positions pos0..computed.
                let ids = r.tokens[pos0 + 1..=r.computed].to_vec();
                let propose = r.tokens.len() + self.drafting.as_ref().map_or(0, |d| d.spec.k) <= self.ctx;
                catchups.push(CatchUp { id: it.id, pos0, ids, hid_start: span.start, propose });
            }
        }
        if !catchups.is_empty() && self.drafting.is_some() {
            self.draft(&fwd.hidden, catchups)?;
        }
        self.refresh_stats();
        Ok(out)
    }

    /// Finishes every live request with an error event (after a failed step) and returns
    /// the events; the engine is empty afterwards.
    pub fn fail_running(&mut self, msg: &str) -> Vec<(RequestId, Event)> {
        let ids: Vec<RequestId> = self.live.keys().copied().collect();
        let mut out = Vec::new();
        for id in ids {
            // Freeing can only fail on a broken device; the request is finished either way.
            let _ = self.sched.remove(id, &mut self.seqs, &mut self.cache);
            let _ = self.drop_drafts(id);
            self.live.remove(&id);
            out.push((id, Event::Error(msg.to_string())));
        }
        self.refresh_stats();
        out
    }

    /// The cache (tests: block and slot accounting).
    pub fn cache(&self) -> &ModelCache {
        &self.cache
    }
}
