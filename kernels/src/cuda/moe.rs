//! Launch wrappers of kernels/cuda/moe.cu: the routed experts of a sparse MoE
//! block (`porter_core::nn::Moe::forward` after the router), grouped by expert
//! on the device: alignment (counting sort of the (row, slot) pairs by
//! expert), gate+up with the fused SwiGLU activation, down, and the weighted
//! combine. No host loop over experts and no host synchronisation.

use super::moe_prefill::ExpertWeights;
use super::{prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, MOE};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Largest expert count of [`CudaKernels::moe_experts`] (the alignment kernel
/// keeps one `u32` counter per expert in shared memory).
pub const MOE_MAX_E: usize = 8192;

/// Threads of the alignment kernel (`moe_align`, one block).
pub(super) const ALIGN_THREADS: u32 = 1024;
/// Relative speed per executed row of the tensor-core GEMMs by row fragments
/// per warp (`MI` = 1..4: tiles of 16·MI rows; fewer fragments reuse each
/// weight fragment less). Estimates from the shared-memory traffic per FLOP.
const TC_SPEED: [f64; 4] = [0.45, 0.72, 0.9, 1.0];
/// Warps per GEMV block (`MOE_GEMV_WARPS`).
pub(super) const GEMV_WARPS: usize = 8;
/// Down rows per GEMV warp (`MOE_DOWN_NR`).
pub(super) const DOWN_NR: usize = 4;
/// Resident blocks per SM of the persistent decode kernels (their
/// `__launch_bounds__(256, 3)`).
const GEMV_BLOCKS_PER_SM: usize = 3;
/// Largest dynamic shared memory of the decode kernels' in-block grouping
/// (`e + n + 3·min(e, n)` u32); beyond it `moe_align` groups the pairs first.
pub(super) const FUSED_GROUPING_BYTES: usize = 40 * 1024;
/// The decode (GEMV) path is taken up to this many (row, slot) pairs, or up to
/// [`DECODE_PAIRS_PER_EXPERT`] per expert on average, whichever is larger.
const DECODE_MAX_PAIRS: usize = 256;
/// See [`DECODE_MAX_PAIRS`].
const DECODE_PAIRS_PER_EXPERT: usize = 2;

/// Rounds `n` up to a multiple of 256 bytes (scratch sub-buffer alignment).
pub(super) fn align256(n: usize) -> usize {
    n.div_ceil(256) * 256
}

/// Whether `ptr` and rows of `row_elems` elements of `T` allow 16-byte loads.
pub(super) fn vec_ok<T>(ptr: u64, row_elems: usize) -> bool {
    ptr.is_multiple_of(16) && (row_elems * std::mem::size_of::<T>()).is_multiple_of(16)
}

impl CudaKernels {
    /// Whether [`CudaKernels::moe_experts`] takes the decode (GEMV) path for
    /// `t` rows with `k` experts each out of `e` (else the tiled GEMM path).
    pub fn moe_decode_path(t: usize, k: usize, e: usize) -> bool {
        t.saturating_mul(k) <= DECODE_MAX_PAIRS.max(DECODE_PAIRS_PER_EXPERT.saturating_mul(e))
    }

    /// Routed experts of a sparse MoE block (`porter_core::nn::Moe::forward`
    /// without the router and the shared expert). For every row `r` and slot
    /// `j`, with expert `x = idx[r, j]`:
    /// `g = x_r·gate_xᵀ`, `u = x_r·up_xᵀ` (f32 accumulation),
    /// `h = round(silu(round(g)) · round(u))`, `o = h·down_xᵀ` (f32), and
    /// `out[r] = Σ_j round(o_j) · w[r, j]` in f32 (`round` to `T`; the sum runs
    /// over slots in order, not over ascending experts as on the CPU).
    ///
    /// The pairs are grouped by expert on the device (counting sort); then
    /// either GEMV kernels that stream each routed expert's weights once
    /// (decode, [`CudaKernels::moe_decode_path`]) or tiled GEMMs over row
    /// tiles of each expert's rows (tensor cores for `bf16` / `f16` on sm_80+,
    /// tiles of 16–64 rows, [`CudaKernels::moe_prefill_tile_frags`]; exact f32
    /// CUDA-core math, 64-row tiles, for `f32`). Scratch is allocated on the stream.
    ///
    /// Expert ids are trusted (they come from [`CudaKernels::moe_router`]),
    /// but an id `>= e` is skipped (contributes nothing), never read out of
    /// bounds.
    ///
    /// # Shapes
    /// - `x`: `[t, hidden]` (`T`)
    /// - `idx`: `[t, k]` (`u32`), `w`: `[t, k]` (`f32`) from `moe_router`
    /// - `gate`, `up`: `[e, inter, hidden]` (`T`); `down`: `[e, hidden, inter]` (`T`)
    /// - `out`: `[t, hidden]` (`f32`), overwritten
    ///
    /// # Errors
    /// [`CudaError::Invalid`] unless `1 ≤ k ≤ e ≤ 8192`, `hidden, inter > 0`,
    /// on a length mismatch or a size beyond the kernels' `u32` indexing;
    /// driver errors (allocation, launch).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        t: usize,
        k: usize,
        e: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<()> {
        self.moe_experts_in(x, idx, w, gate, up, down, out, [t, k, e, hidden, inter], false)
    }

    /// [`CudaKernels::moe_experts`] whose every row's result is independent of
    /// the other rows in the call (batch-invariant): always the decode GEMV
    /// path, which computes each (row, expert) pair by one warp in a fixed
    /// order whatever the row count (the tensor-core prefill tiles round and
    /// accumulate differently). Slower for long prefills; for deterministic
    /// serving.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts`].
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_invariant<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        t: usize,
        k: usize,
        e: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<()> {
        self.moe_experts_in(x, idx, w, gate, up, down, out, [t, k, e, hidden, inter], true)
    }

    /// Checked body of [`CudaKernels::moe_experts`] (`dims` = t, k, e, hidden,
    /// inter); `invariant` pins the decode path.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts_in<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        invariant: bool,
    ) -> Result<()> {
        let [t, k, e, hidden, inter] = dims;
        if k == 0 || k > e || e > MOE_MAX_E || hidden == 0 || inter == 0 {
            return Err(CudaError::Invalid(format!(
                "moe_experts: need 1 <= k <= e <= {MOE_MAX_E}, hidden > 0, inter > 0; got k = {k}, e = {e}, \
                 hidden = {hidden}, inter = {inter}"
            )));
        }
        self.check("x", x, prod(&[t, hidden])?)?;
        self.check("idx", idx, prod(&[t, k])?)?;
        self.check("w", w, prod(&[t, k])?)?;
        self.check("gate", gate, prod(&[e, inter, hidden])?)?;
        self.check("up", up, prod(&[e, inter, hidden])?)?;
        self.check("down", down, prod(&[e, hidden, inter])?)?;
        self.check("out", out, prod(&[t, hidden])?)?;
        if t == 0 {
            return Ok(());
        }
        if invariant || Self::moe_decode_path(t, k, e) {
            self.moe_decode::<T>(x, idx, w, gate, up, down, out, t, k, e, hidden, inter)
        } else {
            let (s, dims) = (&self.stream, [t, k, e, hidden, inter]);
            let ((pg, _gg), (pu, _gu), (pd, _gd)) = (gate.device_ptr(s), up.device_ptr(s), down.device_ptr(s));
            let weights = ExpertWeights::Dense { gate: pg, up: pu, down: pd };
            self.moe_prefill::<T>(x, idx, w, weights, out, dims, &mut |_| Ok(()))
        }
    }

    /// Row fragments per warp (`MI`; tiles of 16·MI rows) of the tensor-core
    /// prefill GEMMs for `t` rows with `k` experts each out of `e`: the one with
    /// the least expected work, Σ over experts of the rows padded to whole tiles
    /// (per-expert counts taken as Poisson of mean t·k/e), over its relative
    /// speed [`TC_SPEED`]. Any choice is correct; this only sets the padding.
    pub fn moe_prefill_tile_frags(t: usize, k: usize, e: usize) -> usize {
        let lambda = t as f64 * k as f64 / e.max(1) as f64;
        if lambda <= 0.0 || lambda > 2048.0 {
            return 4;
        }
        let hi = (lambda + 12.0 * lambda.sqrt() + 32.0).ceil() as usize;
        let ln_l = lambda.ln();
        let mut best = (f64::INFINITY, 4);
        for mi in 1..=4usize {
            let bm = 16 * mi;
            // E[ceil(c / bm) · bm], c ~ Poisson(lambda), pmf in log space.
            let (mut lp, mut rows) = (-lambda, 0.0);
            for c in 0..=hi {
                if c > 0 {
                    lp += ln_l - (c as f64).ln();
                }
                rows += lp.exp() * (c.div_ceil(bm) * bm) as f64;
            }
            let cost = rows / TC_SPEED[mi - 1];
            if cost < best.0 {
                best = (cost, mi);
            }
        }
        best.1
    }

    /// Resident blocks of a persistent decode kernel: `GEMV_BLOCKS_PER_SM` per
    /// SM, no more than `items` warp items need.
    pub(super) fn moe_persistent_grid(&self, items: usize) -> Result<u32> {
        let sms =
            self.ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let sms = usize::try_from(sms).unwrap_or(1).max(1);
        u32_of("gemv blocks", (sms * GEMV_BLOCKS_PER_SM).min(items.div_ceil(GEMV_WARPS)).max(1))
    }

    /// Decode path of [`CudaKernels::moe_experts`] (arguments checked): two
    /// persistent GEMV kernels (gate+up, down + combine), grouping the pairs in
    /// each block; `moe_align` first only when the grouping does not fit in
    /// shared memory.
    #[allow(clippy::too_many_arguments)]
    fn moe_decode<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        t: usize,
        k: usize,
        e: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<()> {
        let n = prod(&[t, k])?;
        let slots = e.min(n);
        let nq = hidden.div_ceil(DOWN_NR);
        let esize = std::mem::size_of::<T>();
        let dsm = prod(&[e + n + 3 * slots, 4])?;
        let fused = dsm <= FUSED_GROUPING_BYTES;
        // Scratch, one allocation: sorted [n], tile_expert [n], seg [3·slots],
        // meta [2], ctr [nq] (u32; the first four only without `fused`);
        // h [n, inter] (T); o [n, hidden] (T).
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
        // SAFETY: uninitialised scratch; every byte a kernel reads is written
        // before: the index lists by moe_align (or built in shared memory
        // instead), the counters by block 0 of the gate+up kernel, h for every
        // valid pair by the gate+up kernel, o for every valid pair by the down
        // kernel before the item is counted done.
        let mut scratch = unsafe { s.alloc::<u8>(bytes) }?;
        let (px, _gx) = x.device_ptr(s);
        let (pi, _gi) = idx.device_ptr(s);
        let (pw, _gw) = w.device_ptr(s);
        let (pg, _gg) = gate.device_ptr(s);
        let (pu, _gu) = up.device_ptr(s);
        let (pd, _gd) = down.device_ptr(s);
        let (po, _go) = out.device_ptr_mut(s);
        let (base, _gs) = scratch.device_ptr_mut(s);
        let p_sorted = base;
        let p_tile = base + off_tile as u64;
        let p_seg = base + off_seg as u64;
        let p_meta = base + off_meta as u64;
        let p_ctr = base + off_ctr as u64;
        let p_h = base + off_h as u64;
        let p_o = base + off_o as u64;

        if !fused {
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (ALIGN_THREADS, 1, 1),
                shared_mem_bytes: u32_of("shared memory", e * 4)?,
            };
            let one = 1u32;
            // SAFETY: arguments match `moe_align`; pad 1: sorted and
            // tile_expert have n entries, seg 3·min(e, n), meta 2; dynamic
            // shared memory e u32 (e ≤ 8192: 32 KiB).
            // Kernel: `moe_align(const u32* idx, u32 n, u32 e, u32 pad, u32 cap, u32 tiles_cap, u32* sorted,
            // u32* tile_expert, u32* seg, u32* meta)`.
            unsafe {
                launch!(self, MOE, "moe_align", cfg, [pi, n32, e32, one, n32, n32, p_sorted, p_tile, p_seg, p_meta])
            }?;
        }
        // 2a. gate+up GEMV: a warp per (active expert, inter column) item.
        let vec_gu = i32::from(vec_ok::<T>(px, hidden) && vec_ok::<T>(pg, hidden) && vec_ok::<T>(pu, hidden));
        // Both GEMV kernels: persistent blocks of GEMV_WARPS warps, the same dynamic shared memory.
        let gemv_cfg = |blocks: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (GEMV_WARPS as u32 * 32, 1, 1),
            shared_mem_bytes: dsm32,
        };
        let cfg = gemv_cfg(grid_gu);
        // SAFETY: arguments match `moe_dec_gu_<T>`; lengths checked; items
        // past the active experts are never visited; h rows per pair (< n);
        // 16-byte loads only with `vec`; the global lists are read only
        // without `fused` (then written by moe_align); dynamic shared memory
        // e + n + 3·min(e, n) u32 with `fused`.
        // Kernel: `moe_dec_gu_<T>(const T* x, const T* gate, const T* up, const u32* idx, u32 n, u32 e, int fused,
        // const u32* g_sorted, const u32* g_seg, const u32* g_meta, u32* ctr, u32 nctr, T* h, u32 H, u32 I, u32 k,
        // int vec)`.
        unsafe {
            launch!(
                self,
                MOE,
                format!("moe_dec_gu_{}", T::NAME),
                cfg,
                [px, pg, pu, pi, n32, e32, fused32, p_sorted, p_seg, p_meta, p_ctr, nq32, p_h, h32, i32_, k32, vec_gu]
            )
        }?;
        // 3a. down GEMV + combine: a warp per (active expert, DOWN_NR hidden columns) item.
        let vec_d = i32::from(vec_ok::<T>(pd, inter) && vec_ok::<T>(p_h, inter));
        let cfg = gemv_cfg(grid_down);
        // SAFETY: arguments match `moe_dec_down_<T>`; o has n rows of hidden,
        // written for valid pairs only and read back (combine) only for them;
        // out [t, hidden] written in full (by the completing warp of every
        // column group, or zeroed when no id is valid); ctr has nq entries.
        // Kernel: `moe_dec_down_<T>(const T* h, const T* down, const u32* idx, const float* wt, u32 n, u32 e,
        // int fused, const u32* g_sorted, const u32* g_seg, const u32* g_meta, u32* ctr, T* o, float* out, u32 H,
        // u32 I, u32 k, u32 t, int vec)`.
        unsafe {
            launch!(
                self,
                MOE,
                format!("moe_dec_down_{}", T::NAME),
                cfg,
                [
                    p_h, pd, pi, pw, n32, e32, fused32, p_sorted, p_seg, p_meta, p_ctr, p_o, po, h32, i32_, k32, t32,
                    vec_d
                ]
            )
        }
    }
}
