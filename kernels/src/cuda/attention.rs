//! Launch wrappers of kernels/cuda/attention.cu: KV append into per-sequence
//! cache buffers, causal GQA attention over those buffers (tiled, online
//! softmax, split-K for decode, tensor cores for 16-bit prefill), and on-device
//! sampling.

use super::{ew_cfg, opt_ptr, prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, ATTENTION};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Largest `head_dim` of [`CudaKernels::attention`].
pub const ATTN_MAX_HEAD_DIM: usize = 256;

/// Threads of an attention block (`ATT_THREADS` in attention.cu).
const ATT_THREADS: u32 = 128;
/// Keys per tile (`ATT_BN`).
const ATT_BN: usize = 64;
/// Row stride of the staged P tile in floats (`ATT_PS`).
const ATT_PS: usize = ATT_BN + 16;
/// Blocks the split-K heuristic aims for (about 4 per SM of an H100/H200).
const TARGET_BLOCKS: usize = 528;
/// Most key splits of one (item tile, sequence, KV head): at most `ATT_THREADS`
/// (the combine kernel gives each split a thread).
const MAX_SPLITS: usize = ATT_THREADS as usize;
/// Threads of a tensor-core attention block (`ATC_THREADS`).
const ATC_THREADS: u32 = 128;
/// Warps of a tensor-core attention block (`ATC_WARPS`).
const ATC_WARPS: usize = 4;
/// Items (query row, head) per tensor-core attention block (`ATC_BM`).
const ATC_BM: usize = 64;
/// Keys per tensor-core K/V tile (`ATC_BN`).
const ATC_BN: usize = 64;
/// f32 row stride of a warp's S tile (`ATC_SS`).
const ATC_SS: usize = 72;
/// Row stride of a warp's P tile in elements (`ATC_PSS`).
const ATC_PSS: usize = 72;
/// Padded head dims with a tensor-core kernel (`attention_tc_<T>_d<DP>`).
const ATC_DIMS: [usize; 3] = [64, 128, 256];
/// Smallest `max_q_len` that takes the tensor-core path.
const ATC_MIN_Q: usize = 16;
/// Threads of a sampling block (`SMP_THREADS`).
const SMP_THREADS: u32 = 1024;

impl CudaKernels {
    /// Appends new K/V rows to per-sequence cache buffers: `K_s[row_pos[r]] = k[r]`,
    /// `V_s[row_pos[r]] = v[r]` with `s = row_seq[r]`.
    ///
    /// `k_ptrs[s]` / `v_ptrs[s]` are raw device addresses of sequence `s`'s
    /// buffers, laid out `[capacity, kv_heads, head_dim]` of `T`. Nothing on the
    /// device side is bounds-checked: the caller guarantees that every `row_seq`
    /// indexes `k_ptrs` / `v_ptrs` and every position is below that buffer's capacity.
    ///
    /// # Shapes
    /// - `k`, `v`: `[t, kv_heads, head_dim]` (`T`)
    /// - `row_seq`, `row_pos`: `[t]` (`u32`)
    /// - `k_ptrs`, `v_ptrs`: `[n_seqs]` (`u64` device addresses)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_append<T: CudaFloat>(
        &self,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        row_seq: &impl DevicePtr<u32>,
        row_pos: &impl DevicePtr<u32>,
        k_ptrs: &impl DevicePtr<u64>,
        v_ptrs: &impl DevicePtr<u64>,
        t: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let row_len = prod(&[kv_heads, head_dim])?;
        let n = prod(&[t, row_len])?;
        self.check("k", k, n)?;
        self.check("v", v, n)?;
        self.check("row_seq", row_seq, t)?;
        self.check("row_pos", row_pos, t)?;
        if k_ptrs.len() != v_ptrs.len() {
            return Err(CudaError::Invalid("kv_append: k_ptrs and v_ptrs differ in length".into()));
        }
        self.check("k_ptrs", k_ptrs, k_ptrs.len())?;
        self.check("v_ptrs", v_ptrs, v_ptrs.len())?;
        if n == 0 {
            return Ok(());
        }
        let (t32, rl32) = (u32_of("t", t)?, u32_of("kv_heads * head_dim", row_len)?);
        let cfg = ew_cfg(n);
        // SAFETY: arguments match `kv_append_<T>` in attention.cu; `k`, `v`,
        // `row_seq`, `row_pos` have the checked lengths; the cache addresses and
        // positions are the caller's contract (documented above).
        // Kernel: `kv_append_<T>(const T* k, const T* v, const u32* row_seq, const u32* row_pos, const u64* k_ptrs,
        // const u64* v_ptrs, u32 t, u32 row_len)`.
        unsafe {
            launch!(
                self,
                ATTENTION,
                format!("kv_append_{}", T::NAME),
                cfg,
                [ptr(k), ptr(v), ptr(row_seq), ptr(row_pos), ptr(k_ptrs), ptr(v_ptrs), t32, rl32]
            )
        }
    }

    /// Causal GQA attention of a batch of sequences over their KV caches
    /// (`cpu::ops::causal_attention` per sequence).
    ///
    /// `spans[s] = (q_row0, q_len, pos0)`: query rows `q_row0..q_row0+q_len`
    /// belong to sequence `s`; row `q_row0 + i` is at position `p = pos0 + i` and
    /// attends to keys `lo..=p` of the sequence's cache (already appended), with
    /// `lo = p + 1 − w` for `window = Some(w)` when `p + 1 > w`, else 0. Head `h`
    /// reads KV head `h / (heads / kv_heads)`. Scores, softmax and `Σ p·v` in
    /// f32, the output rounded to `T` once. `max_q_len` bounds every `q_len`
    /// (rows beyond it are not computed); every row of `q` should belong to one
    /// span (rows of no span are left unwritten, or zero / NaN on the split path).
    ///
    /// Decode (small `max_q_len`) splits each sequence's keys across blocks and
    /// merges the partials in a second pass. Prefill in bf16 / f16 (`max_q_len`
    /// at least 16, `head_dim % 16 == 0`, sm_80+) runs on tensor cores
    /// (FlashAttention-2: Q·Kᵀ and P·V as 16×16×16 MMAs with f32 accumulators,
    /// P rounded to `T`, online softmax in f32); f32 and the other launches run
    /// the CUDA-core kernels.
    ///
    /// # Shapes
    /// - `q`, `out`: `[t, heads, head_dim]` (`T`)
    /// - `k_ptrs`, `v_ptrs`: `[n_seqs]` (`u64` addresses of `[capacity, kv_heads, head_dim]` buffers of `T`)
    /// - `spans`: `[n_seqs, 3]` (`u32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch, `head_dim` of 0 or above
    /// [`ATTN_MAX_HEAD_DIM`], `heads % kv_heads != 0`, or `window == Some(0)`;
    /// driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn attention<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        k_ptrs: &impl DevicePtr<u64>,
        v_ptrs: &impl DevicePtr<u64>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        t: usize,
        n_seqs: usize,
        max_q_len: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        scale: f32,
        window: Option<usize>,
    ) -> Result<()> {
        if head_dim == 0 || head_dim > ATTN_MAX_HEAD_DIM {
            return Err(CudaError::Invalid(format!("attention: head_dim {head_dim} not in 1..={ATTN_MAX_HEAD_DIM}")));
        }
        if kv_heads == 0 || heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(CudaError::Invalid(format!("attention: heads {heads} not a multiple of kv_heads {kv_heads}")));
        }
        if window == Some(0) {
            return Err(CudaError::Invalid("attention: window must be > 0".into()));
        }
        let n = prod(&[t, heads, head_dim])?;
        self.check("q", q, n)?;
        self.check("out", out, n)?;
        self.check("k_ptrs", k_ptrs, n_seqs)?;
        self.check("v_ptrs", v_ptrs, n_seqs)?;
        self.check("spans", spans, prod(&[n_seqs, 3])?)?;
        if n == 0 || n_seqs == 0 || max_q_len == 0 {
            return Ok(());
        }
        // One grid row per (sequence, KV head) on both paths.
        let seq_heads = prod(&[n_seqs, kv_heads])?;
        if seq_heads > 65_535 {
            return Err(CudaError::Invalid(format!("attention: n_seqs * kv_heads = {seq_heads} > 65535")));
        }
        if let Some((dp, smem)) = self.tc_plan::<T>(head_dim, max_q_len)? {
            return self.attention_tc::<T>(
                q, k_ptrs, v_ptrs, spans, out, n_seqs, max_q_len, heads, kv_heads, head_dim, scale, window, dp, smem,
            );
        }
        let group = heads / kv_heads;
        let items = prod(&[max_q_len, group])?;
        let ra: usize = if items <= 8 { 1 } else { 4 };
        let bm = 8 * ra;
        let nc = head_dim.div_ceil(64);
        let ds = 64 * nc + 4;
        let tiles_m = items.div_ceil(bm);
        let base = prod(&[tiles_m, seq_heads])?;
        let nsplit = if base >= TARGET_BLOCKS / 2 { 1 } else { TARGET_BLOCKS.div_ceil(base).min(MAX_SPLITS) };
        let smem = (bm + 2 * ATT_BN) * ds * std::mem::size_of::<T>() + bm * ATT_PS * 4;
        let smem32 = u32_of("shared memory", smem)?;

        let f = self.function_smem(&ATTENTION, &format!("attention_{}_r{ra}_c{nc}", T::NAME), smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("item tiles", tiles_m)?, seq_heads as u32, nsplit as u32),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: smem32,
        };
        let (t32, h32, kvh32, d32) =
            (u32_of("t", t)?, u32_of("heads", heads)?, u32_of("kv_heads", kv_heads)?, u32_of("head_dim", head_dim)?);
        let win32 = window_arg(window);
        let ns32 = nsplit as u32;
        let part = if nsplit > 1 {
            Some(self.stream.alloc_zeros::<f32>(prod(&[nsplit, t, heads, head_dim + 2])?)?)
        } else {
            None
        };

        let s = &*self.stream;
        let (po, _go) = out.device_ptr_mut(s);
        let (ppart, _gpart) = opt_ptr(part.as_ref(), s);
        // SAFETY: arguments match `attention_<T>_r<RA>_c<NC>` in attention.cu;
        // `q`, `out`, `spans`, `k_ptrs`, `v_ptrs` have the checked lengths; the
        // partial buffer holds `nsplit * t * heads * (head_dim + 2)` floats when
        // `nsplit > 1` (null otherwise, and then never read); the dynamic shared
        // memory is the size the kernel carves (attribute raised above 48 KiB);
        // spans and cache contents are the caller's contract.
        // Kernel: `attention_<T>_r<RA>_c<NC>(const T* q, const u64* k_ptrs, const u64* v_ptrs, const u32* spans,
        // T* out, float* part, u32 t, u32 heads, u32 kvh, u32 D, float scale, u32 window, u32 nsplit)`.
        unsafe {
            launch_fn!(
                self,
                f,
                cfg,
                [ptr(q), ptr(k_ptrs), ptr(v_ptrs), ptr(spans), po, ppart, t32, h32, kvh32, d32, scale, win32, ns32]
            )
        }?;

        if let Some(p) = &part {
            let rows = prod(&[t, heads])?;
            let cfg = LaunchConfig {
                grid_dim: (u32_of("t * heads", rows)?, 1, 1),
                block_dim: (ATT_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments match `attention_combine_<T>`; the partial buffer
            // and `out` have the sizes above.
            // Kernel: `attention_combine_<T>(const float* part, T* out, u32 t, u32 heads, u32 D, u32 nsplit)`.
            unsafe {
                launch!(
                    self,
                    ATTENTION,
                    format!("attention_combine_{}", T::NAME),
                    cfg,
                    [ptr(p), po, t32, h32, d32, ns32]
                )
            }?;
        }
        Ok(())
    }

    /// The tensor-core prefill path for this launch, as (padded head dim,
    /// dynamic shared memory bytes), or `None` for the CUDA-core kernels: it
    /// needs a 16-bit `T`, `head_dim % 16 == 0`, `max_q_len >= ATC_MIN_Q`, an
    /// sm_80+ device and enough opt-in shared memory per block.
    fn tc_plan<T: CudaFloat>(&self, head_dim: usize, max_q_len: usize) -> Result<Option<(usize, usize)>> {
        if std::mem::size_of::<T>() != 2 || !head_dim.is_multiple_of(16) || max_q_len < ATC_MIN_Q {
            return Ok(None);
        }
        let sm = self.arch().strip_prefix("sm_").and_then(|n| n.parse::<u32>().ok()).unwrap_or(0);
        if sm < 80 {
            return Ok(None);
        }
        let Some(dp) = ATC_DIMS.iter().copied().find(|&d| d >= head_dim) else { return Ok(None) };
        let smem = atc_smem::<T>(dp);
        let optin = self.context().attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        if usize::try_from(optin).map_or(true, |o| smem > o) {
            return Ok(None);
        }
        Ok(Some((dp, smem)))
    }

    /// [`CudaKernels::attention`] on tensor cores (`attention_tc_<T>_d<dp>`); the
    /// arguments (and `n_seqs · kv_heads ≤ 65535`) are checked by the caller and `tc_plan`
    /// chose `dp` and `smem`.
    #[allow(clippy::too_many_arguments)]
    fn attention_tc<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        k_ptrs: &impl DevicePtr<u64>,
        v_ptrs: &impl DevicePtr<u64>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        n_seqs: usize,
        max_q_len: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        scale: f32,
        window: Option<usize>,
        dp: usize,
        smem: usize,
    ) -> Result<()> {
        let group = heads / kv_heads;
        let tiles_m = prod(&[max_q_len, group])?.div_ceil(ATC_BM);
        let seq_heads = prod(&[n_seqs, kv_heads])?;
        let f = self.function_smem(&ATTENTION, &format!("attention_tc_{}_d{dp}", T::NAME), smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("item tiles", tiles_m)?, seq_heads as u32, 1),
            block_dim: (ATC_THREADS, 1, 1),
            shared_mem_bytes: u32_of("shared memory", smem)?,
        };
        let (h32, kvh32, d32) = (u32_of("heads", heads)?, u32_of("kv_heads", kv_heads)?, u32_of("head_dim", head_dim)?);
        let win32 = window_arg(window);
        // SAFETY: arguments match `attention_tc_<T>_d<DP>` in attention.cu
        // (head_dim % 16 == 0, head_dim <= DP); `q`, `out`, `spans`, `k_ptrs`,
        // `v_ptrs` have the lengths checked by `attention`; the dynamic shared
        // memory is the size the kernel carves (attribute raised above 48 KiB,
        // within the device's opt-in limit); spans and cache contents are the
        // caller's contract.
        // Kernel: `attention_tc_<T>_d<DP>(const T* q, const u64* k_ptrs, const u64* v_ptrs, const u32* spans, T* out,
        // u32 heads, u32 kvh, u32 D, float scale, u32 window)`.
        unsafe {
            launch_fn!(
                self,
                f,
                cfg,
                [ptr(q), ptr(k_ptrs), ptr(v_ptrs), ptr(spans), ptr_mut(out), h32, kvh32, d32, scale, win32]
            )
        }
    }

    /// On-device sampling of one token per row (`porter_core::sampling::Sampler`
    /// semantics): temperature 0 → argmax (first index on ties); otherwise keep
    /// the `top_k` largest logits (ties by lower index), `p ∝ exp(l/t − max)`,
    /// keep the smallest prefix reaching mass `top_p` (at least one), renormalise
    /// and walk the kept tokens in ascending index order, returning the first
    /// where `u < Σp` (the last kept one if none).
    ///
    /// # Shapes
    /// - `logits`: `[rows, vocab]` (`f32`)
    /// - `params`: `[rows, 4]` (`f32`): temperature, top_k (0 = none), top_p
    ///   (`>= 1` = none), `u` uniform in `[0, 1)`
    /// - `out`: `[rows]` (`u32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch or `vocab == 0`; driver errors.
    pub fn sample_rows(
        &self,
        logits: &impl DevicePtr<f32>,
        params: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<u32>,
        rows: usize,
        vocab: usize,
    ) -> Result<()> {
        if vocab == 0 {
            return Err(CudaError::Invalid("sample_rows: vocab must be > 0".into()));
        }
        self.check("logits", logits, prod(&[rows, vocab])?)?;
        self.check("params", params, prod(&[rows, 4])?)?;
        self.check("out", out, rows)?;
        if rows == 0 {
            return Ok(());
        }
        let v32 = u32_of("vocab", vocab)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("rows", rows)?, 1, 1),
            block_dim: (SMP_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match `sample_rows` in attention.cu; lengths checked.
        // Kernel: `sample_rows(const float* logits, const float* params, u32* out, u32 vocab)`.
        unsafe { launch!(self, ATTENTION, "sample_rows", cfg, [ptr(logits), ptr(params), ptr_mut(out), v32]) }
    }
}

/// The kernels' `window` parameter: 0 for none; a window beyond `u32` saturates (it then
/// covers every position a cache can hold).
fn window_arg(window: Option<usize>) -> u32 {
    window.map_or(0, |w| u32::try_from(w).unwrap_or(u32::MAX))
}

/// Dynamic shared memory of `attention_tc_<T>_d<dp>` in bytes: Q tile, two K
/// and two V tiles of `dp + 8` elements a row, then per warp the f32 S tile,
/// the P tile and 16 row factors.
fn atc_smem<T>(dp: usize) -> usize {
    let t = std::mem::size_of::<T>();
    // P is kept as two tiles (P = P_hi + P_lo, see attention.cu).
    (ATC_BM + 4 * ATC_BN) * (dp + 8) * t + ATC_WARPS * 16 * (ATC_SS * 4 + 2 * ATC_PSS * t + 4)
}
