//! The serving engine's sizes from the flags `porter serve` and `porter bench --serve` share:
//! sequences, batch budget, the KV pool from `--kv-cache-memory` / `--gpu-memory-utilization`,
//! and a hybrid model's recurrent-state checkpoints.

use crate::serve_bench::DEFAULT_GPU_MEMORY_UTILIZATION;
use anyhow::{bail, Result};
use porter_core::engine::EngineConfig;
use porter_core::state::CacheConfig;
use porter_core::{Device, Model};

/// The engine-size flags `porter bench --serve` and `porter serve` share.
pub struct EngineSizes {
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub kv_cache_memory: Option<usize>,
    pub gpu_memory_utilization: Option<f64>,
    pub state_checkpoints: Option<usize>,
    pub prefix_caching: bool,
}

/// The engine configuration for `model` and the size flags, with the KV pool's bytes: on
/// CUDA without `--kv-cache-memory`, `--gpu-memory-utilization` (default 0.9) of the device
/// memory free now (after the weights) less the recurrent state slots and the prefix cache's
/// state checkpoints (hybrid models: `--state-checkpoints`, by default 2 per sequence but at
/// most a tenth of that share).
///
/// # Errors
/// When that share leaves nothing for the KV cache, or the device cannot be queried.
pub fn sized_engine_config(model: &Model, a: &EngineSizes) -> Result<(EngineConfig, Option<usize>)> {
    let mut cfg = EngineConfig::for_model(model, None);
    if let Some(n) = a.max_num_seqs {
        cfg.max_num_seqs = n;
    }
    if let Some(n) = a.max_num_batched_tokens {
        cfg.max_num_batched_tokens = n;
    }
    let ck_bytes = model.checkpoint_bytes(0);
    cfg.prefix_caching = a.prefix_caching;
    cfg.state_checkpoints = match (a.state_checkpoints, ck_bytes) {
        (Some(_), 0) => bail!("--state-checkpoints applies to hybrid models (recurrent layers); this model has none"),
        (Some(n), _) if n > 0 && !a.prefix_caching => {
            bail!("--state-checkpoints {n} keeps checkpoints for the prefix cache, which --no-enable-prefix-caching turns off")
        }
        (None, 0) => 0,
        (None, _) if !a.prefix_caching => 0,
        (Some(n), _) => n,
        (None, _) => EngineConfig::default_checkpoints(model, cfg.max_num_seqs).0,
    };
    let kv_bytes = match (a.kv_cache_memory, model.info.device) {
        (Some(b), _) => Some(b),
        (None, Device::Cuda(i)) => {
            let f = a.gpu_memory_utilization.unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION);
            let free = porter_core::tensor::cuda::mem_info(i)?.0;
            let state = model.state_bytes_per_slot(0).saturating_mul(cfg.max_num_seqs);
            let budget = (free as f64 * f) as usize;
            if a.state_checkpoints.is_none() && ck_bytes > 0 {
                cfg.state_checkpoints = cfg.state_checkpoints.min(budget.saturating_sub(state) / 10 / ck_bytes);
            }
            let cks = ck_bytes.saturating_mul(cfg.state_checkpoints);
            if budget <= state.saturating_add(cks) {
                bail!(
                    "--gpu-memory-utilization {f}: {:.2} GB of the {:.2} GB free leave nothing for the KV cache after \
                     {} state slots of {:.2} GB and {} state checkpoints of {:.2} GB; raise it, or lower \
                     --max-num-seqs or --state-checkpoints",
                    budget as f64 / 1e9,
                    free as f64 / 1e9,
                    cfg.max_num_seqs,
                    state as f64 / 1e9,
                    cfg.state_checkpoints,
                    cks as f64 / 1e9
                );
            }
            Some(budget - state - cks)
        }
        (None, Device::Cpu) => None,
    };
    cfg.num_blocks = match kv_bytes {
        Some(b) => EngineConfig::for_model(model, Some(b)).num_blocks,
        None => CacheConfig::for_tokens(cfg.max_num_seqs, 0, model.default_cache_tokens()).num_blocks,
    };
    Ok((cfg, kv_bytes))
}
