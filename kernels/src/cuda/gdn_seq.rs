//! Launch wrappers of kernels/cuda/gdn_seq.cu: the multi-token Gated DeltaNet
//! path over a batch of sequences. A *span* is one sequence's run of
//! consecutive rows in the batch; per-sequence state lives in pools indexed by
//! slot. Semantics of [`crate::cpu::gdn`].

use super::{opt_ptr, opt_ptr_mut, prod, u32_of, CudaError, CudaFloat, CudaKernels, KernelArg, Result, GDN_SEQ};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

/// Most rows per block of the conv kernel (`CONV_ROWS` in gdn_seq.cu).
const CONV_ROWS: usize = 16;
/// The conv kernel takes 2^⌈log2(t / this)⌉ rows per block (at most [`CONV_ROWS`]).
const CONV_TILE_ROWS_FROM: usize = 256;
/// Largest conv kernel size (`CONV_MAXK`).
pub const GDN_CONV_MAXK: usize = 8;
/// Threads of the conv + gates kernel (`CONV_THREADS`).
const THREADS: u32 = 256;
/// Tokens staged per tile by the delta-rule kernel (`DS_TT`).
const DS_TT: usize = 16;
/// Padding of a part's staged q / k rows (`DS_PAD`).
const DS_PAD: usize = 4;
/// Largest key head dim of [`CudaKernels::gdn_delta_seq`].
pub const GDN_SEQ_MAX_DK: usize = 256;
/// Register rows per lane of the delta-rule kernel that are instantiated.
const DS_RS: [usize; 4] = [16, 32, 64, 128];
/// Threads of a whole-head block of [`CudaKernels::gdn_delta_seq`] at most (its launch bound).
const DS_HEAD_THREADS: usize = 256;
/// Below this many lanes (columns × parts) the delta-rule kernel splits
/// columns over more lanes.
const DS_MIN_LANES: usize = 32 * 1024;

impl CudaKernels {
    /// Causal depthwise conv1d + SiLU over the spans of a batch, reading and
    /// updating a per-slot window of raw inputs (`cpu::gdn::causal_conv1d_prefill`
    /// per span, no bias), and the GDN gates of every row (`cpu::gdn::gdn_gates`),
    /// in one launch.
    ///
    /// Conv: span `s` = `spans[s] = (row0, len, slot, lag)`: rows `row0..row0 + len`
    /// continue the sequence whose window is `window[slot]`; the newest `lag`
    /// entries of that window were rolled back, so the history is
    /// `window[slot, .., 0..win − lag]`. With `u` = history ++ the span's inputs
    /// (`x[r, ch]` read as f32),
    /// `out[r, ch] = silu(Σ_{i<k} w[ch, i] · u[r − (k−1) + i])` (summed in f32, rounded to `T`
    /// once, as transformers' bf16 forward rounds its conv output). Afterwards
    /// the window holds the last `win` entries of `u`, oldest first (zeros where
    /// `u` is shorter), i.e. its lag is 0.
    ///
    /// Gates, for every row `r < t` from the `[b | a]` columns
    /// `ba_col..ba_col + 2·hv` of `ba` when given (`in_proj_ba`'s output read in place
    /// instead of concatenated onto the projections), else of `x` (`ba_stride` then must be
    /// `x_stride`): `g = −exp(a_log) · softplus(a + dt_bias)` (threshold 20), `beta = σ(b)`.
    ///
    /// Spans must use distinct slots and disjoint rows. A span whose slot is
    /// `>= num_slots`, whose rows pass `t`, or with `lag > win − (k − 1)` gives
    /// NaN conv rows and leaves the windows alone; rows outside every span get no
    /// conv output (their gates are written).
    ///
    /// # Shapes
    /// - `x`: `[t, x_stride]` (`T`; the conv channels are columns `0..c`, without `ba` the
    ///   `[b(hv) | a(hv)]` columns `ba_col..ba_col + 2·hv`)
    /// - `ba`: `[t, ba_stride]` (`T`), when given
    /// - `w`: `[c, k]` (`f32`)
    /// - `a_log`, `dt_bias`: `[hv]` (`f32`)
    /// - `window`: `[num_slots, c, win]` (`f32`, oldest first), updated
    /// - `spans`: `[n_spans, 4]` (`u32`)
    /// - `out`: `[t, c]` (`T`)
    /// - `g`, `beta`: `[t, hv]` (`f32`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if `c == 0`, `hv == 0`, `k == 0`, `k > 8`,
    /// `win < k − 1`, `x_stride < c`, `ba_col + 2·hv > ba_stride`, a `ba_stride` other than
    /// `x_stride` without `ba`, or on a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_conv_gates_seq<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        x_stride: usize,
        ba: Option<&impl DevicePtr<T>>,
        ba_stride: usize,
        ba_col: usize,
        w: &impl DevicePtr<f32>,
        a_log: &impl DevicePtr<f32>,
        dt_bias: &impl DevicePtr<f32>,
        window: &mut impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        g: &mut impl DevicePtrMut<f32>,
        beta: &mut impl DevicePtrMut<f32>,
        t: usize,
        n_spans: usize,
        c: usize,
        k: usize,
        win: usize,
        num_slots: usize,
        hv: usize,
    ) -> Result<()> {
        const NAME: &str = "gdn_conv_gates_seq";
        if ba_col.checked_add(2 * hv).is_none_or(|e| e > ba_stride) || (ba.is_none() && ba_stride != x_stride) {
            return Err(CudaError::Invalid(format!(
                "{NAME}: gate columns {ba_col}+2·{hv} past the stride {ba_stride} (which must be x_stride {x_stride} \
                 without ba)"
            )));
        }
        if let Some(b) = ba {
            self.check("ba", b, prod(&[t, ba_stride])?)?;
        }
        let (ba32, bas32) = (u32_of("ba_col", ba_col)?, u32_of("ba_stride", ba_stride)?);
        let (pba, _gba) = match ba {
            Some(b) => b.device_ptr(&self.stream),
            None => x.device_ptr(&self.stream),
        };
        let d = ConvGatesDims { t, n_spans, c, k, win, num_slots, hv };
        let gates = GateArgs::Cols { ba: pba, stride: bas32, col: ba32 };
        self.conv_gates_launch(NAME, x, x_stride, w, a_log, dt_bias, window, spans, out, g, beta, d, gates)
    }

    /// The checks and the launch both conv + gates forms share ([`CudaKernels::gdn_conv_gates_seq`],
    /// [`CudaKernels::gdn_conv_gates_proj_seq`]): sizes, buffer lengths, the grid (a row tile's
    /// channel blocks and its gate blocks: 1, or `gb` of the proj form).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn conv_gates_launch<T: CudaFloat>(
        &self,
        name: &str,
        x: &impl DevicePtr<T>,
        x_stride: usize,
        w: &impl DevicePtr<f32>,
        a_log: &impl DevicePtr<f32>,
        dt_bias: &impl DevicePtr<f32>,
        window: &mut impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        g: &mut impl DevicePtrMut<f32>,
        beta: &mut impl DevicePtrMut<f32>,
        d: ConvGatesDims,
        gates: GateArgs,
    ) -> Result<()> {
        let ConvGatesDims { t, n_spans, c, k, win, num_slots, hv } = d;
        if c == 0 || hv == 0 || k == 0 || k > GDN_CONV_MAXK {
            return Err(CudaError::Invalid(format!(
                "{name}: c {c} and hv {hv} must be > 0 and k {k} in 1..={GDN_CONV_MAXK}"
            )));
        }
        if win + 1 < k {
            return Err(CudaError::Invalid(format!("{name}: window {win} < k − 1 = {}", k - 1)));
        }
        if x_stride < c {
            return Err(CudaError::Invalid(format!("{name}: x_stride {x_stride} < c {c}")));
        }
        self.check("x", x, prod(&[t, x_stride])?)?;
        self.check("w", w, prod(&[c, k])?)?;
        self.check("a_log", a_log, hv)?;
        self.check("dt_bias", dt_bias, hv)?;
        self.check("window", window, prod(&[num_slots, c, win])?)?;
        self.check("spans", spans, prod(&[n_spans, 4])?)?;
        self.check("out", out, prod(&[t, c])?)?;
        self.check("g", g, prod(&[t, hv])?)?;
        self.check("beta", beta, prod(&[t, hv])?)?;
        if t == 0 {
            return Ok(());
        }
        let rows = conv_tile_rows(t);
        let cblocks = c.div_ceil(THREADS as usize);
        let gblocks = match gates {
            GateArgs::Cols { .. } => 1,
            GateArgs::Proj { gb, .. } => gb as usize,
        };
        if cblocks + gblocks > 65_535 {
            return Err(CudaError::Invalid(format!("{name}: c {c} too large")));
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of("row blocks", t.div_ceil(rows))?, (cblocks + gblocks) as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xs32, t32, ns32, c32, k32, win32, slots32, hv32) = (
            u32_of("x_stride", x_stride)?,
            u32_of("t", t)?,
            u32_of("n_spans", n_spans)?,
            u32_of("c", c)?,
            u32_of("k", k)?,
            u32_of("win", win)?,
            u32_of("num_slots", num_slots)?,
            u32_of("hv", hv)?,
        );
        let st = &*self.stream;
        let ((px, _gx), (pw, _gw), (pal, _gal), (pdt, _gdt), (psp, _gsp)) =
            (x.device_ptr(st), w.device_ptr(st), a_log.device_ptr(st), dt_bias.device_ptr(st), spans.device_ptr(st));
        let ((pwin, _gwin), (pout, _gout), (pg, _gg), (pbeta, _gbeta)) =
            (window.device_ptr_mut(st), out.device_ptr_mut(st), g.device_ptr_mut(st), beta.device_ptr_mut(st));
        let mut args: Vec<&dyn KernelArg> = vec![
            &px, &xs32, &pw, &pwin, &psp, &pout, &pal, &pdt, &pg, &pbeta, &t32, &ns32, &c32, &k32, &win32, &slots32,
        ];
        let rows32 = rows as u32;
        let kernel = match &gates {
            GateArgs::Cols { ba, stride, col } => {
                args.extend([ba as &dyn KernelArg, stride, col]);
                "gdn_conv_gates_seq"
            }
            GateArgs::Proj { x: xp, w: wba, hidden, gb, split } => {
                args.extend([xp as &dyn KernelArg, wba, hidden, gb, split]);
                "gdn_conv_gates_proj_seq"
            }
        };
        args.extend([&hv32 as &dyn KernelArg, &rows32]);
        // SAFETY: arguments match `gdn_conv_gates_seq_<T>(const T* x, u32 x_stride, const float* w,
        // float* window, const u32* spans, float* out, const float* a_log, const float* dt_bias,
        // float* g, float* beta, u32 t, u32 n_spans, u32 c, u32 k, u32 win, u32 num_slots, const T*
        // ba, u32 ba_stride, u32 ba_col, u32 hv, u32 rows)` in gdn_seq.cu (lengths: ba's or x's t ·
        // ba_stride, checked by the caller with the gate columns), or `gdn_conv_gates_proj_seq_<T>`
        // with `const T* xp, const T* wba, u32 hidden, u32 gb, u32 split` in place of ba's three
        // (the caller checked xp's t · hidden and wba's 2·hv · hidden elements, gb >= 1 and split
        // in {1, 2, 4}; the kernel takes its vector path only on 16-byte rows); k <= CONV_MAXK
        // checked; rows <= CONV_ROWS; the kernel bounds-checks every span (slot, rows, lag) before
        // reading through it.
        unsafe { self.launch(&GDN_SEQ, &format!("{kernel}_{}", T::NAME), cfg, &args) }
    }

    /// The conv windows slots would hold after consuming the first `cut` rows of a span
    /// (prefix-cache checkpoints saved inside a prefill span): launched before the step's
    /// [`CudaKernels::gdn_conv_gates_seq`], which rewrites the windows it reads.
    ///
    /// Save `i` = `saves[i] = (row0, cut, slot, lag, dst)`: with `u` = the slot's history
    /// `window[slot, ch, 0..win − lag]` ++ `x[row0 .. row0 + cut, ch]` (read as f32),
    /// `dst[dst_i, ch, w] = u[len(u) − win + w]` (0 where the index is negative) — what the
    /// conv kernel leaves in the window after a span of `cut` rows. A save whose slot, lag
    /// or rows are out of range gets NaN windows; one whose `dst ≥ num_dst` writes nothing.
    ///
    /// # Shapes
    /// - `x`: `[t, x_stride]` (`T`; the conv channels are columns `0..c`)
    /// - `window`: `[num_slots, c, win]` (`f32`, oldest first), read
    /// - `saves`: `[n, 5]` (`u32`)
    /// - `dst`: `[num_dst, c, win]` (`f32`), written where a save names it
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if `c` or `win` is 0, `x_stride < c`, or on a length mismatch;
    /// driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_window_at<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        x_stride: usize,
        window: &impl DevicePtr<f32>,
        saves: &impl DevicePtr<u32>,
        dst: &mut impl DevicePtrMut<f32>,
        t: usize,
        n: usize,
        c: usize,
        win: usize,
        num_slots: usize,
        num_dst: usize,
    ) -> Result<()> {
        const NAME: &str = "gdn_window_at";
        if c == 0 || win == 0 || x_stride < c {
            return Err(CudaError::Invalid(format!(
                "{NAME}: c {c} and win {win} must be > 0, x_stride {x_stride} >= c"
            )));
        }
        self.check("x", x, prod(&[t, x_stride])?)?;
        self.check("window", window, prod(&[num_slots, c, win])?)?;
        self.check("saves", saves, prod(&[n, 5])?)?;
        self.check("dst", dst, prod(&[num_dst, c, win])?)?;
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of("channel blocks", c.div_ceil(THREADS as usize))?, u32_of("saves", n)?, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xs32, t32, c32, win32, slots32, dst32) = (
            u32_of("x_stride", x_stride)?,
            u32_of("t", t)?,
            u32_of("c", c)?,
            u32_of("win", win)?,
            u32_of("num_slots", num_slots)?,
            u32_of("num_dst", num_dst)?,
        );
        // SAFETY: arguments match `gdn_window_at_<T>` in gdn_seq.cu; lengths checked; the
        // kernel skips a save whose dst is out of range and writes NaN windows for one whose
        // slot, lag or rows are, so every access stays inside the checked buffers.
        // Kernel: `gdn_window_at_<T>(const T* x, u32 x_stride, const float* window, const u32* saves,
        // float* dst, u32 t, u32 c, u32 win, u32 num_slots, u32 num_dst)`.
        unsafe {
            launch!(
                self,
                GDN_SEQ,
                format!("gdn_window_at_{}", T::NAME),
                cfg,
                [ptr(x), xs32, ptr(window), ptr(saves), ptr_mut(dst), t32, c32, win32, slots32, dst32]
            )
        }
    }

    /// Gated delta rule over the spans of a batch (recurrent form; per span,
    /// `cpu::gdn::l2norm_rows` on q and k followed by
    /// `cpu::gdn::recurrent_gated_delta_rule`), with optional per-token
    /// snapshots of the state (speculative decoding).
    ///
    /// Span `s` = `spans[s] = (row0, len, slot, src_buf, snapshot)`. Per value
    /// head `j` (key head `j / (hv / hk)`), starting from
    /// `S = state[slot, src_buf, j]`, for every token of the span: q and k are
    /// L2-normalised in f32 (`x · rsqrt(Σx² + 1e-6)`, q also times `dk^-½`),
    /// `S ← exp(g)·S` (flushed to 0 below `g = −60`), `δ = β·(v − Sᵀk)`,
    /// `S ← S + k⊗δ`, `out[row] = Sᵀq` (rounded to `T` once). With
    /// `snapshot ≠ 0` the state after token `i` is written to buffer `i` of the
    /// slot (`src_buf` may be one of them: it is read first); otherwise the
    /// final state goes back to `src_buf`.
    ///
    /// Spans must use distinct slots and disjoint rows; `max_len` bounds their
    /// lengths (it only steers the launch shape). A span whose slot or
    /// `src_buf` is out of range, whose rows pass `t`, or a snapshot span longer
    /// than `nbuf` gives NaN rows and leaves every state alone; rows outside
    /// every span are not written.
    ///
    /// # Shapes
    /// - `qkv`: `[t, 2·hk·dk + hv·dv]` (`T`, the conv output: q `[hk, dk]`
    ///   at column 0, k at `hk·dk`, v `[hv, dv]` at `2·hk·dk`)
    /// - `g`, `beta`: `[t, hv]` (`f32`)
    /// - `state`: `[num_slots, nbuf, hv, dk, dv]` (`f32`, k-major), updated
    /// - `spans`: `[n_spans, 5]` (`u32`)
    /// - `out`: `[t, hv, dv]` (`T`)
    ///
    /// # Errors
    /// [`CudaError::Invalid`] if a dimension is zero, `hv % hk != 0`,
    /// `dk > 256`, or on a length mismatch; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_delta_seq<T: CudaFloat>(
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
        norm: Option<DeltaNorm<'_, T>>,
    ) -> Result<()> {
        let dims = DeltaDims { t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf };
        if let Some(nz) = &norm {
            let width = prod(&[hv, dv])?;
            if nz.zoff.checked_add(width).is_none_or(|e| e > nz.z_stride) {
                return Err(CudaError::Invalid(format!(
                    "gdn_delta_seq: z columns {}+{width} exceed the row width {}",
                    nz.zoff, nz.z_stride
                )));
            }
            self.check("z", nz.z, prod(&[t, nz.z_stride])?)?;
            self.check("norm weight", nz.w, dv)?;
            self.check("normed out", &*nz.out, prod(&[t, hv, dv])?)?;
            let need = prod(&[n_spans, hv])?;
            if nz.counters.len() < need {
                return Err(CudaError::Invalid(format!(
                    "gdn_delta_seq: {} norm counters, {need} needed",
                    nz.counters.len()
                )));
            }
        }
        if !self.check_delta_args("gdn_delta_seq", (GDN_SEQ_MAX_DK, None), qkv, g, beta, &*state, spans, &*out, dims)? {
            return Ok(());
        }
        // The whole-head form (a norm that asks for it, and a head that fits a block of
        // DS_HEAD_THREADS at the most lanes a column that does): one block per (head, span).
        let head_lanes = norm
            .as_ref()
            .filter(|nz| nz.whole_head)
            .and_then(|_| [8usize, 4, 2, 1].into_iter().find(|&p| p * dv <= DS_HEAD_THREADS && dk.div_ceil(p) <= 128));
        let p = head_lanes.unwrap_or_else(|| delta_lanes(n_spans, hv, dk, dv));
        let r = DS_RS
            .into_iter()
            .find(|&r| r >= dk.div_ceil(p))
            .ok_or_else(|| CudaError::Invalid(format!("gdn_delta_seq: dk {dk} too large")))?;
        let cpw = 32 / p;
        let mut nt = if p == 1 { 64 } else { 128 };
        while nt > 32 && nt / p >= 2 * dv.div_ceil(cpw) * cpw {
            nt /= 2;
        }
        if head_lanes.is_some() {
            nt = (p * dv).div_ceil(32) * 32;
        }
        let cb = nt / p;
        let shared = 4 * DS_TT * (2 * p * (r + DS_PAD) + cb + 2);
        let cfg = LaunchConfig {
            grid_dim: (u32_of("column blocks", dv.div_ceil(cb))?, hv as u32, n_spans as u32),
            block_dim: (nt as u32, 1, 1),
            shared_mem_bytes: u32_of("shared memory", shared)?,
        };
        let (t32, hk32, hv32, dk32, dv32, slots32, nbuf32, p32) = (
            u32_of("t", t)?,
            u32_of("hk", hk)?,
            u32_of("hv", hv)?,
            u32_of("dk", dk)?,
            u32_of("dv", dv)?,
            u32_of("num_slots", num_slots)?,
            u32_of("nbuf", nbuf)?,
            p as u32,
        );
        let q_scale = 1.0 / (dk as f32).sqrt();
        let s = &*self.stream;
        let (z, w, zs, zoff, eps) = match &norm {
            Some(nz) => (Some(nz.z), Some(nz.w), u32_of("z stride", nz.z_stride)?, u32_of("zoff", nz.zoff)?, nz.eps),
            None => (None, None, 0, 0, 0.0),
        };
        let (pz, _gz) = opt_ptr(z, s);
        let (pw, _gw) = opt_ptr(w, s);
        let (out_n, counters) = match norm {
            Some(nz) => (Some(nz.out), Some(nz.counters)),
            None => (None, None),
        };
        let (po, _go) = opt_ptr_mut(out_n, s);
        let (pc, _gc) = opt_ptr_mut(counters, s);
        // SAFETY: arguments match `gdn_delta_seq_r<R>_<T>` in gdn_seq.cu; lengths
        // checked; R·P >= dk; the shared memory size is the kernel's layout for
        // (P, R, blockDim / P columns) and stays below 48 KiB (dk <= 256); the
        // kernel bounds-checks every span before using it. The norm's pointers are all null
        // (no norm) or all set, with the lengths checked above (counters zero between launches:
        // the last block of each (span, head) sets its count back).
        // Kernel: `gdn_delta_seq_r<R>_<T>(const T* qkv, const float* g, const float* beta, float* state,
        // const u32* spans, T* out, u32 t, u32 hk, u32 hv, u32 dk, u32 dv, u32 num_slots, u32 nbuf, u32 P,
        // float q_scale, const T* nz_z, u32 nz_z_stride, u32 nz_zoff, const T* nz_w, float nz_eps, T* nz_out,
        // u32* nz_counters)`.
        unsafe {
            launch!(
                self,
                GDN_SEQ,
                format!("gdn_delta_seq_r{r}_{}", T::NAME),
                cfg,
                [
                    ptr(qkv),
                    ptr(g),
                    ptr(beta),
                    ptr_mut(state),
                    ptr(spans),
                    ptr_mut(out),
                    t32,
                    hk32,
                    hv32,
                    dk32,
                    dv32,
                    slots32,
                    nbuf32,
                    p32,
                    q_scale,
                    pz,
                    zs,
                    zoff,
                    pw,
                    eps,
                    po,
                    pc
                ]
            )
        }
    }
}

/// The gated RMSNorm with SiLU(z) that [`CudaKernels::gdn_delta_seq`] may apply to its output
/// rows (`gated_norm_z`'s values on that output, bit for bit): in the whole-head form by the
/// head's one block after a barrier, else by the last column block of each (span, value head)
/// after an atomic count.
///
/// # Shapes
/// - `z`: `[t, z_stride]` (`T`; z of head `j` at columns `zoff + j·dv ..`), `w`: `[dv]` (`T`)
/// - `out`: `[t, hv, dv]` (`T`), `counters`: at least `[n_spans, hv]` (`u32`, zero between
///   launches and left so)
pub struct DeltaNorm<'a, T> {
    /// One block per (head, span) holding all dv columns (the norm after a block barrier)
    /// where a head fits a block, instead of the column blocks and the count.
    pub whole_head: bool,
    pub z: &'a CudaSlice<T>,
    pub z_stride: usize,
    pub zoff: usize,
    pub w: &'a CudaSlice<T>,
    pub eps: f32,
    pub out: &'a mut CudaSlice<T>,
    pub counters: &'a mut CudaSlice<u32>,
}

/// The sizes of one delta-rule call ([`CudaKernels::gdn_delta_seq`],
/// [`CudaKernels::gdn_chunked_seq`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeltaDims {
    pub t: usize,
    pub n_spans: usize,
    pub max_len: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    pub num_slots: usize,
    pub nbuf: usize,
}

/// Rows a block of the conv + gates launch takes for `t` rows: 1 for decode-sized batches
/// (every block a short chain of dependent loads), up to `CONV_ROWS` for prefill (the conv
/// weights and the span scan amortised).
pub(crate) fn conv_tile_rows(t: usize) -> usize {
    (t / CONV_TILE_ROWS_FROM).next_power_of_two().min(CONV_ROWS)
}

/// The sizes of one conv + gates launch ([`CudaKernels::gdn_conv_gates_seq`] and its proj form).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvGatesDims {
    pub t: usize,
    pub n_spans: usize,
    pub c: usize,
    pub k: usize,
    pub win: usize,
    pub num_slots: usize,
    pub hv: usize,
}

/// Where the conv + gates launch gets its gate inputs, as kernel arguments (device addresses
/// whose guards the caller holds over the launch).
#[derive(Clone, Copy, Debug)]
pub(crate) enum GateArgs {
    /// `[b | a]` at column `col` of `ba`'s rows of `stride` elements.
    Cols { ba: u64, stride: u32, col: u32 },
    /// Computed by the launch from `x` `[t, hidden]` and `w` `[2·hv, hidden]` (`gb` gate blocks a
    /// row tile, `split` the decode GEMV's parts).
    Proj { x: u64, w: u64, hidden: u32, gb: u32, split: u32 },
}

/// Lanes per state column of [`CudaKernels::gdn_delta_seq`] for `n_spans` spans: enough lanes
/// to fill the GPU (`n_spans · hv · dv · P >= 32768`), at most 128 state rows each, at most 8.
pub fn delta_lanes(n_spans: usize, hv: usize, dk: usize, dv: usize) -> usize {
    let cols = n_spans.saturating_mul(hv).saturating_mul(dv);
    let mut p = 1usize;
    while p < 8 && (dk.div_ceil(p) > 128 || cols.saturating_mul(p) < DS_MIN_LANES) {
        p *= 2;
    }
    p
}

impl CudaKernels {
    /// The argument checks both delta-rule entry points share: positive sizes, `hv % hk`,
    /// the head-dim limits (`(max_dk, Some(max_dv))` also bounds `dv`), every buffer length
    /// and the grid limits. `Ok(false)` when there is nothing to launch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_delta_args<T: CudaFloat>(
        &self,
        name: &str,
        limits: (usize, Option<usize>),
        qkv: &impl DevicePtr<T>,
        g: &impl DevicePtr<f32>,
        beta: &impl DevicePtr<f32>,
        state: &impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        out: &impl DevicePtrMut<T>,
        d: DeltaDims,
    ) -> Result<bool> {
        let DeltaDims { t, n_spans, max_len, hk, hv, dk, dv, num_slots, nbuf } = d;
        if hk == 0 || hv == 0 || dk == 0 || dv == 0 || nbuf == 0 {
            return Err(CudaError::Invalid(format!("{name}: hk, hv, dk, dv and nbuf must be > 0")));
        }
        if !hv.is_multiple_of(hk) {
            return Err(CudaError::Invalid(format!("{name}: hv {hv} is not a multiple of hk {hk}")));
        }
        match limits {
            (max_dk, None) if dk > max_dk => {
                return Err(CudaError::Invalid(format!("{name}: dk {dk} > {max_dk}")));
            }
            (max_dk, Some(max_dv)) if dk > max_dk || dv > max_dv => {
                return Err(CudaError::Invalid(format!("{name}: dk {dk} or dv {dv} > {max_dk}")));
            }
            _ => {}
        }
        let width = prod(&[2, hk, dk])?
            .checked_add(prod(&[hv, dv])?)
            .ok_or_else(|| CudaError::Invalid(format!("{name}: qkv width overflows")))?;
        self.check("qkv", qkv, prod(&[t, width])?)?;
        self.check("g", g, prod(&[t, hv])?)?;
        self.check("beta", beta, prod(&[t, hv])?)?;
        self.check("state", state, prod(&[num_slots, nbuf, hv, dk, dv])?)?;
        self.check("spans", spans, prod(&[n_spans, 5])?)?;
        self.check("out", out, prod(&[t, hv, dv])?)?;
        if t == 0 || n_spans == 0 || max_len == 0 {
            return Ok(false);
        }
        if n_spans > 65_535 || hv > 65_535 {
            return Err(CudaError::Invalid(format!("{name}: n_spans {n_spans} or hv {hv} exceeds 65535")));
        }
        Ok(true)
    }
}
