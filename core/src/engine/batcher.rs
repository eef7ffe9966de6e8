//! The engine core: owns the model and its paged cache, runs continuous-batching steps.
//!
//! Each [`EngineCore::step`] asks the [`Scheduler`] for a plan (who runs, how many rows),
//! lays the rows out in one [`Batch`] (prefill chunks and decode rows together), runs one
//! forward, samples the next token of every request whose rows reached its last known token
//! (each with its own sampler: a seeded request reproduces whatever else runs), applies the
//! stopping rules and registers full blocks in the prefix cache. Synchronous and
//! single-threaded; [`crate::engine::handle::Engine`] runs it on its own thread.

use crate::bail;
use crate::batch::Batch;
use crate::engine::request::{EngineStats, Event, Finish, Finished, RequestId, RequestParams, TokenOut};
use crate::engine::sampling::Sampler;
use crate::engine::scheduler::{SchedConfig, SchedSeq, Scheduler};
use crate::error::Result;
use crate::model::{LogitsFor, Model};
use crate::state::{CacheConfig, ModelCache};
use std::collections::HashMap;
use std::ops::Deref;

/// Chunk of the chunked delta rule (prefill chunks of recurrent models align to it).
const DELTA_CHUNK: usize = 64;

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
}

impl EngineConfig {
    /// Defaults sized for `model`: on the CPU 8 sequences, a budget of 512 rows and room for
    /// every sequence's whole context (host blocks are allocated when first written); on a
    /// GPU, 64 sequences, 2048 rows and as many blocks as `kv_cache_bytes` hold.
    pub fn for_model(model: &Model, kv_cache_bytes: Option<usize>) -> Self {
        let block_size = crate::state::DEFAULT_BLOCK_SIZE;
        let (max_num_seqs, max_num_batched_tokens) = match model.info.device {
            crate::tensor::Device::Cpu => (8, 512),
            crate::tensor::Device::Cuda(_) => (64, 2048),
        };
        let per_block = (model.kv_bytes_per_token() * block_size).max(1);
        let num_blocks = match kv_cache_bytes {
            Some(b) => b / per_block,
            None => CacheConfig::for_tokens(max_num_seqs, 0, model.default_cache_tokens()).num_blocks,
        };
        Self { max_num_batched_tokens, max_num_seqs, block_size, num_blocks }
    }
}

/// One request inside the engine.
struct Live {
    params: RequestParams,
    sampler: Sampler,
    prompt_len: usize,
    generated: usize,
    stop: Vec<u32>,
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
}

impl<M: Deref<Target = Model>> EngineCore<M> {
    /// An engine over `model` with the pools `cfg` describes (allocated now on a GPU).
    ///
    /// # Errors
    /// A config that cannot make progress (zero sizes; a budget below `max_num_seqs` plus one
    /// aligned chunk for recurrent models), or a device allocation error.
    pub fn new(model: M, cfg: EngineConfig) -> Result<Self> {
        if cfg.max_num_seqs == 0 || cfg.max_num_batched_tokens == 0 || cfg.block_size == 0 {
            bail!(Input, "engine sizes must be > 0: {cfg:?}");
        }
        let cache_cfg =
            CacheConfig { max_seqs: cfg.max_num_seqs, spec: 0, block_size: cfg.block_size, num_blocks: cfg.num_blocks };
        let cache = model.new_cache_with(&cache_cfg)?;
        if cache.has_kv() && cfg.num_blocks == 0 {
            bail!(Input, "the KV cache has 0 blocks: give it more memory");
        }
        let align = if cache.has_recurrent() { DELTA_CHUNK } else { 1 };
        if align > 1 && cfg.max_num_batched_tokens < cfg.max_num_seqs + align {
            bail!(
                Input,
                "max_num_batched_tokens = {} is too small for a model with linear-attention layers: it needs at least \
                 max_num_seqs + {align} = {} (one decode row per running request plus one aligned prefill chunk)",
                cfg.max_num_batched_tokens,
                cfg.max_num_seqs + align
            );
        }
        let sched = Scheduler::new(SchedConfig {
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            max_num_seqs: cfg.max_num_seqs,
            align,
            align_tail: 1,
        });
        let g = &model.info.generation;
        let eos = g.eos_token_ids.clone();
        let ctx = model.info.max_position_embeddings.unwrap_or(usize::MAX);
        let capacity_tokens = if cache.has_kv() { cfg.num_blocks * cfg.block_size } else { usize::MAX };
        let stats = EngineStats {
            kv_blocks_total: cache.blocks().total,
            block_size: cfg.block_size,
            state_slots_total: cfg.max_num_seqs,
            ..Default::default()
        };
        let mut e =
            Self { model, cache, sched, seqs: HashMap::new(), live: HashMap::new(), stats, eos, ctx, capacity_tokens };
        e.refresh_stats();
        Ok(e)
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
    }

    /// Admits a request (queued; it runs from the next step).
    ///
    /// # Errors
    /// Bad parameters, an empty prompt, ids outside the vocabulary, a request that needs
    /// more positions than the context or the whole KV pool holds, or a duplicate id.
    pub fn add_request(&mut self, id: RequestId, prompt: Vec<u32>, params: RequestParams) -> Result<()> {
        let vocab = self.model.info.vocab_size;
        params.validate(vocab)?;
        if self.live.contains_key(&id) {
            bail!(Input, "request id {id} is already in use");
        }
        if prompt.is_empty() {
            bail!(Input, "the prompt is empty: at least one token id is needed");
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            bail!(Input, "token id {bad} is out of range: the vocabulary has {vocab} entries");
        }
        let need = prompt.len().saturating_add(params.max_tokens);
        if prompt.len() >= self.ctx {
            bail!(Input, "the prompt ({} tokens) does not fit the context of {} positions", prompt.len(), self.ctx);
        }
        if need > self.capacity_tokens {
            bail!(
                Input,
                "the prompt ({} tokens) plus max_tokens = {} need {need} KV positions, more than the whole KV cache \
                 holds ({} positions); lower max_tokens or give the cache more memory",
                prompt.len(),
                params.max_tokens,
                self.capacity_tokens
            );
        }
        let sampler = Sampler::new(params.sampling.clone())?;
        let mut stop = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop.extend(self.eos.iter().copied());
        }
        let prompt_len = prompt.len();
        self.seqs.insert(id, SchedSeq { tokens: prompt, computed: 0, seq: None, cached: 0, preemptions: 0 });
        self.live.insert(id, Live { params, sampler, prompt_len, generated: 0, stop });
        self.sched.waiting.push_back(id);
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
        let l = self.live.remove(&id);
        self.stats.finished += 1;
        self.refresh_stats();
        Ok(Event::Done(Finished {
            reason,
            prompt_tokens: l.as_ref().map_or(0, |l| l.prompt_len),
            completion_tokens: l.as_ref().map_or(0, |l| l.generated),
            cached_tokens: cached,
            preemptions,
        }))
    }

    /// Runs one step; returns the events it produced, in order.
    ///
    /// # Errors
    /// A model or device error. The requests of the failed step are then finished with an
    /// [`Event::Error`] each (returned by [`EngineCore::fail_running`]), never left hanging.
    pub fn step(&mut self) -> Result<Vec<(RequestId, Event)>> {
        let plan = self.sched.schedule(&mut self.seqs, &mut self.cache)?;
        self.stats.preemptions += plan.preempted.len() as u64;
        let mut out = Vec::new();
        if plan.items.is_empty() {
            self.refresh_stats();
            return Ok(out);
        }
        // [T] rows: each request's next `n` known tokens.
        let mut batch = Batch::default();
        for it in &plan.items {
            let r = &self.seqs[&it.id];
            let seq = r.seq.ok_or_else(|| crate::err!(Internal, "scheduled request {} has no slot", it.id))?;
            batch.push(seq, r.computed, &r.tokens[r.computed..r.computed + it.n]);
        }
        let fwd = self.model.forward(&batch, &mut self.cache, LogitsFor::Last)?;
        self.stats.steps += 1;
        self.stats.batched_tokens += batch.len() as u64;
        // [S, vocab] logits, one row per span; only rows that end a request's known tokens
        // are sampled (the others are prefill chunks).
        let logits = fwd.logits.to_host()?;
        for (row, it) in plan.items.iter().enumerate() {
            let r = self.seqs.get_mut(&it.id).ok_or_else(|| crate::err!(Internal, "request {} vanished", it.id))?;
            r.computed += it.n;
            let seq = r.seq.ok_or_else(|| crate::err!(Internal, "request {} lost its slot", it.id))?;
            self.cache.register_prefix(seq, &r.tokens[..r.computed])?;
            if r.computed < r.tokens.len() {
                continue;
            }
            let l = self.live.get_mut(&it.id).ok_or_else(|| crate::err!(Internal, "request {} vanished", it.id))?;
            let mut lrow = logits.row(row).to_vec();
            if l.generated < l.params.min_tokens {
                for &s in &l.stop {
                    if let Some(v) = lrow.get_mut(s as usize) {
                        *v = f32::NEG_INFINITY;
                    }
                }
            }
            let tok = l.sampler.sample(&lrow);
            let (logprob, top) = logprobs(&lrow, tok, l.params.logprobs.unwrap_or(0));
            r.tokens.push(tok);
            l.generated += 1;
            self.stats.generated_tokens += 1;
            out.push((it.id, Event::Token(TokenOut { id: tok, logprob, top })));
            let reason = if l.generated >= l.params.min_tokens && l.stop.contains(&tok) {
                Some(Finish::Stop)
            } else if l.generated >= l.params.max_tokens || r.tokens.len() >= self.ctx {
                Some(Finish::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                let ev = self.finish(it.id, reason)?;
                out.push((it.id, ev));
            }
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

/// `log_softmax(row)[tok]` and the top `n` `(id, logprob)`, best first (lower id on ties).
fn logprobs(row: &[f32], tok: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + row.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln() as f32;
    let lp = |i: usize| row[i] - lse;
    let mut top: Vec<(u32, f32)> = Vec::new();
    if n > 0 {
        let mut idx: Vec<usize> = (0..row.len()).collect();
        let k = n.min(row.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        idx.truncate(k);
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        top = idx.into_iter().map(|i| (i as u32, lp(i))).collect();
    }
    (lp(tok as usize), top)
}
