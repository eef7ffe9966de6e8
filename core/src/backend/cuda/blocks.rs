//! CUDA bodies of the block-level ops of [`crate::backend::Ops`] and the device state
//! buffers of attention and linear-attention layers.
//!
//! The math and the rounding points follow the CPU backend (`backend/cpu.rs`). Per step, the
//! only host → device traffic is the batch metadata (token ids, positions, span tables, KV
//! addresses); nothing here waits for the device.

use super::profile;
use crate::backend::{
    qk_prep_composed, qkv_prep_composed, AttnArgs, HeadNorm, KvBuf, KvCache, NormKind, QkPrep, QkPrepared, RopeArgs,
};
use crate::batch::{Batch, PageStep};
use crate::error::Context;
use crate::error::Result;
use crate::tensor::cuda::{alloc, cuda_err, gpu_of, zeros, BatchDev, DevType, Gpu, PageDev, UploadTag};
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;
use crate::{bail, err};
use cudarc::driver::CudaSlice;
use porter_kernels::cpu::kv_quant::KvQuant;
use porter_kernels::cuda::{qk_prep_enabled, QkNorm, QuantPools, RmsNormKind, QK_PREP_MAX_HD};
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
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, kind: NormKind) -> Result<Tensor> {
    let g = gpu_of(x, "rms_norm")?;
    let _p = profile::span("rms_norm", &g);
    let d = w.elem_count();
    if d == 0 || !x.elem_count().is_multiple_of(d) {
        bail!(Shape, "rms_norm: input {:?} is not a multiple of the norm width {d}", x.shape());
    }
    let rows = x.elem_count() / d;
    let kind = norm_kind(kind);
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
    crate::by_dtype!(w.dtype(), go(&g, x, w, &mut out, rows, d, eps, kind))?;
    Ok(out)
}

pub(crate) fn norm_kind(k: NormKind) -> RmsNormKind {
    match k {
        NormKind::Standard => RmsNormKind::Standard,
        NormKind::ZeroCentred => RmsNormKind::ZeroCentred,
    }
}

/// `x += y` (f32 residual) fused with the RMSNorm of the sum; returns the normed rows.
pub fn add_rms_norm(x: &mut Tensor, y: &Tensor, w: &Tensor, eps: f32, kind: NormKind) -> Result<Tensor> {
    let g = gpu_of(x, "add_rms_norm")?;
    let _p = profile::span("add_rms_norm", &g);
    let d = w.elem_count();
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
    let kind = norm_kind(kind);
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
    crate::by_dtype!(w.dtype(), go(&g, x, y, w, &mut out, rows, d, eps, kind))?;
    Ok(out)
}

/// RoPE in place on `[T, heads, head_dim]` at the batch's positions.
pub fn rope(x: &mut Tensor, r: &RopeArgs<'_>, batch: &Batch) -> Result<()> {
    let g = gpu_of(x, "rope")?;
    let bd = batch_dev(&g, batch)?;
    let positions = bd.positions();
    let inv = r.inv_freq.dev::<f32>()?;
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
    crate::by_dtype!(x.dtype(), go(&g, x, &positions, inv, (t, heads, hd, r.rot_dim), r.scaling))
}

/// [`crate::backend::Ops::qk_prep`]: one launch (`CudaKernels::qk_prep`) where the
/// projections and the norm weights share one dtype and head_dim <= 512, the same values as
/// the composition (which runs elsewhere, and with `PORTER_QK_PREP=apart`).
///
/// # Shapes
/// `qg`: `[T, heads·hd·(1 + gated)]`, `k`: `[T, kv_heads·hd]` → [`QkPrepared`]
pub fn qk_prep(qg: Tensor, k: Tensor, p: &QkPrep<'_>, batch: &Batch) -> Result<QkPrepared> {
    if !qk_prep_fits(&qg, Some(&k), p) {
        return qk_prep_composed(&super::CudaOps, qg, k, p, batch);
    }
    let (t, (qw, kw)) = (qg.rows(), p.widths());
    if qg.elem_count() != t * qw || k.elem_count() != t * kw {
        bail!(
            Shape,
            "qk_prep: projections {:?} and {:?} for {} heads, {} kv heads of {}",
            qg.shape(),
            k.shape(),
            p.heads,
            p.kv_heads,
            p.head_dim
        );
    }
    qk_prep_run(QkIn::Apart(&qg, &k), p, batch, t)
}

/// [`crate::backend::Ops::qkv_prep`]: one launch (`CudaKernels::qkv_prep`) where
/// [`qk_prep`]'s holds, else the composition.
///
/// # Shapes
/// `qkv`: `[T, heads·hd·(1 + gated) + 2·kv_heads·hd]` → ([`QkPrepared`], v `[T, kv_heads·hd]`)
pub fn qkv_prep(qkv: Tensor, p: &QkPrep<'_>, batch: &Batch) -> Result<(QkPrepared, Tensor)> {
    let (t, (qw, kw)) = (qkv.rows(), p.widths());
    if !qk_prep_fits(&qkv, None, p) || qkv.last_dim() != qw + 2 * kw {
        return qkv_prep_composed(&super::CudaOps, qkv, p, batch);
    }
    let mut v = Tensor::empty_on(&gpu_of(&qkv, "qkv_prep")?, [t, kw], qkv.dtype())?;
    let prepared = qk_prep_run(QkIn::Packed(&qkv, &mut v), p, batch, t)?;
    Ok((prepared, v))
}

/// Whether the one-launch preparation takes these operands: one dtype for the projections
/// and the norm weights, head_dim within the kernel, and the kernel not turned off.
fn qk_prep_fits(qg: &Tensor, k: Option<&Tensor>, p: &QkPrep<'_>) -> bool {
    let dt = qg.dtype();
    let one_dtype =
        k.is_none_or(|k| k.dtype() == dt) && [&p.q_norm, &p.k_norm].into_iter().flatten().all(|n| n.w.dtype() == dt);
    one_dtype && p.head_dim <= QK_PREP_MAX_HD && qk_prep_enabled()
}

/// The sources of [`qk_prep_run`]: the projections apart, or packed `[qg | k | v]` with the
/// output v is copied to (`[T, kv_heads·hd]`).
enum QkIn<'a> {
    Apart(&'a Tensor, &'a Tensor),
    Packed(&'a Tensor, &'a mut Tensor),
}

/// The launch of [`qk_prep`] / [`qkv_prep`] (`t` tokens; shapes checked by the callers): q, k
/// and the gate (and, packed, v into its output).
fn qk_prep_run(src: QkIn<'_>, p: &QkPrep<'_>, batch: &Batch, t: usize) -> Result<QkPrepared> {
    let first = match &src {
        QkIn::Apart(qg, _) | QkIn::Packed(qg, _) => *qg,
    };
    let (dt, hd) = (first.dtype(), p.head_dim);
    let g = gpu_of(first, "qk_prep")?;
    let _p = profile::span("qk_prep", &g);
    let bd = batch_dev(&g, batch)?;
    let positions = bd.positions();
    let mut q = Tensor::empty_on(&g, [t, p.heads, hd], dt)?;
    let mut ko = Tensor::empty_on(&g, [t, p.kv_heads, hd], dt)?;
    let mut gate = if p.gated { Some(Tensor::empty_on(&g, [t * p.heads, hd], dt)?) } else { None };
    #[allow(clippy::too_many_arguments)]
    fn go<T: DevType>(
        g: &Gpu,
        src: QkIn<'_>,
        (q, ko, gate): (&mut Tensor, &mut Tensor, Option<&mut Tensor>),
        p: &QkPrep<'_>,
        positions: &cudarc::driver::CudaView<'_, u32>,
        t: usize,
    ) -> Result<()> {
        fn norm<'a, T: DevType>(n: Option<HeadNorm<'a>>) -> Result<Option<QkNorm<'a, T>>> {
            n.map(|n| Ok(QkNorm { w: n.w.dev::<T>()?, eps: n.eps, kind: norm_kind(n.kind) })).transpose()
        }
        let (qn, kn) = (norm::<T>(p.q_norm)?, norm::<T>(p.k_norm)?);
        let gate = gate.map(|g| g.dev_mut::<T>()).transpose()?;
        let inv = p.rope.inv_freq.dev::<f32>()?;
        let dims = [t, p.heads, p.kv_heads, p.head_dim, p.rope.rot_dim];
        let (qd, kd) = (q.dev_mut::<T>()?, ko.dev_mut::<T>()?);
        match src {
            QkIn::Apart(qg, k) => g.k.qk_prep::<T>(
                qg.dev::<T>()?,
                k.dev::<T>()?,
                qn,
                kn,
                qd,
                kd,
                gate,
                positions,
                inv,
                dims,
                p.rope.scaling,
            ),
            QkIn::Packed(qkv, vo) => g.k.qkv_prep::<T>(
                qkv.dev::<T>()?,
                (qn, kn),
                qd,
                kd,
                vo.dev_mut::<T>()?,
                gate,
                positions,
                inv,
                dims,
                p.rope.scaling,
            ),
        }
        .map_err(cuda_err)
    }
    crate::by_dtype!(dt, go(&g, src, (&mut q, &mut ko, gate.as_mut()), p, &positions, t))?;
    Ok(QkPrepared { q, k: ko, gate })
}

/// `silu(g) · u` of a stacked `[T, 2I] = [gate | up]` → `[T, I]`.
pub fn swiglu(gu: &Tensor) -> Result<Tensor> {
    let g = gpu_of(gu, "swiglu")?;
    let _p = profile::span("swiglu", &g);
    let (t, inter) = (gu.rows(), gu.last_dim() / 2);
    let mut h = Tensor::empty_on(&g, [t, inter], gu.dtype())?;
    fn fused<T: DevType>(g: &Gpu, gu: &Tensor, h: &mut Tensor, t: usize, i: usize) -> Result<()> {
        g.k.swiglu_fused::<T>(gu.dev::<T>()?, h.dev_mut::<T>()?, t, i).map_err(cuda_err)
    }
    crate::by_dtype!(gu.dtype(), fused(&g, gu, &mut h, t, inter))?;
    Ok(h)
}

/// `x *= sigmoid(gate)` elementwise.
pub fn sigmoid_gate_mul(x: &mut Tensor, gate: &Tensor) -> Result<()> {
    let g = gpu_of(x, "sigmoid_gate")?;
    let (rows, d) = (x.rows(), x.last_dim());
    fn go<T: DevType>(g: &Gpu, out: &mut Tensor, gt: &Tensor, rows: usize, d: usize) -> Result<()> {
        g.k.sigmoid_gate_mul::<T>(out.dev_mut::<T>()?, gt.dev::<T>()?, rows, d, d).map_err(cuda_err)
    }
    crate::by_dtype!(x.dtype(), go(&g, x, gate, rows, d))
}

// ---------------------------------------------------------------------------
// Batch metadata
// ---------------------------------------------------------------------------

/// The host values of a batch's [`BatchDev`]: `[positions (T) | spans (S × 3: q_row0, q_len,
/// pos0)]`.
pub(crate) fn batch_table(batch: &Batch) -> Vec<u32> {
    let mut v: Vec<u32> = Vec::with_capacity(batch.len() + 3 * batch.spans.len());
    v.extend(batch.positions().into_iter().map(|p| p as u32));
    for s in &batch.spans {
        v.extend_from_slice(&[s.start as u32, s.len as u32, s.pos0 as u32]);
    }
    v
}

/// The batch's device tables, uploaded at the first call of a forward.
fn batch_dev(g: &Gpu, batch: &Batch) -> Result<Arc<BatchDev>> {
    if let Some(d) = batch.dev.get() {
        if d.ordinal == g.ordinal {
            return Ok(d.clone());
        }
    }
    let (t, n) = (batch.len(), batch.spans.len());
    let d = Arc::new(BatchDev { ordinal: g.ordinal, t, n, buf: g.upload_as(UploadTag::Batch, &batch_table(batch))? });
    let _ = batch.dev.set(d.clone());
    Ok(d)
}

// ---------------------------------------------------------------------------
// Attention with a device KV cache
// ---------------------------------------------------------------------------

/// Device KV pool of one attention layer: `k`, `v` of `[rows, kv_heads, head_dim]`,
/// allocated once; the kernels address it through the step's slots and block tables.
///
/// # Shapes
/// `k`, `v`: `[rows, kv_heads, head_dim]` in the model dtype, or quantized: bytes of that
/// shape plus `[rows, kv_heads]` f32 scales each ([`porter_kernels::cuda::QuantPools`])
#[derive(Debug, Clone)]
pub struct CudaKv {
    pub kv_heads: usize,
    pub head_dim: usize,
    pool: CudaPool,
}

/// The pools of one layer (one value per attention layer, so the variants' sizes do not matter).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
enum CudaPool {
    Plain { k: Tensor, v: Tensor },
    Quant(Arc<std::sync::Mutex<QuantPools>>),
}

impl CudaKv {
    /// A pool of `rows` token rows (zeroed; scales 0 until written), allocated now: of the
    /// model dtype, or quantized as `quant`.
    pub fn new(
        gpu: Arc<Gpu>,
        kv_heads: usize,
        head_dim: usize,
        dtype: DType,
        quant: Option<KvQuant>,
        rows: usize,
    ) -> Result<Self> {
        let rows = rows.max(1);
        let pool = match quant {
            None => {
                let bytes = 2 * rows * kv_heads * head_dim * dtype.size_in_bytes();
                let mk = || {
                    Tensor::zeros_on(&gpu, [rows, kv_heads, head_dim], dtype)
                        .with_context(|| format!("allocating a KV pool of {rows} rows ({bytes} bytes for K and V)"))
                };
                CudaPool::Plain { k: mk()?, v: mk()? }
            }
            Some(kind) => {
                let (n, ns) = (rows * kv_heads * head_dim, rows * kv_heads);
                let bytes = 2 * (n + 4 * ns);
                let ctx =
                    || format!("allocating a quantized KV pool of {rows} rows ({bytes} bytes for K, V and scales)");
                let k = zeros::<u8>(&gpu, n).with_context(ctx)?;
                let v = zeros::<u8>(&gpu, n).with_context(ctx)?;
                let k_scale = zeros::<f32>(&gpu, ns).with_context(ctx)?;
                let v_scale = zeros::<f32>(&gpu, ns).with_context(ctx)?;
                CudaPool::Quant(Arc::new(std::sync::Mutex::new(QuantPools { kind, k, v, k_scale, v_scale })))
            }
        };
        Ok(Self { kv_heads, head_dim, pool })
    }
}

/// The host values of a step's [`PageDev`] with block tables `width` entries wide (at least
/// the step's own width; the rest [`crate::batch::PAD`]): `[slots (T) | tables (S × width)]`.
pub(crate) fn page_table(step: &PageStep, width: usize) -> Result<Vec<u32>> {
    let (mb, n) = (step.max_blocks, step.tables.len() / step.max_blocks.max(1));
    if width < mb {
        bail!(Internal, "block tables of {mb} entries laid out {width} wide");
    }
    let mut v = Vec::with_capacity(step.slots.len() + n * width);
    v.extend_from_slice(&step.slots);
    for row in step.tables.chunks(mb.max(1)) {
        v.extend_from_slice(row);
        v.resize(v.len() + width - mb, crate::batch::PAD);
    }
    Ok(v)
}

/// The step's slots and block tables on the device, uploaded once per forward.
fn page_dev(g: &Gpu, step: &PageStep) -> Result<Arc<PageDev>> {
    if let Some(d) = step.dev.get() {
        if d.ordinal == g.ordinal {
            return Ok(d.clone());
        }
    }
    let v = page_table(step, step.max_blocks)?;
    let d = Arc::new(PageDev { ordinal: g.ordinal, t: step.slots.len(), buf: g.upload_as(UploadTag::Page, &v)? });
    let _ = step.dev.set(d.clone());
    Ok(d)
}

/// Environment variable: `apart` runs a gated attention's output gate as a launch of its own
/// (`sigmoid_gate_mul`) after the attention; `fused` or unset (the default) passes it to the
/// attention call, whose decode kernels apply it as they write each row. Same bits either way;
/// read once, another value warns once and means the default.
///
/// Measured in the model (H100, 24-layer 80B, batch 1, graphs on; docs/benchmarks.md "Session
/// 30"): with the gate read after the decode attention's PDL wait the fusion lost 0.5–0.8 %;
/// with it prefetched before the wait, where Q is read (2026-12-07, call 3), it is even at 128
/// keys (bf16 447.6 / 447.3 against 448.3 / 449.4 tok/s apart, FP8 563.7 / 565.6 against
/// 566.7 / 564.7) and ahead at 4,096 (bf16 445.4 / 446.7 against 439.0 / 442.3, FP8 560.6 /
/// 559.9 against 557.2 / 557.2).
pub const ATTN_GATE_ENV: &str = "PORTER_ATTN_GATE";

/// Whether the attention call applies the output gate ([`ATTN_GATE_ENV`], read once; on by
/// default).
pub fn attn_gate_fused() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| porter_kernels::cuda::env_fused(ATTN_GATE_ENV, true))
}

/// Writes K / V into the paged pool and attends (see `Ops::attention`); with `gate`
/// (`[T·heads, hd]`), times its sigmoid (`Ops::attention_gated`).
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    gate: Option<&Tensor>,
    c: &AttnArgs,
    batch: &Batch,
    cache: &mut KvCache,
) -> Result<Tensor> {
    let g = gpu_of(q, "attention")?;
    let _p = profile::span("attention", &g);
    let (t, hd) = (q.dim(0), c.head_dim);
    let step = cache.step_for(batch)?;
    let block_size = cache.block_size;
    let KvBuf::Cuda(kv) = &mut cache.buf else { bail!(Internal, "device attention with a host KV cache") };
    let bd = batch_dev(&g, batch)?;
    let pd = page_dev(&g, &step)?;
    let max_q = batch.spans.iter().map(|s| s.len).max().unwrap_or(0);
    let mut out = Tensor::empty_on(&g, [t, c.heads, hd], q.dtype())?;
    #[allow(clippy::too_many_arguments)]
    fn go<T: DevType>(
        g: &Gpu,
        c: &AttnArgs,
        (k, v, q, gate): (&Tensor, &Tensor, &Tensor, Option<&Tensor>),
        kv: &mut CudaKv,
        out: &mut Tensor,
        bd: &BatchDev,
        pd: &PageDev,
        step: &PageStep,
        block_size: usize,
        t: usize,
        max_q: usize,
    ) -> Result<()> {
        let spans = bd.spans();
        let (kp, vp) = match &mut kv.pool {
            CudaPool::Plain { k, v } => (k, v),
            CudaPool::Quant(qp) => {
                let mut qp = qp.lock().unwrap_or_else(|e| e.into_inner());
                g.k.kv_append_quant::<T>(k.dev::<T>()?, v.dev::<T>()?, &pd.slots(), &mut qp, t, c.kv_heads, c.head_dim)
                    .map_err(cuda_err)?;
                g.k.attention_quant::<T>(
                    q.dev::<T>()?,
                    &qp,
                    &pd.tables(),
                    step.max_blocks,
                    block_size,
                    &spans,
                    out.dev_mut::<T>()?,
                    t,
                    spans.len() / 3,
                    max_q,
                    c.heads,
                    c.kv_heads,
                    c.head_dim,
                    c.scale,
                    c.window,
                    attn_mode(),
                )
                .map_err(cuda_err)?;
                // The quantized pools' kernels take no gate: a launch of its own.
                return match gate {
                    Some(gate) => {
                        g.k.sigmoid_gate_mul::<T>(
                            out.dev_mut::<T>()?,
                            gate.dev::<T>()?,
                            t * c.heads,
                            c.head_dim,
                            c.head_dim,
                        )
                        .map_err(cuda_err)
                    }
                    None => Ok(()),
                };
            }
        };
        // The append, then the attention, in one call: the decode kernel may then read
        // ahead of its PDL wait (kernels/src/cuda/attention.rs `append_attention`).
        g.k.append_attention_gated::<T>(
            k.dev::<T>()?,
            v.dev::<T>()?,
            &pd.slots(),
            kp.dev_mut::<T>()?,
            vp.dev_mut::<T>()?,
            q.dev::<T>()?,
            &pd.tables(),
            (step.max_blocks, block_size),
            &spans,
            out.dev_mut::<T>()?,
            (t, spans.len() / 3, max_q),
            (c.heads, c.kv_heads, c.head_dim),
            c.scale,
            c.window,
            attn_mode(),
            gate.map(|g| g.dev::<T>()).transpose()?,
        )
        .map_err(cuda_err)
    }
    if let Some(gt) = gate {
        if gt.elem_count() != t * c.heads * hd || gt.dtype() != q.dtype() {
            bail!(
                Shape,
                "attention gate {:?} ({}) for {t} rows of {} heads of {hd} ({})",
                gt.shape(),
                gt.dtype(),
                c.heads,
                q.dtype()
            );
        }
    }
    crate::by_dtype!(q.dtype(), go(&g, c, (k, v, q, gate), kv, &mut out, &bd, &pd, &step, block_size, t, max_q))?;
    Ok(out)
}

/// The attention kernels' mode: batch-invariant when deterministic mode is on
/// ([`crate::tensor::cuda::set_deterministic`]).
fn attn_mode() -> porter_kernels::cuda::AttnMode {
    if crate::tensor::cuda::deterministic() {
        porter_kernels::cuda::AttnMode::Invariant
    } else {
        porter_kernels::cuda::AttnMode::Fast
    }
}

// ---------------------------------------------------------------------------
// Embedding, sampling
// ---------------------------------------------------------------------------

/// Embedding gather into the f32 residual stream.
pub fn embedding(table: &Tensor, ids: &[u32]) -> Result<Tensor> {
    let g = gpu_of(table, "embedding")?;
    let _p = profile::span("embedding", &g);
    let (vocab, hidden) = (table.dim(0), table.dim(1));
    let dev_ids = g.upload_as(UploadTag::Ids, ids)?;
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
