//! The prefill path of the routed experts (kernels/cuda/moe.cu's tiled grouped GEMMs, with
//! dense or FP8 experts; kernels/cuda/fp8_gemm.cu's FP8 forms): alignment of the (row, slot)
//! pairs into tiles by expert, gate+up with the fused activation, down, combine. Split from
//! moe.rs (the checks, the decode GEMVs and the tile choice stay there).

use super::moe::{align256, ALIGN_THREADS};
use super::{grid_for, prod, u32_of, CudaError, CudaFloat, CudaKernels, Fp8Dev, Result, FP8, MOE, MOE_WGMMA};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

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
/// Columns of a k-step of the tensor-core GEMMs (`MOE_TC_BK`; FP8 weights stage rows of this
/// many bytes).
const TC_BK: usize = 32;
/// cp.async stages of the tensor-core GEMMs (`MOE_TC_STAGES`).
const TC_STAGES: usize = 4;
/// Threads of the combine kernel.
const COMBINE_THREADS: u32 = 256;
/// Slots the 8-column combine kernel unrolls (`MOE_COMBINE_K` in moe.cu).
const COMBINE_K: usize = 16;
/// Threads of the mma.sync GEMM kernels (`MOE_MMA_THREADS`, 8 warps).
const MMA_THREADS: u32 = 256;
/// Row fragments (`MI`: tiles of 16·MI rows) of the mma.sync GEMMs that are built: 1..4 wide
/// (warp tiles 16·MI × 64, block tiles 16·MI × 512), 6 and 8 tall (16·MI × 32, 16·MI × 256).
const MMA_FRAGS: [usize; 6] = [1, 2, 3, 4, 6, 8];

/// Weight rows of an mma.sync GEMM block tile of `16·mi` rows (8 warps × `8·WN8`; gate+up:
/// half gate, half the matching up rows).
fn mma_bn(mi: usize) -> usize {
    if mi <= 4 {
        512
    } else {
        256
    }
}
/// Bytes of a staged row of a k-step of the mma.sync GEMMs (`MOE_MMA_BK` = 32 elements of
/// 2 bytes).
const MMA_ROW_BYTES: usize = 64;
/// cp.async stages of the mma.sync GEMMs (`MOE_MMA_STAGES`).
const MMA_STAGES: usize = 4;
/// Threads of the parallel alignment's histogram and scatter kernels (`MOE_PALIGN_THREADS`).
const PALIGN_THREADS: u32 = 512;
/// Pairs per block of the parallel alignment (at least; more when that would need more than
/// [`PALIGN_MAX_BLOCKS`] blocks). One block's worth or fewer: the single-block `moe_align`.
const PALIGN_PAIRS: usize = 4096;
/// Most blocks of the parallel alignment (its histogram scratch is blocks × e u32).
const PALIGN_MAX_BLOCKS: usize = 256;

mod choice;
mod pipe;
mod times;
mod wg;
use choice::{one_block_align_env, Choice, MoeGemm};

/// What [`CudaKernels::moe_prefill_stage_times_with`] ran: the seconds of the alignment, the
/// gate+up GEMM, the down GEMM and the combine, the GEMM form (`"mma"`, `"pipe"`, `"wmma"`,
/// `"simt"`, ...), the tile height in rows, and the seconds of the scratch allocation.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct PrefillTimes {
    /// Seconds of the alignment, gate+up, down and combine launches.
    pub secs: [f64; 4],
    /// The GEMM form that ran.
    pub form: &'static str,
    /// Rows of a tile of the sorted pair list.
    pub tile_rows: usize,
    /// Blocks of the alignment (1: the single-block `moe_align`).
    pub align_blocks: usize,
    /// Seconds of the scratch allocation before the alignment (stream-ordered; not in
    /// `secs[0]`). Large when the memory pool gives freed memory back at every
    /// synchronisation (porter-core keeps it).
    pub alloc_secs: f64,
}

/// Dynamic shared memory of an mma.sync GEMM launch for tiles of `16·mi` rows of `esize`-byte
/// elements and `nc` output columns a block: the cp.async stages, or the C staging area of
/// `16·mi` rows × (`nc` + 8) elements if larger.
fn mma_smem(mi: usize, esize: usize, nc: usize) -> usize {
    (MMA_STAGES * (16 * mi + mma_bn(mi)) * MMA_ROW_BYTES).max(16 * mi * (nc + 8) * esize)
}

/// The expert weights of the prefill path: dense `T` (device addresses, the caller holding
/// the buffers) or FP8 (tiles dequantized in the tensor-core GEMMs, fp8_gemm.cu).
#[derive(Clone, Copy, Debug)]
pub(super) enum ExpertWeights<'a> {
    /// gate, up `[e, inter, hidden]`, down `[e, hidden, inter]` of `T`.
    Dense { gate: u64, up: u64, down: u64 },
    /// gate, up `[e·inter, hidden]`, down `[e·hidden, inter]` FP8 (checked by the caller);
    /// `mma8`: the e4m3 MMA GEMMs on quantized activations, else the tile-dequantizing ones.
    Fp8 { gate: Fp8Dev<'a>, up: Fp8Dev<'a>, down: Fp8Dev<'a>, mma8: bool },
}

/// Rows of the e4m3 MMA grouped GEMMs' tiles (`32 · WM`, WM = 2), weight rows per block
/// (`32 · WN`, WN = 8), and their threads (`FP8_MMA_THREADS`).
const MMA8_BM: usize = 64;
/// See [`MMA8_BM`].
const MMA8_BN: usize = 256;
/// See [`MMA8_BM`].
const MMA8_THREADS: u32 = 512;

/// Bytes of a cp.async stage of the e4m3 MMA grouped GEMMs: the 64 × 128-byte A and 256 ×
/// 128-byte W tiles and their 320 f32 scales.
const MMA8_STAGE: usize = (MMA8_BM + MMA8_BN) * 132;

/// cp.async stages of the e4m3 MMA grouped GEMMs within `limit` bytes of shared memory (4 of
/// [`MMA8_STAGE`], the only form built), or `None`.
pub(super) fn mma8_moe_stages(limit: usize) -> Option<usize> {
    (4 * MMA8_STAGE <= limit).then_some(4)
}

/// Dynamic shared memory of the tensor-core GEMMs' cp.async stages (and FP8 conversion
/// buffers) for tiles of `16·mi` rows of `esize`-byte elements (moe.cu's `gemm_tc_impl`).
pub(super) fn tc_stage_smem(mi: usize, esize: usize, fp8: bool) -> usize {
    if fp8 {
        TC_STAGES * (16 * mi * TC_LDS * esize + TC_BN * TC_BK) + 2 * TC_BN * TC_LDS * esize
    } else {
        TC_STAGES * (16 * mi + TC_BN) * TC_LDS * esize
    }
}

/// Dynamic shared memory of a tensor-core GEMM launch: the stages, or the f32 C staging area
/// of `16·mi` rows × (`nc` + 4) if larger.
pub(super) fn tc_smem(mi: usize, esize: usize, fp8: bool, nc: usize) -> usize {
    tc_stage_smem(mi, esize, fp8).max(16 * mi * (nc + 4) * 4)
}

impl CudaKernels {
    /// Row fragments (`MI`, tiles of 16·MI rows: 1, 2 or 3 of the built 1, 2, 3, 4, 6, 8) of
    /// the mma.sync prefill GEMMs for `t` rows with `k` experts each out of `e`: the smallest
    /// tile that holds an expert's rows with high probability (per-expert counts taken as
    /// Poisson of mean λ = t·k/e: λ + 3√λ + 1 rows), at most 48 rows. Those GEMMs skip the m16
    /// fragments of padding rows, so the MMA work is Σ 16·⌈count/16⌉ whatever the tile; the
    /// tile height sets how often an expert's weights are streamed (once per tile) and,
    /// through the wide / tall warp shapes, the MMAs per fragment load. Measured on the H200
    /// at the 80B shapes, t = 4096 (λ = 80, `cuda_moe` `moe_80b_forms_timed`): 48-row tiles
    /// (wide) 1.124 + 0.569 ms for gate+up + down against 1.255 + 0.641 ms for 128-row ones
    /// (tall, each expert streamed once): the wide warp tiles beat the saved weight reads, so
    /// the tall tiles are never the default (64 rows: not measured). Any choice is correct.
    pub fn moe_prefill_mma_frags(t: usize, k: usize, e: usize) -> usize {
        let lambda = t as f64 * k as f64 / e.max(1) as f64;
        let rows = lambda + 3.0 * lambda.sqrt() + 1.0;
        MMA_FRAGS.into_iter().take_while(|&mi| mi <= 3).find(|&mi| (16 * mi) as f64 >= rows).unwrap_or(3)
    }

    /// Whether the tensor-core prefill GEMMs take FP8 experts of `hidden` × `inter` for `T`
    /// on this device (bf16 / f16 on sm_80+ and not forced to the fallback, both dimensions
    /// multiples of 16, the stages within the shared-memory limit); otherwise an FP8 prefill
    /// must dequantize the experts and run [`CudaKernels::moe_experts`].
    pub fn moe_prefill_fp8_fits<T: CudaFloat>(&self, hidden: usize, inter: usize) -> bool {
        T::NAME != "f32"
            && self.caps().tensor_cores()
            && hidden.is_multiple_of(16)
            && inter.is_multiple_of(16)
            && tc_stage_smem(1, std::mem::size_of::<T>(), true) <= self.caps().smem_limit()
    }

    /// Prefill path of [`CudaKernels::moe_experts`] (arguments checked; `dims` = t, k, e,
    /// hidden, inter): alignment, tiled gate+up and down GEMMs, combine. `done(stage)` is
    /// called after the launch of each stage (0..4), and with 4 after the scratch allocation
    /// (before stage 0). FP8 `weights` need the tensor-core GEMMs
    /// ([`CudaKernels::moe_prefill_fp8_fits`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_prefill<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        weights: ExpertWeights<'_>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        done: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        let choice = Choice { gemm: MoeGemm::from_env(), frags: None, one_block_align: one_block_align_env() };
        self.moe_prefill_in(x, idx, w, weights, out, dims, choice, done).map(|_| ())
    }

    /// [`CudaKernels::moe_prefill`] with the dense GEMM form and tile fragments of `choice`
    /// (see [`CudaKernels::moe_prefill_stage_times_with`]); returns the form that ran, the
    /// tile height and the alignment's blocks.
    #[allow(clippy::too_many_arguments)]
    fn moe_prefill_in<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        weights: ExpertWeights<'_>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        choice: Choice,
        done: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(&'static str, usize, usize)> {
        let [t, k, e, hidden, inter] = dims;
        let Choice { gemm: gemm_form, frags, one_block_align } = choice;
        // Auto: on sm_90 the wgmma GEMMs at every size (session 12, H200: 0.885 / 0.901 /
        // 1.160 ms a layer at t = 512 / 1024 / 4096 against 0.915 / 1.014 for pipe and 1.784
        // for mma); elsewhere the streamed GEMMs where their tile is 64 rows (few rows an
        // expert: weight streaming decides), the mma.sync ones beyond (MMA throughput decides).
        let gemm_form = match gemm_form {
            MoeGemm::Auto if frags.is_none() && wg::fits(&self.caps()) => MoeGemm::Wgmma,
            MoeGemm::Auto if frags.is_none() && pipe::frags(t, k, e) <= 4 => MoeGemm::Pipe,
            MoeGemm::Auto => MoeGemm::Mma,
            f => f,
        };
        if frags.is_some_and(|f| !MMA_FRAGS.contains(&f)) {
            return Err(CudaError::Invalid(format!("moe prefill: tile fragments {frags:?}, not one of {MMA_FRAGS:?}")));
        }
        let n = prod(&[t, k])?;
        let slots = e.min(n);
        let esize = std::mem::size_of::<T>();
        // Tensor cores for bf16 / f16 on sm_80+ with 16-byte rows everywhere
        // (K % 8 == 0 and N % 8 == 0 for both GEMMs; FP8 rows: K % 16 == 0; base pointers
        // checked below). Fallback (below sm_80, forced, or too little shared memory): the
        // SIMT GEMMs (dense weights only).
        let sm80 = self.caps().tensor_cores();
        let (fp8, mma8) = match weights {
            ExpertWeights::Fp8 { mma8, .. } => (true, mma8),
            ExpertWeights::Dense { .. } => (false, false),
        };
        let tc_dims =
            T::NAME != "f32" && sm80 && (hidden * esize).is_multiple_of(16) && (inter * esize).is_multiple_of(16);
        let (px, _gx) = x.device_ptr(&self.stream);
        let wptrs = match weights {
            ExpertWeights::Dense { gate, up, down } => [gate, up, down],
            ExpertWeights::Fp8 { gate, up, down, .. } => {
                let s = &self.stream;
                [gate.q.device_ptr(s).0, up.q.device_ptr(s).0, down.q.device_ptr(s).0]
            }
        };
        let tc_dims = tc_dims && (!fp8 || (hidden.is_multiple_of(16) && inter.is_multiple_of(16)));
        let tc = tc_dims && std::iter::once(px).chain(wptrs).all(|p| p.is_multiple_of(16));
        let mma8_stages = if mma8 { mma8_moe_stages(self.caps().smem_limit()) } else { None };
        if mma8 && (!tc || mma8_stages.is_none() || !self.fp8_mma8_fits(hidden) || !self.fp8_mma8_fits(inter)) {
            return Err(CudaError::Invalid(format!(
                "moe prefill with e4m3 MMA ({} hidden {hidden}, inter {inter}) does not fit on {} \
                 (moe_prefill_mma8_fits)",
                T::NAME,
                self.arch()
            )));
        }
        // Dense bf16 / f16: the mma.sync GEMMs unless PORTER_MOE_GEMM=wmma or their stages
        // need more shared memory than the device allows (sm_86 / sm_89 for the wide tiles,
        // the forced fallback).
        let limit = self.caps().smem_limit();
        let mut mma_mi = frags.unwrap_or_else(|| Self::moe_prefill_mma_frags(t, k, e));
        if frags.is_none() && mma_mi <= 4 && mma_smem(mma_mi, esize, mma_bn(mma_mi)) > limit {
            // The wide tiles' stages do not fit (sm_86 / sm_89): the tall 96-row ones (the same
            // MMA work, padding fragments being skipped) rather than the wmma form.
            mma_mi = 6;
        }
        // PORTER_MOE_GEMM=pipe: the streamed GEMMs (tiles of 64 / 128 rows, frags 4 / 8) where
        // their stages fit (sm_80: 3, sm_90: 4 stages), else the mma.sync ones.
        // PORTER_MOE_GEMM=wgmma: moe_wgmma.cu's GEMMs on the same tiles, where they run (sm_90),
        // else as pipe.
        let streamed = matches!(gemm_form, MoeGemm::Pipe | MoeGemm::Wgmma);
        let pipe_mi = if streamed { frags.unwrap_or_else(|| pipe::frags(t, k, e)) } else { 0 };
        if streamed && !pipe::FRAGS.contains(&pipe_mi) {
            return Err(CudaError::Invalid(format!(
                "moe prefill pipe: tile fragments {pipe_mi}, not one of {:?}",
                pipe::FRAGS
            )));
        }
        // The wgmma GEMMs take FP8 experts too (moe_wg_*_fp8_*: each thread dequantizes the
        // e4m3 weight chunks it staged into the T tile the MMAs read). H100, 80B, 4k tokens:
        // session 31 (docs/benchmarks.md).
        let use_wg = tc && !mma8 && gemm_form == MoeGemm::Wgmma && wg::fits(&self.caps());
        let pipe_stages = if tc && !fp8 && streamed && !use_wg { pipe::stages(pipe_mi, limit) } else { None };
        let use_pipe = pipe_stages.is_some();
        let mma_form = gemm_form == MoeGemm::Mma || (streamed && !use_pipe && !use_wg);
        let use_mma = tc && !fp8 && mma_form && mma_smem(mma_mi, esize, mma_bn(mma_mi)) <= limit;
        // The e4m3 MMA GEMMs have tiles of 64 rows (mi = 4).
        let mut mi = if mma8 {
            4
        } else if use_pipe || use_wg {
            pipe_mi
        } else if use_mma {
            mma_mi
        } else if tc {
            frags.map_or_else(|| Self::moe_prefill_tile_frags(t, k, e), |f| f.min(4))
        } else {
            0
        };
        // wmma: fewer row fragments where the cp.async stages of 16·mi rows need more shared
        // memory than the device allows (mi = 4 needs 100 KiB: an sm_86 / sm_89 allows 99 KiB).
        let stage_smem = |mi: usize| tc_stage_smem(mi, esize, fp8);
        while !mma8 && !use_mma && !use_pipe && !use_wg && mi > 1 && stage_smem(mi) > limit {
            mi -= 1;
        }
        let tc = tc && (mma8 || use_mma || use_pipe || use_wg || stage_smem(mi) <= limit);
        if fp8 && !tc {
            return Err(CudaError::Invalid(format!(
                "moe prefill with fp8 experts ({} hidden {hidden}, inter {inter}) needs the tensor-core GEMMs \
                 (moe_prefill_fp8_fits) and 16-byte aligned buffers",
                T::NAME
            )));
        }
        // Sorted list: each expert's segment padded to whole tiles (at most
        // one partial tile per active expert).
        let tile_rows = if tc { 16 * mi } else { BM };
        let (pad, tiles_cap) = (tile_rows, n.div_ceil(tile_rows) + slots);
        let cap = prod(&[tiles_cap, pad])?;
        // Scratch, one allocation: sorted [cap], tile_expert [tiles_cap],
        // seg [3·slots], meta [2] (u32); h [cap, inter] (T); o [n, hidden] (T); with mma8
        // also x and h quantized: bytes [t, hidden], scales [t, ⌈hidden/128⌉], bytes
        // [cap, inter], scales [cap, ⌈inter/128⌉].
        let off_tile = align256(cap * 4);
        let off_seg = off_tile + align256(tiles_cap * 4);
        let off_meta = off_seg + align256(slots * 3 * 4);
        let off_h = off_meta + 256;
        let off_o = off_h + align256(prod(&[cap, inter, esize])?);
        let off_xq = off_o + align256(prod(&[n, hidden, esize])?);
        let q = |rows: usize, cols: usize| -> Result<(usize, usize)> {
            let bytes = if mma8 { prod(&[rows, cols])? } else { 0 };
            let scales = if mma8 { prod(&[rows, cols.div_ceil(super::FP8_BLOCK), 4])? } else { 0 };
            Ok((align256(bytes), align256(scales)))
        };
        let ((xq_b, xs_b), (hq_b, hs_b)) = (q(t, hidden)?, q(cap, inter)?);
        let (off_xs, off_hq) = (off_xq + xq_b, off_xq + xq_b + xs_b);
        let off_hs = off_hq + hq_b;
        // Parallel alignment: nb blocks of `per` pairs and their histograms hist [nb, e] (u32);
        // one block's worth: the single-block moe_align, no histograms.
        let per = PALIGN_PAIRS.max(n.div_ceil(PALIGN_MAX_BLOCKS));
        let nb = if one_block_align { 1 } else { n.div_ceil(per) };
        let off_hist = off_hs + hs_b;
        let bytes = off_hist + if nb > 1 { align256(prod(&[nb, e, 4])?) } else { 0 };
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
        done(4)?;
        let (pi, _gi) = idx.device_ptr(s);
        let (base, _gs) = scratch.device_ptr_mut(s);
        let p_sorted = base;
        let p_tile = base + off_tile as u64;
        let p_seg = base + off_seg as u64;
        let p_meta = base + off_meta as u64;
        let p_h = base + off_h as u64;
        let p_o = base + off_o as u64;
        let (p_xq, p_xs, p_hq, p_hs) =
            (base + off_xq as u64, base + off_xs as u64, base + off_hq as u64, base + off_hs as u64);
        let p_hist = base + off_hist as u64;

        // 1. Alignment.
        let shared_e = u32_of("shared memory", e * 4)?;
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (ALIGN_THREADS, 1, 1), shared_mem_bytes: shared_e };
        if nb == 1 {
            // SAFETY: arguments match `moe_align`; idx has n elements; sorted has
            // cap = tiles_cap · pad entries, enough for Σ roundup(count, pad)
            // (≤ n + slots·(pad − 1)); tile_expert tiles_cap, seg 3·min(e, n),
            // meta 2; dynamic shared memory e u32 (e ≤ 8192: 32 KiB).
            // Kernel: `moe_align(const u32* idx, u32 n, u32 e, u32 pad, u32 cap, u32 tiles_cap, u32* sorted,
            // u32* tile_expert, u32* seg, u32* meta)`.
            unsafe {
                launch!(
                    self,
                    MOE,
                    "moe_align",
                    one,
                    [pi, n32, e32, pad32, cap32, tiles32, p_sorted, p_tile, p_seg, p_meta]
                )
            }?;
        } else {
            let (nb32, per32) = (u32_of("alignment blocks", nb)?, u32_of("pairs per block", per)?);
            let many =
                LaunchConfig { grid_dim: (nb32, 1, 1), block_dim: (PALIGN_THREADS, 1, 1), shared_mem_bytes: shared_e };
            // SAFETY: arguments match `moe_palign_hist`; block b reads idx [b·per, min((b+1)·per, n))
            // and writes hist row b (nb rows of e u32 in the scratch); dynamic shared memory e u32.
            // Kernel: `moe_palign_hist(const u32* idx, u32 n, u32 e, u32 per, u32* hist)`.
            unsafe { launch!(self, MOE, "moe_palign_hist", many, [pi, n32, e32, per32, p_hist]) }?;
            // SAFETY: arguments match `moe_palign_scan`; hist [nb, e] written in full above; the
            // outputs as for moe_align (same sizes); dynamic shared memory e u32.
            // Kernel: `moe_palign_scan(u32* hist, u32 nb, u32 e, u32 pad, u32 cap, u32 tiles_cap,
            // u32* sorted, u32* tile_expert, u32* seg, u32* meta)`.
            unsafe {
                launch!(
                    self,
                    MOE,
                    "moe_palign_scan",
                    one,
                    [p_hist, nb32, e32, pad32, cap32, tiles32, p_sorted, p_tile, p_seg, p_meta]
                )
            }?;
            // SAFETY: arguments match `moe_palign_scatter`; the cursors hist[b][x] + the block's
            // count of expert x stay within expert x's segment of sorted (cap entries).
            // Kernel: `moe_palign_scatter(const u32* idx, u32 n, u32 e, u32 per, const u32* hist,
            // u32* sorted)`.
            unsafe { launch!(self, MOE, "moe_palign_scatter", many, [pi, n32, e32, per32, p_hist, p_sorted]) }?;
        }

        done(0)?;
        if mma8 {
            // SAFETY: x holds t·hidden T (checked by the callers); xq / xs have t·hidden bytes
            // and t·⌈hidden/128⌉ scales in the scratch.
            unsafe { self.fp8_act_quant_raw::<T>(px, p_xq, p_xs, t, hidden) }?;
        }

        // Kernel, column blocks, grid (tiles_cap · column blocks), block and dynamic shared
        // memory of a GEMM; the streamed GEMMs: grid tiles_cap · groups, and [groups, column
        // blocks a CTA].
        type Gemm = (cudarc::driver::CudaFunction, u32, LaunchConfig, [u32; 2]);
        let gemm = |gu: bool, n_cols: usize| -> Result<Gemm> {
            let which = if gu { "gu" } else { "down" };
            if use_wg {
                // As pipe: gate+up 128 h columns a column block, down 256 o columns.
                let nblk = n_cols.div_ceil(if gu { wg::WR / 2 } else { wg::WR });
                let cpb = pipe::cols_per_cta(nblk, slots, self.caps().sms);
                let ngrp = nblk.div_ceil(cpb);
                let kind = if fp8 { "fp8_" } else { "" };
                let f = self.function_smem(&MOE_WGMMA, &format!("moe_wg_{which}_{kind}{}", T::NAME), wg::SMEM)?;
                let cfg = LaunchConfig {
                    grid_dim: (u32_of("gemm blocks", prod(&[tiles_cap, ngrp])?)?, 1, 1),
                    block_dim: (wg::THREADS, 1, 1),
                    shared_mem_bytes: u32_of("shared memory", wg::SMEM)?,
                };
                Ok((f, u32_of("column blocks", nblk)?, cfg, [u32_of("groups", ngrp)?, u32_of("column blocks", cpb)?]))
            } else if let Some(st) = pipe_stages {
                // gate+up: 128 h columns a column block; down: 256 o columns.
                let nblk = n_cols.div_ceil(if gu { pipe::BN / 2 } else { pipe::BN });
                // Tiles to expect: every active expert has one (64 / 128 rows hold its rows).
                let cpb = pipe::cols_per_cta(nblk, slots, self.caps().sms);
                let ngrp = nblk.div_ceil(cpb);
                let smem = pipe::smem(mi, st);
                let f = self.function_smem(&MOE, &format!("moe_gemm_{which}_pipe{mi}_s{st}_{}", T::NAME), smem)?;
                let cfg = LaunchConfig {
                    grid_dim: (u32_of("gemm blocks", prod(&[tiles_cap, ngrp])?)?, 1, 1),
                    block_dim: (pipe::THREADS, 1, 1),
                    shared_mem_bytes: u32_of("shared memory", smem)?,
                };
                Ok((f, u32_of("column blocks", nblk)?, cfg, [u32_of("groups", ngrp)?, u32_of("column blocks", cpb)?]))
            } else if let Some(st) = mma8_stages {
                // gate+up: 128 h columns per block; down: 256 o columns.
                let nblk = n_cols.div_ceil(if gu { MMA8_BN / 2 } else { MMA8_BN });
                let smem = st * MMA8_STAGE;
                let f = self.function_smem(&FP8, &format!("moe_gemm_{which}_fp8_mma8_{}_s{st}", T::NAME), smem)?;
                let cfg = LaunchConfig {
                    grid_dim: (u32_of("gemm blocks", prod(&[tiles_cap, nblk])?)?, 1, 1),
                    block_dim: (MMA8_THREADS, 1, 1),
                    shared_mem_bytes: u32_of("shared memory", smem)?,
                };
                Ok((f, u32_of("column blocks", nblk)?, cfg, [0, 0]))
            } else if use_mma {
                // gate+up: half the block's weight rows in h columns; down: all in o columns.
                let nc = if gu { mma_bn(mi) / 2 } else { mma_bn(mi) };
                let nblk = n_cols.div_ceil(nc);
                let smem = mma_smem(mi, esize, nc);
                let f = self.function_smem(&MOE, &format!("moe_gemm_{which}_mma{mi}_{}", T::NAME), smem)?;
                let cfg = LaunchConfig {
                    grid_dim: (u32_of("gemm blocks", prod(&[tiles_cap, nblk])?)?, 1, 1),
                    block_dim: (MMA_THREADS, 1, 1),
                    shared_mem_bytes: u32_of("shared memory", smem)?,
                };
                Ok((f, u32_of("column blocks", nblk)?, cfg, [0, 0]))
            } else if tc {
                // gate+up: 128 h columns per block; down: 256 o columns.
                let nc = if gu { TC_BN / 2 } else { TC_BN };
                let nblk = n_cols.div_ceil(nc);
                let smem = tc_smem(mi, esize, fp8, nc);
                let f = if fp8 {
                    self.function_smem(&FP8, &format!("moe_gemm_{which}_fp8_tc{mi}_{}", T::NAME), smem)?
                } else {
                    self.function_smem(&MOE, &format!("moe_gemm_{which}_tc{mi}_{}", T::NAME), smem)?
                };
                let cfg = LaunchConfig {
                    grid_dim: (u32_of("gemm blocks", prod(&[tiles_cap, nblk])?)?, 1, 1),
                    block_dim: (TC_THREADS, 1, 1),
                    shared_mem_bytes: u32_of("shared memory", smem)?,
                };
                Ok((f, u32_of("column blocks", nblk)?, cfg, [0, 0]))
            } else {
                let nblk = n_cols.div_ceil(if gu { BN / 2 } else { BN });
                let f = self.function(&MOE, &format!("moe_gemm_{which}_simt_{}", T::NAME))?;
                let cfg = LaunchConfig {
                    grid_dim: (u32_of("gemm blocks", prod(&[tiles_cap, nblk])?)?, 1, 1),
                    block_dim: (GEMM_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                Ok((f, u32_of("column blocks", nblk)?, cfg, [0, 0]))
            }
        };
        // 2b. gate+up GEMM (+ activation).
        let (f, nblk32, cfg, [ngrp32, cpb32]) = gemm(true, inter)?;
        // SAFETY: arguments match `moe_gemm_gu_<kind>_<T>`; the sorted list
        // was padded to tiles of this kernel's height (pad); tiles past the
        // real count exit (tile_expert invalid); A rows gathered through the
        // sorted list (padding reads nothing); h has cap rows; the tensor-core
        // variants (wmma, mma, pipe, wgmma: moe_wg_* also need tm <= 128, the 64 / 128 row
        // tiles of pipe::FRAGS) are only chosen with 16-byte aligned rows (hidden, inter
        // multiples of 8, base pointers checked, scratch 256-byte aligned).
        // Kernel: `moe_gemm_gu_<kind>_<T>(const T* a, const T* w0, const T* w1, const u32* sorted,
        // const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk)`; FP8:
        // `moe_gemm_gu_fp8_tc<MI>_<T>(const T* a, const u8* q0, const float* s0, const u32* rs0,
        // const u8* q1, const float* s1, const u32* rs1, const u32* sorted, const u32* tile_expert,
        // T* dst, u32 K, u32 N, u32 k, u32 nblk)` (the scale rows named by the maps exist:
        // Fp8Dev's contract).
        let tm32 = u32_of("tile rows", tile_rows)?;
        match weights {
            // wgmma (moe_wgmma.cu): `moe_wg_gu_<T>(..., u32 k, u32 ngrp, u32 cpb, u32 nblk, u32 tm)`
            // (tiles of tm = 64 / 128 rows, the pad of the sorted list).
            ExpertWeights::Dense { gate: pg, up: pu, .. } if use_wg => unsafe {
                launch_fn!(
                    self,
                    f,
                    cfg,
                    [px, pg, pu, p_sorted, p_tile, p_h, h32, i32_, k32, ngrp32, cpb32, nblk32, tm32]
                )
            },
            // Streamed: `moe_gemm_gu_pipe<MI>_s<S>_<T>(..., u32 k, u32 ngrp, u32 cpb, u32 nblk)`
            // (grid tiles_cap · ngrp, ngrp = ⌈nblk / cpb⌉).
            ExpertWeights::Dense { gate: pg, up: pu, .. } if use_pipe => unsafe {
                launch_fn!(self, f, cfg, [px, pg, pu, p_sorted, p_tile, p_h, h32, i32_, k32, ngrp32, cpb32, nblk32])
            },
            ExpertWeights::Dense { gate: pg, up: pu, .. } => unsafe {
                launch_fn!(self, f, cfg, [px, pg, pu, p_sorted, p_tile, p_h, h32, i32_, k32, nblk32])
            },
            // wgmma with FP8 experts: `moe_wg_gu_fp8_<T>(const T* a, const u8* q0, const float* s0,
            // const u32* rs0, const u8* q1, const float* s1, const u32* rs1, ..., u32 tm)` (the scale
            // rows named by the maps exist, or the maps are null: Fp8Dev's contract).
            ExpertWeights::Fp8 { gate, up, mma8: false, .. } if use_wg => unsafe {
                launch_fn!(
                    self,
                    f,
                    cfg,
                    [
                        px,
                        ptr(gate.q),
                        ptr(gate.scales),
                        ptr(gate.row_scale),
                        ptr(up.q),
                        ptr(up.scales),
                        ptr(up.row_scale),
                        p_sorted,
                        p_tile,
                        p_h,
                        h32,
                        i32_,
                        k32,
                        ngrp32,
                        cpb32,
                        nblk32,
                        tm32
                    ]
                )
            },
            // e4m3 MMA: `moe_gemm_gu_fp8_mma8_<T>_s<S>(const u8* aq, const float* as, const u8* q0,
            // const float* s0, const u32* rs0, const u8* q1, const float* s1, const u32* rs1,
            // const u32* sorted, const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk)`
            // (aq / as: x quantized above, t rows).
            ExpertWeights::Fp8 { gate, up, mma8: true, .. } => unsafe {
                launch_fn!(
                    self,
                    f,
                    cfg,
                    [
                        p_xq,
                        p_xs,
                        ptr(gate.q),
                        ptr(gate.scales),
                        ptr(gate.row_scale),
                        ptr(up.q),
                        ptr(up.scales),
                        ptr(up.row_scale),
                        p_sorted,
                        p_tile,
                        p_h,
                        h32,
                        i32_,
                        k32,
                        nblk32
                    ]
                )
            },
            ExpertWeights::Fp8 { gate, up, mma8: false, .. } => unsafe {
                launch_fn!(
                    self,
                    f,
                    cfg,
                    [
                        px,
                        ptr(gate.q),
                        ptr(gate.scales),
                        ptr(gate.row_scale),
                        ptr(up.q),
                        ptr(up.scales),
                        ptr(up.row_scale),
                        p_sorted,
                        p_tile,
                        p_h,
                        h32,
                        i32_,
                        k32,
                        nblk32
                    ]
                )
            },
        }?;
        done(1)?;
        if mma8 {
            // SAFETY: h holds cap·inter T, every row written by the gate+up GEMM (padding rows
            // with 0); hq / hs have cap·inter bytes and cap·⌈inter/128⌉ scales in the scratch.
            unsafe { self.fp8_act_quant_raw::<T>(p_h, p_hq, p_hs, cap, inter) }?;
        }
        // 3b. down GEMM.
        let (f, nblk32, cfg, [ngrp32, cpb32]) = gemm(false, hidden)?;
        // SAFETY: arguments match `moe_gemm_down_<kind>_<T>`; h rows of
        // real tiles were all written by the gate+up GEMM; o written for
        // valid pairs only.
        // Kernel: `moe_gemm_down_<kind>_<T>(const T* a, const T* w0, const T* w1, const u32* sorted,
        // const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk)`; FP8:
        // `moe_gemm_down_fp8_tc<MI>_<T>(const T* a, const u8* q, const float* s, const u32* rs,
        // const u32* sorted, const u32* tile_expert, T* dst, u32 K, u32 N, u32 k, u32 nblk)`.
        match weights {
            ExpertWeights::Dense { down: pd, .. } if use_wg => unsafe {
                launch_fn!(
                    self,
                    f,
                    cfg,
                    [p_h, pd, pd, p_sorted, p_tile, p_o, i32_, h32, k32, ngrp32, cpb32, nblk32, tm32]
                )
            },
            ExpertWeights::Dense { down: pd, .. } if use_pipe => unsafe {
                launch_fn!(self, f, cfg, [p_h, pd, pd, p_sorted, p_tile, p_o, i32_, h32, k32, ngrp32, cpb32, nblk32])
            },
            ExpertWeights::Dense { down: pd, .. } => unsafe {
                launch_fn!(self, f, cfg, [p_h, pd, pd, p_sorted, p_tile, p_o, i32_, h32, k32, nblk32])
            },
            ExpertWeights::Fp8 { down, mma8: false, .. } if use_wg => unsafe {
                launch_fn!(
                    self,
                    f,
                    cfg,
                    [
                        p_h,
                        ptr(down.q),
                        ptr(down.scales),
                        ptr(down.row_scale),
                        p_sorted,
                        p_tile,
                        p_o,
                        i32_,
                        h32,
                        k32,
                        ngrp32,
                        cpb32,
                        nblk32,
                        tm32
                    ]
                )
            },
            // e4m3 MMA: `moe_gemm_down_fp8_mma8_<T>_s<S>(const u8* aq, const float* as, const u8* q,
            // const float* s, const u32* rs, const u32* sorted, const u32* tile_expert, T* dst,
            // u32 K, u32 N, u32 k, u32 nblk)` (aq / as: h quantized above, cap rows).
            ExpertWeights::Fp8 { down, mma8: true, .. } => unsafe {
                launch_fn!(
                    self,
                    f,
                    cfg,
                    [
                        p_hq,
                        p_hs,
                        ptr(down.q),
                        ptr(down.scales),
                        ptr(down.row_scale),
                        p_sorted,
                        p_tile,
                        p_o,
                        i32_,
                        h32,
                        k32,
                        nblk32
                    ]
                )
            },
            ExpertWeights::Fp8 { down, mma8: false, .. } => unsafe {
                launch_fn!(
                    self,
                    f,
                    cfg,
                    [
                        p_h,
                        ptr(down.q),
                        ptr(down.scales),
                        ptr(down.row_scale),
                        p_sorted,
                        p_tile,
                        p_o,
                        i32_,
                        h32,
                        k32,
                        nblk32
                    ]
                )
            },
        }?;
        done(2)?;

        // 4. Combine: 8 columns a thread (16-byte loads) for 2-byte T with hidden % 8 == 0 and
        // k within the kernel's unrolled slots, else one column a thread; the same bits.
        let total = prod(&[t, hidden])?;
        let vec8 = T::NAME != "f32" && hidden.is_multiple_of(8) && k <= COMBINE_K;
        let items = if vec8 { total / 8 } else { total };
        let total64 = items as u64;
        let cfg = LaunchConfig {
            grid_dim: (grid_for(items, COMBINE_THREADS), 1, 1),
            block_dim: (COMBINE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match `moe_combine_<T>` / `moe_combine8_<T>` (total: elements, or
        // groups of 8 with hidden % 8 == 0: 16-byte aligned rows of o and out); out and idx/w
        // lengths checked; o is read only for pairs with a valid expert id, all of which the
        // down kernel wrote.
        // Kernel: `moe_combine[8]_<T>(const T* o, const u32* idx, const float* w, float* out, u64 total, u32 H,
        // u32 k, u32 e)`.
        unsafe {
            launch!(
                self,
                MOE,
                format!("moe_combine{}_{}", if vec8 { "8" } else { "" }, T::NAME),
                cfg,
                [p_o, pi, ptr(w), ptr_mut(out), total64, h32, k32, e32]
            )
        }?;
        done(3)?;
        let form = if mma8 {
            "fp8_mma8"
        } else if fp8 && use_wg {
            "fp8_wgmma"
        } else if fp8 {
            "fp8_tc"
        } else if use_wg {
            "wgmma"
        } else if use_pipe {
            "pipe"
        } else if use_mma {
            "mma"
        } else if tc {
            "wmma"
        } else {
            "simt"
        };
        Ok((form, tile_rows, nb))
    }
}

#[cfg(test)]
mod tests {
    use super::mma_smem;

    #[test]
    fn mma_smem_bytes() {
        // 4 stages of (16·mi + BN) rows × 64 bytes; the C staging area is smaller.
        assert_eq!(mma_smem(3, 2, 512), 4 * (48 + 512) * 64);
        assert_eq!(mma_smem(4, 2, 512), 147_456);
        assert!(mma_smem(1, 2, 512) > 99 * 1024, "sm_86 / sm_89: no wide tiles");
        assert_eq!(mma_smem(8, 2, 256), 4 * (128 + 256) * 64);
        assert!(mma_smem(8, 2, 256) <= 99 * 1024, "sm_86 / sm_89: tall tiles");
        assert!(mma_smem(6, 2, 256) <= 99 * 1024);
    }
}
