//! The layer traits (LightLLM's pre / transformer / post split) and what a layer tells the
//! engine about itself: the state it keeps ([`LayerKind`]) and the bytes it moves ([`LayerCost`]).

use crate::error::Result;
pub use crate::state::LayerKind;
use crate::state::{Batch, LayerCache};
use crate::tensor::Tensor;

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

    /// [`TransformerLayer::forward`] with the last residual add of the layer before deferred
    /// into this one: this layer's input is `x + pending` (`pending`: `[T, hidden]`, f32 or
    /// the model dtype). Returns the residual stream and this layer's own last branch output
    /// still to be added (`None`: already added), so that a layer can fuse each residual add
    /// into the norm after it. The values are those of `forward` layer after layer. By
    /// default: adds `pending`, runs `forward`.
    fn forward_deferred(
        &self,
        mut x: Tensor,
        pending: Option<Tensor>,
        batch: &Batch,
        cache: &mut LayerCache,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if let Some(p) = pending {
            x.add_(&p)?;
        }
        Ok((self.forward(x, batch, cache)?, None))
    }

    /// Bytes this layer moves per decode step (unknown: zeros).
    fn cost(&self) -> LayerCost {
        LayerCost::default()
    }

    /// The state this layer keeps for the cache `cfg` describes (by default the buffers
    /// [`TransformerLayer::kind`] asks for; a tensor-parallel layer keeps one set per rank).
    fn new_cache(
        &self,
        device: crate::tensor::Device,
        dtype: crate::tensor::DType,
        cfg: &crate::state::CacheConfig,
    ) -> Result<LayerCache> {
        LayerCache::new(self.kind(), device, dtype, cfg)
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
