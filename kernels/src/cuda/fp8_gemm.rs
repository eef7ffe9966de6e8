//! Launch wrappers of kernels/cuda/fp8_gemm.cu: the FP8 prefill GEMMs.
//!
//! - **Tile dequantization** ([`CudaKernels::fp8_gemm_tc`], [`CudaKernels::moe_experts_fp8_prefill`]):
//!   moe.cu's cp.async + wmma tensor-core GEMM with the weight tiles staged as e4m3 bytes and
//!   dequantized in shared memory (`W = round_T(e4m3 · scale)`, as [`CudaKernels::fp8_dequant`]),
//!   so no dequantized copy of the weight is ever written. Weights-only: the result is the
//!   dense GEMM on the dequantized weight up to f32 summation order.
//! - **e4m3 MMA** ([`CudaKernels::fp8_act_quant`], [`CudaKernels::fp8_gemm_mma8`]): activations
//!   quantized per token and per 128 columns, `mma.sync` on e4m3 × e4m3 with f32 accumulation
//!   per 128-column block, scaled by both block scales (sm_89+).

use super::moe::MOE_MAX_E;
use super::moe_prefill::{mma8_moe_stages, tc_smem, ExpertWeights};
use super::{prod, u32_of, CudaError, CudaFloat, CudaKernels, Fp8Dev, Result, FP8};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Threads of the tile-dequantizing GEMMs (moe.cu's `MOE_TC_THREADS`).
const TC_THREADS: u32 = 128;
/// Output columns per block of the dense tile-dequantizing GEMM (`MOE_TC_BN`).
const TC_BN: usize = 256;
/// Columns of a k-step of the tile-dequantizing GEMM (`MOE_TC_BK`).
const TC_BK: usize = 32;
/// Split-K: the dense tile-dequantizing GEMM is split along k until it has this many blocks
/// per SM (2 are resident at MI = 4), each split at least [`SPLIT_MIN_KSTEPS`] k-steps, at most
/// [`SPLIT_MAX`] splits.
const SPLIT_BLOCKS_PER_SM: usize = 2;
/// See [`SPLIT_BLOCKS_PER_SM`].
const SPLIT_MIN_KSTEPS: usize = 8;
/// See [`SPLIT_BLOCKS_PER_SM`].
const SPLIT_MAX: usize = 16;
/// Rows and columns of an e4m3 MMA block tile (`FP8_MMA_BM`, `FP8_MMA_BN`).
const MMA_TILE: usize = 128;
/// Threads of the e4m3 MMA GEMM (`FP8_MMA_THREADS`).
const MMA_THREADS: u32 = 512;
/// Shared memory of one cp.async stage of the e4m3 MMA GEMM: the 128 × 128-byte A and W tiles
/// and their 256 f32 scales.
const MMA_STAGE: usize = (128 + 128) * 132;

impl CudaKernels {
    /// Whether [`CudaKernels::fp8_gemm_tc`] takes this shape on this device: `A` bf16 / f16,
    /// `O` equal to `A` or f32, `k` a multiple of 16, `n` of 8, tensor cores (sm_80+, not
    /// forced to the fallback) and the stages within the shared-memory limit.
    pub fn fp8_gemm_tc_fits<A: CudaFloat, O: CudaFloat>(&self, k: usize, n: usize) -> bool {
        A::NAME != "f32"
            && (O::NAME == A::NAME || O::NAME == "f32")
            && k > 0
            && k.is_multiple_of(16)
            && n.is_multiple_of(8)
            && self.caps().tensor_cores()
            && tc_smem(1, std::mem::size_of::<A>(), true, TC_BN) <= self.caps().smem_limit()
    }

    /// `out[m, n] = x[m, k] · W[n, k]ᵀ` with an FP8 weight on tensor cores: tiles of
    /// `16·MI` rows (`MI` = 1..4, the fewest that cover `m` up to 64) × 256 weight rows, the
    /// weight's e4m3 bytes staged with cp.async and dequantized in shared memory to `A`
    /// (`round_A(e4m3 · scale)`, the weights of [`CudaKernels::fp8_dequant`]), f32
    /// accumulation (wmma), one rounding to `O`. Few tiles (small `m`) are split along `k`
    /// into f32 partials summed in a fixed order ([`CudaKernels::fp8_gemm_tc_splits`]).
    ///
    /// # Shapes
    /// - `x`: `[m, k]` (`A`), `w`: FP8 `[n, k]`, `out`: `[m, n]` (`O`), overwritten
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if the shape does not fit ([`CudaKernels::fp8_gemm_tc_fits`]),
    /// a buffer is not 16-byte aligned, or on a length mismatch; driver errors.
    pub fn fp8_gemm_tc<A: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
    ) -> Result<()> {
        self.fp8_gemm_tc_split(x, w, out, m, None)
    }

    /// The split-K factor [`CudaKernels::fp8_gemm_tc`] uses for `m` rows of `[n, k]`: 1 when
    /// the tiles alone give `SPLIT_BLOCKS_PER_SM` blocks per SM, else enough splits for
    /// that, each of at least 8 k-steps (256 columns), at most 16.
    ///
    /// # Errors
    /// [`CudaError::Driver`] if the SM count cannot be read.
    pub fn fp8_gemm_tc_splits(&self, m: usize, k: usize, n: usize) -> Result<usize> {
        let target = SPLIT_BLOCKS_PER_SM * self.caps().sms;
        let blocks = (m.div_ceil(16 * m.div_ceil(16).clamp(1, 4)) * n.div_ceil(TC_BN)).max(1);
        let nk = k.div_ceil(TC_BK);
        Ok(if blocks >= target { 1 } else { target.div_ceil(blocks).min(nk / SPLIT_MIN_KSTEPS).clamp(1, SPLIT_MAX) })
    }

    /// [`CudaKernels::fp8_gemm_tc`] with `splits` k-splits (`None`: its choice,
    /// [`CudaKernels::fp8_gemm_tc_splits`]); more than 1: each split's f32 partial into a
    /// stream-ordered workspace `[splits, m, n]`, then their sum in split order, rounded once.
    ///
    /// # Shapes
    /// As [`CudaKernels::fp8_gemm_tc`].
    ///
    /// # Errors
    /// As [`CudaKernels::fp8_gemm_tc`]; [`CudaError::Invalid`] for 0 splits.
    pub fn fp8_gemm_tc_split<A: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
        splits: Option<usize>,
    ) -> Result<()> {
        let (k, n) = (w.cols, w.rows);
        if !self.fp8_gemm_tc_fits::<A, O>(k, n) {
            return Err(CudaError::Invalid(format!(
                "fp8_gemm_tc: k {k}, n {n} ({} -> {}) does not fit on {}",
                A::NAME,
                O::NAME,
                self.arch()
            )));
        }
        w.check(self, "w", n, k)?;
        self.check("x", x, prod(&[m, k])?)?;
        self.check("out", out, prod(&[m, n])?)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let esize = std::mem::size_of::<A>();
        let mut mi = m.div_ceil(16).clamp(1, 4);
        while mi > 1 && tc_smem(mi, esize, true, TC_BN) > self.caps().smem_limit() {
            mi -= 1;
        }
        let smem = tc_smem(mi, esize, true, TC_BN);
        let s = &*self.stream;
        let (px, _gx) = x.device_ptr(s);
        let (pq, _gq) = w.q.device_ptr(s);
        let (po, _go) = out.device_ptr_mut(s);
        if (px | pq | po) & 15 != 0 {
            return Err(CudaError::Invalid("fp8_gemm_tc: x, w and out must be 16-byte aligned".into()));
        }
        let nblk = n.div_ceil(TC_BN);
        let tiles = m.div_ceil(16 * mi);
        let nk = k.div_ceil(TC_BK);
        let splits = match splits {
            Some(0) => return Err(CudaError::Invalid("fp8_gemm_tc: 0 k-splits".into())),
            Some(v) => v.min(nk),
            None => self.fp8_gemm_tc_splits(m, k, n)?,
        };
        let ksteps = nk.div_ceil(splits);
        let splits = nk.div_ceil(ksteps);
        let oname = if splits > 1 { "f32" } else { O::NAME };
        let f = self.function_smem(&FP8, &format!("fp8_gemm_tc{mi}_{}_{oname}", A::NAME), smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("blocks", prod(&[tiles, nblk])?)?, u32_of("k-splits", splits)?, 1),
            block_dim: (TC_THREADS, 1, 1),
            shared_mem_bytes: u32_of("shared memory", smem)?,
        };
        let (k32, n32, m32, nblk32) = (u32_of("k", k)?, u32_of("n", n)?, u32_of("m", m)?, u32_of("blocks", nblk)?);
        let ks32 = u32_of("k-steps", ksteps)?;
        let total = prod(&[m, n])?;
        // Split partials [splits, m, n] f32 (written in full: every split covers every row
        // and column of out); none without a split.
        let mut ws = if splits > 1 {
            // SAFETY: uninitialised workspace, written in full by the GEMM before the sum reads it.
            Some(unsafe { self.stream.alloc::<f32>(prod(&[splits, total])?) }?)
        } else {
            None
        };
        let ws_ptr = ws.as_mut().map(|b| b.device_ptr_mut(s));
        let pws = ws_ptr.as_ref().map_or(0, |p| p.0);
        let dst = if splits > 1 { pws } else { po };
        // SAFETY: matches fp8_gemm_tc<mi>_<A>_<O or f32>; x holds m·k, q n·k elements, dst
        // m·n of O (out) or splits·m·n f32 (the workspace; split y writes its m·n at y·m·n);
        // rows past m / n are neither read nor written; 16-byte aligned buffers with k % 16 == 0
        // and n % 8 == 0 (fits; the workspace is 256-byte aligned and m·n·4 a multiple of 32);
        // the scale rows named by row_scale exist (Fp8Dev's contract); dynamic shared memory as
        // the kernel needs for mi (allowed above).
        // Kernel: `fp8_gemm_tc<MI>_<A>_<O>(const A* x, const u8* q, const float* sc, const u32* rs, O* out,
        // u32 K, u32 N, u32 m, u32 nblk, u32 ksteps)`.
        unsafe {
            launch_fn!(self, f, cfg, [px, pq, ptr(w.scales), ptr(w.row_scale), dst, k32, n32, m32, nblk32, ks32])
        }?;
        if splits == 1 {
            return Ok(());
        }
        let (sp32, total64) = (u32_of("k-splits", splits)?, total as u64);
        // SAFETY: matches fp8_splitk_reduce_<O>; the workspace holds splits·total f32, out total O.
        // Kernel: `fp8_splitk_reduce_<O>(const float* ws, O* out, u32 splits, u64 total)`.
        unsafe {
            launch!(self, FP8, format!("fp8_splitk_reduce_{}", O::NAME), super::ew_cfg(total), [pws, po, sp32, total64])
        }
    }

    /// Whether the e4m3 MMA path ([`CudaKernels::fp8_gemm_mma8`]) runs on this device for
    /// rows of `k`: sm_89+ (e4m3 `mma.sync`), not forced to the fallback, 99 KiB of shared
    /// memory a block (3 stages), `k` a multiple of 16.
    pub fn fp8_mma8_fits(&self, k: usize) -> bool {
        let c = self.caps();
        (c.major, c.minor) >= (8, 9) && !c.forced && 3 * MMA_STAGE <= c.smem_limit() && k > 0 && k.is_multiple_of(16)
    }

    /// Quantizes activations per token and per 128 columns for the e4m3 MMA path: per group
    /// `scale = amax / 448` (1 for an all-zero group), `q = e4m3(x / scale)` rounded to nearest
    /// even and saturated (the CPU's `quantize_blocks` on 1 × 128 blocks, bit for bit).
    ///
    /// # Shapes
    /// - `x`: `[m, k]` (`T`, bf16 or f16); `q`: `[m, k]`; `scales`: `[m, ceil(k/128)]`
    ///
    /// # Errors
    /// [`CudaError::Invalid`] for f32 or on a length mismatch; driver errors.
    pub fn fp8_act_quant<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        q: &mut impl DevicePtrMut<u8>,
        scales: &mut impl DevicePtrMut<f32>,
        m: usize,
        k: usize,
    ) -> Result<()> {
        if T::NAME == "f32" {
            return Err(CudaError::Invalid("fp8_act_quant: bf16 or f16 activations only".into()));
        }
        let groups = prod(&[m, k.div_ceil(super::FP8_BLOCK)])?;
        self.check("x", x, prod(&[m, k])?)?;
        self.check("q", q, prod(&[m, k])?)?;
        self.check("scales", scales, groups)?;
        if groups == 0 {
            return Ok(());
        }
        let s = &*self.stream;
        let ((px, _gx), (pq, _gq), (ps, _gs)) = (x.device_ptr(s), q.device_ptr_mut(s), scales.device_ptr_mut(s));
        // SAFETY: lengths checked above; the guards live until the launch is queued.
        unsafe { self.fp8_act_quant_raw::<T>(px, pq, ps, m, k) }
    }

    /// [`CudaKernels::fp8_act_quant`] on device addresses (T bf16 / f16, unchecked).
    ///
    /// # Safety
    /// `x` holds `m·k` `T`, `q` `m·k` bytes and `s` `m·⌈k/128⌉` f32, live on this stream.
    pub(super) unsafe fn fp8_act_quant_raw<T: CudaFloat>(
        &self,
        x: u64,
        q: u64,
        s: u64,
        m: usize,
        k: usize,
    ) -> Result<()> {
        let groups = prod(&[m, k.div_ceil(super::FP8_BLOCK)])?;
        if groups == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of("blocks", groups.div_ceil(8))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (m32, k32) = (u32_of("m", m)?, u32_of("k", k)?);
        // SAFETY: matches fp8_act_quant_<T>; the caller's contract on the buffers; a warp per
        // group, warps past the last exit.
        // Kernel: `fp8_act_quant_<T>(const T* x, u8* q, float* s, u32 m, u32 K)`.
        unsafe { launch!(self, FP8, format!("fp8_act_quant_{}", T::NAME), cfg, [x, q, s, m32, k32]) }
    }

    /// `out[m, n] = Σ_kb a_scales[r, kb] · w_scale[j, kb] · Σ_{c ∈ kb} e4m3(aq[r, c]) ·
    /// e4m3(w.q[j, c])`: e4m3 tensor-core MMA (`mma.sync.m16n8k32`) on activations quantized by
    /// [`CudaKernels::fp8_act_quant`], each 128-column block accumulated in f32 and added
    /// times both block scales; one rounding to `O`. 128 × 128 block tiles, 3 or 4 cp.async
    /// stages (by the shared-memory limit).
    ///
    /// # Shapes
    /// - `aq`: `[m, k]` bytes, `a_scales`: `[m, ceil(k/128)]`; `w`: FP8 `[n, k]`; `out`: `[m, n]`
    ///
    /// # Errors
    /// [`CudaError::Invalid`] unless [`CudaKernels::fp8_mma8_fits`], on a length mismatch or
    /// unaligned bytes; driver errors.
    pub fn fp8_gemm_mma8<O: CudaFloat>(
        &self,
        aq: &impl DevicePtr<u8>,
        a_scales: &impl DevicePtr<f32>,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
    ) -> Result<()> {
        let (k, n) = (w.cols, w.rows);
        if !self.fp8_mma8_fits(k) {
            return Err(CudaError::Invalid(format!("fp8_gemm_mma8: k {k} on {} does not fit", self.arch())));
        }
        w.check(self, "w", n, k)?;
        self.check("aq", aq, prod(&[m, k])?)?;
        self.check("a_scales", a_scales, prod(&[m, k.div_ceil(super::FP8_BLOCK)])?)?;
        self.check("out", out, prod(&[m, n])?)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let stages = if 4 * MMA_STAGE <= self.caps().smem_limit() { 4 } else { 3 };
        let smem = stages * MMA_STAGE;
        let s = &*self.stream;
        let (pa, _ga) = aq.device_ptr(s);
        let (pq, _gq) = w.q.device_ptr(s);
        if (pa | pq) & 15 != 0 {
            return Err(CudaError::Invalid("fp8_gemm_mma8: aq and w must be 16-byte aligned".into()));
        }
        let f = self.function_smem(&FP8, &format!("fp8_gemm_mma8_{}_s{stages}", O::NAME), smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("column blocks", n.div_ceil(MMA_TILE))?, u32_of("row blocks", m.div_ceil(MMA_TILE))?, 1),
            block_dim: (MMA_THREADS, 1, 1),
            shared_mem_bytes: u32_of("shared memory", smem)?,
        };
        let (m32, k32, n32) = (u32_of("m", m)?, u32_of("k", k)?, u32_of("n", n)?);
        // SAFETY: matches fp8_gemm_mma8_<O>_s<stages>; aq holds m·k bytes, a_scales
        // m·ceil(k/128), w n·k bytes, out m·n (checked); rows past m / n are neither read nor
        // written; 16-byte aligned bytes with k % 16 == 0; the scale rows named by row_scale
        // exist (Fp8Dev's contract); stages · 32 KiB of shared memory (allowed above).
        // Kernel: `fp8_gemm_mma8_<O>_s<S>(const u8* aq, const float* as, const u8* wq, const float* ws,
        // const u32* wrs, O* out, u32 m, u32 K, u32 n)`.
        unsafe {
            launch_fn!(
                self,
                f,
                cfg,
                [pa, ptr(a_scales), pq, ptr(w.scales), ptr(w.row_scale), ptr_mut(out), m32, k32, n32]
            )
        }
    }

    /// [`CudaKernels::fp8_act_quant`] into stream-ordered scratch, then
    /// [`CudaKernels::fp8_gemm_mma8`]: `out ≈ x · Wᵀ` with the activations quantized.
    ///
    /// # Shapes
    /// - `x`: `[m, k]` (`A`, bf16 / f16), `w`: FP8 `[n, k]`, `out`: `[m, n]` (`O`)
    ///
    /// # Errors
    /// As the two calls.
    pub fn fp8_gemm_mma8_quant<A: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
    ) -> Result<()> {
        let k = w.cols;
        if !self.fp8_mma8_fits(k) {
            return Err(CudaError::Invalid(format!("fp8_gemm_mma8: k {k} on {} does not fit", self.arch())));
        }
        let (nq, ns) = (prod(&[m, k])?, prod(&[m, k.div_ceil(super::FP8_BLOCK)])?);
        // SAFETY: uninitialised scratch, written in full by fp8_act_quant before the GEMM reads it.
        let mut q = unsafe { self.stream.alloc::<u8>(nq.max(1)) }?;
        // SAFETY: as above.
        let mut sc = unsafe { self.stream.alloc::<f32>(ns.max(1)) }?;
        let (mut qv, mut sv) = (q.slice_mut(0..nq), sc.slice_mut(0..ns));
        self.fp8_act_quant::<A>(x, &mut qv, &mut sv, m, k)?;
        self.fp8_gemm_mma8(&q.slice(0..nq), &sc.slice(0..ns), w, out, m)
    }

    /// [`CudaKernels::moe_experts`]'s prefill path with FP8 experts: the same alignment,
    /// tiles, activation and combine, with moe.cu's tensor-core GEMMs reading the experts'
    /// e4m3 tiles and dequantizing them in shared memory (no dequantized copy of the experts).
    /// Needs [`CudaKernels::moe_prefill_fp8_fits`]; not batch-invariant (use
    /// [`CudaKernels::moe_experts_fp8`] for that, and for decode).
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts_fp8`].
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`]; [`CudaError::Invalid`] if the tensor-core GEMMs do not
    /// take the shape or the buffers are not 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_fp8_prefill<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        self.moe_fp8_grouped(x, idx, w, ExpertWeights::Fp8 { gate, up, down, mma8: false }, out, dims)
    }

    /// Whether [`CudaKernels::moe_experts_fp8_mma8`] runs here: bf16 / f16, e4m3 MMA
    /// ([`CudaKernels::fp8_mma8_fits`] for both dimensions) and 4 stages of 41 KiB of shared memory (H100 / H200).
    pub fn moe_prefill_mma8_fits<T: CudaFloat>(&self, hidden: usize, inter: usize) -> bool {
        self.moe_prefill_fp8_fits::<T>(hidden, inter)
            && self.fp8_mma8_fits(hidden)
            && self.fp8_mma8_fits(inter)
            && mma8_moe_stages(self.caps().smem_limit()).is_some()
    }

    /// [`CudaKernels::moe_experts_fp8_prefill`] with the e4m3 MMA GEMMs: `x` quantized per
    /// token and 128 columns, gate+up (SiLU·up fused, `h` rounded to `T`) on e4m3 MMA, `h`
    /// quantized per row and 128 columns, down on e4m3 MMA, the same combine. Tiles of 64 rows.
    /// Not weights-only (both activations are rounded to e4m3).
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts_fp8`].
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts_fp8_prefill`], and unless
    /// [`CudaKernels::moe_prefill_mma8_fits`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_fp8_mma8<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        self.moe_fp8_grouped(x, idx, w, ExpertWeights::Fp8 { gate, up, down, mma8: true }, out, dims)
    }

    /// Checks, then [`CudaKernels::moe_prefill`] with FP8 `weights`.
    fn moe_fp8_grouped<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        weights: ExpertWeights<'_>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        let ExpertWeights::Fp8 { gate, up, down, mma8 } = weights else {
            return Err(CudaError::Invalid("moe_fp8_grouped: dense weights".into()));
        };
        let [t, k, e, hidden, inter] = dims;
        if k == 0 || k > e || e > MOE_MAX_E || hidden == 0 || inter == 0 {
            return Err(CudaError::Invalid(format!(
                "moe_experts_fp8 prefill: need 1 <= k <= e <= {MOE_MAX_E}, hidden > 0, inter > 0; got k = {k}, \
                 e = {e}, hidden = {hidden}, inter = {inter}"
            )));
        }
        self.check("x", x, prod(&[t, hidden])?)?;
        self.check("idx", idx, prod(&[t, k])?)?;
        self.check("w", w, prod(&[t, k])?)?;
        gate.check(self, "gate", prod(&[e, inter])?, hidden)?;
        up.check(self, "up", prod(&[e, inter])?, hidden)?;
        down.check(self, "down", prod(&[e, hidden])?, inter)?;
        self.check("out", out, prod(&[t, hidden])?)?;
        // The kernels index expert rows in u32.
        u32_of("expert rows", prod(&[e, inter.max(hidden)])?)?;
        if t == 0 {
            return Ok(());
        }
        let fits = if mma8 {
            self.moe_prefill_mma8_fits::<T>(hidden, inter)
        } else {
            self.moe_prefill_fp8_fits::<T>(hidden, inter)
        };
        if !fits {
            return Err(CudaError::Invalid(format!(
                "moe_experts_fp8 prefill ({}): {} hidden {hidden}, inter {inter} does not fit on {}",
                if mma8 { "e4m3 MMA" } else { "tile dequantization" },
                T::NAME,
                self.arch()
            )));
        }
        self.moe_prefill::<T>(x, idx, w, weights, out, dims, &mut |_| Ok(()))
    }
}
