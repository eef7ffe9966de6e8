//! Single-request generation on top of [`Model::forward`]: prefill the prompt, then decode
//! one token at a time through the state cache.

use crate::bail;
use crate::engine::sampling::{Sampler, SamplingParams};
use crate::error::Result;
use crate::state::StateCache;
use crate::{Batch, LogitsFor, Model};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence id was produced (it is included in the output).
    Eos,
    /// `max_tokens` were produced.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Generated ids and why generation stopped.
#[derive(Clone, Debug)]
pub struct Generation {
    pub ids: Vec<u32>,
    pub finish: FinishReason,
}

/// Generates up to `max_tokens` ids after `prompt`, stopping after any id in `stop_ids`.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    params: SamplingParams,
    max_tokens: usize,
    stop_ids: &[u32],
) -> Result<Generation> {
    if prompt.is_empty() {
        bail!(Input, "the prompt is empty: at least one token id is needed");
    }
    let mut sampler = Sampler::new(params)?;
    let mut cache = model.try_new_cache_spec(1, 0)?;
    let seq = cache.alloc_seq()?;
    let mut out = Vec::with_capacity(max_tokens);
    let mut next_input: Vec<u32> = prompt.to_vec();
    while out.len() < max_tokens {
        let batch = Batch::single(seq, cache.seq_len(seq), &next_input);
        let fwd = model.forward(&batch, &mut cache, LogitsFor::Last)?;
        let tok = sampler.sample_tensor(&fwd.logits, 0)?;
        out.push(tok);
        if stop_ids.contains(&tok) {
            return Ok(Generation { ids: out, finish: FinishReason::Eos });
        }
        next_input = vec![tok];
    }
    Ok(Generation { ids: out, finish: FinishReason::Length })
}
