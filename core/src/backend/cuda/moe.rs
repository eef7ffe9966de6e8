//! The MoE block on the device: router, routed experts (dense or FP8) and the shared
//! expert, fused into the routed experts' direct decode form when it runs
//! (`fuse_shared`), else its own three launches (`swiglu_cols`, the down projection,
//! `shared_expert_add`, run by `nn::Moe::forward`).

use super::profile;
use crate::backend::{MoeArgs, MoeShared, SharedIn};
use crate::bail;
use crate::error::Result;
use crate::tensor::cuda::{alloc, cuda_err, gpu_of, DevType, Gpu};
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;
use cudarc::driver::CudaSlice;
use porter_kernels::cuda::{CudaKernels, MoeGemv, MoeRouteDev, MoeRouter, MoeSharedDev, SharedGu};

/// The kind of a set of weights, as the MoE kernels take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WeightKind {
    /// Dense, of this dtype.
    Dense(DType),
    /// FP8 (block-scaled e4m3).
    Fp8,
    /// Dense and FP8, or dense of different dtypes.
    Mixed,
}

/// The kind of `ws` (all of one kind, else [`WeightKind::Mixed`]).
fn kind_of(ws: &[&Tensor]) -> WeightKind {
    let one = |w: &Tensor| match super::fp8::fp8_of(w) {
        Some(_) => WeightKind::Fp8,
        None => WeightKind::Dense(w.dtype()),
    };
    let first = ws.first().map_or(WeightKind::Mixed, |w| one(w));
    if ws.iter().all(|w| one(w) == first) {
        first
    } else {
        WeightKind::Mixed
    }
}

/// Whether the shared expert is fused into the routed experts: when they run the direct
/// decode form (`direct`, [`CudaKernels::moe_shared_fuses`]) and the shared down weight is of
/// the routed weights' kind (FP8 with FP8, dense of the activations' dtype with dense of that
/// dtype); otherwise the unfused sequence runs, whatever the weights.
fn fuse_shared(direct: bool, routed: WeightKind, shared: WeightKind, act: DType) -> bool {
    direct
        && match (routed, shared) {
            (WeightKind::Fp8, WeightKind::Fp8) => true,
            (WeightKind::Dense(a), WeightKind::Dense(b)) => a == act && b == act,
            _ => false,
        }
}

/// Routed experts on the device (see `Ops::moe_experts`): router over the first
/// `m.experts` columns of the f32 `logits`, grouped expert GEMMs, deterministic weighted
/// combine → `[T, H]` f32; with `shared` fused in when `fuse_shared` says so (the flag
/// returned). The router is a launch of its own, or, with `PORTER_MOE_ROUTER=fused` where the
/// direct decode form runs ([`CudaKernels::moe_router_fuses`]), inside its gate+up kernel (the
/// same expert ids and weights; opt-in, measured slower at batch 1).
pub fn moe_experts(
    x: &Tensor,
    logits: &Tensor,
    m: &MoeArgs,
    gate: &Tensor,
    up: &Tensor,
    down: &Tensor,
    shared: Option<&MoeShared<'_>>,
) -> Result<(Tensor, bool)> {
    let g = gpu_of(x, "moe")?;
    let _p = profile::span("moe experts (incl. router)", &g);
    let (t, h) = (x.rows(), x.last_dim());
    let (e, k) = (m.experts, m.top_k);
    let stride = logits.last_dim();
    let mut idx = alloc::<u32>(&g, t * k)?;
    let mut wts = alloc::<f32>(&g, t * k)?;
    let inter = gate.dim(1);
    let mut y = Tensor::empty_on(&g, [t, h], DType::F32)?;
    let routed = kind_of(&[gate, up, down]);
    // Fused and apart differ in the shared down product's summation order, and which one runs
    // depends on the row count: batch-invariant runs (f32, deterministic mode) keep it apart
    // at every row count, so that a row's bits do not depend on the batch.
    let invariant = crate::tensor::cuda::batch_invariant(x.dtype());
    let shared = shared.filter(|s| {
        // The gate / up products as f32 columns, or their weight `[2·I_s, H]` of the routed
        // weights' kind (the gate+up launch multiplies it).
        let gu_ok = match s.gu {
            SharedIn::Cols { gu, .. } => gu.dtype() == DType::F32,
            SharedIn::Weights(w) => kind_of(&[w]) == routed && w.shape() == [2 * s.inter, h],
        };
        !invariant
            && gu_ok
            && s.gate.dtype() == DType::F32
            && fuse_shared(
                CudaKernels::moe_shared_fuses(t, k, e, routed == WeightKind::Fp8),
                routed,
                kind_of(&[s.down]),
                x.dtype(),
            )
    });
    // The router inside the direct form's gate+up kernel where it runs, else its own launch.
    let route =
        MoeRouteDev { logits: logits.dev::<f32>()?, stride, renorm: m.norm_topk_prob, router: MoeRouter::of_process() };
    let fp8 = routed == WeightKind::Fp8;
    let route = CudaKernels::moe_router_fuses(t, k, e, fp8, shared.is_some(), invariant).then_some(&route);
    if route.is_none() {
        g.k.moe_router_strided(logits.dev::<f32>()?, stride, &mut idx, &mut wts, t, e, k, m.norm_topk_prob)
            .map_err(cuda_err)?;
    }
    match (super::fp8::fp8_of(gate), super::fp8::fp8_of(up), super::fp8::fp8_of(down)) {
        (Some(gq), Some(uq), Some(dq)) => {
            let rw = (route, &mut idx, &mut wts);
            super::fp8::moe_experts(&g, x, rw, (gq, uq, dq), shared, &mut y, (t, k, e, h, inter))?;
            return Ok((y, shared.is_some()));
        }
        (None, None, None) => {}
        _ => bail!(Internal, "moe experts with fp8 and dense weights mixed"),
    }
    #[allow(clippy::too_many_arguments)]
    fn go<T: DevType>(
        g: &Gpu,
        x: &Tensor,
        route: Option<&MoeRouteDev<'_>>,
        idx: &mut CudaSlice<u32>,
        w: &mut CudaSlice<f32>,
        experts: (&Tensor, &Tensor, &Tensor),
        shared: Option<&MoeShared<'_>>,
        y: &mut Tensor,
        dims: (usize, usize, usize, usize, usize),
    ) -> Result<()> {
        let (t, k, e, h, inter) = dims;
        let (gate, up, down) = experts;
        let (xd, gd, ud, dd) = (x.dev::<T>()?, gate.dev::<T>()?, up.dev::<T>()?, down.dev::<T>()?);
        let out = y.dev_mut::<f32>()?;
        if let Some(r) = route {
            // The decode GEMVs (with the shared expert: its fused direct form) and their router.
            let sd = shared.map(|s| shared_dev(s, s.down.dev::<T>()?, |w| w.dev::<T>())).transpose()?;
            let dims = [t, k, e, h, inter];
            return g
                .k
                .moe_experts_routed::<T>(xd, r, idx, w, gd, ud, dd, sd.as_ref(), out, dims, MoeGemv::from_env())
                .map_err(cuda_err);
        }
        let (idx, w) = (&*idx, &*w);
        if let Some(s) = shared {
            let sd = shared_dev(s, s.down.dev::<T>()?, |w| w.dev::<T>())?;
            return g
                .k
                .moe_experts_shared::<T>(xd, idx, w, gd, ud, dd, &sd, out, [t, k, e, h, inter])
                .map_err(cuda_err);
        }
        // The batch-invariant rule (f32, or deterministic mode) pins the per-row GEMV path:
        // the prefill tiles would make a row's result depend on how many rows share the call.
        if crate::tensor::cuda::batch_invariant(T::DTYPE) {
            g.k.moe_experts_invariant::<T>(xd, idx, w, gd, ud, dd, out, t, k, e, h, inter)
        } else {
            g.k.moe_experts::<T>(xd, idx, w, gd, ud, dd, out, t, k, e, h, inter)
        }
        .map_err(cuda_err)
    }
    crate::by_dtype!(
        x.dtype(),
        go(&g, x, route, &mut idx, &mut wts, (gate, up, down), shared, &mut y, (t, k, e, h, inter))
    )?;
    Ok((y, shared.is_some()))
}

/// The kernels' view of a shared expert with down weight `down` and `weight` the kernels' view
/// of a weight of its kind (its gate / up `[gate; up]` weight, or its f32 columns and gate
/// logit as f32 device tensors; checked by the caller).
pub(super) fn shared_dev<'a, W>(
    s: &MoeShared<'a>,
    down: W,
    weight: impl FnOnce(&'a Tensor) -> Result<W>,
) -> Result<MoeSharedDev<'a, W>> {
    let gu = match s.gu {
        SharedIn::Cols { gu, col0 } => SharedGu::Cols { gu: gu.dev::<f32>()?, stride: gu.last_dim(), col0 },
        SharedIn::Weights(w) => SharedGu::Weights(weight(w)?),
    };
    Ok(MoeSharedDev {
        gu,
        gate: s.gate.dev::<f32>()?,
        gate_stride: s.gate.last_dim(),
        gate_col: s.gate_col,
        down,
        inter: s.inter,
    })
}

/// `silu(g) · u` from f32 columns of `all` (see `Ops::swiglu_cols`).
pub fn swiglu_cols(all: &Tensor, col0: usize, inter: usize, dtype: DType) -> Result<Tensor> {
    let g = gpu_of(all, "swiglu_cols")?;
    let (t, stride) = (all.rows(), all.last_dim());
    let mut hsh = Tensor::empty_on(&g, [t, inter], dtype)?;
    fn act<T: DevType>(g: &Gpu, all: &Tensor, h: &mut Tensor, dims: (usize, usize, usize, usize)) -> Result<()> {
        let (t, i, stride, col0) = dims;
        g.k.swiglu_f32in::<T>(all.dev::<f32>()?, h.dev_mut::<T>()?, t, i, stride, col0).map_err(cuda_err)
    }
    crate::by_dtype!(dtype, act(&g, all, &mut hsh, (t, inter, stride, col0)))?;
    Ok(hsh)
}

/// `y += sigmoid(round(all[:, gate_col])) · so` (see `Ops::shared_expert_add`).
pub fn shared_expert_add(y: &mut Tensor, so: &Tensor, all: &Tensor, gate_col: usize) -> Result<()> {
    let g = gpu_of(y, "shared_expert_add")?;
    let (h, stride) = (y.last_dim(), all.last_dim());
    fn add<T: DevType>(g: &Gpu, y: &mut Tensor, so: &Tensor, all: &Tensor, dims: (usize, usize, usize)) -> Result<()> {
        let (h, stride, gcol) = dims;
        let t = so.rows();
        g.k.shared_expert_add_f32g::<T>(y.dev_mut::<f32>()?, so.dev::<T>()?, all.dev::<f32>()?, t, h, stride, gcol)
            .map_err(cuda_err)
    }
    crate::by_dtype!(so.dtype(), add(&g, y, so, all, (h, stride, gate_col)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fused only in the direct form and only with the shared down weight of the routed
    /// weights' kind (and the activations' dtype for dense weights).
    #[test]
    fn shared_expert_fuses_only_with_matching_weights_in_the_direct_form() {
        use WeightKind::*;
        let bf = Dense(DType::BF16);
        assert!(fuse_shared(true, bf, bf, DType::BF16));
        assert!(fuse_shared(true, Fp8, Fp8, DType::BF16));
        assert!(fuse_shared(true, Dense(DType::F32), Dense(DType::F32), DType::F32));
        assert!(!fuse_shared(false, bf, bf, DType::BF16), "not in the v1 / v2 / prefill paths");
        assert!(!fuse_shared(false, Fp8, Fp8, DType::BF16));
        assert!(!fuse_shared(true, Fp8, bf, DType::BF16), "FP8 routed, dense shared");
        assert!(!fuse_shared(true, bf, Fp8, DType::BF16), "dense routed, FP8 shared");
        assert!(!fuse_shared(true, bf, Dense(DType::F16), DType::BF16), "another dtype");
        assert!(!fuse_shared(true, bf, bf, DType::F16), "weights not of the activations' dtype");
        assert!(!fuse_shared(true, Mixed, bf, DType::BF16));
    }

    /// Weight kinds of host tensors (no device needed): dense of their dtype, mixed dtypes.
    #[test]
    fn weight_kinds() {
        let a = Tensor::from_vec(vec![0.0; 4], [2, 2], DType::BF16).unwrap();
        let b = Tensor::from_vec(vec![0.0; 4], [2, 2], DType::F32).unwrap();
        assert_eq!(kind_of(&[&a, &a]), WeightKind::Dense(DType::BF16));
        assert_eq!(kind_of(&[&a, &b]), WeightKind::Mixed);
        assert_eq!(kind_of(&[]), WeightKind::Mixed);
    }
}
