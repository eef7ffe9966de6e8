//! The CUDA backend: [`CudaOps`] (the [`Ops`] of device tensors) over the kernels of
//! `porter_kernels::cuda` and cuBLAS, plus the device state buffers. Device memory itself
//! (the per-device handle, typed buffers) is `crate::tensor::cuda`.

pub mod blocks;
pub mod fp8;
pub mod gdn;
mod gdn_ba;
pub mod graph;
pub mod moe;
pub mod norm_matmul;
pub mod profile;

pub use blocks::CudaKv;
pub use gdn::CudaRec;

use super::{
    Act, AttnArgs, GateIn, GdnArgs, GdnWeights, KvCache, MoeArgs, MoeShared, NormKind, Ops, QkPrep, QkPrepared,
    RecCache, RopeArgs,
};
use crate::bail;
use crate::batch::Batch;
use crate::error::Result;
use crate::tensor::cuda::{cuda_err, gpu_of, zeros, DevType, Gpu};
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cuda::CudaKernels;

/// The CUDA implementation of [`Ops`].
#[derive(Debug, Clone, Copy)]
pub struct CudaOps;

impl Ops for CudaOps {
    fn matmul_t(&self, x: &Tensor, w: &Tensor, out: DType) -> Result<Tensor> {
        matmul_t(x, w, out)
    }
    fn add_(&self, x: &mut Tensor, y: &Tensor) -> Result<()> {
        add_into(x, y)
    }
    fn add_bias(&self, y: &mut Tensor, b: &Tensor) -> Result<()> {
        blocks::add_bias(y, b)
    }
    fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        cast(x, dtype)
    }
    fn gather_rows(&self, x: &Tensor, idx: &[usize]) -> Result<Tensor> {
        gather_rows(x, idx)
    }
    fn cols(&self, x: &Tensor, col0: usize, n: usize) -> Result<Tensor> {
        cols(x, x.rows(), x.last_dim(), col0, n)
    }
    fn concat_last(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        concat_last(a, b)
    }
    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        concat_rows(parts)
    }
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        blocks::embedding(table, ids)
    }
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, kind: NormKind) -> Result<Tensor> {
        blocks::rms_norm(x, w, eps, kind)
    }
    fn add_rms_norm(&self, x: &mut Tensor, y: &Tensor, w: &Tensor, eps: f32, kind: NormKind) -> Result<Tensor> {
        blocks::add_rms_norm(x, y, w, eps, kind)
    }
    fn norm_matmul(
        &self,
        x: &Tensor,
        y: Option<&Tensor>,
        norm_w: &Tensor,
        eps: f32,
        kind: NormKind,
        w: &Tensor,
        out: DType,
    ) -> Result<Option<crate::backend::NormMatmul>> {
        norm_matmul::norm_matmul(x, y, norm_w, eps, kind, w, out)
    }
    fn rope(&self, x: &mut Tensor, rope: &RopeArgs<'_>, batch: &Batch) -> Result<()> {
        blocks::rope(x, rope, batch)
    }
    fn qk_prep(&self, qg: Tensor, k: Tensor, p: &QkPrep<'_>, batch: &Batch) -> Result<QkPrepared> {
        blocks::qk_prep(qg, k, p, batch)
    }
    fn qkv_prep(&self, qkv: Tensor, p: &QkPrep<'_>, batch: &Batch) -> Result<(QkPrepared, Tensor)> {
        blocks::qkv_prep(qkv, p, batch)
    }
    fn swiglu(&self, gate_up: &Tensor, act: Act) -> Result<Tensor> {
        fused_silu(act, "swiglu")?;
        blocks::swiglu(gate_up)
    }
    fn sigmoid_gate_mul(&self, x: &mut Tensor, gate: &Tensor) -> Result<()> {
        blocks::sigmoid_gate_mul(x, gate)
    }
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        a: &AttnArgs,
        batch: &Batch,
        kv: &mut KvCache,
    ) -> Result<Tensor> {
        blocks::attention(q, k, v, None, a, batch, kv)
    }
    fn attention_gated(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        gate: Option<&Tensor>,
        a: &AttnArgs,
        batch: &Batch,
        kv: &mut KvCache,
    ) -> Result<Tensor> {
        if gate.is_some() && !blocks::attn_gate_fused() {
            let out = blocks::attention(q, k, v, None, a, batch, kv)?;
            return crate::backend::gate_after(self, out, gate, a);
        }
        blocks::attention(q, k, v, gate, a, batch, kv)
    }
    fn moe_experts(
        &self,
        x: &Tensor,
        logits: &Tensor,
        m: &MoeArgs,
        gate: &Tensor,
        up: &Tensor,
        down: &Tensor,
        shared: Option<&MoeShared<'_>>,
    ) -> Result<(Tensor, bool)> {
        fused_silu(m.act, "moe_experts")?;
        moe::moe_experts(x, logits, m, gate, up, down, shared)
    }
    fn swiglu_cols(&self, all: &Tensor, col0: usize, inter: usize, dtype: DType, act: Act) -> Result<Tensor> {
        fused_silu(act, "swiglu_cols")?;
        moe::swiglu_cols(all, col0, inter, dtype)
    }
    fn shared_expert_add(&self, y: &mut Tensor, so: &Tensor, all: &Tensor, gate_col: usize) -> Result<()> {
        moe::shared_expert_add(y, so, all, gate_col)
    }
    fn gdn(
        &self,
        p: &Tensor,
        gates: GateIn<'_>,
        w: &GdnWeights<'_>,
        g: &GdnArgs,
        batch: &Batch,
        rec: &mut RecCache,
    ) -> Result<Tensor> {
        fused_silu(g.act, "gdn")?;
        gdn::gdn(p, gates, w, g, batch, rec)
    }
    fn gated_norm(&self, o: &Tensor, p: &Tensor, w: &Tensor, zoff: usize, eps: f32) -> Result<Tensor> {
        gdn::gated_norm(o, p, w, zoff, eps)
    }
    #[allow(clippy::too_many_arguments)]
    fn gdn_gated(
        &self,
        p: &Tensor,
        gates: GateIn<'_>,
        w: &GdnWeights<'_>,
        g: &GdnArgs,
        batch: &Batch,
        rec: &mut RecCache,
        norm_w: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        fused_silu(g.act, "gdn")?;
        gdn::gdn_gated(p, gates, w, g, batch, rec, norm_w, eps)
    }
}

/// The CUDA kernels fuse SiLU (gated MLPs, MoE experts, the Gated DeltaNet conv): any other
/// activation is an internal error here, as the load refuses it first
/// (`config::check_act_device`).
fn fused_silu(act: Act, op: &str) -> Result<()> {
    if !act.is_silu() {
        bail!(
            Internal,
            "{op} on CUDA with hidden_act \"{act}\": the CUDA kernels fuse silu (the load should have refused it)"
        );
    }
    Ok(())
}

/// `x · wᵀ` on the device: `[rows, k] × [n, k]ᵀ → [rows, n]` in `out_dtype`.
pub fn matmul_t(x: &Tensor, w: &Tensor, out_dtype: DType) -> Result<Tensor> {
    let g = gpu_of(x, "matmul")?;
    let _p = profile::span("gemm", &g);
    let (m, k, n) = (x.rows(), x.last_dim(), w.dim(0));
    if x.dtype() != w.dtype() {
        bail!(Internal, "matmul of a {} activation with a {} weight", x.dtype(), w.dtype());
    }
    let mut shape = x.shape().to_vec();
    if let Some(l) = shape.last_mut() {
        *l = n;
    }
    let mut out = Tensor::empty_on(&g, shape, out_dtype)?;
    if let Some(f) = fp8::fp8_of(w) {
        fp8::matmul_t(&g, x, f, &mut out)?;
        return Ok(out);
    }
    fn go<A: DevType>(g: &Gpu, x: &Tensor, w: &Tensor, out: &mut Tensor, m: usize, k: usize, n: usize) -> Result<()> {
        let (xs, ws) = (x.dev::<A>()?, w.dev::<A>()?);
        // Batch invariance: in an f32 model (and in deterministic mode) every row takes the
        // GEMV kernel in groups of at most 8 rows, whose per-row arithmetic (one f32 FMA chain
        // per lane, one warp sum) does not depend on the other rows; cuBLAS picks its
        // algorithm, and so a row's rounding, by the matrix shape.
        let invariant = crate::tensor::cuda::batch_invariant(A::DTYPE);
        if invariant && m > porter_kernels::cuda::GEMV_MAX_ROWS {
            const G: usize = 8;
            fn groups<A: DevType, O: DevType>(
                g: &Gpu,
                xs: &cudarc::driver::CudaSlice<A>,
                ws: &cudarc::driver::CudaSlice<A>,
                out: &mut cudarc::driver::CudaSlice<O>,
                m: usize,
                k: usize,
                n: usize,
            ) -> Result<bool> {
                if !CudaKernels::gemv_fits::<A, O>(G, k) {
                    return Ok(false);
                }
                for r0 in (0..m).step_by(G) {
                    let r = G.min(m - r0);
                    let xv = xs.slice(r0 * k..(r0 + r) * k);
                    let mut ov = out.slice_mut(r0 * n..(r0 + r) * n);
                    g.k.gemv::<A, O>(&xv, ws, &mut ov, r, k, n).map_err(cuda_err)?;
                }
                Ok(true)
            }
            let done = match out.dtype() {
                DType::F32 => groups::<A, f32>(g, xs, ws, out.dev_mut::<f32>()?, m, k, n)?,
                dt if dt == A::DTYPE => groups::<A, A>(g, xs, ws, out.dev_mut::<A>()?, m, k, n)?,
                _ => false,
            };
            if done {
                return Ok(());
            }
        }
        // Decode-sized GEMMs take porter's skinny kernel (one light launch instead of a
        // cuBLAS call); the rest cuBLAS.
        match out.dtype() {
            DType::F32 if m <= porter_kernels::cuda::GEMV_MAX_ROWS && CudaKernels::gemv_fits::<A, f32>(m, k) => {
                return g.k.gemv::<A, f32>(xs, ws, out.dev_mut::<f32>()?, m, k, n).map_err(cuda_err)
            }
            dt if dt == A::DTYPE
                && m <= porter_kernels::cuda::GEMV_MAX_ROWS
                && CudaKernels::gemv_fits::<A, A>(m, k) =>
            {
                return g.k.gemv::<A, A>(xs, ws, out.dev_mut::<A>()?, m, k, n).map_err(cuda_err)
            }
            _ => {}
        }
        match out.dtype() {
            DType::F32 => g.gemm.matmul_t::<A, f32>(xs, ws, out.dev_mut::<f32>()?, m, k, n),
            DType::BF16 => g.gemm.matmul_t::<A, bf16>(xs, ws, out.dev_mut::<bf16>()?, m, k, n),
            DType::F16 => g.gemm.matmul_t::<A, f16>(xs, ws, out.dev_mut::<f16>()?, m, k, n),
        }
        .map_err(cuda_err)
    }
    crate::by_dtype!(x.dtype(), go(&g, x, w, &mut out, m, k, n))?;
    Ok(out)
}

/// `x (f32) += y` on the device.
pub fn add_into(x: &mut Tensor, y: &Tensor) -> Result<()> {
    let g = gpu_of(x, "add")?;
    if x.dtype() != DType::F32 {
        bail!(Internal, "device residual adds need an f32 accumulator, got {}", x.dtype());
    }
    fn go<T: DevType>(g: &Gpu, x: &mut Tensor, y: &Tensor) -> Result<()> {
        let ys = y.dev::<T>()?;
        g.k.add_into_f32::<T>(x.dev_mut::<f32>()?, ys).map_err(cuda_err)
    }
    crate::by_dtype!(y.dtype(), go(&g, x, y))
}

/// Casts a device tensor to `dtype`.
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return x.try_clone();
    }
    let g = gpu_of(x, "cast")?;
    let mut out = Tensor::empty_on(&g, x.shape().to_vec(), dtype)?;
    fn go<A: DevType>(g: &Gpu, x: &Tensor, out: &mut Tensor) -> Result<()> {
        let xs = x.dev::<A>()?;
        match out.dtype() {
            DType::F32 => g.k.cast::<A, f32>(xs, out.dev_mut::<f32>()?),
            DType::BF16 => g.k.cast::<A, bf16>(xs, out.dev_mut::<bf16>()?),
            DType::F16 => g.k.cast::<A, f16>(xs, out.dev_mut::<f16>()?),
        }
        .map_err(cuda_err)
    }
    crate::by_dtype!(x.dtype(), go(&g, x, &mut out))?;
    Ok(out)
}

/// Columns `col0..col0+ncols` of the `[rows, last_dim]` view, as `[rows, ncols]`.
pub fn cols(x: &Tensor, rows: usize, stride: usize, col0: usize, ncols: usize) -> Result<Tensor> {
    let g = gpu_of(x, "cols")?;
    let mut out = Tensor::empty_on(&g, [rows, ncols], x.dtype())?;
    fn go<T: DevType>(g: &Gpu, x: &Tensor, o: &mut Tensor, r: usize, s: usize, c0: usize, nc: usize) -> Result<()> {
        g.k.copy_cols::<T>(x.dev::<T>()?, o.dev_mut::<T>()?, r, s, c0, nc).map_err(cuda_err)
    }
    crate::by_dtype!(x.dtype(), go(&g, x, &mut out, rows, stride, col0, ncols))?;
    Ok(out)
}

/// Rows `idx` of the `[rows, last_dim]` view.
pub fn gather_rows(x: &Tensor, idx: &[usize]) -> Result<Tensor> {
    let g = gpu_of(x, "gather_rows")?;
    let (rows, d) = (x.rows(), x.last_dim());
    if let Some(&bad) = idx.iter().find(|&&i| i >= rows) {
        bail!(Shape, "row index {bad} out of range ({rows} rows)");
    }
    let ids: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
    let dev_idx = g.upload(&ids)?;
    let mut out = Tensor::empty_on(&g, [idx.len(), d], x.dtype())?;
    fn go<T: DevType>(g: &Gpu, x: &Tensor, i: &CudaSlice<u32>, o: &mut Tensor, rows: usize, d: usize) -> Result<()> {
        g.k.gather_rows::<T>(x.dev::<T>()?, i, o.dev_mut::<T>()?, rows, d).map_err(cuda_err)
    }
    crate::by_dtype!(x.dtype(), go(&g, x, &dev_idx, &mut out, rows, d))?;
    Ok(out)
}

/// `[a | b]` along the last dimension on the device.
///
/// # Shapes
/// `[T, d1]`, `[T, d2]` → `[T, d1 + d2]`
pub fn concat_last(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let g = gpu_of(a, "concat")?;
    if a.dtype() != b.dtype() {
        bail!(Internal, "concat of {} and {}", a.dtype(), b.dtype());
    }
    let (rows, da, db) = (a.rows(), a.last_dim(), b.last_dim());
    let mut out = Tensor::empty_on(&g, [rows, da + db], a.dtype())?;
    fn go<T: DevType>(g: &Gpu, a: &Tensor, b: &Tensor, o: &mut Tensor, r: usize, da: usize, db: usize) -> Result<()> {
        g.k.concat_cols::<T>(a.dev::<T>()?, b.dev::<T>()?, o.dev_mut::<T>()?, r, da, db).map_err(cuda_err)
    }
    crate::by_dtype!(a.dtype(), go(&g, a, b, &mut out, rows, da, db))?;
    Ok(out)
}

/// Measured device-to-device copy bandwidth in bytes/s (read + write counted), the HBM
/// roofline `porter bench` reports fractions of: the best of several 1 GiB copies.
pub fn copy_bandwidth(g: &Gpu) -> Result<f64> {
    let n = 1usize << 28; // 256 Mi f32 = 1 GiB
    let src = zeros::<f32>(g, n)?;
    let mut dst = zeros::<f32>(g, n)?;
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        g.sync()?;
        let t0 = std::time::Instant::now();
        g.stream().memcpy_dtod(&src, &mut dst).map_err(cuda_err)?;
        g.sync()?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(2.0 * (n * 4) as f64 / best)
}

/// Parts stacked along the first dimension on the device (load-time packing).
pub fn concat_rows(parts: &[&Tensor]) -> Result<Tensor> {
    let first = parts.first().ok_or_else(|| crate::err!(Internal, "concat_rows of no tensors"))?;
    let g = gpu_of(first, "concat_rows")?;
    let mut shape = first.shape().to_vec();
    shape[0] = parts.iter().map(|p| p.dim(0)).sum();
    let mut out = Tensor::empty_on(&g, shape, first.dtype())?;
    fn go<T: DevType>(g: &Gpu, parts: &[&Tensor], o: &mut Tensor) -> Result<()> {
        let d = o.dev_mut::<T>()?;
        let mut off = 0;
        for p in parts {
            let s = p.dev::<T>()?;
            let n = s.len();
            g.stream().memcpy_dtod(s, &mut d.slice_mut(off..off + n)).map_err(cuda_err)?;
            off += n;
        }
        Ok(())
    }
    crate::by_dtype!(first.dtype(), go(&g, parts, &mut out))?;
    Ok(out)
}

/// Copies the first `rows` rows of `src` into the first rows of `dst` (same dtype and row
/// length; `dst` may hold more rows).
///
/// # Shapes
/// `src`: `[≥ rows, d]`, `dst`: `[≥ rows, d]`
pub fn copy_rows_into(src: &Tensor, dst: &mut Tensor, rows: usize) -> Result<()> {
    let g = gpu_of(src, "copy_rows")?;
    let d = src.last_dim();
    if src.dtype() != dst.dtype() || dst.last_dim() != d || src.rows() < rows || dst.rows() < rows {
        bail!(
            Internal,
            "copy of {rows} rows of {:?} {} into {:?} {}",
            src.shape(),
            src.dtype(),
            dst.shape(),
            dst.dtype()
        );
    }
    fn go<T: DevType>(g: &Gpu, s: &Tensor, o: &mut Tensor, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let src = s.dev::<T>()?.slice(0..n);
        g.stream().memcpy_dtod(&src, &mut o.dev_mut::<T>()?.slice_mut(0..n)).map_err(cuda_err)
    }
    crate::by_dtype!(src.dtype(), go(&g, src, dst, rows * d))
}

/// A new tensor holding the first `rows` rows of `src`.
///
/// # Shapes
/// `[≥ rows, d]` → `[rows, d]`
pub fn head_rows(src: &Tensor, rows: usize) -> Result<Tensor> {
    let g = gpu_of(src, "head_rows")?;
    let mut out = Tensor::empty_on(&g, [rows, src.last_dim()], src.dtype())?;
    copy_rows_into(src, &mut out, rows)?;
    Ok(out)
}
