//! Per-request token sampling for the batched engine.
//!
//! Every request owns a [`SeqSampler`]: its [`SamplingParams`], its own RNG stream
//! (SplitMix64, so a seeded request draws the same numbers whatever else shares the batch) and
//! the token counts the penalties need (the prompt's token set for the repetition penalty, the
//! output's counts for presence/frequency). One batched forward yields a logits row per
//! request; the engine hands each row to that request's sampler.
//!
//! # Processing order
//!
//! For one row of logits `l` (length `vocab`) at output position `out_len`:
//!
//! 1. **Logit bias** (OpenAI `logit_bias`): each listed token's bias is added to its raw
//!    logit, before the penalties (vLLM's order).
//!    **Penalties** (on the biased logits, float32, HF/vLLM order):
//!    - repetition (HF `RepetitionPenaltyLogitsProcessor`): for every token of prompt ∪ output,
//!      `l > 0 → l / r`, otherwise `l · r`;
//!    - presence / frequency (OpenAI / vLLM): over **output** tokens only,
//!      `l -= presence · [count > 0] + frequency · count`.
//! 2. **min_tokens**: while `out_len < min_tokens`, the stop ids (`stop_token_ids`, plus the
//!    `eos` ids unless `ignore_eos`) are set to −∞. **Structured output** (`json`): every
//!    token whose bytes do not continue a text of the request's schema is set to −∞; the stop
//!    ids pass only where the text may end, and once it is complete only they do
//!    (`sampling/schema.rs`, `sampling/json.rs`).
//! 3. **Logprobs** (when requested) are taken here: `log_softmax` of the logits after steps 1–2
//!    (vLLM's `processed_logprobs` choice: penalties included, temperature and truncation not),
//!    in float64. A token masked by step 2 has logprob −∞.
//! 4. Greedy (temperature 0) stops here: the token is the argmax (first index on ties); no
//!    random number is drawn.
//! 5. **Temperature** `l / t`, then **top-k** (the k largest, lower index first on ties), then
//!    **top-p** (the smallest prefix, largest first, whose mass reaches `top_p`, at least one
//!    token), then **min-p** (drop tokens whose probability is below `min_p` times the largest
//!    one): HF's warper order.
//! 6. **Draw**: one uniform `u` in [0, 1); the kept tokens are walked in index order and the
//!    first whose cumulative probability exceeds `u` is chosen. When a single token survives,
//!    nothing is drawn.
//!
//! # Cost
//!
//! The row is never copied: penalised and masked entries are a short sorted list of overrides
//! on top of the borrowed row. Greedy is one pass (max, argmax and the top-N logprobs together);
//! logprobs add one exp-sum pass. Top-k keeps a bounded insertion list (k ≤ 1024) or uses
//! `select_nth_unstable` (larger k). Top-p without top-k sums the probabilities in one pass,
//! gathers the tokens with probability ≥ (1 − top_p)/64 (a prefix of the sorted order: when it
//! already reaches `top_p` the answer is exact), else those with probability ≥
//! (1 − top_p)/vocab (whose mass provably exceeds `top_p`), and finds the nucleus among them by
//! quickselect on mass (expected linear, no full sort). Min-p alone is one threshold pass.
//! Nothing sorts the whole vocabulary.

mod json;
mod row;
mod schema;
mod seq;

pub use json::JsonVocab;
pub use schema::Schema;
pub use seq::{Sampled, SeqSampler};

use crate::bail;
use crate::engine::generate::FinishReason;
use crate::error::Result;

/// Most top logprobs a request may ask for (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// The former name of [`SeqSampler`].
pub type Sampler = SeqSampler;

/// When a request stops, and what it must not stop on.
///
/// Separate from the sampling knobs because the scheduler, not the sampler, ends a request;
/// the sampler only reads `min_tokens`, `ignore_eos` and `stop_token_ids` for its mask.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StopParams {
    /// Most tokens to generate; `None`: until a stop id or the context is full. Must be ≥ 1.
    pub max_tokens: Option<usize>,
    /// Stop ids (and eos) are masked out until this many tokens were generated.
    pub min_tokens: usize,
    /// Generation does not stop at the model's eos ids (nor are they masked by `min_tokens`).
    pub ignore_eos: bool,
    /// Extra ids that end generation (included in the output), honoured even with `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
}

impl StopParams {
    /// Why generation ends after `token` was appended as output number `out_len` (1-based:
    /// the output now holds `out_len` tokens), given the model's `eos` ids; `None` to go on.
    pub fn finish(&self, token: u32, out_len: usize, eos: &[u32]) -> Option<FinishReason> {
        let stop = self.stop_token_ids.contains(&token) || (!self.ignore_eos && eos.contains(&token));
        if stop && out_len >= self.min_tokens {
            return Some(FinishReason::Eos);
        }
        if self.max_tokens.is_some_and(|m| out_len >= m) {
            return Some(FinishReason::Length);
        }
        None
    }

    /// Whether `token` must be masked at output position `out_len` (0-based).
    pub(crate) fn masks(&self, out_len: usize) -> bool {
        out_len < self.min_tokens
    }
}

/// The structured-output constraint of a request: a compiled [`Schema`] (for
/// `json_object`, [`Schema::any_object`]) over a tokenizer's [`JsonVocab`]. Equal when both
/// are the same objects.
#[derive(Clone, Debug)]
pub struct JsonMode {
    pub vocab: std::sync::Arc<JsonVocab>,
    pub schema: std::sync::Arc<Schema>,
}

impl PartialEq for JsonMode {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.vocab, &other.vocab) && std::sync::Arc::ptr_eq(&self.schema, &other.schema)
    }
}

/// Sampling parameters of one request. The defaults are greedy with every filter off.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy; otherwise a finite value > 0.
    pub temperature: f32,
    /// Keep the k most likely tokens (≥ 1); `None`: off.
    pub top_k: Option<usize>,
    /// Nucleus mass in (0, 1]; `None` (or 1): off.
    pub top_p: Option<f32>,
    /// Keep tokens with probability ≥ `min_p` × the largest, in [0, 1]; `None` (or 0): off.
    pub min_p: Option<f32>,
    /// HF repetition penalty over prompt ∪ output tokens, > 0; 1: off.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty over output tokens, in [−2, 2]; 0: off.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty over output tokens, in [−2, 2]; 0: off.
    pub frequency_penalty: f32,
    /// OpenAI `logit_bias`: `(token id, bias)` pairs, ids strictly increasing, each bias finite
    /// in [−100, 100], added to the raw logits before the penalties; empty: off. Ids beyond the
    /// logits row are ignored (the API checks them against the vocabulary).
    pub logit_bias: Vec<(u32, f32)>,
    /// Structured output (`response_format` `json_object` / `json_schema`): every token that
    /// would not continue a text of the schema is masked, and the end ids only pass once the
    /// text is complete ([`JsonMode`]); `None`: off.
    pub json: Option<JsonMode>,
    /// Seed of this request's RNG stream; `None`: a fresh random seed per sampler.
    pub seed: Option<u64>,
    /// Return the chosen token's logprob and the top-N (N ≤ [`MAX_LOGPROBS`]); `None`: no logprobs.
    pub logprobs: Option<usize>,
    /// Stopping rules (`max_tokens`, `min_tokens`, `ignore_eos`, `stop_token_ids`).
    pub stop: StopParams,
    /// Log-probabilities of the prompt's tokens (vLLM's `prompt_logprobs`; OpenAI's `echo`
    /// with `logprobs`): each prompt token after the first, from the raw logits of the row
    /// before it, with the top-N alternatives (N ≤ [`MAX_LOGPROBS`]); `None`: off. Such a
    /// request computes its whole prompt (no prefix-cache hit) in pieces of at most
    /// [`crate::engine::batcher::PROMPT_LOGPROBS_ROWS`] rows.
    pub prompt_logprobs: Option<usize>,
    /// Scheduling priority (vLLM's `priority`): lower runs first under
    /// [`crate::engine::EngineConfig::priority_scheduling`]; must be 0 otherwise.
    pub priority: i64,
    /// Prefix-cache isolation (vLLM's `cache_salt`): the hash chain of this request's KV
    /// blocks starts from this value, so it shares cached blocks (and recurrent-state
    /// checkpoints) only with requests of the same salt; `None`: the common chain.
    pub cache_salt: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            json: None,
            seed: None,
            logprobs: None,
            stop: StopParams::default(),
            prompt_logprobs: None,
            priority: 0,
            cache_salt: None,
        }
    }
}

impl SamplingParams {
    /// Rejects out-of-range values with a message naming the parameter.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!(Input, "`temperature` must be a finite number >= 0, got {}", self.temperature);
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                bail!(Input, "`top_p` must be in (0, 1], got {p}");
            }
        }
        if self.top_k == Some(0) {
            bail!(Input, "`top_k` must be >= 1 (leave it unset to disable it)");
        }
        if let Some(m) = self.min_p {
            if !(0.0..=1.0).contains(&m) {
                bail!(Input, "`min_p` must be in [0, 1], got {m}");
            }
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            bail!(Input, "`repetition_penalty` must be a finite number > 0, got {r}");
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                bail!(Input, "`{name}` must be in [-2, 2], got {v}");
            }
        }
        if let Some(w) = self.logit_bias.windows(2).find(|w| w[0].0 >= w[1].0) {
            bail!(Input, "`logit_bias` token ids must be distinct and sorted, got {} before {}", w[0].0, w[1].0);
        }
        if let Some(&(id, b)) = self.logit_bias.iter().find(|e| !(e.1.is_finite() && (-100.0..=100.0).contains(&e.1))) {
            bail!(Input, "`logit_bias` of token {id} must be in [-100, 100], got {b}");
        }
        if let Some(n) = self.logprobs {
            if n > MAX_LOGPROBS {
                bail!(Input, "`logprobs` must be at most {MAX_LOGPROBS}, got {n}");
            }
        }
        if let Some(n) = self.prompt_logprobs {
            if n > MAX_LOGPROBS {
                bail!(Input, "`prompt_logprobs` must be at most {MAX_LOGPROBS}, got {n}");
            }
        }
        if let Some(m) = self.stop.max_tokens {
            if m == 0 {
                bail!(Input, "`max_tokens` must be at least 1");
            }
            if self.stop.min_tokens > m {
                bail!(Input, "`min_tokens` ({}) must be <= `max_tokens` ({m})", self.stop.min_tokens);
            }
        }
        Ok(())
    }

    /// Whether any penalty changes logits.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// Whether the device sampler (temperature, top-k, top-p only) computes exactly this
    /// request's draw at output position `out_len`.
    pub fn device_compatible(&self, out_len: usize) -> bool {
        !self.has_penalties()
            && self.logit_bias.is_empty()
            && self.json.is_none()
            && self.min_p.is_none_or(|m| m == 0.0)
            && self.logprobs.is_none()
            && !self.stop.masks(out_len)
    }
}

/// Index of the largest value; the first one on ties (as `torch.argmax`). NaN never wins and
/// an all-NaN (or empty) row gives 0, as the device argmax (`argmax_f32`) decides.
///
/// Two passes the compiler vectorizes: the largest non-NaN value (`f32::max` skips NaN; max is
/// exact in any order), then the first chunk holding it. A greedy draft or decode token on the
/// host scans a whole vocabulary row (151,936 entries for Qwen3): one compare-and-branch an
/// element took ≈ 0.2 ms a row on the GPU machine's CPU (session 23's host profile), this
/// ≈ 4× less (0.05 ms there; 41 against 149 µs on the development machine).
pub fn argmax(xs: &[f32]) -> usize {
    const L: usize = 16;
    let chunks = xs.chunks_exact(L);
    let mut m = chunks.remainder().iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    let mut acc = [f32::NEG_INFINITY; L];
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    m = acc.iter().fold(m, |a, &x| a.max(x));
    // The first element equal to m (−inf when every value is NaN or −inf: then the first −inf,
    // or none at all, 0). Signed zeros compare equal: the first of them, as a scan would give.
    for (ci, c) in xs.chunks(L).enumerate() {
        if c.iter().fold(false, |f, &x| f | (x == m)) {
            return ci * L + c.iter().position(|&x| x == m).unwrap_or(0);
        }
    }
    0
}

#[cfg(test)]
mod tests;
