//! Launch wrapper of kernels/cuda/gdn_chunk.cu: the chunked (64-token)
//! Gated DeltaNet prefill over the spans of a batch, the parallel form of
//! [`CudaKernels::gdn_delta_seq`] (semantics of
//! `cpu::gdn::chunked_gated_delta_rule` per span).

//!
//! Two forms: the CUDA-core f32 kernels (gdn_chunk.cu; every output type) and, for bf16 / f16
//! outputs on sm_80+, the tensor-core kernels (gdn_chunk_tc.cu: wmma products on operands
//! rounded to the output type, f32 accumulators and state). [`GDN_CHUNK_ENV`]` = f32` forces
//! the f32 kernels for bf16 / f16 as well (A/B); `tc2` runs the tensor-core form with its state
//! sweep on mma.sync with the state in registers (gdn_chunk_tc2.cu; [`GDN_TC2_BV_ENV`] sets its
//! columns per block); `tc3` the same sweep writing the outputs too, two launches in all
//! (gdn_chunk/tc3.rs).

use super::{prod, u32_of, CudaFloat, CudaKernels, DeviceCaps, Result, GDN_CHUNK};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

mod tc3;
use tc3::{tc3_smem, tc4_wu, tc5_state, tc6_state, tc7_state, Tc3Call};
pub use tc3::{GDN_TC6_CLUSTER_ENV, GDN_WU_OCC_ENV};

/// Environment variable choosing the form of [`CudaKernels::gdn_chunked_seq`] for bf16 / f16
/// outputs: `f32` runs the CUDA-core f32 kernels; `tc` the tensor-core kernels
/// where the device and the head dims allow them; `tc2` the tensor-core kernels with the
/// mma.sync state sweep (gdn_chunk_tc2.cu) where its shared memory fits (else as `tc`); `tc3`
/// that sweep writing the outputs as well (no out launch; where its 207 KiB of shared memory or
/// a 16-byte aligned qkv are missing, as `tc`); `tc4` as `tc3` with its wu launch on mma.sync
/// (gdn_chunk_tc4.cu; where that launch's shared memory does not fit, exactly `tc3`); `tc5` as
/// `tc4` with the state sweep on warp pairs (gdn_chunk_tc5.cu: 4 warps a block instead of 2, the
/// same bits; where its 219 KiB do not fit, exactly `tc4`); `tc6` as
/// `tc5` with the sweep's stages multicast across a thread-block cluster of a head's column
/// blocks and the wu launch writing its scratch in the stage layout (gdn_chunk_tc6.cu; sm_90
/// only, else exactly `tc5`; the same bits; [`GDN_TC6_CLUSTER_ENV`]; H100, session 32, 80B
/// layout: 280.7 / 1,062.8 µs at 4k / 16k tokens against tc5's 308.1 / 1,170.9; session 33,
/// with q / k / v in the activation dtype and the wu launch at 3 blocks an SM: 268.3 / 988.2;
/// session 34, the wu launch's grams balanced over its warps: 244.8 / 928.2 on an H100);
/// `tc7` (or unset: the default) as `tc6` on a lean scratch: K̂ and Q̂ once per key head, U in
/// the activation dtype, the decays applied in the sweep's registers (65,024 bytes a chunk and
/// value head against 98,304; not tc6's bits, the same tolerances; where tc6 would not run in
/// clusters of 2, exactly `tc6`; H100, session 36: 207.8–210.3 / 792.0–795.4 µs against tc6's
/// 244.6–246.0 / 931.5–935.3 in the same runs).
/// Measured on the H200 in session 12, 4k / 16k tokens of the 80B layout: tc4 344.0 / 1,287.5 µs, tc3 435.5 /
/// 1,630.7, tc2 730.5 / 2,721, tc 1,036.6 / 3,900; flash-linear-attention 690 / 1,628; on the
/// H100 in session 20: tc5 318.0 / 1,180.0 µs, tc4 349.0 / 1,312.2, flash-linear-attention
/// 576.4 / 1,358.0. Any other value warns once on stderr and counts as unset. Read on every call.
pub const GDN_CHUNK_ENV: &str = "PORTER_GDN_CHUNK";

/// Environment variable: state columns per block of the `tc2` / `tc3` state sweep, `16`, `32` (unset:
/// the default) or `64` (1, 2 or 4 warps a block; 64 needs dv % 64 == 0, else 32). Other
/// values warn once and count as unset. Read on every call.
pub const GDN_TC2_BV_ENV: &str = "PORTER_GDN_TC2_BV";

/// Form of the chunked delta rule a caller asks for (see [`GDN_CHUNK_ENV`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnChunkForm {
    /// Tensor cores (wmma) for bf16 / f16 where they apply, else the f32 kernels.
    Tc,
    /// As `Tc` with the mma.sync state sweep of gdn_chunk_tc2.cu.
    Tc2,
    /// As `Tc2` with the outputs written by the state sweep (gdn_chunk/tc3.rs).
    Tc3,
    /// As `Tc3` with the wu launch on mma.sync (gdn_chunk_tc4.cu).
    Tc4,
    /// As `Tc4` with the state sweep on warp pairs (gdn_chunk_tc5.cu).
    Tc5,
    /// As `Tc5` with the sweep's stages multicast across a thread-block cluster
    /// (gdn_chunk_tc6.cu; sm_90 only, else exactly `Tc5`).
    Tc6,
    /// As `Tc6` on the wu launch's lean scratch (K̂ / Q̂ per key head, U in the activation type,
    /// the decays applied in the sweep; clusters of 2 only, else exactly `Tc6`).
    Tc7,
    /// The CUDA-core f32 kernels for every output type.
    F32,
}

/// The form [`GDN_CHUNK_ENV`]'s value `v` names (unset or a bad value, which warns once: `Tc7`,
/// which is exactly `Tc5` off sm_90).
fn form_from(v: Option<std::ffi::OsString>) -> GdnChunkForm {
    let Some(v) = v else { return GdnChunkForm::Tc7 };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "f32" => GdnChunkForm::F32,
        "tc2" => GdnChunkForm::Tc2,
        "tc3" => GdnChunkForm::Tc3,
        "tc4" => GdnChunkForm::Tc4,
        "tc5" => GdnChunkForm::Tc5,
        "tc6" => GdnChunkForm::Tc6,
        "" | "tc7" => GdnChunkForm::Tc7,
        "tc" => GdnChunkForm::Tc,
        other => {
            super::env::warn_once(
                GDN_CHUNK_ENV,
                &format!(
                    "warning: {GDN_CHUNK_ENV}={other:?} is none of `tc`, `tc2`, `tc3`, `tc4`, `tc5`, `tc6`, `tc7`, `f32`; using the default (tc7)"
                ),
            );
            GdnChunkForm::Tc7
        }
    }
}

/// Warps per block of the tc2 state sweep that [`GDN_TC2_BV_ENV`]'s value `v` names (a bad
/// value warns once and gives the default, 2).
fn tc2_warps_from(v: Option<std::ffi::OsString>) -> usize {
    let Some(v) = v else { return 2 };
    match v.to_string_lossy().trim() {
        "16" => 1,
        "" | "32" => 2,
        "64" => 4,
        other => {
            super::env::warn_once(
                GDN_TC2_BV_ENV,
                &format!("warning: {GDN_TC2_BV_ENV}={other:?} is none of 16, 32, 64; using 32"),
            );
            2
        }
    }
}

/// Which kernels a call of [`CudaKernels::gdn_chunked_seq_with`] ran.
#[doc(hidden)]
pub const GDN_FORMS: [&str; 9] = ["tc", "f32", "seq", "tc2", "tc3", "tc4", "tc5", "tc6", "tc7"];

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
    /// at most `cap · hv · (64·(2·dk + dv) + dk·dv + 1) · 4` bytes (335 MB for the
    /// 80B dims at 4096 tokens: the `tc` form's) plus `4·n_spans`; the default `tc7` takes
    /// about `cap · hv · 65 KB` there (133 MB).
    ///
    /// # Shapes
    /// - `qkv`: `[t, 2·hk·dk + hv·dv]` (`T`, the conv output: q `[hk, dk]` at column 0, k at
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
        qkv: &impl DevicePtr<T>,
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
        let form = form_from(std::env::var_os(GDN_CHUNK_ENV));
        self.gdn_chunked_impl(
            qkv, g, beta, state, spans, out, t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf, form, None,
        )
        .map(|_| ())
    }

    /// [`CudaKernels::gdn_chunked_seq`] with the form chosen by the caller instead of
    /// [`GDN_CHUNK_ENV`] ([`GdnChunkForm::F32`]: the f32 kernels even for bf16 / f16) and,
    /// with `timing`, CUDA events recorded around each of the four launches and their GPU
    /// times in µs written there once the stream has caught up (prep, wu, state, out; all 0
    /// when the sequential fallback runs). Returns the form that ran: `"tc"`, `"tc2"`, `"tc3"`, `"tc4"`, `"tc5"`,
    /// `"tc6"`, `"tc7"`, `"f32"`, or `"seq"` (`gdn_delta_seq`, where the chunk kernels do not fit the device's
    /// shared memory). For tests and profiling.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_chunked_seq_with<T: CudaFloat>(
        &self,
        qkv: &impl DevicePtr<T>,
        g: &impl DevicePtr<f32>,
        beta: &impl DevicePtr<f32>,
        state: &mut impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        dims: [usize; 9],
        form: GdnChunkForm,
        timing: Option<&mut [f64; 4]>,
    ) -> Result<&'static str> {
        let [t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf] = dims;
        self.gdn_chunked_impl(
            qkv, g, beta, state, spans, out, t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf, form, timing,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn gdn_chunked_impl<T: CudaFloat>(
        &self,
        qkv: &impl DevicePtr<T>,
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
        form: GdnChunkForm,
        timing: Option<&mut [f64; 4]>,
    ) -> Result<&'static str> {
        let dims = super::gdn_seq::DeltaDims { t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf };
        let limits = (GDN_CHUNK_MAX_D, Some(GDN_CHUNK_MAX_D));
        // The tensor-core form where it applies (bf16 / f16, sm_80+, dk 64 or 128, dv a
        // multiple of 32 up to 256, shared memory within the device's limit).
        let tc = if form == GdnChunkForm::F32 || T::NAME == "f32" { None } else { tc_smem(dk, dv, self.caps()) };
        // The mma.sync state sweep (warps per block, shared memory) where asked for and it fits.
        let tc2 = match (tc, form) {
            (Some(_), GdnChunkForm::Tc2) => {
                tc2_state_smem(dk, dv, tc2_warps_from(std::env::var_os(GDN_TC2_BV_ENV)), self.caps())
            }
            _ => None,
        };
        let tc3 = match (tc, form) {
            (Some(_), GdnChunkForm::Tc3) => {
                tc3_smem(dk, dv, tc2_warps_from(std::env::var_os(GDN_TC2_BV_ENV)), self.caps())
            }
            (Some(_), GdnChunkForm::Tc4) => {
                tc3_smem(dk, dv, tc2_warps_from(std::env::var_os(GDN_TC2_BV_ENV)), self.caps())
                    .map(|m| tc4_wu(m, dk, dv, self.caps()))
            }
            (Some(_), GdnChunkForm::Tc5 | GdnChunkForm::Tc6 | GdnChunkForm::Tc7) => tc3_smem(dk, dv, 2, self.caps())
                .map(|m| {
                    let caps = self.caps();
                    let m5 = tc5_state(tc4_wu(m, dk, dv, caps), dk, dv, caps);
                    match form {
                        GdnChunkForm::Tc6 => tc6_state(m5, dv, caps),
                        GdnChunkForm::Tc7 => tc7_state(tc6_state(m5, dv, caps), dk, caps),
                        _ => m5,
                    }
                }),
            _ => None,
        };
        let form_name = match (tc.is_some(), tc2.is_some(), tc3) {
            (true, _, Some(m)) if m.lean => GDN_FORMS[8],
            (true, _, Some(m)) if m.cluster > 0 => GDN_FORMS[7],
            (true, _, Some(m)) if m.pair => GDN_FORMS[6],
            (true, _, Some(m)) if m.tc4 => GDN_FORMS[5],
            (true, _, Some(_)) => GDN_FORMS[4],
            (true, true, _) => GDN_FORMS[3],
            (true, false, None) => GDN_FORMS[0],
            _ => GDN_FORMS[1],
        };
        if !self.check_delta_args("gdn_chunked_seq", limits, qkv, g, beta, &*state, spans, &*out, dims)? {
            return Ok(form_name);
        }
        // Fallback: where the chunk kernels need more shared memory than the device allows
        // (97 KiB at dk = 64, 169 KiB at dk = 128: more than an sm_70 / sm_75 / sm_86 has, or
        // PORTER_CUDA_FALLBACK=1), the sequential form, which uses about 21 KiB. It honours
        // the snapshot flag that this form reads as 0 (callers route snapshot spans there
        // anyway); with `timing`, the four times are 0.
        let (rk, ct, smem_state, smem_out) = gc_smem(dk, dv);
        if tc.is_none() && smem_state.max(smem_out) > self.caps().smem_limit() {
            return self
                .gdn_delta_seq(
                    qkv, g, beta, state, spans, out, t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf, None,
                )
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

        let mut laps = Laps::start(s, timing)?;
        // 1. Chunk offsets per span.
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: arguments match `gdn_chunk_prep`; `spans` holds n_spans rows,
        // `off` n_spans entries.
        // Kernel: `gdn_chunk_prep(const u32* spans, u32* off, u32 n_spans, u32 t, u32 num_slots, u32 nbuf,
        // u32 max_len, u32 cap)`.
        unsafe {
            launch!(self, GDN_CHUNK, "gdn_chunk_prep", cfg, [psp, poff, ns32, t32, slots32, nbuf32, ml32, cap32])
        }?;
        laps.lap(s)?;
        let chunk_grid = (mc32, hv32, ns32);

        // tc3's wu loads q / k rows 4 elements (8 bytes) at a time: qkv must be aligned (16
        // bytes asked; else the tc form).
        if let Some(m) = tc3.filter(|_| pq % 16 == 0) {
            let (pb, _gb) = beta.device_ptr(s);
            let (pst, _gst) = state.device_ptr_mut(s);
            let (pout, _gout) = out.device_ptr_mut(s);
            let call = Tc3Call {
                qkv: pq,
                g: pg,
                beta: pb,
                spans: psp,
                off: poff,
                state: pst,
                out: pout,
                cap,
                t: t32,
                n_spans: ns32,
                max_chunks: mc32,
                hk: hk32,
                hv: hv32,
                dk,
                dv: dv32,
                nbuf: nbuf32,
                q_scale,
            };
            self.gdn_tc3::<T>(m, &call, &mut laps)?;
            laps.finish()?;
            return Ok(form_name);
        }

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
            let f_state = match tc2 {
                Some((nw, smem)) => {
                    self.function_smem(&GDN_CHUNK, &format!("gdn_chunk_tc2_state_d{dk}_{}_w{nw}", T::NAME), smem)?
                }
                None => self.function_smem(&GDN_CHUNK, &name("state"), smem_tstate)?,
            };
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
            // Kernel: `gdn_chunk_tc_wu_d<DK>_<T>(const T* qkv, const float* g, const float* beta,
            // const u32* spans, const u32* off, T* wn, T* kb, float* uf, float* gl, u32 hk, u32 hv, u32 dv)`.
            unsafe {
                launch_fn!(self, f_wu, cfg, [pq, pg, ptr(beta), psp, poff, pwn, pkb, puf, pgl, hk32, hv32, dv32])
            }?;
            laps.lap(s)?;
            // 3. The state, chunk after chunk, 32 columns a block (tc2: 16 per warp, 1, 2 or
            // 4 warps); Vn and the chunk-start states.
            let cfg = match tc2 {
                Some((nw, smem)) => LaunchConfig {
                    grid_dim: (u32_of("column blocks", dv / (16 * nw))?, hv32, ns32),
                    block_dim: (u32_of("threads", 32 * nw)?, 1, 1),
                    shared_mem_bytes: u32_of("smem", smem)?,
                },
                None => LaunchConfig {
                    grid_dim: (dv32 / 32, hv32, ns32),
                    block_dim: block,
                    shared_mem_bytes: u32_of("smem", smem_tstate)?,
                },
            };
            // SAFETY: arguments match `gdn_chunk_tc_state_d<dk>_<T>` and
            // `gdn_chunk_tc2_state_d<dk>_<T>_w<nw>` alike; dv % 32 == 0 (tc2: dv % (16·nw) == 0,
            // tc2_state_smem); the shared memory size is the kernel's layout; slot / src_buf of a
            // valid span are in range.
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
            laps.lap(s)?;
            // 4. Outputs per (chunk, value head).
            let cfg =
                LaunchConfig { grid_dim: chunk_grid, block_dim: block, shared_mem_bytes: u32_of("smem", smem_tout)? };
            // SAFETY: arguments match `gdn_chunk_tc_out_d<dk>_<T>`; dv <= 256 (at most 8 output
            // tiles a warp); NaN rows of invalid spans are clipped to t.
            // Kernel: `gdn_chunk_tc_out_d<DK>_<T>(const T* qkv, const float* g, const u32* spans,
            // const u32* off, const T* vb, const T* hb, T* out, u32 t, u32 hk, u32 hv, u32 dv, float q_scale)`.
            unsafe {
                launch_fn!(
                    self,
                    f_out,
                    cfg,
                    [pq, pg, psp, poff, pvb, phb, ptr_mut(out), t32, hk32, hv32, dv32, q_scale]
                )
            }?;
            laps.lap(s)?;
            laps.finish()?;
            return Ok(if tc2.is_some() { GDN_FORMS[3] } else { GDN_FORMS[0] });
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
        // SAFETY: arguments match `gdn_chunk_wu_<T>`; lengths checked; a valid span
        // (per `off`) has rows inside 0..t and at most max_chunks chunks, whose
        // scratch indices off + c are below cap (checked by gdn_chunk_prep).
        // Kernel: `gdn_chunk_wu_<T>(const T* qkv, const float* g, const float* beta, const u32* spans, const u32* off,
        // float* wt, float* ut, float* kt, float* gl, u32 hk, u32 hv, u32 dk, u32 dv)`.
        unsafe {
            launch!(
                self,
                GDN_CHUNK,
                &format!("gdn_chunk_wu_{}", T::NAME),
                cfg,
                [pq, pg, ptr(beta), psp, poff, pwt, put, pkt, pgl, hk32, hv32, dk32, dv32]
            )
        }?;

        laps.lap(s)?;
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

        laps.lap(s)?;
        // 4. Outputs per (chunk, value head).
        let cfg = LaunchConfig {
            grid_dim: chunk_grid,
            block_dim: (GC_THREADS, 1, 1),
            shared_mem_bytes: u32_of("shared memory", smem_out)?,
        };
        // SAFETY: arguments match `gdn_chunk_out_c<CT>_<T>`; 16·CT >= dv; the
        // shared memory size is the kernel's layout for (dk, CT) (at most
        // ~165 KiB, opted in above); NaN rows of invalid spans are clipped to t.
        // Kernel: `gdn_chunk_out_c<CT>_<T>(const T* qkv, const float* g, const u32* spans, const u32* off,
        // const float* ut, const float* hs, T* out, u32 t, u32 hk, u32 hv, u32 dk, u32 dv, float q_scale)`.
        unsafe {
            launch_fn!(
                self,
                f_out,
                cfg,
                [pq, pg, psp, poff, put, phs, ptr_mut(out), t32, hk32, hv32, dk32, dv32, q_scale]
            )
        }?;
        laps.lap(s)?;
        laps.finish()?;
        Ok(GDN_FORMS[1])
    }
}

/// CUDA events around the launches of one call (timing only): [`Laps::lap`] after each
/// launch, [`Laps::finish`] waits for the last and writes the GPU time between consecutive
/// events, µs, to the caller's array.
struct Laps<'a> {
    out: Option<&'a mut [f64; 4]>,
    events: Vec<cudarc::driver::CudaEvent>,
}

impl<'a> Laps<'a> {
    fn flags() -> Option<cudarc::driver::sys::CUevent_flags> {
        Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    /// Records the start event when `out` is given.
    fn start(s: &cudarc::driver::CudaStream, out: Option<&'a mut [f64; 4]>) -> Result<Self> {
        let mut events = Vec::new();
        if out.is_some() {
            events.push(s.record_event(Self::flags())?);
        }
        Ok(Laps { out, events })
    }

    /// Records the end of the launch just queued (timing only).
    fn lap(&mut self, s: &cudarc::driver::CudaStream) -> Result<()> {
        if self.out.is_some() {
            self.events.push(s.record_event(Self::flags())?);
        }
        Ok(())
    }

    /// Waits for the events and writes the times (timing only).
    fn finish(self) -> Result<()> {
        if let Some(us) = self.out {
            for (k, pair) in self.events.windows(2).enumerate().take(4) {
                us[k] = f64::from(pair[0].elapsed_ms(&pair[1])?) * 1e3;
            }
        }
        Ok(())
    }
}

/// Warps per block and dynamic shared memory (bytes; `GT2_STATE_SMEM` in gdn_chunk_tc2.cu:
/// 3 stages of −W, K̃ (T [64][dk + 8]) and U (f32 [64][16·nw + 4])) of the tc2 state sweep
/// for `nw` warps asked for (4 falls back to 2 where dv % 64 != 0), or `None` where it does
/// not fit the device's shared memory. The dims are those [`tc_smem`] accepts.
fn tc2_state_smem(dk: usize, dv: usize, nw: usize, caps: DeviceCaps) -> Option<(usize, usize)> {
    let nw = if dv.is_multiple_of(16 * nw) { nw } else { 2 };
    let smem = 3 * (4 * GC_C * (dk + 8) + 4 * GC_C * (16 * nw + 4));
    (smem + TC_STATIC_SMEM <= caps.smem_limit()).then_some((nw, smem))
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
        assert_eq!(form_from(None), GdnChunkForm::Tc7);
        assert_eq!(form_from(Some("tc6".into())), GdnChunkForm::Tc6);
        assert_eq!(form_from(Some("f32".into())), GdnChunkForm::F32);
        assert_eq!(form_from(Some(" F32 ".into())), GdnChunkForm::F32);
        assert_eq!(form_from(Some("tc".into())), GdnChunkForm::Tc);
        assert_eq!(form_from(Some("TC2".into())), GdnChunkForm::Tc2);
        assert_eq!(form_from(Some("tc3".into())), GdnChunkForm::Tc3);
        assert_eq!(form_from(Some(" Tc4".into())), GdnChunkForm::Tc4);
        assert_eq!(form_from(Some("tc5".into())), GdnChunkForm::Tc5);
        assert_eq!(form_from(Some("tc7".into())), GdnChunkForm::Tc7);
        assert_eq!(form_from(Some("bogus".into())), GdnChunkForm::Tc7); // warns once, default
        assert_eq!(tc2_warps_from(None), 2);
        assert_eq!(tc2_warps_from(Some("16".into())), 1);
        assert_eq!(tc2_warps_from(Some("64".into())), 4);
        assert_eq!(tc2_warps_from(Some("48".into())), 2); // warns once, default
    }

    #[test]
    fn tc2_state_smem_layout() {
        let h200 = caps(9, 227 * 1024, false);
        // 80B dims: 3 × (2 · 64 · 136 · 2 + 64 · 36 · 4) = 132 096 bytes.
        assert_eq!(tc2_state_smem(128, 128, 2, h200), Some((2, 132_096)));
        assert_eq!(tc2_state_smem(128, 128, 4, h200), Some((4, 3 * (34_816 + 64 * 68 * 4))));
        assert_eq!(tc2_state_smem(128, 32, 4, h200).map(|x| x.0), Some(2)); // dv % 64 != 0
        assert_eq!(tc2_state_smem(64, 64, 1, h200).map(|x| x.0), Some(1));
        assert_eq!(tc2_state_smem(128, 128, 2, caps(8, 99 * 1024, false)), None);
        assert_eq!(3 * tc3::tc2_stage_bytes(128, 2, false), 132_096);
    }

    #[test]
    fn tc3_smem_layout() {
        let h200 = caps(9, 227 * 1024, false);
        // 80B dims: wu as gdn_chunk_tc_wu's; the state 3 × (3 · 17 408 + 9 216 + 9 216).
        let m = tc3_smem(128, 128, 2, h200).expect("fits an H200");
        assert_eq!((m.wu, m.nw, m.state), (70_656, 2, 211_968));
        // 4 warps (U [64][68] f32) do not fit three stages: 2.
        assert_eq!(tc3_smem(128, 128, 4, h200).map(|m| m.nw), Some(2));
        assert_eq!(tc3_smem(64, 64, 4, h200).map(|m| m.nw), Some(4));
        assert_eq!(tc3_smem(128, 128, 2, caps(8, 163 * 1024, false)).map(|m| m.nw), None); // A100: 207 KiB
        assert_eq!(tc3_smem(64, 64, 2, caps(8, 163 * 1024, false)).map(|m| m.nw), Some(2));
    }

    #[test]
    fn tc4_wu_smem_layout() {
        let h200 = caps(9, 227 * 1024, false);
        let m = tc3_smem(128, 128, 2, h200).expect("fits an H200");
        // 80B dims: Kb, Qb 2 · 17 408, Vb 17 408, As 17 408 (2 blocks an SM with 112 registers).
        let m4 = tc4_wu(m, 128, 128, h200);
        assert_eq!((m4.wu, m4.tc4, m4.nw, m4.state), (69_632, true, 2, 211_968));
        assert!(2 * (m4.wu + 1280 + 1024) <= 228 * 1024);
        assert_eq!(tc4_wu(m, 128, 256, h200).wu, 86_016);
        // Too little shared memory: tc3's wu launch, unchanged.
        let small = caps(8, 60 * 1024, false);
        assert_eq!(tc4_wu(m, 128, 128, small), m);
    }

    #[test]
    fn tc5_state_smem_layout() {
        let h200 = caps(9, 227 * 1024, false);
        let m4 = tc4_wu(tc3_smem(128, 128, 2, h200).expect("fits an H200"), 128, 128, h200);
        // 80B dims: tc3's three stages of 32 columns + 4 warps × (2 + 4) × 512 bytes of exchange.
        let m5 = tc5_state(m4, 128, 128, h200);
        assert_eq!((m5.wu, m5.tc4, m5.nw, m5.state, m5.pair), (69_632, true, 2, 224_256, true));
        assert_eq!(tc3::tc5_state_smem(64), 3 * 46_080 + 8_192);
        // An A100 (163 KiB) keeps the pairs at dk = 64 only; too little: tc4's sweep, unchanged.
        let a100 = caps(8, 163 * 1024, false);
        let m64 = tc3_smem(64, 64, 2, a100).expect("fits an A100");
        assert!(tc5_state(m64, 64, 64, a100).pair);
        let small = caps(8, 140 * 1024, false);
        assert_eq!(tc5_state(m64, 64, 64, small), m64);
    }

    #[test]
    fn tc6_only_on_sm90_with_whole_clusters() {
        let h200 = caps(9, 227 * 1024, false);
        let m5 = tc5_state(tc4_wu(tc3_smem(128, 128, 2, h200).expect("fits"), 128, 128, h200), 128, 128, h200);
        // Clusters of 2 (the default; the environment variable is unset in unit tests): tc5's
        // shared memory, 160 threads.
        let m6 = tc6_state(m5, 128, h200);
        assert_eq!((m6.cluster, m6.state, m6.pair), (2, m5.state, true));
        // dv = 32: one column block, no whole cluster of 2; elsewhere than sm_90, or forced: tc5.
        assert_eq!(tc6_state(m5, 32, h200), m5);
        assert_eq!(tc6_state(m5, 128, caps(8, 227 * 1024, false)), m5);
        assert_eq!(tc6_state(m5, 128, caps(9, 227 * 1024, true)), m5);
        // Not after tc4's sweep (no warp pairs).
        let m4 = tc4_wu(tc3_smem(128, 128, 2, h200).expect("fits"), 128, 128, h200);
        assert_eq!(tc6_state(m4, 128, h200), m4);
    }

    #[test]
    fn tc7_on_tc6_clusters_of_two() {
        let h200 = caps(9, 227 * 1024, false);
        let m5 = tc5_state(tc4_wu(tc3_smem(128, 128, 2, h200).expect("fits"), 128, 128, h200), 128, 128, h200);
        let m6 = tc6_state(m5, 128, h200);
        // GT7_SMEM(128): 3 stages of 3 · 17,408 + 5,120 + 512 + 9,216 bytes, then the exchange
        // (4 warps · 8 fragments · 512 bytes); GT7_UFB(128) = 512 + 4 · 5,120.
        assert_eq!(tc3::tc7_state_smem(128), 3 * 67_072 + 16_384);
        assert_eq!(tc3::tc7_state_smem(64), 3 * 42_496 + 12_288);
        assert_eq!(tc3::tc7_ufb(128), 20_992);
        let m7 = tc7_state(m6, 128, h200);
        assert_eq!((m7.lean, m7.cluster, m7.state), (true, 2, 217_600));
        // Only on tc6's clusters of 2 (tc5's sweep, or no room: unchanged).
        assert_eq!(tc7_state(m5, 128, h200), m5);
        assert_eq!(tc7_state(m6, 128, caps(9, 200 * 1024, false)), m6);
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
