//! Gated DeltaNet on the device: the per-slot conv windows and SSM states ([`CudaRec`]), the
//! step's span tables, and the core (conv, gates, delta rule) with its gated RMSNorm — a
//! decode / verify step's recurrent spans in one fused launch where the kernel takes the head
//! sizes and `PORTER_GDN_FUSED=on` asks for it ([`gdn_gated`]).

use super::gdn_ba::{self, DevGates};
use super::profile;
use crate::backend::{GateIn, GdnArgs, GdnWeights, RecBuf, RecCache};
use crate::bail;
use crate::batch::{Batch, SeqId};
use crate::error::Result;
use crate::tensor::cuda::{alloc, cuda_err, gpu_of, DevType, Gpu};
use crate::tensor::Tensor;
use cudarc::driver::{CudaSlice, CudaView};
use porter_kernels::cuda::{CudaKernels, DeltaNorm, GdnFusedDims, GDN_FUSED_MAX_KEY_HEADS};
use std::sync::Arc;

/// Device conv windows and SSM states of one Gated DeltaNet layer for every slot (the
/// bookkeeping is the backend-independent `RecCache::meta`).
///
/// # Shapes
/// - conv windows `[max_slots, conv_dim, win]` f32 (oldest first), `win = kernel − 1 + spec`
/// - SSM states `[max_slots, spec + 1, Hv·dk·dv]` f32
/// - prefix-cache checkpoints: conv windows `[checkpoints, conv_dim, win]` and SSM states
///   `[checkpoints, Hv·dk·dv]` f32
#[derive(Debug)]
pub struct CudaRec {
    max_slots: usize,
    /// Conv-window floats per slot.
    win_len: usize,
    /// SSM floats per slot (all `spec + 1` buffers).
    ssm_len: usize,
    /// SSM floats of one state (one buffer).
    state_len: usize,
    gpu: Arc<Gpu>,
    window: CudaSlice<f32>,
    ssm: CudaSlice<f32>,
    /// The fused step's window counters, `[max_slots, GDN_FUSED_MAX_KEY_HEADS]` (zero between
    /// launches).
    counters: CudaSlice<u32>,
    /// Checkpoint slots, and their conv windows and SSM states (`None` when there are none).
    checkpoints: usize,
    ck: Option<Box<(CudaSlice<f32>, CudaSlice<f32>)>>,
}

impl Clone for CudaRec {
    fn clone(&self) -> Self {
        Self {
            window: self.window.clone(),
            ssm: self.ssm.clone(),
            counters: self.counters.clone(),
            gpu: self.gpu.clone(),
            ck: self.ck.clone(),
            ..*self
        }
    }
}

impl CudaRec {
    /// Zeroed buffers for `max_slots` slots: conv windows of `conv_dim × win` and `nbuf` SSM
    /// buffers of `state_len` floats per slot; and `checkpoints` prefix-cache checkpoints
    /// (a conv window and one SSM state each).
    pub fn new(
        gpu: Arc<Gpu>,
        conv_dim: usize,
        win: usize,
        (nbuf, state_len): (usize, usize),
        max_slots: usize,
        checkpoints: usize,
    ) -> Result<Self> {
        let win_len = conv_dim * win.max(1);
        let ssm_len = nbuf * state_len;
        let window = crate::tensor::cuda::zeros::<f32>(&gpu, max_slots * win_len)?;
        let ssm = crate::tensor::cuda::zeros::<f32>(&gpu, max_slots * ssm_len)?;
        let counters = crate::tensor::cuda::zeros::<u32>(&gpu, max_slots * GDN_FUSED_MAX_KEY_HEADS)?;
        let ck = match checkpoints {
            0 => None,
            n => Some(Box::new((alloc::<f32>(&gpu, n * win_len)?, alloc::<f32>(&gpu, n * state_len)?))),
        };
        Ok(Self { max_slots, win_len, ssm_len, state_len, gpu, window, ssm, counters, checkpoints, ck })
    }

    fn ck_slot(&self, c: usize) -> Result<()> {
        if c >= self.checkpoints {
            bail!(Internal, "recurrent checkpoint {c} of {} kept on the device", self.checkpoints);
        }
        Ok(())
    }

    /// Makes slot `seq` hold checkpoint `c`: its conv window, and its SSM state as buffer 0.
    pub fn restore(&mut self, seq: SeqId, c: usize) -> Result<()> {
        let s = self.slot(seq)?;
        self.ck_slot(c)?;
        let (wl, sl, ssm_len) = (self.win_len, self.state_len, self.ssm_len);
        let Some((ck_w, ck_s)) = self.ck.as_deref() else { bail!(Internal, "no recurrent checkpoints on the device") };
        let st = self.gpu.stream().clone();
        st.memcpy_dtod(&ck_w.slice(c * wl..(c + 1) * wl), &mut self.window.slice_mut(s * wl..(s + 1) * wl))
            .map_err(cuda_err)?;
        st.memcpy_dtod(&ck_s.slice(c * sl..(c + 1) * sl), &mut self.ssm.slice_mut(s * ssm_len..s * ssm_len + sl))
            .map_err(cuda_err)?;
        Ok(())
    }

    /// Copies the SSM state in buffer `buf` of slot `slot` to checkpoint `c`.
    fn save_state(&mut self, slot: usize, buf: usize, c: usize) -> Result<()> {
        self.ck_slot(c)?;
        let (sl, ssm_len) = (self.state_len, self.ssm_len);
        if slot >= self.max_slots || (buf + 1) * sl > ssm_len {
            bail!(Internal, "recurrent checkpoint from slot {slot} buffer {buf}: out of range");
        }
        let Some((_, ck_s)) = self.ck.as_deref_mut() else { bail!(Internal, "no recurrent checkpoints on the device") };
        let from = slot * ssm_len + buf * sl;
        self.gpu
            .stream()
            .memcpy_dtod(&self.ssm.slice(from..from + sl), &mut ck_s.slice_mut(c * sl..(c + 1) * sl))
            .map_err(cuda_err)
    }

    fn slot(&self, seq: SeqId) -> Result<usize> {
        if seq.0 >= self.max_slots {
            bail!(Cache, "sequence slot {} exceeds the device cache's {} slots", seq.0, self.max_slots);
        }
        Ok(seq.0)
    }

    pub fn clear(&mut self, seq: SeqId) -> Result<()> {
        let s = self.slot(seq)?;
        let (cw, sl) = (self.win_len, self.ssm_len);
        let st = self.gpu.stream().clone();
        st.memset_zeros(&mut self.window.slice_mut(s * cw..(s + 1) * cw)).map_err(cuda_err)?;
        st.memset_zeros(&mut self.ssm.slice_mut(s * sl..(s + 1) * sl)).map_err(cuda_err)?;
        Ok(())
    }
}

/// Span count, longest span and the device span table of one delta-rule launch.
type DeltaSpans<'a> = (usize, usize, CudaView<'a, u32>);

/// Shortest span that takes the chunked delta rule (chunks are 64 tokens, at positions
/// counted from the span's start). The same rule as the CPU backend: every span of more
/// than one row without snapshots, so that a prompt's positions are computed by the same
/// algorithm however the scheduler splits it into (chunk-aligned) prefill pieces; a
/// length threshold made a short final piece take the per-token rule and its bits differ.
const GDN_CHUNKED_MIN_LEN: usize = 2;

/// One Gated DeltaNet step's span tables, in one buffer: `[conv (4 per span: row0, len,
/// slot, lag) | recurrent (5 per span: row0, len, slot, src_buf, snapshot) | chunked (5 per
/// span) | conv of the chunked spans alone (4 each) | fused (6 per recurrent span: row0, len,
/// slot, lag, src_buf, snapshot)]`; `conv`, `rec`, `chunk`, `conv_chunk`, `fused` count their
/// `u32`s. The three launches of a step read the first three parts, the fused form the last
/// two: the layout does not depend on which runs, so a graph's recorded upload is rewritten
/// by the same function at replay whatever the layer chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GdnTables {
    pub data: Vec<u32>,
    pub conv: usize,
    pub rec: usize,
    pub chunk: usize,
    pub conv_chunk: usize,
    pub fused: usize,
    pub rec_max: usize,
    pub chunk_max: usize,
}

/// The most `u32`s [`gdn_tables`] writes a span: conv 4 + recurrent 5 + fused 6 (a chunked
/// span: 4 + 5 + 4). A CUDA graph's upload recording is sized with it (`model/graph.rs`): a
/// table longer than the recording makes the shape run eagerly.
pub(crate) const GDN_TABLE_MAX_WORDS_PER_SPAN: usize = 15;

/// The span tables of a Gated DeltaNet step over `batch`, starting the step in the slots'
/// rollback bookkeeping. Long spans without snapshots (prefill) take the chunked algorithm,
/// the rest (decode, speculative verify with per-token snapshots) the per-token recurrence.
/// A [`SeqId::PAD`] span gets the invalid slot (the kernels write NaN rows for it and leave
/// every state alone) and touches no bookkeeping.
pub(crate) fn gdn_tables(batch: &Batch, cache: &mut RecCache) -> Result<GdnTables> {
    let n = batch.spans.len();
    let (mut conv, mut rec, mut chunk) = (Vec::with_capacity(24 * n), Vec::new(), Vec::new());
    let (mut conv_chunk, mut fused) = (Vec::new(), Vec::new());
    let (mut rec_max, mut chunk_max) = (0, 0);
    for s in &batch.spans {
        let snapshots = cache.snapshots_for(s.len);
        let (slot, lag, cur) = if s.seq.is_pad() {
            (crate::batch::PAD, 0, 0)
        } else {
            let m = cache.meta_mut(s.seq)?;
            let (lag, cur) = (m.lag as u32, m.cur as u32);
            m.start_step(s.pos0, s.len, snapshots);
            (s.seq.0 as u32, lag, cur)
        };
        let (start, len) = (s.start as u32, s.len as u32);
        conv.extend_from_slice(&[start, len, slot, lag]);
        let row = [start, len, slot, cur, snapshots as u32];
        if !snapshots && s.len >= GDN_CHUNKED_MIN_LEN {
            chunk.extend_from_slice(&row);
            conv_chunk.extend_from_slice(&[start, len, slot, lag]);
            chunk_max = chunk_max.max(s.len);
        } else {
            rec.extend_from_slice(&row);
            fused.extend_from_slice(&[start, len, slot, lag, cur, snapshots as u32]);
            rec_max = rec_max.max(s.len);
        }
    }
    let (nc, nr, nk, ncc, nf) = (conv.len(), rec.len(), chunk.len(), conv_chunk.len(), fused.len());
    for part in [rec, chunk, conv_chunk, fused] {
        conv.extend_from_slice(&part);
    }
    Ok(GdnTables { data: conv, conv: nc, rec: nr, chunk: nk, conv_chunk: ncc, fused: nf, rec_max, chunk_max })
}

/// The prefix-cache checkpoints a step saves inside its chunked (prefill) spans
/// ([`RecCache::ckpt_step`]): their conv windows in one [`CudaKernels::gdn_window_at`] launch
/// before the conv (which rewrites the windows it reads), and the chunked delta rule in
/// rounds — round j holds every chunked span's j-th piece, the pieces of a span ending at its
/// checkpoints — each followed by copies of the states that end there. A span that saves
/// starts on a chunk boundary and its checkpoints lie on chunk boundaries, so the rounds
/// compute the chunks of one launch: the same bits.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct CkptPlan {
    /// `[n, 5]`: (row0, cut, slot, lag, checkpoint), [`CudaKernels::gdn_window_at`]'s saves.
    pub windows: Vec<u32>,
    pub rounds: Vec<CkptRound>,
}

/// One round of [`CkptPlan`]: the chunked spans' table (5 `u32` a piece: row0, len, slot,
/// src_buf, 0), its longest piece, and the states to copy after it: (slot, buffer,
/// checkpoint).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct CkptRound {
    pub table: Vec<u32>,
    pub max: usize,
    pub copies: Vec<(usize, usize, usize)>,
}

/// The checkpoint plan of a step over `batch` (`None` when no chunked span saves one).
/// Reads the slots' rollback bookkeeping as it is before [`gdn_tables`] starts the step.
pub(crate) fn ckpt_plan(batch: &Batch, cache: &RecCache) -> Result<Option<CkptPlan>> {
    let Some(saves) = cache.ckpt_step.as_ref().filter(|s| !s.is_empty()) else { return Ok(None) };
    let mut plan = CkptPlan::default();
    for (i, s) in batch.spans.iter().enumerate() {
        if s.seq.is_pad() || cache.snapshots_for(s.len) || s.len < GDN_CHUNKED_MIN_LEN {
            continue;
        }
        let m = cache.meta.get(s.seq.0).copied().unwrap_or_default();
        let mut cuts: Vec<(usize, usize)> = saves
            .iter()
            .filter(|c| c.span == i && c.pos > s.pos0 && c.pos <= s.pos0 + s.len)
            .map(|c| (c.pos - s.pos0, c.slot))
            .collect();
        cuts.sort_unstable();
        if cuts.windows(2).any(|w| w[0].0 == w[1].0) {
            bail!(Internal, "two recurrent checkpoints at one position of span {i}");
        }
        let u = |v: usize| u32::try_from(v).map_err(|_| crate::err!(Internal, "checkpoint table value {v} > u32"));
        let (row0, slot) = (s.start, s.seq.0);
        for &(cut, ck) in &cuts {
            plan.windows.extend_from_slice(&[u(row0)?, u(cut)?, u(slot)?, u(m.lag)?, u(ck)?]);
        }
        let tail = (cuts.last().is_none_or(|&(c, _)| c < s.len)).then_some((s.len, usize::MAX));
        let mut from = 0;
        for (j, (to, ck)) in cuts.iter().copied().chain(tail).enumerate() {
            if plan.rounds.len() <= j {
                plan.rounds.push(Default::default());
            }
            let r = &mut plan.rounds[j];
            r.table.extend_from_slice(&[u(row0 + from)?, u(to - from)?, u(slot)?, u(m.cur)?, 0]);
            r.max = r.max.max(to - from);
            if ck != usize::MAX {
                r.copies.push((slot, m.cur, ck));
            }
            from = to;
        }
    }
    Ok((!plan.windows.is_empty()).then_some(plan))
}

/// The Gated DeltaNet core on the device (see `Ops::gdn`): three launches (conv + gates, the
/// recurrent delta rule, the chunked delta rule), the last two only where they have spans.
pub fn gdn(
    p: &Tensor,
    gates: GateIn<'_>,
    w: &GdnWeights<'_>,
    c: &GdnArgs,
    batch: &Batch,
    cache: &mut RecCache,
) -> Result<Tensor> {
    gdn_run(p, gates, w, c, batch, cache, None, None)
}

/// The Gated DeltaNet core and its gated RMSNorm with SiLU(z) on the device (see
/// `Ops::gdn_gated`): the recurrent spans (decode, verify) in one fused launch
/// ([`CudaKernels::gdn_fused_seq`], with the lanes per state column of
/// [`CudaKernels::gdn_fused_lanes`]: the separate delta rule's, or in batch-invariant runs
/// those of one span) where it takes the head sizes and
/// [`porter_kernels::cuda::GDN_FUSED_ENV`] turns it on (off by default), the chunked spans (prefill)
/// as conv + gates, chunked delta rule and gated norm; else [`gdn`] then [`gated_norm`].
#[allow(clippy::too_many_arguments)]
pub fn gdn_gated(
    p: &Tensor,
    gates: GateIn<'_>,
    w: &GdnWeights<'_>,
    c: &GdnArgs,
    batch: &Batch,
    cache: &mut RecCache,
    norm_w: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    let (hk, hv, dk, dv) = (c.key_heads, c.value_heads, c.key_dim, c.value_dim);
    let invariant = crate::tensor::cuda::batch_invariant(p.dtype());
    // The spans gdn_tables gives the per-token recurrence (the fused launch's).
    let n_rec = batch.spans.iter().filter(|s| cache.snapshots_for(s.len) || s.len < GDN_CHUNKED_MIN_LEN).count();
    let lanes = CudaKernels::gdn_fused_lanes(n_rec, hv, dk, dv, invariant);
    let takes = CudaKernels::gdn_fused_shape((hk, hv, dk, dv), c.conv_kernel, cache.window(), lanes).is_some();
    if takes && norm_w.dtype() == p.dtype() && porter_kernels::cuda::gdn_fused_enabled() {
        return gdn_run(p, gates, w, c, batch, cache, Some((norm_w, eps, lanes)), None);
    }
    // The gated norm inside the recurrent delta-rule launch (`gdn_run` falls back to the
    // separate launch when a span takes the chunked path).
    if let Some(whole_head) =
        delta_norm_plan(n_rec).filter(|_| norm_w.dtype() == p.dtype() && hv <= GDN_FUSED_MAX_KEY_HEADS)
    {
        return gdn_run(p, gates, w, c, batch, cache, None, Some((norm_w, eps, whole_head)));
    }
    let core = gdn(p, gates, w, c, batch, cache)?;
    gated_norm(&core, p, norm_w, c.conv_dim(), eps)
}

/// Environment variable: where the Gated DeltaNet decode's gated RMSNorm runs. Unset (or
/// `head`): inside the recurrent delta rule's launch in its whole-head form (one block per
/// (value head, sequence) holding all the head's columns, the norm after a block barrier)
/// for steps of up to 4 sequences (`HEAD_NORM_MAX_SPANS`), a launch of its own beyond; `columns`:
/// inside the launch in its column-block form (the norm by the last block of each head after
/// an atomic count) up to 8 sequences (`COLUMNS_NORM_MAX_SPANS`); `apart`: always a launch of its
/// own (`gated_norm_z`). Read once; another value warns once and means the default.
///
/// Measured on the H100 (session 24, 24 layers of the 80B geometry, tok/s at batch 1 / 2 / 4 /
/// 8): whole-head 447.4 / 635.0 / 869.7 / 1,267.0, column blocks 437.3 / 628.9 / 863.9 /
/// 1,274.0, apart 434.3 / 628.6 / 861.7 / 1,270.7; FP8 batch 1 526.2 / 508.9 / 512.0.
pub const GDN_NORM_ENV: &str = "PORTER_GDN_NORM";

/// Most sequences a step whose norm runs in the whole-head form by default.
const HEAD_NORM_MAX_SPANS: usize = 4;
/// Most sequences a step whose norm runs in the column-block form (`columns`): at 64 it lost
/// ≈ 1 % (a last block's row of norm per (sequence, head) after an atomic count, against one
/// launch spreading 2,048 rows).
const COLUMNS_NORM_MAX_SPANS: usize = 8;

/// Where the decode's gated norm runs ([`GDN_NORM_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeltaNormMode {
    Head,
    Columns,
    Apart,
}

/// [`GDN_NORM_ENV`]'s mode (read once).
fn delta_norm() -> DeltaNormMode {
    static MODE: std::sync::OnceLock<DeltaNormMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var(GDN_NORM_ENV).ok().as_deref().map(str::trim) {
        None | Some("") | Some("head") => DeltaNormMode::Head,
        Some("columns") => DeltaNormMode::Columns,
        Some("apart") => DeltaNormMode::Apart,
        Some(v) => {
            eprintln!("warning: {GDN_NORM_ENV}={v:?} is not one of head, columns, apart; using head");
            DeltaNormMode::Head
        }
    })
}

/// Whether a step of `n_rec` recurrent sequences runs its gated norm inside the delta rule's
/// launch, and in which form (`Some(true)`: whole-head, where a head fits a block; the kernel
/// takes the column blocks where it does not).
fn delta_norm_plan(n_rec: usize) -> Option<bool> {
    match delta_norm() {
        DeltaNormMode::Head => (n_rec <= HEAD_NORM_MAX_SPANS).then_some(true),
        DeltaNormMode::Columns => (n_rec <= COLUMNS_NORM_MAX_SPANS).then_some(false),
        DeltaNormMode::Apart => None,
    }
}

/// [`gdn`] (`fuse` and `delta_norm` `None`: returns the core `[T·Hv, dv]`), or [`gdn_gated`]'s
/// fused form (`fuse` = the gated norm's weight and epsilon and the lanes per state column:
/// returns the normalised `[T·Hv, dv]`), or with `delta_norm` (the gated norm's weight and
/// epsilon; `fuse` is `None`) the normalised `[T·Hv, dv]`: from inside the recurrent delta
/// rule's launch when every span is recurrent, else by the separate gated norm.
#[allow(clippy::too_many_arguments)]
fn gdn_run(
    p: &Tensor,
    gate_in: GateIn<'_>,
    w: &GdnWeights<'_>,
    c: &GdnArgs,
    batch: &Batch,
    cache: &mut RecCache,
    fuse: Option<(&Tensor, f32, usize)>,
    delta_norm: Option<(&Tensor, f32, bool)>,
) -> Result<Tensor> {
    let g = gpu_of(p, "gated_delta_net")?;
    // The gate inputs, in_proj_ba's product left to the conv + gates launch where that runs
    // over every row (not in the one-launch step), else computed here first.
    let mut held = None;
    let gates = gdn_ba::dev_gates(p, gate_in, c, fuse.is_none(), &mut held)?;
    let _p = profile::span("gated_delta_net core", &g);
    let (spec, window) = (cache.spec, cache.window());
    let (hv, dv) = (c.value_heads, c.value_dim);
    let conv = c.conv_dim();
    let t = p.rows();
    let plan = ckpt_plan(batch, cache)?;
    let gt = gdn_tables(batch, cache)?;
    let max_slots = cache.meta.len();
    let RecBuf::Cuda(rc) = &mut cache.buf else { bail!(Internal, "device Gated DeltaNet with a host cache") };
    let tables = g.upload_as(crate::tensor::cuda::UploadTag::Gdn, &gt.data)?;
    let mut at = 0;
    let mut part = |len: usize| {
        let v = tables.slice(at..at + len);
        at += len;
        v
    };
    let (conv_all, rec, chunk) = (part(gt.conv), part(gt.rec), part(gt.chunk));
    let (conv_chunk, fused) = (part(gt.conv_chunk), part(gt.fused));
    // Fused: the conv kernel and the delta rule see only the chunked spans.
    let (conv_spans, n_conv, rec) = match fuse {
        Some(_) => (conv_chunk, gt.conv_chunk / 4, (0, 0, rec.slice(0..0))),
        None => (conv_all, gt.conv / 4, (gt.rec / 5, gt.rec_max, rec)),
    };
    let chunk = (gt.chunk / 5, gt.chunk_max, chunk);
    let (win, nbuf) = (window, spec + 1);
    let three = fuse.is_none() || chunk.0 > 0;
    // The gated norm inside the delta rule's launch: only when no span is chunked.
    let mut in_delta = match delta_norm {
        Some((nw, eps, whole)) if chunk.0 == 0 => {
            Some((nw, eps, whole, Tensor::empty_on(&g, [t * hv, dv], p.dtype())?))
        }
        _ => None,
    };
    let o = if three {
        let mut o = Tensor::empty_on(&g, [t * hv, dv], p.dtype())?;
        let mut gate = alloc::<f32>(&g, t * hv)?;
        let mut beta = alloc::<f32>(&g, t * hv)?;
        crate::by_dtype!(
            p.dtype(),
            three_launches(
                &g,
                (c, w, max_slots),
                p,
                gates,
                rc,
                (&conv_spans, n_conv, &rec, &chunk),
                plan.as_ref(),
                (&mut gate, &mut beta),
                &mut o,
                in_delta.as_mut().map(|(nw, eps, whole, normed)| (&**nw, *eps, *whole, normed)),
                (t, win, nbuf)
            )
        )?;
        Some(o)
    } else {
        None
    };
    if let Some((_, _, _, normed)) = in_delta {
        return Ok(normed);
    }
    if let (Some((nw, eps, _)), Some(o)) = (delta_norm, &o) {
        return gated_norm(o, p, nw, conv, eps);
    }
    let Some((norm_w, eps, lanes)) = fuse else {
        return o.ok_or_else(|| crate::err!(Internal, "Gated DeltaNet: no launch ran"));
    };
    // The chunked spans' rows normalised (every row: the fused launch then rewrites the
    // recurrent spans' rows), or a buffer of its own for the fused launch alone.
    let mut normed = match &o {
        Some(o) => gated_norm(o, p, norm_w, conv, eps)?,
        None => Tensor::empty_on(&g, [t * hv, dv], p.dtype())?,
    };
    let n_fused = gt.fused / 6;
    if n_fused > 0 {
        let d = GdnFusedDims {
            t,
            n_spans: n_fused,
            hk: c.key_heads,
            hv,
            dk: c.key_dim,
            dv,
            k: c.conv_kernel,
            win,
            num_slots: max_slots,
            nbuf,
            zoff: conv,
            eps,
            lanes,
        };
        let cols = gates.cols()?;
        crate::by_dtype!(p.dtype(), fused_launch(&g, w, p, cols, rc, &fused, norm_w, &mut normed, d))?;
    }
    Ok(normed)
}

/// The fused decode / verify launch of [`gdn_gated`] over the recurrent spans `spans`.
#[allow(clippy::too_many_arguments)]
fn fused_launch<T: DevType>(
    g: &Gpu,
    w: &GdnWeights<'_>,
    p: &Tensor,
    (gates, ba_col): (&Tensor, usize),
    rc: &mut CudaRec,
    spans: &CudaView<'_, u32>,
    norm_w: &Tensor,
    out: &mut Tensor,
    d: GdnFusedDims,
) -> Result<()> {
    // The gate inputs: p's own columns, or in_proj_ba's output read in place.
    let ba = if std::ptr::eq(gates, p) { None } else { Some((gates.dev::<T>()?, gates.last_dim())) };
    g.k.gdn_fused_seq::<T>(
        p.dev::<T>()?,
        p.last_dim(),
        ba,
        ba_col,
        w.conv_w.dev::<f32>()?,
        w.a_log.dev::<f32>()?,
        w.dt_bias.dev::<f32>()?,
        &mut rc.window,
        &mut rc.ssm,
        spans,
        norm_w.dev::<T>()?,
        out.dev_mut::<T>()?,
        &mut rc.counters,
        d,
    )
    .map_err(cuda_err)
}

/// Conv + gates over `conv_spans`, then the recurrent delta rule over `rec` and the chunked
/// one over `chunk` (each only where it has spans), into `o`.
#[allow(clippy::too_many_arguments)]
fn three_launches<T: DevType>(
    g: &Gpu,
    (c, w, ns): (&GdnArgs, &GdnWeights<'_>, usize),
    p: &Tensor,
    gates: DevGates<'_>,
    rc: &mut CudaRec,
    spans: (&CudaView<'_, u32>, usize, &DeltaSpans, &DeltaSpans),
    plan: Option<&CkptPlan>,
    gb: (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    o: &mut Tensor,
    mut norm: Option<(&Tensor, f32, bool, &mut Tensor)>,
    dims: (usize, usize, usize),
) -> Result<()> {
    let (conv_spans, n, rec, chunk) = spans;
    let (t, win, nbuf) = dims;
    let (gate, beta) = gb;
    // Checkpoints' conv windows, from the windows before the conv rewrites them.
    if let Some(pl) = plan {
        let saves = g.upload_as(crate::tensor::cuda::UploadTag::Other, &pl.windows)?;
        let Some((ck_w, _)) = rc.ck.as_deref_mut() else {
            bail!(Internal, "recurrent checkpoints without a device pool")
        };
        g.k.gdn_window_at::<T>(
            p.dev::<T>()?,
            p.last_dim(),
            &rc.window,
            &saves,
            ck_w,
            t,
            pl.windows.len() / 5,
            c.conv_dim(),
            win,
            ns,
            rc.checkpoints,
        )
        .map_err(cuda_err)?;
    }
    // Conv, conv window update and gates (their inputs too where in_proj_ba's product is left
    // to it): one launch. The conv output q | k | v is in the activation dtype, as transformers'
    // forward rounds it (half the bytes of f32 for it and for the delta rule that reads it).
    let qkv = &mut alloc::<T>(g, t * c.conv_dim())?;
    gdn_ba::conv_gates::<T>(g, c, w, p, gates, &mut rc.window, (conv_spans, n), qkv, (gate, beta), (t, win, ns))?;
    let (hk, hv, dk, dv) = (c.key_heads, c.value_heads, c.key_dim, c.value_dim);
    // Short spans (decode, verify with snapshots) take the recurrence, long ones the
    // chunked algorithm; both launches share one argument list.
    for (chunked, (cnt, max, sp)) in [(false, rec), (true, chunk)] {
        if *cnt == 0 {
            continue;
        }
        if let Some(pl) = plan.filter(|_| chunked) {
            // In rounds of pieces that end at the checkpoints, each state copied after its round.
            for r in &pl.rounds {
                let sp = g.upload_as(crate::tensor::cuda::UploadTag::Other, &r.table)?;
                let (o, n) = (o.dev_mut::<T>()?, r.table.len() / 5);
                g.k.gdn_chunked_seq::<T>(qkv, gate, beta, &mut rc.ssm, &sp, o, t, n, r.max, hk, hv, dk, dv, ns, nbuf)
                    .map_err(cuda_err)?;
                for &(slot, buf, ck) in &r.copies {
                    rc.save_state(slot, buf, ck)?;
                }
            }
            continue;
        }
        if chunked {
            g.k.gdn_chunked_seq::<T>(
                qkv,
                gate,
                beta,
                &mut rc.ssm,
                sp,
                o.dev_mut::<T>()?,
                t,
                *cnt,
                *max,
                hk,
                hv,
                dk,
                dv,
                ns,
                nbuf,
            )
            .map_err(cuda_err)?;
            continue;
        }
        // The gated norm by the delta rule's launch (`gdn_run`: no span is chunked).
        let (norm, out) = match norm.as_mut() {
            Some((nw, eps, whole, normed)) => {
                let dn = DeltaNorm {
                    whole_head: *whole,
                    z: p.dev::<T>()?,
                    z_stride: p.last_dim(),
                    zoff: c.conv_dim(),
                    w: nw.dev::<T>()?,
                    eps: *eps,
                    out: normed.dev_mut::<T>()?,
                    counters: &mut rc.counters,
                };
                (Some(dn), o.dev_mut::<T>()?)
            }
            None => (None, o.dev_mut::<T>()?),
        };
        g.k.gdn_delta_seq::<T>(qkv, gate, beta, &mut rc.ssm, sp, out, t, *cnt, *max, hk, hv, dk, dv, ns, nbuf, norm)
            .map_err(cuda_err)?;
    }
    Ok(())
}

/// Gated RMSNorm per value head with SiLU(z), z = columns `zoff..zoff + Hv·dv` of `p` read
/// in place (see `Ops::gated_norm`).
pub fn gated_norm(o: &Tensor, p: &Tensor, w: &Tensor, zoff: usize, eps: f32) -> Result<Tensor> {
    let g = gpu_of(o, "gated_norm")?;
    let (t, dv) = (p.rows(), w.elem_count());
    let hv = o.rows() / t.max(1);
    let mut normed = Tensor::empty_on(&g, [t * hv, dv], o.dtype())?;
    #[allow(clippy::too_many_arguments)]
    fn norm<T: DevType>(
        g: &Gpu,
        o: &Tensor,
        p: &Tensor,
        w: &Tensor,
        out: &mut Tensor,
        dims: (usize, usize, usize, usize),
        eps: f32,
    ) -> Result<()> {
        let (t, hv, dv, zoff) = dims;
        let pw = p.last_dim();
        g.k.gated_norm_z::<T>(
            o.dev::<T>()?,
            p.dev::<T>()?,
            w.dev::<T>()?,
            out.dev_mut::<T>()?,
            t,
            hv,
            dv,
            pw,
            zoff,
            eps,
        )
        .map_err(cuda_err)
    }
    crate::by_dtype!(o.dtype(), norm(&g, o, p, w, &mut normed, (t, hv, dv, zoff), eps))?;
    Ok(normed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Device;

    /// The checkpoint plan: one window save per checkpoint (with the slot's lag before the
    /// step), and rounds whose pieces tile each chunked span in order, end at its checkpoints
    /// and copy the state after them; decode spans and padding take no part, and spans
    /// without checkpoints run whole in the first round.
    #[test]
    fn checkpoint_plan_splits_spans_at_their_checkpoints() {
        use crate::backend::CkptSave;
        let mut cache = RecCache::new(Device::Cpu, 8, 4, 16, 0, 8, 4).expect("recurrent cache");
        cache.meta_mut(SeqId(1)).expect("slot").lag = 2;
        let mut b = Batch::default();
        b.push(SeqId(0), 5, &[1]); // decode
        b.push(SeqId(1), 64, &[7; 200]); // prefill from 64: checkpoints at 128 and 256
        b.push(SeqId(2), 0, &[3; 100]); // prefill without checkpoints
        b.push(SeqId(3), 0, &[4; 128]); // prefill ending on its checkpoint
        let saves = vec![
            CkptSave { span: 1, pos: 128, slot: 2 },
            CkptSave { span: 1, pos: 256, slot: 0 },
            CkptSave { span: 3, pos: 128, slot: 3 },
        ];
        assert_eq!(ckpt_plan(&b, &cache).expect("plan"), None, "no checkpoints asked for");
        cache.ckpt_step = Some(std::sync::Arc::new(saves));
        let plan = ckpt_plan(&b, &cache).expect("plan").expect("checkpoints");
        let (r1, r2, r3) = (1u32, 1 + 200, 1 + 200 + 100);
        assert_eq!(plan.windows, vec![r1, 64, 1, 2, 2, r1, 192, 1, 2, 0, r3, 128, 3, 0, 3]);
        assert_eq!(plan.rounds.len(), 3);
        assert_eq!(plan.rounds[0].table, vec![r1, 64, 1, 0, 0, r2, 100, 2, 0, 0, r3, 128, 3, 0, 0]);
        assert_eq!((plan.rounds[0].max, &plan.rounds[0].copies), (128, &vec![(1, 0, 2), (3, 0, 3)]));
        assert_eq!(plan.rounds[1].table, vec![r1 + 64, 128, 1, 0, 0]);
        assert_eq!((plan.rounds[1].max, &plan.rounds[1].copies), (128, &vec![(1, 0, 0)]));
        assert_eq!(plan.rounds[2].table, vec![r1 + 192, 8, 1, 0, 0]);
        assert!(plan.rounds[2].copies.is_empty());
        // Two checkpoints at one position are refused.
        cache.ckpt_step = Some(std::sync::Arc::new(vec![
            CkptSave { span: 3, pos: 64, slot: 0 },
            CkptSave { span: 3, pos: 64, slot: 1 },
        ]));
        assert!(ckpt_plan(&b, &cache).is_err());
    }

    /// Every mix of span kinds stays within the per-span bound the graph recording is sized
    /// with: decode spans, K + 1-row verify spans with snapshots, chunked prefill spans, padding.
    #[test]
    fn tables_fit_the_graph_recordings_bound() {
        for spec in [0, 3] {
            let mut cache = RecCache::new(Device::Cpu, 8, 4, 16, spec, 64, 0).expect("recurrent cache");
            for (n, rows) in [(1, 1), (33, 1), (64, 1), (16, 4), (5, 9)] {
                let mut b = Batch::default();
                for i in 0..n {
                    let ids: Vec<u32> = (0..rows as u32).collect();
                    b.push(SeqId(i), 0, &ids);
                }
                for batch in [b.clone(), b.padded(n + 7, rows)] {
                    let gt = gdn_tables(&batch, &mut cache).expect("tables");
                    let spans = batch.spans.len();
                    assert!(
                        gt.data.len() <= GDN_TABLE_MAX_WORDS_PER_SPAN * spans,
                        "spec {spec}: {} words for {spans} spans of {rows} rows",
                        gt.data.len()
                    );
                    assert_eq!(gt.data.len(), gt.conv + gt.rec + gt.chunk + gt.conv_chunk + gt.fused);
                }
            }
        }
        // The bound is reached: a decode span writes conv, recurrent and fused rows.
        let mut cache = RecCache::new(Device::Cpu, 8, 4, 16, 0, 4, 0).expect("recurrent cache");
        let mut b = Batch::default();
        b.push(SeqId(0), 3, &[1]);
        assert_eq!(gdn_tables(&b, &mut cache).expect("tables").data.len(), GDN_TABLE_MAX_WORDS_PER_SPAN);
    }
}
