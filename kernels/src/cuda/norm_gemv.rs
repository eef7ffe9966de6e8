//! Launch wrapper of kernels/cuda/norm_gemv.cu: the RMSNorm (or the residual add + RMSNorm)
//! before a decode projection, fused into that projection's skinny GEMV.

use super::misc::gemv_split;
use super::{prod, row_threads, u32_of, CudaError, CudaFloat, CudaKernels, Fp8Dev, Fp8GemvForm, Result, RmsNormKind};
use super::{FP8, MISC};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Environment variable: which RMSNorm (or residual add + RMSNorm) → decode GEMV pairs run as
/// one launch ([`CudaKernels::norm_gemv`], the same bits either way).
/// - `apart` (the default): never (two launches).
/// - `small`: one row into a small projection only (at most 4 M weight elements,
///   [`norm_gemv_wanted`]: the MoE input / router GEMV of the 80B, `[1544, 2048]`), the shape
///   where the fused kernel measured faster alone (session 14: 8.0 against 10.7 µs with the
///   add; session 30: 9.0 against 10.5).
/// - `fused`: every pair that fits.
///
/// Why apart: in the model the fused kernel has lost every time. H200, 24-layer 80B bf16,
/// graphs on, 2026-12-02 (docs/benchmarks.md "Session 9"), `fused` at batch 1 430.2 tok/s
/// against 445.8 apart — the fused grid of 4 blocks an SM, each normalising the rows before its
/// first weight load, streams a large weight (the in_proj) slower than the plain GEMV's full
/// grid saves in launches. Again with PDL (session 14, 2026-12-03): 452.7 against 481.1 tok/s
/// at batch 1, 824.6 against 991.9 at batch 4. And `small` alone (session 30, H100,
/// 2026-12-07): 433.7 against 445.3 tok/s (bf16), 550.4 against 554.0 (FP8); and again with
/// each block's first weight rows prefetched into L2 before its PDL wait (436.5 against 448.6,
/// reverted). The cause is not measured: the plain path's norm reads its weight before its
/// PDL wait and the GEMV runs a full grid, while every fused block normalises the row again.
/// Read on every call; an unknown value warns once and means the default (`auto` means it too).
pub const NORM_GEMV_ENV: &str = "PORTER_NORM_GEMV";

/// Which norm → GEMV pairs run fused ([`NORM_GEMV_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormGemvPolicy {
    /// Never fused (the default).
    Apart,
    /// One row into a small projection ([`norm_gemv_small`]).
    Small,
    /// Every pair the fused kernels take.
    Fused,
}

/// [`NORM_GEMV_ENV`]'s value `v` (`Err`: the value, unknown).
fn norm_policy(v: Option<&std::ffi::OsStr>) -> std::result::Result<NormGemvPolicy, String> {
    let Some(v) = v else { return Ok(NormGemvPolicy::Apart) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" | "apart" | "auto" => Ok(NormGemvPolicy::Apart),
        "small" => Ok(NormGemvPolicy::Small),
        "fused" => Ok(NormGemvPolicy::Fused),
        _ => Err(v.to_string_lossy().into_owned()),
    }
}

/// The policy [`NORM_GEMV_ENV`] asks for.
pub fn norm_gemv_policy() -> NormGemvPolicy {
    let parsed = norm_policy(std::env::var_os(NORM_GEMV_ENV).as_deref());
    super::env::one_of_or(NORM_GEMV_ENV, parsed, &["apart", "small", "fused"], "apart", NormGemvPolicy::Apart)
}

/// Largest weight (`n · k` elements) the `small` policy fuses: the 80B's MoE input GEMV
/// (`[1544, 2048]`, 3.2 M) fits, its q (`[8192, 2048]`) and in_proj (`[12352, 2048]`) do not.
pub const NORM_GEMV_SMALL_ELEMS: usize = 4 << 20;

/// Whether the `small` policy fuses `m` rows into an `[n, k]` weight: one row, at most
/// [`NORM_GEMV_SMALL_ELEMS`] weight elements.
pub fn norm_gemv_small(m: usize, n: usize, k: usize) -> bool {
    m == 1 && n.saturating_mul(k) <= NORM_GEMV_SMALL_ELEMS
}

/// Whether the backend should fuse the norm into a GEMV of `m` rows into an `[n, k]` weight
/// ([`NORM_GEMV_ENV`]; the caller checks that the kernels take the shape).
pub fn norm_gemv_wanted(m: usize, n: usize, k: usize) -> bool {
    match norm_gemv_policy() {
        NormGemvPolicy::Apart => false,
        NormGemvPolicy::Small => norm_gemv_small(m, n, k),
        NormGemvPolicy::Fused => true,
    }
}

/// Most rows [`CudaKernels::norm_gemv`] takes (its kernels exist for 1, 2 and 4).
pub const NORM_GEMV_MAX_ROWS: usize = 4;

/// Shared memory the normalised rows may take (`m · d` elements of the model dtype): the
/// default 48 KiB of a block (no opt-in needed on any GPU) less 1 KiB for the kernels' static
/// shared memory (the GEMV's and the norm's reductions, ≤ 256 bytes): dynamic + static must stay
/// within 48 KiB, else the launch fails (CUDA_ERROR_INVALID_VALUE, seen on the H200 for f32
/// rows of m = 3, k = 4096: exactly 48 KiB dynamic). A shape beyond it runs apart.
const NORM_GEMV_SMEM: usize = 47 * 1024;

/// Blocks an SM of the fused launch (each block recomputes the norm, so the grid is held to
/// a few blocks an SM and each block loops over column blocks).
const NORM_GEMV_BLOCKS_PER_SM: usize = 4;

/// Environment variable: blocks an SM of the fused launches (1–64; default
/// `NORM_GEMV_BLOCKS_PER_SM`, 4), for measuring a fuller grid against the norm each block
/// recomputes (read once; another value warns once and is ignored).
pub const NORM_GEMV_BPS_ENV: &str = "PORTER_NORM_GEMV_BPS";

/// Blocks an SM of the fused launches ([`NORM_GEMV_BPS_ENV`]).
fn norm_gemv_bps() -> usize {
    static BPS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BPS.get_or_init(|| {
        super::env_count(NORM_GEMV_BPS_ENV, |v| (1..=64).contains(&v), "a count of 1 to 64")
            .unwrap_or(NORM_GEMV_BLOCKS_PER_SM)
    })
}

/// The optional residual add of [`CudaKernels::norm_gemv`]: `y` (the model dtype or f32) is
/// added to the f32 residual `x` before the norm, and the sum is written to `sum` (a buffer of
/// its own).
#[derive(Debug)]
pub struct NormGemvAdd<'a, Y, S> {
    /// The layer output added to the residual, `[m, k]`.
    pub y: &'a Y,
    /// The new residual `x + y`, `[m, k]` f32.
    pub sum: &'a mut S,
}

impl CudaKernels {
    /// Whether [`CudaKernels::norm_gemv`] takes this shape: what [`CudaKernels::gemv`] takes,
    /// at most [`NORM_GEMV_MAX_ROWS`] rows, and the normalised rows within its shared memory.
    pub fn norm_gemv_fits<T: CudaFloat, O: CudaFloat>(m: usize, k: usize) -> bool {
        Self::gemv_fits::<T, O>(m, k)
            && m <= NORM_GEMV_MAX_ROWS
            && m.saturating_mul(k).saturating_mul(std::mem::size_of::<T>()) <= NORM_GEMV_SMEM
    }

    /// Whether [`CudaKernels::norm_fp8_gemv`] takes this shape: what [`CudaKernels::fp8_gemv`]
    /// takes at most [`NORM_GEMV_MAX_ROWS`] rows, output in `A`, the normalised rows within its
    /// shared memory, and the process on the default FP8 GEMV form or [`Fp8GemvForm::FMA`] (the
    /// fused kernels reproduce the FMA form's bits; the default tensor-core form sums in
    /// another order, so with it the fused and the separate launches differ in f32 rounding).
    pub fn norm_fp8_gemv_fits<A: CudaFloat>(m: usize, k: usize) -> bool {
        Self::fp8_gemv_fits::<A, A>(m, k)
            && m <= NORM_GEMV_MAX_ROWS
            && m.saturating_mul(k).saturating_mul(std::mem::size_of::<A>()) <= NORM_GEMV_SMEM
            && matches!(Fp8GemvForm::of_process(), Fp8GemvForm::AUTO | Fp8GemvForm::FMA)
    }

    /// `normed = rms_norm(x)` and `out = normed · Wᵀ` with an FP8 weight in one launch, bit for
    /// bit what [`CudaKernels::rms_norm`] followed by [`CudaKernels::fp8_gemv`] computes in the
    /// form [`Fp8GemvForm::FMA`] (fp8_norm.cu).
    ///
    /// # Shapes
    /// `x`: `[m, k]` f32, `norm_w`: `[k]`, `w`: `[n, k]`, `out`: `[m, n]`, `normed`: `[m, k]`
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if the shape does not fit ([`CudaKernels::norm_fp8_gemv_fits`]),
    /// the weight bytes are not 16-byte aligned, or on a length mismatch.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_fp8_gemv<A: CudaFloat>(
        &self,
        x: &impl DevicePtr<f32>,
        norm_w: &impl DevicePtr<A>,
        eps: f32,
        kind: RmsNormKind,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<A>,
        normed: &mut impl DevicePtrMut<A>,
        m: usize,
    ) -> Result<()> {
        let (k, n) = (w.cols, w.rows);
        if !Self::norm_fp8_gemv_fits::<A>(m, k) || n == 0 {
            return Err(CudaError::Invalid(format!("norm_fp8_gemv: m {m}, k {k}, n {n} ({}) does not fit", A::NAME)));
        }
        w.check(self, "w", n, k)?;
        let mk = prod(&[m, k])?;
        self.check("x", x, mk)?;
        self.check("norm_w", norm_w, k)?;
        self.check("out", out, prod(&[m, n])?)?;
        self.check("normed", normed, mk)?;
        let mm = [1usize, 2, 4].into_iter().find(|&v| v >= m).unwrap_or(4);
        let nr = Fp8GemvForm::AUTO.rows(mm, n);
        let s = &*self.stream;
        let (pq, _gq) = w.q.device_ptr(s);
        if pq & 15 != 0 {
            return Err(CudaError::Invalid("norm_fp8_gemv: the weight bytes must be 16-byte aligned".into()));
        }
        let (m32, k32, n32) = (u32_of("m", m)?, u32_of("k", k)?, u32_of("n", n)?);
        let nblk = n.div_ceil(8 * nr);
        let grid = nblk.min(norm_gemv_bps() * self.caps().sms.max(1));
        let cfg = LaunchConfig {
            grid_dim: (u32_of("blocks", grid)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: u32_of("shared memory", mk * std::mem::size_of::<A>())?,
        };
        let (nt, nblk32) = (row_threads(k, 512), u32_of("column blocks", nblk)?);
        let zc = i32::from(kind == RmsNormKind::ZeroCentred);
        // SAFETY: matches norm_fp8_gemvx_<A>_<A>_m<mm>_r<nr> (8 warps of nr weight rows a column
        // block, nblk of them; (mm, nr) one of the pairs AUTO picks, which fp8_norm.cu
        // instantiates); sizes and alignment checked; the scale rows named by row_scale exist
        // (Fp8Dev's contract); nt <= 512, a multiple of 32; dynamic shared memory holds the
        // m normalised rows.
        // Kernel: `norm_fp8_gemvx_<A>_<A>_m<mm>_r<nr>(const float* x, const A* nw, float eps, int zc,
        // u32 nt, const u8* w, const float* sc, const u32* rs, A* out, A* normed, u32 m, u32 k, u32 n,
        // u32 nblk)`.
        unsafe {
            launch!(
                self,
                FP8,
                format!("norm_fp8_gemvx_{0}_{0}_m{mm}_r{nr}", A::NAME),
                cfg,
                [
                    ptr(x),
                    ptr(norm_w),
                    eps,
                    zc,
                    nt,
                    pq,
                    ptr(w.scales),
                    ptr(w.row_scale),
                    ptr_mut(out),
                    ptr_mut(normed),
                    m32,
                    k32,
                    n32,
                    nblk32
                ]
            )
        }
    }

    /// `normed = rms_norm(x (+ y))` and `out = normed · wᵀ` in one launch (`y` in `T` or f32),
    /// bit for bit what
    /// [`CudaKernels::rms_norm`] (or [`CudaKernels::add_rms_norm`]) followed by
    /// [`CudaKernels::gemv`] computes (norm_gemv.cu explains how). With `add`, the new residual
    /// `x + y` goes to `add.sum` and `x` is left as it was.
    ///
    /// # Shapes
    /// `x`: `[m, k]` f32, `norm_w`: `[k]`, `w`: `[n, k]`, `out`: `[m, n]`, `normed`: `[m, k]`
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if the shape does not fit ([`CudaKernels::norm_gemv_fits`]), `w`
    /// or `normed` is not 16-byte aligned, or on a length mismatch.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_gemv<T: CudaFloat, O: CudaFloat, Y: CudaFloat>(
        &self,
        x: &impl DevicePtr<f32>,
        add: Option<NormGemvAdd<'_, impl DevicePtr<Y>, impl DevicePtrMut<f32>>>,
        norm_w: &impl DevicePtr<T>,
        eps: f32,
        kind: RmsNormKind,
        w: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<O>,
        normed: &mut impl DevicePtrMut<T>,
        (m, k, n): (usize, usize, usize),
    ) -> Result<()> {
        if !Self::norm_gemv_fits::<T, O>(m, k) {
            return Err(CudaError::Invalid(format!(
                "norm_gemv: m {m}, k {k} ({} -> {}) does not fit",
                T::NAME,
                O::NAME
            )));
        }
        let mk = prod(&[m, k])?;
        self.check("x", x, mk)?;
        self.check("norm_w", norm_w, k)?;
        self.check("w", w, prod(&[n, k])?)?;
        self.check("out", out, prod(&[m, n])?)?;
        self.check("normed", normed, mk)?;
        if let Some(a) = &add {
            if Y::NAME != T::NAME && Y::NAME != "f32" {
                return Err(CudaError::Invalid(format!("norm_gemv: y must be {} or f32, got {}", T::NAME, Y::NAME)));
            }
            self.check("y", a.y, mk)?;
            self.check("sum", &*a.sum, mk)?;
        }
        if n == 0 {
            return Err(CudaError::Invalid("norm_gemv: n must be > 0 (the launch also writes the norm)".into()));
        }
        let mm = [1usize, 2, 4].into_iter().find(|&v| v >= m).unwrap_or(4);
        let s = &*self.stream;
        let (pw, _gw) = w.device_ptr(s);
        if pw & 15 != 0 {
            return Err(CudaError::Invalid("norm_gemv: w must be 16-byte aligned".into()));
        }
        let (m32, k32, n32) = (u32_of("m", m)?, u32_of("k", k)?, u32_of("n", n)?);
        let split = gemv_split(n, k / (16 / std::mem::size_of::<T>()), self.caps().sms);
        let nblk = n.div_ceil(8 / split);
        let grid = nblk.min(norm_gemv_bps() * self.caps().sms.max(1));
        let cfg = LaunchConfig {
            grid_dim: (u32_of("blocks", grid)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: u32_of("shared memory", mk * std::mem::size_of::<T>())?,
        };
        // The norm kernels' threads a row, which this launch emulates (same sums, same bits).
        let nt = row_threads(k, 512);
        let (split32, nblk32) = (split as u32, u32_of("column blocks", nblk)?);
        let zc = i32::from(kind == RmsNormKind::ZeroCentred);
        match add {
            None => {
                // SAFETY: matches norm_gemv_<T>_<O>_m<mm>; sizes and alignment checked; m <= mm;
                // split 1, 2 or 4 with nblk column blocks of 8 / split; nt <= 512, a multiple of
                // 32; dynamic shared memory holds the m normalised rows.
                // Kernel: `norm_gemv_<T>_<O>_m<mm>(const float* x, const T* nw, float eps, int zc, u32 nt,
                // const T* w, O* out, T* normed, u32 m, u32 k, u32 n, u32 split, u32 nblk)`.
                unsafe {
                    launch!(
                        self,
                        MISC,
                        format!("norm_gemv_{}_{}_m{mm}", T::NAME, O::NAME),
                        cfg,
                        [
                            ptr(x),
                            ptr(norm_w),
                            eps,
                            zc,
                            nt,
                            pw,
                            ptr_mut(out),
                            ptr_mut(normed),
                            m32,
                            k32,
                            n32,
                            split32,
                            nblk32
                        ]
                    )
                }
            }
            Some(a) => {
                // SAFETY: as above, plus y [m, k] (T or f32, the kernel of its type) and sum
                // [m, k] (checked).
                // Kernel: `add_norm_gemv_<T>_<O>_m<mm>(const float* x, const T* y, const T* nw, float eps,
                // int zc, u32 nt, const T* w, O* out, T* normed, float* sum, u32 m, u32 k, u32 n, u32 split,
                // u32 nblk)`.
                unsafe {
                    launch!(
                        self,
                        MISC,
                        if Y::NAME == T::NAME {
                            format!("add_norm_gemv_{}_{}_m{mm}", T::NAME, O::NAME)
                        } else {
                            format!("add_norm_gemv_f32y_{}_{}_m{mm}", T::NAME, O::NAME)
                        },
                        cfg,
                        [
                            ptr(x),
                            ptr(a.y),
                            ptr(norm_w),
                            eps,
                            zc,
                            nt,
                            pw,
                            ptr_mut(out),
                            ptr_mut(normed),
                            ptr_mut(a.sum),
                            m32,
                            k32,
                            n32,
                            split32,
                            nblk32
                        ]
                    )
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{norm_gemv_small, norm_policy, NormGemvPolicy};
    use std::ffi::OsStr;

    #[test]
    fn env_values() {
        assert_eq!(norm_policy(None), Ok(NormGemvPolicy::Apart));
        assert_eq!(norm_policy(Some(OsStr::new(""))), Ok(NormGemvPolicy::Apart));
        assert_eq!(norm_policy(Some(OsStr::new(" Fused "))), Ok(NormGemvPolicy::Fused));
        assert_eq!(norm_policy(Some(OsStr::new("apart"))), Ok(NormGemvPolicy::Apart));
        assert_eq!(norm_policy(Some(OsStr::new("small"))), Ok(NormGemvPolicy::Small));
        assert_eq!(norm_policy(Some(OsStr::new("off"))), Err("off".to_string()));
    }

    #[test]
    fn small_takes_the_moe_input_gemv_only() {
        // The 80B's decode shapes: the MoE input GEMV fuses at one row only; q and in_proj
        // never under the default.
        assert!(norm_gemv_small(1, 1544, 2048));
        assert!(!norm_gemv_small(2, 1544, 2048));
        assert!(!norm_gemv_small(1, 8192, 2048));
        assert!(!norm_gemv_small(1, 12352, 2048));
    }

    #[test]
    fn fits_leaves_room_for_static_shared_memory() {
        use super::CudaKernels;
        // The 80B decode shapes fit; 48 KiB of f32 rows (over the default limit with the
        // static reductions beside them) do not, and run as two launches.
        assert!(CudaKernels::norm_gemv_fits::<half::bf16, half::bf16>(4, 2048));
        assert!(CudaKernels::norm_gemv_fits::<f32, f32>(2, 4096));
        assert!(!CudaKernels::norm_gemv_fits::<f32, f32>(3, 4096));
        assert!(!CudaKernels::norm_gemv_fits::<half::bf16, half::bf16>(5, 2048));
        assert!(!CudaKernels::norm_fp8_gemv_fits::<f32>(3, 4096));
    }
}
