//! CUDA body of [`crate::backend::Ops::norm_matmul`]: the RMSNorm (or residual add + RMSNorm)
//! before a decode projection fused into that projection's skinny GEMV
//! (`CudaKernels::norm_gemv`, bit for bit the two launches it replaces).

use super::blocks::norm_kind;
use super::{fp8, profile};
use crate::backend::{NormKind, NormMatmul};
use crate::error::Result;
use crate::tensor::cuda::{cuda_err, gpu_of, DevFp8, DevType, Gpu};
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;
use porter_kernels::cuda::{norm_gemv_wanted, CudaKernels, NormGemvAdd};

/// The fused op where it applies (`Ok(None)` otherwise: see `fuses`).
pub fn norm_matmul(
    x: &Tensor,
    y: Option<&Tensor>,
    norm_w: &Tensor,
    eps: f32,
    kind: NormKind,
    w: &Tensor,
    out: DType,
) -> Result<Option<NormMatmul>> {
    if let Some(f) = fp8::fp8_of(w) {
        return norm_matmul_fp8(x, y, norm_w, eps, kind, w, f, out);
    }
    if !fuses(x, y, norm_w, w, out) {
        return Ok(None);
    }
    let g = gpu_of(x, "norm_matmul")?;
    let _p = profile::span(if y.is_some() { "add_rms_norm + matmul" } else { "rms_norm + matmul" }, &g);
    let (m, k, n) = (x.rows(), x.last_dim(), w.dim(0));
    let mut o = Tensor::empty_on(&g, vec![m, n], out)?;
    let mut normed = Tensor::empty_on(&g, x.shape().to_vec(), norm_w.dtype())?;
    let mut sum = y.map(|_| Tensor::empty_on(&g, x.shape().to_vec(), DType::F32)).transpose()?;
    /// The launch with the output in `O` and `y` (if any) in `Y`.
    #[allow(clippy::too_many_arguments)]
    fn run<T: DevType, O: DevType, Y: DevType>(
        g: &Gpu,
        (x, y, norm_w, w): (&Tensor, Option<&Tensor>, &Tensor, &Tensor),
        (eps, kind): (f32, NormKind),
        o: &mut Tensor,
        normed: &mut Tensor,
        sum: Option<&mut Tensor>,
        dims: (usize, usize, usize),
    ) -> Result<()> {
        let (xs, nws, ws) = (x.dev::<f32>()?, norm_w.dev::<T>()?, w.dev::<T>()?);
        let ns = normed.dev_mut::<T>()?;
        let add = match (y, sum) {
            (Some(y), Some(s)) => Some(NormGemvAdd { y: y.dev::<Y>()?, sum: s.dev_mut::<f32>()? }),
            _ => None,
        };
        g.k.norm_gemv::<T, O, Y>(xs, add, nws, eps, norm_kind(kind), ws, o.dev_mut::<O>()?, ns, dims).map_err(cuda_err)
    }
    #[allow(clippy::too_many_arguments)]
    fn go<T: DevType>(
        g: &Gpu,
        ops: (&Tensor, Option<&Tensor>, &Tensor, &Tensor),
        nk: (f32, NormKind),
        o: &mut Tensor,
        normed: &mut Tensor,
        sum: Option<&mut Tensor>,
        dims: (usize, usize, usize),
    ) -> Result<()> {
        let y32 = ops.1.is_some_and(|y| y.dtype() == DType::F32);
        match (o.dtype() == DType::F32, y32) {
            (true, true) => run::<T, f32, f32>(g, ops, nk, o, normed, sum, dims),
            (true, false) => run::<T, f32, T>(g, ops, nk, o, normed, sum, dims),
            (false, true) => run::<T, T, f32>(g, ops, nk, o, normed, sum, dims),
            (false, false) => run::<T, T, T>(g, ops, nk, o, normed, sum, dims),
        }
    }
    crate::by_dtype!(
        norm_w.dtype(),
        go(&g, (x, y, norm_w, w), (eps, kind), &mut o, &mut normed, sum.as_mut(), (m, k, n))
    )?;
    Ok(Some(NormMatmul { normed, out: o.reshape(out_shape(x, n))?, sum }))
}

/// `x`'s shape with the last dimension `n` (the product's shape).
fn out_shape(x: &Tensor, n: usize) -> Vec<usize> {
    let mut shape = x.shape().to_vec();
    if let Some(l) = shape.last_mut() {
        *l = n;
    }
    shape
}

/// [`norm_matmul`] with an FP8 weight: fused (`CudaKernels::norm_fp8_gemv`) for the norm
/// alone (no add) of at most `FP8_GEMV_MAX_ROWS` rows into an output of the norm's dtype —
/// where `matmul_t` takes the FP8 GEMV — else `Ok(None)`. `f` is `w`'s FP8 storage.
#[allow(clippy::too_many_arguments)]
fn norm_matmul_fp8(
    x: &Tensor,
    y: Option<&Tensor>,
    norm_w: &Tensor,
    eps: f32,
    kind: NormKind,
    w: &Tensor,
    f: &DevFp8,
    out: DType,
) -> Result<Option<NormMatmul>> {
    let t = norm_w.dtype();
    let (m, k, n) = (x.rows(), x.last_dim(), f.rows());
    let plain = y.is_none()
        && x.dtype() == DType::F32
        && out == t
        && f.dtype == t
        && f.cols == k
        && n > 0
        && norm_w.elem_count() == k
        && m <= fp8::FP8_GEMV_MAX_ROWS
        && x.device() == w.device();
    fn fits<T: DevType>(m: usize, k: usize) -> bool {
        CudaKernels::norm_fp8_gemv_fits::<T>(m, k)
    }
    if !plain || !crate::by_dtype!(t, fits(m, k)) || !norm_gemv_wanted(m, n, k) {
        return Ok(None);
    }
    let g = gpu_of(x, "norm_matmul")?;
    let _p = profile::span("rms_norm + fp8 matmul", &g);
    let mut o = Tensor::empty_on(&g, vec![m, n], out)?;
    let mut normed = Tensor::empty_on(&g, x.shape().to_vec(), t)?;
    fn go<T: DevType>(
        g: &Gpu,
        (x, norm_w, f): (&Tensor, &Tensor, &DevFp8),
        (eps, kind): (f32, NormKind),
        o: &mut Tensor,
        normed: &mut Tensor,
        m: usize,
    ) -> Result<()> {
        let (xs, nws) = (x.dev::<f32>()?, norm_w.dev::<T>()?);
        let ns = normed.dev_mut::<T>()?;
        g.k.norm_fp8_gemv::<T>(xs, nws, eps, norm_kind(kind), f.view(), o.dev_mut::<T>()?, ns, m).map_err(cuda_err)
    }
    crate::by_dtype!(t, go(&g, (x, norm_w, f), (eps, kind), &mut o, &mut normed, m))?;
    Ok(Some(NormMatmul { normed, out: o.reshape(out_shape(x, n))?, sum: None }))
}

/// Whether the fused kernel takes these operands: the f32 residual `x` of at most
/// `NORM_GEMV_MAX_ROWS` rows, a plain (not FP8) 2-D weight of the norm's dtype, `y` (if any)
/// of `x`'s shape in that dtype or f32, output in that dtype or f32, all within the kernel's limits
/// — exactly where `matmul_t` takes the skinny GEMV, so that both ways give the same bits —
/// and the fusion asked for (`PORTER_NORM_GEMV`: by default one row into a small weight).
fn fuses(x: &Tensor, y: Option<&Tensor>, norm_w: &Tensor, w: &Tensor, out: DType) -> bool {
    let t = norm_w.dtype();
    let (m, k) = (x.rows(), x.last_dim());
    let shapes = x.dtype() == DType::F32
        && norm_w.elem_count() == k
        && w.shape().len() == 2
        && w.dim(1) == k
        && w.dim(0) > 0
        && fp8::fp8_of(w).is_none()
        && w.dtype() == t
        && (out == t || out == DType::F32)
        && y.is_none_or(|y| y.shape() == x.shape() && (y.dtype() == t || y.dtype() == DType::F32))
        && m <= porter_kernels::cuda::GEMV_MAX_ROWS;
    if !shapes || x.device() != w.device() || !norm_gemv_wanted(m, w.dim(0), k) {
        return false;
    }
    fn fits<T: DevType>(m: usize, k: usize, out: DType) -> bool {
        if out == DType::F32 {
            CudaKernels::norm_gemv_fits::<T, f32>(m, k)
        } else {
            CudaKernels::norm_gemv_fits::<T, T>(m, k)
        }
    }
    crate::by_dtype!(t, fits(m, k, out))
}
