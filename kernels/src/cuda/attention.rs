//! Launch wrappers of kernels/cuda/attention.cu (with attention_tc.cu and sampling.cu, one
//! module): KV append into a paged cache pool, batch-invariant causal GQA attention over
//! that pool (tiled, online softmax, split-K at fixed key boundaries for short spans, tensor
//! cores for 16-bit prefill in [`AttnMode::Fast`]), and on-device sampling.

use super::{ew_cfg, opt_ptr, prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, ATTENTION};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

mod decode;
mod tc;
pub(crate) use decode::decode_env_selected;
#[doc(hidden)]
pub use decode::{
    force_attn_decode, force_attn_decode_early, force_attn_decode_splits, force_attn_decode_timing, DecodeTiming,
};
pub use decode::{
    AttnDecode, ATTN_DECODE_EARLY_ENV, ATTN_DECODE_ENV, ATTN_DECODE_MIN_KEYS_ENV, ATTN_DECODE_SPLITS_ENV,
};
pub use tc::{AttnTc, ATTN_TC_DEFAULT, ATTN_TC_ENV};

/// Largest `head_dim` of [`CudaKernels::attention`].
pub const ATTN_MAX_HEAD_DIM: usize = 256;

/// A `slots` entry of [`CudaKernels::kv_append`] that writes nothing (a padding row).
pub const PAD_SLOT: u32 = u32::MAX;

/// Which kernels [`CudaKernels::attention`] may use.
///
/// Every row's output is bit-identical whatever else is in the launch (other
/// sequences, their lengths, `n_seqs`, `max_q_len`, `t`) on the CUDA-core
/// kernels, which f32 always uses. `Fast` lets a bf16 / f16 launch with
/// `max_q_len >= 16` run on tensor cores instead: a row of such a launch (a
/// decode row included) is then rounded differently from the same row in a
/// launch that takes the CUDA-core kernels (within the usual 16-bit tolerance of
/// the reference). `Invariant` never uses tensor cores, so 16-bit rows are
/// bit-identical too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AttnMode {
    /// Tensor cores for 16-bit prefill launches (batch-invariant only in f32), the kernel
    /// of [`ATTN_TC_ENV`] (default [`ATTN_TC_DEFAULT`]).
    #[default]
    Fast,
    /// CUDA-core kernels only: batch-invariant in every storage type.
    Invariant,
    /// [`AttnMode::Fast`] with the tensor-core kernel given here instead of by
    /// [`ATTN_TC_ENV`] (tests, A/B timing); where it does not fit the device, the other
    /// tensor-core kernels are tried, then the CUDA cores, as for `Fast`.
    Tc(AttnTc),
}

/// Threads of an attention block (`ATT_THREADS` in attention.cu).
const ATT_THREADS: u32 = 128;
/// Keys per tile of the CUDA-core kernels (`ATT_BN`), where shared memory allows.
const ATT_BN: usize = 64;
/// The smaller key tiles attention.cu instantiates (item tile 1 only), by storage type
/// size and `NC` (head_dim / 64 rounded up): `(bytes of T, NC, BN)`.
const ATT_SMALL_TILES: [(usize, usize, usize); 5] = [(4, 2, 32), (4, 3, 32), (4, 4, 32), (4, 4, 16), (2, 4, 32)];
/// Longest `q_len` of a sequence whose keys are split across blocks (`ATT_SPLIT_Q`).
const ATT_SPLIT_Q: usize = 8;
/// Keys per split (`ATT_KS`): split `z` of a sequence covers key positions
/// `z * ATT_KS .. (z + 1) * ATT_KS`, whatever the launch.
const ATT_KS: usize = 128;
/// Threads of a sampling block (`SMP_THREADS`).
const SMP_THREADS: u32 = 1024;

/// The paged-cache arguments of the attention kernels, checked: `max_blocks`,
/// `log2(block_size)`, the pools' slot count.
#[derive(Clone, Copy)]
struct Paged {
    max_blocks: u32,
    bs_log2: u32,
    n_slots: u32,
}

impl CudaKernels {
    /// Writes new K/V rows into the paged cache pools: `k_pool[slots[r]] = k[r]`,
    /// `v_pool[slots[r]] = v[r]`; a row with `slots[r] == PAD_SLOT` (padding) is
    /// skipped, and so is one whose slot is beyond the pools (device-side check).
    ///
    /// # Shapes
    /// - `k`, `v`: `[t, kv_heads, head_dim]` (`T`)
    /// - `slots`: `[t]` (`u32`; slot = block · block_size + offset)
    /// - `k_pool`, `v_pool`: `[n_slots, kv_heads, head_dim]` (`T`), the same length
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch, pools that are not whole
    /// rows, or more than `u32::MAX` slots; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_append<T: CudaFloat>(
        &self,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        slots: &impl DevicePtr<u32>,
        k_pool: &mut impl DevicePtrMut<T>,
        v_pool: &mut impl DevicePtrMut<T>,
        t: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let row_len = prod(&[kv_heads, head_dim])?;
        let n = prod(&[t, row_len])?;
        self.check("k", k, n)?;
        self.check("v", v, n)?;
        self.check("slots", slots, t)?;
        let n_slots = pool_slots("kv_append", k_pool.len(), v_pool.len(), row_len)?;
        self.check("k_pool", k_pool, k_pool.len())?;
        self.check("v_pool", v_pool, v_pool.len())?;
        if n == 0 {
            return Ok(());
        }
        let (t32, rl32) = (u32_of("t", t)?, u32_of("kv_heads * head_dim", row_len)?);
        let cfg = ew_cfg(n);
        // SAFETY: arguments match `kv_append_<T>` in attention.cu; `k`, `v`,
        // `slots` have the checked lengths; the pools hold `n_slots` rows of
        // `row_len` and the kernel skips any slot >= `n_slots` (PAD_SLOT included).
        // Kernel: `kv_append_<T>(const T* k, const T* v, const u32* slots, T* kp, T* vp, u32 t, u32 row_len,
        // u32 n_slots)`.
        unsafe {
            launch!(
                self,
                ATTENTION,
                format!("kv_append_{}", T::NAME),
                cfg,
                [ptr(k), ptr(v), ptr(slots), ptr_mut(k_pool), ptr_mut(v_pool), t32, rl32, n_slots]
            )
        }
    }

    /// Causal GQA attention of a batch of sequences over a paged KV cache
    /// (`cpu::ops::causal_attention` per sequence).
    ///
    /// `spans[s] = (q_row0, q_len, pos0)`: query rows `q_row0..q_row0+q_len`
    /// belong to sequence `s`; row `q_row0 + i` is at position `p = pos0 + i` and
    /// attends to keys `lo..=p` of the sequence (already appended), with
    /// `lo = p + 1 − w` for `window = Some(w)` when `p + 1 > w`, else 0. Key
    /// position `j` of sequence `s` is pool row `block_tables[s · max_blocks + j /
    /// block_size] · block_size + j % block_size`. Head `h` reads KV head `h /
    /// (heads / kv_heads)`. Scores, softmax and `Σ p·v` in f32, the output rounded
    /// to `T` once. A span with `q_len == 0` is padding. `max_q_len` bounds every
    /// `q_len` (rows beyond it are not computed); every row of `q` should belong
    /// to one span (rows of no span are left unwritten). Nothing is read or
    /// written outside the buffers whatever `spans` and `block_tables` hold: rows
    /// at or beyond `t` are not computed, and keys beyond the table or the pools
    /// read as zeros.
    ///
    /// Batch invariance (see [`AttnMode`]): on the CUDA-core kernels a row's
    /// result depends only on its own sequence. A sequence with `q_len <= 8`
    /// (decode, draft verification) splits its keys at fixed positions (every 128
    /// keys) across blocks and merges the partials of a row in a second kernel, in
    /// a fixed order; longer spans are not split. `AttnMode::Fast` runs bf16 /
    /// f16 launches with `max_q_len >= 16` (`head_dim % 16 == 0`, sm_80+) on
    /// tensor cores (FlashAttention-2: Q·Kᵀ and P·V as MMAs with f32 accumulators,
    /// P kept as two `T` terms, online softmax in f32; wmma or raw mma.sync kernels,
    /// [`ATTN_TC_ENV`]). With [`ATTN_DECODE_ENV`]`=mma`, a launch with `max_q_len <= 8`
    /// outside `Invariant` (bf16 / f16, head_dim 64 / 128 / 256, sm_80+) runs the
    /// tensor-core decode kernel instead (splits fixed by each sequence's own length, so
    /// rows stay bit-identical across such launches, but rounded differently from the
    /// CUDA-core kernels). Every
    /// power-of-two `block_size` works on every path (a key tile may cross cache
    /// blocks).
    ///
    /// The split path allocates `ceil(max_blocks · block_size / 128) · n_seqs ·
    /// min(max_q_len, 8) · heads · (head_dim + 2)` f32 of scratch per call, so
    /// `max_blocks` should not be much wider than the longest sequence needs.
    ///
    /// # Shapes
    /// - `q`, `out`: `[t, heads, head_dim]` (`T`)
    /// - `k_pool`, `v_pool`: `[n_slots, kv_heads, head_dim]` (`T`), the same length
    /// - `block_tables`: `[n_seqs, max_blocks]` (`u32` physical block ids)
    /// - `spans`: `[n_seqs, 3]` (`u32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch, `head_dim` of 0 or above
    /// [`ATTN_MAX_HEAD_DIM`], `heads % kv_heads != 0`, `window == Some(0)`,
    /// `block_size` not a power of two, `max_blocks == 0`, pools that are not
    /// whole rows or hold more than `u32::MAX` slots, or `n_seqs · kv_heads >
    /// 65535`; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn attention<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        k_pool: &impl DevicePtr<T>,
        v_pool: &impl DevicePtr<T>,
        block_tables: &impl DevicePtr<u32>,
        max_blocks: usize,
        block_size: usize,
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
        mode: AttnMode,
    ) -> Result<()> {
        self.check("k_pool", k_pool, k_pool.len())?;
        self.check("v_pool", v_pool, v_pool.len())?;
        let st = &*self.stream;
        let (kp, _gk) = k_pool.device_ptr(st);
        let (vp, _gv) = v_pool.device_ptr(st);
        let geo =
            Geometry::new((max_blocks, block_size), (t, n_seqs, max_q_len), (heads, kv_heads, head_dim), scale, window);
        let pools = (kp, vp, k_pool.len(), v_pool.len());
        self.attention_plain::<T>(q, pools, block_tables, spans, out, None::<&CudaSlice<T>>, &geo, mode)
    }

    /// The decode step's pair: [`CudaKernels::kv_append`] of the new rows `k`, `v` at
    /// `slots`, then [`CudaKernels::attention`] over the pools, the same results bit for bit.
    /// Because the launch before the attention is this append, the tensor-core decode kernel
    /// (V2) reads its spans, block tables, Q and the keys before each span's first new
    /// position before its PDL wait: its start-up overlaps the append (attention_decode.cu,
    /// `ADEC_PRE`). `slots` must hold the new positions' slots (`pos0..pos0 + q_len` of each
    /// span), as the engine's step does; `q` must not be written by the append. With the
    /// attention output gate: [`CudaKernels::append_attention_gated`].
    ///
    /// # Shapes
    /// - `k`, `v`: `[t, kv_heads, head_dim]`, `slots`: `[t]`
    /// - the rest as [`CudaKernels::attention`]
    ///
    /// # Errors
    /// Those of [`CudaKernels::kv_append`] and [`CudaKernels::attention`].
    #[allow(clippy::too_many_arguments)]
    pub fn append_attention<T: CudaFloat>(
        &self,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        slots: &impl DevicePtr<u32>,
        k_pool: &mut impl DevicePtrMut<T>,
        v_pool: &mut impl DevicePtrMut<T>,
        q: &impl DevicePtr<T>,
        block_tables: &impl DevicePtr<u32>,
        (max_blocks, block_size): (usize, usize),
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        (t, n_seqs, max_q_len): (usize, usize, usize),
        (heads, kv_heads, head_dim): (usize, usize, usize),
        scale: f32,
        window: Option<usize>,
        mode: AttnMode,
    ) -> Result<()> {
        self.append_attention_gated::<T>(
            k,
            v,
            slots,
            k_pool,
            v_pool,
            q,
            block_tables,
            (max_blocks, block_size),
            spans,
            out,
            (t, n_seqs, max_q_len),
            (heads, kv_heads, head_dim),
            scale,
            window,
            mode,
            None::<&CudaSlice<T>>,
        )
    }

    /// [`CudaKernels::append_attention`] followed by the attention output gate of Qwen3-Next:
    /// with `gate`, `out = round(o · round(σ(gate)))` element-wise, `o` the attention output
    /// rounded to `T` — bit for bit `append_attention` then [`CudaKernels::sigmoid_gate_mul`]
    /// (`rows = t · heads`, `d = gate_dim = head_dim`); `None` is `append_attention`. The
    /// tensor-core decode kernels ([`ATTN_DECODE_ENV`]'s `mma*` forms: the split kernel for a
    /// row within one key split, the combine otherwise) apply the gate as they write a row,
    /// with no launch of its own; the other paths (CUDA-core, tensor-core prefill, f32)
    /// launch `sigmoid_gate_mul` over `out` after the attention. The gate is read only after
    /// the PDL wait (an earlier kernel may write it). Rows of `out` that belong to no span are
    /// unspecified (left unwritten on the fused path, gated on the others).
    ///
    /// # Shapes
    /// - `gate`: `[t, heads, head_dim]` (`T`, contiguous), the shape of `out`
    /// - the rest as [`CudaKernels::append_attention`]
    ///
    /// # Errors
    /// Those of [`CudaKernels::append_attention`], and a `gate` of another length.
    #[allow(clippy::too_many_arguments)]
    pub fn append_attention_gated<T: CudaFloat>(
        &self,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        slots: &impl DevicePtr<u32>,
        k_pool: &mut impl DevicePtrMut<T>,
        v_pool: &mut impl DevicePtrMut<T>,
        q: &impl DevicePtr<T>,
        block_tables: &impl DevicePtr<u32>,
        (max_blocks, block_size): (usize, usize),
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        (t, n_seqs, max_q_len): (usize, usize, usize),
        (heads, kv_heads, head_dim): (usize, usize, usize),
        scale: f32,
        window: Option<usize>,
        mode: AttnMode,
        gate: Option<&impl DevicePtr<T>>,
    ) -> Result<()> {
        if let Some(g) = gate {
            self.check("gate", g, prod(&[t, heads, head_dim])?)?;
        }
        self.kv_append::<T>(k, v, slots, k_pool, v_pool, t, kv_heads, head_dim)?;
        let (kn, vn) = (k_pool.len(), v_pool.len());
        let st = &*self.stream;
        let (kp, _gk) = k_pool.device_ptr_mut(st);
        let (vp, _gv) = v_pool.device_ptr_mut(st);
        let geo = Geometry {
            after_append: true,
            ..Geometry::new(
                (max_blocks, block_size),
                (t, n_seqs, max_q_len),
                (heads, kv_heads, head_dim),
                scale,
                window,
            )
        };
        self.attention_plain::<T>(q, (kp, vp, kn, vn), block_tables, spans, out, gate, &geo, mode)
    }

    /// [`CudaKernels::attention_pools_gated`] over pools of `T` given as device addresses and
    /// element counts `(k, v, k_len, v_len)`.
    #[allow(clippy::too_many_arguments)]
    fn attention_plain<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        (kp, vp, k_len, v_len): (u64, u64, usize, usize),
        block_tables: &impl DevicePtr<u32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        gate: Option<&impl DevicePtr<T>>,
        geo: &Geometry,
        mode: AttnMode,
    ) -> Result<()> {
        let n_slots = pool_slots("attention", k_len, v_len, prod(&[geo.kv_heads, geo.head_dim])?)?;
        let pools = Pools { k: kp, v: vp, ks: 0, vs: 0, tag: "" };
        self.attention_pools_gated::<T>(q, &pools, n_slots, block_tables, spans, out, gate, geo, mode)
    }

    /// The checks and dispatch of [`CudaKernels::attention`] once the pools are device
    /// addresses (`pools.tag` picks the kernels of a quantized pool; its `n_slots` checked).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_pools<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        pools: &Pools,
        n_slots: u32,
        block_tables: &impl DevicePtr<u32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        geo: &Geometry,
        mode: AttnMode,
    ) -> Result<()> {
        let none = None::<&CudaSlice<T>>;
        self.attention_pools_gated::<T>(q, pools, n_slots, block_tables, spans, out, none, geo, mode)
    }

    /// [`CudaKernels::attention_pools`] with the output gate of
    /// [`CudaKernels::append_attention_gated`] (`gate`: `[t, heads, head_dim]`, checked): fused
    /// into the tensor-core decode kernels, else [`CudaKernels::sigmoid_gate_mul`] after the
    /// attention.
    #[allow(clippy::too_many_arguments)]
    fn attention_pools_gated<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        pools: &Pools,
        n_slots: u32,
        block_tables: &impl DevicePtr<u32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        gate: Option<&impl DevicePtr<T>>,
        geo: &Geometry,
        mode: AttnMode,
    ) -> Result<()> {
        let Geometry {
            max_blocks,
            block_size,
            t,
            n_seqs,
            max_q_len,
            heads,
            kv_heads,
            head_dim,
            scale,
            window,
            after_append,
        } = *geo;
        if head_dim == 0 || head_dim > ATTN_MAX_HEAD_DIM {
            return Err(CudaError::Invalid(format!("attention: head_dim {head_dim} not in 1..={ATTN_MAX_HEAD_DIM}")));
        }
        if kv_heads == 0 || heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(CudaError::Invalid(format!("attention: heads {heads} not a multiple of kv_heads {kv_heads}")));
        }
        if window == Some(0) {
            return Err(CudaError::Invalid("attention: window must be > 0".into()));
        }
        if !block_size.is_power_of_two() {
            return Err(CudaError::Invalid(format!("attention: block_size {block_size} is not a power of two")));
        }
        if max_blocks == 0 {
            return Err(CudaError::Invalid("attention: max_blocks must be > 0".into()));
        }
        let n = prod(&[t, heads, head_dim])?;
        self.check("q", q, n)?;
        self.check("out", out, n)?;
        self.check("block_tables", block_tables, prod(&[n_seqs, max_blocks])?)?;
        self.check("spans", spans, prod(&[n_seqs, 3])?)?;
        if let Some(g) = gate {
            self.check("gate", g, n)?;
        }
        if n == 0 || n_seqs == 0 || max_q_len == 0 {
            return Ok(());
        }
        // One grid row per (sequence, KV head) on both paths.
        let seq_heads = prod(&[n_seqs, kv_heads])?;
        if seq_heads > 65_535 {
            return Err(CudaError::Invalid(format!("attention: n_seqs * kv_heads = {seq_heads} > 65535")));
        }
        let pg = Paged { max_blocks: u32_of("max_blocks", max_blocks)?, bs_log2: block_size.trailing_zeros(), n_slots };
        let a = Args { t, n_seqs, max_q_len, heads, kv_heads, head_dim, scale, window, pg, after_append };
        let aligned = pools.k.is_multiple_of(16) && pools.v.is_multiple_of(16);
        if let Some(plan) = self.decode_plan::<T>(head_dim, max_q_len, mode, pools.tag, aligned) {
            // The gate fused into the kernel that writes each row.
            return self.attention_decode::<T>(q, pools, block_tables, spans, out, gate, &a, &plan);
        }
        if let Some(plan) = self.tc_plan::<T>(head_dim, max_q_len, mode, pools.tag) {
            self.attention_tc::<T>(q, pools, block_tables, spans, out, &a, &plan)?;
        } else {
            self.attention_cc::<T>(q, pools, block_tables, spans, out, &a)?;
        }
        match gate {
            Some(g) => self.sigmoid_gate_mul::<T>(out, g, prod(&[t, heads])?, head_dim, head_dim),
            None => Ok(()),
        }
    }

    /// [`CudaKernels::attention`] on the CUDA-core kernels (`attention_<T>_r<RA>_c<NC>`,
    /// then `attention_combine_<T>` when a sequence may span several splits); the
    /// arguments are checked by the caller.
    #[allow(clippy::too_many_arguments)]
    fn attention_cc<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        pools: &Pools,
        block_tables: &impl DevicePtr<u32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        a: &Args,
    ) -> Result<()> {
        let (heads, head_dim, seq_heads) = (a.heads, a.head_dim, prod(&[a.n_seqs, a.kv_heads])?);
        let group = heads / a.kv_heads;
        let (ra, bn, smem) =
            cc_plan(std::mem::size_of::<T>(), head_dim, prod(&[a.max_q_len, group])?, self.caps().smem_limit());
        let bm = 8 * ra;
        let tiles_m = prod(&[a.max_q_len, group])?.div_ceil(bm);
        // Split-K geometry: rows of split sequences per sequence, splits of the widest table.
        let qcap = a.max_q_len.min(ATT_SPLIT_Q);
        let nz = prod(&[a.pg.max_blocks as usize, 1 << a.pg.bs_log2])?.div_ceil(ATT_KS);
        let tiles_split = prod(&[qcap, group])?.div_ceil(bm);
        let grid_x = tiles_m.max(prod(&[tiles_split, nz])?);
        let smem32 = u32_of("shared memory", smem)?;
        let nc = head_dim.div_ceil(64);
        let bs = if bn == ATT_BN { String::new() } else { format!("_n{bn}") };
        let f = self.function_smem(&ATTENTION, &format!("attention_{}{}_r{ra}_c{nc}{bs}", T::NAME, pools.tag), smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("attention blocks", grid_x)?, seq_heads as u32, 1),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: smem32,
        };
        let (t32, h32, kvh32, d32) = (
            u32_of("t", a.t)?,
            u32_of("heads", heads)?,
            u32_of("kv_heads", a.kv_heads)?,
            u32_of("head_dim", head_dim)?,
        );
        let (win32, tm32, qc32, nz32) =
            (window_arg(a.window), u32_of("item tiles", tiles_m)?, qcap as u32, u32_of("splits", nz)?);
        let Paged { max_blocks, bs_log2, n_slots } = a.pg;
        let part: Option<CudaSlice<f32>> = if nz > 1 {
            let len = prod(&[nz, a.n_seqs, qcap, heads, head_dim + 2])?;
            // SAFETY: f32 scratch; the combine kernel reads only the partials the
            // attention kernel wrote (the splits of a row that spans several).
            Some(unsafe { self.stream.alloc::<f32>(len) }?)
        } else {
            None
        };

        let s = &*self.stream;
        let (po, _go) = out.device_ptr_mut(s);
        let (ppart, _gpart) = opt_ptr(part.as_ref(), s);
        // SAFETY: arguments match `attention_<T>_r<RA>_c<NC>` in attention.cu;
        // `q`, `out`, `spans`, `block_tables` have the checked lengths and the
        // pools `n_slots` rows (the kernel reads no slot >= n_slots, no table entry
        // beyond `max_blocks`, no row >= t); the partial buffer holds
        // `nz * n_seqs * qcap * heads * (head_dim + 2)` floats when `nz > 1` (null
        // otherwise, and then never written: every row lies in split 0); the
        // dynamic shared memory is the size the kernel carves (attribute raised
        // above 48 KiB).
        // `pools` are live device addresses of pools of `n_slots` rows (bytes with
        // `[n_slots, kvh]` scales for a quantized tag, null scales otherwise).
        // Kernel: `attention_<T><Q>_r<RA>_c<NC>(const T* q, const void* kpool, const void* vpool,
        // const u32* tables, const u32* spans, T* out, float* part, u32 t, u32 heads, u32 kvh, u32 D,
        // float scale, u32 window, u32 max_blocks, u32 bs_log2, u32 n_slots, u32 tiles_m, u32 qcap, u32 nz,
        // const float* ksc, const float* vsc)`.
        unsafe {
            launch_fn!(
                self,
                f,
                cfg,
                [
                    ptr(q),
                    pools.k,
                    pools.v,
                    ptr(block_tables),
                    ptr(spans),
                    po,
                    ppart,
                    t32,
                    h32,
                    kvh32,
                    d32,
                    a.scale,
                    win32,
                    max_blocks,
                    bs_log2,
                    n_slots,
                    tm32,
                    qc32,
                    nz32,
                    pools.ks,
                    pools.vs
                ]
            )
        }?;

        if let Some(p) = &part {
            let cfg = LaunchConfig {
                grid_dim: (u32_of("qcap * heads", qcap * heads)?, a.n_seqs as u32, 1),
                block_dim: (ATT_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments match `attention_combine_<T>`; the partial buffer
            // and `out` have the sizes above (the kernel reads splits < nz and
            // writes rows < t only).
            // Kernel: `attention_combine_<T>(const float* part, const u32* spans, T* out, u32 t, u32 heads,
            // u32 D, u32 window, u32 qcap, u32 nz)`.
            unsafe {
                launch!(
                    self,
                    ATTENTION,
                    format!("attention_combine_{}", T::NAME),
                    cfg,
                    [ptr(p), ptr(spans), po, t32, h32, d32, win32, qc32, nz32]
                )
            }?;
        }
        Ok(())
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
        // SAFETY: arguments match `sample_rows` in sampling.cu; lengths checked.
        // Kernel: `sample_rows(const float* logits, const float* params, u32* out, u32 vocab)`.
        unsafe { launch!(self, ATTENTION, "sample_rows", cfg, [ptr(logits), ptr(params), ptr_mut(out), v32]) }
    }
}

/// The kernels' `window` parameter: 0 for none; a window beyond `u32` saturates (it then
/// covers every position a cache can hold).
fn window_arg(window: Option<usize>) -> u32 {
    window.map_or(0, |w| u32::try_from(w).unwrap_or(u32::MAX))
}

/// Dynamic shared memory of `attention_<T>_r<ra>_c<nc>[_n<bn>]` in bytes: the Q tile and a K
/// and a V tile of `64 * nc + 4` elements a row, the f32 P tile (`bn + 16` a row) and two
/// key-slot tables.
fn cc_smem(esz: usize, nc: usize, ra: usize, bn: usize) -> usize {
    (8 * ra + 2 * bn) * (64 * nc + 4) * esz + 8 * ra * (bn + 16) * 4 + 2 * bn * 4
}

/// The CUDA-core kernel's item tile `ra` (8·ra items), key tile `bn` and shared memory for
/// storage type size `esz`, `head_dim`, `items` = max q_len · GQA group, on a device with
/// `limit` bytes of opt-in shared memory a block. The key tile depends on the device, the
/// dtype and head_dim alone (never on the batch: batch invariance on a given device); the
/// item tile changes no item's arithmetic. When nothing fits, the 64-key plan is returned
/// and the launch reports the shortfall.
fn cc_plan(esz: usize, head_dim: usize, items: usize, limit: usize) -> (usize, usize, usize) {
    let nc = head_dim.div_ceil(64);
    if cc_smem(esz, nc, 1, ATT_BN) > limit {
        for &(e, n, bn) in &ATT_SMALL_TILES {
            if e == esz && n == nc && cc_smem(esz, nc, 1, bn) <= limit {
                return (1, bn, cc_smem(esz, nc, 1, bn));
            }
        }
        return (1, ATT_BN, cc_smem(esz, nc, 1, ATT_BN));
    }
    let ra = if items <= 8 || cc_smem(esz, nc, 4, ATT_BN) > limit { 1 } else { 4 };
    (ra, ATT_BN, cc_smem(esz, nc, ra, ATT_BN))
}

/// Device addresses of a K/V pool pair (and, quantized, its scale pools), valid for the
/// launch, and the kernel-name tag of their element type (`""`, `"_fp8"`, `"_i8"`).
pub(crate) struct Pools {
    pub k: u64,
    pub v: u64,
    /// 0 (null) for pools of the model dtype.
    pub ks: u64,
    pub vs: u64,
    pub tag: &'static str,
}

/// The launch geometry of [`CudaKernels::attention`] (its arguments after the pools).
#[derive(Clone, Copy)]
pub(crate) struct Geometry {
    pub max_blocks: usize,
    pub block_size: usize,
    pub t: usize,
    pub n_seqs: usize,
    pub max_q_len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
    /// The launch before the attention is the append of the spans' new rows
    /// ([`CudaKernels::append_attention`]): the decode kernel may read early.
    pub after_append: bool,
}

impl Geometry {
    /// `((max_blocks, block_size), (t, n_seqs, max_q_len), (heads, kv_heads, head_dim), scale,
    /// window)`, not after an append.
    pub fn new(
        (max_blocks, block_size): (usize, usize),
        (t, n_seqs, max_q_len): (usize, usize, usize),
        (heads, kv_heads, head_dim): (usize, usize, usize),
        scale: f32,
        window: Option<usize>,
    ) -> Self {
        let after_append = false;
        Geometry {
            max_blocks,
            block_size,
            t,
            n_seqs,
            max_q_len,
            heads,
            kv_heads,
            head_dim,
            scale,
            window,
            after_append,
        }
    }
}

/// The checked launch arguments of [`CudaKernels::attention`] its two paths share.
struct Args {
    t: usize,
    n_seqs: usize,
    max_q_len: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    window: Option<usize>,
    pg: Paged,
    /// [`Geometry::after_append`].
    after_append: bool,
}

/// Slots of a K/V pool pair of `k_len` / `v_len` elements with rows of `row_len`:
/// the pools must have the same length, a whole number of rows, at most `u32::MAX`.
pub(crate) fn pool_slots(what: &str, k_len: usize, v_len: usize, row_len: usize) -> Result<u32> {
    if k_len != v_len {
        return Err(CudaError::Invalid(format!("{what}: k_pool ({k_len}) and v_pool ({v_len}) differ in length")));
    }
    if row_len == 0 || !k_len.is_multiple_of(row_len) {
        return Err(CudaError::Invalid(format!("{what}: pool of {k_len} elements is not rows of {row_len}")));
    }
    u32::try_from(k_len / row_len)
        .ok()
        .filter(|&n| n < u32::MAX)
        .ok_or_else(|| CudaError::Invalid(format!("{what}: {} slots exceed u32", k_len / row_len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_core_tiles_fit_every_supported_device() {
        // The H200's 227 KiB: the 64-key tile everywhere, item tile 4 past 8 items.
        assert_eq!(cc_plan(4, 256, 64, 232_448), (4, 64, cc_smem(4, 4, 4, 64)));
        assert_eq!(cc_plan(2, 256, 8, 232_448).0, 1);
        // Every dtype and head_dim up to 256 fits 96 KiB (sm_70, the forced fallback) and
        // 64 KiB (sm_75) with some key tile.
        for limit in [98_304, 65_536] {
            for esz in [2, 4] {
                for hd in (8..=256).step_by(8) {
                    let (ra, bn, smem) = cc_plan(esz, hd, 64, limit);
                    assert!(smem <= limit, "esz {esz} head_dim {hd} limit {limit}: {smem} bytes");
                    assert_eq!(smem, cc_smem(esz, hd.div_ceil(64), ra, bn));
                    if bn != ATT_BN {
                        assert_eq!(ra, 1);
                        assert!(ATT_SMALL_TILES.contains(&(esz, hd.div_ceil(64), bn)));
                    }
                }
            }
        }
        // f32 at head_dim 256: 32 keys under 96 KiB, 16 under 64 KiB.
        assert_eq!(cc_plan(4, 256, 1, 98_304).1, 32);
        assert_eq!(cc_plan(4, 256, 1, 65_536).1, 16);
        // The key tile never depends on the batch.
        for items in [1, 8, 9, 512] {
            assert_eq!(cc_plan(4, 192, items, 98_304).1, 32);
        }
    }
}
