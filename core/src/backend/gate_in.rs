//! [`GateIn`]: how a Gated DeltaNet block hands its gate inputs `[b | a]` to [`Ops::gdn`](super::Ops::gdn).

use crate::error::Result;
use crate::tensor::Tensor;

/// Where a Gated DeltaNet block's gate inputs `[b | a]` come from ([`Ops::gdn`](super::Ops::gdn)).
///
/// # Shapes
/// - `Packed`: columns `conv_dim + Hv·dv .. + 2·Hv` of the projections `p`
///   (`[T, conv_dim + Hv·dv + 2·Hv]`)
/// - `Cols(ba)`: `ba` `[T, 2·Hv]` (`p`'s dtype; `p` then `[T, conv_dim + Hv·dv]`)
/// - `Proj { x, w }`: `x` `[T, hidden]` (the rows the block's input projection read), `w`
///   `[2·Hv, hidden]` (`in_proj_ba`'s weight, a plain projection: no bias, no tensor-parallel
///   reduction), both in `p`'s dtype; the inputs are `x · wᵀ` ([`Tensor::matmul_t`], what a
///   plain `Linear::forward` computes)
#[derive(Debug, Clone, Copy)]
pub enum GateIn<'a> {
    /// Stacked onto the projections (`in_proj_ba` packed into `in_proj`).
    Packed,
    /// A tensor of their own (`in_proj_ba`'s output, read in place).
    Cols(&'a Tensor),
    /// The product `x · wᵀ`, left to the backend: one that can computes it inside the launch
    /// that reads the gates (the CUDA backend at decode sizes), the others compute it first
    /// ([`GateIn::project`]) and go on as with [`GateIn::Cols`].
    Proj { x: &'a Tensor, w: &'a Tensor },
}

impl<'a> GateIn<'a> {
    /// `Proj`'s product `x · wᵀ` (`None` for the other variants): the same call as a plain
    /// `Linear::forward`, so the bits are those of the layer without the fusion.
    ///
    /// # Errors
    /// [`Error::Shape`](crate::error::Error) when `w` does not fit `x`; backend errors.
    pub fn project(&self) -> Result<Option<Tensor>> {
        match self {
            GateIn::Proj { x, w } => x.matmul_t(w).map(Some),
            GateIn::Packed | GateIn::Cols(_) => Ok(None),
        }
    }

    /// The `ba` argument of [`GdnArgs::gate_cols`](super::GdnArgs::gate_cols): `Cols`' tensor, `Proj`'s product
    /// `projected` (from [`GateIn::project`]), `None` when packed.
    pub fn cols<'b>(self, projected: &'b Option<Tensor>) -> Option<&'b Tensor>
    where
        'a: 'b,
    {
        match self {
            GateIn::Packed => None,
            GateIn::Cols(b) => Some(b),
            GateIn::Proj { .. } => projected.as_ref(),
        }
    }
}
