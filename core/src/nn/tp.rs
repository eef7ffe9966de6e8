//! Tensor-parallel layers: one shard per rank, run on every rank's thread at once.
//!
//! Each rank's shard is an ordinary block built from that rank's slice of the weights (its
//! attention / Gated DeltaNet heads, its slice of every MLP and expert intermediate, its
//! vocabulary rows); the row-parallel projections inside it sum the ranks' partials through
//! the rank's [`Communicator`]. Every rank computes the replicated parts (norms, router,
//! residual stream) itself, on identical inputs, so all ranks hold bit-identical residuals
//! and the layer returns rank 0's.

use super::*;
use crate::comm::{run_ranks, TpGroup};
use crate::layer::{LayerCost, LayerKind, TransformerLayer};
use crate::state::CacheConfig;
use crate::tensor::Device;
use std::sync::Mutex;

/// A transformer layer split over the ranks of a tensor-parallel group.
///
/// # Shapes
/// `[T, hidden]` → `[T, hidden]` (every rank gets the whole input and returns the whole output)
pub struct TpLayer {
    pub shards: Vec<Box<dyn TransformerLayer>>,
    pub group: Arc<dyn TpGroup>,
}

/// Runs `f(rank, input)` on every rank with its own copy of `x` (rank 0 takes `x` itself).
fn on_every_rank<R: Send>(
    group: &dyn TpGroup,
    x: Tensor,
    f: impl Fn(usize, Tensor) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let world = group.world();
    let mut inputs = Vec::with_capacity(world);
    for _ in 1..world {
        inputs.push(Mutex::new(Some(x.try_clone()?)));
    }
    inputs.insert(0, Mutex::new(Some(x)));
    run_ranks(group, |r| {
        let x = inputs[r]
            .lock()
            .ok()
            .and_then(|mut g| g.take())
            .ok_or_else(|| crate::err!(Internal, "rank {r}: input already taken"))?;
        f(r, x)
    })
}

impl TransformerLayer for TpLayer {
    /// The state of one rank (what each device holds).
    fn kind(&self) -> LayerKind {
        self.shards[0].kind()
    }

    /// The bytes of one rank.
    fn cost(&self) -> LayerCost {
        self.shards[0].cost()
    }

    fn new_cache(&self, device: Device, dtype: DType, cfg: &CacheConfig) -> Result<LayerCache> {
        let caches = self.shards.iter().map(|s| s.new_cache(device, dtype, cfg)).collect::<Result<_>>()?;
        Ok(LayerCache::Sharded(caches))
    }

    fn forward(&self, x: Tensor, batch: &Batch, cache: &mut LayerCache) -> Result<Tensor> {
        let LayerCache::Sharded(caches) = cache else {
            bail!(Internal, "tensor-parallel layer was given an unsharded cache")
        };
        if caches.len() != self.shards.len() {
            bail!(Internal, "tensor-parallel layer of {} ranks was given {} caches", self.shards.len(), caches.len());
        }
        let caches: Vec<Mutex<&mut LayerCache>> = caches.iter_mut().map(Mutex::new).collect();
        let mut out = on_every_rank(&*self.group, x, |r, x| {
            let mut c = caches[r].lock().map_err(|_| crate::err!(Internal, "rank {r}: cache lock poisoned"))?;
            self.shards[r].forward(x, batch, &mut c)
        })?;
        Ok(out.swap_remove(0))
    }
}

/// The final norm and a vocab-parallel lm_head: every rank computes the logits of its
/// vocabulary rows, and an all-gather puts them side by side.
///
/// # Shapes
/// - each shard's lm_head: `[vocab / world, hidden]`
/// - `[R, hidden]` → `[R, vocab]` (f32)
pub struct TpHead {
    pub shards: Vec<Box<dyn PostLayer>>,
    pub group: Arc<dyn TpGroup>,
}

impl PostLayer for TpHead {
    /// The final norm is replicated: rank 0's is every rank's.
    fn norm(&self, h: &Tensor) -> Result<Tensor> {
        self.shards[0].norm(h)
    }

    fn logits(&self, normed: &Tensor) -> Result<Tensor> {
        let mut out = on_every_rank(&*self.group, normed.try_clone()?, |r, x| {
            let part = self.shards[r].logits(&x)?;
            self.group.comm(r).all_gather_last(&part)
        })?;
        Ok(out.swap_remove(0))
    }

    /// The bytes of one rank.
    fn weight_bytes(&self) -> usize {
        self.shards[0].weight_bytes()
    }
}
