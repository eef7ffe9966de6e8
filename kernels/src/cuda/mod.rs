//! CUDA kernels: sources embedded from `kernels/cuda/*.cu` with `include_str!`,
//! compiled at first use by NVRTC for the device's architecture, and launched
//! through safe wrappers (methods of [`CudaKernels`]).
//!
//! Semantics follow the CPU kernels ([`crate::cpu`]), which are the reference
//! every backend is tested against (`kernels/tests/cuda_kernels.rs`). Storage
//! types are `f32` and `bf16` ([`CudaFloat`]); the math is `f32`, and a `bf16`
//! output is rounded once, at the points where the CPU model rounds.
//!
//! Nothing here needs CUDA at build time (cudarc's `dynamic-loading`): the
//! driver (`libcuda`) and NVRTC (`libnvrtc`) are loaded on first use. With
//! `dynamic-loading`, a missing library is a *panic* inside cudarc, so every
//! entry point checks for the library first ([`gpu_available`],
//! [`nvrtc_available`]) and returns an error instead.
//!
//! Older GPUs (docs/older-gpus.md): the sm_80+ fast paths (cp.async, bf16 / f16 tensor
//! cores, large shared-memory tiles) have fallbacks, chosen at run time from the device's
//! compute capability and shared-memory limit ([`DeviceCaps`]); [`FALLBACK_ENV`]` = 1`
//! forces every fallback on any GPU.
//!
//! NVRTC needs the CUDA headers (`cuda_bf16.h` and what it includes): their
//! directory is `$PORTER_CUDA_INCLUDE`, else `/usr/local/cuda/include`
//! ([`cuda_include_dir`]).

/// Launches entry point `name` of `SOURCE` on the stream of a [`CudaKernels`] with `cfg`:
/// `launch!(kernels, SOURCE, name, cfg, [arg, ...])`.
///
/// The arguments are the kernel's parameters, in order: `ptr(buf)` for a buffer the kernel
/// reads (a `&impl DevicePtr`: passes its device address), `ptr_mut(buf)` for one it writes
/// (a `&mut impl DevicePtrMut`), or an expression of a [`KernelArg`] type (`u64`, `u32`,
/// `i32`, `f32`: a device address or a scalar). The buffers' guards live until the launch
/// is queued. Evaluates to `Result<()>`. It expands to a call of the unsafe
/// [`CudaKernels::launch`], so it goes inside `unsafe { }` with a `SAFETY` comment naming the
/// kernel signature the arguments match.
macro_rules! launch {
    (@push $s:ident, $a:ident,) => {};
    (@push $s:ident, $a:ident, ptr($e:expr) $(, $($rest:tt)*)?) => {
        let (p, _guard) = cudarc::driver::DevicePtr::device_ptr(&*$e, $s);
        $a.push(&p);
        launch!(@push $s, $a, $($($rest)*)?);
    };
    (@push $s:ident, $a:ident, ptr_mut($e:expr) $(, $($rest:tt)*)?) => {
        let (p, _guard) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut *$e, $s);
        $a.push(&p);
        launch!(@push $s, $a, $($($rest)*)?);
    };
    (@push $s:ident, $a:ident, $e:expr $(, $($rest:tt)*)?) => {
        let v = $e;
        $a.push(&v);
        launch!(@push $s, $a, $($($rest)*)?);
    };
    (@call $k:expr, |$kk:ident, $args:ident| $call:expr, [$($arg:tt)*]) => {{
        let $kk: &$crate::cuda::CudaKernels = $k;
        #[allow(unused_variables)] // when every argument is a value
        let s: &cudarc::driver::CudaStream = $kk.stream();
        let mut $args: Vec<&dyn $crate::cuda::KernelArg> = Vec::new();
        launch!(@push s, $args, $($arg)*);
        $call
    }};
    ($k:expr, $src:expr, $name:expr, $cfg:expr, [$($arg:tt)*] $(,)?) => {
        launch!(@call $k, |k, args| k.launch(&$src, &$name, $cfg, &args), [$($arg)*])
    };
}

/// [`launch!`] for a function already at hand (from [`CudaKernels::function_smem`]):
/// `launch_fn!(kernels, f, cfg, [arg, ...])`, expanding to the unsafe
/// [`CudaKernels::launch_fn`].
macro_rules! launch_fn {
    ($k:expr, $f:expr, $cfg:expr, [$($arg:tt)*] $(,)?) => {
        launch!(@call $k, |k, args| k.launch_fn(&$f, $cfg, &args), [$($arg)*])
    };
}

mod attention;
mod compile;
mod env;
mod fp8;
mod fp8_gemm;
mod gdn;
mod gdn_ba;
mod gdn_chunk;
mod gdn_fused;
mod gdn_seq;
mod knockout;
mod kv_quant;
mod misc;
mod moe;
mod moe_decode;
mod moe_mma;
mod moe_prefill;
mod moe_route;
mod norm_gemv;
mod ops;
mod qk_prep;
mod timeline;

pub use attention::{
    force_attn_decode, force_attn_decode_early, force_attn_decode_splits, force_attn_decode_timing, AttnDecode,
    AttnMode, AttnTc, DecodeTiming, ATTN_DECODE_EARLY_ENV, ATTN_DECODE_ENV, ATTN_DECODE_MIN_KEYS_ENV,
    ATTN_DECODE_SPLITS_ENV, ATTN_MAX_HEAD_DIM, ATTN_TC_DEFAULT, ATTN_TC_ENV, PAD_SLOT,
};
pub use compile::*;
use env::pdl_from;
pub use env::{
    env_count, env_fused, env_on_off, fallback_forced, smem_limit_from, DEFAULT_INCLUDE, FALLBACK_ENV, FALLBACK_SMEM,
    INCLUDE_ENV, PDL_ENV, SMEM_LIMIT_ENV,
};
pub use fp8::{
    fp8_row_map_affine, Fp8Dev, Fp8GemvConv, Fp8GemvForm, Fp8MoeDec, FP8_BLOCK, FP8_GEMVT_MAX_ROWS, FP8_GEMV_ENV,
    FP8_GEMV_FMA_M1_MIN, FP8_MOE_DEC_ENV,
};
pub use gdn::GDN_MAX_DK;
pub use gdn_ba::{gdn_ba_fused_enabled, GateProj, GDN_BA_ENV, GDN_BA_FUSED_MAX_ROWS};
pub use gdn_chunk::{GdnChunkForm, GDN_CHUNK_ENV, GDN_TC2_BV_ENV, GDN_TC6_CLUSTER_ENV, GDN_WU_OCC_ENV};
pub use gdn_fused::{
    gdn_fused_enabled, GdnFusedDims, GdnFusedShape, GDN_FUSED_ENV, GDN_FUSED_LANES_ENV, GDN_FUSED_MAX_KEY_HEADS,
};
pub use gdn_seq::DeltaNorm;
pub use knockout::{parse_rules as knockout_rules, KNOCKIN_ENV, KNOCKOUT_ENV, LAUNCH_TRACE_ENV};
pub use kv_quant::QuantPools;
pub use misc::{Gemm, GemvKind, GEMV_MAX_ROWS};
pub use moe::{MoeSharedDev, SharedGu, MOE_DECODE_PER_EXPERT_ENV};
pub use moe_decode::{MoeGemv, MOE_DOWNA_ENV, MOE_DOWN_ENV, MOE_GEMV_ENV, MOE_PHASES_ALL, MOE_SHARED_ENV};
pub use moe_mma::{moe_dec_of_process, MoeDec, MOE_DEC_ENV};
pub use moe_route::{MoeRouteDev, MoeRouter, MOE_ROUTER_ENV};
pub use norm_gemv::{norm_gemv_wanted, NormGemvAdd, NORM_GEMV_ENV, NORM_GEMV_MAX_ROWS};
pub use ops::{RmsNormKind, ROUTER_MAX_E, ROUTER_MAX_K};
pub use qk_prep::{qk_prep_enabled, QkNorm, QK_PREP_ENV, QK_PREP_MAX_HD};
pub use timeline::{analyse as timeline_analyse, TimelineReport, TimelineRow, TIMELINE_ENV};

use cudarc::driver::sys::{self, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DeviceSlice, DriverError,
    LaunchArgs, LaunchConfig, PushKernelArg, SyncOnDrop, ValidAsZeroBits,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex};

/// What the kernels may use on a device: its compute capability, its opt-in shared memory
/// per block, and whether the fallback paths are forced ([`FALLBACK_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Compute capability, major.
    pub major: i32,
    /// Compute capability, minor.
    pub minor: i32,
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, bytes.
    pub smem_optin: usize,
    /// [`FALLBACK_ENV`] was set when the kernels were opened.
    pub forced: bool,
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT` (grid sizes of persistent and split kernels).
    pub sms: usize,
}

impl DeviceCaps {
    /// Whether the kernels are compiled with `-DPORTER_FALLBACK=1` (when forced; below
    /// sm_80, `__CUDA_ARCH__` alone leaves the same paths out).
    pub fn fallback_build(&self) -> bool {
        self.forced
    }

    /// Whether the sm_80+ fast paths may run: bf16 / f16 tensor-core MMAs and cp.async
    /// staging. False below sm_80 and when forced.
    pub fn tensor_cores(&self) -> bool {
        self.major >= 8 && !self.forced
    }

    /// Whether the `sm_90a` builds of [`module_arch`] load and run here (wgmma, multicast bulk
    /// copies): an sm_90 device outside the fallback build.
    pub fn sm90a(&self) -> bool {
        self.major == 9 && self.minor == 0 && self.tensor_cores()
    }

    /// Dynamic shared memory a block may use, bytes: the opt-in limit, at most
    /// [`FALLBACK_SMEM`] when forced.
    pub fn smem_limit(&self) -> usize {
        if self.forced {
            self.smem_optin.min(FALLBACK_SMEM)
        } else {
            self.smem_optin
        }
    }
}

/// Error of the CUDA backend.
#[derive(Debug, Clone)]
pub enum CudaError {
    /// No usable driver, device or NVRTC library.
    Unavailable(String),
    /// The CUDA headers that NVRTC needs were not found.
    Headers(String),
    /// NVRTC rejected a source (the log says why).
    Compile {
        /// The `.cu` file.
        source: &'static str,
        /// NVRTC's log, or the error when there is none.
        log: String,
    },
    /// A CUDA driver call failed (allocation, module load, launch, ...).
    Driver(DriverError),
    /// Arguments that do not fit: a slice length, a dimension, a limit.
    Invalid(String),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Unavailable(m) => write!(f, "CUDA unavailable: {m}"),
            CudaError::Headers(m) => write!(f, "CUDA headers: {m}"),
            CudaError::Compile { source, log } => write!(f, "NVRTC failed to compile {source}:\n{log}"),
            CudaError::Driver(e) => write!(f, "CUDA driver error: {e}"),
            CudaError::Invalid(m) => write!(f, "invalid CUDA kernel arguments: {m}"),
        }
    }
}

impl std::error::Error for CudaError {}

impl From<DriverError> for CudaError {
    fn from(e: DriverError) -> Self {
        CudaError::Driver(e)
    }
}

/// Result of the CUDA backend.
pub type Result<T> = std::result::Result<T, CudaError>;

/// Storage type of a kernel operand: `f32`, `bf16` or `f16` (math is always `f32`).
pub trait CudaFloat: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// Suffix of the kernel entry points for this type.
    const NAME: &'static str;
    /// Converts to `f32` (exact).
    fn to_f32(self) -> f32;
    /// Converts from `f32`, rounding to nearest even.
    fn from_f32(v: f32) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

impl CudaFloat for f32 {
    const NAME: &'static str = "f32";
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl CudaFloat for half::f16 {
    const NAME: &'static str = "f16";
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

impl CudaFloat for half::bf16 {
    const NAME: &'static str = "bf16";
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
}

/// A CUDA context and stream, with the kernels of this crate compiled lazily
/// (per source, for the device's architecture) and their functions cached.
///
/// All launches go to [`CudaKernels::stream`]; they are asynchronous, so a
/// launch error may also surface at the next synchronisation.
#[derive(Debug)]
pub struct CudaKernels {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: &'static str,
    caps: DeviceCaps,
    /// Launch kernels as programmatic dependents of their predecessor ([`PDL_ENV`]).
    pdl: bool,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Entry-point names by function handle, kept only while a launch diagnostic is on
    /// ([`KNOCKOUT_ENV`], [`KNOCKIN_ENV`], [`LAUNCH_TRACE_ENV`], [`TIMELINE_ENV`]).
    names: Mutex<HashMap<usize, String>>,
    /// The MoE decode kernel's counters (`moe_decode::SYNC_WORDS` u32, zero between calls:
    /// the kernel zeroes what it used before it ends).
    moe_sync: Mutex<CudaSlice<u32>>,
    /// The device timeline's buffer and captured launch names, while [`TIMELINE_ENV`] is set.
    timeline: Option<Mutex<timeline::Timeline>>,
}

impl CudaKernels {
    /// Opens device `ordinal` and uses its default stream.
    ///
    /// # Errors
    /// [`CudaError::Unavailable`] without a driver or device (never panics for
    /// a missing `libcuda`); [`CudaError::Driver`] if the context cannot be made.
    pub fn new(ordinal: usize) -> Result<Self> {
        let n = gpu_available().map_err(CudaError::Unavailable)?;
        if ordinal >= n {
            return Err(CudaError::Unavailable(format!("device {ordinal} requested, {n} present")));
        }
        let ctx = CudaContext::new(ordinal)?;
        // A stream of our own: the legacy default stream cannot be captured into a CUDA graph.
        let stream = ctx.new_stream()?;
        Self::with_stream(stream)
    }

    /// Uses an existing stream (and its context). Reads the device's compute capability and
    /// opt-in shared memory per block (held to [`SMEM_LIMIT_ENV`] when set), and
    /// [`FALLBACK_ENV`] ([`DeviceCaps`]).
    ///
    /// # Errors
    /// [`CudaError::Driver`] if the compute capability or the shared-memory limit cannot be
    /// read, [`CudaError::Unavailable`] for an unknown capability, [`CudaError::Invalid`] for
    /// a malformed [`SMEM_LIMIT_ENV`].
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context().clone();
        let (major, minor) = ctx.compute_capability()?;
        let arch = arch_for(major, minor)?;
        let optin = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        let mut smem_optin = usize::try_from(optin).unwrap_or(0);
        if let Some(cap) = smem_limit_from(std::env::var_os(SMEM_LIMIT_ENV))? {
            smem_optin = smem_optin.min(cap);
        }
        let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let sms = usize::try_from(sms).unwrap_or(1).max(1);
        let caps = DeviceCaps { major, minor, smem_optin, forced: fallback_forced(), sms };
        // PDL needs sm_90; a forced fallback build stands for an older GPU, which has none.
        let pdl = pdl_from(std::env::var_os(PDL_ENV))? && major >= 9 && !caps.forced;
        // NVRTC for every module starts now, in parallel, while the caller loads its weights.
        precompile_in_background(arch, caps.fallback_build());
        let moe_sync = Mutex::new(stream.alloc_zeros::<u32>(moe_decode::SYNC_WORDS)?);
        let timeline = match timeline::records_from_env() {
            Some(n) => Some(Mutex::new(timeline::Timeline::new(&stream, n)?)),
            None => None,
        };
        Ok(Self {
            ctx,
            stream,
            arch,
            caps,
            pdl,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            names: Mutex::new(HashMap::new()),
            moe_sync,
            timeline,
        })
    }

    /// What the kernels may use on this device (capability, shared memory, forced fallback).
    pub fn caps(&self) -> DeviceCaps {
        self.caps
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// NVRTC architecture of the device (e.g. `"sm_90"`).
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// Compiles and loads every source now rather than at first use.
    ///
    /// # Errors
    /// As [`compile()`], or [`CudaError::Driver`] if a module fails to load.
    pub fn preload(&self) -> Result<()> {
        for s in sources() {
            self.module(s)?;
        }
        Ok(())
    }

    fn module(&self, src: &'static KernelSource) -> Result<Arc<CudaModule>> {
        if let Some(m) = self.modules.lock().unwrap_or_else(|e| e.into_inner()).get(src.name) {
            return Ok(m.clone());
        }
        let fallback = self.caps.fallback_build();
        let arch = module_arch(src, self.arch, fallback);
        // The cubin NVRTC built for this very architecture: the driver loads it as is, where
        // PTX would be JIT-compiled first (tens of seconds for the larger modules on a fresh
        // machine). A cubin the driver refuses (e.g. from an NVRTC newer than it) falls back
        // to the PTX.
        let m = match self.ctx.load_module(module_image(src, arch, fallback)?) {
            Ok(m) => m,
            Err(_) => self.ctx.load_module(compile_with(src, arch, fallback)?)?,
        };
        if let Some(t) = &self.timeline {
            t.lock().unwrap_or_else(|e| e.into_inner()).attach(&m, &self.stream)?;
        }
        self.modules.lock().unwrap_or_else(|e| e.into_inner()).insert(src.name, m.clone());
        Ok(m)
    }

    /// The entry point `name` of `src`.
    pub(crate) fn function(&self, src: &'static KernelSource, name: &str) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Ok(f.clone());
        }
        let f = self.module(src)?.load_function(name)?;
        if knockout::diag().active() || self.timeline.is_some() {
            self.names.lock().unwrap_or_else(|e| e.into_inner()).insert(f.cu_function() as usize, name.to_owned());
        }
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), f.clone());
        Ok(f)
    }

    /// The entry point `name` of `src`, allowed `smem` bytes of dynamic shared memory: from
    /// the default 48 KiB on, the opt-in attribute is raised to `smem`.
    ///
    /// # Errors
    /// As [`compile()`]; [`CudaError::Unavailable`] if `smem` passes
    /// [`DeviceCaps::smem_limit`]; [`CudaError::Driver`] if the attribute is refused.
    pub(crate) fn function_smem(&self, src: &'static KernelSource, name: &str, smem: usize) -> Result<CudaFunction> {
        let limit = self.caps.smem_limit();
        if smem > limit {
            return Err(CudaError::Unavailable(format!(
                "{name} needs {smem} bytes of shared memory a block, the device allows {limit} ({}{}); \
                 see docs/older-gpus.md",
                self.arch,
                if self.caps.forced { format!(", {FALLBACK_ENV}=1") } else { String::new() }
            )));
        }
        let f = self.function(src, name)?;
        if smem >= SMEM_DEFAULT {
            let bytes = i32::try_from(smem)
                .map_err(|_| CudaError::Invalid(format!("{name}: {smem} bytes of shared memory")))?;
            f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes)?;
        }
        Ok(f)
    }

    /// Launches entry point `name` of `src` on [`CudaKernels::stream`] with `cfg`, passing
    /// `args` as the kernel's parameters, in order.
    ///
    /// # Safety
    /// As [`CudaKernels::launch_fn`] for the function `name` of `src`.
    pub(crate) unsafe fn launch(
        &self,
        src: &'static KernelSource,
        name: &str,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<()> {
        let f = self.function(src, name)?;
        // SAFETY: the caller's contract, for this very function.
        unsafe { self.launch_fn(&f, cfg, args) }
    }

    /// Launches `f` (an entry point of this crate's sources, from [`CudaKernels::function`]
    /// or [`CudaKernels::function_smem`]) on [`CudaKernels::stream`] with `cfg`.
    ///
    /// # Safety
    /// - `args` are exactly `f`'s parameters, in order and of the C types it declares: a
    ///   `u64` device address for every pointer, `u32` / `i32` / `u64` / `f32` for every scalar.
    /// - Every address is live device memory of this context (not freed before the kernel
    ///   has run, in stream order) that holds every element the kernel reaches for these
    ///   arguments and `cfg`, or null where the kernel accepts null.
    /// - `cfg` is a launch shape the kernel supports (its block size, and at least the dynamic
    ///   shared memory it uses, within what [`CudaKernels::function_smem`] allowed).
    /// - Buffers the kernel writes are not read or written by other work in flight.
    pub(crate) unsafe fn launch_fn(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[&dyn KernelArg]) -> Result<()> {
        // Once, or with the launch diagnostics none (knocked out) or twice (knocked in).
        for _ in 0..self.launches(f, &cfg) {
            if self.pdl {
                let mut params: Vec<*mut c_void> = args.iter().map(|a| a.param()).collect();
                // SAFETY: the caller's contract; `params` points at `args`, alive across the call;
                // every kernel of this crate waits for its predecessor first (porter_pdl_enter).
                unsafe { self.launch_pdl(f, &cfg, &mut params) }?;
            } else {
                let mut b = self.stream.launch_builder(f);
                for a in args {
                    a.push(&mut b);
                }
                // SAFETY: the caller's contract (parameters, memory and launch shape of `f`).
                unsafe { b.launch(cfg) }?;
            }
        }
        Ok(())
    }

    /// How many times the launch of `f` with `cfg` is issued: 1, or with the launch
    /// diagnostics 0 ([`KNOCKOUT_ENV`]) or 2 ([`KNOCKIN_ENV`]); [`LAUNCH_TRACE_ENV`] prints it.
    /// Free when none is set.
    pub(crate) fn launches(&self, f: &CudaFunction, cfg: &LaunchConfig) -> usize {
        let d = knockout::diag();
        if !d.active() && self.timeline.is_none() {
            return 1;
        }
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let name = names.get(&(f.cu_function() as usize)).map_or("?", String::as_str);
        let n = if d.skips(name, cfg.grid_dim.0) {
            0
        } else if d.doubles(name, cfg.grid_dim.0) {
            2
        } else {
            1
        };
        if let Some(t) = &self.timeline {
            let capturing =
                matches!(self.stream.capture_status(), Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE));
            let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
            for _ in 0..n {
                t.note(name, capturing);
            }
        }
        if d.trace > 0 {
            static SEEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            if SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < d.trace {
                let note = [" (knocked out)", "", " (twice)"][n];
                eprintln!(
                    "launch {name} grid {:?} block {:?} smem {}{note}",
                    cfg.grid_dim, cfg.block_dim, cfg.shared_mem_bytes
                );
            }
        }
        n
    }

    /// Empties the device timeline's records (and with `names` the captured launch names, before
    /// a capture); nothing without [`TIMELINE_ENV`].
    ///
    /// # Errors
    /// [`CudaError::Driver`] if the upload fails.
    pub fn timeline_reset(&self, names: bool) -> Result<()> {
        match &self.timeline {
            Some(t) => t.lock().unwrap_or_else(|e| e.into_inner()).reset(&self.stream, names),
            None => Ok(()),
        }
    }

    /// The records since [`CudaKernels::timeline_reset`] analysed against the launches captured
    /// since the last reset with names ([`timeline_analyse`]); `None` without [`TIMELINE_ENV`].
    /// Synchronises the stream.
    ///
    /// # Errors
    /// [`CudaError::Driver`] if the download fails; the analysis's own complaint (too few
    /// records, nothing captured) is the inner `Err`.
    pub fn timeline_report(&self) -> Result<Option<std::result::Result<TimelineReport, String>>> {
        let Some(t) = &self.timeline else { return Ok(None) };
        let (rec, names) = t.lock().unwrap_or_else(|e| e.into_inner()).read(&self.stream)?;
        Ok(Some(timeline::analyse(&rec, &names)))
    }

    /// Whether kernels are launched as programmatic dependents of their predecessor
    /// ([`PDL_ENV`]).
    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// Launches `f` on the stream with `cfg` as a programmatic dependent of the grid before
    /// it (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, sm_90+): its blocks may
    /// start once every block of that grid has triggered (griddepcontrol.launch_dependents)
    /// or exited, and must griddepcontrol.wait before reading its outputs.
    ///
    /// # Safety
    /// `params` points at `f`'s parameters, in order, with their types; memory and launch
    /// shape as `f` requires; `f` waits for the grid before it wherever it reads that grid's
    /// outputs or writes what that grid reads, in every block.
    pub(crate) unsafe fn launch_pdl(
        &self,
        f: &CudaFunction,
        cfg: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.ctx.bind_to_thread()?;
        // SAFETY: plain-data C structs; every field is set below or meant to be zero.
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
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the caller's contract; `config` and `attr` outlive the call.
        unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()?;
        Ok(())
    }

    /// Checks that a device slice lives in this context and has `expected` elements.
    pub(crate) fn check<T>(&self, what: &str, s: &impl DeviceSlice<T>, expected: usize) -> Result<()> {
        if **s.stream().context() != *self.ctx {
            return Err(CudaError::Invalid(format!("`{what}` belongs to another CUDA context")));
        }
        if s.len() != expected {
            return Err(CudaError::Invalid(format!("`{what}` has {} elements, expected {expected}", s.len())));
        }
        Ok(())
    }
}

/// A kernel parameter passed by value: a `u64` device address or size, a `u32` / `i32`
/// size or flag, an `f32` scalar (the only C types the kernels of this crate take).
pub(crate) trait KernelArg {
    /// Appends `self` to the launch's parameter list.
    fn push<'a>(&'a self, b: &mut LaunchArgs<'a>);
    /// The address of `self`, as a `cuLaunchKernelEx` parameter pointer.
    fn param(&self) -> *mut c_void;
}

macro_rules! kernel_arg {
    ($($t:ty),*) => {$(
        impl KernelArg for $t {
            fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
                b.arg(self);
            }
            fn param(&self) -> *mut c_void {
                (self as *const $t).cast_mut().cast()
            }
        }
    )*};
}
kernel_arg!(u64, u32, i32, f32);

/// Dynamic shared memory a kernel may use without the opt-in attribute.
const SMEM_DEFAULT: usize = 48 * 1024;

/// Threads of a block of the element-wise (grid-stride) kernels.
pub(crate) const EW_THREADS: u32 = 256;

/// Launch shape of an element-wise kernel over `n` elements: [`EW_THREADS`] threads a block,
/// [`grid_for`] blocks.
pub(crate) fn ew_cfg(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid_for(n, EW_THREADS), 1, 1), block_dim: (EW_THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// One block per row: a multiple of 32 threads, at most `max`, no more than a row of `d`
/// elements needs.
pub(crate) fn row_threads(d: usize, max: u32) -> u32 {
    let t = d.div_ceil(32).saturating_mul(32).clamp(32, max as usize);
    t as u32
}

/// Launch shape of one block of `threads` per row, with `shared` bytes of dynamic shared memory.
pub(crate) fn rows_cfg(rows: usize, threads: u32, shared: u32) -> Result<LaunchConfig> {
    Ok(LaunchConfig { grid_dim: (u32_of("rows", rows)?, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: shared })
}

/// The device address of an optional buffer and its guard: 0 (null, which the kernels taking
/// an optional buffer test for) and no guard for `None`.
pub(crate) fn opt_ptr<'a, T>(v: Option<&'a impl DevicePtr<T>>, s: &'a CudaStream) -> (u64, Option<SyncOnDrop<'a>>) {
    match v {
        Some(v) => {
            let (p, g) = v.device_ptr(s);
            (p, Some(g))
        }
        None => (0, None),
    }
}

/// [`opt_ptr`] of a buffer the kernel writes (its guard records the write).
pub(crate) fn opt_ptr_mut<'a, T>(
    v: Option<&'a mut impl cudarc::driver::DevicePtrMut<T>>,
    s: &'a CudaStream,
) -> (u64, Option<SyncOnDrop<'a>>) {
    match v {
        Some(v) => {
            let (p, g) = v.device_ptr_mut(s);
            (p, Some(g))
        }
        None => (0, None),
    }
}

/// `a · b · ...` with overflow checked.
pub(crate) fn prod(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| CudaError::Invalid(format!("size {dims:?} overflows usize")))
}

/// `n` as a kernel's `u32` parameter.
pub(crate) fn u32_of(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| CudaError::Invalid(format!("{what} = {n} does not fit in u32")))
}

/// Blocks of `threads` for a grid-stride loop over `n` elements (at least 1,
/// capped so that the grid stays small; the kernels loop).
pub(crate) fn grid_for(n: usize, threads: u32) -> u32 {
    let blocks = n.div_ceil(threads as usize).clamp(1, 1 << 20);
    blocks as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_choose_the_paths() {
        let h200 = DeviceCaps { major: 9, minor: 0, smem_optin: 232_448, forced: false, sms: 132 };
        assert!(h200.tensor_cores() && !h200.fallback_build() && h200.smem_limit() == 232_448);
        let forced = DeviceCaps { forced: true, ..h200 };
        assert!(!forced.tensor_cores() && forced.fallback_build() && forced.smem_limit() == FALLBACK_SMEM);
        let v100 = DeviceCaps { major: 7, minor: 0, smem_optin: 98_304, forced: false, sms: 80 };
        assert!(!v100.tensor_cores() && !v100.fallback_build() && v100.smem_limit() == 98_304);
        let t4 = DeviceCaps { major: 7, minor: 5, smem_optin: 65_536, forced: true, sms: 40 };
        assert_eq!(t4.smem_limit(), 65_536);
    }

    #[test]
    fn arch_names() {
        assert_eq!(arch_for(9, 0).ok(), Some("sm_90"));
        assert!(arch_for(1, 0).is_err());
    }

    #[test]
    fn sources_embed_the_prelude() {
        for s in sources() {
            let t = s.full_text();
            assert!(t.contains("#include <cuda_bf16.h>") && t.contains(&format!("#line 1 \"{}\"", s.name)));
        }
    }

    #[test]
    fn gpu_guard_never_panics() {
        // On a machine without CUDA this is an Err with a reason; with a GPU, a count.
        match gpu_available() {
            Ok(n) => assert!(n > 0),
            Err(e) => assert!(!e.is_empty()),
        }
        let _ = nvrtc_available();
    }
}
