//! FP8 weights in the CUDA backend: the dispatch of GEMMs and routed experts whose weights are
//! [`DevFp8`] (e4m3 bytes + 128 × 128 block scales, `porter_kernels::cuda::fp8`).
//!
//! - **Decode** (`m ≤ FP8_GEMV_MAX_ROWS` rows), and every row count when the dtype is
//!   batch-invariant (f32, deterministic mode): the FP8 GEMV in groups of at most 8 rows, which
//!   reads the e4m3 bytes and dequantizes in registers (row-invariant arithmetic). Its
//!   tensor-core form takes up to 64 rows in one launch (`fp8_gemv_rows`): decode batches of
//!   5–64 rows (`FP8_ROWS_GEMV_MAX`; since session 15/16, the tile-dequantizing GEMM before), and
//!   the batch-invariant runs' groups.
//! - **Prefill** (and batches above the GEMV rows), by [`FP8_GEMM_ENV`] ([`Fp8Gemm`]):
//!   `dequant`: the weight is dequantized to the compute dtype into the device's scratch
//!   ([`Gpu`]'s `fp8_scratch`, grown to the largest weight, reused in stream order) and the
//!   dense cuBLAS GEMM runs on it; `tc`: the tile-dequantizing tensor-core GEMM
//!   (`fp8_gemm_tc`, no dequantized copy); `mma8`: e4m3 tensor-core MMA on activations
//!   quantized per token and 128 columns (`fp8_gemm_mma8_quant`, sm_89+; not weights-only).
//!   A path the device or shape does not take falls back: `mma8` → `tc` → `dequant`.
//! - **Routed experts**: the FP8 MoE decode GEMVs on the decode path and whenever the dtype is
//!   batch-invariant; otherwise the grouped tensor-core GEMMs dequantizing the experts' tiles
//!   in shared memory (`tc`, the default: on sm_90 the wgmma GEMMs, `moe_wg_*_fp8_*`, else the
//!   wmma ones; `PORTER_MOE_GEMM` chooses as for dense experts), the grouped e4m3 MMA GEMMs on
//!   quantized x and h (`mma8`, H100 / H200 class), or with `dequant` (or where the
//!   tensor-core GEMMs do not run: f32, below sm_80, forced fallback) all experts of the layer
//!   dequantized into the scratch and the dense grouped GEMMs; the same fallback order as
//!   above.

use crate::backend::MoeShared;
use crate::bail;
use crate::error::Result;
use crate::tensor::cuda::{alloc, cuda_err, DevBuf, DevFp8, DevType, Gpu};
use crate::tensor::dtype::DType;
use crate::tensor::{Storage, Tensor};
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cuda::{
    CudaKernels, Fp8Dev, Fp8GemvConv, Fp8GemvForm, MoeGemv, MoeRouteDev, MoeSharedDev, GEMV_MAX_ROWS, MOE_PHASES_ALL,
};

/// Environment variable choosing the FP8 prefill GEMM ([`Fp8Gemm`]): `dequant`, `tc` or
/// `mma8`; unset or empty: [`DENSE_DEFAULT`] (or [`Fp8Gemm::Tc`] up to [`DENSE_TC_MAX_ROWS`]
/// rows) for dense GEMMs, [`MOE_DEFAULT`] for the routed experts. Read on every call.
pub const FP8_GEMM_ENV: &str = "PORTER_FP8_GEMM";

/// How a prefill GEMM with an FP8 weight feeds the tensor cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Gemm {
    /// Dequantize the whole weight into scratch, then cuBLAS (dense) / the dense grouped GEMMs.
    Dequant,
    /// Tile-dequantizing tensor-core GEMMs (weights-only).
    Tc,
    /// e4m3 tensor-core MMA with per-token, per-128-column activation scales.
    Mma8,
}

/// Rows up to which a dense FP8 GEMM takes the GEMV (beyond: [`Fp8Gemm`]); `fp8_gemm_bench`
/// times the GEMV against the split-K tensor-core GEMM at 1–8 rows.
pub const FP8_GEMV_MAX_ROWS: usize = GEMV_MAX_ROWS;

/// Dense GEMMs of more than [`FP8_GEMV_MAX_ROWS`] and at most this many rows take the
/// tensor-core FP8 GEMV in one launch (`fp8_gemv_rows`: row groups of 8, two a block beyond 8
/// rows with bf16 x). Measured on the H200 (2026-12-04, `cuda_fp8_rows` `fp8_gemv_rows_speed`,
/// µs at 8 / 16 / 32 / 64 rows, the two-group GEMV against the tile-dequantizing GEMM):
/// `[12352, 2048]` 12.0 / 14.7 / 21.9 / 38.9 against 29.4 / 30.9 / 34.3 / 45.5; `[2048, 4096]`
/// 5.6 / 6.6 / 8.0 / 14.3 against 11.8 / 12.1 / 12.8 / 17.2; FP8 decode at batch 64 (48 layers)
/// 2,787 against 2,646 tok/s. (One group a block, session 15, lost at 64 rows: 56.7 µs.)
pub const FP8_ROWS_GEMV_MAX: usize = 64;

/// Environment variable: the most rows (5–64) a dense FP8 GEMM takes the row-group GEMV for,
/// instead of [`FP8_ROWS_GEMV_MAX`] (A/B runs; read once; another value warns once and is
/// ignored).
pub const FP8_ROWS_GEMV_ENV: &str = "PORTER_FP8_GEMV_ROWS";

/// [`FP8_ROWS_GEMV_MAX`], or the value of [`FP8_ROWS_GEMV_ENV`].
fn rows_gemv_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let rows = FP8_GEMV_MAX_ROWS..=porter_kernels::cuda::FP8_GEMVT_MAX_ROWS;
        let expected = format!("a row count in {}..={}", rows.start(), rows.end());
        porter_kernels::cuda::env_count(FP8_ROWS_GEMV_ENV, |r| rows.contains(&r), &expected)
            .unwrap_or(FP8_ROWS_GEMV_MAX)
    })
}

/// Dense GEMMs above [`DENSE_TC_MAX_ROWS`] rows when [`FP8_GEMM_ENV`] is unset: the path
/// measured fastest on the H200 (docs/architecture.md §6.1).
pub const DENSE_DEFAULT: Fp8Gemm = Fp8Gemm::Dequant;
/// Dense GEMMs of more than [`FP8_GEMV_MAX_ROWS`] and at most this many rows take
/// [`Fp8Gemm::Tc`] when [`FP8_GEMM_ENV`] is unset (where dequantizing the whole weight costs
/// more than the GEMM); `None`: [`DENSE_DEFAULT`] for every row count. Measured on the H100
/// (2026-12-07, `fp8_gemm_bench`, after `fp8_dequant` went from 272 to 31 µs for
/// `[12288, 2048]`): `[m, 2048] × [12288, 2048]ᵀ` tile-dequant 45.9 / 94.5 / 274.2 / 1,102.4
/// µs at 64 / 256 / 1,024 / 4,096 rows against 50.0 / 54.7 / 103.4 / 295.1 for dequantize +
/// cuBLAS; `[64, 4096] × [2048, 4096]ᵀ` 17.3 against 20.4. (Session 13's dequantization took
/// 253 µs, so the tile-dequant GEMM won up to ~2k rows then.) Up to 64 rows the row-group GEMV
/// ([`FP8_ROWS_GEMV_MAX`]) runs where it applies.
pub const DENSE_TC_MAX_ROWS: Option<usize> = Some(64);
/// The routed experts' prefill when [`FP8_GEMM_ENV`] is unset.
pub const MOE_DEFAULT: Fp8Gemm = Fp8Gemm::Tc;

impl Fp8Gemm {
    /// The choice [`FP8_GEMM_ENV`] makes, `default` when it is unset or empty.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for another value.
    pub fn from_env(default: Fp8Gemm) -> Result<Fp8Gemm> {
        Self::parse(std::env::var(FP8_GEMM_ENV).ok().as_deref(), default)
    }

    /// [`Fp8Gemm::from_env`] for a given value of the variable.
    fn parse(v: Option<&str>, default: Fp8Gemm) -> Result<Fp8Gemm> {
        match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") => Ok(default),
            Some("dequant") => Ok(Fp8Gemm::Dequant),
            Some("tc") => Ok(Fp8Gemm::Tc),
            Some("mma8") => Ok(Fp8Gemm::Mma8),
            Some(other) => bail!(Config, "{FP8_GEMM_ENV}={other}: expected dequant, tc or mma8"),
        }
    }
}

/// The device FP8 weight of `w`, if it is one.
pub fn fp8_of(w: &Tensor) -> Option<&DevFp8> {
    match w.storage() {
        Storage::Cuda(c) => match &c.buf {
            DevBuf::F8(f) => Some(f.as_ref()),
            _ => None,
        },
        Storage::Cpu(_) => None,
    }
}

/// Runs `f` on the device's scratch buffer of `T`, at least `n` elements (grown, or remade
/// for another dtype, as needed; a freed buffer is released in stream order).
fn with_scratch<T: DevType, R>(g: &Gpu, n: usize, f: impl FnOnce(&mut CudaSlice<T>) -> Result<R>) -> Result<R> {
    let mut s = g.fp8_scratch.lock().unwrap_or_else(|e| e.into_inner());
    let fits = s.as_ref().and_then(T::get).is_some_and(|b| b.len() >= n);
    if !fits {
        *s = None;
        *s = Some(T::wrap(alloc::<T>(g, n.max(1))?));
    }
    match s.as_mut().and_then(T::get_mut) {
        Some(b) => f(b),
        None => bail!(Internal, "fp8 scratch of the wrong dtype"),
    }
}

/// `x · Wᵀ` with an FP8 weight: `[rows, k] × [n, k]ᵀ → [rows, n]` in `out_dtype` (see the
/// module doc for the paths).
pub fn matmul_t(g: &Gpu, x: &Tensor, w: &DevFp8, out: &mut Tensor) -> Result<()> {
    let (m, k, n) = (x.rows(), x.last_dim(), w.rows());
    if w.cols != k || w.dtype != x.dtype() {
        bail!(
            Internal,
            "matmul of a [{m}, {k}] {} activation with an fp8 [{n}, {}] {} weight",
            x.dtype(),
            w.cols,
            w.dtype
        );
    }
    fn go<A: DevType>(g: &Gpu, x: &Tensor, w: &DevFp8, out: &mut Tensor, m: usize, k: usize, n: usize) -> Result<()> {
        let xs = x.dev::<A>()?;
        let invariant = crate::tensor::cuda::batch_invariant(A::DTYPE);
        // Up to 64 rows in one tensor-core GEMV launch where the default form (or the
        // tensor-core one) runs: beyond FP8_GEMV_MAX_ROWS rows up to FP8_ROWS_GEMV_MAX (decode
        // batches 5..64), and in batch-invariant runs (where it was a launch per 8 rows, the
        // same bits).
        let tc_form = matches!(Fp8GemvForm::of_process().conv, Fp8GemvConv::Auto | Fp8GemvConv::Tc);
        if tc_form && (invariant || (FP8_GEMV_MAX_ROWS < m && m <= rows_gemv_max())) {
            let done = match out.dtype() {
                DType::F32 if g.k.fp8_gemv_rows_fits::<A, f32>(m, k) => {
                    g.k.fp8_gemv_rows::<A, f32>(xs, w.view(), out.dev_mut::<f32>()?, m).map_err(cuda_err)?;
                    true
                }
                dt if dt == A::DTYPE && g.k.fp8_gemv_rows_fits::<A, A>(m, k) => {
                    g.k.fp8_gemv_rows::<A, A>(xs, w.view(), out.dev_mut::<A>()?, m).map_err(cuda_err)?;
                    true
                }
                _ => false,
            };
            if done {
                return Ok(());
            }
        }
        let gemv = invariant || m <= FP8_GEMV_MAX_ROWS;
        fn groups<A: DevType, O: DevType>(
            g: &Gpu,
            xs: &CudaSlice<A>,
            w: &DevFp8,
            out: &mut CudaSlice<O>,
            m: usize,
            k: usize,
            n: usize,
        ) -> Result<bool> {
            const G: usize = 8;
            if !CudaKernels::fp8_gemv_fits::<A, O>(G.min(m.max(1)), k) {
                return Ok(false);
            }
            for r0 in (0..m).step_by(G) {
                let r = G.min(m - r0);
                let xv = xs.slice(r0 * k..(r0 + r) * k);
                let mut ov = out.slice_mut(r0 * n..(r0 + r) * n);
                if crate::tensor::cuda::batch_invariant(A::DTYPE)
                    && Fp8GemvForm::of_process() == Fp8GemvForm::AUTO
                    && g.k.fp8_gemv_tc_fits::<A>()
                {
                    // The default form depends on the row count; batch-invariant runs take one.
                    g.k.fp8_gemv_with::<A, O>(&xv, w.view(), &mut ov, r, Fp8GemvForm::TC).map_err(cuda_err)?;
                } else {
                    g.k.fp8_gemv::<A, O>(&xv, w.view(), &mut ov, r).map_err(cuda_err)?;
                }
            }
            Ok(true)
        }
        if gemv {
            let done = match out.dtype() {
                DType::F32 => groups::<A, f32>(g, xs, w, out.dev_mut::<f32>()?, m, k, n)?,
                dt if dt == A::DTYPE => groups::<A, A>(g, xs, w, out.dev_mut::<A>()?, m, k, n)?,
                _ => false,
            };
            if done {
                return Ok(());
            }
        } else {
            let path =
                Fp8Gemm::from_env(if DENSE_TC_MAX_ROWS.is_some_and(|r| m <= r) { Fp8Gemm::Tc } else { DENSE_DEFAULT })?;
            /// The tensor-core paths, `path` or the next one down; false where neither runs.
            fn tensor<A: DevType, O: DevType>(
                g: &Gpu,
                xs: &CudaSlice<A>,
                w: &DevFp8,
                out: &mut CudaSlice<O>,
                m: usize,
                path: Fp8Gemm,
            ) -> Result<bool> {
                let (k, n) = (w.cols, w.rows());
                if path == Fp8Gemm::Mma8 && A::DTYPE != DType::F32 && g.k.fp8_mma8_fits(k) {
                    g.k.fp8_gemm_mma8_quant::<A, O>(xs, w.view(), out, m).map_err(cuda_err)?;
                    return Ok(true);
                }
                if path != Fp8Gemm::Dequant && g.k.fp8_gemm_tc_fits::<A, O>(k, n) {
                    g.k.fp8_gemm_tc::<A, O>(xs, w.view(), out, m).map_err(cuda_err)?;
                    return Ok(true);
                }
                Ok(false)
            }
            if path != Fp8Gemm::Dequant {
                let done = match out.dtype() {
                    DType::F32 => tensor::<A, f32>(g, xs, w, out.dev_mut::<f32>()?, m, path)?,
                    dt if dt == A::DTYPE => tensor::<A, A>(g, xs, w, out.dev_mut::<A>()?, m, path)?,
                    _ => false,
                };
                if done {
                    return Ok(());
                }
            }
        }
        with_scratch::<A, ()>(g, n * k, |s| {
            g.k.fp8_dequant::<A>(w.view(), &mut s.slice_mut(0..n * k)).map_err(cuda_err)?;
            let ws = s.slice(0..n * k);
            match out.dtype() {
                DType::F32 => g.gemm.matmul_t::<A, f32>(xs, &ws, out.dev_mut::<f32>()?, m, k, n),
                DType::BF16 => g.gemm.matmul_t::<A, bf16>(xs, &ws, out.dev_mut::<bf16>()?, m, k, n),
                DType::F16 => g.gemm.matmul_t::<A, f16>(xs, &ws, out.dev_mut::<f16>()?, m, k, n),
            }
            .map_err(cuda_err)
        })
    }
    crate::by_dtype!(x.dtype(), go(g, x, w, out, m, k, n))
}

/// The routing of a routed-experts call: with a router (`moe::moe_experts` chose the routed
/// call, [`porter_kernels::cuda::CudaKernels::moe_router_fuses`]) the call writes `idx` / `wts`,
/// else they hold the router's output.
pub type Routing<'a, 'r> = (Option<&'a MoeRouteDev<'r>>, &'a mut CudaSlice<u32>, &'a mut CudaSlice<f32>);

/// Routed experts with FP8 `gate` / `up` `[e, inter, hidden]` and `down` `[e, hidden, inter]`
/// (see `moe::moe_experts`; `routing`: `idx` / `wts` from the router, or the router to run
/// with the experts) → `y` `[t, hidden]` f32; with `shared` (its down weight FP8; chosen by
/// `moe::moe_experts`) fused into the direct form.
#[allow(clippy::too_many_arguments)]
pub fn moe_experts(
    g: &Gpu,
    x: &Tensor,
    routing: Routing<'_, '_>,
    experts: (&DevFp8, &DevFp8, &DevFp8),
    shared: Option<&MoeShared<'_>>,
    y: &mut Tensor,
    dims: (usize, usize, usize, usize, usize),
) -> Result<()> {
    #[allow(clippy::too_many_arguments)]
    fn go<T: DevType>(
        g: &Gpu,
        x: &Tensor,
        routing: Routing<'_, '_>,
        experts: (&DevFp8, &DevFp8, &DevFp8),
        shared: Option<&MoeShared<'_>>,
        y: &mut Tensor,
        dims: (usize, usize, usize, usize, usize),
    ) -> Result<()> {
        let (t, k, e, h, inter) = dims;
        let (gate, up, down) = experts;
        let xd = x.dev::<T>()?;
        let out = y.dev_mut::<f32>()?;
        let (route, idx, wts) = routing;
        if let Some(r) = route {
            // The decode GEMVs (with the shared expert: its fused direct form) and their router.
            let sd = shared.map(fp8_shared).transpose()?;
            let (gv, uv, dv, dims) = (gate.view(), up.view(), down.view(), [t, k, e, h, inter]);
            return g
                .k
                .moe_experts_fp8_routed::<T>(xd, r, idx, wts, gv, uv, dv, sd.as_ref(), out, dims, MoeGemv::from_env())
                .map_err(cuda_err);
        }
        let (idx, wts) = (&*idx, &*wts);
        if let Some(s) = shared {
            let sd = fp8_shared(s)?;
            let (gv, uv, dv) = (gate.view(), up.view(), down.view());
            return g
                .k
                .moe_experts_fp8_shared::<T>(xd, idx, wts, gv, uv, dv, &sd, out, [t, k, e, h, inter])
                .map_err(cuda_err);
        }
        if crate::tensor::cuda::batch_invariant(T::DTYPE) {
            // Always the GEMV form (batch-invariant; never the tensor-core decode form).
            let (gv, uv, dv, dims) = (gate.view(), up.view(), down.view(), [t, k, e, h, inter]);
            return g
                .k
                .moe_experts_fp8_with::<T>(xd, idx, wts, gv, uv, dv, out, dims, MoeGemv::from_env(), MOE_PHASES_ALL)
                .map_err(cuda_err);
        }
        if CudaKernels::moe_decode_path(t, k, e) {
            // The tensor-core form beyond the direct GEMV form's pairs (PORTER_FP8_MOE_DEC, default mma), else the GEMVs.
            return g
                .k
                .moe_experts_fp8::<T>(xd, idx, wts, gate.view(), up.view(), down.view(), out, [t, k, e, h, inter])
                .map_err(cuda_err);
        }
        let path = Fp8Gemm::from_env(MOE_DEFAULT)?;
        let (gv, uv, dv, dims) = (gate.view(), up.view(), down.view(), [t, k, e, h, inter]);
        if path == Fp8Gemm::Mma8 && g.k.moe_prefill_mma8_fits::<T>(h, inter) {
            return g.k.moe_experts_fp8_mma8::<T>(xd, idx, wts, gv, uv, dv, out, dims).map_err(cuda_err);
        }
        if path != Fp8Gemm::Dequant && g.k.moe_prefill_fp8_fits::<T>(h, inter) {
            return g.k.moe_experts_fp8_prefill::<T>(xd, idx, wts, gv, uv, dv, out, dims).map_err(cuda_err);
        }
        let n1 = e * inter * h;
        with_scratch::<T, ()>(g, 3 * n1, |s| {
            g.k.fp8_dequant::<T>(gate.view(), &mut s.slice_mut(0..n1)).map_err(cuda_err)?;
            g.k.fp8_dequant::<T>(up.view(), &mut s.slice_mut(n1..2 * n1)).map_err(cuda_err)?;
            g.k.fp8_dequant::<T>(down.view(), &mut s.slice_mut(2 * n1..3 * n1)).map_err(cuda_err)?;
            let (gd, ud, dd) = (s.slice(0..n1), s.slice(n1..2 * n1), s.slice(2 * n1..3 * n1));
            g.k.moe_experts::<T>(xd, idx, wts, &gd, &ud, &dd, out, t, k, e, h, inter).map_err(cuda_err)
        })
    }
    crate::by_dtype!(x.dtype(), go(g, x, routing, experts, shared, y, dims))
}

/// The kernels' view of a fused shared expert with FP8 weights (`moe::moe_experts` fuses it
/// only so).
fn fp8_shared<'a>(s: &MoeShared<'a>) -> Result<MoeSharedDev<'a, Fp8Dev<'a>>> {
    let view = |w: &'a Tensor, what: &str| match fp8_of(w) {
        Some(q) => Ok(q.view()),
        None => bail!(Internal, "fused FP8 shared expert with a dense {what} weight"),
    };
    super::moe::shared_dev(s, view(s.down, "down")?, |w| view(w, "gate / up"))
}

/// A random FP8 weight `[rows, cols]` made on the device: `dense` (the compute dtype's values)
/// block-quantized by the device kernel, scale rows `r / 128`.
pub fn quantize(g: &Gpu, dense: &Tensor, rows: usize, cols: usize) -> Result<DevFp8> {
    let (sr, sc) = (rows.div_ceil(porter_kernels::cuda::FP8_BLOCK), cols.div_ceil(porter_kernels::cuda::FP8_BLOCK));
    let mut q = alloc::<u8>(g, rows * cols)?;
    let mut scales = alloc::<f32>(g, sr * sc)?;
    fn go<T: DevType>(
        g: &Gpu,
        d: &Tensor,
        q: &mut CudaSlice<u8>,
        s: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        g.k.fp8_quantize::<T>(d.dev::<T>()?, q, s, rows, cols).map_err(cuda_err)
    }
    crate::by_dtype!(dense.dtype(), go(g, dense, &mut q, &mut scales, rows, cols))?;
    let rs: Vec<u32> = (0..rows).map(|r| (r / porter_kernels::cuda::FP8_BLOCK) as u32).collect();
    let row_scale = g.stream().clone_htod(&rs).map_err(cuda_err)?;
    Ok(DevFp8 { q, scales, row_scale, row_scale_affine: true, cols, dtype: dense.dtype() })
}

/// A device tensor of `shape` (its dtype the weight's compute dtype) holding `w`.
pub fn tensor(g: &std::sync::Arc<Gpu>, w: DevFp8, shape: Vec<usize>) -> Tensor {
    let dtype = w.dtype;
    let storage = Storage::Cuda(crate::tensor::cuda::CudaStorage { gpu: g.clone(), buf: DevBuf::F8(Box::new(w)) });
    Tensor::from_storage(shape, storage, dtype)
}

/// FP8 device weights with the same row length stacked along the rows, each keeping its own
/// scales (the row → scale-row maps are offset on the host: 4 bytes a row).
pub fn concat(g: &Gpu, parts: &[Tensor]) -> Result<DevFp8> {
    let ws: Vec<&DevFp8> = parts
        .iter()
        .map(|t| fp8_of(t).ok_or_else(|| crate::err!(Internal, "concat of a dense part as fp8")))
        .collect::<Result<_>>()?;
    let Some(first) = ws.first() else { bail!(Internal, "concat of no fp8 weights") };
    let (cols, dtype) = (first.cols, first.dtype);
    let sc = cols.div_ceil(porter_kernels::cuda::FP8_BLOCK).max(1);
    let (nq, ns) = (ws.iter().map(|w| w.q.len()).sum(), ws.iter().map(|w| w.scales.len()).sum());
    let mut q = alloc::<u8>(g, nq)?;
    let mut scales = alloc::<f32>(g, ns)?;
    let mut rs = Vec::new();
    let (mut oq, mut os) = (0, 0);
    for w in &ws {
        if w.cols != cols || w.dtype != dtype {
            bail!(Shape, "concat of fp8 weights with {cols} and {} columns", w.cols);
        }
        g.stream().memcpy_dtod(&w.q, &mut q.slice_mut(oq..oq + w.q.len())).map_err(cuda_err)?;
        g.stream().memcpy_dtod(&w.scales, &mut scales.slice_mut(os..os + w.scales.len())).map_err(cuda_err)?;
        let base = (os / sc) as u32;
        rs.extend(g.stream().clone_dtoh(&w.row_scale).map_err(cuda_err)?.into_iter().map(|r| r + base));
        oq += w.q.len();
        os += w.scales.len();
    }
    let row_scale = g.stream().clone_htod(&rs).map_err(cuda_err)?;
    Ok(DevFp8 { q, scales, row_scale, row_scale_affine: porter_kernels::cuda::fp8_row_map_affine(&rs), cols, dtype })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_gemm_env_values() {
        assert_eq!(Fp8Gemm::parse(None, Fp8Gemm::Tc).ok(), Some(Fp8Gemm::Tc));
        assert_eq!(Fp8Gemm::parse(Some(" "), Fp8Gemm::Dequant).ok(), Some(Fp8Gemm::Dequant));
        assert_eq!(Fp8Gemm::parse(Some("DEQUANT"), Fp8Gemm::Tc).ok(), Some(Fp8Gemm::Dequant));
        assert_eq!(Fp8Gemm::parse(Some("tc"), Fp8Gemm::Dequant).ok(), Some(Fp8Gemm::Tc));
        assert_eq!(Fp8Gemm::parse(Some("mma8"), Fp8Gemm::Dequant).ok(), Some(Fp8Gemm::Mma8));
        let e = Fp8Gemm::parse(Some("cublas"), Fp8Gemm::Tc).unwrap_err().to_string();
        assert!(e.contains(FP8_GEMM_ENV) && e.contains("cublas"), "{e}");
    }
}
