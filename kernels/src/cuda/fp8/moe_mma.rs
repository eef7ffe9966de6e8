//! Launch code of the tensor-core FP8 routed experts for decode batches
//! (kernels/cuda/fp8_moe_mma.cu): `moe_align`, then gate+up (`fp8_moe_mma_gu_<T>`), down
//! (`fp8_moe_mma_down_<T>`) and the combine (`moe_combine[8]_<T>`), bf16 / f16 activations on
//! sm_80+. Chosen over the GEMV form by [`FP8_MOE_DEC_ENV`] (default: beyond the direct GEMV
//! form's pairs; H200, session 12: 3.69 TB/s of FP8 weights at t = 64 against 1.25 for v1).

use super::super::moe::{align256, vec_ok, ALIGN_THREADS};
use super::super::moe_decode::{check_dims, DIRECT_MAX_PAIRS};
use super::super::{grid_for, prod, u32_of, CudaError, CudaFloat, CudaKernels, KernelArg, Result, FP8};
use super::Fp8Dev;
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Environment variable choosing the FP8 routed experts' decode form: `gemv` (the
/// moe_decode.cu GEMVs with the FP8 row reader), `mma` (or unset: the default; tensor cores,
/// [`CudaKernels::moe_experts_fp8_mma`], where [`CudaKernels::moe_fp8_mma_fits`], beyond
/// [`super::super::moe_decode::DIRECT_MAX_PAIRS`] pairs; the GEMV direct form up to it) or
/// `mma-all` (the tensor-core form at every batch). Read once per process; another value
/// warns once on stderr and means `mma`. Batch-invariant mode always takes the GEMV form.
pub const FP8_MOE_DEC_ENV: &str = "PORTER_FP8_MOE_DEC";

/// The FP8 routed experts' decode form ([`FP8_MOE_DEC_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8MoeDec {
    /// The GEMV form (CUDA cores; batch-invariant).
    Gemv,
    /// The tensor-core form (swap-AB mma.sync; not batch-invariant) beyond
    /// [`super::super::moe_decode::DIRECT_MAX_PAIRS`] pairs, the GEMV form up to it.
    Mma,
    /// The tensor-core form at every batch.
    MmaAll,
}

impl Fp8MoeDec {
    /// Parses a value of [`FP8_MOE_DEC_ENV`] (`Err`: the value, unknown).
    pub fn parse(v: Option<&str>) -> std::result::Result<Self, String> {
        match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            Some("gemv") => Ok(Self::Gemv),
            None | Some("") | Some("mma") => Ok(Self::Mma),
            Some("mma-all") => Ok(Self::MmaAll),
            Some(_) => Err(v.unwrap_or_default().to_string()),
        }
    }

    /// The form of this process ([`FP8_MOE_DEC_ENV`], read once).
    pub fn of_process() -> Self {
        static FORM: std::sync::OnceLock<Fp8MoeDec> = std::sync::OnceLock::new();
        *FORM.get_or_init(|| {
            let v = std::env::var(FP8_MOE_DEC_ENV).ok();
            Self::parse(v.as_deref()).unwrap_or_else(|bad| {
                eprintln!("warning: {FP8_MOE_DEC_ENV}={bad:?} is not gemv, mma or mma-all; using mma");
                Self::Mma
            })
        })
    }

    /// Whether this form runs the tensor-core kernels for `pairs` (row, expert) pairs.
    pub fn mma_at(self, pairs: usize) -> bool {
        match self {
            Self::Gemv => false,
            Self::Mma => pairs > DIRECT_MAX_PAIRS,
            Self::MmaAll => true,
        }
    }
}

/// Weight rows a block (`FMM_ROWS`); gate+up blocks take half of them as gate rows.
const ROWS: usize = 128;
/// Threads a block (`FMM_THREADS`).
const THREADS: u32 = 128;
/// Dynamic shared memory a block: `FMM_STAGES` stages of 128 × 128 weight bytes and 8 × 128
/// activations of 2 bytes.
const SMEM: usize = 4 * (ROWS * 128 + 8 * 128 * 2);
/// Threads a block of the combine.
const COMBINE_THREADS: u32 = 256;
/// Slots the 8-column combine kernel unrolls (`MOE_COMBINE_K` in moe.cu).
const COMBINE_K: usize = 16;

impl CudaKernels {
    /// Whether [`CudaKernels::moe_experts_fp8_mma`] runs for activations `T` and rows of
    /// `hidden` / `inter` weights: bf16 or f16, tensor cores (sm_80+, not the forced fallback),
    /// enough shared memory a block, both row lengths multiples of 16.
    pub fn moe_fp8_mma_fits<T: CudaFloat>(&self, hidden: usize, inter: usize) -> bool {
        matches!(T::NAME, "bf16" | "f16")
            && self.caps().tensor_cores()
            && self.caps().smem_limit() >= SMEM
            && hidden > 0
            && inter > 0
            && hidden.is_multiple_of(16)
            && inter.is_multiple_of(16)
    }

    /// [`CudaKernels::moe_experts_fp8`] on tensor cores (fp8_moe_mma.cu): the pairs grouped by
    /// expert (`moe_align`), each expert's weight rows the M side of bf16 / f16 MMAs against its
    /// routed rows 8 at a time, the e4m3 bytes converted exactly in registers, each 128-column
    /// block's f32 partial sum times its scale; h and o rounded to `T` as the GEMV form, the
    /// same combine. Same semantics as the GEMV form up to f32 summation order; not
    /// batch-invariant.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts_fp8`].
    ///
    /// # Errors
    /// [`CudaError::Invalid`] on a length mismatch, a shape [`CudaKernels::moe_fp8_mma_fits`]
    /// refuses or unaligned buffers; as [`CudaKernels::moe_experts`] otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_fp8_mma<T: CudaFloat>(
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
        check_dims("moe_experts_fp8_mma", dims)?;
        if !self.moe_fp8_mma_fits::<T>(hidden, inter) {
            return Err(CudaError::Invalid(format!(
                "moe_experts_fp8_mma: {} activations, hidden {hidden}, inter {inter} on this device do not fit",
                T::NAME
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
        let s = &self.stream;
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
        let es = std::mem::size_of::<T>();
        if !(vec_ok::<T>(px, hidden) && vec_ok::<u8>(pg, hidden) && vec_ok::<u8>(pu, hidden) && vec_ok::<u8>(pd, inter))
        {
            return Err(CudaError::Invalid("moe_experts_fp8_mma: x and the weights must be 16-byte aligned".into()));
        }
        let n = prod(&[t, k])?;
        let slots = e.min(n);
        // Scratch: sorted [n], tile_expert [n], seg [3·slots], meta [2] (u32, moe_align's);
        // h [n, inter], o [n, hidden] (T).
        let off_tile = align256(n * 4);
        let off_seg = off_tile + align256(n * 4);
        let off_meta = off_seg + align256(slots * 3 * 4);
        let off_h = off_meta + 256;
        let off_o = off_h + align256(prod(&[n, inter, es])?);
        let bytes = off_o + align256(prod(&[n, hidden, es])?);
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
        let args: [&dyn KernelArg; 10] = [&pi, &n32, &e32, &one, &n32, &n32, &p_sorted, &p_tile, &p_seg, &p_meta];
        unsafe { self.launch(&FP8, "moe_align", cfg, &args) }?;

        let smem32 = u32_of("shared memory", SMEM)?;
        let gu = self.function_smem(&FP8, &format!("fp8_moe_mma_gu_{}", T::NAME), SMEM)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("column blocks", inter.div_ceil(ROWS / 2))?, slots32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem32,
        };
        let args: [&dyn KernelArg; 14] =
            [&px, &pg, &pgs, &pgr, &pu, &pus, &pur, &p_sorted, &p_seg, &p_meta, &p_h, &h32, &i32_, &k32];
        // SAFETY: arguments match `fp8_moe_mma_gu_<T>(const T* x, const u8* gate, const float* gs,
        // const u32* grs, const u8* up, const float* us, const u32* urs, const u32* sorted, const u32* seg,
        // const u32* meta, T* h, u32 H, u32 I, u32 k)`; block (x, slot) reads inter columns
        // 64x.. (< I) of the slot's expert (< e, from moe_align) for its pairs (< n), rows of x
        // p / k < t; h has n rows of I; SMEM bytes of dynamic shared memory (allowed by
        // function_smem); rows 16-byte aligned (checked), FP8 scale rows exist (Fp8Dev's contract).
        unsafe { self.launch_fn(&gu, cfg, &args) }?;

        let dn = self.function_smem(&FP8, &format!("fp8_moe_mma_down_{}", T::NAME), SMEM)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("row blocks", hidden.div_ceil(ROWS))?, slots32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem32,
        };
        let args: [&dyn KernelArg; 10] = [&p_h, &pd, &pds, &pdr, &p_sorted, &p_seg, &p_meta, &p_o, &h32, &i32_];
        // SAFETY: arguments match `fp8_moe_mma_down_<T>(const T* h, const u8* down, const float* ds,
        // const u32* drs, const u32* sorted, const u32* seg, const u32* meta, T* o, u32 H, u32 I)`;
        // h written above for every valid pair (p_h + n·I·size_of T bytes ≤ off_o, 256-byte
        // aligned), o has n rows of H; otherwise as the gate+up launch.
        unsafe { self.launch_fn(&dn, cfg, &args) }?;

        let total = prod(&[t, hidden])?;
        let vec8 = hidden.is_multiple_of(8) && k <= COMBINE_K && po.is_multiple_of(16);
        let items = if vec8 { total / 8 } else { total };
        let total64 = items as u64;
        let cfg = LaunchConfig {
            grid_dim: (grid_for(items, COMBINE_THREADS), 1, 1),
            block_dim: (COMBINE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let name = format!("moe_combine{}_{}", if vec8 { "8" } else { "" }, T::NAME);
        let args: [&dyn KernelArg; 8] = [&p_o, &pi, &pw, &po, &total64, &h32, &k32, &e32];
        // SAFETY: arguments match `moe_combine[8]_<T>(const T* o, const u32* idx, const float* w,
        // float* out, u64 total, u32 H, u32 k, u32 e)` (total: elements, or groups of 8 with
        // hidden % 8 == 0 and out 16-byte aligned; o rows 16-byte aligned: hidden · 2 bytes a
        // row, 256-byte aligned base); o is read only for pairs with a valid expert id, all of
        // which the down kernel wrote; out [t, hidden] written in full.
        unsafe { self.launch(&FP8, &name, cfg, &args) }
    }
}

#[cfg(test)]
mod tests {
    use super::Fp8MoeDec;

    #[test]
    fn parses_the_switch() {
        assert_eq!(Fp8MoeDec::parse(None), Ok(Fp8MoeDec::Mma));
        assert_eq!(Fp8MoeDec::parse(Some(" MMA ")), Ok(Fp8MoeDec::Mma));
        assert_eq!(Fp8MoeDec::parse(Some("gemv")), Ok(Fp8MoeDec::Gemv));
        assert!(Fp8MoeDec::parse(Some("wgmma")).is_err());
        assert_eq!(Fp8MoeDec::parse(Some("mma-all")), Ok(Fp8MoeDec::MmaAll));
        assert!(!Fp8MoeDec::Mma.mma_at(40) && Fp8MoeDec::Mma.mma_at(41) && Fp8MoeDec::MmaAll.mma_at(1));
        assert!(!Fp8MoeDec::Gemv.mma_at(640));
    }
}
