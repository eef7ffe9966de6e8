//! Programmatic dependent launch (PDL, sm_90+) for the decode GEMVs: a GEMV's blocks start
//! while the small kernel before it (an RMSNorm, the gated norm) is still running, prefetch
//! their weight rows into L2, and only then wait for that kernel's output.
//!
//! A decode step at batch 1 is a chain of small kernels; between a one-block norm and the
//! GEMV that reads its output the GPU's memory system sits idle for the norm's whole run
//! (3–4 µs on an H200, ncu) plus the GEMV's launch and ramp-up. With the launch attribute
//! `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` on the GEMV, its blocks are
//! scheduled as soon as every block of the kernel before it has executed
//! `griddepcontrol.launch_dependents` (`PORTER_PDL_TRIGGER()`, the first statement of the
//! norm kernels); they issue `prefetch.global.L2` for their weight rows — memory that no
//! kernel writes — and block in `griddepcontrol.wait` (`PORTER_PDL_WAIT()`) until the norm has
//! completed and its writes are visible, before they read x or write anything.
//!
//! Only the GEMV is launched with the attribute, so only it can start early, and it waits
//! before it touches memory another kernel writes; every other launch keeps plain stream
//! order (a trigger in a kernel whose successor lacks the attribute does nothing). Session 8
//! put a wait-then-trigger into every kernel (no overlap of work: no gain, docs/benchmarks.md);
//! here the overlap is the weight traffic itself.
//!
//! On by default where the device can (compute capability 9.0 and newer, no forced fallback
//! build); [`PDL_ENV`]`=0` turns it off (A/B runs, or a driver that refuses the attribute).
//! Inside a CUDA graph capture the attribute becomes a programmatic edge of the graph.

use super::{DeviceCaps, KernelArg, Result};
use cudarc::driver::{sys, CudaFunction, CudaStream, LaunchConfig};
use std::ffi::c_void;

/// Environment variable turning programmatic dependent launch of the decode GEMVs off (`0`,
/// `false`, `no`, `off`) or on (`1`, `true`, `yes`, `on`, the default where the device
/// supports it). Read when the kernels are opened; another value warns once on stderr and
/// means the default.
pub const PDL_ENV: &str = "PORTER_PDL";

/// Whether the GEMVs launch with PDL on a device with `caps`, given the value of [`PDL_ENV`]
/// (`Err`: the value is not understood; the caller warns and takes the default).
pub(crate) fn pdl_from(v: Option<&std::ffi::OsStr>, caps: DeviceCaps) -> std::result::Result<bool, String> {
    let able = caps.major >= 9 && !caps.forced;
    let Some(v) = v else { return Ok(able) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" | "1" | "true" | "yes" | "on" => Ok(able),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(v.to_string_lossy().into_owned()),
    }
}

/// [`pdl_from`] for the process environment, warning once about a value it does not know.
pub(crate) fn pdl_enabled(caps: DeviceCaps) -> bool {
    let v = std::env::var_os(PDL_ENV);
    pdl_from(v.as_deref(), caps).unwrap_or_else(|bad| {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| eprintln!("warning: {PDL_ENV}={bad:?} is not one of 0, 1; using the default"));
        pdl_from(None, caps).unwrap_or(false)
    })
}

/// Launches `f` with `args` (its parameters, in order) and the PDL attribute on `stream`.
///
/// # Safety
/// As [`super::CudaKernels::launch_fn`]; in addition `f` executes `griddepcontrol.wait`
/// (`PORTER_PDL_WAIT()`) before it reads or writes any memory that earlier work in the
/// stream writes or reads.
pub(crate) unsafe fn launch_pdl(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &[&dyn KernelArg],
) -> Result<()> {
    let mut params: Vec<*mut c_void> = args.iter().map(|a| a.raw()).collect();
    // SAFETY: a plain-data C struct; every field is set below or valid as zero (`pad`).
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    stream.context().bind_to_thread()?;
    // SAFETY: `config` and `attr` live through the call; `params` holds one pointer per
    // kernel parameter (the caller's contract), the launch copies the values it points to.
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }.result()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(major: i32, forced: bool) -> DeviceCaps {
        DeviceCaps { major, minor: 0, smem_optin: 232_448, forced, sms: 132 }
    }

    #[test]
    fn on_by_default_from_sm90_only() {
        assert_eq!(pdl_from(None, caps(9, false)), Ok(true));
        assert_eq!(pdl_from(None, caps(8, false)), Ok(false));
        assert_eq!(pdl_from(None, caps(9, true)), Ok(false), "a forced fallback build has no griddepcontrol");
        assert_eq!(pdl_from(Some("0".as_ref()), caps(9, false)), Ok(false));
        assert_eq!(pdl_from(Some(" Off ".as_ref()), caps(9, false)), Ok(false));
        assert_eq!(pdl_from(Some("1".as_ref()), caps(8, false)), Ok(false), "asking cannot enable it below sm_90");
        assert_eq!(pdl_from(Some("sometimes".as_ref()), caps(9, false)), Err("sometimes".into()));
    }
}
