//! What a request is, what the engine sends back, and the engine's counters.

use crate::bail;
use crate::engine::sampling::SamplingParams;
use crate::error::Result;

/// A request's id (unique per engine).
pub type RequestId = u64;

/// Checks a request's parameters against the model: [`SamplingParams::validate`], stop ids
/// inside the vocabulary.
pub fn validate(params: &SamplingParams, vocab: usize) -> Result<()> {
    params.validate()?;
    if params.stop.max_tokens == Some(0) {
        bail!(Input, "`max_tokens` must be >= 1");
    }
    if let Some(&bad) = params.stop.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
        bail!(Input, "stop token id {bad} is outside the vocabulary of {vocab}");
    }
    Ok(())
}

/// Why a request finished (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop id was generated (it is included in the output).
    Stop,
    /// `max_tokens` were generated, or the context is full.
    Length,
    /// Aborted by the caller (or its receiver went away).
    Abort,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Abort => "abort",
        }
    }
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    pub id: u32,
    /// Log-probability of the token (log-softmax of the logits after penalties, see
    /// [`crate::engine::sampling`]), when the request asked for log-probabilities.
    pub logprob: Option<f32>,
    /// The top alternatives `(id, logprob)`, best first, when the request asked for them.
    pub top: Vec<(u32, f32)>,
}

/// One prompt token's log-probability (`SamplingParams::prompt_logprobs`): under the raw logits
/// of the row before it.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptToken {
    pub id: u32,
    pub logprob: f32,
    /// 1 + the number of ids with a larger logit (vLLM's `rank`).
    pub rank: u32,
    /// The top alternatives `(id, logprob)`, best first.
    pub top: Vec<(u32, f32)>,
}

/// The end of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub reason: Finish,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache (at the last admission).
    pub cached_tokens: usize,
    /// Times the request was preempted (and recomputed).
    pub preemptions: usize,
    /// Speculative decoding: draft tokens verified and accepted.
    pub drafted: usize,
    pub accepted: usize,
    /// Time from `add_request` to the first step that scheduled it (vLLM's queue time); the
    /// whole wait when it ended (aborted) before being scheduled.
    pub queue_time: std::time::Duration,
}

/// What the engine sends a request's receiver.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The prompt's log-probabilities (a request with `prompt_logprobs`), once its prefill is
    /// done and before its first token: entry p is prompt token p's (`None` for the first).
    Prompt(Vec<Option<PromptToken>>),
    Token(TokenOut),
    Done(Finished),
    /// The engine failed while running the request (it is finished).
    Error(String),
}

impl Event {
    /// Whether the request ends with this event (`Done` or `Error`; nothing follows).
    pub fn is_end(&self) -> bool {
        matches!(self, Event::Done(_) | Event::Error(_))
    }
}

/// Counters of an engine (a snapshot).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub steps: u64,
    /// Rows run through the model (prefill + decode).
    pub batched_tokens: u64,
    pub generated_tokens: u64,
    pub preemptions: u64,
    pub finished: u64,
    pub aborted: u64,
    /// KV blocks: total, free (cached ones included), and free ones holding a cached prefix.
    pub kv_blocks_total: usize,
    pub kv_blocks_free: usize,
    pub kv_blocks_cached: usize,
    pub block_size: usize,
    /// State slots (sequences that can be live at once) and free ones.
    pub state_slots_total: usize,
    pub state_slots_free: usize,
    /// Prefix cache: prompt tokens looked up and found (in tokens, at admission).
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Prompt tokens found in cached KV blocks but computed again: a recurrent model had no
    /// state checkpoint at the end of the match (0 for attention-only models). Tells "no
    /// shared prefix" (queries without hits) from "shared but not resumable".
    pub prefix_unresumed_tokens: u64,
    /// Recurrent-state checkpoints of the prefix cache: the pool, and those registered
    /// (findable by later prompts).
    pub state_checkpoints_total: usize,
    pub state_checkpoints_cached: usize,
    /// Speculative decoding: verify steps (one per request and step), draft tokens
    /// verified and accepted, and acceptances by draft position (index j: the (j+1)-th draft).
    pub spec_steps: u64,
    pub spec_drafted: u64,
    pub spec_accepted: u64,
    pub spec_accepted_at: Vec<u64>,
}
