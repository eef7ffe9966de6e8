//! Launch wrappers of kernels/cuda/fp8.cu: FP8 (e4m3fn, 128 × 128 block scales) weights read
//! directly by the decode GEMV and the MoE decode GEMVs, dequantized for the prefill GEMMs, and
//! block-quantized on the device (random benchmark weights).
//!
//! A weight `W[r, c] = round_T(e4m3(q[r, c]) · scales[row_scale[r], c / 128])` (`round_T` the
//! compute dtype's rounding): the dequantization of the CPU backend (`crate::cpu::fp8`).

use super::moe::{align256, vec_ok, ALIGN_THREADS, DOWN_NR, FUSED_GROUPING_BYTES, GEMV_WARPS, MOE_MAX_E};
use super::{grid_for, prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, FP8};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

/// Side of a scale block (rows and columns).
pub const FP8_BLOCK: usize = 128;

/// A device FP8 weight `[rows, cols]` (any leading dimensions flattened into the rows).
///
/// # Shapes
/// - `q`: `[rows, cols]` e4m3fn bytes
/// - `scales`: `[scale_rows, ceil(cols/128)]` f32, multiplied
/// - `row_scale`: `[rows]` u32, the scale row of every weight row (`r / 128` for one checkpoint
///   tensor); its values must be `< scale_rows` (trusted: checked when the weight is made)
#[derive(Clone, Copy, Debug)]
pub struct Fp8Dev<'a> {
    /// The e4m3fn bytes.
    pub q: &'a CudaSlice<u8>,
    /// The block scales.
    pub scales: &'a CudaSlice<f32>,
    /// The scale row of each weight row.
    pub row_scale: &'a CudaSlice<u32>,
    /// Weight rows.
    pub rows: usize,
    /// Row length (input features).
    pub cols: usize,
}

impl Fp8Dev<'_> {
    /// Checks the buffers against `rows × cols` (and `rows` against `want_rows`).
    pub(super) fn check(&self, k: &CudaKernels, what: &str, want_rows: usize, want_cols: usize) -> Result<()> {
        if self.rows != want_rows || self.cols != want_cols {
            return Err(CudaError::Invalid(format!(
                "{what}: fp8 weight [{}, {}], expected [{want_rows}, {want_cols}]",
                self.rows, self.cols
            )));
        }
        k.check(what, self.q, prod(&[self.rows, self.cols])?)?;
        k.check(what, self.row_scale, self.rows)?;
        let sc = self.cols.div_ceil(FP8_BLOCK);
        let n = self.scales.len();
        if sc == 0 || n == 0 || !n.is_multiple_of(sc) {
            return Err(CudaError::Invalid(format!("{what}: {n} fp8 scales for rows of {} columns", self.cols)));
        }
        k.check(what, self.scales, n)
    }
}

impl CudaKernels {
    /// Whether [`CudaKernels::fp8_gemv`] takes this shape: `1 ≤ m ≤ 8`, `k` a multiple of 16,
    /// output `O` equal to `A` or f32.
    pub fn fp8_gemv_fits<A: CudaFloat, O: CudaFloat>(m: usize, k: usize) -> bool {
        (1..=8).contains(&m) && k > 0 && k.is_multiple_of(16) && (O::NAME == A::NAME || O::NAME == "f32")
    }

    /// Skinny GEMM `out[m, n] = x[m, k] · W[n, k]ᵀ` with an FP8 weight (`m ≤ 8`): a warp per
    /// weight row (two from 2 rows of `x` on, sharing each converted `x` chunk), 16-byte loads
    /// of e4m3 bytes dequantized in registers, f32 accumulation in an order that does not
    /// depend on `m` (row-invariant), one rounding to `O`.
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if the shape does not fit ([`CudaKernels::fp8_gemv_fits`]), a
    /// buffer is not 16-byte aligned, or on a length mismatch.
    pub fn fp8_gemv<A: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
    ) -> Result<()> {
        let (k, n) = (w.cols, w.rows);
        if !Self::fp8_gemv_fits::<A, O>(m, k) {
            return Err(CudaError::Invalid(format!(
                "fp8_gemv: m {m}, k {k} ({} -> {}) does not fit",
                A::NAME,
                O::NAME
            )));
        }
        w.check(self, "w", n, k)?;
        self.check("x", x, prod(&[m, k])?)?;
        self.check("out", out, prod(&[m, n])?)?;
        if n == 0 {
            return Ok(());
        }
        let mm = [1usize, 2, 4, 8].into_iter().find(|&v| v >= m).unwrap_or(8);
        let s = &*self.stream;
        let (px, _gx) = x.device_ptr(s);
        let (pq, _gq) = w.q.device_ptr(s);
        if (px | pq) & 15 != 0 {
            return Err(CudaError::Invalid("fp8_gemv: x and w must be 16-byte aligned".into()));
        }
        let (m32, k32, n32) = (u32_of("m", m)?, u32_of("k", k)?, u32_of("n", n)?);
        let cfg = LaunchConfig {
            // 8 warps a block, FP8_GEMV_NR(mm) weight rows a warp (2 from 2 rows of x on).
            grid_dim: (u32_of("blocks", n.div_ceil(if mm >= 2 { 16 } else { 8 }))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches fp8_gemv_<A>_<O>_m<mm>; sizes and alignment checked; m <= mm; the
        // scale rows named by row_scale exist (Fp8Dev's contract).
        // Kernel: `fp8_gemv_<A>_<O>_m<mm>(const u8* w, const float* sc, const u32* rs, const A* x, O* out,
        // u32 m, u32 k, u32 n)`.
        unsafe {
            launch!(
                self,
                FP8,
                format!("fp8_gemv_{}_{}_m{mm}", A::NAME, O::NAME),
                cfg,
                [pq, ptr(w.scales), ptr(w.row_scale), px, ptr_mut(out), m32, k32, n32]
            )
        }
    }

    /// Dequantizes an FP8 weight into `out` (`[rows, cols]` of `T`, values rounded to `T`):
    /// the input of the cuBLAS prefill GEMMs.
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch or a dimension beyond `u32`.
    pub fn fp8_dequant<T: CudaFloat>(&self, w: Fp8Dev<'_>, out: &mut impl DevicePtrMut<T>) -> Result<()> {
        w.check(self, "w", w.rows, w.cols)?;
        let n = prod(&[w.rows, w.cols])?;
        self.check("out", out, n)?;
        if n == 0 {
            return Ok(());
        }
        let vec = w.cols.is_multiple_of(16);
        let vec32 = i32::from(vec);
        let (r32, c32) = (u32_of("rows", w.rows)?, u32_of("cols", w.cols)?);
        let items = if vec { n / 16 } else { n };
        let cfg = LaunchConfig { grid_dim: (grid_for(items, 256), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches fp8_dequant_<T>; q and out hold rows·cols elements; 16-byte loads only
        // with vec (cols % 16 == 0, allocations 256-byte aligned).
        // Kernel: `fp8_dequant_<T>(const u8* q, const float* sc, const u32* rs, T* out, u32 rows, u32 cols,
        // int vec)`.
        unsafe {
            launch!(
                self,
                FP8,
                format!("fp8_dequant_{}", T::NAME),
                cfg,
                [ptr(w.q), ptr(w.scales), ptr(w.row_scale), ptr_mut(out), r32, c32, vec32]
            )
        }
    }

    /// Block-quantizes `w` (`[rows, cols]` of `T`) into e4m3 bytes `q` and scales
    /// `[ceil(rows/128), ceil(cols/128)]`: per block `scale = amax / 448` (1 for an all-zero
    /// block), `q = e4m3(w / scale)` rounded to nearest even and saturated, the CPU's
    /// `quantize_blocks` bit for bit.
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch or a dimension beyond `u32`.
    pub fn fp8_quantize<T: CudaFloat>(
        &self,
        w: &impl DevicePtr<T>,
        q: &mut impl DevicePtrMut<u8>,
        scales: &mut impl DevicePtrMut<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let n = prod(&[rows, cols])?;
        self.check("w", w, n)?;
        self.check("q", q, n)?;
        let (sr, sc) = (rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK));
        self.check("scales", scales, prod(&[sr, sc])?)?;
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of("column blocks", sc)?, u32_of("row blocks", sr)?, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (r32, c32) = (u32_of("rows", rows)?, u32_of("cols", cols)?);
        // SAFETY: matches fp8_quantize_<T>; w and q hold rows·cols elements, scales sr·sc; a
        // block per 128 × 128 block of the grid shape above.
        // Kernel: `fp8_quantize_<T>(const T* w, u8* q, float* scales, u32 rows, u32 cols)`.
        unsafe {
            launch!(
                self,
                FP8,
                format!("fp8_quantize_{}", T::NAME),
                cfg,
                [ptr(w), ptr_mut(q), ptr_mut(scales), r32, c32]
            )
        }
    }

    /// [`CudaKernels::moe_experts`]'s decode (GEMV) path with FP8 experts: the same grouping,
    /// per-pair arithmetic order and combine, the weights read as e4m3 bytes and dequantized
    /// in registers. Each (row, expert) pair is computed by one warp in a fixed order whatever
    /// `t` is (batch-invariant), so it also serves as the FP8 `moe_experts_invariant`.
    ///
    /// # Shapes
    /// - `x`: `[t, hidden]` (`T`); `idx`, `w`: `[t, k]` from `moe_router`
    /// - `gate`, `up`: FP8 `[e·inter, hidden]`; `down`: FP8 `[e·hidden, inter]`
    /// - `out`: `[t, hidden]` (`f32`), overwritten
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_fp8<T: CudaFloat>(
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
        let [t, k, e, hidden, inter] = dims;
        if k == 0 || k > e || e > MOE_MAX_E || hidden == 0 || inter == 0 {
            return Err(CudaError::Invalid(format!(
                "moe_experts_fp8: need 1 <= k <= e <= {MOE_MAX_E}, hidden > 0, inter > 0; got k = {k}, e = {e}, \
                 hidden = {hidden}, inter = {inter}"
            )));
        }
        self.check("x", x, prod(&[t, hidden])?)?;
        self.check("idx", idx, prod(&[t, k])?)?;
        self.check("w", w, prod(&[t, k])?)?;
        gate.check(self, "gate", prod(&[e, inter])?, hidden)?;
        up.check(self, "up", prod(&[e, inter])?, hidden)?;
        down.check(self, "down", prod(&[e, hidden])?, inter)?;
        self.check("out", out, prod(&[t, hidden])?)?;
        if t == 0 {
            return Ok(());
        }
        let n = prod(&[t, k])?;
        let slots = e.min(n);
        let nq = hidden.div_ceil(DOWN_NR);
        let esize = std::mem::size_of::<T>();
        let dsm = prod(&[e + n + 3 * slots, 4])?;
        let fused = dsm <= FUSED_GROUPING_BYTES;
        // Scratch as moe.rs's decode path: sorted [n], tile_expert [n], seg [3·slots], meta [2],
        // ctr [nq] (u32); h [n, inter] (T); o [n, hidden] (T).
        let off_tile = align256(n * 4);
        let off_seg = off_tile + align256(n * 4);
        let off_meta = off_seg + align256(slots * 3 * 4);
        let off_ctr = off_meta + 256;
        let off_h = off_ctr + align256(nq * 4);
        let off_o = off_h + align256(prod(&[n, inter, esize])?);
        let bytes = off_o + align256(prod(&[n, hidden, esize])?);
        let (n32, e32, k32, t32) = (u32_of("t·k", n)?, u32_of("e", e)?, u32_of("k", k)?, u32_of("t", t)?);
        let (h32, i32_, nq32) = (u32_of("hidden", hidden)?, u32_of("inter", inter)?, u32_of("column groups", nq)?);
        let fused32 = i32::from(fused);
        let dsm32 = if fused { u32_of("shared memory", dsm)? } else { 0 };
        let grid_gu = self.moe_persistent_grid(prod(&[slots, inter])?)?;
        let grid_down = self.moe_persistent_grid(prod(&[slots, nq])?)?;

        let s = &self.stream;
        // SAFETY: uninitialised scratch, written before it is read (as in moe.rs's decode).
        let mut scratch = unsafe { s.alloc::<u8>(bytes) }?;
        let (px, _gx) = x.device_ptr(s);
        let (pi, _gi) = idx.device_ptr(s);
        let (pw, _gw) = w.device_ptr(s);
        let (pg, _gg) = gate.q.device_ptr(s);
        let (pgs, _ggs) = gate.scales.device_ptr(s);
        let (pgr, _ggr) = gate.row_scale.device_ptr(s);
        let (pu, _gu) = up.q.device_ptr(s);
        let (pus, _gus) = up.scales.device_ptr(s);
        let (pur, _gur) = up.row_scale.device_ptr(s);
        let (pd, _gd) = down.q.device_ptr(s);
        let (pds, _gds) = down.scales.device_ptr(s);
        let (pdr, _gdr) = down.row_scale.device_ptr(s);
        let (po, _go) = out.device_ptr_mut(s);
        let (base, _gs) = scratch.device_ptr_mut(s);
        let (p_sorted, p_tile, p_seg) = (base, base + off_tile as u64, base + off_seg as u64);
        let (p_meta, p_ctr) = (base + off_meta as u64, base + off_ctr as u64);
        let (p_h, p_o) = (base + off_h as u64, base + off_o as u64);
        if !fused {
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (ALIGN_THREADS, 1, 1),
                shared_mem_bytes: u32_of("shared memory", e * 4)?,
            };
            let one = 1u32;
            // SAFETY: as moe.rs's decode path (pad 1; lists of n, 3·min(e, n), 2 entries).
            // Kernel: `moe_align(const u32* idx, u32 n, u32 e, u32 pad, u32 cap, u32 tiles_cap, u32* sorted,
            // u32* tile_expert, u32* seg, u32* meta)`.
            unsafe {
                launch!(self, FP8, "moe_align", cfg, [pi, n32, e32, one, n32, n32, p_sorted, p_tile, p_seg, p_meta])
            }?;
        }
        let gemv_cfg = |blocks: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (GEMV_WARPS as u32 * 32, 1, 1),
            shared_mem_bytes: dsm32,
        };
        let vec_gu = i32::from(
            vec_ok::<T>(px, hidden)
                && hidden.is_multiple_of(16)
                && vec_ok::<u8>(pg, hidden)
                && vec_ok::<u8>(pu, hidden),
        );
        // SAFETY: arguments match `moe_dec_gu_fp8_<T>`; lengths checked; scale rows named by
        // row_scale exist (Fp8Dev's contract); otherwise as moe.rs's `moe_dec_gu_<T>`.
        // Kernel: `moe_dec_gu_fp8_<T>(const T* x, const u8* gate, const float* gs, const u32* grs, const u8* up,
        // const float* us, const u32* urs, const u32* idx, u32 n, u32 e, int fused, const u32* g_sorted,
        // const u32* g_seg, const u32* g_meta, u32* ctr, u32 nctr, T* h, u32 H, u32 I, u32 k, int vec)`.
        unsafe {
            launch!(
                self,
                FP8,
                format!("moe_dec_gu_fp8_{}", T::NAME),
                gemv_cfg(grid_gu),
                [
                    px, pg, pgs, pgr, pu, pus, pur, pi, n32, e32, fused32, p_sorted, p_seg, p_meta, p_ctr, nq32, p_h,
                    h32, i32_, k32, vec_gu
                ]
            )
        }?;
        let vec_d = i32::from(vec_ok::<u8>(pd, inter) && inter.is_multiple_of(16) && vec_ok::<T>(p_h, inter));
        // SAFETY: arguments match `moe_dec_down_fp8_<T>`; as moe.rs's `moe_dec_down_<T>`.
        // Kernel: `moe_dec_down_fp8_<T>(const T* h, const u8* down, const float* ds, const u32* drs,
        // const u32* idx, const float* wt, u32 n, u32 e, int fused, const u32* g_sorted, const u32* g_seg,
        // const u32* g_meta, u32* ctr, T* o, float* out, u32 H, u32 I, u32 k, u32 t, int vec)`.
        unsafe {
            launch!(
                self,
                FP8,
                format!("moe_dec_down_fp8_{}", T::NAME),
                gemv_cfg(grid_down),
                [
                    p_h, pd, pds, pdr, pi, pw, n32, e32, fused32, p_sorted, p_seg, p_meta, p_ctr, p_o, po, h32, i32_,
                    k32, t32, vec_d
                ]
            )
        }
    }
}
