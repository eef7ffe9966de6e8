//! Single-request generation on top of [`Model::forward`]: prefill the prompt, then decode
//! one token at a time through the state cache.

use crate::bail;
use crate::batch::Batch;
use crate::engine::sampling::{SamplingParams, SeqSampler};
use crate::error::Result;
use crate::model::{LogitsFor, Model};
use crate::state::StateCache;

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence id was produced (it is included in the output).
    Eos,
    /// `max_tokens` were produced, or the context (`max_position_embeddings`) is full.
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string: `stop` or `length`.
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

/// Checks, before anything runs, that a prompt of `prompt_len` tokens plus `max_tokens`
/// generated ones fit the model's context (`max_position_embeddings`). `lookahead` is the
/// number of extra positions a step may write beyond the last generated token
/// (speculative decoding verifies K draft tokens: K).
pub fn check_context(model: &Model, prompt_len: usize, max_tokens: usize, lookahead: usize) -> Result<()> {
    if prompt_len == 0 {
        bail!(Input, "the prompt is empty: at least one token id is needed");
    }
    let Some(ctx) = model.info.max_position_embeddings else { return Ok(()) };
    let need = prompt_len.saturating_add(max_tokens).saturating_add(lookahead);
    if need > ctx {
        let extra = if lookahead > 0 { format!(" plus {lookahead} speculative positions") } else { String::new() };
        bail!(
            Input,
            "the prompt ({prompt_len} tokens) plus max_tokens = {max_tokens}{extra} need {need} positions, more than \
             the model's context of max_position_embeddings = {ctx}"
        );
    }
    Ok(())
}

/// Generates up to `max_tokens` ids after `prompt`, stopping after any id in `stop_ids` (the
/// model's eos ids). `params.stop` applies too: its `max_tokens` lowers the limit, its
/// `stop_token_ids` also stop, `min_tokens` masks the stop ids, `ignore_eos` disables `stop_ids`.
///
/// `prompt.len() + max_tokens` must fit the context ([`check_context`], checked before the
/// first forward). Should a run still reach the end of the context, it returns what it
/// generated with [`FinishReason::Length`].
pub fn generate(
    model: &Model,
    prompt: &[u32],
    params: SamplingParams,
    max_tokens: usize,
    stop_ids: &[u32],
) -> Result<Generation> {
    let max_tokens = max_tokens.min(params.stop.max_tokens.unwrap_or(usize::MAX));
    check_context(model, prompt.len(), max_tokens, 0)?;
    let stop = params.stop.clone();
    let mut sampler = SeqSampler::new(params)?;
    sampler.observe_prompt(prompt);
    let mut cache = model.new_cache_spec(1, 0)?;
    let seq = cache.alloc_seq()?;
    let ctx = model.info.max_position_embeddings.unwrap_or(usize::MAX);
    // Sized by what can be generated, never by an unchecked count.
    let mut out = Vec::with_capacity(max_tokens.min(ctx.saturating_sub(prompt.len())).min(1 << 16));
    let mut next_input: Vec<u32> = prompt.to_vec();
    while out.len() < max_tokens {
        let pos = cache.seq_len(seq);
        if pos.saturating_add(next_input.len()) > ctx {
            break;
        }
        let batch = Batch::single(seq, pos, &next_input);
        let fwd = model.forward(&batch, &mut cache, LogitsFor::Last)?;
        let tok = sampler.sample_tensor(&fwd.logits, 0, out.len(), stop_ids)?;
        sampler.accept(tok);
        out.push(tok);
        if stop.finish(tok, out.len(), stop_ids) == Some(FinishReason::Eos) {
            return Ok(Generation { ids: out, finish: FinishReason::Eos });
        }
        next_input = vec![tok];
    }
    Ok(Generation { ids: out, finish: FinishReason::Length })
}
