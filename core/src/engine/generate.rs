//! Single-request generation on the serving engine: prefill the prompt, then decode one token
//! at a time through the paged cache.

use crate::bail;
use crate::engine::batcher::{EngineConfig, EngineCore};
use crate::engine::request::{Event, Finish};
use crate::engine::sampling::{SamplingParams, SeqSampler};
use crate::error::Result;
use crate::model::Model;

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
/// Runs on the serving engine ([`EngineCore`], one sequence, the prompt prefilled in one
/// step, then one token per step). `prompt.len() + max_tokens` must fit the context
/// ([`check_context`], checked before the first forward). Should a run still reach the end of
/// the context, it returns what it generated with [`FinishReason::Length`].
pub fn generate(
    model: &Model,
    prompt: &[u32],
    params: SamplingParams,
    max_tokens: usize,
    stop_ids: &[u32],
) -> Result<Generation> {
    let max_tokens = max_tokens.min(params.stop.max_tokens.unwrap_or(usize::MAX));
    check_context(model, prompt.len(), max_tokens, 0)?;
    if max_tokens == 0 {
        SeqSampler::new(params)?;
        return Ok(Generation { ids: Vec::new(), finish: FinishReason::Length });
    }
    let block_size = crate::state::DEFAULT_BLOCK_SIZE;
    let cfg = EngineConfig {
        // The whole prompt in one step (and room for the aligned-chunk check).
        max_num_batched_tokens: prompt.len().max(65),
        max_num_seqs: 1,
        block_size,
        num_blocks: (prompt.len() + max_tokens).div_ceil(block_size),
        kv_dtype: model.info.kv_cache_dtype,
        // One sequence: nothing to share a prefix with.
        state_checkpoints: 0,
        checkpoint_stride: crate::state::CHECKPOINT_INTERVAL,
        prefix_caching: false,
        priority_scheduling: false,
    };
    let mut engine = EngineCore::new(model, cfg)?;
    // `stop_ids` are this call's eos ids (instead of the model's).
    engine.set_eos(stop_ids.to_vec());
    let mut params = params;
    params.stop.max_tokens = Some(max_tokens);
    engine.add_request(0, prompt.to_vec(), params)?;
    let mut ids = Vec::with_capacity(max_tokens.min(1 << 16));
    loop {
        for (_, ev) in engine.step()? {
            match ev {
                Event::Prompt(_) => {}
                Event::Token(t) => ids.push(t.id),
                Event::Done(f) => {
                    let finish = if f.reason == Finish::Stop { FinishReason::Eos } else { FinishReason::Length };
                    return Ok(Generation { ids, finish });
                }
                Event::Error(e) => bail!(Internal, "{e}"),
            }
        }
        if !engine.has_work() {
            return Ok(Generation { ids, finish: FinishReason::Length });
        }
    }
}
