//! The scheduler (vLLM v1 style): one token budget per step, running requests first, then
//! waiting ones (FCFS) while below `max_num_seqs`; chunked prefill; preemption by recompute
//! when the KV pool runs out.
//!
//! A request is only a count of tokens known (`prompt + generated`) and of tokens computed
//! (in the cache). Each step gives every scheduled request `n ≥ 1` new rows: the rest of its
//! prompt (or a chunk of it) or its one decode token; prefill chunks and decode rows share
//! one forward. When a running request needs a block and none is free, the most recently
//! admitted running request is preempted: its blocks and state slot are freed, its computed
//! count drops to 0, and it goes back to the head of the waiting queue, to be recomputed
//! from its prompt and the tokens it already generated (which are kept). The oldest request
//! is never preempted for a younger one, so nothing starves.

use crate::engine::request::RequestId;
use crate::error::Result;
use crate::state::{ModelCache, SeqId, StateCache};
use std::collections::{HashMap, VecDeque};

/// A request as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct SchedSeq {
    /// Tokens known: prompt + generated (what must be in the cache before the next token).
    pub tokens: Vec<u32>,
    /// Tokens in the cache.
    pub computed: usize,
    /// The state slot while admitted.
    pub seq: Option<SeqId>,
    /// Prompt tokens served from the prefix cache at the last admission.
    pub cached: usize,
    /// Tokens that were prompt (the rest were generated; after a preemption those are
    /// recomputed in small pieces, as they were first computed).
    pub prompt_len: usize,
    pub preemptions: usize,
    /// Draft tokens to verify after the known ones (speculative decoding; 0 otherwise).
    pub lookahead: usize,
    /// The request's prefix-cache salt ([`crate::engine::SamplingParams::cache_salt`]).
    pub salt: Option<u64>,
    /// Computes its whole prompt, in pieces of at most `max_rows` rows (prompt
    /// log-probabilities need every row's logits); `usize::MAX`: any piece, prefix hits too.
    pub max_rows: usize,
    /// Its priority (lower runs first; 0 without priority scheduling) and arrival order.
    pub priority: i64,
    pub arrival: u64,
}

/// Scheduling limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// Rows per forward (prefill chunks + decode rows).
    pub max_num_batched_tokens: usize,
    /// Requests running at once (≤ the cache's state slots).
    pub max_num_seqs: usize,
    /// Prefill chunks of a model with recurrent layers end on multiples of this many
    /// positions (the chunked delta rule's chunk), and never leave a final piece of at most
    /// `align_tail` tokens: the chunking then does not change a request's arithmetic (the
    /// batch-invariance guarantee). 1 = any split.
    pub align: usize,
    pub align_tail: usize,
    /// Most rows of a span that attention computes as "decode" rows (split over fixed key
    /// ranges on a GPU); a prefill split into pieces keeps every piece and its tail above
    /// this, and generated tokens recomputed after a preemption go in pieces of at most
    /// `replay_piece`, so every row takes the path it took the first time.
    pub decode_rows: usize,
    pub replay_piece: usize,
    /// vLLM's `--scheduling-policy priority`: the waiting queue and the running set are kept
    /// in (priority, arrival) order, so a lower priority value is admitted and given blocks
    /// first, and preemption takes the lowest priority (then the latest) first. Off: first
    /// come, first served.
    pub priority: bool,
}

/// A request's place under priority scheduling: (priority, arrival), smallest first.
fn order(reqs: &HashMap<RequestId, SchedSeq>, id: RequestId) -> (i64, u64) {
    reqs.get(&id).map_or((i64::MAX, u64::MAX), |r| (r.priority, r.arrival))
}

/// One scheduled request: `n` rows starting at its `computed` position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: RequestId,
    pub n: usize,
}

/// One step's plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub items: Vec<Scheduled>,
    /// Requests preempted while planning (already back in the waiting queue).
    pub preempted: Vec<RequestId>,
    /// Requests admitted this step: `(id, tokens looked up, their prefix-cache hit)`.
    pub admitted: Vec<(RequestId, usize, crate::state::PrefixHit)>,
}

/// The waiting queue and the running set.
#[derive(Debug)]
pub struct Scheduler {
    pub cfg: SchedConfig,
    pub waiting: VecDeque<RequestId>,
    pub running: Vec<RequestId>,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig) -> Self {
        Self { cfg, waiting: VecDeque::new(), running: Vec::new() }
    }

    /// Rows request `r` may take this step out of `budget` (0: none now).
    fn chunk(&self, r: &SchedSeq, budget: usize) -> usize {
        let budget = budget.min(r.max_rows);
        let need = r.tokens.len() - r.computed + r.lookahead;
        if r.lookahead > 0 {
            // A verify span is never split.
            return if need <= budget { need } else { 0 };
        }
        if r.computed >= r.prompt_len {
            // Recomputing generated tokens after a preemption (or decoding: need = 1).
            return need.min(budget).min(self.cfg.replay_piece.max(1));
        }
        // Prefill of the prompt; generated tokens after it wait for the replay rule.
        let prompt_need = r.prompt_len - r.computed;
        let n = prompt_need.min(budget);
        if n == prompt_need {
            // The rest of the prompt in one piece.
            return n;
        }
        // A partial piece: end on an aligned position, keep the piece and the tail of the
        // prompt above `decode_rows`, and the tail above `align_tail`.
        let a = self.cfg.align.max(1);
        let tail_min = self.cfg.align_tail.max(self.cfg.decode_rows) + 1;
        let mut end = (r.computed + n) / a * a;
        while end > r.computed && r.prompt_len - end < tail_min {
            end -= a;
        }
        let n = end.saturating_sub(r.computed);
        if prompt_need > self.cfg.decode_rows && n <= self.cfg.decode_rows {
            return 0;
        }
        n
    }

    /// Queues a new request: at the back, or (priority scheduling) after every request that
    /// comes before it in (priority, arrival) order.
    pub fn enqueue(&mut self, id: RequestId, reqs: &HashMap<RequestId, SchedSeq>) {
        let at = if self.cfg.priority {
            self.waiting.partition_point(|&x| order(reqs, x) <= order(reqs, id))
        } else {
            self.waiting.len()
        };
        self.waiting.insert(at, id);
    }

    /// Adds an admitted request to the running set: at the back, or in (priority, arrival)
    /// order (the back is what preemption takes first).
    fn run(&mut self, id: RequestId, reqs: &HashMap<RequestId, SchedSeq>) {
        let at = if self.cfg.priority {
            self.running.partition_point(|&x| order(reqs, x) <= order(reqs, id))
        } else {
            self.running.len()
        };
        self.running.insert(at, id);
    }

    /// Frees `id`'s slot and blocks and puts it at the head of the waiting queue.
    fn preempt(
        &mut self,
        id: RequestId,
        reqs: &mut HashMap<RequestId, SchedSeq>,
        cache: &mut ModelCache,
    ) -> Result<()> {
        self.running.retain(|&x| x != id);
        if let Some(r) = reqs.get_mut(&id) {
            if let Some(seq) = r.seq.take() {
                cache.free_seq(seq)?;
            }
            r.computed = 0;
            r.lookahead = 0;
            r.preemptions += 1;
        }
        if self.cfg.priority {
            self.enqueue(id, reqs);
        } else {
            self.waiting.push_front(id);
        }
        Ok(())
    }

    /// Plans one step: reserves nothing yet (the forward's `prepare` takes the blocks), but
    /// guarantees that the planned rows' blocks are free.
    pub fn schedule(&mut self, reqs: &mut HashMap<RequestId, SchedSeq>, cache: &mut ModelCache) -> Result<Plan> {
        let mut plan = Plan::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        // Blocks promised to requests planned earlier in this step.
        let mut promised = 0usize;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(r) = reqs.get(&id) else {
                self.running.remove(i);
                continue;
            };
            let n = self.chunk(r, budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let need = cache.blocks_needed(r.seq, r.computed + n);
            if need + promised > cache.blocks().free {
                // Preempt from the back (the youngest) until this one fits, or it is the
                // youngest itself.
                let victim = *self.running.last().unwrap_or(&id);
                self.preempt(victim, reqs, cache)?;
                plan.preempted.push(victim);
                if victim == id {
                    break;
                }
                continue;
            }
            promised += need;
            budget -= n;
            plan.items.push(Scheduled { id, n });
            i += 1;
        }
        // Admit waiting requests in order while there is budget, a slot and blocks.
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs && cache.free_slots() > 0 {
            let Some(&id) = self.waiting.front() else { break };
            let Some(r) = reqs.get_mut(&id) else {
                self.waiting.pop_front();
                continue;
            };
            let found = if r.max_rows == usize::MAX {
                cache.alloc_seq_prefix(&r.tokens, r.salt)?
            } else {
                crate::state::PrefixHit { seq: cache.alloc_seq()?, cached: 0, matched: 0 }
            };
            let (seq, hit) = (found.seq, found.cached);
            r.seq = Some(seq);
            r.computed = hit;
            r.cached = hit;
            let n = self.chunk(r, budget);
            let need = cache.blocks_needed(Some(seq), r.computed + n);
            if n == 0 || need + promised > cache.blocks().free {
                cache.free_seq(seq)?;
                r.seq = None;
                r.computed = 0;
                break;
            }
            let len = r.tokens.len();
            self.waiting.pop_front();
            self.run(id, reqs);
            plan.admitted.push((id, len, found));
            promised += need;
            budget -= n;
            plan.items.push(Scheduled { id, n });
        }
        Ok(plan)
    }

    /// Drops a request from both queues (finished or aborted), freeing its slot.
    pub fn remove(
        &mut self,
        id: RequestId,
        reqs: &mut HashMap<RequestId, SchedSeq>,
        cache: &mut ModelCache,
    ) -> Result<()> {
        self.running.retain(|&x| x != id);
        self.waiting.retain(|&x| x != id);
        if let Some(mut r) = reqs.remove(&id) {
            if let Some(seq) = r.seq.take() {
                cache.free_seq(seq)?;
            }
        }
        Ok(())
    }
}
