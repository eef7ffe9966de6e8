//! Finding the driver and NVRTC, the kernel sources (`kernels/cuda/*.cu`, embedded with
//! `include_str!`) and their compilation to PTX for a device architecture (cached per
//! source, architecture and fallback flag). Re-exported by the parent module.

use super::{CudaError, Result, DEFAULT_INCLUDE, INCLUDE_ENV};
use cudarc::driver::CudaContext;
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Number of CUDA devices, or why there is no usable one. Never panics.
///
/// Checks that the driver library can be loaded *before* asking for the device
/// count: with cudarc's `dynamic-loading`, calling into a missing `libcuda`
/// panics.
pub fn gpu_available() -> std::result::Result<usize, String> {
    // SAFETY: only tries to dlopen the driver library under its known names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no libcuda (the CUDA driver library is not installed or not on the library path)".into());
    }
    match std::panic::catch_unwind(CudaContext::device_count) {
        Ok(Ok(n)) if n > 0 => Ok(n as usize),
        Ok(Ok(_)) => Err("libcuda is present but reports no CUDA device".into()),
        Ok(Err(e)) => Err(format!("libcuda is present but cuInit / cuDeviceGetCount failed: {e}")),
        Err(_) => Err("libcuda is present but lacks a required entry point (driver too old?)".into()),
    }
}

/// Whether NVRTC can be loaded (compiling needs no GPU). Never panics.
pub fn nvrtc_available() -> std::result::Result<(), String> {
    // SAFETY: only tries to dlopen the NVRTC library under its known names.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(format!(
            "no libnvrtc (looked for libnvrtc.so and libnvrtc.so.{CUDA_MAJOR}; put its directory on LD_LIBRARY_PATH)"
        ))
    }
}

/// Major CUDA version the bindings are pinned to (cudarc feature `cuda-13000`, or
/// `cuda-12090` with this crate's feature `cuda-12`).
#[cfg(not(feature = "cuda-12"))]
const CUDA_MAJOR: u32 = 13;
/// Major CUDA version the bindings are pinned to (cudarc feature `cuda-12090`).
#[cfg(feature = "cuda-12")]
const CUDA_MAJOR: u32 = 12;

/// The version of the NVRTC library that was loaded, as (major, minor). cudarc's dynamic
/// loading tries `libnvrtc.so`, then `libnvrtc.so.<bindings' major>`, then `libnvrtc.so.12`
/// (and older), on the library path: which one a process got is what this reports. Never
/// panics.
///
/// # Errors
/// [`CudaError::Unavailable`] without NVRTC or if `nvrtcVersion` fails.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc_available().map_err(CudaError::Unavailable)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); nvrtcVersion writes two ints.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Unavailable(format!("nvrtcVersion failed: {rc:?}")));
    }
    Ok((major, minor))
}

/// The CUDA include directory for NVRTC: `$PORTER_CUDA_INCLUDE`, else
/// `/usr/local/cuda/include`.
///
/// # Errors
/// [`CudaError::Headers`] if `cuda_bf16.h` is not in that directory.
pub fn cuda_include_dir() -> Result<PathBuf> {
    include_dir_from(std::env::var_os(INCLUDE_ENV))
}

/// [`cuda_include_dir`] for a given value of the environment variable.
fn include_dir_from(var: Option<std::ffi::OsString>) -> Result<PathBuf> {
    let (dir, from_env) = match var {
        Some(d) if !d.is_empty() => (PathBuf::from(d), true),
        _ => (PathBuf::from(DEFAULT_INCLUDE), false),
    };
    if dir.join("cuda_bf16.h").is_file() {
        return Ok(dir);
    }
    let origin = if from_env { format!("from ${INCLUDE_ENV}") } else { format!("the default; {INCLUDE_ENV} is unset") };
    Err(CudaError::Headers(format!(
        "{}/cuda_bf16.h not found ({origin}); set {INCLUDE_ENV} to a CUDA include directory, e.g. \
         /usr/local/cuda/include or the nvidia/cu13/include folder of the `nvidia-cuda-runtime` wheel \
         (with `nvidia-cuda-crt` and `nvidia-cuda-cccl` installed beside it)",
        dir.display()
    )))
}

/// A CUDA source file of this crate, embedded with `include_str!`.
#[derive(Debug)]
pub struct KernelSource {
    /// File name under `kernels/cuda/`.
    pub name: &'static str,
    /// The file's text (without the shared prelude `common.cuh`).
    pub code: &'static str,
}

/// The shared prelude prepended to every source.
const PRELUDE: &str = include_str!("../../cuda/common.cuh");

/// Embedding gather, SwiGLU, sigmoid gate, RoPE.
pub(crate) static ELEMENTWISE: KernelSource =
    KernelSource { name: "elementwise.cu", code: include_str!("../../cuda/elementwise.cu") };
/// RMSNorm: standard, zero-centred, gated; an attention block's q / k norms, RoPE and gate
/// split in one launch (qk_prep.cu).
pub(crate) static NORM: KernelSource = KernelSource {
    name: "norm.cu",
    code: concat!(
        "#line 1 \"norm.cu\"\n",
        include_str!("../../cuda/norm.cu"),
        "\n#line 1 \"qk_prep.cu\"\n",
        include_str!("../../cuda/qk_prep.cu")
    ),
};
/// MoE router, argmax (router.cu, after router_sel.cu: the one-warp router's selection as a
/// device function, which the MOE and FP8 modules' direct gate+up kernels also run).
pub(crate) static ROUTER: KernelSource = KernelSource {
    name: "router.cu",
    code: concat!(
        "#line 1 \"router_sel.cu\"\n",
        include_str!("../../cuda/router_sel.cu"),
        "\n#line 1 \"router.cu\"\n",
        include_str!("../../cuda/router.cu")
    ),
};
/// Gated DeltaNet: gates, conv1d, recurrent step.
pub(crate) static GDN: KernelSource = KernelSource { name: "gdn.cu", code: include_str!("../../cuda/gdn.cu") };

/// The text of a tensor-core attention module that runs on the helpers of attention.cu
/// (kv_quant.cu's tile loaders, attention.cu and attention_tc.cu with their kernels left out by
/// `PORTER_ATTN_HELPERS_ONLY`), then the kernels of `$file` (`kernels/cuda/$file`).
macro_rules! attention_helpers_then {
    ($file:literal) => {
        concat!(
            "#define PORTER_ATTN_HELPERS_ONLY 1\n#line 1 \"kv_quant.cu\"\n",
            include_str!("../../cuda/kv_quant.cu"),
            "\n#line 1 \"attention.cu\"\n",
            include_str!("../../cuda/attention.cu"),
            "\n#line 1 \"attention_tc.cu\"\n",
            include_str!("../../cuda/attention_tc.cu"),
            "\n#line 1 \"",
            $file,
            "\"\n",
            include_str!(concat!("../../cuda/", $file))
        )
    };
}

/// Causal GQA attention over a paged KV cache (model-dtype or quantized pools), KV append
/// (kv_quant.cu, the quantized pools' encoders and append, comes first; attention.cu's CUDA-core
/// kernels, then its wmma tensor-core prefill path attention_tc.cu), and on-device sampling
/// (sampling.cu).
pub(crate) static ATTENTION: KernelSource = KernelSource {
    name: "attention.cu",
    code: concat!(
        include_str!("../../cuda/kv_quant.cu"),
        "\n#line 1 \"attention.cu\"\n",
        include_str!("../../cuda/attention.cu"),
        "\n#line 1 \"attention_tc.cu\"\n",
        include_str!("../../cuda/attention_tc.cu"),
        "\n#line 1 \"sampling.cu\"\n",
        include_str!("../../cuda/sampling.cu")
    ),
};
/// The raw mma.sync prefill attention (attention_mma.cu, on the helpers of kv_quant.cu,
/// attention.cu and attention_tc.cu, whose kernels `PORTER_ATTN_HELPERS_ONLY` leaves out): a
/// module of its own, compiled only when a launch asks for one
/// of its kernels (its ~16 MB of PTX take about a minute of NVRTC and more of the driver's JIT,
/// which a path that does not use it should not pay).
pub(crate) static ATTENTION_MMA: KernelSource =
    KernelSource { name: "attention_mma.cu", code: attention_helpers_then!("attention_mma.cu") };
/// The wgmma (Hopper warpgroup MMA) prefill attention (attention_wgmma.cu, on the same helpers
/// as [`ATTENTION_MMA`]): a module of its own, compiled only when a launch asks for one of its
/// kernels, for `sm_90a` on an sm_90 device ([`module_arch`]); elsewhere its kernels trap and
/// are never chosen.
pub(crate) static ATTENTION_WGMMA: KernelSource =
    KernelSource { name: "attention_wgmma.cu", code: attention_helpers_then!("attention_wgmma.cu") };
/// The tensor-core decode attention (attention_decode.cu, on the same helpers as
/// [`ATTENTION_MMA`]): split-K over the paged cache with per-warp cp.async rings, mma.sync.
pub(crate) static ATTENTION_DECODE: KernelSource =
    KernelSource { name: "attention_decode.cu", code: attention_helpers_then!("attention_decode.cu") };
/// MoE dispatch: alignment by expert, grouped expert GEMMs, combine (moe.cu), the decode
/// GEMVs (moe_decode.cu, which uses moe.cu's grouping and combine; moe_direct.cu, the direct
/// form without grouping, with router_sel.cu's router before it for its fused router), the
/// direct decode form's
/// entry points with the shared expert fused in (moe_shared.cu, dense weights) and the prefill
/// path's parallel alignment and mma.sync grouped GEMMs (moe_prefill.cu, on moe.cu's helpers),
/// and the tensor-core decode experts (moe_dec_mma.cu: the swap-AB core shared with the FP8
/// module, and its dense entry points).
pub(crate) static MOE: KernelSource = KernelSource {
    name: "moe.cu",
    code: concat!(
        include_str!("../../cuda/moe.cu"),
        "\n#line 1 \"moe_decode.cu\"\n",
        include_str!("../../cuda/moe_decode.cu"),
        "\n#line 1 \"router_sel.cu\"\n",
        include_str!("../../cuda/router_sel.cu"),
        "\n#line 1 \"moe_direct.cu\"\n",
        include_str!("../../cuda/moe_direct.cu"),
        "\n#line 1 \"moe_shared.cu\"\n",
        include_str!("../../cuda/moe_shared.cu"),
        "\n#line 1 \"moe_prefill.cu\"\n",
        include_str!("../../cuda/moe_prefill.cu"),
        "\n#line 1 \"moe_dec_mma.cu\"\n",
        include_str!("../../cuda/moe_dec_mma.cu")
    ),
};
/// The prefill path's grouped GEMMs on wgmma (moe_wgmma.cu, `PORTER_MOE_GEMM=wgmma`,
/// self-contained): a module of its own, compiled only when a launch asks for one of its
/// kernels, for `sm_90a` on an sm_90 device ([`module_arch`]); elsewhere its kernels trap and
/// are never chosen.
pub(crate) static MOE_WGMMA: KernelSource =
    KernelSource { name: "moe_wgmma.cu", code: include_str!("../../cuda/moe_wgmma.cu") };
/// Gated DeltaNet multi-token path: conv window step, gates, multi-token recurrence (gdn_seq.cu),
/// and the decode / verify step in one launch (gdn_fused.cu: conv, gates, delta rule and the
/// gated RMSNorm of gdn_norm.cu).
pub(crate) static GDN_SEQ: KernelSource = KernelSource {
    name: "gdn_seq.cu",
    code: concat!(
        "#line 1 \"gdn_norm.cu\"\n",
        include_str!("../../cuda/gdn_norm.cu"),
        "\n#line 1 \"gdn_seq.cu\"\n",
        include_str!("../../cuda/gdn_seq.cu"),
        "\n#line 1 \"gdn_fused.cu\"\n",
        include_str!("../../cuda/gdn_fused.cu")
    ),
};
/// Gated DeltaNet chunked (64-token) prefill over spans: the f32 CUDA-core form (gdn_chunk.cu)
/// and the tensor-core forms for bf16 / f16 (gdn_chunk_tc.cu, which uses gdn_chunk.cu's helpers;
/// gdn_chunk_tc2.cu, the mma.sync state sweep of `PORTER_GDN_CHUNK=tc2`; gdn_chunk_tc4.cu, the
/// mma.sync wu launch of `tc4`; gdn_chunk_tc5.cu, the warp-pair state sweep of `tc5`;
/// gdn_chunk_tc6.cu, that sweep with its stages multicast across a thread-block cluster, `tc6`,
/// for which the module is compiled for `sm_90a` on an sm_90 device, [`module_arch`]).
pub(crate) static GDN_CHUNK: KernelSource = KernelSource {
    name: "gdn_chunk.cu",
    code: concat!(
        include_str!("../../cuda/gdn_chunk.cu"),
        "\n#line 1 \"gdn_chunk_tc.cu\"\n",
        include_str!("../../cuda/gdn_chunk_tc.cu"),
        "\n#line 1 \"gdn_chunk_tc2.cu\"\n",
        include_str!("../../cuda/gdn_chunk_tc2.cu"),
        "\n#line 1 \"gdn_chunk_tc4.cu\"\n",
        include_str!("../../cuda/gdn_chunk_tc4.cu"),
        "\n#line 1 \"gdn_chunk_tc5.cu\"\n",
        include_str!("../../cuda/gdn_chunk_tc5.cu"),
        "\n#line 1 \"gdn_chunk_tc6.cu\"\n",
        include_str!("../../cuda/gdn_chunk_tc6.cu")
    ),
};
/// Glue for the model path: residual adds, casts, strided copies, bias, sampling, the skinny
/// decode GEMV, and the GEMV with the RMSNorm before it fused in (norm_gemv.cu).
pub(crate) static MISC: KernelSource = KernelSource {
    name: "misc.cu",
    code: concat!(
        "#line 1 \"gdn_norm.cu\"\n",
        include_str!("../../cuda/gdn_norm.cu"),
        "\n#line 1 \"misc.cu\"\n",
        include_str!("../../cuda/misc.cu"),
        "\n#line 1 \"gemv_pdl.cu\"\n",
        include_str!("../../cuda/gemv_pdl.cu"),
        "\n#line 1 \"norm_rows.cu\"\n",
        include_str!("../../cuda/norm_rows.cu"),
        "\n#line 1 \"norm_gemv.cu\"\n",
        include_str!("../../cuda/norm_gemv.cu")
    ),
};
/// FP8 weights: dequantizing GEMV, dequantize / quantize, the FP8 row reader of the MoE decode
/// GEMVs (fp8.cu), their direct form with the shared expert fused in (moe_shared.cu's FP8 entry
/// points), and the FP8 prefill GEMMs (fp8_gemm.cu: tile-dequantizing tensor-core GEMMs,
/// dense and grouped, activation quantization, e4m3 MMA), and the tensor-core decode experts
/// (fp8_moe_mma.cu, the FP8 format of moe_dec_mma.cu's core), and the tensor-core decode GEMV
/// (fp8_gemvt.cu). Built on the text of moe.cu and
/// moe_decode.cu + router_sel.cu + moe_direct.cu (the grouping, the decode GEMV templates, the vector helpers and the
/// tensor-core GEMM), compiled as a module of its own.
pub(crate) static FP8: KernelSource = KernelSource {
    name: "fp8.cu",
    code: concat!(
        "#line 1 \"moe.cu\"\n",
        include_str!("../../cuda/moe.cu"),
        "\n#line 1 \"moe_decode.cu\"\n",
        include_str!("../../cuda/moe_decode.cu"),
        "\n#line 1 \"router_sel.cu\"\n",
        include_str!("../../cuda/router_sel.cu"),
        "\n#line 1 \"moe_direct.cu\"\n",
        include_str!("../../cuda/moe_direct.cu"),
        "\n#line 1 \"fp8.cu\"\n",
        include_str!("../../cuda/fp8.cu"),
        "\n#line 1 \"norm_rows.cu\"\n",
        include_str!("../../cuda/norm_rows.cu"),
        "\n#line 1 \"fp8_norm.cu\"\n",
        include_str!("../../cuda/fp8_norm.cu"),
        "\n#define PORTER_FP8_MODULE 1\n#line 1 \"moe_shared.cu\"\n",
        include_str!("../../cuda/moe_shared.cu"),
        "\n#line 1 \"fp8_gemm.cu\"\n",
        include_str!("../../cuda/fp8_gemm.cu"),
        "\n#line 1 \"moe_dec_mma.cu\"\n",
        include_str!("../../cuda/moe_dec_mma.cu"),
        "\n#line 1 \"fp8_moe_mma.cu\"\n",
        include_str!("../../cuda/fp8_moe_mma.cu"),
        "\n#line 1 \"fp8_gemvt.cu\"\n",
        include_str!("../../cuda/fp8_gemvt.cu")
    ),
};

/// Every CUDA source of the crate.
pub fn sources() -> [&'static KernelSource; 14] {
    [
        &ELEMENTWISE,
        &NORM,
        &ROUTER,
        &GDN,
        &ATTENTION,
        &ATTENTION_MMA,
        &ATTENTION_WGMMA,
        &ATTENTION_DECODE,
        &MOE,
        &MOE_WGMMA,
        &GDN_SEQ,
        &GDN_CHUNK,
        &MISC,
        &FP8,
    ]
}

/// The NVRTC architecture `src` is compiled for on a device of architecture `arch`: `sm_90a`
/// (the Hopper-only wgmma instructions; the multicast bulk copies of gdn_chunk_tc6.cu, which
/// are slow outside sm_90a) for `ATTENTION_WGMMA`, `MOE_WGMMA` and `GDN_CHUNK` on sm_90
/// outside the fallback build, else `arch`.
pub fn module_arch(src: &KernelSource, arch: &'static str, fallback: bool) -> &'static str {
    let hopper = [&ATTENTION_WGMMA, &MOE_WGMMA, &GDN_CHUNK].into_iter().any(|m| std::ptr::eq(src, m));
    if hopper && arch == "sm_90" && !fallback {
        "sm_90a"
    } else {
        arch
    }
}

impl KernelSource {
    /// The text NVRTC compiles: the prelude, then the file (line numbers of
    /// errors refer to the file).
    pub fn full_text(&self) -> String {
        // The device timeline's build (PORTER_TIMELINE): its own text, so its own cache entries.
        let tl = if super::timeline::records_from_env().is_some() { "#define PORTER_TIMELINE 1\n" } else { "" };
        format!("{tl}{PRELUDE}\n#line 1 \"{}\"\n{}", self.name, self.code)
    }
}

/// NVRTC `--gpu-architecture` for a compute capability.
///
/// # Errors
/// [`CudaError::Unavailable`] for a capability this crate has no name for.
pub fn arch_for(major: i32, minor: i32) -> Result<&'static str> {
    Ok(match (major, minor) {
        (7, 0) => "sm_70",
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (10, 3) => "sm_103",
        (11, 0) => "sm_110",
        (12, 0) => "sm_120",
        (12, 1) => "sm_121",
        _ => return Err(CudaError::Unavailable(format!("unsupported compute capability {major}.{minor}"))),
    })
}

/// Every architecture name [`arch_for`] can return, oldest first.
pub const ARCHS: [&str; 12] =
    ["sm_70", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"];

/// The architecture a user names: `sm_90`, `90` or `9.0` (as [`arch_for`] would name it), or
/// `None` for a name not in [`ARCHS`].
pub fn arch_named(name: &str) -> Option<&'static str> {
    let n = name.trim().to_ascii_lowercase();
    let digits = match n.split_once('.') {
        Some((major, minor)) if !major.is_empty() && minor.len() == 1 => format!("{major}{minor}"),
        _ => n.trim_start_matches("sm_").trim_start_matches("compute_").to_string(),
    };
    ARCHS.iter().copied().find(|a| a[3..] == digits)
}

/// What [`precompile`] did for one (source, build).
#[derive(Debug, Clone)]
pub struct Precompiled {
    /// The module's file name (`moe.cu`, …).
    pub source: &'static str,
    /// NVRTC `--gpu-architecture`.
    pub arch: &'static str,
    /// The forced-fallback build ([`FALLBACK_ENV`](super::FALLBACK_ENV)).
    pub fallback: bool,
    /// Bytes of the image a device loads: the cubin (the PTX where NVRTC gave none).
    pub bytes: usize,
    /// Wall time of this compilation (or of reading it back).
    pub seconds: f64,
    /// The on-disk cache already held it ([`KERNEL_CACHE_ENV`]): nothing was compiled.
    pub cached: bool,
    /// Its files in the on-disk cache (PTX and cubin), where there is one.
    pub files: Vec<PathBuf>,
}

/// Compiles `srcs` (e.g. every source of the crate, [`sources`], the opt-in modules included)
/// for each `(arch, fallback)` build, `threads` compilations at a time, into the process and on-disk
/// PTX caches ([`KERNEL_CACHE_ENV`]). Needs NVRTC and the CUDA headers, no GPU: a machine
/// without a GPU fills the cache that a GPU machine with the same NVRTC version then reads
/// (the cache key is the source text, the arch, the fallback flag and the NVRTC version), so
/// that its first process skips NVRTC. Blocks until every compilation ended.
///
/// # Errors
/// The first compilation error ([`compile_with`]'s errors).
pub fn precompile(
    srcs: &[&'static KernelSource],
    builds: &[(&'static str, bool)],
    threads: usize,
) -> Result<Vec<Precompiled>> {
    nvrtc_available().map_err(CudaError::Unavailable)?;
    cuda_include_dir()?;
    let jobs: Vec<(&'static str, bool, &'static KernelSource)> =
        builds.iter().flat_map(|&(a, f)| srcs.iter().map(move |&s| (a, f, s))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = Mutex::new(Vec::with_capacity(jobs.len()));
    std::thread::scope(|sc| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            sc.spawn(|| {
                while let Some(&(arch, fallback, src)) =
                    jobs.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    // The build a device of `arch` loads (sm_90a for the wgmma module on sm_90).
                    let arch = module_arch(src, arch, fallback);
                    let t0 = std::time::Instant::now();
                    let disk = disk_cache_path(src.name, &src.full_text(), arch, fallback);
                    let cached = disk.as_ref().is_some_and(|(path, header)| read_cached_cubin(path, header).is_some());
                    let files = disk.map_or_else(Vec::new, |(path, _)| vec![cubin_path(&path), path]);
                    let r = image(src, arch, fallback).map(|(_, bytes)| Precompiled {
                        source: src.name,
                        arch,
                        fallback,
                        bytes,
                        seconds: t0.elapsed().as_secs_f64(),
                        cached,
                        files,
                    });
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                }
            });
        }
    });
    let mut out = done.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().collect::<Result<Vec<_>>>()?;
    out.sort_by_key(|p| (p.arch, p.fallback, p.source));
    Ok(out)
}

/// The directory of the on-disk PTX cache ([`KERNEL_CACHE_ENV`], or its default), if any.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    cache_dir()
}

/// Process-wide module cache, keyed by (hash of the full source text, arch, fallback build).
type PtxKey = (u64, &'static str, bool);

/// What one NVRTC compilation produced: the PTX (text) and, for a real architecture, the
/// cubin (SASS the driver loads as is).
#[derive(Default)]
struct Built {
    ptx: Option<Ptx>,
    cubin: Option<Vec<u8>>,
}

/// One entry of the cache: its own lock, held while the source compiles, so that a second
/// caller of the same key (e.g. a launch while [`precompile_in_background`] is on it) waits for
/// that compilation instead of running its own.
type PtxSlot = std::sync::Arc<Mutex<Built>>;

/// The cache of [`compile_with`] and [`module_image`].
fn ptx_cache() -> &'static Mutex<HashMap<PtxKey, PtxSlot>> {
    static CACHE: OnceLock<Mutex<HashMap<PtxKey, PtxSlot>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The cache slot of `text` built for `arch` / `fallback`.
fn slot_of(text: &str, arch: &'static str, fallback: bool) -> PtxSlot {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    let key = (h.finish(), arch, fallback);
    ptx_cache().lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().clone()
}

/// Starts compiling every source the default paths use for `arch` on background threads, one
/// a source (once a process): NVRTC runs on as many cores as there are modules while the
/// caller loads weights, and a launch that needs a module waits only for what is left of its
/// compilation. The opt-in mma.sync attention module (`ATTENTION_MMA`) is left to its first
/// launch, as it was split off for; the tensor-core decode module (`ATTENTION_DECODE`) too,
/// unless `PORTER_ATTN_DECODE` selects it; the wgmma MoE module (`MOE_WGMMA`, the default
/// prefill GEMMs on sm_90) is compiled here only where it runs (sm_90, not the fallback
/// build). Failures are left for the launch that needs the module to report.
pub fn precompile_in_background(arch: &'static str, fallback: bool) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let moe_wg = arch == "sm_90" && !fallback;
        let decode = super::attention::decode_env_selected();
        for src in sources().into_iter().filter(|s| {
            ![&ATTENTION_MMA, &ATTENTION_WGMMA].iter().any(|o| std::ptr::eq(*s, *o))
                && (moe_wg || !std::ptr::eq(*s, &MOE_WGMMA))
                && (decode || !std::ptr::eq(*s, &ATTENTION_DECODE))
        }) {
            let _ = std::thread::Builder::new()
                .name(format!("nvrtc {}", src.name))
                .spawn(move || drop(module_image(src, module_arch(src, arch, fallback), fallback)));
        }
    });
}

/// Compiles `src` with NVRTC for `arch` (e.g. `"sm_90"`), or returns the cached
/// PTX of an earlier compilation of the same text for the same arch. Needs
/// NVRTC and the CUDA headers, no GPU.
///
/// # Errors
/// [`CudaError::Unavailable`] without NVRTC, [`CudaError::Headers`] without
/// `cuda_bf16.h`, [`CudaError::Compile`] with NVRTC's log.
pub fn compile(src: &KernelSource, arch: &'static str) -> Result<Ptx> {
    compile_with(src, arch, false)
}

/// [`compile`], as a fallback build when `fallback`: NVRTC gets `-DPORTER_FALLBACK=1`, so
/// the sm_80+ paths are left out as below sm_80 ([`FALLBACK_ENV`](super::FALLBACK_ENV)).
///
/// # Errors
/// As [`compile`].
pub fn compile_with(src: &KernelSource, arch: &'static str, fallback: bool) -> Result<Ptx> {
    let text = src.full_text();
    let slot = slot_of(&text, arch, fallback);
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = slot.ptx.as_ref() {
        return Ok(p.clone());
    }
    nvrtc_available().map_err(CudaError::Unavailable)?;
    let disk = disk_cache_path(src.name, &text, arch, fallback);
    if let Some(p) = disk.as_ref().and_then(|(path, header)| read_cached(path, header)) {
        slot.ptx = Some(p.clone());
        return Ok(p);
    }
    build_into(&mut slot, src, &text, arch, fallback, disk.as_ref())?;
    slot.ptx.clone().ok_or(CudaError::Compile { source: src.name, log: "NVRTC returned no PTX".into() })
}

/// What a device of `arch` loads for `src`: the cubin NVRTC built for that real architecture
/// (from the process cache, the on-disk cache, or a compilation now), so that the driver need
/// not JIT-compile PTX (a minute for the larger modules on a fresh machine); the PTX where no
/// cubin came out. [`CudaKernels`](super::CudaKernels) falls back to the PTX if the driver
/// refuses the cubin.
///
/// # Errors
/// As [`compile`].
pub fn module_image(src: &KernelSource, arch: &'static str, fallback: bool) -> Result<Ptx> {
    image(src, arch, fallback).map(|(img, _)| img)
}

/// [`module_image`] and its size in bytes.
fn image(src: &KernelSource, arch: &'static str, fallback: bool) -> Result<(Ptx, usize)> {
    let text = src.full_text();
    let slot = slot_of(&text, arch, fallback);
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    let cubin = |c: &[u8]| (Ptx::from_binary(c.to_vec()), c.len());
    if let Some(c) = slot.cubin.as_ref() {
        return Ok(cubin(c));
    }
    nvrtc_available().map_err(CudaError::Unavailable)?;
    let disk = disk_cache_path(src.name, &text, arch, fallback);
    if let Some(c) = disk.as_ref().and_then(|(path, header)| read_cached_cubin(path, header)) {
        let out = cubin(&c);
        slot.cubin = Some(c);
        return Ok(out);
    }
    build_into(&mut slot, src, &text, arch, fallback, disk.as_ref())?;
    match (&slot.cubin, &slot.ptx) {
        (Some(c), _) => Ok(cubin(c)),
        (None, Some(p)) => Ok((p.clone(), p.to_src().len())),
        (None, None) => Err(CudaError::Compile { source: src.name, log: "NVRTC returned nothing".into() }),
    }
}

/// Compiles `text` with NVRTC into `slot` (PTX and, for a real `arch`, the cubin) and writes
/// both to the on-disk cache at `disk`.
fn build_into(
    slot: &mut Built,
    src: &KernelSource,
    text: &str,
    arch: &'static str,
    fallback: bool,
    disk: Option<&(PathBuf, String)>,
) -> Result<()> {
    let include = cuda_include_dir()?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        format!("--include-path={}", include.to_string_lossy()),
        "--std=c++17".to_string(),
    ];
    if fallback {
        options.push("-DPORTER_FALLBACK=1".into());
    }
    let (ptx, cubin) =
        nvrtc_build(text, src.name, &options).map_err(|log| CudaError::Compile { source: src.name, log })?;
    if let Some((path, header)) = disk {
        write_cached(path, header, &ptx);
        if let Some(c) = &cubin {
            write_cached_cubin(path, header, c);
        }
    }
    slot.ptx = Some(ptx);
    slot.cubin = cubin;
    Ok(())
}

/// One NVRTC compilation: the PTX, and the cubin when `options` name a real architecture
/// (`sm_XX`); the error is NVRTC's log.
fn nvrtc_build(text: &str, name: &str, options: &[String]) -> std::result::Result<(Ptx, Option<Vec<u8>>), String> {
    use cudarc::nvrtc::{result, sys};
    let c_text = std::ffi::CString::new(text).map_err(|e| format!("source holds a NUL byte: {e}"))?;
    let c_name = std::ffi::CString::new(name).map_err(|e| format!("name holds a NUL byte: {e}"))?;
    let prog = result::create_program(&c_text, Some(&c_name)).map_err(|e| e.to_string())?;
    let log = |prog| {
        // SAFETY: `prog` is live (destroyed only below).
        unsafe { result::get_program_log(prog) }.map(|l| nvrtc_string(&l)).unwrap_or_default()
    };
    // SAFETY: `prog` came from create_program and is destroyed once, at the end; `c_text`
    // and `c_name` outlive it.
    let out = unsafe {
        match result::compile_program(prog, options) {
            Err(e) => Err(format!("{e}\n{}", log(prog))),
            Ok(()) => match result::get_ptx(prog) {
                Err(e) => Err(format!("nvrtcGetPTX: {e}")),
                Ok(ptx) => {
                    let ptx = Ptx::from_src(nvrtc_string(&ptx));
                    let mut size = 0usize;
                    let cubin = if sys::nvrtcGetCUBINSize(prog, &mut size).result().is_ok() && size > 0 {
                        let mut buf = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()).result().ok().map(|()| buf)
                    } else {
                        None
                    };
                    Ok((ptx, cubin))
                }
            },
        }
    };
    // SAFETY: as above; nothing uses `prog` after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// NVRTC's NUL-terminated text (the log, the PTX) as a string.
fn nvrtc_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Environment variable: the directory of the on-disk PTX cache ([`compile_with`] keeps each
/// module's PTX there, so that a second process skips NVRTC: the attention and MoE modules take
/// tens of seconds to compile). `off` disables it. Unset: `$XDG_CACHE_HOME/porter/ptx`, else
/// `$HOME/.cache/porter/ptx`, else none. A file that cannot be read or written is compiled
/// again (never an error).
pub const KERNEL_CACHE_ENV: &str = "PORTER_KERNEL_CACHE";

/// 64-bit FNV-1a (stable across builds, unlike the std hasher): the cache file's name.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cache directory [`KERNEL_CACHE_ENV`] names (or its default), if any.
fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os(KERNEL_CACHE_ENV) {
        Some(v) if v.to_string_lossy().trim().eq_ignore_ascii_case("off") => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("porter").join("ptx")),
    }
}

/// The cache file of one compilation and the header line its content starts with: the file
/// name hashes the source text, the arch, the fallback flag and the NVRTC version; the header
/// repeats them with the text's length and a second hash, checked on every read.
fn disk_cache_path(name: &str, text: &str, arch: &str, fallback: bool) -> Option<(PathBuf, String)> {
    let dir = cache_dir()?;
    let (major, minor) = nvrtc_version().ok()?;
    let ver = format!("{major}.{minor}");
    let fb: &[u8] = if fallback { b"fallback" } else { b"" };
    let h1 = fnv1a(&[text.as_bytes(), arch.as_bytes(), fb, ver.as_bytes()]);
    let h2 = fnv1a(&[ver.as_bytes(), fb, arch.as_bytes(), text.as_bytes(), name.as_bytes()]);
    let stem = name.trim_end_matches(".cu");
    let path = dir.join(format!("{stem}-{arch}{}-{h1:016x}.ptx", if fallback { "-fb" } else { "" }));
    let header =
        format!("// porter ptx cache v1 nvrtc {ver} {arch} fallback={fallback} len={} {h2:016x}\n", text.len());
    Some((path, header))
}

/// The cached PTX at `path` if it starts with `header`.
fn read_cached(path: &std::path::Path, header: &str) -> Option<Ptx> {
    let body = std::fs::read_to_string(path).ok()?;
    body.strip_prefix(header).map(|ptx| Ptx::from_src(ptx.to_string()))
}

/// Writes `ptx` to `path` behind `header` (through a temporary file and a rename, so that a
/// concurrent reader never sees half a file); failures are ignored (the cache is optional).
fn write_cached(path: &std::path::Path, header: &str, ptx: &Ptx) {
    write_behind(path, header, ptx.to_src().as_bytes());
}

/// Writes `header` then `body` to `path` through a temporary file beside it (`<name>.tmp<pid>`)
/// and a rename; failures are ignored (the cache is optional).
fn write_behind(path: &std::path::Path, header: &str, body: &[u8]) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let mut bytes = Vec::with_capacity(header.len() + body.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(body);
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The cubin file beside the PTX cache file at `ptx_path`.
fn cubin_path(ptx_path: &std::path::Path) -> PathBuf {
    ptx_path.with_extension("cubin")
}

/// The cached cubin beside `ptx_path` if it starts with `header`.
fn read_cached_cubin(ptx_path: &std::path::Path, header: &str) -> Option<Vec<u8>> {
    let body = std::fs::read(cubin_path(ptx_path)).ok()?;
    let rest = body.strip_prefix(header.as_bytes())?;
    (!rest.is_empty()).then(|| rest.to_vec())
}

/// Writes `cubin` beside `ptx_path`, behind `header`, as [`write_cached`] does.
fn write_cached_cubin(ptx_path: &std::path::Path, header: &str, cubin: &[u8]) {
    write_behind(&cubin_path(ptx_path), header, cubin);
}

#[cfg(test)]
mod tests;
