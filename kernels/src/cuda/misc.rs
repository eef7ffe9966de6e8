//! Launch wrappers of kernels/cuda/misc.cu (glue of the model path) and the cuBLAS GEMM.

use super::{ew_cfg, prod, row_threads, rows_cfg, u32_of, CudaError, CudaFloat, CudaKernels, Result, MISC};
use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// cuBLAS data type of a storage type.
fn cuda_type<T: CudaFloat>() -> blas_sys::cudaDataType {
    match T::NAME {
        "f32" => blas_sys::cudaDataType::CUDA_R_32F,
        "bf16" => blas_sys::cudaDataType::CUDA_R_16BF,
        _ => blas_sys::cudaDataType::CUDA_R_16F,
    }
}

impl CudaKernels {
    /// `x += y` (the f32 residual stream plus a layer output).
    ///
    /// # Shapes
    /// `x`: `[n]` f32, `y`: `[n]` (`T`)
    pub fn add_into_f32<T: CudaFloat>(&self, x: &mut impl DevicePtrMut<f32>, y: &impl DevicePtr<T>) -> Result<()> {
        let n = x.len();
        self.check("y", y, n)?;
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        // SAFETY: matches add_into_f32_<T>; both buffers hold n elements.
        // Kernel: `add_into_f32_<T>(float* x, const T* y, u64 n)`.
        unsafe { launch!(self, MISC, format!("add_into_f32_{}", T::NAME), ew_cfg(n), [ptr_mut(x), ptr(y), n64]) }
    }

    /// `y = B(x)`, rounded once. `A` and `B` must differ.
    pub fn cast<A: CudaFloat, B: CudaFloat>(&self, x: &impl DevicePtr<A>, y: &mut impl DevicePtrMut<B>) -> Result<()> {
        let n = x.len();
        self.check("y", y, n)?;
        if A::NAME == B::NAME {
            return Err(CudaError::Invalid("cast: same type".into()));
        }
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        // SAFETY: matches cast_<A>_<B>; both buffers hold n elements.
        // Kernel: `cast_<A>_<B>(const A* x, B* y, u64 n)`.
        unsafe { launch!(self, MISC, format!("cast_{}_{}", A::NAME, B::NAME), ew_cfg(n), [ptr(x), ptr_mut(y), n64]) }
    }

    /// `dst[r, c] = src[r, col0 + c]` for a `[rows, stride]` source.
    ///
    /// # Shapes
    /// `src`: `[rows, stride]`, `dst`: `[rows, ncols]`
    pub fn copy_cols<T: CudaFloat>(
        &self,
        src: &impl DevicePtr<T>,
        dst: &mut impl DevicePtrMut<T>,
        rows: usize,
        stride: usize,
        col0: usize,
        ncols: usize,
    ) -> Result<()> {
        if col0 + ncols > stride {
            return Err(CudaError::Invalid(format!("copy_cols: columns {col0}+{ncols} exceed stride {stride}")));
        }
        self.check("src", src, prod(&[rows, stride])?)?;
        self.check("dst", dst, prod(&[rows, ncols])?)?;
        let n = rows * ncols;
        if n == 0 {
            return Ok(());
        }
        let (r64, st, c0, nc) =
            (rows as u64, u32_of("stride", stride)?, u32_of("col0", col0)?, u32_of("ncols", ncols)?);
        // SAFETY: matches copy_cols_<T>; sizes checked above.
        // Kernel: `copy_cols_<T>(const T* src, T* dst, u64 rows, u32 stride, u32 col0, u32 ncols)`.
        unsafe {
            launch!(self, MISC, format!("copy_cols_{}", T::NAME), ew_cfg(n), [ptr(src), ptr_mut(dst), r64, st, c0, nc])
        }
    }

    /// `dst[r] = src[idx[r]]` (an index `>= src_rows` gives a NaN row).
    ///
    /// # Shapes
    /// `src`: `[src_rows, d]`, `idx`: `[rows]`, `dst`: `[rows, d]`
    pub fn gather_rows<T: CudaFloat>(
        &self,
        src: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        dst: &mut impl DevicePtrMut<T>,
        src_rows: usize,
        d: usize,
    ) -> Result<()> {
        let rows = idx.len();
        self.check("src", src, prod(&[src_rows, d])?)?;
        self.check("dst", dst, prod(&[rows, d])?)?;
        let n = rows * d;
        if n == 0 {
            return Ok(());
        }
        let (r64, d32, sr) = (rows as u64, u32_of("d", d)?, u32_of("src_rows", src_rows)?);
        // SAFETY: matches gather_rows_<T>; sizes checked, indices bounds-checked in the kernel.
        // Kernel: `gather_rows_<T>(const T* src, const u32* idx, T* dst, u64 rows, u32 d, u32 src_rows)`.
        unsafe {
            launch!(
                self,
                MISC,
                format!("gather_rows_{}", T::NAME),
                ew_cfg(n),
                [ptr(src), ptr(idx), ptr_mut(dst), r64, d32, sr]
            )
        }
    }

    /// `y[r, c] = round(y[r, c] + bias[c])`.
    pub fn add_bias<T: CudaFloat>(&self, y: &mut impl DevicePtrMut<T>, bias: &impl DevicePtr<T>) -> Result<()> {
        let n = bias.len();
        if n == 0 || !y.len().is_multiple_of(n) {
            return Err(CudaError::Invalid(format!("add_bias: {} values vs bias of {n}", y.len())));
        }
        let rows = y.len() / n;
        let (r64, n32) = (rows as u64, u32_of("n", n)?);
        // SAFETY: matches add_bias_<T>; y holds rows·n values.
        // Kernel: `add_bias_<T>(T* y, const T* b, u64 rows, u32 n)`.
        unsafe {
            launch!(self, MISC, format!("add_bias_{}", T::NAME), ew_cfg(rows * n), [ptr_mut(y), ptr(bias), r64, n32])
        }
    }

    /// Shared expert: `y[r] += σ(g[r]) · s[r]`.
    ///
    /// # Shapes
    /// `y`: `[rows, h]` f32, `s`: `[rows, h]`, `g`: `[rows]`
    pub fn shared_expert_add<T: CudaFloat>(
        &self,
        y: &mut impl DevicePtrMut<f32>,
        s_out: &impl DevicePtr<T>,
        g: &impl DevicePtr<T>,
        h: usize,
    ) -> Result<()> {
        let rows = g.len();
        self.check("y", y, prod(&[rows, h])?)?;
        self.check("s", s_out, prod(&[rows, h])?)?;
        if rows * h == 0 {
            return Ok(());
        }
        let (r64, h32) = (rows as u64, u32_of("h", h)?);
        // SAFETY: matches shared_expert_add_<T>; sizes checked.
        // Kernel: `shared_expert_add_<T>(float* y, const T* s, const T* g, u64 rows, u32 h)`.
        unsafe {
            launch!(
                self,
                MISC,
                format!("shared_expert_add_{}", T::NAME),
                ew_cfg(rows * h),
                [ptr_mut(y), ptr(s_out), ptr(g), r64, h32]
            )
        }
    }

    /// Residual add fused with the next RMSNorm: `x += y` (f32), then `out = norm(x)`
    /// (`rms_norm`'s formulas; `Y` is `f32` or `O`).
    ///
    /// # Shapes
    /// `x`: `[rows, d]` f32 (updated), `y`: `[rows, d]`, `w`: `[d]`, `out`: `[rows, d]`
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm<Y: CudaFloat, O: CudaFloat>(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        y: &impl DevicePtr<Y>,
        w: &impl DevicePtr<O>,
        out: &mut impl DevicePtrMut<O>,
        rows: usize,
        d: usize,
        eps: f32,
        kind: super::RmsNormKind,
    ) -> Result<()> {
        self.add_rms_norm_with(norm_preload(), x, y, w, out, rows, d, eps, kind)
    }

    /// [`CudaKernels::add_rms_norm`] with the preloading (norm weights read and the residual
    /// prefetched into L2 before the PDL wait) named: `false` is the `PORTER_NORM_PRELOAD=off`
    /// form (A/B timing). Same bits either way.
    ///
    /// # Errors
    /// As [`CudaKernels::add_rms_norm`].
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm_with<Y: CudaFloat, O: CudaFloat>(
        &self,
        preload: bool,
        x: &mut impl DevicePtrMut<f32>,
        y: &impl DevicePtr<Y>,
        w: &impl DevicePtr<O>,
        out: &mut impl DevicePtrMut<O>,
        rows: usize,
        d: usize,
        eps: f32,
        kind: super::RmsNormKind,
    ) -> Result<()> {
        if d == 0 {
            return Err(CudaError::Invalid("add_rms_norm: d must be > 0".into()));
        }
        let n = prod(&[rows, d])?;
        self.check("x", x, n)?;
        self.check("y", y, n)?;
        self.check("w", w, d)?;
        self.check("out", out, n)?;
        if Y::NAME != "f32" && Y::NAME != O::NAME {
            return Err(CudaError::Invalid("add_rms_norm: y must be f32 or the output type".into()));
        }
        if rows == 0 {
            return Ok(());
        }
        let name = if Y::NAME == "f32" && O::NAME != "f32" {
            format!("add_rms_norm_f32y_{}", O::NAME)
        } else {
            format!("add_rms_norm_{}_{}", O::NAME, O::NAME)
        };
        let s = &*self.stream;
        let (pw, _gw) = w.device_ptr(s);
        let (d32, zc) = (u32_of("d", d)?, norm_flags(kind, preload));
        let cfg = rows_cfg(rows, row_threads(d, 512), 0)?;
        // SAFETY: matches add_rms_norm_*; sizes checked; one block per row.
        // Kernel: `add_rms_norm_<O>_<O>` / `add_rms_norm_f32y_<O>(float* x, const Y* y, const O* w, O* out, u32 d,
        // float eps, int zc)`.
        unsafe { launch!(self, MISC, name, cfg, [ptr_mut(x), ptr(y), pw, ptr_mut(out), d32, eps, zc]) }
    }

    /// Gated RMSNorm with SiLU(z) where z is read in place from the in-projection output
    /// `p` (`[t, pw]`): row `token·hv + head` of `x` uses `p[token, zoff + head·d ..]`.
    ///
    /// # Shapes
    /// `x`, `out`: `[t·hv, d]`, `p`: `[t, pw]`, `w`: `[d]`
    #[allow(clippy::too_many_arguments)]
    pub fn gated_norm_z<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        p: &impl DevicePtr<T>,
        w: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<T>,
        t: usize,
        hv: usize,
        d: usize,
        pw: usize,
        zoff: usize,
        eps: f32,
    ) -> Result<()> {
        if d == 0 || hv == 0 || zoff + hv * d > pw {
            return Err(CudaError::Invalid(format!("gated_norm_z: z columns {zoff}+{hv}·{d} exceed {pw}")));
        }
        let rows = prod(&[t, hv])?;
        self.check("x", x, prod(&[rows, d])?)?;
        self.check("p", p, prod(&[t, pw])?)?;
        self.check("w", w, d)?;
        self.check("out", out, prod(&[rows, d])?)?;
        if rows == 0 {
            return Ok(());
        }
        let (d32, hv32, pw32, z32) = (u32_of("d", d)?, u32_of("hv", hv)?, u32_of("pw", pw)?, u32_of("zoff", zoff)?);
        let rows32 = u32_of("rows", rows)?;
        // One warp a row, GATED_NORM_Z_ROWS rows a block (misc.cu); a decode step's few rows
        // one a block, so that they spread over the SMs (32 rows in 4 blocks took 4.1 µs on
        // the H200 against 2.6 for the earlier block-a-row kernel; the kernel takes its rows a
        // block from blockDim).
        let per_block = if rows <= 8 * self.caps().sms { 1 } else { GATED_NORM_Z_ROWS };
        let cfg = LaunchConfig {
            grid_dim: (rows32.div_ceil(per_block), 1, 1),
            block_dim: (32 * per_block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches gated_norm_z_<T>; sizes checked; rows past `rows` return.
        // Kernel: `gated_norm_z_<T>(const T* x, const T* p, const T* w, T* out, u32 d, float eps, u32 hv, u32 pw,
        // u32 zoff, u32 rows)`.
        unsafe {
            launch!(
                self,
                MISC,
                format!("gated_norm_z_{}", T::NAME),
                cfg,
                [ptr(x), ptr(p), ptr(w), ptr_mut(out), d32, eps, hv32, pw32, z32, rows32]
            )
        }
    }

    /// SwiGLU of a stacked f32 GEMM output: `out[r, c] = round(silu(round(g)) · round(u))`
    /// with `[g | u]` at columns `col0..col0 + 2·inter` of the `[rows, stride]` matrix `src`.
    pub fn swiglu_f32in<T: CudaFloat>(
        &self,
        src: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<T>,
        rows: usize,
        inter: usize,
        stride: usize,
        col0: usize,
    ) -> Result<()> {
        if col0 + 2 * inter > stride {
            return Err(CudaError::Invalid(format!("swiglu_f32in: columns {col0}+2·{inter} exceed {stride}")));
        }
        self.check("src", src, prod(&[rows, stride])?)?;
        self.check("out", out, prod(&[rows, inter])?)?;
        if rows * inter == 0 {
            return Ok(());
        }
        let (r64, i32_, st, c0) =
            (rows as u64, u32_of("inter", inter)?, u32_of("stride", stride)?, u32_of("col0", col0)?);
        // SAFETY: matches swiglu_f32in_<T>; sizes checked.
        // Kernel: `swiglu_f32in_<T>(const float* src, T* out, u64 rows, u32 inter, u32 stride, u32 col0)`.
        unsafe {
            launch!(
                self,
                MISC,
                format!("swiglu_f32in_{}", T::NAME),
                ew_cfg(rows * inter),
                [ptr(src), ptr_mut(out), r64, i32_, st, c0]
            )
        }
    }

    /// Shared expert with an f32 gate logit: `y[r] += σ(round(src[r, gcol])) · s[r]`.
    ///
    /// # Shapes
    /// `y`: `[rows, h]` f32, `s_out`: `[rows, h]`, `src`: `[rows, stride]` f32
    #[allow(clippy::too_many_arguments)]
    pub fn shared_expert_add_f32g<T: CudaFloat>(
        &self,
        y: &mut impl DevicePtrMut<f32>,
        s_out: &impl DevicePtr<T>,
        src: &impl DevicePtr<f32>,
        rows: usize,
        h: usize,
        stride: usize,
        gcol: usize,
    ) -> Result<()> {
        if gcol >= stride {
            return Err(CudaError::Invalid(format!("shared_expert_add_f32g: column {gcol} >= {stride}")));
        }
        self.check("y", y, prod(&[rows, h])?)?;
        self.check("s", s_out, prod(&[rows, h])?)?;
        self.check("src", src, prod(&[rows, stride])?)?;
        if rows * h == 0 {
            return Ok(());
        }
        let (r64, h32, st, gc) = (rows as u64, u32_of("h", h)?, u32_of("stride", stride)?, u32_of("gcol", gcol)?);
        // SAFETY: matches shared_expert_add_f32g_<T>; sizes checked.
        // Kernel: `shared_expert_add_f32g_<T>(float* y, const T* s, const float* src, u64 rows, u32 h, u32 stride,
        // u32 gcol)`.
        unsafe {
            launch!(
                self,
                MISC,
                format!("shared_expert_add_f32g_{}", T::NAME),
                ew_cfg(rows * h),
                [ptr_mut(y), ptr(s_out), ptr(src), r64, h32, st, gc]
            )
        }
    }

    /// `out[r] = [a[r] | b[r]]`.
    ///
    /// # Shapes
    /// `a`: `[rows, da]`, `b`: `[rows, db]`, `out`: `[rows, da + db]`
    pub fn concat_cols<T: CudaFloat>(
        &self,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<T>,
        rows: usize,
        da: usize,
        db: usize,
    ) -> Result<()> {
        self.check("a", a, prod(&[rows, da])?)?;
        self.check("b", b, prod(&[rows, db])?)?;
        self.check("out", out, prod(&[rows, da + db])?)?;
        if rows * (da + db) == 0 {
            return Ok(());
        }
        let (r64, da32, db32) = (rows as u64, u32_of("da", da)?, u32_of("db", db)?);
        // SAFETY: matches concat_cols_<T>; sizes checked.
        // Kernel: `concat_cols_<T>(const T* a, const T* b, T* out, u64 rows, u32 da, u32 db)`.
        unsafe {
            launch!(
                self,
                MISC,
                format!("concat_cols_{}", T::NAME),
                ew_cfg(rows * (da + db)),
                [ptr(a), ptr(b), ptr_mut(out), r64, da32, db32]
            )
        }
    }

    /// Fills `y` with `offset + scale·u`, `u` uniform in [−1, 1) from a hash of `(seed, i)`
    /// (benchmark weights generated on the device).
    pub fn fill_uniform<T: CudaFloat>(
        &self,
        y: &mut impl DevicePtrMut<T>,
        seed: u64,
        scale: f32,
        offset: f32,
    ) -> Result<()> {
        let n = y.len();
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        // SAFETY: matches fill_uniform_<T>; y holds n values.
        // Kernel: `fill_uniform_<T>(T* y, u64 n, u64 seed, float scale, float offset)`.
        unsafe {
            launch!(self, MISC, format!("fill_uniform_{}", T::NAME), ew_cfg(n), [ptr_mut(y), n64, seed, scale, offset])
        }
    }
}

/// Most rows the model path sends to [`CudaKernels::gemv`] (the kernel handles up to 8). It
/// re-reads the x rows per weight vector from L1: cheaper than a cuBLAS call at a few rows,
/// slower at 8 (measured on an H200, docs/benchmarks.md). 4 covers the verify forward of
/// speculative decoding with K ≤ 3, so that its rows are computed exactly as a 1-row decode
/// step computes them (same kernel, same accumulation order per output).
pub const GEMV_MAX_ROWS: usize = 4;

/// Warps per output column of [`CudaKernels::gemv`] (1, 2 or 4) for `n` columns of `kv`
/// 16-byte chunks on a GPU of `sms` multiprocessors: doubled while the columns' warps fill
/// less than the resident warps (64 an SM at 8 blocks of 8 warps) and every warp keeps at
/// least two chunks a lane. From (n, k) only, never from m: a column's bits do not depend on
/// how many rows share the call.
pub(crate) fn gemv_split(n: usize, kv: usize, sms: usize) -> usize {
    let resident = 64 * sms;
    let mut split = 1;
    while split < 4 && n * split < resident && kv >= 64 * split * 2 {
        split *= 2;
    }
    split
}

impl CudaKernels {
    /// Whether [`CudaKernels::gemv`] takes this shape: `m ≤ GEMV_MAX_ROWS`, `k` a multiple of
    /// the 16-byte vector, and output `O` equal to `A` or f32.
    pub fn gemv_fits<A: CudaFloat, O: CudaFloat>(m: usize, k: usize) -> bool {
        let e = 16 / std::mem::size_of::<A>();
        (1..=8).contains(&m) && k > 0 && k.is_multiple_of(e) && (O::NAME == A::NAME || O::NAME == "f32")
    }

    /// Skinny GEMM `out[m, n] = x[m, k] · w[n, k]ᵀ` for decode (`m ≤ 8`): one launch, f32
    /// accumulation, one rounding to `O`. Much lighter on the host than a cuBLAS call. Takes
    /// [`GemvKind::default_kind`]: the block kernel unless `PORTER_GEMV=preload`.
    ///
    /// `w` must be a weight (nothing the previous kernel on the stream writes): the default
    /// kernel reads it before its programmatic-dependent-launch wait.
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if the shape does not fit ([`CudaKernels::gemv_fits`]), a
    /// buffer is not 16-byte aligned, or on a length mismatch.
    pub fn gemv<A: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: &impl DevicePtr<A>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        self.gemv_as(GemvKind::default_kind(), x, w, out, m, k, n)
    }

    /// [`CudaKernels::gemv`] with the kernel named (A/B timing and tests). Both kernels give
    /// the same bits for the same shape (same split, same per-column summation order).
    ///
    /// # Errors
    /// As [`CudaKernels::gemv`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_as<A: CudaFloat, O: CudaFloat>(
        &self,
        kind: GemvKind,
        x: &impl DevicePtr<A>,
        w: &impl DevicePtr<A>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        if !Self::gemv_fits::<A, O>(m, k) {
            return Err(CudaError::Invalid(format!("gemv: m {m}, k {k} ({} -> {}) does not fit", A::NAME, O::NAME)));
        }
        self.check("x", x, prod(&[m, k])?)?;
        self.check("w", w, prod(&[n, k])?)?;
        self.check("out", out, prod(&[m, n])?)?;
        if n == 0 {
            return Ok(());
        }
        let mm = [1usize, 2, 4, 8].into_iter().find(|&v| v >= m).unwrap_or(8);
        let s = &*self.stream;
        let (px, _gx) = x.device_ptr(s);
        let (pw, _gw) = w.device_ptr(s);
        if (px | pw) & 15 != 0 {
            return Err(CudaError::Invalid("gemv: x and w must be 16-byte aligned".into()));
        }
        let (m32, k32, n32) = (u32_of("m", m)?, u32_of("k", k)?, u32_of("n", n)?);
        let kv = k / (16 / std::mem::size_of::<A>());
        let split = gemv_split(n, kv, self.caps().sms);
        let split32 = split as u32;
        let (name, cols) = match kind {
            GemvKind::Block => (format!("gemv_{}_{}_m{mm}", A::NAME, O::NAME), 8 / split),
            GemvKind::Preload => (format!("gemvw_{}_{}_m{mm}_g{}", A::NAME, O::NAME, gemvw_batch(kv)), 8),
        };
        let cfg = LaunchConfig {
            grid_dim: (u32_of("blocks", n.div_ceil(cols))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches gemv_<A>_<O>_m<mm> (8 / split columns a block) or
        // gemvw_<A>_<O>_m<mm>_g<G> (8 columns a block); sizes and alignment checked;
        // m <= mm; split is 1, 2 or 4.
        // Kernels: `gemv_<A>_<O>_m<mm>` / `gemvw_<A>_<O>_m<mm>_g<G>(const A* x, const A* w, O* out,
        // u32 m, u32 k, u32 n, u32 split)`.
        unsafe { launch!(self, MISC, name, cfg, [px, pw, ptr_mut(out), m32, k32, n32, split32]) }
    }
}

/// Which decode GEMV kernel [`CudaKernels::gemv`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvKind {
    /// `gemv_*` (misc.cu, the default): `split` warps a column, 4 chunks a lane in flight,
    /// loads after the PDL wait.
    Block,
    /// `gemvw_*` (gemv_pdl.cu; `PORTER_GEMV=preload`): one warp a column, 8 or 16 chunks a lane
    /// in flight, the first batch loaded before the PDL wait. Same bits as `Block`. Measured
    /// slower on the H200 (session 13): the 24-layer decode at batch 1 485.0 tok/s with
    /// `Block` against 468.5, and 1.4–2.7× slower at m = 8 (138 registers, fewer blocks an SM).
    Preload,
}

impl GemvKind {
    /// `Preload` with `PORTER_GEMV=preload` in the environment (read once), else `Block`
    /// (another value warns once).
    pub fn default_kind() -> Self {
        static KIND: std::sync::OnceLock<GemvKind> = std::sync::OnceLock::new();
        *KIND.get_or_init(|| match std::env::var("PORTER_GEMV").as_deref().map(str::trim) {
            Ok("preload") => GemvKind::Preload,
            Ok("block" | "") | Err(_) => GemvKind::Block,
            Ok(other) => {
                eprintln!("warning: PORTER_GEMV={other:?} is not block or preload; using block");
                GemvKind::Block
            }
        })
    }
}

/// Chunks a lane of `gemvw_*` keeps in flight (its `G`) for rows of `kv` 16-byte chunks: 16
/// once a row has 16 a lane (k ≥ 4096 in bf16: the whole row in one batch, 2 blocks an SM), else 8
/// (4 blocks an SM).
pub(crate) fn gemvw_batch(kv: usize) -> usize {
    if kv >= 32 * 16 {
        16
    } else {
        8
    }
}

/// Whether the one-row norms (`rms_norm`, `add_rms_norm`) read their weights (and prefetch
/// the residual) before the PDL wait: yes unless `PORTER_NORM_PRELOAD=off` (read once). The
/// kernels take it as bit 1 of their `zc` argument (set = off; [`norm_flags`]).
pub(crate) fn norm_preload() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let v = std::env::var("PORTER_NORM_PRELOAD").unwrap_or_default();
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "on" | "1" | "true" | "yes" => true,
            "off" | "0" | "false" | "no" => false,
            _ => {
                eprintln!("warning: PORTER_NORM_PRELOAD={v:?} is not on or off; using on");
                true
            }
        }
    })
}

/// The `zc` argument of the one-row norm kernels (norm.cu, misc.cu): bit 0 zero-centred, bit 1
/// no weight preload before the PDL wait.
pub(crate) fn norm_flags(kind: super::RmsNormKind, preload: bool) -> i32 {
    i32::from(kind == super::RmsNormKind::ZeroCentred) | if preload { 0 } else { 2 }
}

/// Rows (warps) per block of `gated_norm_z` (`GNZ_ROWS` in misc.cu).
const GATED_NORM_Z_ROWS: u32 = 8;

/// cuBLAS on the stream of a [`CudaKernels`]: `out = x · wᵀ` with f32 accumulation.
#[derive(Debug)]
pub struct Gemm {
    blas: CudaBlas,
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    /// cuBLAS's workspace, set once: a handle without one allocates it at its first GEMMs,
    /// which is not allowed while a CUDA graph is being captured.
    _workspace: cudarc::driver::CudaSlice<u8>,
}

/// Bytes of the cuBLAS workspace (NVIDIA's recommendation for Hopper).
const CUBLAS_WORKSPACE: usize = 32 << 20;

impl Gemm {
    /// A cuBLAS handle bound to `kernels`' stream.
    ///
    /// # Errors
    /// [`CudaError::Unavailable`] without libcublas.
    pub fn new(kernels: &CudaKernels) -> Result<Self> {
        // SAFETY: only tries to dlopen libcublas under its known names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::Unavailable("no libcublas (put the CUDA 13 libraries on LD_LIBRARY_PATH)".into()));
        }
        let blas = CudaBlas::new(kernels.stream().clone())
            .map_err(|e| CudaError::Unavailable(format!("cuBLAS handle: {e:?}")))?;
        let mut ws = kernels.stream().alloc_zeros::<u8>(CUBLAS_WORKSPACE)?;
        {
            let (p, _g) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut ws, kernels.stream());
            // SAFETY: a live device allocation of CUBLAS_WORKSPACE bytes on the handle's
            // stream, kept alive as long as the handle (a field of the same struct).
            let st = unsafe { blas_sys::cublasSetWorkspace_v2(*blas.handle(), p as *mut _, CUBLAS_WORKSPACE) };
            if st != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(CudaError::Unavailable(format!("cublasSetWorkspace: {st:?}")));
            }
        }
        Ok(Self { blas, stream: kernels.stream().clone(), _workspace: ws })
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` (row-major), inputs of type `A`, output of type `O`
    /// (e.g. bf16 → f32 logits), f32 accumulation and f32 scaling (no TF32 for f32).
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a size mismatch or a dimension above `i32::MAX`.
    pub fn matmul_t<A: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: &impl DevicePtr<A>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        if x.len() != m * k || w.len() != n * k || out.len() != m * n {
            return Err(CudaError::Invalid(format!(
                "gemm: x {} / w {} / out {} elements do not fit m={m} k={k} n={n}",
                x.len(),
                w.len(),
                out.len()
            )));
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let int = |v: usize| i32::try_from(v).map_err(|_| CudaError::Invalid(format!("gemm dimension {v} > i32::MAX")));
        let (mi, ki, ni) = (int(m)?, int(k)?, int(n)?);
        let stream = &*self.stream;
        let (px, _gx) = x.device_ptr(stream);
        let (pw, _gw) = w.device_ptr(stream);
        let (po, _go) = out.device_ptr_mut(stream);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Column-major view: outᵀ[n, m] = W[n, k] · xᵀ[k, m]; W row-major [n, k] is a
        // column-major [k, n] matrix (op T), x row-major [m, k] a column-major [k, m] one.
        // SAFETY: pointers are live device allocations of the checked sizes on the handle's
        // stream; types and compute type form a combination cuBLAS supports.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                ni,
                mi,
                ki,
                (&alpha) as *const f32 as *const _,
                pw as *const _,
                cuda_type::<A>(),
                ki,
                px as *const _,
                cuda_type::<A>(),
                ki,
                (&beta) as *const f32 as *const _,
                po as *mut _,
                cuda_type::<O>(),
                ni,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::Invalid(format!("cublasGemmEx: {e:?}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::gemv_split;

    /// The 80B decode shapes on an H200 (132 SMs): the wide projections keep one warp a
    /// column, out_proj [2048, 4096] and the MoE input [1544, 2048] take four, a short k never
    /// goes below two chunks a lane.
    #[test]
    fn gemv_split_by_shape() {
        let kv = |k: usize| k / 8; // bf16: 8 a chunk
        assert_eq!(gemv_split(12352, kv(2048), 132), 1);
        assert_eq!(super::gemvw_batch(kv(2048)), 8);
        assert_eq!(super::gemvw_batch(kv(4096)), 16);
        assert_eq!(gemv_split(151_936, kv(2048), 132), 1);
        assert_eq!(gemv_split(2048, kv(4096), 132), 4);
        assert_eq!(gemv_split(1544, kv(2048), 132), 4);
        assert_eq!(gemv_split(2048, kv(512), 132), 1);
        assert_eq!(gemv_split(64, kv(64), 132), 1);
    }
}
