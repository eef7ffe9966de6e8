//! The layer traits and the generic model that drives them.
//!
//! Following LightLLM, a model is split into a [`PreLayer`] (token embedding), a stack of
//! [`TransformerLayer`]s (each owning its weights and reading/writing its own slice of the
//! [`StateCache`]) and a [`PostLayer`] (final norm + lm_head). A model crate builds these
//! pieces from its config and weights; [`Model`] runs them for a [`Batch`] of sequences.

use crate::cache::{LayerCache, ModelCache, SeqId, StateCache};
use crate::config::GenerationConfig;
use crate::dtype::DType;
use crate::tensor::Tensor;
use anyhow::{bail, Context, Result};

/// The rows of one sequence inside a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    /// The sequence's cache slot.
    pub seq: SeqId,
    /// First row of this sequence in the batch.
    pub start: usize,
    /// Number of rows (new tokens).
    pub len: usize,
    /// Absolute position of the first row (= tokens already in the cache).
    pub pos0: usize,
}

/// Token ids of several sequences laid out one after another.
///
/// # Shapes
/// `ids`: `[T]` with `T = Σ spans.len`; activations are `[T, hidden]`.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub ids: Vec<u32>,
    pub spans: Vec<SeqSpan>,
    /// The batch's positions and span tables on a CUDA device, uploaded once per forward by
    /// the first layer that needs them and shared by the others.
    pub(crate) dev: std::sync::OnceLock<std::sync::Arc<crate::gpu_blocks::BatchDev>>,
}

impl Batch {
    /// A batch with one sequence.
    pub fn single(seq: SeqId, pos0: usize, ids: &[u32]) -> Self {
        Self {
            ids: ids.to_vec(),
            spans: vec![SeqSpan { seq, start: 0, len: ids.len(), pos0 }],
            dev: std::sync::OnceLock::new(),
        }
    }

    /// Appends a sequence's new tokens.
    pub fn push(&mut self, seq: SeqId, pos0: usize, ids: &[u32]) {
        let start = self.ids.len();
        self.dev = std::sync::OnceLock::new();
        self.ids.extend_from_slice(ids);
        self.spans.push(SeqSpan { seq, start, len: ids.len(), pos0 });
    }

    /// Absolute position of every row.
    pub fn positions(&self) -> Vec<usize> {
        let mut p = vec![0; self.ids.len()];
        for s in &self.spans {
            for i in 0..s.len {
                p[s.start + i] = s.pos0 + i;
            }
        }
        p
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// What per-request state a layer keeps (used to build caches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Full attention with a KV cache.
    Attention { kv_heads: usize, head_dim: usize },
    /// Linear attention with a conv window and a recurrent state.
    Recurrent { conv_dim: usize, kernel: usize, state_len: usize },
    /// No per-request state.
    Stateless,
}

/// What one layer reads and writes per decode step (roofline accounting in `porter bench`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerCost {
    /// Weight bytes every step reads (projections, norms, router, shared expert).
    pub dense_bytes: usize,
    /// Bytes of one routed expert (gate + up + down); 0 without routed experts.
    pub expert_bytes: usize,
    /// Routed experts and how many each token uses.
    pub experts: usize,
    pub top_k: usize,
    /// Recurrent state bytes per sequence (each read and written once per step).
    pub state_bytes: usize,
    /// KV bytes per cached token per sequence (read once per step).
    pub kv_bytes_per_token: usize,
}

impl LayerCost {
    /// Bytes moved by one decode step of `batch` sequences with `context` cached tokens
    /// each; routed experts are counted once per distinct expert, with the expected number
    /// of distinct experts under uniform routing, `E·(1 − (1 − k/E)^batch)`.
    pub fn decode_bytes(&self, batch: usize, context: usize) -> f64 {
        let distinct = if self.experts == 0 {
            0.0
        } else {
            let e = self.experts as f64;
            e * (1.0 - (1.0 - self.top_k as f64 / e).powi(batch as i32))
        };
        self.dense_bytes as f64
            + self.expert_bytes as f64 * distinct
            + (batch * 2 * self.state_bytes) as f64
            + (batch * context * self.kv_bytes_per_token) as f64
    }
}

/// Token embedding.
pub trait PreLayer: Send + Sync {
    /// # Shapes
    /// `ids: [T]` → `[T, hidden]`
    fn forward(&self, ids: &[u32]) -> Result<Tensor>;
}

/// One decoder layer (attention or linear attention, then the MLP / MoE, with residuals).
pub trait TransformerLayer: Send + Sync {
    /// The state this layer needs per request.
    fn kind(&self) -> LayerKind;

    /// # Shapes
    /// `x: [T, hidden]` → `[T, hidden]` (the residual stream after this layer)
    fn forward(&self, x: Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor>;

    /// Bytes this layer moves per decode step (unknown: zeros).
    fn cost(&self) -> LayerCost {
        LayerCost::default()
    }
}

/// Final norm and lm_head.
pub trait PostLayer: Send + Sync {
    /// # Shapes
    /// `[R, hidden]` → `[R, hidden]`
    fn norm(&self, h: &Tensor) -> Result<Tensor>;
    /// # Shapes
    /// `[R, hidden]` (normed) → `[R, vocab]`
    fn logits(&self, normed: &Tensor) -> Result<Tensor>;

    /// Weight bytes read per step (final norm + lm_head).
    fn weight_bytes(&self) -> usize {
        0
    }
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
    pub device: crate::device::Device,
    pub max_position_embeddings: Option<usize>,
    pub generation: GenerationConfig,
}

/// Which rows get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Every row of the batch.
    All,
    /// The last row of every sequence.
    Last,
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
    /// A state cache for up to `max_seqs` concurrent sequences.
    pub fn new_cache(&self, max_seqs: usize) -> ModelCache {
        self.new_cache_spec(max_seqs, 0)
    }

    /// A state cache whose recurrent layers can roll back up to `spec` rejected draft tokens.
    ///
    /// # Panics
    /// When the device cannot hold the cache (see [`Model::try_new_cache_spec`]).
    pub fn new_cache_spec(&self, max_seqs: usize, spec: usize) -> ModelCache {
        match self.try_new_cache_spec(max_seqs, spec) {
            Ok(c) => c,
            Err(e) => panic!("cannot allocate the state cache: {e:#}"),
        }
    }

    /// As [`Model::new_cache_spec`], with device allocation errors reported. On a CUDA
    /// model the recurrent state pools for `max_seqs` slots are allocated up front and the
    /// KV buffers grow per sequence.
    pub fn try_new_cache_spec(&self, max_seqs: usize, spec: usize) -> Result<ModelCache> {
        let gpu = match self.info.device {
            crate::device::Device::Cpu => None,
            crate::device::Device::Cuda(i) => Some(crate::gpu::gpu(i)?),
        };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match (l.kind(), &gpu) {
                    (LayerKind::Attention { kv_heads, head_dim }, None) => {
                        LayerCache::Kv(crate::cache::KvLayer::new(kv_heads, head_dim))
                    }
                    (LayerKind::Attention { kv_heads, head_dim }, Some(g)) => LayerCache::KvCuda(
                        crate::gpu_blocks::DevKv::new(g.clone(), kv_heads, head_dim, self.info.dtype),
                    ),
                    (LayerKind::Recurrent { conv_dim, kernel, state_len }, None) => {
                        LayerCache::Recurrent(crate::cache::RecurrentLayer::new(conv_dim, kernel, state_len, spec))
                    }
                    (LayerKind::Recurrent { conv_dim, kernel, state_len }, Some(g)) => LayerCache::RecurrentCuda(
                        crate::gpu_blocks::DevRecurrent::new(g.clone(), conv_dim, kernel, state_len, spec, max_seqs)?,
                    ),
                    (LayerKind::Stateless, _) => LayerCache::Stateless,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelCache::new(layers, max_seqs))
    }

    /// Bytes one decode step moves: every layer's [`LayerCost::decode_bytes`], the final
    /// norm and lm_head, and the embedding rows.
    pub fn decode_bytes(&self, batch: usize, context: usize) -> f64 {
        let layers: f64 = self.layers.iter().map(|l| l.cost().decode_bytes(batch, context)).sum();
        let embed = (batch * self.info.hidden_size * self.info.dtype.size_in_bytes()) as f64;
        layers + self.post.weight_bytes() as f64 + embed
    }

    /// Waits until the device has finished all queued work of this model (a no-op on the
    /// CPU); benchmarks call it before reading the clock.
    pub fn sync(&self) -> Result<()> {
        match self.info.device {
            crate::device::Device::Cpu => Ok(()),
            crate::device::Device::Cuda(i) => crate::gpu::gpu(i)?.sync(),
        }
    }

    /// Checks a batch against the vocabulary, the cache and the context length.
    fn validate(&self, batch: &Batch, cache: &dyn StateCache) -> Result<()> {
        if batch.is_empty() {
            bail!("empty batch: no token ids");
        }
        if let Some(&bad) = batch.ids.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            bail!(
                "token id {bad} is out of range: the vocabulary has {} entries (valid ids 0..{})",
                self.info.vocab_size,
                self.info.vocab_size - 1
            );
        }
        let mut covered = 0;
        let mut seen = std::collections::HashSet::new();
        for s in &batch.spans {
            if !cache.is_live(s.seq) {
                bail!("sequence slot {} is not allocated in the state cache", s.seq.0);
            }
            if !seen.insert(s.seq) {
                bail!("sequence slot {} appears twice in one batch", s.seq.0);
            }
            if s.start != covered || s.len == 0 {
                bail!("batch spans must be contiguous and non-empty");
            }
            covered += s.len;
            let have = cache.seq_len(s.seq);
            if s.pos0 != have {
                bail!("sequence {} has {have} cached tokens but the batch starts it at position {}", s.seq.0, s.pos0);
            }
            if let Some(max) = self.info.max_position_embeddings {
                if s.pos0 + s.len > max {
                    bail!("sequence of {} tokens exceeds max_position_embeddings = {max}", s.pos0 + s.len);
                }
            }
        }
        if covered != batch.len() {
            bail!("batch spans cover {covered} rows but the batch has {}", batch.len());
        }
        Ok(())
    }

    /// Runs the batch through every layer, updates the cache and returns logits.
    pub fn forward(&self, batch: &Batch, cache: &mut dyn StateCache, rows: LogitsFor) -> Result<ForwardOutput> {
        self.validate(batch, cache)?;
        // [T] -> [T, H]
        let mut x = self.pre.forward(&batch.ids)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x, batch, cache.layer_mut(i)?).with_context(|| format!("layer {i}"))?;
        }
        for s in &batch.spans {
            cache.advance(s.seq, s.len)?;
        }
        let sel = match rows {
            LogitsFor::All => x.try_clone()?,
            LogitsFor::Last => {
                let idx: Vec<usize> = batch.spans.iter().map(|s| s.start + s.len - 1).collect();
                x.gather_rows(&idx)?
            }
        };
        let normed = self.post.norm(&sel)?;
        let logits = self.post.logits(&normed)?;
        Ok(ForwardOutput { logits, hidden: x })
    }
}
