//! Launch wrappers of kernels/cuda/moe.cu: the routed experts of a sparse MoE
//! block (`porter_core::nn::Moe::forward` after the router), grouped by expert
//! on the device: alignment (counting sort of the (row, slot) pairs by
//! expert), gate+up with the fused SwiGLU activation, down, and the weighted
//! combine. No host loop over experts and no host synchronisation. The decode
//! (GEMV) path's launches are in `moe_decode.rs`, shared with the FP8 experts.

use super::moe_decode::{check_dims, DecodeCall, MoeGemv, MOE_PHASES_ALL};
use super::{grid_for, prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, MOE};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Largest expert count of [`CudaKernels::moe_experts`] (the alignment kernel
/// keeps one `u32` counter per expert in shared memory).
pub const MOE_MAX_E: usize = 8192;

/// Threads of the alignment kernel (`moe_align`, one block).
pub(super) const ALIGN_THREADS: u32 = 1024;
/// CUDA-core GEMM tile height: rows of the sorted pair list per tile (`MOE_BM`).
const BM: usize = 64;
/// CUDA-core GEMM tile width in weight rows (`MOE_BN`; gate+up tiles hold 64 of each).
const BN: usize = 128;
/// Threads of the CUDA-core GEMM kernels (`MOE_GEMM_THREADS`).
const GEMM_THREADS: u32 = 256;
/// Threads of the tensor-core GEMM kernels (`MOE_TC_THREADS`).
const TC_THREADS: u32 = 128;
/// Tensor-core GEMM tile width in weight rows (`MOE_TC_BN`; gate+up tiles hold
/// 128 gate and 128 up rows, 128 columns of h).
const TC_BN: usize = 256;
/// Shared-memory row of a staged tile in elements (`MOE_TC_LDS`).
const TC_LDS: usize = 40;
/// cp.async stages of the tensor-core GEMMs (`MOE_TC_STAGES`).
const TC_STAGES: usize = 4;
/// Relative speed per executed row of the tensor-core GEMMs by row fragments
/// per warp (`MI` = 1..4: tiles of 16·MI rows; fewer fragments reuse each
/// weight fragment less). Estimates from the shared-memory traffic per FLOP.
const TC_SPEED: [f64; 4] = [0.45, 0.72, 0.9, 1.0];
/// Threads of the combine kernel.
const COMBINE_THREADS: u32 = 256;
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

/// [`CudaKernels::moe_experts`]'s decode (GEMV) path with dense experts, `which` form
/// ([`MoeGemv`]), stopping after `phases` (see [`CudaKernels::moe_decode_with`]).
#[allow(clippy::too_many_arguments)]
fn decode_dense<T: CudaFloat>(
    k: &CudaKernels,
    x: &impl DevicePtr<T>,
    idx: &impl DevicePtr<u32>,
    w: &impl DevicePtr<f32>,
    gate: &impl DevicePtr<T>,
    up: &impl DevicePtr<T>,
    down: &impl DevicePtr<T>,
    out: &mut impl DevicePtrMut<f32>,
    dims: [usize; 5],
    which: MoeGemv,
    phases: u32,
) -> Result<()> {
    let [_, _, _, hidden, inter] = dims;
    let s = k.stream();
    let (px, _gx) = x.device_ptr(s);
    let (pi, _gi) = idx.device_ptr(s);
    let (pw, _gw) = w.device_ptr(s);
    let (pg, _gg) = gate.device_ptr(s);
    let (pu, _gu) = up.device_ptr(s);
    let (pd, _gd) = down.device_ptr(s);
    let (po, _go) = out.device_ptr_mut(s);
    let call = DecodeCall {
        src: &MOE,
        kind: "",
        tname: T::NAME,
        esize: std::mem::size_of::<T>(),
        x: px,
        idx: pi,
        w: pw,
        out: po,
        gate: &[pg],
        up: &[pu],
        down: &[pd],
        w_vec_gu: vec_ok::<T>(pg, hidden) && vec_ok::<T>(pu, hidden),
        w_vec_d: vec_ok::<T>(pd, inter),
        dims,
    };
    k.moe_decode_run(&call, which, phases)
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
        self.check_experts(x, idx, w, gate, up, down, out, dims)?;
        if t == 0 {
            return Ok(());
        }
        if invariant || Self::moe_decode_path(t, k, e) {
            decode_dense::<T>(self, x, idx, w, gate, up, down, out, dims, MoeGemv::from_env(), MOE_PHASES_ALL)
        } else {
            self.moe_prefill::<T>(x, idx, w, gate, up, down, out, t, k, e, hidden, inter, &mut |_| Ok(()))
        }
    }

    /// [`CudaKernels::moe_experts`]'s decode (GEMV) path whatever `t` is, in the form `which`
    /// ([`MoeGemv`]; both give the same bits), stopping after `phases`: 0 the grouping, 1
    /// gate+up, 2 down (v1: down and combine), [`MOE_PHASES_ALL`] the whole call (`out`
    /// is written only then). For timing each stage and A/B runs.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts`] (`dims` = t, k, e, hidden, inter).
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`].
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn moe_decode_with<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        which: MoeGemv,
        phases: u32,
    ) -> Result<()> {
        self.check_experts(x, idx, w, gate, up, down, out, dims)?;
        if dims[0] == 0 {
            return Ok(());
        }
        decode_dense::<T>(self, x, idx, w, gate, up, down, out, dims, which, phases)
    }

    /// The argument checks of [`CudaKernels::moe_experts`].
    #[allow(clippy::too_many_arguments)]
    fn check_experts<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: &impl DevicePtr<T>,
        up: &impl DevicePtr<T>,
        down: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        let [t, k, e, hidden, inter] = dims;
        check_dims("moe_experts", dims)?;
        self.check("x", x, prod(&[t, hidden])?)?;
        self.check("idx", idx, prod(&[t, k])?)?;
        self.check("w", w, prod(&[t, k])?)?;
        self.check("gate", gate, prod(&[e, inter, hidden])?)?;
        self.check("up", up, prod(&[e, inter, hidden])?)?;
        self.check("down", down, prod(&[e, hidden, inter])?)?;
        self.check("out", out, prod(&[t, hidden])?)
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

    /// The prefill path of [`CudaKernels::moe_experts`] (same arguments and
    /// checks; `t·k` must exceed the decode threshold), synchronising the
    /// stream after every stage: returns the seconds of the alignment, the
    /// gate+up GEMM, the down GEMM and the combine (host clock around each
    /// launch + synchronise). For profiling only.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn moe_prefill_stage_times<T: CudaFloat>(
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
    ) -> Result<[f64; 4]> {
        if t == 0 || Self::moe_decode_path(t, k, e) || k == 0 || k > e || e > MOE_MAX_E || hidden == 0 || inter == 0 {
            return Err(CudaError::Invalid("moe_prefill_stage_times: not a prefill shape".into()));
        }
        self.check("x", x, prod(&[t, hidden])?)?;
        self.check("idx", idx, prod(&[t, k])?)?;
        self.check("w", w, prod(&[t, k])?)?;
        self.check("gate", gate, prod(&[e, inter, hidden])?)?;
        self.check("up", up, prod(&[e, inter, hidden])?)?;
        self.check("down", down, prod(&[e, hidden, inter])?)?;
        self.check("out", out, prod(&[t, hidden])?)?;
        let mut times = [0.0f64; 4];
        self.stream.synchronize()?;
        let mut clock = std::time::Instant::now();
        self.moe_prefill::<T>(x, idx, w, gate, up, down, out, t, k, e, hidden, inter, &mut |stage| {
            self.stream.synchronize()?;
            let now = std::time::Instant::now();
            times[stage] = (now - clock).as_secs_f64();
            clock = now;
            Ok(())
        })?;
        Ok(times)
    }

    /// Prefill path of [`CudaKernels::moe_experts`] (arguments checked):
    /// alignment, tiled gate+up and down GEMMs, combine. `done(stage)` is
    /// called after the launch of each stage (0..4).
    #[allow(clippy::too_many_arguments)]
    fn moe_prefill<T: CudaFloat>(
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
        done: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        let n = prod(&[t, k])?;
        let slots = e.min(n);
        let esize = std::mem::size_of::<T>();
        // Tensor cores for bf16 / f16 on sm_80+ with 16-byte rows everywhere
        // (K % 8 == 0 and N % 8 == 0 for both GEMMs; base pointers checked below).
        // Fallback (below sm_80, forced, or too little shared memory): the SIMT GEMMs.
        let sm80 = self.caps().tensor_cores();
        let tc_dims =
            T::NAME != "f32" && sm80 && (hidden * esize).is_multiple_of(16) && (inter * esize).is_multiple_of(16);
        let (px, _gx) = x.device_ptr(&self.stream);
        let (pg, _gg) = gate.device_ptr(&self.stream);
        let (pu, _gu) = up.device_ptr(&self.stream);
        let (pd, _gd) = down.device_ptr(&self.stream);
        let tc = tc_dims && [px, pg, pu, pd].iter().all(|p| p.is_multiple_of(16));
        let mut mi = if tc { Self::moe_prefill_tile_frags(t, k, e) } else { 0 };
        // Fewer row fragments where the cp.async stages of 16·mi rows need more shared memory
        // than the device allows (mi = 4 needs 100 KiB: an sm_86 / sm_89 allows 99 / 99 KiB).
        let tc_smem = |mi: usize| TC_STAGES * (16 * mi + TC_BN) * TC_LDS * esize;
        while mi > 1 && tc_smem(mi) > self.caps().smem_limit() {
            mi -= 1;
        }
        let tc = tc && tc_smem(mi) <= self.caps().smem_limit();
        // Sorted list: each expert's segment padded to whole tiles (at most
        // one partial tile per active expert).
        let tile_rows = if tc { 16 * mi } else { BM };
        let (pad, tiles_cap) = (tile_rows, n.div_ceil(tile_rows) + slots);
        let cap = prod(&[tiles_cap, pad])?;
        // Scratch, one allocation: sorted [cap], tile_expert [tiles_cap],
        // seg [3·slots], meta [2] (u32); h [cap, inter] (T); o [n, hidden] (T).
        let off_tile = align256(cap * 4);
        let off_seg = off_tile + align256(tiles_cap * 4);
        let off_meta = off_seg + align256(slots * 3 * 4);
        let off_h = off_meta + 256;
        let off_o = off_h + align256(prod(&[cap, inter, esize])?);
        let bytes = off_o + align256(prod(&[n, hidden, esize])?);
        // Every index the kernels use fits in u32 (pair ids, sorted positions);
        // element offsets are 64-bit in the kernels.
        let (n32, e32, k32) = (u32_of("t·k", n)?, u32_of("e", e)?, u32_of("k", k)?);
        let (pad32, cap32, tiles32) = (u32_of("pad", pad)?, u32_of("cap", cap)?, u32_of("tiles", tiles_cap)?);
        let (h32, i32_) = (u32_of("hidden", hidden)?, u32_of("inter", inter)?);

        let s = &self.stream;
        // SAFETY: uninitialised scratch; every byte a kernel reads is written
        // before by an earlier kernel on this stream (moe_align writes the
        // index lists in full, the gate+up kernels every h row the down kernels
        // read, the down kernels o for every pair moe_combine reads).
        let mut scratch = unsafe { s.alloc::<u8>(bytes) }?;
        let (pi, _gi) = idx.device_ptr(s);
        let (base, _gs) = scratch.device_ptr_mut(s);
        let p_sorted = base;
        let p_tile = base + off_tile as u64;
        let p_seg = base + off_seg as u64;
        let p_meta = base + off_meta as u64;
        let p_h = base + off_h as u64;
        let p_o = base + off_o as u64;

        // 1. Alignment.
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (ALIGN_THREADS, 1, 1),
            shared_mem_bytes: u32_of("shared memory", e * 4)?,
        };
        // SAFETY: arguments match `moe_align`; idx has n elements; sorted has
        // cap = tiles_cap · pad entries, enough for Σ roundup(count, pad)
        // (≤ n + slots·(pad − 1)); tile_expert tiles_cap, seg 3·min(e, n),
        // meta 2; dynamic shared memory e u32 (e ≤ 8192: 32 KiB).
        // Kernel: `moe_align(const u32* idx, u32 n, u32 e, u32 pad, u32 cap, u32 tiles_cap, u32* sorted,
        // u32* tile_expert, u32* seg, u32* meta)`.
        unsafe {
            launch!(self, MOE, "moe_align", cfg, [pi, n32, e32, pad32, cap32, tiles32, p_sorted, p_tile, p_seg, p_meta])
        }?;

        done(0)?;

        // Kernel, grid (tiles_cap · column blocks), block and dynamic shared memory of a GEMM.
        let gemm = |gu: bool, n_cols: usize| -> Result<(cudarc::driver::CudaFunction, u32, LaunchConfig)> {
            let which = if gu { "gu" } else { "down" };
            if tc {
                // gate+up: 128 h columns per block; down: 256 o columns.
                let nc = if gu { TC_BN / 2 } else { TC_BN };
                let nblk = n_cols.div_ceil(nc);
                let stages = TC_STAGES * (tile_rows + TC_BN) * TC_LDS * esize;
                let smem = stages.max(tile_rows * (nc + 4) * 4);
                let f = self.function_smem(&MOE, &format!("moe_gemm_{which}_tc{mi}_{}", T::NAME), smem)?;
                let cfg = LaunchConfig {
                    grid_dim: (u32_of("gemm blocks", prod(&[tiles_cap, nblk])?)?, 1, 1),
                    block_dim: (TC_THREADS, 1, 1),
                    shared_mem_bytes: u32_of("shared memory", smem)?,
                };
                Ok((f, u32_of("column blocks", nblk)?, cfg))
            } else {
                let nblk = n_cols.div_ceil(if gu { BN / 2 } else { BN });
                let f = self.function(&MOE, &format!("moe_gemm_{which}_simt_{}", T::NAME))?;
                let cfg = LaunchConfig {
                    grid_dim: (u32_of("gemm blocks", prod(&[tiles_cap, nblk])?)?, 1, 1),
                    block_dim: (GEMM_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                Ok((f, u32_of("column blocks", nblk)?, cfg))
            }
        };
        // 2b. gate+up GEMM (+ activation).
        let (f, nblk32, cfg) = gemm(true, inter)?;
        // SAFETY: arguments match `moe_gemm_gu_<kind>_<T>`; the sorted list
        // was padded to tiles of this kernel's height (pad); tiles past the
        // real count exit (tile_expert invalid); A rows gathered through the
        // sorted list (padding reads nothing); h has cap rows; the tensor-core
        // variant is only chosen with 16-byte aligned rows (hidden, inter
        // multiples of 8, base pointers checked, scratch 256-byte aligned).
        // Kernel: `moe_gemm_gu_<kind>_<T>(const T* a, const T* w0, const T* w1, const u32* sorted,
        // const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk)`.
        unsafe { launch_fn!(self, f, cfg, [px, pg, pu, p_sorted, p_tile, p_h, h32, i32_, k32, nblk32]) }?;
        done(1)?;
        // 3b. down GEMM.
        let (f, nblk32, cfg) = gemm(false, hidden)?;
        // SAFETY: arguments match `moe_gemm_down_<kind>_<T>`; h rows of
        // real tiles were all written by the gate+up GEMM; o written for
        // valid pairs only.
        // Kernel: `moe_gemm_down_<kind>_<T>(const T* a, const T* w0, const T* w1, const u32* sorted,
        // const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk)`.
        unsafe { launch_fn!(self, f, cfg, [p_h, pd, pd, p_sorted, p_tile, p_o, i32_, h32, k32, nblk32]) }?;
        done(2)?;

        // 4. Combine.
        let total = prod(&[t, hidden])?;
        let total64 = total as u64;
        let cfg = LaunchConfig {
            grid_dim: (grid_for(total, COMBINE_THREADS), 1, 1),
            block_dim: (COMBINE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match `moe_combine_<T>`; out and idx/w lengths
        // checked; o is read only for pairs with a valid expert id, all of
        // which the down kernel wrote.
        // Kernel: `moe_combine_<T>(const T* o, const u32* idx, const float* w, float* out, u64 total, u32 H, u32 k,
        // u32 e)`.
        unsafe {
            launch!(
                self,
                MOE,
                format!("moe_combine_{}", T::NAME),
                cfg,
                [p_o, pi, ptr(w), ptr_mut(out), total64, h32, k32, e32]
            )
        }?;
        done(3)?;
        Ok(())
    }
}
