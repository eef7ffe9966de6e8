//! A batch: token ids of several sequences laid out one after another, and the per-step
//! paging metadata ([`PageStep`]) that tells attention layers where each sequence's keys and
//! values live in the paged KV pool.

use std::sync::{Arc, OnceLock};

/// Padding value of every per-step index table (slots, block tables): kernels skip it.
pub const PAD: u32 = u32::MAX;

/// A sequence's slot in a state cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub usize);

impl SeqId {
    /// The slot of a padding span (a CUDA graph's batch padded up to its captured size):
    /// it owns no state, the caches skip it and the kernels read its slot as invalid (no KV
    /// row written, no recurrent state read or written; its rows' outputs are discarded).
    pub const PAD: SeqId = SeqId(u32::MAX as usize);

    /// Whether this is [`SeqId::PAD`].
    pub fn is_pad(self) -> bool {
        self == Self::PAD
    }
}

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
    pub(crate) dev: OnceLock<Arc<crate::tensor::cuda::BatchDev>>,
}

impl Batch {
    /// A batch with one sequence.
    pub fn single(seq: SeqId, pos0: usize, ids: &[u32]) -> Self {
        Self { ids: ids.to_vec(), spans: vec![SeqSpan { seq, start: 0, len: ids.len(), pos0 }], dev: OnceLock::new() }
    }

    /// Appends a sequence's new tokens.
    pub fn push(&mut self, seq: SeqId, pos0: usize, ids: &[u32]) {
        let start = self.ids.len();
        self.dev = OnceLock::new();
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

    /// This batch padded to `spans` spans of `rows` rows each: the extra spans are
    /// [`SeqId::PAD`] spans at position 0 with token id 0 (every span of `self` must have
    /// `rows` rows; a CUDA graph captured for that shape replays the padded batch).
    ///
    /// # Shapes
    /// `[n·rows]` → `[spans·rows]`
    pub fn padded(&self, spans: usize, rows: usize) -> Self {
        let mut b = self.clone();
        b.dev = OnceLock::new();
        let pad = vec![0u32; rows];
        for _ in self.spans.len()..spans {
            b.push(SeqId::PAD, 0, &pad);
        }
        b
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Where one step's K/V rows go and where each sequence's cached keys live in the paged KV
/// pool of a [`crate::state::ModelCache`] (the same for every attention layer of the model).
///
/// A pool row ("slot") is `block · block_size + offset`. The tables are built once per
/// forward by the cache ([`crate::state::StateCache::prepare`]) and shared by every layer.
///
/// # Shapes
/// - `slots`: `[T]`, the pool row each batch row's K/V is written to
/// - `tables`: `[n_spans, max_blocks]`, span `i`'s physical blocks in order, padded with [`PAD`]
#[derive(Debug)]
pub struct PageStep {
    pub block_size: usize,
    pub max_blocks: usize,
    pub slots: Vec<u32>,
    pub tables: Vec<u32>,
    /// Device copies (uploaded by the first CUDA attention layer of the step).
    pub(crate) dev: OnceLock<Arc<crate::tensor::cuda::PageDev>>,
}

impl PageStep {
    /// The step of `batch` given each span's block list (`blocks[i]` covers at least
    /// `spans[i].pos0 + spans[i].len` positions).
    ///
    /// # Errors
    /// [`crate::Error::Cache`] when a span's blocks do not cover its positions.
    pub fn new(batch: &Batch, block_size: usize, blocks: &[&[u32]]) -> crate::error::Result<Self> {
        Self::with_width(batch, block_size, blocks, 0)
    }

    /// [`PageStep::new`] with block tables at least `width` entries wide (a CUDA graph's
    /// tables have the width it was captured with). A [`SeqId::PAD`] span gets no blocks:
    /// its slots and its table row are all [`PAD`].
    ///
    /// # Errors
    /// [`crate::Error::Cache`] when a span's blocks do not cover its positions.
    pub fn with_width(batch: &Batch, block_size: usize, blocks: &[&[u32]], width: usize) -> crate::error::Result<Self> {
        crate::ensure!(block_size > 0, Cache, "block size must be > 0");
        crate::ensure!(blocks.len() == batch.spans.len(), Cache, "one block list per span is needed");
        let max_blocks = blocks.iter().map(|b| b.len()).max().unwrap_or(0).max(width).max(1);
        let mut tables = vec![PAD; batch.spans.len() * max_blocks];
        let mut slots = vec![PAD; batch.len()];
        for (i, (s, b)) in batch.spans.iter().zip(blocks).enumerate() {
            if s.seq.is_pad() {
                continue;
            }
            let end = s.pos0 + s.len;
            crate::ensure!(
                b.len() * block_size >= end,
                Cache,
                "sequence {} has {} KV blocks ({} positions) but the step writes up to position {end}",
                s.seq.0,
                b.len(),
                b.len() * block_size
            );
            tables[i * max_blocks..i * max_blocks + b.len()].copy_from_slice(b);
            for j in 0..s.len {
                let p = s.pos0 + j;
                slots[s.start + j] = b[p / block_size] * block_size as u32 + (p % block_size) as u32;
            }
        }
        Ok(Self { block_size, max_blocks, slots, tables, dev: OnceLock::new() })
    }

    /// Pool row of position `p` of span `i`.
    pub fn row(&self, i: usize, p: usize) -> usize {
        self.tables[i * self.max_blocks + p / self.block_size] as usize * self.block_size + p % self.block_size
    }
}
