//! CUDA graphs of decode and verify forwards (capture and replay).
//!
//! A forward whose sequences all have the same number of rows `r` (1 in decode, K + 1 in a
//! speculative verify) and that wants logits for every row is *graph-eligible*. Its batch is
//! padded to the next captured size with [`SeqId::PAD`](crate::batch::SeqId::PAD) spans (token id 0 at position 0;
//! every kernel reads their slot as invalid: no KV row is written, no recurrent state is read
//! or written, and their rows, NaN or not, are dropped), and the block tables are laid out
//! [`width_bucket`] entries wide. For each such shape ([`GraphKey`]) the first forward
//! captures a graph: one eager run of the all-padding batch (first use of every kernel, pool
//! growth), then the same forward under stream capture, with every allocation a graph memory
//! node and every small upload recorded with its [`UploadTag`] as a copy out of a device
//! arena (`Gpu::begin_recording`). The capture touches no real state (all its spans are padding).
//!
//! A replay runs only the host bookkeeping of a forward: the cache's prepare (KV blocks, the
//! step's paging metadata), the upload producers in the recorded order (the same functions
//! the ops call: `batch_table`, `page_table`, `gdn_tables`, which also starts the recurrent
//! layers' rollback step), one graph launch and two row copies out of the shared output
//! buffers. Anything the recording cannot reproduce (an untagged upload, an unknown
//! producer order) fails the capture, and that shape then runs eagerly.

use super::{ForwardOutput, Model};
use crate::backend::cuda::blocks::{batch_table, page_table};
use crate::backend::cuda::gdn::{gdn_tables, GDN_TABLE_MAX_WORDS_PER_SPAN};
use crate::backend::cuda::graph::{self, width_bucket, Captured, GraphKey, Graphs, Outputs, SendGraph, UploadTag};
use crate::error::{Error, Result};
use crate::state::{Batch, LayerCache, LayerKind, StateCache};
use crate::tensor::cuda::cuda_err;
use crate::tensor::device::Device;
use crate::{bail, err};

/// The device of a CUDA model.
fn gpu_of_model(m: &Model) -> Result<std::sync::Arc<crate::tensor::cuda::Gpu>> {
    match m.info.device {
        Device::Cuda(i) => crate::tensor::cuda::gpu(i),
        Device::Cpu => bail!(Internal, "a CUDA graph of a CPU model"),
    }
}

/// The rows per sequence of a graph-eligible forward: every span has the same length and
/// logits are asked for every row in order.
pub(crate) fn uniform_rows(batch: &Batch, rows: &[usize]) -> Option<usize> {
    let r = batch.spans.first()?.len;
    (super::every_row(rows, batch.len()) && r > 0 && batch.spans.iter().all(|s| s.len == r)).then_some(r)
}

/// A forward without the batch checks, over a batch that may hold padding spans; logits for
/// the rows given.
pub(crate) type RunFn<'a> = dyn Fn(&Batch, &mut dyn StateCache, &[usize]) -> Result<ForwardOutput> + 'a;

/// The forward a graph captures: the main model's, or a draft head's step (which also reads
/// a hidden input the caller has copied into a buffer outside the graph).
pub(crate) struct Target<'a> {
    /// Whose forward it is (an address): another owner's forward through the same cache
    /// drops the graphs.
    pub id: usize,
    pub gpu: std::sync::Arc<crate::tensor::cuda::Gpu>,
    /// Layers of the forward (the upload recording's size).
    pub layers: usize,
    /// Whether it has attention layers (block tables in its graphs).
    pub has_kv: bool,
    /// Its layers that upload Gated DeltaNet tables, in forward order (asked when the graphs
    /// are bound to it).
    pub recurrent: &'a dyn Fn() -> Vec<usize>,
    /// The forward ([`RunFn`]).
    pub run: &'a RunFn<'a>,
}

impl Model {
    /// Calls `f` with the graph target of this model's forward (`forward_unchecked`).
    fn with_graph_target<R>(&self, f: impl FnOnce(&Target) -> Result<R>) -> Result<R> {
        let recurrent = || {
            (0..self.layers.len()).filter(|&i| matches!(self.layers[i].kind(), LayerKind::Recurrent { .. })).collect()
        };
        let run = |b: &Batch, c: &mut dyn StateCache, r: &[usize]| self.forward_unchecked(b, c, r);
        f(&Target {
            id: self as *const Model as usize,
            gpu: gpu_of_model(self)?,
            layers: self.layers.len(),
            has_kv: self.layers.iter().any(|l| matches!(l.kind(), LayerKind::Attention { .. })),
            recurrent: &recurrent,
            run: &run,
        })
    }

    /// Runs a graph-eligible forward from its graph (capturing it first when its shape is
    /// new); `None` when the forward is not eligible or its shape cannot be captured (the
    /// caller then runs it eagerly). The batch has been validated.
    pub(crate) fn forward_graphed(
        &self,
        gs: &mut Graphs,
        batch: &Batch,
        cache: &mut dyn StateCache,
        rows: &[usize],
    ) -> Result<Option<ForwardOutput>> {
        if !graph::enabled() || !matches!(self.info.device, Device::Cuda(_)) {
            return Ok(None);
        }
        self.with_graph_target(|t| forward_graphed(t, gs, batch, cache, rows))
    }

    /// Captures the graphs of `shapes` (`(sequences, rows per sequence)`) for contexts of up
    /// to `context` positions (the block-table width bucket), ahead of the first forwards (a
    /// server's warm-up); `progress(i, n)` is called after each. Returns the shapes that
    /// could not be captured, with why.
    ///
    /// # Errors
    /// A cache without graphs ([`crate::state::ModelCache::enable_graphs`]), or a device
    /// error outside the capture itself.
    pub fn capture_graphs(
        &self,
        cache: &mut dyn StateCache,
        shapes: &[(usize, usize)],
        context: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<(GraphKey, String)>> {
        if !graph::enabled() || !matches!(self.info.device, Device::Cuda(_)) {
            return Ok(Vec::new());
        }
        let Some(mut gs) = cache.take_graphs() else { bail!(Input, "this cache keeps no CUDA graphs") };
        let res = self.with_graph_target(|t| capture_all(t, &mut gs, cache, shapes, context, progress));
        cache.put_graphs(gs);
        res
    }
}

/// Makes `gs` the graphs of `t` (another owner's are dropped first).
fn bind(t: &Target, gs: &mut Graphs) {
    gs.bind(t.id, t.has_kv, t.recurrent);
}

/// Runs a graph-eligible forward of `t` from its graph (capturing it first when its shape
/// is new); `None` when the forward is not eligible or its shape cannot be captured (the
/// caller then runs it eagerly). The batch has been validated; graphs are on and `t` is on
/// a CUDA device.
pub(crate) fn forward_graphed(
    t: &Target,
    gs: &mut Graphs,
    batch: &Batch,
    cache: &mut dyn StateCache,
    rows: &[usize],
) -> Result<Option<ForwardOutput>> {
    let prep = crate::backend::cuda::profile::host_span("model: graph prepare");
    let Some(r) = uniform_rows(batch, rows).filter(|&r| r <= graph::MAX_ROWS) else { return Ok(None) };
    let Some(spans) = gs.bucket(batch.spans.len()) else { return Ok(None) };
    bind(t, gs);
    // A shape whose capture failed runs eagerly without preparing twice (the positions'
    // blocks give the width; the step's tables below are at least as wide).
    let bs = cache.block_size().max(1);
    let need = batch.spans.iter().map(|s| (s.pos0 + s.len).div_ceil(bs)).max().unwrap_or(0);
    if gs.has_kv && gs.failed.contains_key(&GraphKey { spans, rows: r, width: width_bucket(need) }) {
        return Ok(None);
    }
    let padded = batch.padded(spans, r);
    cache.set_page_width(0);
    cache.prepare(&padded)?;
    let width = cache.page_step().map_or(0, |s| width_bucket(s.max_blocks));
    let key = GraphKey { spans, rows: r, width };
    if gs.failed.contains_key(&key) {
        return Ok(None);
    }
    if !gs.graphs.contains_key(&key) {
        if try_capture(t, gs, key, cache).is_some() {
            return Ok(None);
        }
        // The capture prepared its own (all-padding) batch.
        cache.prepare(&padded)?;
    }
    drop(prep);
    replay(t, gs, key, batch, &padded, cache).map(Some)
}

/// [`capture`], recording a failure (that shape then runs eagerly); returns why it failed.
fn try_capture(t: &Target, gs: &mut Graphs, key: GraphKey, cache: &mut dyn StateCache) -> Option<String> {
    let e = capture(t, gs, key, cache).err()?.to_string();
    gs.failed.insert(key, e.clone());
    gs.stats.failed += 1;
    Some(e)
}

/// [`Model::capture_graphs`] for any target, the graphs taken out of the cache.
fn capture_all(
    t: &Target,
    gs: &mut Graphs,
    cache: &mut dyn StateCache,
    shapes: &[(usize, usize)],
    context: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<(GraphKey, String)>> {
    bind(t, gs);
    let blocks = context.div_ceil(cache.block_size().max(1));
    let mut failed = Vec::new();
    for (i, &(spans, rows)) in shapes.iter().enumerate() {
        let key = GraphKey { spans, rows, width: if gs.has_kv { width_bucket(blocks) } else { 0 } };
        if !gs.graphs.contains_key(&key) {
            if let Some(e) = try_capture(t, gs, key, cache) {
                failed.push((key, e));
            }
        }
        progress(i + 1, shapes.len());
    }
    Ok(failed)
}

/// Captures the graph of `key` (see the module docs).
fn capture(tg: &Target, gs: &mut Graphs, key: GraphKey, cache: &mut dyn StateCache) -> Result<()> {
    let gpu = tg.gpu.clone();
    let t = key.spans * key.rows;
    let all: Vec<usize> = (0..t).collect();
    let pad = || Batch::default().padded(key.spans, key.rows);
    cache.set_page_width(key.width);
    // Eager run first: compiles kernels, grows the memory pool and the scratch buffers,
    // and gives the output shapes.
    let out = (tg.run)(&pad(), cache, &all);
    cache.end_step();
    let out = out?;
    let oi = match gs.outputs.iter().position(|o| {
        o.rows() >= t
            && o.logits.dtype() == out.logits.dtype()
            && o.logits.last_dim() == out.logits.last_dim()
            && o.hidden.dtype() == out.hidden.dtype()
    }) {
        Some(i) => i,
        None => {
            // Earlier graphs keep the buffers they were captured with.
            let cap = t.max(gs.outputs.last().map_or(0, |o| o.rows()));
            gs.outputs.push(Outputs {
                logits: crate::tensor::Tensor::empty_on(&gpu, [cap, out.logits.last_dim()], out.logits.dtype())?,
                hidden: crate::tensor::Tensor::empty_on(&gpu, [cap, out.hidden.last_dim()], out.hidden.dtype())?,
            });
            gs.outputs.len() - 1
        }
    };
    drop(out);
    gpu.sync()?;
    gpu.begin_recording(recording_bytes(key, tg.layers))?;
    let stream = gpu.stream().clone();
    if let Err(e) = stream.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    {
        let _ = gpu.end_recording();
        cache.set_page_width(0);
        bail!(Device, "CUDA graph capture could not start: {e}");
    }
    let o = &mut gs.outputs[oi];
    let run = (|| -> Result<()> {
        let b = pad();
        let out = (tg.run)(&b, cache, &all)?;
        crate::backend::cuda::copy_rows_into(&out.logits, &mut o.logits, t)?;
        crate::backend::cuda::copy_rows_into(&out.hidden, &mut o.hidden, t)?;
        // Everything the forward allocated is freed inside the graph.
        drop(out);
        drop(b);
        cache.end_step();
        Ok(())
    })();
    cache.end_step();
    let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
    let rec = gpu.end_recording();
    cache.set_page_width(0);
    run?;
    let graph = graph.map_err(|e| Error::cuda(&e, format!("CUDA graph capture failed: {e}")))?;
    let graph = graph.ok_or_else(|| err!(Device, "CUDA graph capture recorded no graph"))?;
    let rec = rec.ok_or_else(|| err!(Internal, "the graph recording vanished"))?;
    if let Some(why) = &rec.unreplayable {
        bail!(Device, "the forward cannot be replayed from a graph: {why}");
    }
    let count = |tag| rec.entries.iter().filter(|e| e.0 == tag).count();
    let gdn = gs.recurrent.len();
    if count(UploadTag::Gdn) != gdn
        || count(UploadTag::Ids) != 1
        || count(UploadTag::Batch) > 1
        || count(UploadTag::Page) > 1
    {
        bail!(
            Internal,
            "graph capture recorded {} id, {} batch, {} page and {} Gated DeltaNet uploads ({gdn} recurrent layers)",
            count(UploadTag::Ids),
            count(UploadTag::Batch),
            count(UploadTag::Page),
            count(UploadTag::Gdn)
        );
    }
    graph.upload().map_err(cuda_err)?;
    drop(stream);
    gs.graphs.insert(key, Captured { graph: SendGraph(graph), rec, out: oi });
    gs.stats.captures += 1;
    Ok(())
}

/// Replays the graph of `key` for `batch` (`padded` is it padded to the key's shape; the
/// cache has prepared `padded`).
fn replay(
    tg: &Target,
    gs: &mut Graphs,
    key: GraphKey,
    batch: &Batch,
    padded: &Batch,
    cache: &mut dyn StateCache,
) -> Result<ForwardOutput> {
    let _s = crate::backend::cuda::profile::host_span("model: graph replay");
    let step = cache.page_step();
    let Some(c) = gs.graphs.get_mut(&key) else { bail!(Internal, "graph {key:?} vanished") };
    let mut next_gdn = gs.recurrent.iter().copied();
    for i in 0..c.rec.entries.len() {
        let tag = c.rec.entries[i].0;
        match tag {
            UploadTag::Ids => c.rec.write(i, &padded.ids)?,
            UploadTag::Batch => c.rec.write(i, &batch_table(padded))?,
            UploadTag::Page => {
                let st = step.as_ref().ok_or_else(|| err!(Internal, "graph replay without paging metadata"))?;
                c.rec.write(i, &page_table(st, key.width)?)?
            }
            UploadTag::Gdn => {
                let li = next_gdn.next().ok_or_else(|| err!(Internal, "more recorded tables than recurrent layers"))?;
                let LayerCache::Recurrent(rc) = cache.layer_mut(li)? else {
                    bail!(Internal, "layer {li} keeps no recurrent state")
                };
                c.rec.write(i, &gdn_tables(padded, rc)?.data)?
            }
            UploadTag::Other => bail!(Internal, "graph replay of an untagged upload"),
        }
    }
    c.launch(&tg.gpu)?;
    gs.stats.replays += 1;
    for s in batch.spans.iter().filter(|s| !s.seq.is_pad()) {
        cache.advance(s.seq, s.len)?;
    }
    let o = &gs.outputs[c.out];
    let t = batch.len();
    Ok(ForwardOutput {
        logits: crate::backend::cuda::head_rows(&o.logits, t)?,
        hidden: crate::backend::cuda::head_rows(&o.hidden, t)?,
    })
}

/// Bytes of the upload recording of a forward of `key` over `layers` layers: every upload
/// aligned to 256 bytes — ids, positions + spans, slots + block tables, and the Gated DeltaNet
/// span tables of each layer ([`GDN_TABLE_MAX_WORDS_PER_SPAN`]; session 15's fused-step part
/// made them 15 words a span against the 9 sized here before, and graphs of ≥ 32 spans ran
/// eagerly until session 16). An overflow fails the capture (that shape runs eagerly).
fn recording_bytes(key: GraphKey, layers: usize) -> usize {
    let t = key.spans * key.rows;
    let words =
        2 * t + 3 * key.spans + t + key.spans * key.width.max(1) + GDN_TABLE_MAX_WORDS_PER_SPAN * key.spans * layers;
    4 * words + 256 * (layers + 8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::SeqId;

    #[test]
    fn only_uniform_all_row_batches_are_eligible() {
        let mut b = Batch::default();
        b.push(SeqId(0), 5, &[1]);
        b.push(SeqId(3), 9, &[2]);
        assert_eq!(uniform_rows(&b, &[0, 1]), Some(1));
        assert_eq!(uniform_rows(&b, &[1]), None);
        assert_eq!(uniform_rows(&b, &[1, 0]), None);
        b.push(SeqId(4), 0, &[1, 2]);
        assert_eq!(uniform_rows(&b, &[0, 1, 2, 3]), None);
        let mut v = Batch::default();
        v.push(SeqId(0), 5, &[1, 2, 3]);
        v.push(SeqId(1), 7, &[4, 5, 6]);
        assert_eq!(uniform_rows(&v, &[0, 1, 2, 3, 4, 5]), Some(3));
        assert_eq!(uniform_rows(&Batch::default(), &[]), None);
    }

    #[test]
    fn padding_adds_stateless_spans_and_empty_tables() {
        let mut b = Batch::default();
        b.push(SeqId(2), 17, &[7]);
        let p = b.padded(4, 1);
        assert_eq!(p.ids, vec![7, 0, 0, 0]);
        assert_eq!(p.spans.len(), 4);
        assert!(p.spans[1..].iter().all(|s| s.seq.is_pad() && s.pos0 == 0 && s.len == 1));
        assert_eq!(p.positions(), vec![17, 0, 0, 0]);
        let step = crate::state::PageStep::with_width(&p, 16, &[&[5, 9], &[], &[], &[]], 4).unwrap();
        assert_eq!(step.max_blocks, 4);
        assert_eq!(step.slots, vec![9 * 16 + 1, crate::batch::PAD, crate::batch::PAD, crate::batch::PAD]);
        assert_eq!(&step.tables[..4], &[5, 9, crate::batch::PAD, crate::batch::PAD]);
        assert!(step.tables[4..].iter().all(|&x| x == crate::batch::PAD));
        // The page upload of a narrower step laid out as wide as a graph's tables.
        let narrow = crate::state::PageStep::new(&p, 16, &[&[5, 9], &[], &[], &[]]).unwrap();
        assert_eq!(narrow.max_blocks, 2);
        assert_eq!(page_table(&narrow, 4).unwrap(), {
            let mut v = step.slots.clone();
            v.extend_from_slice(&step.tables);
            v
        });
        assert!(page_table(&step, 2).is_err());
    }

    /// The producers' uploads of an all-padding batch (what a capture records), each aligned
    /// to 256 bytes, fit the recording for every layer recurrent: a table that grows past
    /// its sizing fails here rather than silently running that graph shape eagerly.
    #[test]
    fn recording_holds_every_upload_of_a_capture() {
        use crate::backend::RecCache;
        use crate::tensor::Device;
        let al = |words: usize| (4 * words).next_multiple_of(256);
        for spec in [0, 3] {
            let mut rc = RecCache::new(Device::Cpu, 8, 4, 16, spec, 4, 0).expect("recurrent cache");
            for (spans, rows) in [(1, 1), (8, 1), (33, 1), (64, 1), (256, 1), (16, 4), (64, 4)] {
                for width in [0, 1, 16, 64] {
                    let key = GraphKey { spans, rows, width };
                    let layers = 48;
                    let p = Batch::default().padded(spans, rows);
                    let blocks: Vec<&[u32]> = vec![&[]; spans];
                    let step = crate::state::PageStep::with_width(&p, 16, &blocks, width).expect("page step");
                    let gdn = gdn_tables(&p, &mut rc).expect("tables").data.len();
                    let used = al(p.ids.len())
                        + al(batch_table(&p).len())
                        + al(page_table(&step, width.max(step.max_blocks)).expect("page table").len())
                        + layers * al(gdn);
                    let have = recording_bytes(key, layers);
                    assert!(used <= have, "{key:?} spec {spec}: {used} bytes of uploads, {have} recorded");
                }
            }
        }
    }
}
