//! Helpers shared by the CUDA kernel tests: the real Qwen3-Next-80B-A3B sizes, a
//! seeded PRNG, upload / poisoned / download helpers and the relative-error check.
#![allow(dead_code)]

pub mod attn;
pub mod fp8;
pub mod gdn;
pub mod moe;
pub mod timing;

use cudarc::driver::CudaSlice;
use porter_kernels::cuda::{self, CudaFloat, CudaKernels};

// Qwen3-Next-80B-A3B.
pub const HIDDEN: usize = 2048;
pub const LIN_HK: usize = 16;
pub const LIN_HV: usize = 32;
pub const LIN_D: usize = 128;
pub const ATT_HEADS: usize = 16;
pub const ATT_KV_HEADS: usize = 2;
pub const ATT_HEAD_DIM: usize = 256;
pub const EXPERTS: usize = 512;
pub const TOP_K: usize = 10;
pub const ROT_DIM: usize = 64;
pub const ROPE_THETA: f32 = 10_000_000.0;
pub const CONV_K: usize = 4;
pub const VOCAB: usize = 151_936;
pub const EPS: f32 = 1e-6;

pub const TOL_F32: f32 = 1e-5;
pub const TOL_BF16: f32 = 1e-2;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// xorshift64* PRNG.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(tag: u64) -> Self {
        let base = std::env::var("PORTER_CUDA_SEED").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        let seed = base ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        println!("seed {base} (tag {tag})");
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[-scale, scale)`.
    pub fn f(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f(scale)).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub fn rnd<T: CudaFloat>(v: f32) -> f32 {
    T::from_f32(v).to_f32()
}

pub fn rnd_vec<T: CudaFloat>(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| rnd::<T>(x)).collect()
}

/// Device 0 for a GPU test (`#[ignore = "needs a CUDA GPU"]`, run with `--include-ignored`
/// or `--ignored`); panics with the reason when there is no usable GPU, since the test was
/// asked for explicitly.
pub fn gpu(test: &str) -> CudaKernels {
    if let Err(reason) = cuda::gpu_available() {
        panic!("{test} needs a CUDA GPU and found none: {reason}");
    }
    CudaKernels::new(0).unwrap_or_else(|e| panic!("{test}: CudaKernels::new: {e}"))
}

/// Panics unless NVRTC and the CUDA headers are there, for an NVRTC test
/// (`#[ignore = "needs NVRTC ..."]`, asked for explicitly).
pub fn need_nvrtc(test: &str) {
    if let Err(reason) = cuda::nvrtc_available() {
        panic!("{test} needs NVRTC and found none: {reason} (bash .ci/run installs it into target/nvrtc)");
    }
    if let Err(e) = cuda::cuda_include_dir() {
        panic!("{test} needs the CUDA headers: {e}");
    }
}

pub fn up<T: CudaFloat>(k: &CudaKernels, v: &[f32]) -> CudaSlice<T> {
    let host: Vec<T> = v.iter().map(|&x| T::from_f32(x)).collect();
    k.stream().clone_htod(&host).expect("htod")
}

pub fn up_u32(k: &CudaKernels, v: &[u32]) -> CudaSlice<u32> {
    k.stream().clone_htod(v).expect("htod")
}

/// A decode GEMV case: `x` `[m, kk]` and `w` `[n, kk]` drawn from `rng` (rounded to `A`),
/// uploaded, and the CPU reference `x · wᵀ` rounded to `O`.
pub fn gemv_inputs<A: CudaFloat, O: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    m: usize,
    kk: usize,
    n: usize,
) -> (CudaSlice<A>, CudaSlice<A>, Vec<f32>) {
    let x = rnd_vec::<A>(&rng.vec(m * kk, 1.0));
    let w = rnd_vec::<A>(&rng.vec(n * kk, 1.0 / (kk as f32).sqrt()));
    let mut want = vec![0.0f32; m * n];
    porter_kernels::cpu::ops::matmul_t(&x, &w, &mut want, m, kk, n, false);
    (up::<A>(k, &x), up::<A>(k, &w), rnd_vec::<O>(&want))
}

/// A device buffer of `n` NaNs.
pub fn poisoned<T: CudaFloat>(k: &CudaKernels, n: usize) -> CudaSlice<T> {
    up::<T>(k, &vec![f32::NAN; n])
}

pub fn poisoned_u32(k: &CudaKernels, n: usize) -> CudaSlice<u32> {
    up_u32(k, &vec![u32::MAX; n])
}

/// Synchronises (surfacing asynchronous launch errors) and copies back as f32.
pub fn down<T: CudaFloat>(k: &CudaKernels, d: &CudaSlice<T>) -> Vec<f32> {
    k.stream().synchronize().expect("kernel failed (stream synchronize)");
    let h: Vec<T> = k.stream().clone_dtoh(d).expect("dtoh");
    h.into_iter().map(|x| x.to_f32()).collect()
}

pub fn down_u32(k: &CudaKernels, d: &CudaSlice<u32>) -> Vec<u32> {
    k.stream().synchronize().expect("kernel failed (stream synchronize)");
    k.stream().clone_dtoh(d).expect("dtoh")
}

/// `max |got − want| / max |want|`; panics on a NaN in `got` (an unwritten or
/// poisoned element) or above `tol`. Returns the error.
pub fn check(what: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g.is_nan() && !w.is_nan()) {
        panic!("{what}: element {i} is NaN (not written?), expected {}", want[i]);
    }
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    let (mut worst, mut at) = (0.0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if d > worst {
            worst = d;
            at = i;
        }
    }
    let rel = worst / scale;
    println!("  {what}: max abs err {worst:.3e} (at {at}), rel to max|ref| {scale:.3e}: {rel:.3e} (tol {tol:.0e})");
    assert!(rel <= tol, "{what}: relative error {rel:e} > {tol:e} at {at}: got {} want {}", got[at], want[at]);
    rel
}

/// Panics unless `got` and `want` are the same bits (NaN matching NaN).
pub fn check_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let diff = got.iter().zip(want).filter(|(g, w)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan())).count();
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan())) {
        panic!("{what}: {diff} of {} elements differ in bits, first {i}: {} vs {}", got.len(), got[i], want[i]);
    }
}

pub fn tol<T: CudaFloat>() -> f32 {
    if T::NAME == "f32" {
        TOL_F32
    } else {
        TOL_BF16
    }
}

/// `ptxas -v` of one kernel source for sm_90 (sm_90a for the modules `module_arch` compiles
/// so there; [`ptxas_log_arch`], with its PTX / CUBIN dumps): the register and spill lines of
/// every entry function, as `(function, line)`.
pub fn ptxas_info(test: &str, source: &str) -> Vec<(String, String)> {
    let src = cuda::sources().into_iter().find(|s| s.name == source).expect("a registered source");
    // The build an sm_90 device loads (sm_90a for the modules `module_arch` names).
    let (log, _ptx) = ptxas_log_arch(test, source, cuda::module_arch(src, "sm_90", false));
    let mut func = String::new();
    let mut lines = Vec::new();
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            func = line[i + 26..].trim_end_matches(['\'', ' ']).split('\'').next().unwrap_or("").to_string();
        }
        if line.contains("registers") || line.contains("spill") {
            lines.push((func.clone(), line.trim().to_string()));
        }
    }
    lines
}

/// The whole `ptxas -v` log of `source` compiled by NVRTC for `arch` (e.g. `sm_90a`), and its
/// PTX; with `PORTER_PTX_DIR` / `PORTER_CUBIN_DIR` set, the PTX / machine code also written
/// there as `<source>.ptx` / `.cubin` (for nvdisasm: the instruction mix per kernel). No GPU
/// needed; panics without NVRTC or the CUDA headers ([`need_nvrtc`]) and when the source does
/// not compile.
pub fn ptxas_log_arch(test: &str, source: &str, arch: &str) -> (String, String) {
    use cudarc::nvrtc::result as nv;
    use std::ffi::CString;
    need_nvrtc(test);
    let include = cuda::cuda_include_dir().unwrap_or_else(|e| panic!("{test}: {e}"));
    let src = cuda::sources().into_iter().find(|s| s.name == source).expect("a registered source");
    let text = CString::new(src.full_text()).expect("source");
    let name = CString::new(source).expect("name");
    let prog = nv::create_program(&text, Some(&name)).expect("create program");
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        format!("-I{}", include.display()),
        "--ptxas-options=-v".to_string(),
    ];
    // SAFETY: `prog` was just created and is destroyed once, below.
    let res = unsafe { nv::compile_program(prog, &opts) };
    // SAFETY: as above.
    let log = unsafe { nv::get_program_log(prog) }.expect("log");
    let log: Vec<u8> = log.into_iter().map(|c| c as u8).take_while(|&c| c != 0).collect();
    let log = String::from_utf8_lossy(&log).into_owned();
    if let Err(e) = res {
        // SAFETY: as above; not used afterwards.
        unsafe { nv::destroy_program(prog) }.expect("destroy");
        panic!("{test}: {source} for {arch}: compile failed: {e}\n{log}");
    }
    // SAFETY: as above; compiled successfully.
    let ptx = unsafe { nv::get_ptx(prog) }.expect("ptx");
    let ptx: Vec<u8> = ptx.into_iter().map(|c| c as u8).take_while(|&c| c != 0).collect();
    if let Some(dir) = std::env::var_os("PORTER_PTX_DIR") {
        std::fs::write(std::path::Path::new(&dir).join(format!("{source}.ptx")), &ptx).expect("write ptx");
    }
    if let Some(dir) = std::env::var_os("PORTER_CUBIN_DIR") {
        let mut size = 0usize;
        // SAFETY: as above; compiled successfully for a real architecture, so NVRTC holds a
        // CUBIN of `size` bytes, copied into a buffer of that size.
        let cubin = unsafe {
            cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size).result().expect("cubin size");
            let mut buf = vec![0u8; size];
            cudarc::nvrtc::sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()).result().expect("cubin");
            buf
        };
        std::fs::write(std::path::Path::new(&dir).join(format!("{source}.cubin")), cubin).expect("write cubin");
    }
    // SAFETY: as above; not used afterwards.
    unsafe { nv::destroy_program(prog) }.expect("destroy");
    (log, String::from_utf8_lossy(&ptx).into_owned())
}
