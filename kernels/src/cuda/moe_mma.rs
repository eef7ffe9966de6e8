//! Launch code of the tensor-core routed experts for decode batches (kernels/cuda/
//! moe_dec_mma.cu, the swap-AB core shared by both weight kinds): `moe_align`, gate+up
//! (`<prefix>_gu_<T>`), down (`<prefix>_down_<T>`) and the combine (`moe_combine[8]_<T>`), for
//! dense bf16 / f16 experts ([`CudaKernels::moe_experts_mma`], chosen by [`MOE_DEC_ENV`]) and
//! FP8 experts ([`CudaKernels::moe_experts_fp8_mma`], super::fp8::moe_mma).

use super::fp8::Fp8MoeDec;
use super::moe::{align256, io_ptrs, vec_ok, Dense, ALIGN_THREADS};
use super::moe_decode::check_dims;
use super::{grid_for, prod, u32_of, CudaError, CudaFloat, CudaKernels, KernelArg, KernelSource, Result, MOE};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Environment variable choosing the dense (bf16 / f16) routed experts' decode form: `gemv`
/// (the moe_decode.cu GEMVs), `mma` (or unset: the default; tensor cores,
/// [`CudaKernels::moe_experts_mma`], where [`CudaKernels::moe_mma_fits`], beyond
/// `DIRECT_MAX_PAIRS` pairs; the GEMV forms up to it) or `mma-all` (the
/// tensor-core form at every decode batch of [`CudaKernels::moe_experts`]). Read once per
/// process; another value warns once on stderr and means `mma`. H200, session 12, 80B shapes:
/// t = 64 552.5 µs (4.18 TB/s of weights) against 683.6 for v1; the 24-layer bf16 decode at
/// batch 64 3,802 tok/s (88.8 % of the roofline) against 3,203. Batch-invariant mode
/// ([`CudaKernels::moe_experts_invariant`]) and the fused shared expert always take the GEMV
/// forms.
pub const MOE_DEC_ENV: &str = "PORTER_MOE_DEC";

/// The dense experts' decode form ([`MOE_DEC_ENV`]): the same three forms as the FP8 switch.
pub type MoeDec = Fp8MoeDec;

/// The dense experts' decode form of this process ([`MOE_DEC_ENV`], read once).
pub fn moe_dec_of_process() -> MoeDec {
    static FORM: std::sync::OnceLock<MoeDec> = std::sync::OnceLock::new();
    *FORM.get_or_init(|| MoeDec::from_env(MOE_DEC_ENV))
}

/// Weight rows a block (`MDM_ROWS`); gate+up blocks take half of them as gate rows.
const ROWS: usize = 128;
/// Threads a block (`MDM_THREADS`).
const THREADS: u32 = 128;
/// Stages of the cp.async ring (`MDM_STAGES`).
const STAGES: usize = 4;
/// Bytes of a weight row a stage (`MDM_SB`).
const STAGE_ROW_BYTES: usize = 128;
/// Threads a block of the combine.
const COMBINE_THREADS: u32 = 256;
/// Slots the 8-column combine kernel unrolls (`MOE_COMBINE_K` in moe.cu).
const COMBINE_K: usize = 16;

/// Dynamic shared memory a block of the tensor-core decode kernels for weights of `wbytes`
/// bytes an element: [`STAGES`] stages of 128 rows × [`STAGE_ROW_BYTES`] weight bytes and the
/// 8 activation rows of the stage's k (2-byte activations).
pub(super) const fn mma_smem(wbytes: usize) -> usize {
    STAGES * (ROWS * STAGE_ROW_BYTES + 8 * (STAGE_ROW_BYTES / wbytes) * 2)
}

/// Dynamic shared memory a block of the dense kernels.
const SMEM: usize = mma_smem(2);

/// Device addresses and shape of one tensor-core decode call (arguments checked by the caller).
pub(super) struct MmaCall<'a> {
    /// Module of the kernels (`MOE` for dense experts, `FP8`).
    pub src: &'static KernelSource,
    /// Prefix of the kernel names: `moe_dec_mma` (dense) or `fp8_moe_mma`.
    pub prefix: &'static str,
    /// Suffix of the kernel names: the activation type (`T::NAME`).
    pub tname: &'static str,
    /// Bytes of an activation element (`size_of::<T>()`).
    pub esize: usize,
    /// `x` `[t, hidden]`, `idx` / `w` `[t, k]`, `out` `[t, hidden]` f32.
    pub x: u64,
    pub idx: u64,
    pub w: u64,
    pub out: u64,
    /// Kernel arguments of each weight: `[q]` (dense) or `[q, scales, row_scale]` (FP8).
    pub gate: &'a [u64],
    pub up: &'a [u64],
    pub down: &'a [u64],
    /// `[t, k, e, hidden, inter]`, `t > 0`.
    pub dims: [usize; 5],
    /// Dynamic shared memory a block ([`mma_smem`]).
    pub smem: usize,
}

impl CudaKernels {
    /// Whether [`CudaKernels::moe_experts_mma`] runs for `T` experts of `hidden` / `inter`: bf16
    /// or f16, tensor cores (sm_80+, not the forced fallback), enough shared memory a block,
    /// both row lengths multiples of 8 (16-byte rows).
    pub fn moe_mma_fits<T: CudaFloat>(&self, hidden: usize, inter: usize) -> bool {
        self.mma_dec_fits::<T>(hidden, inter, 8, SMEM)
    }

    /// Whether the tensor-core decode kernels run for activations `T` (bf16 or f16, tensor
    /// cores: sm_80+, not the forced fallback), `smem` bytes of shared memory a block and
    /// `hidden` / `inter` > 0 multiples of `mult`.
    pub(super) fn mma_dec_fits<T: CudaFloat>(&self, hidden: usize, inter: usize, mult: usize, smem: usize) -> bool {
        matches!(T::NAME, "bf16" | "f16")
            && self.caps().tensor_cores()
            && self.caps().smem_limit() >= smem
            && hidden > 0
            && inter > 0
            && hidden.is_multiple_of(mult)
            && inter.is_multiple_of(mult)
    }

    /// [`CudaKernels::moe_experts`]'s decode path on tensor cores (moe_dec_mma.cu): the pairs
    /// grouped by expert (`moe_align`), each expert's weight rows the M side of bf16 / f16 MMAs
    /// against its routed rows 8 at a time, f32 accumulation over k; h and o rounded to `T` as
    /// the GEMV forms, the same combine. Same semantics as the GEMV forms up to f32 summation
    /// order; not batch-invariant. [`CudaKernels::moe_experts`] runs it where
    /// [`MOE_DEC_ENV`] asks for it.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts`].
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch, a shape [`CudaKernels::moe_mma_fits`]
    /// refuses or unaligned buffers; as [`CudaKernels::moe_experts`] otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_mma<T: CudaFloat>(
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
        let [t, _, _, hidden, inter] = dims;
        check_dims("moe_experts_mma", dims)?;
        if !self.moe_mma_fits::<T>(hidden, inter) {
            return Err(CudaError::Invalid(format!(
                "moe_experts_mma: {} experts, hidden {hidden}, inter {inter} on this device do not fit",
                T::NAME
            )));
        }
        self.check_routed(x, idx, w, &Dense(gate), &Dense(up), &Dense(down), out, dims)?;
        if t == 0 {
            return Ok(());
        }
        let s = &self.stream;
        let ((pg, _gg), (pu, _gu), (pd, _gd)) = (gate.device_ptr(s), up.device_ptr(s), down.device_ptr(s));
        let ([px, pi, pw, po], _gio) = io_ptrs(s, x, idx, w, out);
        if !(vec_ok::<T>(px, hidden) && vec_ok::<T>(pg, hidden) && vec_ok::<T>(pu, hidden) && vec_ok::<T>(pd, inter)) {
            return Err(CudaError::Invalid("moe_experts_mma: x and the weights must be 16-byte aligned".into()));
        }
        let call = MmaCall {
            src: &MOE,
            prefix: "moe_dec_mma",
            tname: T::NAME,
            esize: std::mem::size_of::<T>(),
            x: px,
            idx: pi,
            w: pw,
            out: po,
            gate: &[pg],
            up: &[pu],
            down: &[pd],
            dims,
            smem: SMEM,
        };
        self.moe_mma_run(&call)
    }

    /// The launches of a tensor-core decode call `c` (shapes, lengths and alignment checked by
    /// the caller; `t > 0`): `moe_align`, gate+up, down, combine.
    pub(super) fn moe_mma_run(&self, c: &MmaCall<'_>) -> Result<()> {
        let [t, k, e, hidden, inter] = c.dims;
        let s = &self.stream;
        let n = prod(&[t, k])?;
        let slots = e.min(n);
        // Scratch: sorted [n], tile_expert [n], seg [3·slots], meta [2] (u32, moe_align's);
        // h [n, inter], o [n, hidden] (T).
        let off_tile = align256(n * 4);
        let off_seg = off_tile + align256(n * 4);
        let off_meta = off_seg + align256(slots * 3 * 4);
        let off_h = off_meta + 256;
        let off_o = off_h + align256(prod(&[n, inter, c.esize])?);
        let bytes = off_o + align256(prod(&[n, hidden, c.esize])?);
        let (n32, e32, k32, slots32) = (u32_of("t·k", n)?, u32_of("e", e)?, u32_of("k", k)?, u32_of("slots", slots)?);
        let (h32, i32_) = (u32_of("hidden", hidden)?, u32_of("inter", inter)?);
        // SAFETY: uninitialised scratch; moe_align writes the lists (sorted: the valid pairs,
        // seg: 3 words per active slot, meta[0] the active slots) before the GEMMs read them,
        // the gate+up kernel h for every valid pair (all inter columns) before down reads it,
        // down o for every valid pair (all hidden columns) before the combine reads it.
        let mut scratch = unsafe { s.alloc::<u8>(bytes) }?;
        let (base, _gs) = scratch.device_ptr_mut(s);
        let (p_sorted, p_tile, p_seg) = (base, base + off_tile as u64, base + off_seg as u64);
        let (p_meta, p_h, p_o) = (base + off_meta as u64, base + off_h as u64, base + off_o as u64);

        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (ALIGN_THREADS, 1, 1),
            shared_mem_bytes: u32_of("shared memory", e * 4)?,
        };
        let one = 1u32;
        // SAFETY: arguments match `moe_align` (as moe_decode_run's call): pad 1, sorted and
        // tile_expert n entries, seg 3·min(e, n), meta 2; dynamic shared memory e u32.
        // Kernel: `moe_align(const u32* idx, u32 n, u32 e, u32 pad, u32 cap, u32 tiles_cap, u32* sorted,
        // u32* tile_expert, u32* seg, u32* meta)`.
        let args: [&dyn KernelArg; 10] = [&c.idx, &n32, &e32, &one, &n32, &n32, &p_sorted, &p_tile, &p_seg, &p_meta];
        unsafe { self.launch(c.src, "moe_align", cfg, &args) }?;

        let smem32 = u32_of("shared memory", c.smem)?;
        let gu = self.function_smem(c.src, &format!("{}_gu_{}", c.prefix, c.tname), c.smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("column blocks", inter.div_ceil(ROWS / 2))?, slots32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem32,
        };
        let mut args: Vec<&dyn KernelArg> = vec![&c.x];
        args.extend(c.gate.iter().map(|p| p as &dyn KernelArg));
        args.extend(c.up.iter().map(|p| p as &dyn KernelArg));
        args.extend([&p_sorted as &dyn KernelArg, &p_seg, &p_meta, &p_h, &h32, &i32_, &k32]);
        // SAFETY: arguments match `<prefix>_gu_<T>(const T* x, <gate: const T* | const u8*, const
        // float* scales, const u32* row_scale>, <up: the same>, const u32* sorted, const u32* seg,
        // const u32* meta, T* h, u32 H, u32 I, u32 k)` (moe_dec_mma.cu, fp8_moe_mma.cu); block
        // (x, slot) reads inter columns 64x.. (< I) of the slot's expert (< e, from moe_align) for
        // its pairs (< n), rows of x p / k < t; h has n rows of I; c.smem bytes of dynamic shared
        // memory (allowed by function_smem); rows 16-byte aligned (checked by the caller).
        unsafe { self.launch_fn(&gu, cfg, &args) }?;

        let dn = self.function_smem(c.src, &format!("{}_down_{}", c.prefix, c.tname), c.smem)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("row blocks", hidden.div_ceil(ROWS))?, slots32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem32,
        };
        let mut args: Vec<&dyn KernelArg> = vec![&p_h];
        args.extend(c.down.iter().map(|p| p as &dyn KernelArg));
        args.extend([&p_sorted as &dyn KernelArg, &p_seg, &p_meta, &p_o, &h32, &i32_]);
        // SAFETY: arguments match `<prefix>_down_<T>(const T* h, <down: as gate>, const u32* sorted,
        // const u32* seg, const u32* meta, T* o, u32 H, u32 I)`; h written above for every valid
        // pair (p_h + n·I·esize bytes ≤ off_o, 256-byte aligned), o has n rows of H; otherwise as
        // the gate+up launch.
        unsafe { self.launch_fn(&dn, cfg, &args) }?;

        let total = prod(&[t, hidden])?;
        let vec8 = hidden.is_multiple_of(8) && k <= COMBINE_K && c.out.is_multiple_of(16);
        let items = if vec8 { total / 8 } else { total };
        let total64 = items as u64;
        let cfg = LaunchConfig {
            grid_dim: (grid_for(items, COMBINE_THREADS), 1, 1),
            block_dim: (COMBINE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let name = format!("moe_combine{}_{}", if vec8 { "8" } else { "" }, c.tname);
        let args: [&dyn KernelArg; 8] = [&p_o, &c.idx, &c.w, &c.out, &total64, &h32, &k32, &e32];
        // SAFETY: arguments match `moe_combine[8]_<T>(const T* o, const u32* idx, const float* w,
        // float* out, u64 total, u32 H, u32 k, u32 e)` (total: elements, or groups of 8 with
        // hidden % 8 == 0 and out 16-byte aligned; o rows 16-byte aligned: hidden · 2 bytes a
        // row, hidden % 8 == 0 (fits), 256-byte aligned base); o is read only for pairs with a
        // valid expert id, all of which the down kernel wrote; out [t, hidden] written in full.
        unsafe { self.launch(c.src, &name, cfg, &args) }
    }
}

#[cfg(test)]
mod tests {
    use super::{mma_smem, MoeDec};

    #[test]
    fn dense_switch_defaults_to_mma() {
        assert_eq!(MoeDec::parse(None), Ok(MoeDec::Mma));
        assert_eq!(MoeDec::parse(Some(" MMA ")), Ok(MoeDec::Mma));
        assert_eq!(MoeDec::parse(Some("gemv")), Ok(MoeDec::Gemv));
        assert_eq!(MoeDec::parse(Some("mma-all")), Ok(MoeDec::MmaAll));
        assert!(MoeDec::parse(Some("wgmma")).is_err());
        // The kernels' shared memory: 4 × (16 KiB + 1 KiB) dense, 4 × (16 KiB + 2 KiB) FP8.
        assert_eq!((mma_smem(2), mma_smem(1)), (69632, 73728));
    }
}
