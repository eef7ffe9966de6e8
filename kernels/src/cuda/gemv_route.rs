//! The MoE input GEMV with the router in its last block ([`CudaKernels::gemv_route`],
//! kernels/cuda/gemv_route.cu; [`MoeRouter::Gemv`](super::MoeRouter::Gemv)).
//!
//! At decode the router is a one-warp launch of its own between the MoE input GEMV and the
//! experts' gate+up kernel: 4.6 µs a layer in place on an H100 (knock-in, session 23) for about
//! 1.5 µs of work. Here the GEMV's last block to finish routes (the separate router's code on
//! the same logits: the same ids and weights, bit for bit), and the router launch goes.

use super::misc::gemv_split;
use super::ops::{router_warp_form, ROUTER_MAX_K};
use super::{prod, u32_of, CudaError, CudaFloat, CudaKernels, Result, MISC};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Most rows [`CudaKernels::gemv_route`] takes (one warp of its last block routes a row; the
/// kernels are built for 1, 2 and 4).
pub const GEMV_ROUTE_MAX_ROWS: usize = 4;

impl CudaKernels {
    /// Whether [`CudaKernels::gemv_route`] takes `m` rows of `k` columns of `A` routing `e`
    /// experts, top-`topk`: `m ≤` [`GEMV_ROUTE_MAX_ROWS`], the GEMV's shape rule
    /// ([`CudaKernels::gemv_fits`] with an f32 output) and the one-warp router's
    /// (`e ≤ 512`, `1 ≤ topk ≤ min(e, 16)`, the warp form not switched off).
    pub fn gemv_route_fits<A: CudaFloat>(m: usize, k: usize, e: usize, topk: usize) -> bool {
        (1..=GEMV_ROUTE_MAX_ROWS).contains(&m)
            && Self::gemv_fits::<A, f32>(m, k)
            && topk >= 1
            && topk <= e
            && topk <= ROUTER_MAX_K
            && router_warp_form(e)
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` in f32 (the bits of [`CudaKernels::gemv`] to f32), and
    /// the router over the first `e` columns of each row ([`CudaKernels::moe_router_strided`]
    /// with stride `n`: the same ids and weights), in one launch: the block that finishes the
    /// GEMV last routes.
    ///
    /// # Shapes
    /// - `x`: `[m, k]`, `w`: `[n, k]` (a weight: nothing the previous kernel writes), `out`:
    ///   `[m, n]` f32 with `n ≥ e`
    /// - `idx`: `[m, topk]` (`u32`), `weights`: `[m, topk]` (`f32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if the shape does not fit ([`CudaKernels::gemv_route_fits`]),
    /// `n < e`, a buffer is short or `x` / `w` are not 16-byte aligned; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_route<A: CudaFloat>(
        &self,
        x: &impl DevicePtr<A>,
        w: &impl DevicePtr<A>,
        out: &mut impl DevicePtrMut<f32>,
        (m, k, n): (usize, usize, usize),
        (e, topk, renorm): (usize, usize, bool),
        idx: &mut impl DevicePtrMut<u32>,
        weights: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        if !Self::gemv_route_fits::<A>(m, k, e, topk) || n < e {
            return Err(CudaError::Invalid(format!(
                "gemv_route: m {m}, k {k}, n {n}, e {e}, top-k {topk} ({}) does not fit",
                A::NAME
            )));
        }
        self.check("x", x, prod(&[m, k])?)?;
        self.check("w", w, prod(&[n, k])?)?;
        self.check("out", out, prod(&[m, n])?)?;
        self.check("idx", idx, prod(&[m, topk])?)?;
        self.check("weights", weights, prod(&[m, topk])?)?;
        let mm = [1usize, 2, 4].into_iter().find(|&v| v >= m).unwrap_or(GEMV_ROUTE_MAX_ROWS);
        let s = &*self.stream;
        let (px, _gx) = x.device_ptr(s);
        let (pw, _gw) = w.device_ptr(s);
        if (px | pw) & 15 != 0 {
            return Err(CudaError::Invalid("gemv_route: x and w must be 16-byte aligned".into()));
        }
        let (m32, k32, n32) = (u32_of("m", m)?, u32_of("k", k)?, u32_of("n", n)?);
        let (e32, k2, rn) = (u32_of("e", e)?, u32_of("top-k", topk)?, i32::from(renorm));
        // The split of `gemv` for this shape (so the logits' bits are its).
        let split = gemv_split(n, k / (16 / std::mem::size_of::<A>()), self.caps().sms);
        let cfg = LaunchConfig {
            grid_dim: (u32_of("blocks", n.div_ceil(8 / split))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let split32 = split as u32;
        let mut counter = self.route_sync.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: matches gemv_route_<A>_m<mm> (8 / split columns a block, as gemv_<A>_f32_m<mm>);
        // sizes and alignment checked; m <= mm <= 4 (one routing warp a row of the 8); e <= 512
        // and 1 <= topk <= min(e, 16) (router_warp_row's registers and outputs); the counter is
        // one u32, zero between launches (the kernel's last block zeroes it), held locked while
        // this launch is issued.
        // Kernel: `gemv_route_<A>_m<mm>(const A* x, const A* w, float* out, u32 m, u32 k, u32 n,
        // u32 split, u32* counter, u32 e, u32 topk, int renorm, u32* idx, float* wts)`.
        unsafe {
            launch!(
                self,
                MISC,
                format!("gemv_route_{}_m{mm}", A::NAME),
                cfg,
                [
                    px,
                    pw,
                    ptr_mut(out),
                    m32,
                    k32,
                    n32,
                    split32,
                    ptr_mut(&mut *counter),
                    e32,
                    k2,
                    rn,
                    ptr_mut(idx),
                    ptr_mut(weights)
                ]
            )
        }
    }
}
