//! Per-request state: the [`StateCache`] trait and its slot-indexed implementation.
//!
//! A cache holds the state of many sequences at once. Each live sequence owns a slot
//! ([`SeqId`]); every layer keeps its state for that slot in a [`LayerCache`]: a KV cache
//! for attention layers, nothing for stateless layers (recurrent-state pools for linear
//! attention plug in as another variant). Freed slots are reused.

mod batch;

pub use batch::{Batch, SeqSpan};

use crate::bail;
use crate::error::Result;

/// A sequence's slot in a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub usize);

/// Key/value cache of one attention layer for every slot.
///
/// # Shapes
/// per slot: `k`, `v`: `[len, kv_heads, head_dim]`
#[derive(Debug, Clone)]
pub struct KvLayer {
    pub kv_heads: usize,
    pub head_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvLayer {
    pub fn new(kv_heads: usize, head_dim: usize) -> Self {
        Self { kv_heads, head_dim, k: Vec::new(), v: Vec::new() }
    }

    fn ensure(&mut self, slot: usize) {
        if self.k.len() <= slot {
            self.k.resize_with(slot + 1, Vec::new);
            self.v.resize_with(slot + 1, Vec::new);
        }
    }

    /// Writes the keys/values of positions `pos0..pos0+t` (dropping anything cached at or
    /// after `pos0`) and returns the whole cached `(k, v)` of the slot.
    pub fn write(&mut self, seq: SeqId, pos0: usize, k: &[f32], v: &[f32]) -> Result<(&[f32], &[f32])> {
        let row = self.kv_heads * self.head_dim;
        self.ensure(seq.0);
        let (kc, vc) = (&mut self.k[seq.0], &mut self.v[seq.0]);
        if kc.len() < pos0 * row {
            bail!(
                Cache,
                "KV cache of slot {} holds {} positions, cannot write at position {pos0}",
                seq.0,
                kc.len() / row.max(1)
            );
        }
        kc.truncate(pos0 * row);
        vc.truncate(pos0 * row);
        kc.extend_from_slice(k);
        vc.extend_from_slice(v);
        Ok((&self.k[seq.0], &self.v[seq.0]))
    }

    /// Number of cached positions of a slot.
    pub fn len(&self, seq: SeqId) -> usize {
        self.k.get(seq.0).map_or(0, |k| k.len() / (self.kv_heads * self.head_dim).max(1))
    }

    pub fn is_empty(&self, seq: SeqId) -> bool {
        self.len(seq) == 0
    }

    /// Drops positions `len..`.
    pub fn truncate(&mut self, seq: SeqId, len: usize) {
        let row = self.kv_heads * self.head_dim;
        if let Some(k) = self.k.get_mut(seq.0) {
            k.truncate(len * row);
        }
        if let Some(v) = self.v.get_mut(seq.0) {
            v.truncate(len * row);
        }
    }

    fn clear(&mut self, seq: SeqId) {
        if let Some(k) = self.k.get_mut(seq.0) {
            *k = Vec::new();
        }
        if let Some(v) = self.v.get_mut(seq.0) {
            *v = Vec::new();
        }
    }
}

/// One slot of a [`RecurrentLayer`].
#[derive(Debug, Clone, Default)]
struct RecurrentSlot {
    /// Raw conv inputs of the last `kernel − 1 + spec` tokens, time-major `[n, conv_dim]`.
    conv_hist: Vec<f32>,
    /// `spec + 1` SSM state buffers of `state_len` f32 each (allocated lazily).
    ssm: Vec<Vec<f32>>,
    /// The buffer holding the current state.
    cur: usize,
    /// Tokens consumed before the last step.
    base: usize,
    /// Tokens of the last step whose post-token states are kept (buffer j = state after
    /// token `base + j`); 0 when only the final state is kept.
    kept: usize,
}

/// Conv and SSM state of one linear-attention (Gated DeltaNet) layer for every slot.
///
/// For speculative decoding the layer keeps `spec + 1` SSM buffers and a conv window widened
/// to `kernel − 1 + spec` inputs per slot (engine.md §4.6): a step of `t ≤ spec + 1` tokens
/// writes the state after each token into its own buffer, so rejecting draft tokens only
/// moves the `cur` index and drops conv inputs; nothing is recomputed or copied back.
///
/// # Shapes
/// per slot: conv window `[kernel − 1, conv_dim]` (oldest first), SSM `[Hv, dk, dv]` f32
#[derive(Debug, Clone)]
pub struct RecurrentLayer {
    pub conv_dim: usize,
    pub kernel: usize,
    pub state_len: usize,
    /// Maximum draft tokens that can be rolled back (0: no snapshots).
    pub spec: usize,
    slots: Vec<RecurrentSlot>,
}

impl RecurrentLayer {
    pub fn new(conv_dim: usize, kernel: usize, state_len: usize, spec: usize) -> Self {
        Self { conv_dim, kernel, state_len, spec, slots: Vec::new() }
    }

    fn slot(&mut self, seq: SeqId) -> &mut RecurrentSlot {
        if self.slots.len() <= seq.0 {
            self.slots.resize_with(seq.0 + 1, RecurrentSlot::default);
        }
        let (n, len) = (self.spec + 1, self.state_len);
        let s = &mut self.slots[seq.0];
        if s.ssm.len() != n {
            s.ssm = vec![vec![0.0; len]; n];
            s.cur = 0;
        }
        s
    }

    /// The conv state for the next token: the last `kernel − 1` inputs, channel-major
    /// `[conv_dim, kernel − 1]`, oldest first, zero-padded at the start of a sequence.
    pub fn conv_state(&mut self, seq: SeqId) -> Vec<f32> {
        let (c, w) = (self.conv_dim, self.kernel.saturating_sub(1));
        let hist = &self.slot(seq).conv_hist;
        let n = hist.len() / c.max(1);
        let mut st = vec![0.0; c * w];
        for j in 0..w.min(n) {
            // column w-1-j holds the input j steps back
            let row = &hist[(n - 1 - j) * c..(n - j) * c];
            for ch in 0..c {
                st[ch * w + (w - 1 - j)] = row[ch];
            }
        }
        st
    }

    /// Appends this step's raw conv inputs (`[t, conv_dim]`) to the window.
    pub fn push_conv_inputs(&mut self, seq: SeqId, x: &[f32]) {
        let keep = (self.kernel.saturating_sub(1) + self.spec) * self.conv_dim;
        let s = self.slot(seq);
        s.conv_hist.extend_from_slice(x);
        if s.conv_hist.len() > keep {
            let cut = s.conv_hist.len() - keep;
            s.conv_hist.drain(..cut);
        }
    }

    /// Whether a step of `t` tokens keeps a state per token (rollback possible).
    pub fn snapshots_for(&self, t: usize) -> bool {
        self.spec > 0 && t <= self.spec + 1
    }

    /// The current SSM state of a slot.
    pub fn ssm_mut(&mut self, seq: SeqId) -> &mut [f32] {
        let s = self.slot(seq);
        let cur = s.cur;
        &mut s.ssm[cur]
    }

    /// Records a step that updated the current buffer in place (no per-token snapshots).
    pub fn finish_step(&mut self, seq: SeqId, pos0: usize) {
        let s = self.slot(seq);
        s.base = pos0;
        s.kept = 0;
    }

    /// Buffer `j` of a slot (for per-token snapshots), and the current one, by index.
    pub fn snapshot_buffers(&mut self, seq: SeqId) -> (&mut Vec<Vec<f32>>, usize) {
        let s = self.slot(seq);
        let cur = s.cur;
        (&mut s.ssm, cur)
    }

    /// Records a step of `t` tokens whose post-token states are in buffers `0..t`.
    pub fn finish_snapshot_step(&mut self, seq: SeqId, pos0: usize, t: usize) {
        let s = self.slot(seq);
        s.base = pos0;
        s.kept = t;
        s.cur = t - 1;
    }

    /// Whether the slot can roll back from `from` to `to` consumed tokens.
    pub fn can_rollback(&self, seq: SeqId, from: usize, to: usize) -> bool {
        if to == from {
            return true;
        }
        match self.slots.get(seq.0) {
            Some(s) => s.kept > 0 && to > s.base && from == s.base + s.kept,
            None => false,
        }
    }

    /// Rolls a slot back from `from` to `to` consumed tokens (`to ≤ from`).
    pub fn rollback(&mut self, seq: SeqId, from: usize, to: usize) -> Result<()> {
        if to == from {
            return Ok(());
        }
        if !self.can_rollback(seq, from, to) {
            bail!(Cache,
                "cannot roll the recurrent state of slot {} back from {from} to {to} tokens: only the tokens of the last step (at most the speculative window) can be rejected",
                seq.0
            );
        }
        let c = self.conv_dim;
        let s = self.slot(seq);
        s.cur = to - s.base - 1;
        s.kept = to - s.base;
        let drop = (from - to) * c;
        let n = s.conv_hist.len().saturating_sub(drop);
        s.conv_hist.truncate(n);
        Ok(())
    }

    fn clear(&mut self, seq: SeqId) {
        if let Some(s) = self.slots.get_mut(seq.0) {
            *s = RecurrentSlot::default();
        }
    }
}

/// The state one layer keeps for every slot.
#[derive(Debug, Clone)]
pub enum LayerCache {
    /// Layers without per-request state.
    Stateless,
    /// Attention layers.
    Kv(KvLayer),
    /// Linear-attention layers (conv + SSM state).
    Recurrent(RecurrentLayer),
    /// Attention layers of a CUDA model.
    KvCuda(crate::backend::cuda::blocks::DevKv),
    /// Linear-attention layers of a CUDA model.
    RecurrentCuda(crate::backend::cuda::blocks::DevRecurrent),
}

impl LayerCache {
    fn clear(&mut self, seq: SeqId) -> Result<()> {
        match self {
            LayerCache::Stateless => {}
            LayerCache::Kv(kv) => kv.clear(seq),
            LayerCache::Recurrent(r) => r.clear(seq),
            LayerCache::KvCuda(kv) => kv.clear(seq),
            LayerCache::RecurrentCuda(r) => r.clear(seq)?,
        }
        Ok(())
    }

    fn can_rollback(&self, seq: SeqId, from: usize, to: usize) -> bool {
        match self {
            LayerCache::Recurrent(r) => r.can_rollback(seq, from, to),
            LayerCache::RecurrentCuda(r) => r.can_rollback(seq, from, to),
            _ => true,
        }
    }

    fn truncate(&mut self, seq: SeqId, from: usize, len: usize) -> Result<()> {
        match self {
            LayerCache::Stateless => Ok(()),
            LayerCache::Kv(kv) => {
                kv.truncate(seq, len);
                Ok(())
            }
            LayerCache::KvCuda(kv) => {
                kv.truncate(seq, len);
                Ok(())
            }
            LayerCache::Recurrent(r) => r.rollback(seq, from, len),
            LayerCache::RecurrentCuda(r) => r.rollback(seq, from, len),
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
    /// Releases a slot and its state.
    fn free_seq(&mut self, seq: SeqId);
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
}

/// The standard slot-indexed [`StateCache`].
#[derive(Debug, Clone)]
pub struct ModelCache {
    layers: Vec<LayerCache>,
    lens: Vec<Option<usize>>,
    free: Vec<usize>,
    max_seqs: usize,
}

impl ModelCache {
    /// A cache with the given per-layer state kinds, for at most `max_seqs` live sequences.
    pub fn new(layers: Vec<LayerCache>, max_seqs: usize) -> Self {
        Self { layers, lens: Vec::new(), free: Vec::new(), max_seqs }
    }

    /// Slots ever created (live + free); bounded by the peak number of live sequences.
    pub fn slots_created(&self) -> usize {
        self.lens.len()
    }

    fn check(&self, seq: SeqId) -> Result<usize> {
        match self.lens.get(seq.0) {
            Some(Some(l)) => Ok(*l),
            _ => bail!(Cache, "sequence slot {} is not allocated", seq.0),
        }
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
        Ok(SeqId(self.lens.len() - 1))
    }

    fn free_seq(&mut self, seq: SeqId) {
        if let Some(l @ Some(_)) = self.lens.get_mut(seq.0) {
            *l = None;
            for layer in &mut self.layers {
                // Zeroing a device slot can only fail on a broken device; the slot is then
                // not handed out again.
                if layer.clear(seq).is_err() {
                    return;
                }
            }
            self.free.push(seq.0);
        }
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
            {
                if !layer.can_rollback(seq, l, len) {
                    bail!(Cache,
                        "cannot roll the recurrent state of sequence {} back from {l} to {len} tokens (layer {i}): only the tokens of the last step (at most the speculative window) can be rejected",
                        seq.0
                    );
                }
            }
        }
        for layer in &mut self.layers {
            layer.truncate(seq, l, len)?;
        }
        self.lens[seq.0] = Some(len);
        Ok(())
    }

    fn layer_mut(&mut self, layer: usize) -> Result<&mut LayerCache> {
        let n = self.layers.len();
        self.layers.get_mut(layer).ok_or_else(|| crate::err!(Cache, "layer {layer} out of range ({n} layers)"))
    }

    fn live(&self) -> usize {
        self.lens.iter().filter(|l| l.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_without_leaks() {
        let mut c = ModelCache::new(vec![LayerCache::Kv(KvLayer::new(1, 2)), LayerCache::Stateless], 4);
        for round in 0..1000usize {
            let a = c.alloc_seq().unwrap();
            let b = c.alloc_seq().unwrap();
            if let LayerCache::Kv(kv) = c.layer_mut(0).unwrap() {
                kv.write(a, 0, &[1.0, 2.0], &[3.0, 4.0]).unwrap();
            }
            c.advance(a, 1).unwrap();
            // Free in both orders.
            if round % 2 == 0 {
                c.free_seq(a);
                c.free_seq(b);
            } else {
                c.free_seq(b);
                c.free_seq(a);
            }
            assert_eq!(c.live(), 0);
        }
        assert!(c.lens.len() <= 2, "slots leaked: {}", c.lens.len());
        let s: Vec<_> = (0..4).map(|_| c.alloc_seq().unwrap()).collect();
        assert!(c.alloc_seq().is_err());
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn truncate_drops_kv() {
        let mut c = ModelCache::new(vec![LayerCache::Kv(KvLayer::new(1, 1))], 1);
        let a = c.alloc_seq().unwrap();
        if let LayerCache::Kv(kv) = c.layer_mut(0).unwrap() {
            kv.write(a, 0, &[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]).unwrap();
        }
        c.advance(a, 3).unwrap();
        c.truncate(a, 1).unwrap();
        assert_eq!(c.seq_len(a), 1);
        if let LayerCache::Kv(kv) = c.layer_mut(0).unwrap() {
            assert_eq!(kv.len(a), 1);
        }
        assert!(c.truncate(a, 2).is_err());
    }
}
