//! The Gated DeltaNet gate inputs on the device: where `in_proj_ba` is held apart (the FP8
//! checkpoints) and handed over as its product ([`GateIn::Proj`]), a decode-sized step computes
//! it inside the conv + gates launch ([`porter_kernels::cuda::CudaKernels::gdn_conv_gates_proj_seq`]) instead of a
//! GEMV launch of its own; every other step computes the product first, exactly as the plain
//! `Linear` did, and reads its columns.

use crate::backend::{GateIn, GdnArgs, GdnWeights};
use crate::bail;
use crate::error::Result;
use crate::tensor::cuda::{cuda_err, DevType, Gpu};
use crate::tensor::Tensor;
use cudarc::driver::{CudaSlice, CudaView};
use porter_kernels::cuda::{gdn_ba_fused_enabled, GateProj, GDN_BA_FUSED_MAX_ROWS};

/// The gate inputs of one step as the conv + gates launch takes them.
#[derive(Debug, Clone, Copy)]
pub(super) enum DevGates<'a> {
    /// `[b | a]` at the given column of the tensor's rows (`p` itself when packed).
    Cols(&'a Tensor, usize),
    /// `x · wᵀ` computed by the launch: `x` `[T, hidden]`, `w` `[2·Hv, hidden]`.
    Proj { x: &'a Tensor, w: &'a Tensor },
}

impl<'a> DevGates<'a> {
    /// The columns form, for the launches that read only that (the fused decode step).
    pub fn cols(self) -> Result<(&'a Tensor, usize)> {
        match self {
            DevGates::Cols(t, col) => Ok((t, col)),
            DevGates::Proj { .. } => {
                bail!(Internal, "Gated DeltaNet gate inputs left to a launch that cannot compute them")
            }
        }
    }
}

/// The step's gate inputs on the device. `GateIn::Proj` stays a projection for the conv +
/// gates launch where `fusable` (the caller runs that launch over every row: not the one-launch
/// decode step of `PORTER_GDN_FUSED=on`) and [`proj_fits`] holds; otherwise its product is
/// computed here into `held` (the plain `Linear`'s `x.matmul_t(w)`, same launches, same bits)
/// and read as columns like `Cols`.
///
/// # Errors
/// `Shape` when the gate inputs do not fit `p` and `c` ([`GdnArgs::gate_cols`]); device errors.
pub(super) fn dev_gates<'a>(
    p: &'a Tensor,
    gates: GateIn<'a>,
    c: &GdnArgs,
    fusable: bool,
    held: &'a mut Option<Tensor>,
) -> Result<DevGates<'a>> {
    if let GateIn::Proj { x, w } = gates {
        if fusable && gdn_ba_fused_enabled() && proj_fits(p, x, w, c) {
            return Ok(DevGates::Proj { x, w });
        }
    }
    *held = gates.project()?;
    let held: &'a Option<Tensor> = held;
    let (t, col) = c.gate_cols(p, gates.cols(held))?;
    Ok(DevGates::Cols(t, col))
}

/// Whether the conv + gates launch computes `x · wᵀ` for the projections `p`: a decode-sized
/// step (`1 ..= GDN_BA_FUSED_MAX_ROWS` rows: beyond, every row re-reading the weight loses
/// to a GEMM), `p` without packed gate columns, `x` `[T, hidden]` and a dense `w`
/// `[2·Hv, hidden]` on the device, all three of one dtype. A step that fails this takes the
/// GEMM, whose shape errors are the caller's.
fn proj_fits(p: &Tensor, x: &Tensor, w: &Tensor, c: &GdnArgs) -> bool {
    let (t, hv) = (p.rows(), c.value_heads);
    let width = c.conv_dim() + hv * c.value_dim;
    (1..=GDN_BA_FUSED_MAX_ROWS).contains(&t)
        && p.last_dim() == width
        && x.rows() == t
        && x.last_dim() > 0
        && w.shape() == [2 * hv, x.last_dim()]
        && x.dtype() == p.dtype()
        && w.dtype() == p.dtype()
        && super::fp8::fp8_of(w).is_none()
        && x.is_cuda()
        && w.is_cuda()
}

/// The conv + gates launch of a step over `spans` (`n` of them): the gate inputs read as
/// columns ([`porter_kernels::cuda::CudaKernels::gdn_conv_gates_seq`]) or computed by it
/// ([`porter_kernels::cuda::CudaKernels::gdn_conv_gates_proj_seq`]). `dims` = `(t, win, num_slots)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_gates<T: DevType>(
    g: &Gpu,
    c: &GdnArgs,
    w: &GdnWeights<'_>,
    p: &Tensor,
    gates: DevGates<'_>,
    window: &mut CudaSlice<f32>,
    (spans, n): (&CudaView<'_, u32>, usize),
    qkv: &mut CudaSlice<T>,
    (gate, beta): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    (t, win, ns): (usize, usize, usize),
) -> Result<()> {
    let (conv, kernel, hv) = (c.conv_dim(), c.conv_kernel, c.value_heads);
    let (cw, a_log, dt_bias) = (w.conv_w.dev::<f32>()?, w.a_log.dev::<f32>()?, w.dt_bias.dev::<f32>()?);
    match gates {
        DevGates::Cols(gt, ba_col) => {
            // The gate inputs: p's own columns, or in_proj_ba's output read in place.
            let ba = if std::ptr::eq(gt, p) { None } else { Some(gt.dev::<T>()?) };
            g.k.gdn_conv_gates_seq::<T>(
                p.dev::<T>()?,
                p.last_dim(),
                ba,
                gt.last_dim(),
                ba_col,
                cw,
                a_log,
                dt_bias,
                window,
                spans,
                qkv,
                gate,
                beta,
                t,
                n,
                conv,
                kernel,
                win,
                ns,
                hv,
            )
        }
        DevGates::Proj { x, w: wba } => {
            let proj = GateProj { x: x.dev::<T>()?, w: wba.dev::<T>()?, hidden: x.last_dim() };
            g.k.gdn_conv_gates_proj_seq::<T>(
                p.dev::<T>()?,
                p.last_dim(),
                proj,
                cw,
                a_log,
                dt_bias,
                window,
                spans,
                qkv,
                gate,
                beta,
                t,
                n,
                conv,
                kernel,
                win,
                ns,
                hv,
            )
        }
    }
    .map_err(cuda_err)
}
