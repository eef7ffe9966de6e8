//! Launch wrappers of kernels/cuda/fp8.cu: FP8 (e4m3fn, 128 × 128 block scales) weights read
//! directly by the decode GEMV and the MoE decode GEMVs, dequantized for the prefill GEMMs, and
//! block-quantized on the device (random benchmark weights).
//!
//! A weight `W[r, c] = round_T(e4m3(q[r, c]) · scales[row_scale[r], c / 128])` (`round_T` the
//! compute dtype's rounding): the dequantization of the CPU backend (`crate::cpu::fp8`), of the
//! prefill paths and the MoE decode GEMVs. The decode GEMV ([`CudaKernels::fp8_gemv`]) computes
//! with the exact `e4m3 · scale` instead (not rounded to `T`: within half an ulp of `T` per
//! weight of the rounded one; identical for f32).

mod moe_mma;

pub use moe_mma::{Fp8MoeDec, FP8_MOE_DEC_ENV};

use super::moe::{io_ptrs, vec_ok};
use super::moe_decode::{check_dims, DecodeCall, MoeGemv, MOE_PHASES_ALL};
use super::moe_route::RouteCall;
use super::{grid_for, prod, u32_of, CudaError, CudaFloat, CudaKernels, MoeSharedDev, Result, SharedGu, FP8};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, SyncOnDrop};

/// Side of a scale block (rows and columns).
pub const FP8_BLOCK: usize = 128;

/// Environment variable choosing the FP8 decode GEMV's form for A/B runs:
/// `auto` (default: `tc` where it fits, else `fma`), `tc`, `fma` (the default before `tc`),
/// `hw`, `alu` or `legacy`, the FMA forms optionally followed by `:1`, `:2` or `:4`, the weight
/// rows a warp takes (e.g. `hw:2`; default by the row count, [`Fp8GemvForm::rows`]).
pub const FP8_GEMV_ENV: &str = "PORTER_FP8_GEMV";

/// Most rows of `x` [`CudaKernels::fp8_gemv_rows`] takes in one launch (8 groups of 8).
pub const FP8_GEMVT_MAX_ROWS: usize = 64;

/// From this many weight elements (`n · k`) on, [`Fp8GemvConv::Auto`] takes the FMA form for
/// a single row of `x` (measured faster there), the tensor-core form otherwise.
pub const FP8_GEMV_FMA_M1_MIN: usize = 16 << 20;

/// How the FP8 decode GEMV turns e4m3 bytes into products (kernels/cuda/fp8.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8GemvConv {
    /// [`Fp8GemvConv::Tc`] where it fits ([`CudaKernels::fp8_gemv_tc_fits`]) but for one row
    /// of `x` over a weight of [`FP8_GEMV_FMA_M1_MIN`] elements or more, else
    /// [`Fp8GemvConv::Fma`].
    Auto,
    /// Tensor cores (fp8_gemvt.cu): the weight rows the M side of bf16 / f16 MMAs, the rows of
    /// `x` the N side, each 128-column block's f32 partial times its scale. `W = e4m3 · scale`
    /// in f32 as the FMA forms, another summation order (other bits). bf16 / f16 `x`, sm_80+.
    Tc,
    /// The per-chunk f32 FMA kernels with rows a warp by shape ([`Fp8GemvConv::Hw`] on sm_89+,
    /// else [`Fp8GemvConv::Alu`]): the default before [`Fp8GemvConv::Tc`], and the form for f32
    /// `x` and GPUs without tensor cores.
    Fma,
    /// Scale after each 16-byte chunk's dot; e4m3 → f16 by `cvt.rn.f16x2.e4m3x2`.
    Hw,
    /// Scale after each chunk's dot; e4m3 → f16 by shifts and masks. The same bits as `Hw`.
    Alu,
    /// The older form: every weight dequantized and rounded to the activation type before its
    /// FMA (`round_T(e4m3 · s)`, the CPU backend's semantics); different bits.
    Legacy,
}

/// A form of the FP8 decode GEMV: the conversion and the weight rows per warp (`0`: the
/// default for the row count). All forms but [`Fp8GemvConv::Legacy`] give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8GemvForm {
    /// The conversion.
    pub conv: Fp8GemvConv,
    /// Weight rows a warp takes: 1, 2 or 4, or 0 for [`Fp8GemvForm::rows`]'s default.
    pub rows_per_warp: usize,
}

impl Fp8GemvForm {
    /// The default: [`Fp8GemvConv::Auto`], rows per warp by the row count.
    pub const AUTO: Self = Self { conv: Fp8GemvConv::Auto, rows_per_warp: 0 };
    /// The tensor-core form.
    pub const TC: Self = Self { conv: Fp8GemvConv::Tc, rows_per_warp: 0 };
    /// The FMA forms by shape (the default before [`Fp8GemvForm::TC`]).
    pub const FMA: Self = Self { conv: Fp8GemvConv::Fma, rows_per_warp: 0 };

    /// The form [`FP8_GEMV_ENV`] asks for ([`Fp8GemvForm::AUTO`] when unset or unknown, with
    /// a warning once).
    pub fn from_env() -> Self {
        let v = std::env::var(FP8_GEMV_ENV).ok();
        Self::parse(v.as_deref()).unwrap_or_else(|bad| {
            super::env::warn_once(
                FP8_GEMV_ENV,
                &format!(
                    "warning: {FP8_GEMV_ENV}={bad:?} is not auto, tc, fma, hw, alu or legacy (optionally :1, :2, :4); \
                     using auto"
                ),
            );
            Self::AUTO
        })
    }

    /// The form of this process ([`Fp8GemvForm::from_env`], read once).
    pub fn of_process() -> Self {
        static FORM: std::sync::OnceLock<Fp8GemvForm> = std::sync::OnceLock::new();
        *FORM.get_or_init(Fp8GemvForm::from_env)
    }

    /// Parses a value of [`FP8_GEMV_ENV`] (`Err`: the value, unknown).
    pub fn parse(v: Option<&str>) -> std::result::Result<Self, String> {
        let Some(v) = v else { return Ok(Self::AUTO) };
        let t = v.trim().to_ascii_lowercase();
        let (name, nr) = t.split_once(':').unwrap_or((&t, ""));
        let conv = match name {
            "" | "auto" => Fp8GemvConv::Auto,
            "tc" => Fp8GemvConv::Tc,
            "fma" => Fp8GemvConv::Fma,
            "hw" => Fp8GemvConv::Hw,
            "alu" => Fp8GemvConv::Alu,
            "legacy" => Fp8GemvConv::Legacy,
            _ => return Err(v.to_string()),
        };
        let rows_per_warp = match nr {
            "" => 0,
            "1" => 1,
            "2" => 2,
            "4" => 4,
            _ => return Err(v.to_string()),
        };
        Ok(Self { conv, rows_per_warp })
    }

    /// The kernel of this FMA form for `mm` (1, 2, 4 or 8) rows of `x` against `n` weight rows,
    /// and its weight rows a warp. [`Fp8GemvConv::Fma`] has kernels for every `A -> O` (at one row
    /// of `x` for 1, 2 and 4 weight rows a warp, beyond at 1 and 2); the others (A/B runs) for bf16 ->
    /// bf16 only (legacy also bf16 -> f32): the hardware conversion at 1, 2 and 4 rows a warp
    /// (at one row of `x` the default kernels, which convert in hardware on sm_89+), the integer
    /// one at 2 rows a warp (4 from 4 rows of `x`).
    fn kernel<A: CudaFloat, O: CudaFloat>(self, mm: usize, n: usize) -> Result<(String, usize)> {
        let (a, o) = (A::NAME, O::NAME);
        let nr = self.rows(mm, n);
        let bf16 = a == "bf16" && o == "bf16";
        let name = match self.conv {
            // FP8_GEMV_NR(mm) in fp8.cu: 2 weight rows a warp from 2 rows of x on.
            Fp8GemvConv::Legacy if a == "bf16" => {
                return Ok((format!("fp8_gemv_{a}_{o}_m{mm}"), if mm >= 2 { 2 } else { 1 }))
            }
            Fp8GemvConv::Fma | Fp8GemvConv::Hw if mm == 1 && (bf16 || self.conv == Fp8GemvConv::Fma) => {
                format!("fp8_gemvx_{a}_{o}_m1_r{nr}")
            }
            Fp8GemvConv::Fma if nr == 2 => format!("fp8_gemvx_{a}_{o}_m{mm}"),
            Fp8GemvConv::Fma if nr == 1 => format!("fp8_gemvx_{a}_{o}_m{mm}_r1"),
            Fp8GemvConv::Hw | Fp8GemvConv::Fma if bf16 => format!("fp8_gemvx_{a}_{o}_m{mm}_r{nr}_hw"),
            Fp8GemvConv::Alu if bf16 && matches!(self.rows_per_warp, 0 | 2 | 4) => {
                let nr = if mm >= 4 { 4 } else { 2 };
                return Ok((format!("fp8_gemvx_{a}_{o}_m{mm}_r{nr}_alu"), nr));
            }
            _ => return Err(CudaError::Invalid(format!("fp8_gemv: no {self:?} kernel for {a} -> {o} at {mm} rows"))),
        };
        Ok((name, nr))
    }

    /// Weight rows a warp takes for a launch of `mm` (1, 2, 4 or 8) rows of `x` against `n`
    /// weight rows: the set value, else at one row of `x` 4 from 4,096 weight rows on, 2 from
    /// 2,048 and 1 below (more rows a warp keep more bytes in flight, fewer keep enough warps:
    /// H200, `fp8_gemv_speed`, 2026-12-02: [12352, 2048] 10.6 / 11.7 / — µs at 4 / 2 rows a
    /// warp, [2048, 4096] 10.3 / 10.4 / 11.0 at 4 / 2 / 1, [1544, 2048] → f32 11.9 at 2 against
    /// 10.9 at 1), and from two rows of `x` on 2 from 4,096 weight rows and 1 below (same
    /// call: [12352, 2048] m = 4 21.5 / 23.1 µs at 2 / 1, [2048, 4096] m = 4 14.1 / 12.8 and
    /// m = 8 23.2 / 21.9; 4 made [2048, 4096] 31 % slower at m = 4).
    pub fn rows(self, mm: usize, n: usize) -> usize {
        match self.rows_per_warp {
            1 | 2 | 4 => self.rows_per_warp,
            _ if mm >= 2 && n >= 4096 => 2,
            _ if mm >= 2 => 1,
            _ if n >= 4096 => 4,
            _ if n >= 2048 => 2,
            _ => 1,
        }
    }
}

/// Whether a row → scale-row map is `r / 128` everywhere (one checkpoint tensor, or experts
/// stacked whose rows are whole 128-row blocks): what [`Fp8Dev::row_scale_affine`] may claim.
pub fn fp8_row_map_affine(row_scale: &[u32]) -> bool {
    row_scale.iter().enumerate().all(|(r, &s)| s as usize == r / FP8_BLOCK)
}

/// A device FP8 weight `[rows, cols]` (any leading dimensions flattened into the rows).
///
/// # Shapes
/// - `q`: `[rows, cols]` e4m3fn bytes
/// - `scales`: `[scale_rows, ceil(cols/128)]` f32, multiplied
/// - `row_scale`: `[rows]` u32, the scale row of every weight row (`r / 128` for one checkpoint
///   tensor); its values must be `< scale_rows` (trusted: checked when the weight is made), and
///   equal to `r / 128` where `row_scale_affine` says so
#[derive(Clone, Copy, Debug)]
pub struct Fp8Dev<'a> {
    /// The e4m3fn bytes.
    pub q: &'a CudaSlice<u8>,
    /// The block scales.
    pub scales: &'a CudaSlice<f32>,
    /// The scale row of each weight row.
    pub row_scale: &'a CudaSlice<u32>,
    /// Whether `row_scale[r] == r / 128` for every row ([`fp8_row_map_affine`]): the MoE decode
    /// kernels then compute the scale row instead of loading it, one dependent memory round
    /// trip less a row. `false` is always correct.
    pub row_scale_affine: bool,
    /// Weight rows.
    pub rows: usize,
    /// Row length (input features).
    pub cols: usize,
}

impl<'a> Fp8Dev<'a> {
    /// The kernel arguments `[q, scales, row_scale]` (the guards live to the launch).
    pub(super) fn args<'s>(&self, s: &'s CudaStream) -> ([u64; 3], [SyncOnDrop<'s>; 3])
    where
        'a: 's,
    {
        let ((q, gq), (sc, gs), (r, gr)) =
            (self.q.device_ptr(s), self.scales.device_ptr(s), self.row_scale.device_ptr(s));
        ([q, sc, r], [gq, gs, gr])
    }

    /// [`Fp8Dev::args`] for the MoE decode kernels (`Fp8Mat` in fp8.cu): a null row map when
    /// [`Fp8Dev::row_scale_affine`] (the kernels take `r / 128` then).
    pub(super) fn moe_args<'s>(&self, s: &'s CudaStream) -> ([u64; 3], [SyncOnDrop<'s>; 3])
    where
        'a: 's,
    {
        let (mut a, g) = self.args(s);
        if self.row_scale_affine {
            a[2] = 0;
        }
        (a, g)
    }

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

/// Tiles of 16 weight rows a block of the tensor-core FP8 GEMV (1, 2, 4 or 8; the block's 8
/// warps split the `ceil(k / 128)` scale blocks 8 / tiles ways): about 4 scale blocks a warp
/// (16 16-byte loads a lane in flight, 64 KiB a block), fewer tiles while the grid would not
/// cover every SM. From `(n, k)` and the GPU only, so a row's bits never depend on `m`.
fn fp8_gemv_tc_tiles(n: usize, k: usize, sms: usize) -> usize {
    let kb = k.div_ceil(FP8_BLOCK).max(1);
    let mut rt = 1;
    while rt < 8 && (8 / (2 * rt)) * 4 >= kb {
        rt *= 2;
    }
    while rt > 1 && n.div_ceil(16 * rt) < sms {
        rt /= 2;
    }
    rt
}

impl CudaKernels {
    /// Whether the tensor-core form of [`CudaKernels::fp8_gemv`] runs here for `A`
    /// activations: bf16 or f16, and tensor cores ([`super::DeviceCaps::tensor_cores`]).
    pub fn fp8_gemv_tc_fits<A: CudaFloat>(&self) -> bool {
        matches!(A::NAME, "bf16" | "f16") && self.caps().tensor_cores()
    }

    /// Whether [`CudaKernels::fp8_gemv`] takes this shape: `1 ≤ m ≤ 8`, `k` a multiple of 16,
    /// output `O` equal to `A` or f32.
    pub fn fp8_gemv_fits<A: CudaFloat, O: CudaFloat>(m: usize, k: usize) -> bool {
        (1..=8).contains(&m) && k > 0 && k.is_multiple_of(16) && (O::NAME == A::NAME || O::NAME == "f32")
    }

    /// Skinny GEMM `out[m, n] = x[m, k] · W[n, k]ᵀ` with an FP8 weight (`m ≤ 8`), in the
    /// form [`FP8_GEMV_ENV`] asks for (by default on tensor cores where
    /// [`CudaKernels::fp8_gemv_tc_fits`], [`Fp8GemvConv::Tc`]; else each 16-byte chunk of e4m3
    /// bytes dotted with `x` in f32 FMAs, [`Fp8GemvConv::Fma`]). Both: each 128-column block's
    /// f32 dot multiplied by its block scale once, i.e. `W = e4m3 · scale` in f32, not rounded
    /// to `A`; f32 accumulation in an order that does not depend on `m` (row-invariant), one
    /// rounding to `O`.
    ///
    /// # Shapes
    /// - `x`: `[m, k]`, `w`: `[n, k]`, `out`: `[m, n]`
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
        self.fp8_gemv_with(x, w, out, m, Fp8GemvForm::of_process())
    }

    /// [`CudaKernels::fp8_gemv`] in the form `form` (A/B runs and tests).
    ///
    /// # Shapes
    /// As [`CudaKernels::fp8_gemv`].
    ///
    /// # Errors
    /// As [`CudaKernels::fp8_gemv`].
    #[doc(hidden)]
    pub fn fp8_gemv_with<A: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
        form: Fp8GemvForm,
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
        let tc = self.fp8_gemv_tc_fits::<A>();
        let form = match form.conv {
            // One row of a large weight streams faster through the FMA form (H200, session 13:
            // [12352, 2048] 8.9 against 11.1 µs, lm_head 74.9 against 87.1); from two rows on,
            // and for the smaller weights, the tensor-core form wins (it is flat in m). The
            // choice depends on m, so a row's bits may differ between batch sizes: callers
            // that must be batch-invariant name a form ([`Fp8GemvForm::TC`]).
            Fp8GemvConv::Auto if tc && !(m == 1 && n * k >= FP8_GEMV_FMA_M1_MIN) => Fp8GemvForm::TC,
            Fp8GemvConv::Auto => Fp8GemvForm { conv: Fp8GemvConv::Fma, ..form },
            _ => form,
        };
        if form.conv == Fp8GemvConv::Tc {
            if !tc {
                return Err(CudaError::Invalid(format!("fp8_gemv: no tensor-core form for {} here", A::NAME)));
            }
            return self.launch_gemvt::<A, O>(px, w, out, m);
        }
        let (name, nr) = form.kernel::<A, O>(mm, n)?;
        let cfg = LaunchConfig {
            // 8 warps a block, nr weight rows a warp.
            grid_dim: (u32_of("blocks", n.div_ceil(8 * nr))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches fp8_gemv_<A>_<O>_m<mm> / fp8_gemvx_<A>_<O>_m<mm>[_r<nr>_<conv>] (nr
        // weight rows a warp, 8 warps a block: Fp8GemvForm::kernel); sizes and alignment
        // checked; m <= mm; the scale rows named by row_scale exist (Fp8Dev's contract).
        // Kernel: `fp8_gemv[x]_..(const u8* w, const float* sc, const u32* rs, const A* x, O* out,
        // u32 m, u32 k, u32 n)`.
        unsafe { launch!(self, FP8, name, cfg, [pq, ptr(w.scales), ptr(w.row_scale), px, ptr_mut(out), m32, k32, n32]) }
    }

    /// Whether [`CudaKernels::fp8_gemv_rows`] runs this shape here: the tensor-core form
    /// ([`CudaKernels::fp8_gemv_tc_fits`]), `1 ≤ m ≤` [`FP8_GEMVT_MAX_ROWS`], `k` a multiple of
    /// 16, output `O` equal to `A` or f32.
    pub fn fp8_gemv_rows_fits<A: CudaFloat, O: CudaFloat>(&self, m: usize, k: usize) -> bool {
        self.fp8_gemv_tc_fits::<A>() && (1..=FP8_GEMVT_MAX_ROWS).contains(&m) && Self::fp8_gemv_fits::<A, O>(1, k)
    }

    /// The tensor-core form of [`CudaKernels::fp8_gemv`] ([`Fp8GemvForm::TC`]) for up to
    /// [`FP8_GEMVT_MAX_ROWS`] rows in one launch: the rows of `x` in groups of 8, a block per
    /// (group, tile of weight rows), the groups of a tile adjacent in the launch order so that
    /// the tile is read from HBM once and from L2 for the other groups. Each row's arithmetic
    /// is that of the `m ≤ 8` launch: the same bits whatever `m` (batch-invariant). Why:
    /// decode batches of 5–32 rows took the tile-dequantizing tensor-core GEMM, 29.5 / 34.3 µs
    /// at 8 / 32 rows of `[12352, 2048]` on the H200 against 12.0 / 29.6 µs here (each group
    /// re-reads the weight tile from L2: 56.7 µs at 64 rows, where the GEMM takes 45.6).
    ///
    /// # Shapes
    /// - `x`: `[m, k]`, `w`: `[n, k]`, `out`: `[m, n]`
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if the shape does not fit ([`CudaKernels::fp8_gemv_rows_fits`]),
    /// a buffer is not 16-byte aligned, or on a length mismatch.
    pub fn fp8_gemv_rows<A: CudaFloat, O: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
    ) -> Result<()> {
        let (k, n) = (w.cols, w.rows);
        if !self.fp8_gemv_rows_fits::<A, O>(m, k) {
            return Err(CudaError::Invalid(format!(
                "fp8_gemv_rows: m {m}, k {k} ({} -> {}) does not fit here",
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
        let s = &*self.stream;
        let (px, _gx) = x.device_ptr(s);
        let (pq, _gq) = w.q.device_ptr(s);
        if (px | pq) & 15 != 0 {
            return Err(CudaError::Invalid("fp8_gemv_rows: x and w must be 16-byte aligned".into()));
        }
        self.launch_gemvt::<A, O>(px, w, out, m)
    }

    /// The launch of `fp8_gemvt_<A>_<O>` for `m ≤ 64` rows (checked by the callers: shapes,
    /// lengths, alignment, tensor cores; `px` the address of `x`).
    fn launch_gemvt<A: CudaFloat, O: CudaFloat>(
        &self,
        px: u64,
        w: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<O>,
        m: usize,
    ) -> Result<()> {
        let (k, n) = (w.cols, w.rows);
        let (pq, _gq) = w.q.device_ptr(&self.stream);
        let rt = fp8_gemv_tc_tiles(n, k, self.caps().sms);
        // Groups of 8 rows a block: 2 beyond one group with bf16 x (each converted weight
        // fragment feeds two MMAs: half the tile's L2 re-reads; f16's conversion spilled so),
        // else 1.
        let ng = if m > 8 && A::NAME == "bf16" { 2 } else { 1 };
        let blocks = n.div_ceil(16 * rt).saturating_mul(m.div_ceil(8).div_ceil(ng));
        let cfg =
            LaunchConfig { grid_dim: (u32_of("blocks", blocks)?, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (m32, k32, n32, rt32) = (u32_of("m", m)?, u32_of("k", k)?, u32_of("n", n)?, rt as u32);
        // SAFETY: matches fp8_gemvt_<A>_<O>[_g2] (8 warps, rt tiles of 16 weight rows a block, rt
        // in 1, 2, 4, 8; a block per (ng groups of 8 rows of x, tile)); sizes and alignment checked
        // by the callers; m <= 64; the scale rows named by row_scale exist (Fp8Dev's contract).
        // Kernel: `fp8_gemvt_<A>_<O>(const u8* w, const float* sc, const u32* rs, const A* x, O* out,
        // u32 m, u32 k, u32 n, u32 rt)`.
        unsafe {
            launch!(
                self,
                FP8,
                format!("fp8_gemvt_{}_{}{}", A::NAME, O::NAME, if ng == 2 { "_g2" } else { "" }),
                cfg,
                [pq, ptr(w.scales), ptr(w.row_scale), px, ptr_mut(out), m32, k32, n32, rt32]
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
        let out_at = {
            let (p, _g) = out.device_ptr_mut(&self.stream);
            p
        };
        let vec = w.cols.is_multiple_of(16) && out_at.is_multiple_of(16);
        let vec32 = i32::from(vec);
        let (r32, c32) = (u32_of("rows", w.rows)?, u32_of("cols", w.cols)?);
        // vec: a block per (row, run of 8·256 columns), capped by grid_for (the kernel strides
        // over the rest).
        let grid = if vec { grid_for(prod(&[w.rows, (w.cols / 8).div_ceil(256)])?, 1) } else { grid_for(n, 256) };
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches fp8_dequant_<T>; q and out hold rows·cols elements; 16-byte loads and
        // stores only with vec (cols % 16 == 0, q's allocation 256-byte aligned, out checked).
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
    /// per-pair arithmetic order and combine (the same kernels, kernels/cuda/moe_decode.cu,
    /// with an FP8 row reader), the weights read as e4m3 bytes and dequantized in registers.
    /// Each (row, expert) pair is computed by one warp in a fixed order whatever `t` is
    /// (batch-invariant). With [`FP8_MOE_DEC_ENV`] `=mma` (the default; beyond 40 pairs) or `=mma-all`, where
    /// [`CudaKernels::moe_fp8_mma_fits`], the tensor-core form runs instead
    /// ([`CudaKernels::moe_experts_fp8_mma`], not batch-invariant: the batch-invariant mode calls
    /// [`CudaKernels::moe_experts_fp8_with`], always the GEMV form).
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
        if Fp8MoeDec::of_process().mma_at(dims[0].saturating_mul(dims[1]))
            && self.moe_fp8_mma_fits::<T>(dims[3], dims[4])
        {
            return self.moe_experts_fp8_mma(x, idx, w, gate, up, down, out, dims);
        }
        self.moe_experts_fp8_with(x, idx, w, gate, up, down, out, dims, MoeGemv::from_env(), MOE_PHASES_ALL)
    }

    /// [`CudaKernels::moe_experts_fp8`] in the form `which`, stopping after `phases` (as
    /// [`CudaKernels::moe_decode_with`]). For timing each stage and A/B runs.
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts_fp8`].
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts`].
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_fp8_with<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        which: MoeGemv,
        phases: u32,
    ) -> Result<()> {
        self.moe_fp8_decode(x, idx, w, gate, up, down, out, dims, which, phases, None)
    }

    /// [`CudaKernels::moe_experts_fp8`] plus the shared expert `shared` (an FP8 down
    /// projection), fused into the direct decode form: as [`CudaKernels::moe_experts_shared`]
    /// for dense weights (the same kernels with the FP8 row reader; the shared down weights are
    /// dequantized as the routed ones, `round_T(e4m3 · scale)`).
    ///
    /// # Shapes
    /// As [`CudaKernels::moe_experts_fp8`]; `shared` as [`super::MoeSharedDev`] with `down` FP8
    /// `[hidden, shared.inter]`.
    ///
    /// # Errors
    /// As [`CudaKernels::moe_experts_shared`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts_fp8_shared<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        shared: &MoeSharedDev<'_, Fp8Dev<'_>>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
    ) -> Result<()> {
        self.moe_fp8_decode(x, idx, w, gate, up, down, out, dims, MoeGemv::from_env(), MOE_PHASES_ALL, Some(shared))
    }

    /// The checked body of [`CudaKernels::moe_experts_fp8_with`] and
    /// [`CudaKernels::moe_experts_fp8_shared`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_fp8_decode<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        out: &mut impl DevicePtrMut<f32>,
        dims: [usize; 5],
        which: MoeGemv,
        phases: u32,
        shared: Option<&MoeSharedDev<'_, Fp8Dev<'_>>>,
    ) -> Result<()> {
        self.moe_fp8_check(x, idx, w, gate, up, down, out, dims, shared)?;
        if dims[0] == 0 {
            return Ok(());
        }
        let (io, _gio) = io_ptrs(&self.stream, x, idx, w, out);
        self.moe_fp8_decode_at::<T>(io, gate, up, down, dims, which, phases, shared, None)
    }

    /// The argument checks of [`CudaKernels::moe_fp8_decode`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_fp8_check<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        idx: &impl DevicePtr<u32>,
        w: &impl DevicePtr<f32>,
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        out: &impl DevicePtrMut<f32>,
        dims: [usize; 5],
        shared: Option<&MoeSharedDev<'_, Fp8Dev<'_>>>,
    ) -> Result<()> {
        let [t, _, _, hidden, _] = dims;
        check_dims("moe_experts_fp8", dims)?;
        self.check_routed(x, idx, w, &gate, &up, &down, out, dims)?;
        if let Some(m) = shared {
            m.check_inputs(self, t)?;
            m.down.check(self, "shared down", hidden, m.inter)?;
            if let SharedGu::Weights(w) = m.gu {
                w.check(self, "shared gate / up", 2 * m.inter, hidden)?;
            }
        }
        Ok(())
    }

    /// [`CudaKernels::moe_fp8_decode`] after its checks, `io` the device addresses of x, idx, w
    /// and out ([`io_ptrs`]), `route` the fused router (which writes idx and w).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_fp8_decode_at<T: CudaFloat>(
        &self,
        io: [u64; 4],
        gate: Fp8Dev<'_>,
        up: Fp8Dev<'_>,
        down: Fp8Dev<'_>,
        dims: [usize; 5],
        which: MoeGemv,
        phases: u32,
        shared: Option<&MoeSharedDev<'_, Fp8Dev<'_>>>,
        route: Option<RouteCall>,
    ) -> Result<()> {
        let [_, _, _, hidden, inter] = dims;
        let s = &self.stream;
        let ((gate, _gg), (up, _gu), (down, _gd)) = (gate.moe_args(s), up.moe_args(s), down.moe_args(s));
        let [px, pi, pw, po] = io;
        let (pg, pu, pd) = (gate[0], up[0], down[0]);
        // The shared expert's addresses (0 without one; the guards live to the launch).
        let none = || (0, SyncOnDrop::Sync(None));
        let (pgl, _ggl) = match shared {
            Some(m) => m.gate.device_ptr(s),
            None => none(),
        };
        let (pgu, _ggu) = match shared.map(|m| m.gu) {
            Some(SharedGu::Cols { gu, .. }) => gu.device_ptr(s),
            _ => none(),
        };
        let none3 = || ([0; 3], [none().1, none().1, none().1]);
        let (sdown, _gsd) = match shared {
            Some(m) => m.down.moe_args(s),
            None => none3(),
        };
        let (sgu, _gsw) = match shared.map(|m| m.gu) {
            Some(SharedGu::Weights(w)) => w.moe_args(s),
            _ => none3(),
        };
        let psq = sdown[0];
        // The shared [gate; up] weight's rows (hidden e4m3 bytes) in 16-byte chunks.
        let gu_w = shared.and_then(|m| match m.gu {
            SharedGu::Weights(_) => Some((&sgu[..], hidden.is_multiple_of(16) && vec_ok::<u8>(sgu[0], hidden))),
            SharedGu::Cols { .. } => None,
        });
        let call = DecodeCall {
            src: &FP8,
            kind: "fp8_",
            tname: T::NAME,
            esize: std::mem::size_of::<T>(),
            x: px,
            idx: pi,
            w: pw,
            out: po,
            gate: &gate,
            up: &up,
            down: &down,
            // Chunks of 16 e4m3 bytes: rows of a multiple of 16 weights.
            w_vec_gu: hidden.is_multiple_of(16) && vec_ok::<u8>(pg, hidden) && vec_ok::<u8>(pu, hidden),
            w_vec_d: inter.is_multiple_of(16) && vec_ok::<u8>(pd, inter),
            dims,
            shared: shared
                .map(|m| m.call(pgu, gu_w, pgl, &sdown, m.inter.is_multiple_of(16) && vec_ok::<u8>(psq, m.inter))),
            route,
        };
        self.moe_decode_run(&call, which, phases)
    }
}

#[cfg(test)]
mod tests {
    use super::{fp8_row_map_affine, Fp8GemvConv, Fp8GemvForm};

    /// The MoE decode kernels compute the scale row as `r / 128` only where the map is that
    /// (a wrong `true` would scale rows with another block's scales).
    #[test]
    fn affine_row_maps() {
        let one: Vec<u32> = (0..300).map(|r| r / 128).collect();
        assert!(fp8_row_map_affine(&one));
        assert!(fp8_row_map_affine(&[]));
        // Two experts of 256 rows stacked: whole blocks, still r / 128.
        let stacked: Vec<u32> = (0..512).map(|r| r / 128).collect();
        assert!(fp8_row_map_affine(&stacked));
        // Two tensors of 200 rows stacked: the second starts a new scale block at row 200.
        let odd: Vec<u32> = (0..400u32).map(|r| if r < 200 { r / 128 } else { 2 + (r - 200) / 128 }).collect();
        assert!(!fp8_row_map_affine(&odd));
        // Experts sharing a bank of scales (the kernel tests' stacking).
        let bank: Vec<u32> = (0..512u32).map(|r| (r % 256) / 128).collect();
        assert!(!fp8_row_map_affine(&bank));
    }

    #[test]
    fn tc_tiles_by_shape() {
        use super::fp8_gemv_tc_tiles as t;
        // About 4 scale blocks a warp: k 2048 (16) → 2 tiles, 4096 → 1, 512 → 8.
        assert_eq!((t(12352, 2048, 132), t(2048, 4096, 132), t(151_936, 512, 132)), (2, 1, 8));
        // Fewer tiles while the grid is below the SMs: [4096, 2048] 128 blocks at 2 → 1.
        assert_eq!((t(4096, 2048, 132), t(1024, 2048, 132), t(130, 16, 132)), (1, 1, 1));
        assert_eq!(t(4096, 2048, 100), 2);
    }

    #[test]
    fn rows_a_warp_by_shape() {
        let auto = Fp8GemvForm::AUTO;
        // One row of x: 4 / 2 / 1 by the weight rows.
        assert_eq!((auto.rows(1, 12352), auto.rows(1, 2048), auto.rows(1, 1544)), (4, 2, 1));
        // From two rows of x on: 2 from 4,096 weight rows, 1 below.
        for mm in [2, 4, 8] {
            assert_eq!((auto.rows(mm, 12352), auto.rows(mm, 4096), auto.rows(mm, 2048)), (2, 2, 1));
        }
        // A set value wins.
        let set = Fp8GemvForm { conv: Fp8GemvConv::Hw, rows_per_warp: 4 };
        assert_eq!((set.rows(1, 16), set.rows(8, 16)), (4, 4));
    }
}
