//! The block manager: one pool of fixed-size KV blocks shared by every sequence of a model
//! cache, reference-counted, with a hash-chained prefix cache of full blocks (LRU-evicted).
//!
//! A block holds `block_size` consecutive token positions of one sequence in every attention
//! layer at once (the layers' pools are indexed by the same block ids). A *full* block whose
//! tokens are known can be registered under the hash of `(parent block's hash, its tokens)`;
//! a later sequence with the same prefix takes the same blocks (reference count + 1) instead
//! of recomputing them. Freed blocks that carry a hash stay findable until the pool needs
//! them (least recently freed first); freed blocks without one are reused first.

use std::collections::{BTreeMap, HashMap};

/// Hash of a full block: `(parent's hash, token ids)` chained from the first block.
pub fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    // FNV-1a over the parent hash and the ids: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(parent.unwrap_or(0x5eed));
    eat(tokens.len() as u64);
    for &t in tokens {
        eat(t as u64);
    }
    h
}

/// Counts of a [`BlockPool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockUsage {
    pub block_size: usize,
    pub total: usize,
    /// Blocks no sequence holds (cached ones included: they are evictable).
    pub free: usize,
    /// Free blocks that still hold a registered prefix.
    pub cached: usize,
}

/// The pool of KV blocks (ids `0..total`).
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: usize,
    refs: Vec<u32>,
    hash: Vec<Option<u64>>,
    by_hash: HashMap<u64, u32>,
    /// Free blocks without a hash (reused first).
    plain: Vec<u32>,
    /// Free blocks with a hash, by the tick they were freed at (oldest evicted first).
    lru: BTreeMap<u64, u32>,
    /// Each free cached block's key in `lru`.
    freed_at: Vec<u64>,
    tick: u64,
    hits: u64,
    queries: u64,
}

impl BlockPool {
    /// `total` free blocks of `block_size` positions.
    pub fn new(block_size: usize, total: usize) -> Self {
        Self {
            block_size,
            refs: vec![0; total],
            hash: vec![None; total],
            by_hash: HashMap::new(),
            // Popped from the back: block 0 first.
            plain: (0..total as u32).rev().collect(),
            lru: BTreeMap::new(),
            freed_at: vec![0; total],
            tick: 0,
            hits: 0,
            queries: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Current counts.
    pub fn usage(&self) -> BlockUsage {
        BlockUsage {
            block_size: self.block_size,
            total: self.refs.len(),
            free: self.plain.len() + self.lru.len(),
            cached: self.lru.len(),
        }
    }

    /// Free blocks (including evictable cached ones).
    pub fn free(&self) -> usize {
        self.plain.len() + self.lru.len()
    }

    /// Prefix-cache block lookups and hits so far.
    pub fn hit_stats(&self) -> (u64, u64) {
        (self.queries, self.hits)
    }

    /// Takes a free block (evicting the least recently freed cached one when no plain block
    /// is left); `None` when every block is held.
    pub fn alloc(&mut self) -> Option<u32> {
        let b = match self.plain.pop() {
            Some(b) => b,
            None => {
                let (&tick, &b) = self.lru.iter().next()?;
                self.lru.remove(&tick);
                if let Some(h) = self.hash[b as usize].take() {
                    self.by_hash.remove(&h);
                }
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// Drops one reference to `b`; at zero the block becomes free (still findable by its
    /// hash until evicted).
    pub fn release(&mut self, b: u32) {
        let i = b as usize;
        let Some(r) = self.refs.get_mut(i) else { return };
        if *r == 0 {
            return;
        }
        *r -= 1;
        if *r == 0 {
            if self.hash[i].is_some() {
                self.tick += 1;
                self.freed_at[i] = self.tick;
                self.lru.insert(self.tick, b);
            } else {
                self.plain.push(b);
            }
        }
    }

    /// The cached block registered under `h`, with a new reference taken.
    pub fn lookup(&mut self, h: u64) -> Option<u32> {
        self.queries += 1;
        let b = *self.by_hash.get(&h)?;
        let i = b as usize;
        if self.refs[i] == 0 {
            self.lru.remove(&self.freed_at[i]);
        }
        self.refs[i] += 1;
        self.hits += 1;
        Some(b)
    }

    /// Registers the held, full block `b` under `h` (a block already registered, or a hash
    /// already taken by another block, is left as is).
    pub fn register(&mut self, b: u32, h: u64) {
        let i = b as usize;
        if i >= self.refs.len() || self.hash[i].is_some() || self.by_hash.contains_key(&h) {
            return;
        }
        self.hash[i] = Some(h);
        self.by_hash.insert(h, b);
    }

    /// Reference count of a block (tests and invariants).
    pub fn refs(&self, b: u32) -> u32 {
        self.refs.get(b as usize).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_release_and_lru_eviction() {
        let mut p = BlockPool::new(4, 3);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        let c = p.alloc().unwrap();
        assert_eq!((a, b, c), (0, 1, 2));
        assert!(p.alloc().is_none());
        p.register(a, 11);
        p.register(b, 22);
        p.release(a);
        p.release(b);
        p.release(c);
        assert_eq!(p.usage(), BlockUsage { block_size: 4, total: 3, free: 3, cached: 2 });
        // The plain block goes first, then the least recently freed cached one (a).
        assert_eq!(p.alloc(), Some(c));
        assert_eq!(p.alloc(), Some(a));
        assert_eq!(p.lookup(11), None);
        // b is still findable, and a hit takes it out of the free set.
        assert_eq!(p.lookup(22), Some(b));
        assert_eq!(p.refs(b), 1);
        assert_eq!(p.free(), 0);
        assert_eq!(p.hit_stats(), (2, 1));
    }

    #[test]
    fn hashes_chain_over_parents() {
        let h1 = block_hash(None, &[1, 2]);
        assert_ne!(block_hash(Some(h1), &[3, 4]), block_hash(None, &[3, 4]));
        assert_eq!(block_hash(Some(h1), &[3, 4]), block_hash(Some(block_hash(None, &[1, 2])), &[3, 4]));
    }
}
