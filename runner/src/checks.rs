//! Flag checks of the `porter` subcommands: each flag's range before anything is loaded or
//! sized from it, then the checks against the loaded model (vocabulary, context). Every
//! message names the flag, its value and what is allowed.

use anyhow::{anyhow, bail, Result};
use porter_core::config::limits;
use porter_core::sampling::SamplingParams;
use porter_core::speculative::MAX_MTP_STEP;
use porter_core::{registry, DType, Device, Model};
use std::fmt::Display;

/// Largest `--batch` of `porter bench` (decode sequences at once).
pub const MAX_BATCH: usize = 4096;
/// Smallest positive `--temperature`: below it `logits / t` overflows f32 for ordinary
/// logits (vLLM's `_SAMPLING_EPS`); 0 means greedy.
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// `{flag} {value}: must be {allowed}`.
pub fn bad(flag: &str, value: impl Display, allowed: impl Display) -> anyhow::Error {
    anyhow!("{flag} {value}: must be {allowed}")
}

/// `--temperature`, `--top-k`, `--top-p`, `--seed` as sampling parameters.
pub fn sampling(temperature: f32, top_k: Option<usize>, top_p: Option<f32>, seed: u64) -> Result<SamplingParams> {
    if !(temperature == 0.0 || (temperature.is_finite() && temperature >= MIN_TEMPERATURE)) {
        return Err(bad("--temperature", temperature, format!("0 (greedy) or a finite number >= {MIN_TEMPERATURE}")));
    }
    if let Some(k) = top_k {
        if !(1..=limits::MAX_VOCAB).contains(&k) {
            return Err(bad(
                "--top-k",
                k,
                format!("in 1..={} (values above the vocabulary keep every token)", limits::MAX_VOCAB),
            ));
        }
    }
    if let Some(p) = top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(bad("--top-p", p, "in (0, 1]"));
        }
    }
    let params = SamplingParams { temperature, top_k, top_p, seed: Some(seed), ..Default::default() };
    params.validate()?;
    Ok(params)
}

/// `--max-tokens`: at least one token (the context bounds it from above).
pub fn max_tokens(n: usize) -> Result<()> {
    if n == 0 {
        return Err(bad("--max-tokens", n, "at least 1"));
    }
    Ok(())
}

/// `--mtp-step`: 1..=MAX_MTP_STEP draft tokens per step.
pub fn mtp_step(k: Option<usize>) -> Result<()> {
    match k {
        Some(k) if !(1..=MAX_MTP_STEP).contains(&k) => Err(bad("--mtp-step", k, format!("in 1..={MAX_MTP_STEP}"))),
        _ => Ok(()),
    }
}

/// Every id of `flag` inside the model's vocabulary.
pub fn ids_in_vocab(flag: &str, ids: &[u32], model: &Model) -> Result<()> {
    let vocab = model.info.vocab_size;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("{flag}: token id {id} is out of range for the model's vocabulary (vocab_size = {vocab})");
    }
    Ok(())
}

/// The model's context (`max_position_embeddings`), or `usize::MAX` when it has none.
pub fn context(model: &Model) -> usize {
    model.info.max_position_embeddings.unwrap_or(usize::MAX)
}

/// `--ids` of `porter logits`: within the context (checked before the logits are sized).
pub fn logits_ids(ids: &[u32], model: &Model) -> Result<()> {
    ids_in_vocab("--ids", ids, model)?;
    let ctx = context(model);
    if ids.len() > ctx {
        bail!("--ids: {} ids exceed the model's context of max_position_embeddings = {ctx}", ids.len());
    }
    Ok(())
}

/// The `porter bench` sizes against the loaded model.
pub fn bench_sizes(model: &Model, prefill: &[usize], batch: &[usize], context_len: usize, steps: usize) -> Result<()> {
    let ctx = context(model);
    for &n in prefill {
        if n == 0 || n > ctx {
            return Err(bad("--prefill", n, format!("in 1..={ctx} (max_position_embeddings)")));
        }
    }
    for &b in batch {
        if !(1..=MAX_BATCH).contains(&b) {
            return Err(bad("--batch", b, format!("in 1..={MAX_BATCH}")));
        }
    }
    if context_len == 0 {
        return Err(bad("--context", context_len, "at least 1"));
    }
    if steps == 0 {
        return Err(bad("--steps", steps, "at least 1"));
    }
    if context_len.saturating_add(steps) > ctx {
        bail!(
            "--context {context_len} plus --steps {steps} exceed the model's context of max_position_embeddings = {ctx}"
        );
    }
    Ok(())
}

/// `--layers` of `porter bench --config`.
pub fn layers(n: usize) -> Result<()> {
    if !(1..=limits::MAX_LAYERS).contains(&n) {
        return Err(bad("--layers", n, format!("in 1..={}", limits::MAX_LAYERS)));
    }
    Ok(())
}

/// Bytes this process may still allocate on the host: `MemAvailable`, capped by the
/// address-space limit (`ulimit -v`) when there is one; `None` when unknown.
fn host_bytes_available() -> Option<u128> {
    let kib = |text: &str, key: &str| -> Option<u128> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse::<u128>().ok().map(|k| k * 1024)
    };
    let avail = kib(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemAvailable:");
    let limit = std::fs::read_to_string("/proc/self/limits").ok().and_then(|t| {
        let line = t.lines().find(|l| l.starts_with("Max address space"))?;
        line.split_whitespace().nth(3)?.parse::<u128>().ok()
    });
    match (avail, limit) {
        (Some(a), Some(l)) => Some(a.min(l)),
        (a, l) => a.or(l),
    }
}

/// `porter bench --config` builds random weights for the whole geometry: on the CPU they
/// must fit in host memory, checked from the resolved weight map before anything is
/// allocated (a bounded but huge geometry would otherwise abort on allocation failure).
pub fn random_weights_fit(cfg: &serde_json::Value, dtype: DType, device: Device) -> Result<()> {
    if device != Device::Cpu {
        return Ok(());
    }
    let map = registry::resolve_config(cfg)?;
    let elems: u128 = map.slots.iter().map(|s| s.shape.iter().map(|&d| d as u128).product::<u128>()).sum();
    let bytes = elems.saturating_mul(dtype.size_in_bytes() as u128);
    if let Some(avail) = host_bytes_available() {
        if bytes > avail {
            let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
            bail!(
                "--config: random {dtype} weights of this geometry need {:.1} GiB, more than the {:.1} GiB of host \
                 memory available (use --layers, a smaller --dtype or a GPU)",
                gib(bytes),
                gib(avail)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_name_themselves() {
        for (r, needle) in [
            (sampling(-1.0, None, None, 0).map(|_| ()), "--temperature -1"),
            (sampling(f32::NAN, None, None, 0).map(|_| ()), "--temperature NaN"),
            (sampling(f32::INFINITY, None, None, 0).map(|_| ()), "--temperature inf"),
            (sampling(1e-30, None, None, 0).map(|_| ()), "--temperature"),
            (sampling(0.7, Some(0), None, 0).map(|_| ()), "--top-k 0"),
            (sampling(0.7, Some(1 << 30), None, 0).map(|_| ()), "--top-k"),
            (sampling(0.7, None, Some(0.0), 0).map(|_| ()), "--top-p 0"),
            (sampling(0.7, None, Some(f32::NAN), 0).map(|_| ()), "--top-p NaN"),
            (max_tokens(0), "--max-tokens 0"),
            (mtp_step(Some(0)), "--mtp-step 0"),
            (mtp_step(Some(MAX_MTP_STEP + 1)), "--mtp-step"),
            (layers(0), "--layers 0"),
            (layers(limits::MAX_LAYERS + 1), "--layers"),
        ] {
            let e = r.expect_err(needle).to_string();
            assert!(e.starts_with(needle), "{e}");
        }
        assert!(sampling(0.0, Some(5), Some(1.0), u64::MAX).is_ok());
        assert!(mtp_step(None).is_ok() && mtp_step(Some(MAX_MTP_STEP)).is_ok());
    }
}
