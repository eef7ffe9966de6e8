//! A batch: token ids of several sequences laid out one after another.

/// A sequence's slot in a state cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub usize);

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
    pub(crate) dev: std::sync::OnceLock<std::sync::Arc<crate::tensor::cuda::BatchDev>>,
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
