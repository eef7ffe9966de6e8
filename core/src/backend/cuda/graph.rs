//! What a model cache keeps of its CUDA graphs: one captured graph per decode / verify shape
//! (sequences padded up to a size bucket × rows per sequence × block-table width), the
//! recorded uploads each replay rewrites, and the output buffers the graphs copy their
//! logits and hidden rows into. The capture and the replay are `crate::model::graph`.
//!
//! A graph bakes in every device address and every launch scalar of the forward it recorded:
//! the weights, the cache's KV pools and state slots, its own activations (graph memory
//! nodes), and the batch shape. Only the small per-step uploads (token ids, positions and
//! spans, KV slots and block tables, the Gated DeltaNet span tables) change between replays:
//! each was recorded with its [`UploadTag`] as a copy node out of a fixed place in a device
//! arena outside the graph, and the replay copies the next step's values there first.

use crate::error::Result;
use crate::tensor::cuda::{cuda_err, Recording};
use crate::tensor::Tensor;
use cudarc::driver::CudaGraph;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

pub use crate::tensor::cuda::UploadTag;

/// Environment variable that turns CUDA graphs off (`0`, `false`, `no`, `off`) or on (`1`,
/// `true`, `yes`, `on`, the default); `--enforce-eager` turns them off too.
pub const GRAPHS_ENV: &str = "PORTER_CUDA_GRAPHS";

/// 0: not yet read from [`GRAPHS_ENV`], 1: off, 2: on.
static ENABLED: AtomicU8 = AtomicU8::new(0);

/// Turns CUDA graphs on or off for every model cache of the process made after the call
/// (`--enforce-eager` turns them off).
pub fn set_enabled(on: bool) {
    ENABLED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether CUDA graphs are on ([`set_enabled`]); until set, [`GRAPHS_ENV`] decides, on by
/// default (graph-on ≡ graph-off is tested in `tests/tests/gpu_graphs.rs`). A value of the
/// variable that is neither on nor off is reported on stderr once and leaves graphs on.
pub fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        0 => {
            let v = std::env::var(GRAPHS_ENV).ok();
            let on = match graphs_env_value(v.as_deref()) {
                Ok(on) => on,
                Err(bad) => {
                    eprintln!("warning: {GRAPHS_ENV}={bad:?} is neither 0/false/no/off nor 1/true/yes/on; CUDA graphs stay on");
                    true
                }
            };
            set_enabled(on);
            on
        }
        v => v == 2,
    }
}

/// [`GRAPHS_ENV`]'s value as on / off (unset: on); `Err` with the value when it is neither.
fn graphs_env_value(v: Option<&str>) -> std::result::Result<bool, String> {
    match v.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(true),
        Some(v) => match v.as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(v),
        },
    }
}

/// A warm-up progress report: `(graphs done, graphs in all)`.
pub type Progress = fn(usize, usize);

static PROGRESS: std::sync::Mutex<Option<Progress>> = std::sync::Mutex::new(None);

/// Sets what a warm-up capture reports its progress to (`report(done, total)` after each
/// graph; a server's progress bar).
pub fn set_progress(report: Option<Progress>) {
    *PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) = report;
}

/// Reports warm-up progress to the [`set_progress`] callback, if any.
pub fn report_progress(done: usize, total: usize) {
    if let Some(f) = *PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) {
        f(done, total);
    }
}

/// Most rows per sequence a graph is captured for (a speculative verify of up to 15 drafts;
/// longer spans are prefill, which runs eagerly).
pub const MAX_ROWS: usize = 16;

/// Fewest block-table entries a graph is captured with (the tables of longer contexts take
/// the next power of two, so a graph serves a range of context lengths).
pub const MIN_WIDTH: usize = 16;

/// The block-table width a graph for sequences of `blocks` KV blocks is captured with.
pub fn width_bucket(blocks: usize) -> usize {
    blocks.max(1).next_power_of_two().max(MIN_WIDTH)
}

/// The batch sizes graphs are captured for, up to `max_spans`: 1, 2, 4, 8, then steps of 8
/// (and `max_spans` itself).
pub fn span_buckets(max_spans: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [1, 2, 4, 8].into_iter().filter(|&b| b <= max_spans).collect();
    let mut b = 16;
    while b <= max_spans {
        v.push(b);
        b += 8;
    }
    if max_spans > 0 && v.last() != Some(&max_spans) {
        v.push(max_spans);
    }
    v
}

/// Device memory the driver holds for the allocations of every CUDA graph of device `g`
/// (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`); `None` when the driver does not say.
pub fn reserved_bytes(g: &crate::tensor::cuda::Gpu) -> Option<u64> {
    use cudarc::driver::sys;
    let mut v: u64 = 0;
    // SAFETY: a plain driver query on a live context's device; `v` outlives the call.
    let r = unsafe {
        sys::cuDeviceGetGraphMemAttribute(
            g.k.context().cu_device(),
            sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
            (&mut v) as *mut u64 as *mut std::ffi::c_void,
        )
    };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

/// The shape a graph is captured for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphKey {
    /// Sequences (real ones first, then padding).
    pub spans: usize,
    /// Rows per sequence: 1 for decode, K + 1 for a speculative verify.
    pub rows: usize,
    /// Block-table entries per sequence (0 without attention layers).
    pub width: usize,
}

/// A captured graph that may move between threads with its cache.
pub(crate) struct SendGraph(pub(crate) CudaGraph);

// SAFETY: CUDA graph objects are not internally synchronised but may be used from any thread
// when calls are serialised; a graph lives in a model cache and is only touched through
// `&mut` access to that cache (the cache is `Send`, not `Sync`), which serialises every call.
unsafe impl Send for SendGraph {}

/// One captured graph.
pub struct Captured {
    pub(crate) graph: SendGraph,
    pub(crate) rec: Recording,
    /// Index of the [`Outputs`] this graph writes.
    pub(crate) out: usize,
}

impl Captured {
    /// Queues the recorded uploads' new values, then the graph.
    pub(crate) fn launch(&mut self, g: &crate::tensor::cuda::Gpu) -> Result<()> {
        self.rec.flush(g)?;
        self.graph.0.launch().map_err(cuda_err)
    }
}

/// Buffers outside every graph that a graph copies its outputs into (one set serves every
/// graph of at most `rows` rows; replays run one after another on one stream and each
/// replay's rows are copied out before the next is queued).
pub struct Outputs {
    pub(crate) logits: Tensor,
    pub(crate) hidden: Tensor,
}

impl Outputs {
    /// Rows the buffers hold.
    pub fn rows(&self) -> usize {
        self.logits.dim(0)
    }
}

/// Counts of a cache's graph use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Forwards replayed from a graph.
    pub replays: u64,
    /// Graphs captured.
    pub captures: u64,
    /// Shapes whose capture failed (those forwards run eagerly).
    pub failed: u64,
}

/// The CUDA graphs of one model cache.
pub struct Graphs {
    /// Most sequences a graph is captured for (the cache's slots).
    pub max_spans: usize,
    /// The model the graphs were captured with (its address): another model's forward
    /// through this cache drops them.
    pub(crate) model: usize,
    /// Whether that model has attention layers (block tables in its graphs).
    pub(crate) has_kv: bool,
    /// Its layers that upload Gated DeltaNet tables, in forward order.
    pub(crate) recurrent: Vec<usize>,
    pub(crate) graphs: HashMap<GraphKey, Captured>,
    /// Shapes whose capture failed, and why.
    pub failed: HashMap<GraphKey, String>,
    pub(crate) outputs: Vec<Outputs>,
    /// A draft head's hidden input rows, which its graphs read (the head's address, the
    /// buffer); the main model's graphs have none.
    pub(crate) input: Option<(usize, Tensor)>,
    pub stats: GraphStats,
}

impl std::fmt::Debug for Graphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut keys: Vec<_> = self.graphs.keys().collect();
        keys.sort();
        f.debug_struct("Graphs").field("max_spans", &self.max_spans).field("graphs", &keys).finish()
    }
}

impl Graphs {
    /// An empty set for batches of up to `max_spans` sequences.
    pub fn new(max_spans: usize) -> Self {
        Self {
            max_spans,
            model: 0,
            has_kv: false,
            recurrent: Vec::new(),
            graphs: HashMap::new(),
            failed: HashMap::new(),
            outputs: Vec::new(),
            input: None,
            stats: GraphStats::default(),
        }
    }

    /// The captured size a batch of `n` sequences pads up to (`None`: more than the largest).
    pub fn bucket(&self, n: usize) -> Option<usize> {
        span_buckets(self.max_spans).into_iter().find(|&b| b >= n)
    }

    /// The shapes captured so far.
    pub fn keys(&self) -> Vec<GraphKey> {
        let mut k: Vec<_> = self.graphs.keys().copied().collect();
        k.sort();
        k
    }

    /// Makes the set the graphs of model `id` (with `has_kv` and the `recurrent` layers):
    /// another model's graphs are dropped first.
    pub(crate) fn bind(&mut self, id: usize, has_kv: bool, recurrent: impl FnOnce() -> Vec<usize>) {
        if self.model != id {
            self.graphs.clear();
            self.failed.clear();
            self.outputs.clear();
            self.input = None;
            self.model = id;
            self.has_kv = has_kv;
            self.recurrent = recurrent();
        }
    }
}

/// A cache's graphs, or none; a clone holds none (graphs address the original's buffers).
#[derive(Default)]
pub struct GraphSlot(pub(crate) Option<Box<Graphs>>);

impl GraphSlot {
    /// A slot with an empty graph set for up to `max_spans` sequences.
    pub fn new(max_spans: usize) -> Self {
        Self(Some(Box::new(Graphs::new(max_spans))))
    }
}

impl Clone for GraphSlot {
    fn clone(&self) -> Self {
        Self(None)
    }
}

impl std::fmt::Debug for GraphSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graphs_are_on_unless_the_variable_says_off() {
        assert_eq!(graphs_env_value(None), Ok(true));
        for v in ["1", "true", "YES", " on "] {
            assert_eq!(graphs_env_value(Some(v)), Ok(true), "{v:?}");
        }
        for v in ["0", "false", "No", "off"] {
            assert_eq!(graphs_env_value(Some(v)), Ok(false), "{v:?}");
        }
        assert_eq!(graphs_env_value(Some("2")), Err("2".to_string()));
    }

    #[test]
    fn buckets_cover_every_batch_size_once() {
        assert_eq!(span_buckets(1), vec![1]);
        assert_eq!(span_buckets(6), vec![1, 2, 4, 6]);
        assert_eq!(span_buckets(8), vec![1, 2, 4, 8]);
        assert_eq!(span_buckets(30), vec![1, 2, 4, 8, 16, 24, 30]);
        assert_eq!(span_buckets(64), vec![1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]);
        let g = Graphs::new(30);
        assert_eq!((1..=30).map(|n| g.bucket(n).unwrap_or(0)).filter(|&b| b == 16).count(), 8);
        assert_eq!(g.bucket(3), Some(4));
        assert_eq!(g.bucket(25), Some(30));
        assert_eq!(g.bucket(31), None);
    }

    #[test]
    fn widths_are_powers_of_two_from_the_minimum() {
        assert_eq!(width_bucket(0), MIN_WIDTH);
        assert_eq!(width_bucket(16), 16);
        assert_eq!(width_bucket(17), 32);
        assert_eq!(width_bucket(300), 512);
    }
}
