//! Launch wrapper of kernels/cuda/gdn_chunk.cu: the chunked (64-token)
//! Gated DeltaNet prefill over the spans of a batch, the parallel form of
//! [`CudaKernels::gdn_delta_seq`] (semantics of
//! `cpu::gdn::chunked_gated_delta_rule` per span).

//!
//! Two forms: the CUDA-core f32 kernels (gdn_chunk.cu; every output type) and, for bf16 / f16
//! outputs on sm_80+, the tensor-core kernels (gdn_chunk_tc.cu: wmma products on operands
//! rounded to the output type, f32 accumulators and state). [`GDN_CHUNK_ENV`]` = f32` forces
//! the f32 kernels for bf16 / f16 as well (A/B).

use super::{prod, u32_of, CudaFloat, CudaKernels, DeviceCaps, Result, GDN_CHUNK};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Environment variable choosing the form of [`CudaKernels::gdn_chunked_seq`] for bf16 / f16
/// outputs: `f32` runs the CUDA-core f32 kernels; `tc` (or unset) the tensor-core kernels
/// where the device and the head dims allow them. Any other value warns once on stderr and
/// counts as unset. Read on every call.
pub const GDN_CHUNK_ENV: &str = "PORTER_GDN_CHUNK";

/// Whether [`GDN_CHUNK_ENV`]'s value `v` forces the f32 kernels (a bad value warns once).
fn f32_forced_from(v: Option<std::ffi::OsString>) -> bool {
    let Some(v) = v else { return false };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "f32" => true,
        "" | "tc" => false,
        other => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!("warning: {GDN_CHUNK_ENV}={other:?} is neither `tc` nor `f32`; using the default (tc)")
            });
            false
        }
    }
}

/// Which kernels a call of [`CudaKernels::gdn_chunked_seq_with`] ran.
#[doc(hidden)]
pub const GDN_FORMS: [&str; 3] = ["tc", "f32", "seq"];

/// Tokens per chunk (`GC_C` in gdn_chunk.cu).
const GC_C: usize = 64;
/// Threads of the per-chunk and state kernels (`GC_THREADS`).
const GC_THREADS: u32 = 256;
/// Largest key / value head dim of [`CudaKernels::gdn_chunked_seq`].
pub const GDN_CHUNK_MAX_D: usize = 256;

impl CudaKernels {
    /// Gated delta rule over the spans of a batch in the chunked form (chunks
    /// of 64 tokens; per span, `cpu::gdn::l2norm_rows` on q and k followed by
    /// `cpu::gdn::chunked_gated_delta_rule`). Same arguments and conventions as
    /// [`CudaKernels::gdn_delta_seq`], except that **snapshot spans are not
    /// supported**: the snapshot flag (`spans[s][4]`) is ignored (read as 0),
    /// so every span continues from `state[slot, src_buf]` and writes its final
    /// state back there. Route snapshot spans to `gdn_delta_seq`.
    ///
    /// Span `s` = `spans[s] = (row0, len, slot, src_buf, snapshot)`. Per value
    /// head `j` (key head `j / (hv / hk)`): q and k L2-normalised in f32
    /// (`x · rsqrt(Σx² + 1e-6)`, q also times `dk^-½`); per token
    /// `S ← exp(g)·S`, `δ = β·(v − Sᵀk)`, `S ← S + k⊗δ`, `out[row] = Sᵀq`
    /// (rounded to `T` once), evaluated chunk by chunk (cumulative decays
    /// within a chunk in f64, `exp` flushed to 0 below −60, as the CPU code).
    ///
    /// Spans must use distinct slots and disjoint rows; unlike in
    /// `gdn_delta_seq`, `max_len` must bound every span's length. A span whose
    /// slot or `src_buf` is out of range, whose rows pass `t` or that is longer
    /// than `max_len` gives NaN rows (as far as `max_len` reaches) and leaves
    /// every state alone; rows outside every span are not written.
    ///
    /// Scratch from the stream's pool (freed asynchronously on return): for
    /// `cap = min(n_spans·⌈max_len/64⌉, (t + 63·n_spans) / 64)` chunks,
    /// `cap · hv · (64·(2·dk + dv) + dk·dv + 1) · 4` bytes (335 MB for the
    /// 80B dims at 4096 tokens) plus `4·n_spans`.
    ///
    /// # Shapes
    /// - `qkv`: `[t, 2·hk·dk + hv·dv]` (`f32`: q `[hk, dk]` at column 0, k at
    ///   `hk·dk`, v `[hv, dv]` at `2·hk·dk`)
    /// - `g`, `beta`: `[t, hv]` (`f32`)
    /// - `state`: `[num_slots, nbuf, hv, dk, dv]` (`f32`, k-major), updated
    /// - `spans`: `[n_spans, 5]` (`u32`)
    /// - `out`: `[t, hv, dv]` (`T`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`](super::CudaError::Invalid) if a dimension is zero, `hv % hk != 0`,
    /// `dk > 256`, `dv > 256`, or on a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_chunked_seq<T: CudaFloat>(
        &self,
        qkv: &impl DevicePtr<f32>,
        g: &impl DevicePtr<f32>,
        beta: &impl DevicePtr<f32>,
        state: &mut impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        t: usize,
        n_spans: usize,
        max_len: usize,
        hk: usize,
        hv: usize,
        dk: usize,
        dv: usize,
        num_slots: usize,
        nbuf: usize,
    ) -> Result<()> {
        let f32_form = f32_forced_from(std::env::var_os(GDN_CHUNK_ENV));
        self.gdn_chunked_impl(
            qkv, g, beta, state, spans, out, t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf, f32_form, None,
        )
        .map(|_| ())
    }

    /// [`CudaKernels::gdn_chunked_seq`] with the form chosen by the caller instead of
    /// [`GDN_CHUNK_ENV`] (`f32_form`: the f32 kernels even for bf16 / f16) and, with
    /// `timing`, the stream synchronised around each of the four launches, their wall times
    /// in µs written there (prep, wu, state, out; all 0 when the sequential fallback runs).
    /// Returns the form that ran: `"tc"`, `"f32"`, or `"seq"` (`gdn_delta_seq`, where the
    /// chunk kernels do not fit the device's shared memory). For tests and profiling.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_chunked_seq_with<T: CudaFloat>(
        &self,
        qkv: &impl DevicePtr<f32>,
        g: &impl DevicePtr<f32>,
        beta: &impl DevicePtr<f32>,
        state: &mut impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        dims: [usize; 9],
        f32_form: bool,
        timing: Option<&mut [f64; 4]>,
    ) -> Result<&'static str> {
        let [t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf] = dims;
        self.gdn_chunked_impl(
            qkv, g, beta, state, spans, out, t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf, f32_form, timing,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn gdn_chunked_impl<T: CudaFloat>(
        &self,
        qkv: &impl DevicePtr<f32>,
        g: &impl DevicePtr<f32>,
        beta: &impl DevicePtr<f32>,
        state: &mut impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        t: usize,
        n_spans: usize,
        max_len: usize,
        hk: usize,
        hv: usize,
        dk: usize,
        dv: usize,
        num_slots: usize,
        nbuf: usize,
        f32_form: bool,
        mut timing: Option<&mut [f64; 4]>,
    ) -> Result<&'static str> {
        let dims = super::gdn_seq::DeltaDims { t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf };
        let limits = (GDN_CHUNK_MAX_D, Some(GDN_CHUNK_MAX_D));
        // The tensor-core form where it applies (bf16 / f16, sm_80+, dk 64 or 128, dv a
        // multiple of 32 up to 256, shared memory within the device's limit).
        let tc = if f32_form || T::NAME == "f32" { None } else { tc_smem(dk, dv, self.caps()) };
        if !self.check_delta_args("gdn_chunked_seq", limits, qkv, g, beta, &*state, spans, &*out, dims)? {
            return Ok(GDN_FORMS[if tc.is_some() { 0 } else { 1 }]);
        }
        // Fallback: where the chunk kernels need more shared memory than the device allows
        // (97 KiB at dk = 64, 169 KiB at dk = 128: more than an sm_70 / sm_75 / sm_86 has, or
        // PORTER_CUDA_FALLBACK=1), the sequential form, which uses about 21 KiB. It honours
        // the snapshot flag that this form reads as 0 (callers route snapshot spans there
        // anyway); with `timing`, the four times are 0.
        let (rk, ct, smem_state, smem_out) = gc_smem(dk, dv);
        if tc.is_none() && smem_state.max(smem_out) > self.caps().smem_limit() {
            return self
                .gdn_delta_seq(qkv, g, beta, state, spans, out, t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf)
                .map(|_| GDN_FORMS[2]);
        }
        // Valid spans are disjoint rows of 0..t, so they have at most
        // (t + 63·n) / 64 chunks in all (and at most n · max_chunks).
        let max_chunks = max_len.div_ceil(GC_C);
        let cap = prod(&[n_spans, max_chunks])?.min(t.saturating_add(prod(&[n_spans, GC_C - 1])?) / GC_C);
        let (t32, ns32, ml32, hk32, hv32, dk32, dv32, slots32, nbuf32, cap32) = (
            u32_of("t", t)?,
            n_spans as u32,
            u32_of("max_len", max_len)?,
            u32_of("hk", hk)?,
            u32_of("hv", hv)?,
            u32_of("dk", dk)?,
            u32_of("dv", dv)?,
            u32_of("num_slots", num_slots)?,
            u32_of("nbuf", nbuf)?,
            u32_of("chunks", cap)?,
        );
        let mc32 = u32_of("max chunks", max_chunks)?;
        let q_scale = 1.0 / (dk as f32).sqrt();

        let s = &*self.stream;
        // SAFETY: written by gdn_chunk_prep (below) before any kernel reads it.
        let mut off = unsafe { self.stream.alloc::<u32>(n_spans) }?;
        let (pq, _gq) = qkv.device_ptr(s);
        let (pg, _gg) = g.device_ptr(s);
        let (psp, _gsp) = spans.device_ptr(s);
        let (poff, _goff) = off.device_ptr_mut(s);

        if timing.is_some() {
            s.synchronize()?;
        }
        let mut t0 = std::time::Instant::now();
        // Wall time of the launches since the previous lap (timing only).
        let mut lap = |k: usize| -> Result<()> {
            if let Some(us) = timing.as_deref_mut() {
                s.synchronize()?;
                us[k] = t0.elapsed().as_secs_f64() * 1e6;
                t0 = std::time::Instant::now();
            }
            Ok(())
        };
        // 1. Chunk offsets per span.
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: arguments match `gdn_chunk_prep`; `spans` holds n_spans rows,
        // `off` n_spans entries.
        // Kernel: `gdn_chunk_prep(const u32* spans, u32* off, u32 n_spans, u32 t, u32 num_slots, u32 nbuf,
        // u32 max_len, u32 cap)`.
        unsafe {
            launch!(self, GDN_CHUNK, "gdn_chunk_prep", cfg, [psp, poff, ns32, t32, slots32, nbuf32, ml32, cap32])
        }?;
        lap(0)?;
        let chunk_grid = (mc32, hv32, ns32);

        if let Some(TcSmem { wu: smem_wu, state: smem_tstate, out: smem_tout }) = tc {
            // SAFETY (all six): every element the kernels read is written first, on this
            // stream: wn / kb / uf / gl for every chunk of a valid span by gdn_chunk_tc_wu
            // (rows past a chunk's length as zeros), vb and hb by gdn_chunk_tc_state.
            let mut wn = unsafe { self.stream.alloc::<T>(prod(&[cap, hv, GC_C, dk])?) }?;
            let mut kb = unsafe { self.stream.alloc::<T>(prod(&[cap, hv, GC_C, dk])?) }?;
            let mut uf = unsafe { self.stream.alloc::<f32>(prod(&[cap, hv, GC_C, dv])?) }?;
            let mut vb = unsafe { self.stream.alloc::<T>(prod(&[cap, hv, GC_C, dv])?) }?;
            let mut gl = unsafe { self.stream.alloc::<f32>(prod(&[cap, hv])?) }?;
            let mut hb = unsafe { self.stream.alloc::<T>(prod(&[cap, hv, dk, dv])?) }?;
            let name = |k: &str| format!("gdn_chunk_tc_{k}_d{dk}_{}", T::NAME);
            let f_wu = self.function_smem(&GDN_CHUNK, &name("wu"), smem_wu)?;
            let f_state = self.function_smem(&GDN_CHUNK, &name("state"), smem_tstate)?;
            let f_out = self.function_smem(&GDN_CHUNK, &name("out"), smem_tout)?;
            let (pwn, _gwn) = wn.device_ptr_mut(s);
            let (pkb, _gkb) = kb.device_ptr_mut(s);
            let (puf, _guf) = uf.device_ptr_mut(s);
            let (pvb, _gvb) = vb.device_ptr_mut(s);
            let (pgl, _ggl) = gl.device_ptr_mut(s);
            let (phb, _ghb) = hb.device_ptr_mut(s);
            let block = (GC_THREADS, 1, 1);
            // 2. −W, K̃, U, exp(G_last) per (chunk, value head).
            let cfg =
                LaunchConfig { grid_dim: chunk_grid, block_dim: block, shared_mem_bytes: u32_of("smem", smem_wu)? };
            // SAFETY: arguments match `gdn_chunk_tc_wu_d<dk>_<T>`; dk is 64 or 128 and dv a
            // multiple of 32 (tc_smem); the shared memory size is the kernel's layout; a valid
            // span (per `off`) has rows inside 0..t and scratch indices below cap.
            // Kernel: `gdn_chunk_tc_wu_d<DK>_<T>(const float* qkv, const float* g, const float* beta,
            // const u32* spans, const u32* off, T* wn, T* kb, float* uf, float* gl, u32 hk, u32 hv, u32 dv)`.
            unsafe {
                launch_fn!(self, f_wu, cfg, [pq, pg, ptr(beta), psp, poff, pwn, pkb, puf, pgl, hk32, hv32, dv32])
            }?;
            lap(1)?;
            // 3. The state, chunk after chunk, 32 columns a block; Vn and the chunk-start states.
            let cfg = LaunchConfig {
                grid_dim: (dv32 / 32, hv32, ns32),
                block_dim: block,
                shared_mem_bytes: u32_of("smem", smem_tstate)?,
            };
            // SAFETY: arguments match `gdn_chunk_tc_state_d<dk>_<T>`; dv % 32 == 0; the shared
            // memory size is the kernel's layout; slot / src_buf of a valid span are in range.
            // Kernel: `gdn_chunk_tc_state_d<DK>_<T>(float* state, const u32* spans, const u32* off, const T* wn,
            // const T* kb, const float* uf, const float* gl, T* vb, T* hb, u32 hv, u32 dv, u32 nbuf)`.
            unsafe {
                launch_fn!(
                    self,
                    f_state,
                    cfg,
                    [ptr_mut(state), psp, poff, pwn, pkb, puf, pgl, pvb, phb, hv32, dv32, nbuf32]
                )
            }?;
            lap(2)?;
            // 4. Outputs per (chunk, value head).
            let cfg =
                LaunchConfig { grid_dim: chunk_grid, block_dim: block, shared_mem_bytes: u32_of("smem", smem_tout)? };
            // SAFETY: arguments match `gdn_chunk_tc_out_d<dk>_<T>`; dv <= 256 (at most 8 output
            // tiles a warp); NaN rows of invalid spans are clipped to t.
            // Kernel: `gdn_chunk_tc_out_d<DK>_<T>(const float* qkv, const float* g, const u32* spans,
            // const u32* off, const T* vb, const T* hb, T* out, u32 t, u32 hk, u32 hv, u32 dv, float q_scale)`.
            unsafe {
                launch_fn!(
                    self,
                    f_out,
                    cfg,
                    [pq, pg, psp, poff, pvb, phb, ptr_mut(out), t32, hk32, hv32, dv32, q_scale]
                )
            }?;
            lap(3)?;
            return Ok(GDN_FORMS[0]);
        }

        // SAFETY (all five): every element the kernels read is written first, on this
        // stream: wt / ut / kt / gl for every chunk of a valid span by gdn_chunk_wu (rows
        // past a chunk's length as zeros); hs by gdn_chunk_state.
        let mut wt = unsafe { self.stream.alloc::<f32>(prod(&[cap, hv, dk, GC_C])?) }?;
        let mut ut = unsafe { self.stream.alloc::<f32>(prod(&[cap, hv, dv, GC_C])?) }?;
        let mut kt = unsafe { self.stream.alloc::<f32>(prod(&[cap, hv, GC_C, dk])?) }?;
        let mut gl = unsafe { self.stream.alloc::<f32>(prod(&[cap, hv])?) }?;
        let mut hs = unsafe { self.stream.alloc::<f32>(prod(&[cap, hv, dk, dv])?) }?;

        let f_state = self.function_smem(&GDN_CHUNK, &format!("gdn_chunk_state_rk{rk}"), smem_state)?;
        let f_out = self.function_smem(&GDN_CHUNK, &format!("gdn_chunk_out_c{ct}_{}", T::NAME), smem_out)?;

        let (pwt, _gwt) = wt.device_ptr_mut(s);
        let (put, _gut) = ut.device_ptr_mut(s);
        let (pkt, _gkt) = kt.device_ptr_mut(s);
        let (pgl, _ggl) = gl.device_ptr_mut(s);
        let (phs, _ghs) = hs.device_ptr_mut(s);

        // 2. W, U, K̃, exp(G_last) per (chunk, value head).
        let cfg = LaunchConfig { grid_dim: chunk_grid, block_dim: (GC_THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: arguments match `gdn_chunk_wu`; lengths checked; a valid span
        // (per `off`) has rows inside 0..t and at most max_chunks chunks, whose
        // scratch indices off + c are below cap (checked by gdn_chunk_prep).
        // Kernel: `gdn_chunk_wu(const float* qkv, const float* g, const float* beta, const u32* spans, const u32* off,
        // float* wt, float* ut, float* kt, float* gl, u32 hk, u32 hv, u32 dk, u32 dv)`.
        unsafe {
            launch!(
                self,
                GDN_CHUNK,
                "gdn_chunk_wu",
                cfg,
                [pq, pg, ptr(beta), psp, poff, pwt, put, pkt, pgl, hk32, hv32, dk32, dv32]
            )
        }?;

        lap(1)?;
        // 3. The state, chunk after chunk; Vn in place of U.
        let cfg = LaunchConfig {
            grid_dim: (u32_of("column blocks", dv.div_ceil(32))?, hv32, ns32),
            block_dim: (GC_THREADS, 1, 1),
            shared_mem_bytes: u32_of("shared memory", smem_state)?,
        };
        // SAFETY: arguments match `gdn_chunk_state_rk<RK>`; 8·RK >= dk; the
        // shared memory size is the kernel's layout for RK; slot / src_buf of a
        // valid span are in range (gdn_chunk_prep).
        // Kernel: `gdn_chunk_state_rk<RK>(float* state, const u32* spans, const u32* off, const float* wt,
        // float* ut, const float* kt, const float* gl, float* hs, u32 hv, u32 dk, u32 dv, u32 nbuf)`.
        unsafe {
            launch_fn!(
                self,
                f_state,
                cfg,
                [ptr_mut(state), psp, poff, pwt, put, pkt, pgl, phs, hv32, dk32, dv32, nbuf32]
            )
        }?;

        lap(2)?;
        // 4. Outputs per (chunk, value head).
        let cfg = LaunchConfig {
            grid_dim: chunk_grid,
            block_dim: (GC_THREADS, 1, 1),
            shared_mem_bytes: u32_of("shared memory", smem_out)?,
        };
        // SAFETY: arguments match `gdn_chunk_out_c<CT>_<T>`; 16·CT >= dv; the
        // shared memory size is the kernel's layout for (dk, CT) (at most
        // ~165 KiB, opted in above); NaN rows of invalid spans are clipped to t.
        // Kernel: `gdn_chunk_out_c<CT>_<T>(const float* qkv, const float* g, const u32* spans, const u32* off,
        // const float* ut, const float* hs, T* out, u32 t, u32 hk, u32 hv, u32 dk, u32 dv, float q_scale)`.
        unsafe {
            launch_fn!(
                self,
                f_out,
                cfg,
                [pq, pg, psp, poff, put, phs, ptr_mut(out), t32, hk32, hv32, dk32, dv32, q_scale]
            )
        }?;
        lap(3)?;
        Ok(GDN_FORMS[1])
    }
}

/// Dynamic shared memory of the tensor-core kernels, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TcSmem {
    wu: usize,
    state: usize,
    out: usize,
}

/// Static shared memory of the tensor-core kernels (at most ~1.5 KiB: G, norms, gates)
/// counted against the device's limit besides the dynamic part.
const TC_STATIC_SMEM: usize = 2048;

/// The tensor-core kernels' shared memory for head dims `dk`, `dv` (the layouts of
/// `GT_WU_SMEM`, `GT_STATE_SMEM`, `GT_OUT_SMEM` in gdn_chunk_tc.cu), or `None` where they
/// do not apply: below sm_80 or with the fallback forced, dk other than 64 / 128, dv not a
/// multiple of 32 or above 256, or more shared memory than the device allows.
fn tc_smem(dk: usize, dv: usize, caps: DeviceCaps) -> Option<TcSmem> {
    if !caps.tensor_cores() || !(dk == 64 || dk == 128) || !dv.is_multiple_of(32) || dv > 256 {
        return None;
    }
    let (c, ldt, ldf, lds, ldb) = (GC_C, 72, 68, 36, 40);
    let tile_k = 2 * c * (dk + 8); // T [64][dk + 8]
    let tile_v = 2 * c * (dv + 8); // T [64][dv + 8]

    // gdn_chunk_tc_wu: Kb, Vb, As (f32 [64][68]: K Kᵀ, A, T, then the warp scratch tiles), Tw, Tu.
    let wu = tile_k + tile_v + 4 * c * ldf + 4 * c * ldt;
    let state = 2 * (2 * tile_k + 4 * c * lds) + 4 * dk * lds + 2 * dk * ldb + 2 * c * ldb;
    let r01 = (tile_k + 4 * c * ldf).max(2 * dk * (dv + 8));
    let out = r01 + tile_k.max(8 * 1024) + tile_k + 2 * c * ldt + tile_v;
    let fits = wu.max(state).max(out) + TC_STATIC_SMEM <= caps.smem_limit();
    fits.then_some(TcSmem { wu, state, out })
}

/// Row blocks `rk` of `gdn_chunk_state_rk<rk>`, column tiles `ct` of `gdn_chunk_out_c<ct>`
/// and their dynamic shared memory in bytes, for key / value head dims `dk`, `dv`.
fn gc_smem(dk: usize, dv: usize) -> (usize, usize, usize, usize) {
    let rk = match dk {
        0..=64 => 8,
        65..=128 => 16,
        _ => 32,
    };
    let ct = match dv {
        0..=64 => 4,
        65..=128 => 8,
        _ => 16,
    };
    // gc_state layout: Ss [8·rk][32] + Vs [64][33] + stages × (Wb [8·rk][64]
    // + Kb [64][8·rk] + Ub [32][68]); 2 stages (prefetch) unless rk = 32.
    let stages = if rk == 32 { 1 } else { 2 };
    let smem_state = 4 * (8 * rk * 32 + GC_C * 33 + stages * (2 * 8 * rk * GC_C + 32 * 68));
    let dkp = dk.next_multiple_of(4);
    let smem_out = 4 * (2 * dkp * GC_C + GC_C * GC_C + 16 * 16 * ct);
    (rk, ct, smem_state, smem_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(major: i32, smem_optin: usize, forced: bool) -> DeviceCaps {
        DeviceCaps { major, minor: 0, smem_optin, forced, sms: 132 }
    }

    #[test]
    fn env_knob_parses() {
        assert!(!f32_forced_from(None));
        assert!(f32_forced_from(Some("f32".into())));
        assert!(f32_forced_from(Some(" F32 ".into())));
        assert!(!f32_forced_from(Some("tc".into())));
        assert!(!f32_forced_from(Some("bogus".into()))); // warns once, default
    }

    #[test]
    fn tc_form_needs_sm80_dims_and_smem() {
        let h200 = caps(9, 227 * 1024, false);
        // 80B dims: the layouts of gdn_chunk_tc.cu.
        assert_eq!(tc_smem(128, 128, h200), Some(TcSmem { wu: 70_656, state: 121_856, out: 96_256 }));
        // The wu launch fits 3 blocks per SM on an H100 / H200 (228 KiB an SM, 1 KiB reserved a
        // block, 1.5 KiB static): at most 75 KiB of dynamic shared memory.
        let wu = tc_smem(128, 128, h200).map_or(usize::MAX, |m| m.wu);
        assert!(3 * (wu + 1536 + 1024) <= 228 * 1024, "wu {wu} bytes");
        assert!(tc_smem(64, 96, h200).is_some());
        assert!(tc_smem(128, 256, h200).is_some());
        // Dims the kernels do not take.
        for (dk, dv) in [(256, 256), (96, 128), (128, 80), (128, 288), (5, 7)] {
            assert_eq!(tc_smem(dk, dv, h200), None, "dk {dk} dv {dv}");
        }
        // Below sm_80, forced fallback, too little shared memory (sm_86: 99 KiB).
        assert_eq!(tc_smem(128, 128, caps(7, 96 * 1024, false)), None);
        assert_eq!(tc_smem(128, 128, caps(9, 227 * 1024, true)), None);
        assert_eq!(tc_smem(128, 128, caps(8, 99 * 1024, false)), None);
        assert!(tc_smem(128, 128, caps(8, 163 * 1024, false)).is_some()); // A100
    }
}
