//! Programmatic dependent launch (PDL, sm_90+): every kernel of this crate may start while
//! the kernel before it in the stream is still running, and waits for it only where it first
//! needs its results.
//!
//! A decode step is a chain of a few hundred small kernels, each of which reads what the one
//! before wrote. Launched plainly, a kernel's blocks are scheduled only once the previous
//! grid has drained and flushed: every boundary costs the block launch and ramp-up of the
//! next kernel (about 1–2 µs on an H200, also inside a CUDA graph). With the launch attribute
//! `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, the next kernel's blocks are
//! scheduled as soon as every block of the running kernel has executed
//! `griddepcontrol.launch_dependents`, and they block in `griddepcontrol.wait` until the
//! running kernel has completed and its memory is visible.
//!
//! The device side is [`with_pdl_entry`]: the text NVRTC compiles gets `PORTER_PDL_ENTRY();`
//! (common.cuh: `griddepcontrol.wait; griddepcontrol.launch_dependents;` on sm_90+, nothing
//! below or in a fallback build) as the first statement of every `extern "C" __global__`
//! entry point, so that
//! - no kernel reads or writes memory before the kernels ahead of it have completed (the
//!   wait comes before any other statement, early returns included), which keeps the stream
//!   order every caller relies on: "completed" is transitive because every kernel waits
//!   before it can complete;
//! - at most one kernel waits ahead of a running one (the trigger comes after the wait), so
//!   the blocks parked in `wait` take few of the running kernel's SM slots; a grid that
//!   relies on all its blocks being resident (the persistent MoE kernels) is fully scheduled
//!   before any dependent block, since the trigger fires only when every block has run it.
//!
//! Kernels of other libraries (cuBLAS) are launched by those libraries without the
//! attribute, so they keep plain stream order; a PDL kernel after one of them still waits
//! for it in `griddepcontrol.wait`.
//!
//! On by default where the device can (compute capability 9.0 and newer, no forced fallback
//! build); [`PDL_ENV`]`=0` turns it off (A/B runs, or a driver that refuses the attribute).

use super::{DeviceCaps, KernelArg, Result};
use cudarc::driver::{sys, CudaFunction, CudaStream, LaunchConfig};
use std::ffi::c_void;

/// Environment variable turning programmatic dependent launch off (`0`, `false`, `no`,
/// `off`) or on (`1`, `true`, `yes`, `on`, the default where the device supports it). Read
/// when the kernels are opened; another value warns once on stderr and means the default.
pub const PDL_ENV: &str = "PORTER_PDL";

/// The statement placed first in every entry point (defined in common.cuh).
const ENTRY: &str = " PORTER_PDL_ENTRY();";

/// Whether launches use PDL on a device with `caps`, given the value of [`PDL_ENV`]
/// (`Err`: the value is not understood; the caller warns and takes the default).
pub(crate) fn pdl_from(v: Option<&std::ffi::OsStr>, caps: DeviceCaps) -> std::result::Result<bool, String> {
    let able = caps.major >= 9 && !caps.forced;
    let Some(v) = v else { return Ok(able) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" => Ok(able),
        "1" | "true" | "yes" | "on" => Ok(able),
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

/// `code` with [`ENTRY`] inserted after the opening brace of every `extern "C" __global__`
/// entry point (the first `{` after the keyword: parameter lists and `__launch_bounds__`
/// hold none; the words in a `//` comment are not an entry point). Entry points defined inside a macro get it on the macro's line, so line
/// numbers of compile errors do not move.
pub(crate) fn with_pdl_entry(code: &str) -> String {
    const KEY: &str = "extern \"C\" __global__";
    let mut out = String::with_capacity(code.len() + 4096);
    let mut rest = code;
    while let Some(at) = rest.find(KEY) {
        let after = at + KEY.len();
        // In a `//` comment: not an entry point.
        let line = rest[..at].rfind('\n').map_or(0, |i| i + 1);
        if rest[line..at].contains("//") {
            out.push_str(&rest[..after]);
            rest = &rest[after..];
            continue;
        }
        let Some(brace) = rest[after..].find('{') else { break };
        let cut = after + brace + 1;
        out.push_str(&rest[..cut]);
        out.push_str(ENTRY);
        rest = &rest[cut..];
    }
    out.push_str(rest);
    out
}

/// Launches `f` with `params` (one pointer to each parameter's value, in order) and the PDL
/// attribute on `stream`.
///
/// # Safety
/// As [`super::CudaKernels::launch_fn`]; `f` is an entry point of this crate's sources (it
/// starts with `PORTER_PDL_ENTRY()`), and every pointer of `params` is live for the call.
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

    #[test]
    fn every_entry_point_waits_first() {
        let src = "// extern \"C\" __global__ in a comment\n\
                   extern \"C\" __global__ void __launch_bounds__(256, 2) a(const float* x) {\n  if (x) return;\n}\n\
                   // then extern \"C\" __global__ again, in a comment {\n\
                   #define K(N) extern \"C\" __global__ void k_##N(u32 n) { body(n); }\n";
        let out = with_pdl_entry(src);
        assert!(out.contains("a(const float* x) { PORTER_PDL_ENTRY();\n  if (x) return;"), "{out}");
        assert!(out.contains("k_##N(u32 n) { PORTER_PDL_ENTRY(); body(n); }"), "{out}");
        assert_eq!(out.lines().count(), src.lines().count());
    }

    /// Every entry point of every source gets the wait, and nothing else changes.
    #[test]
    fn all_sources_are_covered() {
        for s in super::super::sources() {
            let text = with_pdl_entry(s.code);
            let code: String = s.code.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
            let kernels = code.matches("__global__").count();
            let entries = code.matches("extern \"C\" __global__").count();
            assert_eq!(kernels, entries, "{}: a __global__ that is not extern \"C\" would not wait", s.name);
            assert_eq!(text.matches("{ PORTER_PDL_ENTRY();").count(), entries, "{}", s.name);
            assert_eq!(text.replace(ENTRY, ""), s.code, "{}", s.name);
        }
    }
}
