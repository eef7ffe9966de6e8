//! CUDA forward paths of the shared blocks ([`crate::nn`], [`crate::linear_attn`]) and the
//! device state caches of attention and linear-attention layers.
//!
//! Each block's `forward` dispatches here when its input lives on a CUDA device; the math
//! and the rounding points follow the CPU path (see the block's docs). Per step, the only
//! host → device traffic is the batch metadata (token ids, positions, span tables, KV
//! addresses); nothing here waits for the device.

use crate::backend::cuda::{alloc, cuda_err, gpu_of, DevType, Gpu};
use crate::error::Result;
use crate::nn::gdn::GatedDeltaNet;
use crate::nn::{Attention, Moe, NormKind, RmsNorm, Rope, SwiGlu};
use crate::state::Batch;
use crate::state::SeqId;
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;
use crate::{bail, err};
use cudarc::driver::CudaSlice;
use porter_kernels::cuda::RmsNormKind;
use std::sync::Arc;

// ---------------------------------------------------------------------------
// Linear, RMSNorm, RoPE, SwiGLU
// ---------------------------------------------------------------------------

/// `y += b` per row.
pub fn add_bias(y: &mut Tensor, b: &Tensor) -> Result<()> {
    let g = gpu_of(y, "bias")?;
    fn go<T: DevType>(g: &Gpu, y: &mut Tensor, b: &Tensor) -> Result<()> {
        let bs = b.dev::<T>()?;
        g.k.add_bias::<T>(y.dev_mut::<T>()?, bs).map_err(cuda_err)
    }
    crate::by_dtype!(y.dtype(), go(&g, y, b))
}

/// RMSNorm of a CUDA tensor (`x` f32 or the model dtype; output in the norm's dtype).
pub fn rms_norm(n: &RmsNorm, w: &Tensor, x: &Tensor) -> Result<Tensor> {
    let g = gpu_of(x, "rms_norm")?;
    let _p = crate::backend::cuda::profile::span("rms_norm", &g);
    let d = n.dim();
    if d == 0 || !x.elem_count().is_multiple_of(d) {
        bail!(Device, "rms_norm: input {:?} is not a multiple of the norm width {d}", x.shape());
    }
    let rows = x.elem_count() / d;
    let kind = match n.kind() {
        NormKind::Standard => RmsNormKind::Standard,
        NormKind::ZeroCentred => RmsNormKind::ZeroCentred,
    };
    let mut out = Tensor::empty_on(&g, x.shape().to_vec(), w.dtype())?;
    #[allow(clippy::too_many_arguments)]
    fn go<O: DevType>(
        g: &Gpu,
        x: &Tensor,
        w: &Tensor,
        out: &mut Tensor,
        rows: usize,
        d: usize,
        eps: f32,
        kind: RmsNormKind,
    ) -> Result<()> {
        let ws = w.dev::<O>()?;
        let os = out.dev_mut::<O>()?;
        match x.dtype() {
            DType::F32 => g.k.rms_norm::<f32, O>(x.dev::<f32>()?, ws, os, rows, d, eps, kind),
            dt if dt == O::DTYPE => g.k.rms_norm::<O, O>(x.dev::<O>()?, ws, os, rows, d, eps, kind),
            dt => return Err(err!(Internal, "rms_norm of a {dt} input into {}", O::DTYPE)),
        }
        .map_err(cuda_err)
    }
    crate::by_dtype!(w.dtype(), go(&g, x, w, &mut out, rows, d, n.eps(), kind))?;
    Ok(out)
}

/// `x += y` (f32 residual) fused with the RMSNorm `n` of the sum; returns the normed rows.
pub fn add_rms_norm(n: &RmsNorm, w: &Tensor, x: &mut Tensor, y: &Tensor) -> Result<Tensor> {
    let g = gpu_of(x, "add_rms_norm")?;
    let _p = crate::backend::cuda::profile::span("add_rms_norm", &g);
    let d = n.dim();
    if x.shape() != y.shape() || x.dtype() != DType::F32 || d == 0 || x.last_dim() != d {
        bail!(
            Internal,
            "add_rms_norm of {:?} {} and {:?} {} (norm width {d})",
            x.shape(),
            x.dtype(),
            y.shape(),
            y.dtype()
        );
    }
    let rows = x.rows();
    let kind = match n.kind() {
        NormKind::Standard => RmsNormKind::Standard,
        NormKind::ZeroCentred => RmsNormKind::ZeroCentred,
    };
    let mut out = Tensor::empty_on(&g, x.shape().to_vec(), w.dtype())?;
    #[allow(clippy::too_many_arguments)]
    fn go<O: DevType>(
        g: &Gpu,
        x: &mut Tensor,
        y: &Tensor,
        w: &Tensor,
        out: &mut Tensor,
        rows: usize,
        d: usize,
        eps: f32,
        kind: RmsNormKind,
    ) -> Result<()> {
        let ws = w.dev::<O>()?;
        let os = out.dev_mut::<O>()?;
        let xs = x.dev_mut::<f32>()?;
        match y.dtype() {
            DType::F32 => g.k.add_rms_norm::<f32, O>(xs, y.dev::<f32>()?, ws, os, rows, d, eps, kind),
            dt if dt == O::DTYPE => g.k.add_rms_norm::<O, O>(xs, y.dev::<O>()?, ws, os, rows, d, eps, kind),
            dt => return Err(err!(Internal, "add_rms_norm of a {dt} input into {}", O::DTYPE)),
        }
        .map_err(cuda_err)
    }
    crate::by_dtype!(w.dtype(), go(&g, x, y, w, &mut out, rows, d, n.eps(), kind))?;
    Ok(out)
}

/// RoPE in place on `[T, heads, head_dim]` at device positions.
fn rope(r: &Rope, g: &Arc<Gpu>, x: &mut Tensor, positions: &cudarc::driver::CudaView<'_, u32>) -> Result<()> {
    let inv = r.inv_freq_on(g)?;
    let (t, heads, hd) = (x.dim(0), x.dim(1), x.dim(2));
    fn go<T: DevType>(
        g: &Gpu,
        x: &mut Tensor,
        p: &cudarc::driver::CudaView<'_, u32>,
        inv: &CudaSlice<f32>,
        dims: (usize, usize, usize, usize),
        scale: f32,
    ) -> Result<()> {
        let (t, heads, hd, rot) = dims;
        g.k.rope_neox::<T>(x.dev_mut::<T>()?, p, inv, t, heads, hd, rot, scale).map_err(cuda_err)
    }
    crate::by_dtype!(x.dtype(), go(g, x, positions, inv, (t, heads, hd, r.rot_dim()), r.attention_scaling()))
}

/// `down(silu(gate(x)) · up(x))`.
pub fn swiglu(m: &SwiGlu, x: &Tensor) -> Result<Tensor> {
    let g = gpu_of(x, "swiglu")?;
    let _p = crate::backend::cuda::profile::span("swiglu (incl. gemm)", &g);
    if let Some(gu) = &m.gate_up {
        // [T, H] -> [T, 2I] = [gate | up] -> [T, I]
        let gu_out = x.matmul_t(gu)?;
        let (t, inter) = (x.rows(), gu.dim(0) / 2);
        let mut h = Tensor::empty_on(&g, [t, inter], gu_out.dtype())?;
        fn fused<T: DevType>(g: &Gpu, gu: &Tensor, h: &mut Tensor, t: usize, i: usize) -> Result<()> {
            g.k.swiglu_fused::<T>(gu.dev::<T>()?, h.dev_mut::<T>()?, t, i).map_err(cuda_err)
        }
        crate::by_dtype!(gu_out.dtype(), fused(&g, &gu_out, &mut h, t, inter))?;
        return m.down.forward(&h);
    }
    let gate = m.gate.forward(x)?;
    let up = m.up.forward(x)?;
    let mut h = Tensor::empty_on(&g, up.shape().to_vec(), up.dtype())?;
    fn go<T: DevType>(g: &Gpu, a: &Tensor, b: &Tensor, h: &mut Tensor) -> Result<()> {
        g.k.swiglu::<T>(a.dev::<T>()?, b.dev::<T>()?, h.dev_mut::<T>()?).map_err(cuda_err)
    }
    crate::by_dtype!(up.dtype(), go(&g, &gate, &up, &mut h))?;
    m.down.forward(&h)
}

// ---------------------------------------------------------------------------
// Batch metadata
// ---------------------------------------------------------------------------

/// The per-forward tables of a batch on the device (one upload, shared by every layer).
///
/// # Shapes
/// `[positions (T) | row → span index (T) | spans (S × 3: q_row0, q_len, pos0)]` u32
#[derive(Debug)]
pub struct BatchDev {
    ordinal: usize,
    t: usize,
    n: usize,
    buf: CudaSlice<u32>,
}

impl BatchDev {
    fn positions(&self) -> cudarc::driver::CudaView<'_, u32> {
        self.buf.slice(0..self.t)
    }
    fn row_seq(&self) -> cudarc::driver::CudaView<'_, u32> {
        self.buf.slice(self.t..2 * self.t)
    }
    fn spans(&self) -> cudarc::driver::CudaView<'_, u32> {
        self.buf.slice(2 * self.t..2 * self.t + 3 * self.n)
    }
}

/// The batch's device tables, uploaded at the first call of a forward.
fn batch_dev(g: &Gpu, batch: &Batch) -> Result<Arc<BatchDev>> {
    if let Some(d) = batch.dev.get() {
        if d.ordinal == g.ordinal {
            return Ok(d.clone());
        }
    }
    let (t, n) = (batch.len(), batch.spans.len());
    let mut v: Vec<u32> = batch.positions().into_iter().map(|p| p as u32).collect();
    v.resize(2 * t, 0);
    for (i, s) in batch.spans.iter().enumerate() {
        v[t + s.start..t + s.start + s.len].iter_mut().for_each(|r| *r = i as u32);
    }
    for s in &batch.spans {
        v.extend_from_slice(&[s.start as u32, s.len as u32, s.pos0 as u32]);
    }
    let d = Arc::new(BatchDev { ordinal: g.ordinal, t, n, buf: g.upload(&v)? });
    let _ = batch.dev.set(d.clone());
    Ok(d)
}

// ---------------------------------------------------------------------------
// Attention with a device KV cache
// ---------------------------------------------------------------------------

/// One sequence's keys and values: `[cap, kv_heads, head_dim]` each, `len` valid rows.
#[derive(Debug, Clone)]
struct KvSlot {
    k: Tensor,
    v: Tensor,
    cap: usize,
    len: usize,
}

/// Device KV cache of one attention layer for every slot (per-sequence buffers that grow
/// by doubling; the attention kernel reads them through a table of addresses).
///
/// # Shapes
/// per slot: `k`, `v`: `[capacity, kv_heads, head_dim]` in the model dtype
#[derive(Debug, Clone)]
pub struct DevKv {
    pub kv_heads: usize,
    pub head_dim: usize,
    dtype: DType,
    gpu: Arc<Gpu>,
    slots: Vec<Option<KvSlot>>,
}

impl DevKv {
    pub fn new(gpu: Arc<Gpu>, kv_heads: usize, head_dim: usize, dtype: DType) -> Self {
        Self { kv_heads, head_dim, dtype, gpu, slots: Vec::new() }
    }

    /// Cached positions of a slot.
    pub fn len(&self, seq: SeqId) -> usize {
        self.slots.get(seq.0).and_then(|s| s.as_ref()).map_or(0, |s| s.len)
    }

    pub fn is_empty(&self, seq: SeqId) -> bool {
        self.len(seq) == 0
    }

    pub fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(Some(s)) = self.slots.get_mut(seq.0) {
            s.len = s.len.min(len);
        }
    }

    pub fn clear(&mut self, seq: SeqId) {
        if let Some(s) = self.slots.get_mut(seq.0) {
            *s = None;
        }
    }

    /// Makes room for positions `0..need` of a slot (keeping `0..keep`), and returns the
    /// addresses of its K and V buffers.
    fn reserve(&mut self, seq: SeqId, keep: usize, need: usize) -> Result<(u64, u64)> {
        if self.slots.len() <= seq.0 {
            self.slots.resize_with(seq.0 + 1, || None);
        }
        let row = self.kv_heads * self.head_dim;
        let cur_cap = self.slots[seq.0].as_ref().map_or(0, |s| s.cap);
        if need > cur_cap {
            let cap = need.max(2 * cur_cap).max(256).next_multiple_of(256);
            let g = self.gpu.clone();
            let mut k = Tensor::empty_on(&g, [cap, self.kv_heads, self.head_dim], self.dtype)?;
            let mut v = Tensor::empty_on(&g, [cap, self.kv_heads, self.head_dim], self.dtype)?;
            if let Some(old) = self.slots[seq.0].take() {
                let n = keep.min(old.len) * row;
                fn cp<T: DevType>(g: &Gpu, src: &Tensor, dst: &mut Tensor, n: usize) -> Result<()> {
                    if n == 0 {
                        return Ok(());
                    }
                    let s = src.dev::<T>()?.slice(0..n);
                    let mut d = dst.dev_mut::<T>()?.slice_mut(0..n);
                    g.stream().memcpy_dtod(&s, &mut d).map_err(cuda_err)
                }
                crate::by_dtype!(self.dtype, cp(&g, &old.k, &mut k, n))?;
                crate::by_dtype!(self.dtype, cp(&g, &old.v, &mut v, n))?;
            }
            self.slots[seq.0] = Some(KvSlot { k, v, cap, len: keep });
        }
        let s = self.slots[seq.0].as_mut().ok_or_else(|| err!(Internal, "KV slot missing"))?;
        if s.len < keep {
            bail!(Device, "KV cache of slot {} holds {} positions, cannot write at position {keep}", seq.0, s.len);
        }
        s.len = need;
        fn ptr<T: DevType>(g: &Gpu, t: &Tensor) -> Result<u64> {
            Ok(crate::backend::cuda::addr(g, t.dev::<T>()?))
        }
        let kp = crate::by_dtype!(self.dtype, ptr(&self.gpu, &s.k))?;
        let vp = crate::by_dtype!(self.dtype, ptr(&self.gpu, &s.v))?;
        Ok((kp, vp))
    }
}

/// Attention forward on the device.
pub fn attention(a: &Attention, x: &Tensor, batch: &Batch, cache: &mut crate::state::LayerCache) -> Result<Tensor> {
    let g = gpu_of(x, "attention")?;
    let _p = crate::backend::cuda::profile::span("attention (incl. gemm, norms)", &g);
    let c = &a.cfg;
    let (t, hd) = (x.rows(), c.head_dim);
    let crate::state::LayerCache::KvCuda(kv) = cache else {
        bail!(Device, "attention layer was given a non-device KV cache")
    };
    let qg = a.q_proj.forward(x)?;
    // [T, heads·hd·2] viewed as [T·heads, 2·hd]: q = columns 0..hd, gate = hd..2hd.
    let (q, gate) = if c.output_gate {
        let q = crate::backend::cuda::cols(&qg, t * c.heads, 2 * hd, 0, hd)?;
        let gt = crate::backend::cuda::cols(&qg, t * c.heads, 2 * hd, hd, hd)?;
        (q, Some(gt))
    } else {
        (qg, None)
    };
    // [T, heads·hd] -> [T, heads, hd]; [T, kv·hd] -> [T, kv, hd]
    let q = q.reshape([t, c.heads, hd])?;
    let k = a.k_proj.forward(x)?.reshape([t, c.kv_heads, hd])?;
    let v = a.v_proj.forward(x)?;
    let mut q = match &a.q_norm {
        Some(n) => n.forward(&q)?,
        None => q,
    };
    let mut k = match &a.k_norm {
        Some(n) => n.forward(&k)?,
        None => k,
    };
    let bd = batch_dev(&g, batch)?;
    let pos = bd.positions();
    rope(&a.rope, &g, &mut q, &pos)?;
    rope(&a.rope, &g, &mut k, &pos)?;
    // This layer's KV addresses per sequence: [k (S) | v (S)], one upload.
    let n = batch.spans.len();
    let mut kvp = vec![0u64; 2 * n];
    let mut max_q = 0;
    for (i, s) in batch.spans.iter().enumerate() {
        let (k_addr, v_addr) = kv.reserve(s.seq, s.pos0, s.pos0 + s.len)?;
        kvp[i] = k_addr;
        kvp[n + i] = v_addr;
        max_q = max_q.max(s.len);
    }
    let kvp = g.upload(&kvp)?;
    let (kp, vp) = (kvp.slice(0..n), kvp.slice(n..2 * n));
    let (spans, row_seq) = (bd.spans(), bd.row_seq());
    let mut out = Tensor::empty_on(&g, [t, c.heads, hd], x.dtype())?;
    type View<'a, T> = cudarc::driver::CudaView<'a, T>;
    type Meta<'a> = (&'a View<'a, u32>, &'a View<'a, u32>, &'a View<'a, u32>, &'a View<'a, u64>, &'a View<'a, u64>);
    #[allow(clippy::too_many_arguments)]
    fn go<T: DevType>(
        g: &Gpu,
        a: &Attention,
        k: &Tensor,
        v: &Tensor,
        q: &Tensor,
        out: &mut Tensor,
        meta: Meta<'_>,
        t: usize,
        max_q: usize,
    ) -> Result<()> {
        let (row_seq, pos, spans, kp, vp) = meta;
        let c = &a.cfg;
        g.k.kv_append::<T>(k.dev::<T>()?, v.dev::<T>()?, row_seq, pos, kp, vp, t, c.kv_heads, c.head_dim)
            .map_err(cuda_err)?;
        g.k.attention::<T>(
            q.dev::<T>()?,
            kp,
            vp,
            spans,
            out.dev_mut::<T>()?,
            t,
            spans.len() / 3,
            max_q,
            c.heads,
            c.kv_heads,
            c.head_dim,
            c.scale,
            c.window,
        )
        .map_err(cuda_err)
    }
    crate::by_dtype!(x.dtype(), go(&g, a, &k, &v, &q, &mut out, (&row_seq, &pos, &spans, &kp, &vp), t, max_q))?;
    if let Some(gt) = gate {
        fn gate_mul<T: DevType>(g: &Gpu, out: &mut Tensor, gt: &Tensor, rows: usize, hd: usize) -> Result<()> {
            g.k.sigmoid_gate_mul::<T>(out.dev_mut::<T>()?, gt.dev::<T>()?, rows, hd, hd).map_err(cuda_err)
        }
        crate::by_dtype!(x.dtype(), gate_mul(&g, &mut out, &gt, t * c.heads, hd))?;
    }
    // [T, heads, hd] -> [T, heads·hd]
    a.o_proj.forward(&out.reshape([t, c.heads * hd])?)
}

// ---------------------------------------------------------------------------
// MoE
// ---------------------------------------------------------------------------

/// Sparse MoE on the device: router (f32 logits) → top-k → grouped expert GEMMs → shared
/// expert. Returns the `[T, hidden]` output in f32 (added to the f32 residual stream).
pub fn moe(m: &Moe, x: &Tensor) -> Result<Tensor> {
    let g = gpu_of(x, "moe")?;
    let _p = crate::backend::cuda::profile::span("moe (incl. router, shared expert)", &g);
    let (t, h) = (x.rows(), x.last_dim());
    let e = m.router.out_features();
    let k = m.top_k;
    // Router logits in f32 — with a shared expert, one f32 GEMM over the stacked
    // [router; shared gate; shared up; shared expert gate] rows: [T, E + 2·I_s + 1].
    let logits = match &m.stacked_in {
        Some(w) => x.matmul_t_to(w, DType::F32)?,
        None => x.matmul_t_to(&m.router.w, DType::F32)?,
    };
    let stride = logits.last_dim();
    let mut idx = alloc::<u32>(&g, t * k)?;
    let mut wts = alloc::<f32>(&g, t * k)?;
    g.k.moe_router_strided(logits.dev::<f32>()?, stride, &mut idx, &mut wts, t, e, k, m.norm_topk_prob)
        .map_err(cuda_err)?;
    let inter = m.gate.dim(1);
    let mut y = Tensor::empty_on(&g, [t, h], DType::F32)?;
    fn go<T: DevType>(
        g: &Gpu,
        m: &Moe,
        x: &Tensor,
        idx: &CudaSlice<u32>,
        w: &CudaSlice<f32>,
        y: &mut Tensor,
        dims: (usize, usize, usize, usize, usize),
    ) -> Result<()> {
        let (t, k, e, h, inter) = dims;
        g.k.moe_experts::<T>(
            x.dev::<T>()?,
            idx,
            w,
            m.gate.dev::<T>()?,
            m.up.dev::<T>()?,
            m.down.dev::<T>()?,
            y.dev_mut::<f32>()?,
            t,
            k,
            e,
            h,
            inter,
        )
        .map_err(cuda_err)
    }
    crate::by_dtype!(x.dtype(), go(&g, m, x, &idx, &wts, &mut y, (t, k, e, h, inter)))?;
    if let (Some(s), true) = (&m.shared, m.stacked_in.is_some()) {
        // Shared expert from the stacked GEMM: gate/up at columns E.., its gate logit last.
        let inter_s = s.mlp.down.w.dim(1);
        let mut hsh = Tensor::empty_on(&g, [t, inter_s], x.dtype())?;
        fn act<T: DevType>(g: &Gpu, all: &Tensor, h: &mut Tensor, dims: (usize, usize, usize, usize)) -> Result<()> {
            let (t, i, stride, col0) = dims;
            g.k.swiglu_f32in::<T>(all.dev::<f32>()?, h.dev_mut::<T>()?, t, i, stride, col0).map_err(cuda_err)
        }
        crate::by_dtype!(x.dtype(), act(&g, &logits, &mut hsh, (t, inter_s, stride, e)))?;
        let so = s.mlp.down.forward(&hsh)?;
        fn add<T: DevType>(
            g: &Gpu,
            y: &mut Tensor,
            so: &Tensor,
            all: &Tensor,
            dims: (usize, usize, usize),
        ) -> Result<()> {
            let (h, stride, gcol) = dims;
            let t = so.rows();
            g.k.shared_expert_add_f32g::<T>(y.dev_mut::<f32>()?, so.dev::<T>()?, all.dev::<f32>()?, t, h, stride, gcol)
                .map_err(cuda_err)
        }
        crate::by_dtype!(x.dtype(), add(&g, &mut y, &so, &logits, (h, stride, e + 2 * inter_s)))?;
    } else if let Some(s) = &m.shared {
        let so = s.mlp.forward(x)?;
        let gate = s.gate.forward(x)?;
        fn add<T: DevType>(g: &Gpu, y: &mut Tensor, so: &Tensor, gate: &Tensor, h: usize) -> Result<()> {
            g.k.shared_expert_add::<T>(y.dev_mut::<f32>()?, so.dev::<T>()?, gate.dev::<T>()?, h).map_err(cuda_err)
        }
        crate::by_dtype!(x.dtype(), add(&g, &mut y, &so, &gate, h))?;
    }
    Ok(y)
}

// ---------------------------------------------------------------------------
// Gated DeltaNet with a device recurrent cache
// ---------------------------------------------------------------------------

/// Host bookkeeping of one slot of a [`DevRecurrent`] (the CPU `RecurrentLayer`'s meaning).
#[derive(Debug, Clone, Copy, Default)]
struct RecMeta {
    /// Newest conv-window entries rolled back (ignored by the next step).
    lag: usize,
    /// SSM buffer holding the current state.
    cur: usize,
    /// Tokens consumed before the last step.
    base: usize,
    /// Tokens of the last step whose post-token states are kept (0: only the final one).
    kept: usize,
}

/// Device conv windows and SSM states of one Gated DeltaNet layer for every slot, with
/// `spec + 1` SSM buffers and a conv window of `kernel − 1 + spec` inputs per slot for
/// zero-copy rollback of rejected draft tokens (as the CPU `RecurrentLayer`).
///
/// # Shapes
/// - conv windows `[max_slots, conv_dim, kernel − 1 + spec]` f32 (oldest first)
/// - SSM states `[max_slots, spec + 1, Hv·dk·dv]` f32
#[derive(Debug)]
pub struct DevRecurrent {
    pub conv_dim: usize,
    pub kernel: usize,
    pub state_len: usize,
    pub spec: usize,
    max_slots: usize,
    gpu: Arc<Gpu>,
    window: CudaSlice<f32>,
    ssm: CudaSlice<f32>,
    meta: Vec<RecMeta>,
}

impl Clone for DevRecurrent {
    fn clone(&self) -> Self {
        Self {
            window: self.window.clone(),
            ssm: self.ssm.clone(),
            gpu: self.gpu.clone(),
            meta: self.meta.clone(),
            ..*self
        }
    }
}

impl DevRecurrent {
    pub fn new(
        gpu: Arc<Gpu>,
        conv_dim: usize,
        kernel: usize,
        state_len: usize,
        spec: usize,
        max_slots: usize,
    ) -> Result<Self> {
        let win = kernel.saturating_sub(1) + spec;
        let window = crate::backend::cuda::zeros::<f32>(&gpu, max_slots * conv_dim * win.max(1))?;
        let ssm = crate::backend::cuda::zeros::<f32>(&gpu, max_slots * (spec + 1) * state_len)?;
        Ok(Self {
            conv_dim,
            kernel,
            state_len,
            spec,
            max_slots,
            gpu,
            window,
            ssm,
            meta: vec![RecMeta::default(); max_slots],
        })
    }

    fn win(&self) -> usize {
        (self.kernel.saturating_sub(1) + self.spec).max(1)
    }

    fn slot(&self, seq: SeqId) -> Result<usize> {
        if seq.0 >= self.max_slots {
            bail!(Device, "sequence slot {} exceeds the device cache's {} slots", seq.0, self.max_slots);
        }
        Ok(seq.0)
    }

    pub fn can_rollback(&self, seq: SeqId, from: usize, to: usize) -> bool {
        if to == from {
            return true;
        }
        match self.meta.get(seq.0) {
            Some(m) => m.kept > 0 && to > m.base && from == m.base + m.kept,
            None => false,
        }
    }

    pub fn rollback(&mut self, seq: SeqId, from: usize, to: usize) -> Result<()> {
        if to == from {
            return Ok(());
        }
        if !self.can_rollback(seq, from, to) {
            bail!(Device,
                "cannot roll the recurrent state of slot {} back from {from} to {to} tokens: only the tokens of the last step (at most the speculative window) can be rejected",
                seq.0
            );
        }
        let m = &mut self.meta[seq.0];
        m.cur = to - m.base - 1;
        m.kept = to - m.base;
        m.lag += from - to;
        Ok(())
    }

    pub fn clear(&mut self, seq: SeqId) -> Result<()> {
        let s = self.slot(seq)?;
        self.meta[s] = RecMeta::default();
        let (cw, sl) = (self.conv_dim * self.win(), (self.spec + 1) * self.state_len);
        let st = self.gpu.stream().clone();
        st.memset_zeros(&mut self.window.slice_mut(s * cw..(s + 1) * cw)).map_err(cuda_err)?;
        st.memset_zeros(&mut self.ssm.slice_mut(s * sl..(s + 1) * sl)).map_err(cuda_err)?;
        Ok(())
    }
}

/// Span count, longest span and the device span table of one delta-rule launch.
type DeltaSpans<'a> = (usize, usize, cudarc::driver::CudaView<'a, u32>);

/// Shortest span that takes the chunked delta rule (chunks are 64 tokens).
const GDN_CHUNKED_MIN_LEN: usize = 64;

/// Gated DeltaNet forward on the device.
pub fn gated_delta_net(
    gd: &GatedDeltaNet,
    x: &Tensor,
    batch: &Batch,
    cache: &mut crate::state::LayerCache,
) -> Result<Tensor> {
    let g = gpu_of(x, "gated_delta_net")?;
    let _p = crate::backend::cuda::profile::span("gated_delta_net (incl. gemm)", &g);
    let crate::state::LayerCache::RecurrentCuda(rc) = cache else {
        bail!(Device, "linear-attention layer was given a non-device recurrent cache")
    };
    let dev = gd.dev.as_ref().ok_or_else(|| err!(Internal, "Gated DeltaNet weights are not on the device"))?;
    let c = gd.cfg;
    let (hk, hv, dk, dv) = (c.key_heads, c.value_heads, c.key_dim, c.value_dim);
    let (vd, conv) = (hv * dv, c.conv_dim());
    let t = x.rows();
    // [T, H] -> [T, 2kd + 2vd + 2Hv] = [q | k | v | z | b | a] (one GEMM over the stacked
    // in-projections; the conv, z and gates read their columns in place).
    let p = x.matmul_t(&dev.in_proj)?;
    let ba_col = 2 * c.key_heads * c.key_dim + 2 * vd;
    // Span tables: conv (row0, len, slot, lag), delta rule (row0, len, slot, src_buf, snapshot).
    let n = batch.spans.len();
    // Long spans without snapshots (prefill) take the chunked algorithm; the rest (decode,
    // speculative verify with per-token snapshots) the per-token recurrence.
    let (mut conv_spans, mut rec_spans, mut chunk_spans) = (Vec::with_capacity(4 * n), Vec::new(), Vec::new());
    let (mut rec_max, mut chunk_max) = (0, 0);
    for s in &batch.spans {
        let slot = rc.slot(s.seq)?;
        let snapshots = rc.spec > 0 && s.len <= rc.spec + 1;
        let m = &mut rc.meta[slot];
        conv_spans.extend_from_slice(&[s.start as u32, s.len as u32, slot as u32, m.lag as u32]);
        let row = [s.start as u32, s.len as u32, slot as u32, m.cur as u32, snapshots as u32];
        if !snapshots && s.len >= GDN_CHUNKED_MIN_LEN {
            chunk_spans.extend_from_slice(&row);
            chunk_max = chunk_max.max(s.len);
        } else {
            rec_spans.extend_from_slice(&row);
            rec_max = rec_max.max(s.len);
        }
        m.lag = 0;
        m.base = s.pos0;
        if snapshots {
            m.kept = s.len;
            m.cur = s.len - 1;
        } else {
            m.kept = 0;
        }
    }
    // One upload: [conv (4n) | recurrent (5r) | chunked (5c)].
    let (nc, nr, nk) = (conv_spans.len(), rec_spans.len(), chunk_spans.len());
    conv_spans.extend_from_slice(&rec_spans);
    conv_spans.extend_from_slice(&chunk_spans);
    let tables = g.upload(&conv_spans)?;
    let conv_spans = tables.slice(0..nc);
    let rec = (nr / 5, rec_max, tables.slice(nc..nc + nr));
    let chunk = (nk / 5, chunk_max, tables.slice(nc + nr..nc + nr + nk));
    let win = rc.win();
    let nbuf = rc.spec + 1;
    let mut qkv = alloc::<f32>(&g, t * conv)?;
    let mut gate = alloc::<f32>(&g, t * hv)?;
    let mut beta = alloc::<f32>(&g, t * hv)?;
    let mut o = Tensor::empty_on(&g, [t * hv, dv], x.dtype())?;
    #[allow(clippy::too_many_arguments)]
    fn go<T: DevType>(
        g: &Gpu,
        gd: &GatedDeltaNet,
        p: &Tensor,
        ba_col: usize,
        rc: &mut DevRecurrent,
        spans: (&cudarc::driver::CudaView<'_, u32>, usize, &DeltaSpans, &DeltaSpans),
        qkv: &mut CudaSlice<f32>,
        gb: (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        o: &mut Tensor,
        dims: (usize, usize, usize),
    ) -> Result<()> {
        let (conv_spans, n, rec, chunk) = spans;
        let (t, win, nbuf) = dims;
        let c = gd.cfg;
        let dev = gd.dev.as_ref().ok_or_else(|| err!(Internal, "GDN weights not on the device"))?;
        let (gate, beta) = gb;
        g.k.gdn_conv_seq::<T>(
            p.dev::<T>()?,
            p.last_dim(),
            &dev.conv_w,
            &mut rc.window,
            conv_spans,
            qkv,
            t,
            n,
            c.conv_dim(),
            c.conv_kernel,
            win,
            rc.max_slots,
        )
        .map_err(cuda_err)?;
        g.k.gdn_gates_ba::<T>(
            p.dev::<T>()?,
            p.last_dim(),
            ba_col,
            &dev.a_log,
            &dev.dt_bias,
            gate,
            beta,
            t,
            c.value_heads,
        )
        .map_err(cuda_err)?;
        let (hk, hv, dk, dv, ns) = (c.key_heads, c.value_heads, c.key_dim, c.value_dim, rc.max_slots);
        if rec.0 > 0 {
            let (cnt, max, sp) = rec;
            g.k.gdn_delta_seq::<T>(
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
        }
        if chunk.0 > 0 {
            let (cnt, max, sp) = chunk;
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
        }
        Ok(())
    }
    crate::by_dtype!(
        x.dtype(),
        go(
            &g,
            gd,
            &p,
            ba_col,
            rc,
            (&conv_spans, n, &rec, &chunk),
            &mut qkv,
            (&mut gate, &mut beta),
            &mut o,
            (t, win, nbuf)
        )
    )?;
    // Gated RMSNorm per value head with SiLU(z), z = columns conv..conv+vd of P read in place.
    let mut normed = Tensor::empty_on(&g, [t * hv, dv], x.dtype())?;
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
    crate::by_dtype!(x.dtype(), norm(&g, &o, &p, &dev.norm_w, &mut normed, (t, hv, dv, conv), c.eps))?;
    let _ = (hk, dk);
    // [T·Hv, dv] -> [T, Hv·dv] -> [T, H]
    gd.out_proj.forward(&normed.reshape([t, vd])?)
}

/// Device copies of the small Gated DeltaNet weights, and the stacked in-projection.
#[derive(Debug, Clone)]
pub struct GdnDev {
    /// `[in_proj_qkvz; in_proj_ba]`: `[2·Hk·dk + 2·Hv·dv + 2·Hv, hidden]`
    pub in_proj: Tensor,
    /// `[conv_dim, K]` f32
    pub conv_w: CudaSlice<f32>,
    /// `[Hv]` f32
    pub a_log: CudaSlice<f32>,
    /// `[Hv]` f32
    pub dt_bias: CudaSlice<f32>,
    /// `[dv]` in the model dtype
    pub norm_w: Tensor,
}

impl GdnDev {
    pub fn new(
        gpu: &Arc<Gpu>,
        in_proj: Tensor,
        conv_w: &[f32],
        a_log: &[f32],
        dt_bias: &[f32],
        norm_w: Tensor,
    ) -> Result<Self> {
        Ok(Self {
            in_proj,
            conv_w: crate::backend::cuda::upload::<f32>(gpu, conv_w)?,
            a_log: crate::backend::cuda::upload::<f32>(gpu, a_log)?,
            dt_bias: crate::backend::cuda::upload::<f32>(gpu, dt_bias)?,
            norm_w,
        })
    }
}

// ---------------------------------------------------------------------------
// Embedding, sampling
// ---------------------------------------------------------------------------

/// Embedding gather into the f32 residual stream.
pub fn embedding(table: &Tensor, ids: &[u32]) -> Result<Tensor> {
    let g = gpu_of(table, "embedding")?;
    let _p = crate::backend::cuda::profile::span("embedding", &g);
    let (vocab, hidden) = (table.dim(0), table.dim(1));
    let dev_ids = g.upload(ids)?;
    let mut out = Tensor::empty_on(&g, [ids.len(), hidden], DType::F32)?;
    fn go<T: DevType>(
        g: &Gpu,
        table: &Tensor,
        ids: &CudaSlice<u32>,
        out: &mut Tensor,
        v: usize,
        h: usize,
    ) -> Result<()> {
        g.k.embedding::<T>(table.dev::<T>()?, ids, out.dev_mut::<f32>()?, v, h).map_err(cuda_err)
    }
    crate::by_dtype!(table.dtype(), go(&g, table, &dev_ids, &mut out, vocab, hidden))?;
    Ok(out)
}

/// Samples one id per row of device logits `[rows, vocab]`: `params[r] = (temperature,
/// top_k (0 = none), top_p (1 = none), u)` with `u` the host sampler's uniform draw, so
/// the device picks exactly the token the CPU sampler would. Only the ids come back.
pub fn sample_rows(logits: &Tensor, params: &[[f32; 4]]) -> Result<Vec<u32>> {
    let g = gpu_of(logits, "sample")?;
    let (rows, vocab) = (logits.rows(), logits.last_dim());
    if params.len() != rows {
        bail!(Internal, "{} sampling parameter rows for {rows} logit rows", params.len());
    }
    if params.iter().all(|p| p[0] == 0.0) {
        // Greedy rows: a plain argmax (first index on ties, as the host sampler).
        let mut out = alloc::<u32>(&g, rows)?;
        g.k.argmax(logits.dev::<f32>()?, &mut out, rows, vocab).map_err(cuda_err)?;
        return g.stream().clone_dtoh(&out).map_err(cuda_err);
    }
    let flat: Vec<f32> = params.iter().flatten().copied().collect();
    let p = g.upload(&flat)?;
    let mut out = alloc::<u32>(&g, rows)?;
    g.k.sample_rows(logits.dev::<f32>()?, &p, &mut out, rows, vocab).map_err(cuda_err)?;
    g.stream().clone_dtoh(&out).map_err(cuda_err)
}
