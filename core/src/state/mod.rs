//! Per-request state: the [`StateCache`] trait and its slot-indexed implementation.
//!
//! A cache holds the state of many sequences at once. Each live sequence owns a slot
//! ([`SeqId`]); every layer keeps its state for that slot in a [`LayerCache`]: a KV cache
//! for attention layers, nothing for stateless layers (recurrent-state pools for linear
//! attention plug in as another variant). Freed slots are reused.

pub use crate::backend::{KvCache, RecCache, RollbackMeta};
pub use crate::batch::{Batch, SeqId, SeqSpan};

use crate::bail;
use crate::error::Result;
use crate::tensor::{DType, Device};

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
}

impl LayerCache {
    /// The state a layer of `kind` needs on `device` for up to `max_seqs` slots, with
    /// `spec` rejectable draft tokens for recurrent layers.
    pub fn new(kind: LayerKind, device: Device, dtype: DType, max_seqs: usize, spec: usize) -> Result<Self> {
        Ok(match kind {
            LayerKind::Attention { kv_heads, head_dim } => {
                LayerCache::Kv(KvCache::new(device, kv_heads, head_dim, dtype)?)
            }
            LayerKind::Recurrent { conv_dim, kernel, state_len } => {
                LayerCache::Recurrent(RecCache::new(device, conv_dim, kernel, state_len, spec, max_seqs)?)
            }
            LayerKind::Stateless => LayerCache::Stateless,
        })
    }

    fn clear(&mut self, seq: SeqId) -> Result<()> {
        match self {
            LayerCache::Stateless => {}
            LayerCache::Kv(kv) => kv.clear(seq),
            LayerCache::Recurrent(r) => r.clear(seq)?,
        }
        Ok(())
    }

    fn can_rollback(&self, seq: SeqId, from: usize, to: usize) -> bool {
        match self {
            LayerCache::Recurrent(r) => r.can_rollback(seq, from, to),
            LayerCache::Stateless | LayerCache::Kv(_) => true,
        }
    }

    fn truncate(&mut self, seq: SeqId, from: usize, len: usize) -> Result<()> {
        match self {
            LayerCache::Stateless => Ok(()),
            LayerCache::Kv(kv) => {
                kv.truncate(seq, len);
                Ok(())
            }
            LayerCache::Recurrent(r) => r.rollback(seq, from, len),
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

    fn free_seq(&mut self, seq: SeqId) -> Result<()> {
        if let Some(l @ Some(_)) = self.lens.get_mut(seq.0) {
            *l = None;
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
        let kv = KvCache::new(Device::Cpu, 1, 2, DType::F32).unwrap();
        let mut c = ModelCache::new(vec![LayerCache::Kv(kv), LayerCache::Stateless], 4);
        for round in 0..1000usize {
            let a = c.alloc_seq().unwrap();
            let b = c.alloc_seq().unwrap();
            if let LayerCache::Kv(KvCache { buf: crate::backend::KvBuf::Cpu(kv), .. }) = c.layer_mut(0).unwrap() {
                kv.write(a, 0, &[1.0, 2.0], &[3.0, 4.0]).unwrap();
            }
            c.advance(a, 1).unwrap();
            // Free in both orders.
            if round % 2 == 0 {
                c.free_seq(a).unwrap();
                c.free_seq(b).unwrap();
            } else {
                c.free_seq(b).unwrap();
                c.free_seq(a).unwrap();
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
        let kv = KvCache::new(Device::Cpu, 1, 1, DType::F32).unwrap();
        let mut c = ModelCache::new(vec![LayerCache::Kv(kv)], 1);
        let a = c.alloc_seq().unwrap();
        if let LayerCache::Kv(KvCache { buf: crate::backend::KvBuf::Cpu(kv), .. }) = c.layer_mut(0).unwrap() {
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
