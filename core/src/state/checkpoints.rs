//! The recurrent-state checkpoint pool of a hybrid model's prefix cache (its bookkeeping; the
//! states themselves live in each linear-attention layer's `RecCache`).

use std::collections::{BTreeMap, HashMap};

/// The recurrent-state checkpoint pool of a hybrid model's prefix cache: slot `c` holds, in
/// every linear-attention layer, the state after a chunk-aligned position of some prompt,
/// registered under the hash of the KV block that ends there (LRU-evicted).
#[derive(Debug, Clone, Default)]
pub(super) struct Checkpoints {
    /// 0: no checkpoints (no recurrent layers, or none asked for).
    pub(super) interval: usize,
    /// Positions between the checkpoints saved inside a span (a multiple of `interval`).
    pub(super) stride: usize,
    pub(super) free: Vec<usize>,
    pub(super) by_hash: HashMap<u64, usize>,
    pub(super) hash: Vec<Option<u64>>,
    /// Registered checkpoints by last use (oldest evicted first), and each one's key.
    pub(super) lru: BTreeMap<u64, usize>,
    pub(super) used_at: Vec<u64>,
    pub(super) tick: u64,
    /// Per slot: checkpoints saved by a forward, waiting for their block's hash.
    pub(super) pending: Vec<Vec<(usize, usize)>>,
    /// Per slot: the aligned end of its prefix-cache hit in KV blocks when that ran deeper
    /// than its deepest checkpoint — where this prompt branches from one seen before, so a
    /// checkpoint there lets the next prompt with that prefix resume all of it.
    pub(super) branch: Vec<Option<usize>>,
}

impl Checkpoints {
    pub(super) fn new(interval: usize, stride: usize, total: usize) -> Self {
        Self {
            interval,
            stride: stride.max(interval).next_multiple_of(interval.max(1)),
            free: (0..total).rev().collect(),
            hash: vec![None; total],
            used_at: vec![0; total],
            ..Default::default()
        }
    }

    pub(super) fn touch(&mut self, c: usize) {
        self.lru.remove(&self.used_at[c]);
        self.tick += 1;
        self.used_at[c] = self.tick;
        self.lru.insert(self.tick, c);
    }

    /// A slot for a new checkpoint (evicting the least recently used registered one).
    pub(super) fn take(&mut self) -> Option<usize> {
        if let Some(c) = self.free.pop() {
            return Some(c);
        }
        let (&t, &c) = self.lru.iter().next()?;
        self.lru.remove(&t);
        if let Some(h) = self.hash[c].take() {
            self.by_hash.remove(&h);
        }
        Some(c)
    }

    /// Drops a slot's pending checkpoints at positions `>= from`.
    pub(super) fn drop_pending(&mut self, seq: usize, from: usize) {
        if let Some(p) = self.pending.get_mut(seq) {
            let (gone, keep): (Vec<_>, Vec<_>) = p.drain(..).partition(|&(pos, _)| pos >= from);
            *p = keep;
            self.free.extend(gone.into_iter().map(|(_, c)| c));
        }
    }
}
