//! The layer traits and the generic model that drives them.
//!
//! Following LightLLM, a model is split into a [`PreLayer`] (token embedding), a stack of
//! [`TransformerLayer`]s (each owning its weights and reading/writing its own slice of the
//! [`StateCache`]) and a [`PostLayer`] (final norm + lm_head). A model crate builds these
//! pieces from its config and weights; [`Model`] runs them for a [`Batch`] of sequences.

pub mod draft;
pub mod graph;

use crate::bail;
use crate::error::{Context, Result};
use crate::layer::{PostLayer, PreLayer, TransformerLayer};
use crate::state::{Batch, CacheConfig, ModelCache, StateCache};
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;

/// Generation defaults: end-of-sequence ids and sampling parameters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
}

/// Facts about a loaded model that the runner needs.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub dtype: DType,
    /// Where the weights live (and the forward runs).
    pub device: crate::tensor::device::Device,
    pub max_position_embeddings: Option<usize>,
    pub generation: GenerationConfig,
    /// The KV-cache element type of the caches [`Model::new_cache`] and the serving engine's
    /// defaults make (`--kv-cache-dtype`; `auto` = the model dtype).
    pub kv_cache_dtype: crate::state::KvDtype,
}

/// Which rows get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Every row of the batch.
    All,
    /// The last row of every sequence.
    Last,
}

/// Whether `rows` are every row of a batch of `n` rows, in order (logits for all of them).
pub(crate) fn every_row(rows: &[usize], n: usize) -> bool {
    rows.len() == n && rows.iter().enumerate().all(|(i, &r)| i == r)
}

impl LogitsFor {
    /// The batch rows that get logits, in order.
    pub fn rows(self, batch: &Batch) -> Vec<usize> {
        match self {
            LogitsFor::All => (0..batch.len()).collect(),
            LogitsFor::Last => batch.spans.iter().map(|s| s.start + s.len - 1).collect(),
        }
    }
}

/// Result of a forward pass.
#[derive(Debug)]
pub struct ForwardOutput {
    /// `[R, vocab]`, R = T for [`LogitsFor::All`], R = number of sequences for [`LogitsFor::Last`].
    pub logits: Tensor,
    /// `[T, hidden]`: the residual stream after the last layer, before the final norm
    /// (what MTP draft heads consume).
    pub hidden: Tensor,
}

/// A decoder-only language model assembled from the three layer kinds.
pub struct Model {
    pub info: ModelInfo,
    pub pre: Box<dyn PreLayer>,
    pub layers: Vec<Box<dyn TransformerLayer>>,
    pub post: Box<dyn PostLayer>,
}

impl Model {
    /// A state cache for up to `max_seqs` concurrent sequences (device errors reported),
    /// with the default KV pool ([`Model::default_cache_tokens`] positions per sequence).
    pub fn new_cache(&self, max_seqs: usize) -> Result<ModelCache> {
        self.new_cache_spec(max_seqs, 0)
    }

    /// [`Model::new_cache`] whose recurrent layers can roll back up to `spec` rejected draft
    /// tokens.
    pub fn new_cache_spec(&self, max_seqs: usize, spec: usize) -> Result<ModelCache> {
        self.new_cache_with(
            &CacheConfig::for_tokens(max_seqs, spec, self.default_cache_tokens())
                .with_kv_dtype(self.info.kv_cache_dtype),
        )
    }

    /// Positions per sequence the default KV pool has room for: the whole context on the CPU
    /// (host blocks are allocated when first written), at most 4096 on a GPU (allocated up
    /// front; the serving engine sizes its pool from free memory instead).
    pub fn default_cache_tokens(&self) -> usize {
        let ctx = self.info.max_position_embeddings.unwrap_or(32_768);
        match self.info.device {
            crate::tensor::device::Device::Cpu => ctx,
            crate::tensor::device::Device::Cuda(_) => ctx.min(4096),
        }
    }

    /// A state cache of the given size. On a CUDA model the recurrent state pools for
    /// `cfg.max_seqs` slots and the KV pools of `cfg.num_blocks` blocks are allocated now.
    pub fn new_cache_with(&self, cfg: &CacheConfig) -> Result<ModelCache> {
        let (device, dtype) = (self.info.device, self.info.dtype);
        let layers = self.layers.iter().map(|l| l.new_cache(device, dtype, cfg)).collect::<Result<Vec<_>>>()?;
        let mut cache = ModelCache::new(layers, cfg);
        // CUDA graphs of decode / verify steps, captured at first use of each shape
        // (`crate::model::graph`; off with `backend::cuda::graph::set_enabled(false)`).
        if matches!(device, crate::tensor::device::Device::Cuda(_)) && crate::backend::cuda::graph::enabled() {
            cache.enable_graphs(cfg.max_seqs);
        }
        Ok(cache)
    }

    /// KV bytes one cached token takes over all attention layers, in the model's
    /// [`ModelInfo::kv_cache_dtype`].
    pub fn kv_bytes_per_token(&self) -> usize {
        self.kv_bytes_per_token_as(self.info.kv_cache_dtype)
    }

    /// KV bytes one cached token takes over all attention layers with K and V stored as
    /// `kv` (quantized: 1 byte per element plus an f32 scale per KV head, for K and V).
    pub fn kv_bytes_per_token_as(&self, kv: crate::state::KvDtype) -> usize {
        self.layers
            .iter()
            .map(|l| match l.kind() {
                crate::state::LayerKind::Attention { kv_heads, head_dim } => {
                    kv.bytes_per_token(kv_heads, head_dim, self.info.dtype)
                }
                _ => 0,
            })
            .sum()
    }

    /// Recurrent-state bytes one state slot takes over all linear-attention layers (with
    /// `spec` speculative snapshots).
    pub fn state_bytes_per_slot(&self, spec: usize) -> usize {
        self.layers
            .iter()
            .map(|l| match l.kind() {
                crate::state::LayerKind::Recurrent { conv_dim, kernel, state_len } => {
                    4 * ((spec + 1) * state_len) + conv_dim * (kernel.saturating_sub(1) + spec) * 4
                }
                _ => 0,
            })
            .sum()
    }

    /// Bytes one recurrent-state checkpoint of the prefix cache takes over all linear-attention
    /// layers with `spec` draft tokens of rollback: a conv window and one SSM state (f32).
    pub fn checkpoint_bytes(&self, spec: usize) -> usize {
        self.layers
            .iter()
            .map(|l| match l.kind() {
                crate::state::LayerKind::Recurrent { conv_dim, kernel, state_len } => {
                    4 * state_len + 4 * conv_dim * (kernel.saturating_sub(1) + spec).max(1)
                }
                _ => 0,
            })
            .sum()
    }

    /// Bytes one decode step moves: every layer's [`LayerCost::decode_bytes`](crate::layer::LayerCost::decode_bytes), the final
    /// norm and lm_head, and the embedding rows.
    pub fn decode_bytes(&self, batch: usize, context: usize) -> f64 {
        let layers: f64 = self.layers.iter().map(|l| l.cost().decode_bytes(batch, context)).sum();
        let embed = (batch * self.info.hidden_size * self.info.dtype.size_in_bytes()) as f64;
        layers + self.post.weight_bytes() as f64 + embed
    }

    /// Bytes the weights of the layers, the final norm and the lm_head hold (FP8 weights count
    /// their e4m3 bytes and scales).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let c = l.cost();
                c.dense_bytes + c.expert_bytes * c.experts
            })
            .sum();
        layers + self.post.weight_bytes()
    }

    /// One model from the per-rank models of a tensor-parallel group (rank r's weights are its
    /// shard): layer i runs every rank's layer i at once ([`crate::nn::TpLayer`]), the lm_head
    /// is vocab-parallel ([`crate::nn::TpHead`]), the embedding is rank 0's (replicated).
    pub fn tensor_parallel(group: std::sync::Arc<dyn crate::comm::TpGroup>, ranks: Vec<Model>) -> Result<Model> {
        let world = group.world();
        if ranks.len() != world || world == 0 {
            bail!(Internal, "{} rank models for a tensor-parallel group of {world}", ranks.len());
        }
        let n = ranks[0].layers.len();
        if ranks.iter().any(|m| m.layers.len() != n) {
            bail!(Internal, "tensor-parallel ranks built different layer counts");
        }
        let mut info = None;
        let mut pre = None;
        let mut layers: Vec<Vec<Box<dyn TransformerLayer>>> = (0..n).map(|_| Vec::with_capacity(world)).collect();
        let mut posts = Vec::with_capacity(world);
        for m in ranks {
            info.get_or_insert(m.info);
            pre.get_or_insert(m.pre);
            for (i, l) in m.layers.into_iter().enumerate() {
                layers[i].push(l);
            }
            posts.push(m.post);
        }
        let (Some(info), Some(pre)) = (info, pre) else { bail!(Internal, "no rank models") };
        let layers = layers
            .into_iter()
            .map(|shards| Box::new(crate::nn::TpLayer { shards, group: group.clone() }) as Box<dyn TransformerLayer>)
            .collect();
        Ok(Model { info, pre, layers, post: Box::new(crate::nn::TpHead { shards: posts, group }) })
    }

    /// Waits until the device has finished all queued work of this model (a no-op on the
    /// CPU); benchmarks call it before reading the clock.
    pub fn sync(&self) -> Result<()> {
        match self.info.device {
            crate::tensor::device::Device::Cpu => Ok(()),
            crate::tensor::device::Device::Cuda(i) => crate::tensor::cuda::gpu(i)?.sync(),
        }
    }

    /// Checks a batch against the vocabulary, the cache and the context length.
    fn validate(&self, batch: &Batch, cache: &dyn StateCache) -> Result<()> {
        if batch.is_empty() {
            bail!(Input, "empty batch: no token ids");
        }
        if let Some(&bad) = batch.ids.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            bail!(
                Input,
                "token id {bad} is out of range: the vocabulary has {} entries (valid ids 0..{})",
                self.info.vocab_size,
                self.info.vocab_size - 1
            );
        }
        let mut covered = 0;
        let mut seen = std::collections::HashSet::new();
        for s in &batch.spans {
            if !cache.is_live(s.seq) {
                bail!(Input, "sequence slot {} is not allocated in the state cache", s.seq.0);
            }
            if !seen.insert(s.seq) {
                bail!(Input, "sequence slot {} appears twice in one batch", s.seq.0);
            }
            if s.start != covered || s.len == 0 {
                bail!(Input, "batch spans must be contiguous and non-empty");
            }
            covered += s.len;
            let have = cache.seq_len(s.seq);
            if s.pos0 != have {
                bail!(
                    Input,
                    "sequence {} has {have} cached tokens but the batch starts it at position {}",
                    s.seq.0,
                    s.pos0
                );
            }
            if let Some(max) = self.info.max_position_embeddings {
                if s.pos0 + s.len > max {
                    bail!(Input, "sequence of {} tokens exceeds max_position_embeddings = {max}", s.pos0 + s.len);
                }
            }
        }
        if covered != batch.len() {
            bail!(Input, "batch spans cover {covered} rows but the batch has {}", batch.len());
        }
        Ok(())
    }

    /// Runs the batch through every layer, updates the cache and returns logits.
    pub fn forward(&self, batch: &Batch, cache: &mut dyn StateCache, rows: LogitsFor) -> Result<ForwardOutput> {
        self.forward_rows(batch, cache, &rows.rows(batch))
    }

    /// [`Model::forward`] with logits for the batch rows `rows` only (in that order; none
    /// when empty), as the serving engine needs: the last row of a finished prefill, every
    /// row of a speculative verify span, nothing for a prefill chunk.
    ///
    /// # Shapes
    /// logits `[rows.len(), vocab]`, hidden `[T, hidden]`
    pub fn forward_rows(&self, batch: &Batch, cache: &mut dyn StateCache, rows: &[usize]) -> Result<ForwardOutput> {
        use crate::backend::cuda::profile::host_span;
        let prep = host_span("model: validate");
        self.validate(batch, cache)?;
        if let Some(&bad) = rows.iter().find(|&&r| r >= batch.len()) {
            bail!(Input, "logits asked for row {bad} of a batch of {} rows", batch.len());
        }
        drop(prep);
        if let Some(mut graphs) = cache.take_graphs() {
            let _s = host_span("model: graphed forward");
            let out = self.forward_graphed(&mut graphs, batch, cache, rows);
            cache.put_graphs(graphs);
            if let Some(out) = out? {
                return Ok(out);
            }
        }
        self.forward_unchecked(batch, cache, rows)
    }

    /// [`Model::forward_rows`] without the checks of the batch against the cache (a CUDA
    /// graph's padded batch has [`crate::state::SeqId::PAD`] spans, which own no state).
    pub(crate) fn forward_unchecked(
        &self,
        batch: &Batch,
        cache: &mut dyn StateCache,
        rows: &[usize],
    ) -> Result<ForwardOutput> {
        use crate::backend::cuda::profile::host_span;
        let prep = host_span("model: cache prepare");
        cache.prepare(batch)?;
        drop(prep);
        // [T] -> [T, H]
        let mut x = self.pre.forward(&batch.ids)?;
        // Each layer's last residual add is handed to the next one (fused into its input norm
        // where the backend can); the last one is added here.
        let mut pending = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let _s = host_span(match layer.kind() {
                crate::state::LayerKind::Recurrent { .. } => "model: recurrent layer",
                _ => "model: attention layer",
            });
            (x, pending) =
                layer.forward_deferred(x, pending, batch, cache.layer_mut(i)?).with_context(|| format!("layer {i}"))?;
        }
        if let Some(p) = pending {
            x.add_(&p)?;
        }
        let _logits = host_span("model: advance + logits");
        for s in batch.spans.iter().filter(|s| !s.seq.is_pad()) {
            cache.advance(s.seq, s.len)?;
        }
        // [R, H] -> [R, vocab]
        let sel = if every_row(rows, batch.len()) {
            x.try_clone()?
        } else if rows.is_empty() {
            // No row asked for: an empty host tensor (nothing to compute or copy).
            let logits = Tensor::zeros([0, self.info.vocab_size], DType::F32);
            return Ok(ForwardOutput { logits, hidden: x });
        } else {
            x.gather_rows(rows)?
        };
        let normed = self.post.norm(&sel)?;
        let logits = self.post.logits(&normed)?;
        Ok(ForwardOutput { logits, hidden: x })
    }
}
