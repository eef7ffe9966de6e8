//! Launch wrappers of the quantized KV cache (kernels/cuda/kv_quant.cu, attention.cu): the
//! quantizing append and attention over 1-byte pools with per-(token, KV head) scales.

use super::attention::{pool_slots, Geometry, Pools};
use super::{prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, ATTENTION};
use crate::cpu::kv_quant::KvQuant;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

/// A quantized paged K/V pool pair: bytes `[n_slots, kv_heads, head_dim]` and `f32` scales
/// `[n_slots, kv_heads]` for each of K and V (see `porter_kernels::cpu::kv_quant`).
#[derive(Debug)]
pub struct QuantPools {
    pub kind: KvQuant,
    pub k: CudaSlice<u8>,
    pub v: CudaSlice<u8>,
    pub k_scale: CudaSlice<f32>,
    pub v_scale: CudaSlice<f32>,
}

impl QuantPools {
    /// Slots of the pools for rows of `kv_heads · head_dim`, checked: K and V of the same
    /// length, whole rows, scales of `n_slots · kv_heads`, at most `u32::MAX − 1` slots.
    ///
    /// # Errors
    /// [`CudaError::Invalid`] when the pools do not match.
    pub fn slots(&self, kv_heads: usize, head_dim: usize) -> Result<u32> {
        let n = pool_slots("quantized KV", self.k.len(), self.v.len(), prod(&[kv_heads, head_dim])?)?;
        let want = prod(&[n as usize, kv_heads])?;
        if self.k_scale.len() != want || self.v_scale.len() != want {
            return Err(CudaError::Invalid(format!(
                "quantized KV: scale pools of {} / {} floats for {n} slots of {kv_heads} heads",
                self.k_scale.len(),
                self.v_scale.len()
            )));
        }
        Ok(n)
    }
}

fn tag(kind: KvQuant) -> &'static str {
    match kind {
        KvQuant::Fp8 => "fp8",
        KvQuant::Int8 => "i8",
    }
}

impl CudaKernels {
    /// Quantizes new K/V rows into quantized paged pools: head `h` of row `r` goes to slot
    /// `slots[r]` as bytes with its own scale (`amax / 448` for FP8, `amax / 127` for int8,
    /// 1 for an all-zero head), bit-identical to `cpu::kv_quant::quantize_row`; a row with
    /// `slots[r] == PAD_SLOT` or beyond the pools is skipped.
    ///
    /// # Shapes
    /// - `k`, `v`: `[t, kv_heads, head_dim]` (`T`)
    /// - `slots`: `[t]` (`u32`)
    /// - `pools`: see [`QuantPools`]
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch or pools that do not match; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_append_quant<T: CudaFloat>(
        &self,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        slots: &impl DevicePtr<u32>,
        pools: &mut QuantPools,
        t: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let n = prod(&[t, kv_heads, head_dim])?;
        self.check("k", k, n)?;
        self.check("v", v, n)?;
        self.check("slots", slots, t)?;
        let n_slots = pools.slots(kv_heads, head_dim)?;
        if n == 0 {
            return Ok(());
        }
        let warps = prod(&[t, kv_heads])?;
        let threads = 128u32;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("kv_append blocks", warps.div_ceil(4))?, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (t32, h32, d32) = (u32_of("t", t)?, u32_of("kv_heads", kv_heads)?, u32_of("head_dim", head_dim)?);
        let QuantPools { kind, k: kp, v: vp, k_scale, v_scale } = pools;
        // SAFETY: arguments match `kv_append_<T>_<Q>` in kv_quant.cu; `k`, `v`, `slots` have
        // the checked lengths, the byte pools `n_slots` rows of `kv_heads · head_dim` and the
        // scale pools `n_slots · kv_heads` floats; the kernel writes only slots < n_slots, one
        // warp per (row, head) for the `t · kv_heads` warps of the grid.
        // Kernel: `kv_append_<T>_<Q>(const T* k, const T* v, const u32* slots, u8* kp, u8* vp, float* ksc,
        // float* vsc, u32 t, u32 kvh, u32 D, u32 n_slots)`.
        unsafe {
            launch!(
                self,
                ATTENTION,
                format!("kv_append_{}_{}", T::NAME, tag(*kind)),
                cfg,
                [
                    ptr(k),
                    ptr(v),
                    ptr(slots),
                    ptr_mut(kp),
                    ptr_mut(vp),
                    ptr_mut(k_scale),
                    ptr_mut(v_scale),
                    t32,
                    h32,
                    d32,
                    n_slots
                ]
            )
        }
    }

    /// [`CudaKernels::attention`] over quantized pools: the same kernels (split-K decode,
    /// the CUDA-core path, tensor cores for 16-bit prefill in [`super::AttnMode::Fast`]),
    /// with each K/V tile dequantized (`decode(q) · scale`, rounded to `T`) as it is staged
    /// in shared memory — the cache is never dequantized as a whole. Arguments, paging,
    /// batch invariance and errors as [`CudaKernels::attention`].
    ///
    /// # Shapes
    /// - `q`, `out`: `[t, heads, head_dim]` (`T`)
    /// - `pools`: [`QuantPools`] of `[n_slots, kv_heads, head_dim]` bytes
    /// - `block_tables`: `[n_seqs, max_blocks]`, `spans`: `[n_seqs, 3]` (`u32`)
    ///
    /// # Errors
    /// As [`CudaKernels::attention`], and pools that do not match ([`QuantPools::slots`]).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_quant<T: CudaFloat>(
        &self,
        q: &impl DevicePtr<T>,
        pools: &QuantPools,
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
        mode: super::AttnMode,
    ) -> Result<()> {
        let n_slots = pools.slots(kv_heads, head_dim)?;
        let st = &*self.stream;
        let (k, _gk) = pools.k.device_ptr(st);
        let (v, _gv) = pools.v.device_ptr(st);
        let (ks, _gks) = pools.k_scale.device_ptr(st);
        let (vs, _gvs) = pools.v_scale.device_ptr(st);
        let tag = match pools.kind {
            KvQuant::Fp8 => "_fp8",
            KvQuant::Int8 => "_i8",
        };
        let p = Pools { k, v, ks, vs, tag };
        // Not after an append: the quantized pools take no early loads (no V2 decode kernel).
        let geo =
            Geometry::new((max_blocks, block_size), (t, n_seqs, max_q_len), (heads, kv_heads, head_dim), scale, window);
        self.attention_pools::<T>(q, &p, n_slots, block_tables, spans, out, &geo, mode)
    }
}
