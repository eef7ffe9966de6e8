//! Compute devices and CUDA detection.

use std::fmt;
use std::str::FromStr;

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(Device::Cuda(i)),
                _ => Err(format!("unknown device `{s}` (expected cpu, cuda or cuda:N)")),
            },
        }
    }
}

/// Number of CUDA devices, or the reason there are none.
///
/// With cudarc's `dynamic-loading`, touching the driver API when `libcuda` is absent is a
/// panic, so the library's presence is checked first, then the device count.
pub fn cuda_device_count() -> Result<usize, String> {
    // SAFETY: only probes whether the shared library can be loaded.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        return Err("no CUDA driver library (libcuda) found".into());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err("the CUDA driver reports no devices".into()),
        Err(e) => Err(format!("CUDA driver error while counting devices: {e}")),
    }
}

/// The default device: CUDA when a device is present and the CUDA backend can run the
/// model, else the CPU.
pub fn default_device() -> Device {
    if cuda_device_count().is_ok() && crate::tensor::CUDA_BACKEND_AVAILABLE {
        Device::Cuda(0)
    } else {
        Device::Cpu
    }
}

/// Checks that `device` can run models, with a clear error otherwise.
pub fn check_device(device: Device) -> crate::error::Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(i) => {
            let n = cuda_device_count().map_err(|e| crate::err!(Device, "--device cuda: no CUDA device: {e}"))?;
            if i >= n {
                crate::bail!(Device, "--device cuda:{i}: only {n} CUDA device(s) present");
            }
            if !crate::tensor::CUDA_BACKEND_AVAILABLE {
                crate::bail!(Device,
                    "--device cuda: a CUDA device is present but porter's CUDA backend is not built yet; use --device cpu"
                );
            }
            Ok(())
        }
    }
}
