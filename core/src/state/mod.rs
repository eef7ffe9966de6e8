//! Per-request state: the [`StateCache`] trait and its slot-indexed, paged implementation.
//!
//! A cache holds the state of many sequences at once. Each live sequence owns a state slot
//! ([`SeqId`]: its index in every recurrent-state pool) and a block table (its KV blocks in
//! the one [`BlockPool`] that every attention layer's paged pool is indexed by). Every layer
//! keeps its state in a [`LayerCache`]: a paged KV pool for attention layers, a fixed pool of
//! state slots (conv window + SSM state, with the speculative snapshots) for linear-attention
//! layers, nothing for stateless layers. Freed slots and blocks are reused.

pub mod blocks;
mod checkpoints;

pub use crate::backend::{KvCache, KvDtype, RecCache, RollbackMeta};
pub use crate::batch::{Batch, PageStep, SeqId, SeqSpan};
pub use blocks::{block_hash, BlockPool, BlockUsage};

use crate::bail;
use crate::error::Result;
use crate::tensor::{DType, Device};
use checkpoints::Checkpoints;
use std::sync::Arc;

/// Default KV block size (token positions per block).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// How big a model cache is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// State slots: the most sequences live at once.
    pub max_seqs: usize,
    /// Draft tokens a recurrent layer can roll back (speculative decoding).
    pub spec: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// KV blocks in the pool (shared by every sequence).
    pub num_blocks: usize,
    /// What the KV pools store K and V as (`auto`: the model dtype).
    pub kv_dtype: KvDtype,
    /// Recurrent-state checkpoints a hybrid model's prefix cache keeps (0: prefix caching is
    /// off for models with recurrent layers). On a GPU each layer's pool is allocated up
    /// front ([`crate::model::Model::checkpoint_bytes`] each), on the CPU when first written.
    pub checkpoints: usize,
    /// Positions between the checkpoints saved inside one prefill span (a multiple of
    /// [`CHECKPOINT_INTERVAL`]); the span's last aligned position and a sequence's branch
    /// point (where its prefix-cache hit ran out of checkpoints) are saved besides.
    pub checkpoint_stride: usize,
}

impl CacheConfig {
    /// Room for `max_seqs` sequences of up to `tokens_per_seq` positions each.
    pub fn for_tokens(max_seqs: usize, spec: usize, tokens_per_seq: usize) -> Self {
        let block_size = DEFAULT_BLOCK_SIZE;
        let per_seq = tokens_per_seq.max(1).div_ceil(block_size);
        let num_blocks = max_seqs.saturating_mul(per_seq).min(u32::MAX as usize / block_size);
        Self {
            max_seqs,
            spec,
            block_size,
            num_blocks,
            kv_dtype: KvDtype::Auto,
            checkpoints: 0,
            checkpoint_stride: CHECKPOINT_INTERVAL,
        }
    }

    /// The same sizes with K and V stored as `kv_dtype`.
    pub fn with_kv_dtype(self, kv_dtype: KvDtype) -> Self {
        Self { kv_dtype, ..self }
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

/// The state one layer keeps for every slot.
#[derive(Debug, Clone)]
pub enum LayerCache {
    /// Layers without per-request state.
    Stateless,
    /// Attention layers.
    Kv(KvCache),
    /// Linear-attention layers (conv + SSM state).
    Recurrent(RecCache),
    /// A tensor-parallel layer: one cache per rank (each rank's heads), all indexed by the
    /// same slots and KV blocks.
    Sharded(Vec<LayerCache>),
}

impl LayerCache {
    /// The state a layer of `kind` needs on `device` for the cache `cfg` describes.
    pub fn new(kind: LayerKind, device: Device, dtype: DType, cfg: &CacheConfig) -> Result<Self> {
        Ok(match kind {
            LayerKind::Attention { kv_heads, head_dim } => LayerCache::Kv(KvCache::new(
                device,
                kv_heads,
                head_dim,
                dtype,
                cfg.kv_dtype,
                cfg.block_size,
                cfg.num_blocks,
            )?),
            LayerKind::Recurrent { conv_dim, kernel, state_len } => LayerCache::Recurrent(RecCache::new(
                device,
                conv_dim,
                kernel,
                state_len,
                cfg.spec,
                cfg.max_seqs,
                cfg.checkpoints,
            )?),
            LayerKind::Stateless => LayerCache::Stateless,
        })
    }

    fn clear(&mut self, seq: SeqId) -> Result<()> {
        match self {
            LayerCache::Stateless | LayerCache::Kv(_) => Ok(()),
            LayerCache::Recurrent(r) => r.clear(seq),
            LayerCache::Sharded(v) => v.iter_mut().try_for_each(|c| c.clear(seq)),
        }
    }

    fn can_rollback(&self, seq: SeqId, from: usize, to: usize) -> bool {
        match self {
            LayerCache::Recurrent(r) => r.can_rollback(seq, from, to),
            LayerCache::Stateless | LayerCache::Kv(_) => true,
            LayerCache::Sharded(v) => v.iter().all(|c| c.can_rollback(seq, from, to)),
        }
    }

    fn truncate(&mut self, seq: SeqId, from: usize, len: usize) -> Result<()> {
        match self {
            // Positions past `len` are simply overwritten by the next step.
            LayerCache::Stateless | LayerCache::Kv(_) => Ok(()),
            LayerCache::Recurrent(r) => r.rollback(seq, from, len),
            LayerCache::Sharded(v) => v.iter_mut().try_for_each(|c| c.truncate(seq, from, len)),
        }
    }

    /// Every unsharded cache of this layer (itself, or each rank's).
    fn leaves_mut(&mut self) -> Vec<&mut LayerCache> {
        match self {
            LayerCache::Sharded(v) => v.iter_mut().flat_map(LayerCache::leaves_mut).collect(),
            c => vec![c],
        }
    }

    fn leaves(&self) -> Vec<&LayerCache> {
        match self {
            LayerCache::Sharded(v) => v.iter().flat_map(LayerCache::leaves).collect(),
            c => vec![c],
        }
    }
}

/// Per-request state of a whole model, for many sequences.
///
/// The lifecycle is `alloc_seq` → forwards (each layer reads/writes its slot, the model
/// then calls `advance`) → optional `truncate` (rollback of rejected draft tokens) →
/// `free_seq`, after which the slot is reused.
pub trait StateCache: Send {
    /// Takes a free slot for a new sequence.
    fn alloc_seq(&mut self) -> Result<SeqId>;
    /// Releases a slot and its state. A device error while clearing the slot is returned
    /// (the slot is then not handed out again).
    fn free_seq(&mut self, seq: SeqId) -> Result<()>;
    /// Tokens consumed by the sequence so far.
    fn seq_len(&self, seq: SeqId) -> usize;
    /// Whether the slot holds a live sequence.
    fn is_live(&self, seq: SeqId) -> bool;
    /// Marks `n` more tokens as consumed (after a forward wrote their state).
    fn advance(&mut self, seq: SeqId, n: usize) -> Result<()>;
    /// Rolls a sequence back to `len` consumed tokens.
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()>;
    /// The state of layer `layer`.
    fn layer_mut(&mut self, layer: usize) -> Result<&mut LayerCache>;
    /// Number of live sequences.
    fn live(&self) -> usize;
    /// Makes the KV blocks for every span of `batch` available and hands the attention
    /// layers the step's paging metadata; called once at the start of every forward.
    /// [`SeqId::PAD`] spans get no blocks.
    fn prepare(&mut self, batch: &Batch) -> Result<()>;

    /// The paging metadata of the last [`StateCache::prepare`] (none without attention layers).
    fn page_step(&self) -> Option<Arc<PageStep>> {
        None
    }

    /// Makes the block tables of the following prepares at least `width` entries wide (0: as
    /// wide as the longest sequence needs), as a CUDA graph captured for that width reads them.
    fn set_page_width(&mut self, _width: usize) {}

    /// Drops the per-step metadata the last prepare handed the layers (and its device copies).
    fn end_step(&mut self) {}

    /// Positions per KV block.
    fn block_size(&self) -> usize {
        DEFAULT_BLOCK_SIZE
    }

    /// The CUDA graphs captured against this cache's buffers, taken out for a forward (put
    /// back with [`StateCache::put_graphs`]); `None` when the cache keeps none.
    fn take_graphs(&mut self) -> Option<Box<crate::backend::cuda::graph::Graphs>> {
        None
    }

    /// Returns the graphs [`StateCache::take_graphs`] took.
    #[allow(clippy::boxed_local)] // the box moves back into the cache
    fn put_graphs(&mut self, _graphs: Box<crate::backend::cuda::graph::Graphs>) {}
}

/// The standard slot-indexed, paged [`StateCache`].
#[derive(Debug, Clone)]
pub struct ModelCache {
    layers: Vec<LayerCache>,
    lens: Vec<Option<usize>>,
    free: Vec<usize>,
    max_seqs: usize,
    pool: BlockPool,
    /// Each slot's KV blocks, in position order.
    tables: Vec<Vec<u32>>,
    /// Hashes of each slot's leading full blocks that are registered in the prefix cache.
    hashes: Vec<Vec<u64>>,
    /// Each slot's prefix-cache salt (the start of its hash chain; `None`: the common one).
    salts: Vec<Option<u64>>,
    has_kv: bool,
    has_recurrent: bool,
    /// The prefix cache turned off ([`ModelCache::disable_prefix_caching`]).
    prefix_off: bool,
    ck: Checkpoints,
    spec: usize,
    /// The least width of the block tables ([`StateCache::set_page_width`]).
    page_width: usize,
    /// CUDA graphs of decode / verify forwards over this cache's buffers (empty on a copy).
    graphs: crate::backend::cuda::graph::GraphSlot,
}

/// A new sequence's prefix-cache hit ([`ModelCache::alloc_seq_prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixHit {
    pub seq: SeqId,
    /// Leading tokens whose state is reused (not computed again).
    pub cached: usize,
    /// Leading tokens found in cached KV blocks: `cached`, or more when a recurrent model has
    /// no state checkpoint at the end of the match (the rest is recomputed).
    pub matched: usize,
}

/// Positions between recurrent-state checkpoints (the chunked delta rule's chunk: a state
/// saved there and resumed gives the same bits as a run that never stopped there).
pub const CHECKPOINT_INTERVAL: usize = 64;

/// The engine's default [`CacheConfig::checkpoint_stride`] on a GPU: every checkpoint inside
/// a prefill span splits its chunked delta-rule launch and copies 4·Hv·dk·dv bytes a layer
/// (2 MiB at Qwen3-Next-80B's sizes), so a GPU saves every 1024 positions — plus each span's
/// last aligned position and each sequence's branch point — where the CPU saves every 64.
pub const GPU_CHECKPOINT_STRIDE: usize = 1024;

impl ModelCache {
    /// A cache with the given per-layer state, for at most `cfg.max_seqs` live sequences and
    /// `cfg.num_blocks` KV blocks.
    pub fn new(layers: Vec<LayerCache>, cfg: &CacheConfig) -> Self {
        let leaves: Vec<&LayerCache> = layers.iter().flat_map(LayerCache::leaves).collect();
        let has_kv = leaves.iter().any(|l| matches!(l, LayerCache::Kv(_)));
        let has_recurrent = leaves.iter().any(|l| matches!(l, LayerCache::Recurrent(_)));
        let interval =
            if has_recurrent && has_kv && cfg.checkpoints > 0 && CHECKPOINT_INTERVAL.is_multiple_of(cfg.block_size) {
                CHECKPOINT_INTERVAL
            } else {
                0
            };
        Self {
            layers,
            lens: Vec::new(),
            free: Vec::new(),
            max_seqs: cfg.max_seqs,
            pool: BlockPool::new(cfg.block_size, if has_kv { cfg.num_blocks } else { 0 }),
            tables: Vec::new(),
            hashes: Vec::new(),
            salts: Vec::new(),
            has_kv,
            has_recurrent,
            prefix_off: false,
            ck: Checkpoints::new(interval, cfg.checkpoint_stride, if interval > 0 { cfg.checkpoints } else { 0 }),
            spec: cfg.spec,
            page_width: 0,
            graphs: Default::default(),
        }
    }

    /// Keeps CUDA graphs of decode / verify forwards for batches of up to `max_spans`
    /// sequences (captured on first use, or ahead with `Model::capture_graphs`). A clone of
    /// the cache keeps none: graphs address this cache's buffers.
    pub fn enable_graphs(&mut self, max_spans: usize) {
        self.graphs = crate::backend::cuda::graph::GraphSlot::new(max_spans);
    }

    /// Drops every CUDA graph and keeps none: each forward runs eagerly.
    pub fn disable_graphs(&mut self) {
        self.graphs = Default::default();
    }

    /// How this cache's CUDA graphs were used (`None`: it keeps none).
    pub fn graph_stats(&self) -> Option<crate::backend::cuda::graph::GraphStats> {
        self.graphs.0.as_ref().map(|g| g.stats)
    }

    /// The shapes of the CUDA graphs captured so far, and those whose capture failed with why.
    pub fn graph_shapes(
        &self,
    ) -> (Vec<crate::backend::cuda::graph::GraphKey>, Vec<(crate::backend::cuda::graph::GraphKey, String)>) {
        match &self.graphs.0 {
            Some(g) => (g.keys(), g.failed.iter().map(|(k, v)| (*k, v.clone())).collect()),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// Recurrent-state checkpoints: `(total, reusable)` — reusable = free or registered (LRU
    /// evictable); the rest are saved by a forward and wait for their block's hash.
    pub fn checkpoints(&self) -> (usize, usize) {
        (self.ck.hash.len(), self.ck.free.len() + self.ck.lru.len())
    }

    /// Whether prompts reuse cached KV blocks: a model with attention layers, not turned off,
    /// and with recurrent layers only where their state is checkpointed.
    pub fn prefix_caching(&self) -> bool {
        self.has_kv && !self.prefix_off && (!self.has_recurrent || self.ck.interval > 0)
    }

    /// Turns the prefix cache off: no block is registered or reused, no state checkpoint saved.
    pub fn disable_prefix_caching(&mut self) {
        self.prefix_off = true;
        self.ck.interval = 0;
    }

    /// Slots ever created (live + free); bounded by the peak number of live sequences.
    pub fn slots_created(&self) -> usize {
        self.lens.len()
    }

    /// The most sequences that can be live at once.
    pub fn max_seqs(&self) -> usize {
        self.max_seqs
    }

    /// Free state slots.
    pub fn free_slots(&self) -> usize {
        self.max_seqs - self.live()
    }

    /// KV block counts (all zero for a model without attention layers).
    pub fn blocks(&self) -> BlockUsage {
        self.pool.usage()
    }

    /// Positions per KV block.
    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// Whether the model keeps KV blocks at all.
    pub fn has_kv(&self) -> bool {
        self.has_kv
    }

    /// Whether the model has recurrent (linear-attention) layers.
    pub fn has_recurrent(&self) -> bool {
        self.has_recurrent
    }

    /// Blocks a sequence holds.
    pub fn seq_blocks(&self, seq: SeqId) -> &[u32] {
        self.tables.get(seq.0).map_or(&[], |t| &t[..])
    }

    /// New blocks sequence `seq` needs to hold `len` positions (0 when it already does, or
    /// when the model keeps no KV).
    pub fn blocks_needed(&self, seq: Option<SeqId>, len: usize) -> usize {
        if !self.has_kv {
            return 0;
        }
        let have = seq.map_or(0, |s| self.seq_blocks(s).len());
        len.div_ceil(self.pool.block_size()).saturating_sub(have)
    }

    /// Prefix-cache `(lookups, hits)` counted in blocks.
    pub fn prefix_stats(&self) -> (u64, u64) {
        self.pool.hit_stats()
    }

    fn check(&self, seq: SeqId) -> Result<usize> {
        match self.lens.get(seq.0) {
            Some(Some(l)) => Ok(*l),
            _ => bail!(Cache, "sequence slot {} is not allocated", seq.0),
        }
    }

    /// Makes sequence `seq` hold blocks for `len` positions.
    fn reserve(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let need = self.blocks_needed(Some(seq), len);
        if need > self.pool.free() {
            bail!(
                Cache,
                "KV cache out of blocks: sequence {} needs {need} more blocks of {} positions, {} of {} are free",
                seq.0,
                self.pool.block_size(),
                self.pool.free(),
                self.pool.usage().total
            );
        }
        for _ in 0..need {
            let b = self.pool.alloc().ok_or_else(|| crate::err!(Internal, "block pool miscounted"))?;
            self.tables[seq.0].push(b);
        }
        Ok(())
    }

    /// Releases the blocks of `seq` past the first `keep`.
    fn release_from(&mut self, seq: SeqId, keep: usize) {
        let Some(t) = self.tables.get_mut(seq.0) else { return };
        for b in t.drain(keep.min(t.len())..) {
            self.pool.release(b);
        }
        if let Some(h) = self.hashes.get_mut(seq.0) {
            h.truncate(keep);
        }
    }

    /// Registers the full blocks of `seq` covering `ids` (the sequence's tokens from position
    /// 0, all already computed) in the prefix cache. Recurrent models are not registered:
    /// their state at a block boundary is not kept, so a hit could not be resumed.
    pub fn register_prefix(&mut self, seq: SeqId, ids: &[u32]) -> Result<()> {
        let len = self.check(seq)?;
        if !self.prefix_caching() {
            return Ok(());
        }
        let bs = self.pool.block_size();
        let full = len.min(ids.len()) / bs;
        let (table, hashes, salt) = (&self.tables[seq.0], &mut self.hashes[seq.0], self.salts[seq.0]);
        while hashes.len() < full.min(table.len()) {
            let i = hashes.len();
            let h = block_hash(hashes.last().copied().or(salt), &ids[i * bs..(i + 1) * bs]);
            self.pool.register(table[i], h);
            hashes.push(h);
            // A checkpoint saved at this block's end now has its key.
            let end = (i + 1) * bs;
            let ck = &mut self.ck;
            if let Some(p) = ck.pending.get_mut(seq.0) {
                if let Some(j) = p.iter().position(|&(pos, _)| pos == end) {
                    let (_, c) = p.swap_remove(j);
                    match ck.by_hash.entry(h) {
                        std::collections::hash_map::Entry::Occupied(_) => ck.free.push(c),
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(c);
                            ck.hash[c] = Some(h);
                            ck.touch(c);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes a free slot for a new sequence whose tokens will be `ids`, reusing the longest
    /// chain of cached full blocks of `ids` (never the whole of `ids`: at least the last
    /// token is computed, to get its logits); with recurrent layers, up to the deepest block
    /// end of that chain with a state checkpoint. `salt`: the chain starts from it (only
    /// sequences of the same salt share blocks; [`ModelCache::register_prefix`] uses it too).
    pub fn alloc_seq_prefix(&mut self, ids: &[u32], salt: Option<u64>) -> Result<PrefixHit> {
        let seq = self.alloc_seq()?;
        self.salts[seq.0] = salt;
        if !self.prefix_caching() {
            return Ok(PrefixHit { seq, cached: 0, matched: 0 });
        }
        let bs = self.pool.block_size();
        let mut parent = salt;
        let mut n = 0;
        // With recurrent layers: the deepest block end with a saved state (and its slot).
        let mut resume = (0, None);
        while (n + 1) * bs < ids.len() {
            let h = block_hash(parent, &ids[n * bs..(n + 1) * bs]);
            let Some(b) = self.pool.lookup(h) else { break };
            self.tables[seq.0].push(b);
            self.hashes[seq.0].push(h);
            parent = Some(h);
            n += 1;
            if let Some(&c) = self.ck.by_hash.get(&h) {
                resume = (n, Some(c));
            }
        }
        let matched = n * bs;
        if self.has_recurrent {
            let (keep, c) = resume;
            // The KV hit ran past the deepest checkpoint: save one where it ends (aligned).
            let ci = self.ck.interval;
            let branch = n * bs / ci * ci;
            self.ck.branch[seq.0] = (branch > keep * bs).then_some(branch);
            self.release_from(seq, keep);
            n = keep;
            if let Some(c) = c {
                self.ck.touch(c);
                for layer in self.layers.iter_mut().flat_map(LayerCache::leaves_mut) {
                    if let LayerCache::Recurrent(r) = layer {
                        r.restore(seq, c)?;
                    }
                }
            }
        }
        self.lens[seq.0] = Some(n * bs);
        Ok(PrefixHit { seq, cached: n * bs, matched })
    }

    /// Recurrent-state checkpoints registered under a block's hash (findable by later prompts).
    pub fn checkpoints_cached(&self) -> usize {
        self.ck.lru.len()
    }
}

impl StateCache for ModelCache {
    fn alloc_seq(&mut self) -> Result<SeqId> {
        if let Some(s) = self.free.pop() {
            self.lens[s] = Some(0);
            return Ok(SeqId(s));
        }
        if self.lens.len() >= self.max_seqs {
            bail!(Cache, "state cache full: {} sequences live (max {})", self.live(), self.max_seqs);
        }
        self.lens.push(Some(0));
        self.tables.push(Vec::new());
        self.hashes.push(Vec::new());
        self.salts.push(None);
        self.ck.pending.push(Vec::new());
        self.ck.branch.push(None);
        Ok(SeqId(self.lens.len() - 1))
    }

    fn free_seq(&mut self, seq: SeqId) -> Result<()> {
        if let Some(l @ Some(_)) = self.lens.get_mut(seq.0) {
            *l = None;
            self.release_from(seq, 0);
            self.ck.drop_pending(seq.0, 0);
            if let Some(b) = self.ck.branch.get_mut(seq.0) {
                *b = None;
            }
            if let Some(s) = self.salts.get_mut(seq.0) {
                *s = None;
            }
            for layer in &mut self.layers {
                // Zeroing a device slot can only fail on a broken device; the slot is then
                // not handed out again, and the error goes to the caller.
                layer.clear(seq)?;
            }
            self.free.push(seq.0);
        }
        Ok(())
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.lens.get(seq.0).copied().flatten().unwrap_or(0)
    }

    fn is_live(&self, seq: SeqId) -> bool {
        matches!(self.lens.get(seq.0), Some(Some(_)))
    }

    fn advance(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let l = self.check(seq)?;
        self.lens[seq.0] = Some(l + n);
        Ok(())
    }

    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let l = self.check(seq)?;
        if len > l {
            bail!(Cache, "cannot roll sequence {} forward from {l} to {len}", seq.0);
        }
        // Check every layer first so that a refused rollback changes nothing.
        for (i, layer) in self.layers.iter().enumerate() {
            if !layer.can_rollback(seq, l, len) {
                bail!(Cache,
                    "cannot roll the recurrent state of sequence {} back from {l} to {len} tokens (layer {i}): only the tokens of the last step (at most the speculative window) can be rejected",
                    seq.0
                );
            }
        }
        for layer in &mut self.layers {
            layer.truncate(seq, l, len)?;
        }
        self.lens[seq.0] = Some(len);
        // Blocks wholly past the new length go back to the pool; a registered block that
        // now holds rejected positions leaves the sequence's hash chain.
        let bs = self.pool.block_size();
        self.release_from(seq, len.div_ceil(bs));
        if let Some(h) = self.hashes.get_mut(seq.0) {
            h.truncate(len / bs);
        }
        self.ck.drop_pending(seq.0, len + 1);
        Ok(())
    }

    fn layer_mut(&mut self, layer: usize) -> Result<&mut LayerCache> {
        let n = self.layers.len();
        self.layers.get_mut(layer).ok_or_else(|| crate::err!(Cache, "layer {layer} out of range ({n} layers)"))
    }

    fn live(&self) -> usize {
        self.lens.iter().filter(|l| l.is_some()).count()
    }

    fn prepare(&mut self, batch: &Batch) -> Result<()> {
        if !self.has_kv {
            return Ok(());
        }
        for s in batch.spans.iter().filter(|s| !s.seq.is_pad()) {
            self.check(s.seq)?;
            self.reserve(s.seq, s.pos0 + s.len)?;
        }
        let lists: Vec<&[u32]> =
            batch.spans.iter().map(|s| if s.seq.is_pad() { &[][..] } else { &self.tables[s.seq.0][..] }).collect();
        let step = Arc::new(PageStep::with_width(batch, self.pool.block_size(), &lists, self.page_width)?);
        // Recurrent checkpoints inside a chunked (prefill) span that starts aligned: at the
        // multiples of the stride, at the span's last aligned position and at the sequence's
        // branch point.
        let mut saves = Vec::new();
        let (c, stride) = (self.ck.interval, self.ck.stride);
        if c > 0 {
            for (i, s) in batch.spans.iter().enumerate() {
                if s.seq.is_pad() || s.len <= (self.spec + 1).max(1) || !s.pos0.is_multiple_of(c) {
                    continue;
                }
                let end = s.pos0 + s.len / c * c;
                let branch = self.ck.branch[s.seq.0];
                let mut b = s.pos0 + c;
                while b <= end {
                    if b.is_multiple_of(stride) || b == end || Some(b) == branch {
                        let Some(slot) = self.ck.take() else { break };
                        saves.push(crate::backend::CkptSave { span: i, pos: b, slot });
                        self.ck.pending[s.seq.0].push((b, slot));
                    }
                    b += c;
                }
                if branch.is_some_and(|p| p <= end) {
                    self.ck.branch[s.seq.0] = None;
                }
            }
        }
        let saves = Arc::new(saves);
        for layer in self.layers.iter_mut().flat_map(LayerCache::leaves_mut) {
            match layer {
                LayerCache::Kv(kv) => kv.step = Some(step.clone()),
                LayerCache::Recurrent(r) => r.ckpt_step = Some(saves.clone()),
                LayerCache::Stateless | LayerCache::Sharded(_) => {}
            }
        }
        Ok(())
    }

    fn page_step(&self) -> Option<Arc<PageStep>> {
        self.layers.iter().flat_map(LayerCache::leaves).find_map(|l| match l {
            LayerCache::Kv(kv) => kv.step.clone(),
            _ => None,
        })
    }

    fn set_page_width(&mut self, width: usize) {
        self.page_width = width;
    }

    fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    fn end_step(&mut self) {
        for layer in self.layers.iter_mut().flat_map(LayerCache::leaves_mut) {
            match layer {
                LayerCache::Kv(kv) => kv.step = None,
                LayerCache::Recurrent(r) => r.ckpt_step = None,
                LayerCache::Stateless | LayerCache::Sharded(_) => {}
            }
        }
    }

    fn take_graphs(&mut self) -> Option<Box<crate::backend::cuda::graph::Graphs>> {
        self.graphs.0.take()
    }

    fn put_graphs(&mut self, graphs: Box<crate::backend::cuda::graph::Graphs>) {
        self.graphs.0 = Some(graphs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(blocks: usize, max_seqs: usize) -> ModelCache {
        let cfg = CacheConfig { block_size: 2, num_blocks: blocks, ..CacheConfig::for_tokens(max_seqs, 0, 1) };
        let kv = KvCache::new(Device::Cpu, 1, 2, DType::F32, Default::default(), 2, blocks).unwrap();
        ModelCache::new(vec![LayerCache::Kv(kv), LayerCache::Stateless], &cfg)
    }

    #[test]
    fn slots_and_blocks_are_reused_without_leaks() {
        let mut c = cache(8, 4);
        for round in 0..1000usize {
            let a = c.alloc_seq().unwrap();
            let b = c.alloc_seq().unwrap();
            c.prepare(&Batch::single(a, 0, &[1, 2, 3])).unwrap();
            c.advance(a, 3).unwrap();
            assert_eq!(c.seq_blocks(a).len(), 2);
            // Free in both orders.
            if round % 2 == 0 {
                c.free_seq(a).unwrap();
                c.free_seq(b).unwrap();
            } else {
                c.free_seq(b).unwrap();
                c.free_seq(a).unwrap();
            }
            assert_eq!(c.live(), 0);
            assert_eq!(c.blocks().free, 8);
        }
        assert!(c.lens.len() <= 2, "slots leaked: {}", c.lens.len());
        let s: Vec<_> = (0..4).map(|_| c.alloc_seq().unwrap()).collect();
        assert!(c.alloc_seq().is_err());
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn truncate_releases_whole_blocks() {
        let mut c = cache(4, 1);
        let a = c.alloc_seq().unwrap();
        c.prepare(&Batch::single(a, 0, &[1, 2, 3, 4, 5])).unwrap();
        c.advance(a, 5).unwrap();
        assert_eq!(c.blocks().free, 1);
        c.truncate(a, 2).unwrap();
        assert_eq!(c.seq_len(a), 2);
        assert_eq!(c.seq_blocks(a).len(), 1);
        assert_eq!(c.blocks().free, 3);
        assert!(c.truncate(a, 3).is_err());
    }

    #[test]
    fn running_out_of_blocks_is_a_cache_error() {
        let mut c = cache(2, 2);
        let a = c.alloc_seq().unwrap();
        let e = c.prepare(&Batch::single(a, 0, &[1, 2, 3, 4, 5])).unwrap_err();
        assert!(e.to_string().contains("out of blocks"), "{e}");
        assert_eq!(c.blocks().free, 2, "a refused reservation takes nothing");
    }

    #[test]
    fn prefix_blocks_are_shared_and_survive_their_first_owner() {
        let mut c = cache(6, 3);
        let ids = [5, 6, 7, 8, 9];
        let a = c.alloc_seq().unwrap();
        c.prepare(&Batch::single(a, 0, &ids)).unwrap();
        c.advance(a, 5).unwrap();
        c.register_prefix(a, &ids).unwrap();
        let PrefixHit { seq: b, cached: hit, .. } = c.alloc_seq_prefix(&[5, 6, 7, 8, 1, 2], None).unwrap();
        assert_eq!(hit, 4);
        assert_eq!(c.seq_blocks(b), &c.seq_blocks(a)[..2]);
        c.free_seq(a).unwrap();
        // b still holds the two shared blocks; a's third block is free.
        assert_eq!(c.blocks().free, 4);
        c.free_seq(b).unwrap();
        assert_eq!(c.blocks(), BlockUsage { block_size: 2, total: 6, free: 6, cached: 2 });
        // A prompt equal to a cached prefix still computes its last token.
        let PrefixHit { seq: d, cached: hit, .. } = c.alloc_seq_prefix(&[5, 6, 7, 8], None).unwrap();
        assert_eq!(hit, 2);
        assert_eq!(c.seq_len(d), 2);
    }
}
