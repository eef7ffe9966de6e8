//! Random FP8 weights of [`super::Weights`] (`--quantize fp8` on a `--config` geometry).

use super::{random_on_device, random_values};
use crate::error::Result;
use crate::tensor::cuda::gpu;
use crate::tensor::{CpuStorage, DType, Device, Fp8Weight, Tensor};
use crate::{bail, err};

/// A random FP8 weight: [`random_values`] on the CPU (block-quantized on the host), or
/// [`random_on_device`] quantized by the device kernel (the dense values are dropped at once).
pub(super) fn random_fp8(device: Device, shape: &[usize], dt: DType, seed: u64, index: u64) -> Result<Tensor> {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape.iter().product::<usize>() / cols.max(1);
    match device {
        Device::Cpu => {
            let (q, scales) =
                porter_kernels::cpu::fp8::quantize_blocks(&random_values(shape, seed, index, dt), rows, cols);
            Tensor::from_host(CpuStorage::F8E4M3(Fp8Weight::new(q, scales, rows, cols, dt)?), shape.to_vec(), dt)
        }
        Device::Cuda(i) => {
            let g = gpu(i)?;
            let dense = random_on_device(&g, shape, dt, seed, index)?;
            let w = crate::backend::cuda::fp8::quantize(&g, &dense, rows, cols)?;
            Ok(crate::backend::cuda::fp8::tensor(&g, w, shape.to_vec()))
        }
    }
}

/// FP8 weights stacked along the rows (each part keeps its scales), on their device.
pub(super) fn concat_fp8(ts: Vec<Tensor>, dt: DType) -> Result<Tensor> {
    let mut shape = ts.first().map(|t| t.shape().to_vec()).ok_or_else(|| err!(Internal, "concat of no fp8 weights"))?;
    shape[0] = ts.iter().map(|t| t.dim(0)).sum();
    if let Some(Device::Cuda(i)) = ts.first().map(|t| t.device()) {
        let g = gpu(i)?;
        let w = crate::backend::cuda::fp8::concat(&g, &ts)?;
        return Ok(crate::backend::cuda::fp8::tensor(&g, w, shape));
    }
    let parts = ts.iter().map(|t| match t.host()? {
        CpuStorage::F8E4M3(w) => Ok(w.clone()),
        _ => bail!(Internal, "an fp8 part is not fp8"),
    });
    Tensor::from_host(CpuStorage::F8E4M3(Fp8Weight::concat(parts.collect::<Result<_>>()?)?), shape, dt)
}
