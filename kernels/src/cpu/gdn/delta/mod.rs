//! The gated delta rule of a Gated DeltaNet layer: [`recurrent_gated_delta_rule`] (token by
//! token) and [`chunked_gated_delta_rule`] (the chunked WY form), with their shared validation.
//! Re-exported by [`super`] (the module documentation there gives the conventions).

use super::*;

// ---------------------------------------------------------------------------
// Gated delta rule: shared validation
// ---------------------------------------------------------------------------

/// Validated inputs of one gated-delta-rule call.
struct Seq<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
}

impl Seq<'_> {
    /// Key head read by value head `j`.
    #[inline(always)]
    fn kh(&self, j: usize) -> usize {
        j / (self.hv / self.hk)
    }
    #[inline(always)]
    fn q_row(&self, tt: usize, kh: usize) -> &[f32] {
        let o = (tt * self.hk + kh) * self.dk;
        &self.q[o..o + self.dk]
    }
    #[inline(always)]
    fn k_row(&self, tt: usize, kh: usize) -> &[f32] {
        let o = (tt * self.hk + kh) * self.dk;
        &self.k[o..o + self.dk]
    }
    #[inline(always)]
    fn v_row(&self, tt: usize, j: usize) -> &[f32] {
        let o = (tt * self.hv + j) * self.dv;
        &self.v[o..o + self.dv]
    }
    #[inline(always)]
    fn g_at(&self, tt: usize, j: usize) -> f32 {
        self.g[tt * self.hv + j]
    }
    #[inline(always)]
    fn beta_at(&self, tt: usize, j: usize) -> f32 {
        self.beta[tt * self.hv + j]
    }
}

#[allow(clippy::too_many_arguments)]
fn validate<'a>(
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    state_len: usize,
    out_len: usize,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<Seq<'a>, GdnError> {
    if hk == 0 || hv == 0 || dk == 0 || dv == 0 {
        return Err(GdnError::Dims("hk, hv, dk and dv must be > 0"));
    }
    if !is_multiple(hv, hk) {
        return Err(GdnError::Dims("hv must be a multiple of hk"));
    }
    check_len("q", q.len(), prod(&[t, hk, dk])?)?;
    check_len("k", k.len(), prod(&[t, hk, dk])?)?;
    check_len("v", v.len(), prod(&[t, hv, dv])?)?;
    check_len("g", g.len(), prod(&[t, hv])?)?;
    check_len("beta", beta.len(), prod(&[t, hv])?)?;
    check_len("state", state_len, prod(&[hv, dk, dv])?)?;
    check_len("out", out_len, prod(&[t, hv, dv])?)?;
    Ok(Seq { q, k, v, g, beta, t, hk, hv, dk, dv })
}

/// Tokens per slab in [`for_each_head`]: a multiple of [`GDN_CHUNK`], so that
/// slab boundaries are chunk boundaries.
const SLAB: usize = 4 * GDN_CHUNK;

impl<'a> Seq<'a> {
    /// Tokens `[a, b)` of the sequence.
    fn slab(&self, a: usize, b: usize) -> Seq<'a> {
        let (hk, hv, dk, dv) = (self.hk, self.hv, self.dk, self.dv);
        Seq {
            q: &self.q[a * hk * dk..b * hk * dk],
            k: &self.k[a * hk * dk..b * hk * dk],
            v: &self.v[a * hv * dv..b * hv * dv],
            g: &self.g[a * hv..b * hv],
            beta: &self.beta[a * hv..b * hv],
            t: b - a,
            hk,
            hv,
            dk,
            dv,
        }
    }
}

/// Runs `head(p, j, state_j, out_j)` for every v-head `j` in parallel, where
/// `out_j` is a head-major `[t, dv]` buffer, then scatters it into `out`
/// `[T, Hv, dv]`. Long sequences go in slabs of [`SLAB`] tokens (the state
/// carries over), so the head-major buffer stays small and is reused.
fn for_each_head<F>(p: &Seq<'_>, state: &mut [f32], out: &mut [f32], head: F)
where
    F: Fn(&Seq<'_>, usize, &mut [f32], &mut [f32]) + Sync + Send,
{
    let (t, hv, dv, dk) = (p.t, p.hv, p.dv, p.dk);
    if t == 1 {
        // [1, Hv, dv] is already head-major.
        state.par_chunks_mut(dk * dv).zip(out.par_chunks_mut(dv)).enumerate().for_each(|(j, (s, o))| head(p, j, s, o));
        return;
    }
    let mut tmp = vec![0.0f32; hv * SLAB.min(t) * dv];
    let mut a = 0;
    while a < t {
        let b = t.min(a + SLAB);
        let ps = p.slab(a, b);
        let ts = b - a;
        let tmp = &mut tmp[..hv * ts * dv];
        state
            .par_chunks_mut(dk * dv)
            .zip(tmp.par_chunks_mut(ts * dv))
            .enumerate()
            .for_each(|(j, (s, o))| head(&ps, j, s, o));
        out[a * hv * dv..b * hv * dv].par_chunks_mut(hv * dv).enumerate().with_min_len(16).for_each(|(tt, orow)| {
            for (j, oh) in orow.chunks_exact_mut(dv).enumerate() {
                let src = (j * ts + tt) * dv;
                oh.copy_from_slice(&tmp[src..src + dv]);
            }
        });
        a = b;
    }
}

// ---------------------------------------------------------------------------
// Recurrent (token by token) form
// ---------------------------------------------------------------------------

/// Gated delta rule, token by token (the decode path; HF
/// `torch_recurrent_gated_delta_rule`, FLA `fused_recurrent_gated_delta_rule`).
///
/// For every token `t` and v-head `j` (key head `kh = j / (Hv / Hk)`), with
/// `S = state[j]` (`[dk, dv]`):
/// ```text
/// S  = exp(g[t,j]) · S
/// kv = Sᵀ k[t,kh]                    (kv[v] = Σ_i S[i,v] k[i])
/// δ  = beta[t,j] · (v[t,j] − kv)
/// S  = S + k[t,kh] ⊗ δ               (S[i,v] += k[i] δ[v])
/// out[t,j] = Sᵀ q[t,kh]              (the UPDATED state)
/// ```
/// q and k must already be L2-normalised ([`l2norm_rows`]) and q scaled by
/// `dk^-0.5`; the kernel applies no scale. `state` is read as the initial
/// state and left holding the final state, so calls can be chained over a
/// sequence, and mixed with [`chunked_gated_delta_rule`]. Parallel over
/// v-heads (rayon). `T = 0` is a no-op.
///
/// Columns of `S` evolve independently, so each head is scanned in blocks of
/// 16 state columns that stay in L1 over all tokens; on x86-64 an AVX2+FMA
/// version is picked at run time. A decay factor `exp(g)` below `e^−60` is
/// flushed to exactly 0 (a full reset in `f32` terms), which avoids
/// subnormal arithmetic.
///
/// # Shapes
/// - `q`, `k`: `[T, Hk, dk]`
/// - `v`: `[T, Hv, dv]`
/// - `g`, `beta`: `[T, Hv]` (log-decay and write strength, see [`gdn_gates`])
/// - `state`: `[Hv, dk, dv]`, k-major, updated in place
/// - `out`: `[T, Hv, dv]`
///
/// # Errors
/// [`GdnError`] if a dimension is zero, `Hv % Hk != 0`, or a slice length
/// does not match; nothing is written then.
#[allow(clippy::too_many_arguments)]
pub fn recurrent_gated_delta_rule(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<(), GdnError> {
    let p = validate(q, k, v, g, beta, state.len(), out.len(), t, hk, hv, dk, dv)?;
    if t == 0 {
        return Ok(());
    }
    for_each_head(&p, state, out, recurrent_head);
    Ok(())
}

/// Recurrence of one v-head over all tokens; picks the best code path.
fn recurrent_head(p: &Seq<'_>, j: usize, s: &mut [f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above), which
            // is the only requirement of `recurrent_head_avx2`.
            unsafe { recurrent_head_avx2(p, j, s, o) };
            return;
        }
    }
    recurrent_head_impl::<{ cfg!(target_arch = "aarch64") }>(p, j, s, o);
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn recurrent_head_avx2(p: &Seq<'_>, j: usize, s: &mut [f32], o: &mut [f32]) {
    recurrent_head_impl::<true>(p, j, s, o);
}

/// `a·b + c`, fused when `FMA` (only instantiated with `FMA = true` where the
/// target has a hardware FMA; otherwise `mul_add` would call libm).
#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Scans one v-head (`s`: `[dk, dv]`, `o`: head-major `[T, dv]`) in column
/// blocks of `REC_COLS`. For short calls (decode) the blocks are scanned in
/// place; for longer ones each block is first copied to a contiguous buffer
/// (rows of the state are `dv` floats apart, which maps a block's 128 rows
/// onto few L1 sets).
#[inline(always)]
fn recurrent_head_impl<const FMA: bool>(p: &Seq<'_>, j: usize, s: &mut [f32], o: &mut [f32]) {
    const CB: usize = REC_COLS;
    let (t, dk, dv) = (p.t, p.dk, p.dv);
    let mut blk: Vec<f32> = Vec::new();
    let mut c0 = 0;
    while c0 < dv {
        let cw = CB.min(dv - c0);
        if cw == CB && t <= 4 {
            scan_block::<FMA>(p, j, s, dv, c0, c0, cw, o);
        } else {
            blk.resize(dk * CB, 0.0);
            for (row, src) in blk.chunks_exact_mut(CB).zip(s.chunks_exact(dv)) {
                row[..cw].copy_from_slice(&src[c0..c0 + cw]);
                row[cw..].fill(0.0);
            }
            scan_block::<FMA>(p, j, &mut blk, CB, 0, c0, cw, o);
            for (row, dst) in blk.chunks_exact(CB).zip(s.chunks_exact_mut(dv)) {
                dst[c0..c0 + cw].copy_from_slice(&row[..cw]);
            }
        }
        c0 += CB;
    }
}

/// Runs all tokens of `p` through one block of `REC_COLS` state columns:
/// row `i` of the block is `rows[i * stride + off..][..REC_COLS]`, and the
/// block holds state columns `c0..c0 + cw` (`cw < REC_COLS` only for a padded
/// copy, whose extra columns are zero and stay zero). Per token one fused
/// pass over the rows does the rank-1 update and output of token `t` together
/// with the decay and `Sᵀk` of token `t + 1`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn scan_block<const FMA: bool>(
    p: &Seq<'_>,
    j: usize,
    rows: &mut [f32],
    stride: usize,
    off: usize,
    c0: usize,
    cw: usize,
    o: &mut [f32],
) {
    const CB: usize = REC_COLS;
    let (t, dv) = (p.t, p.dv);
    let kh = p.kh(j);
    // Every row has `off + CB <= stride` floats, so `first_chunk_mut` never
    // fails; the `let .. else` only avoids an unwrap.
    macro_rules! block_rows {
        () => {
            rows.chunks_exact_mut(stride).filter_map(|r| r[off..].first_chunk_mut::<CB>())
        };
    }
    // Prologue: decay by exp(g_0) and kv = Sᵀ k_0.
    let mut kv = [0.0f32; CB];
    {
        let a = decay_exp(p.g_at(0, j));
        for (row, &ki) in block_rows!().zip(p.k_row(0, kh)) {
            for c in 0..CB {
                row[c] *= a;
                kv[c] = fmadd::<FMA>(ki, row[c], kv[c]);
            }
        }
    }
    for tt in 0..t {
        let b = p.beta_at(tt, j);
        let vr = &p.v_row(tt, j)[c0..c0 + cw];
        let mut delta = [0.0f32; CB];
        for c in 0..cw {
            delta[c] = b * (vr[c] - kv[c]);
        }
        let kt = p.k_row(tt, kh);
        let qt = p.q_row(tt, kh);
        let mut acc = [0.0f32; CB];
        kv = [0.0f32; CB];
        if tt + 1 < t {
            let a = decay_exp(p.g_at(tt + 1, j));
            let kn = p.k_row(tt + 1, kh);
            for (((row, &ki), &qi), &kni) in block_rows!().zip(kt).zip(qt).zip(kn) {
                for c in 0..CB {
                    let sv = fmadd::<FMA>(ki, delta[c], row[c]);
                    acc[c] = fmadd::<FMA>(qi, sv, acc[c]);
                    let sd = sv * a;
                    kv[c] = fmadd::<FMA>(kni, sd, kv[c]);
                    row[c] = sd;
                }
            }
        } else {
            for ((row, &ki), &qi) in block_rows!().zip(kt).zip(qt) {
                for c in 0..CB {
                    let sv = fmadd::<FMA>(ki, delta[c], row[c]);
                    acc[c] = fmadd::<FMA>(qi, sv, acc[c]);
                    row[c] = sv;
                }
            }
        }
        o[tt * dv + c0..tt * dv + c0 + cw].copy_from_slice(&acc[..cw]);
    }
}

// ---------------------------------------------------------------------------
// Chunked (WY / UT) form
// ---------------------------------------------------------------------------

/// Gated delta rule in the chunked WY/UT form (the prefill path; HF
/// `torch_chunk_gated_delta_rule`, FLA `chunk_gated_delta_rule`): the same
/// recurrence and the same result as [`recurrent_gated_delta_rule`], up to
/// `f32` rounding (about 1e-6 relative).
///
/// Tokens are taken in chunks of [`GDN_CHUNK`] = 64 (the last one may be
/// shorter; there is no padding). Within a chunk, with `G = cumsum(g)`,
/// `Γ[i,m] = exp(G_i − G_m)` for `i ≥ m`, and `S` the state at chunk start:
/// ```text
/// A  = −(diag(β) K Kᵀ ⊙ Γ), strictly lower;   T = (I − A)⁻¹ (forward substitution)
/// U  = T (β ⊙ V);   W = T (β ⊙ K ⊙ exp(G))
/// Vn = U − W S
/// O  = (Q ⊙ exp(G)) S + tril(Q Kᵀ ⊙ Γ) Vn
/// S  = exp(G_last) S + (K ⊙ exp(G_last − G))ᵀ Vn
/// ```
/// The code computes `Vn = T (β⊙V − (β⊙K⊙exp(G)) S)`, which is `U − W S`
/// reassociated (one matmul fewer), and keeps `G` in `f64`: an `f32` cumsum,
/// as in HF's fallback, loses ~`ulp(|G|)` in every `G_i − G_m` and gave
/// ~1e-5 relative error on fast-decaying heads. Decay factors below `e^−60`
/// are flushed to 0 (see the recurrent kernel), avoiding subnormals.
///
/// The chunk matmuls go through `gemm` (single-threaded per call); the
/// parallelism is over v-heads (rayon). Preconditions and state semantics are
/// those of [`recurrent_gated_delta_rule`]: q, k L2-normalised, q scaled by
/// `dk^-0.5`, `state` in/out. `T = 0` is a no-op.
///
/// On CPU this form does about as many flops per token as the recurrent one
/// (`3·dk·dv` + `O(64·(dk+dv))` vs `4·dk·dv`), so it is not faster there;
/// measured on a 16-core Xeon (AVX2 path): 1 thread 5.6K vs 8.0K tokens/s,
/// 16 threads 49K vs 70K tokens/s for recurrent, at Qwen3-Next shapes.
///
/// # Shapes
/// - `q`, `k`: `[T, Hk, dk]`
/// - `v`: `[T, Hv, dv]`
/// - `g`, `beta`: `[T, Hv]`
/// - `state`: `[Hv, dk, dv]`, k-major, updated in place
/// - `out`: `[T, Hv, dv]`
///
/// # Errors
/// [`GdnError`] if a dimension is zero, `Hv % Hk != 0`, or a slice length
/// does not match; nothing is written then.
#[allow(clippy::too_many_arguments)]
pub fn chunked_gated_delta_rule(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<(), GdnError> {
    let p = validate(q, k, v, g, beta, state.len(), out.len(), t, hk, hv, dk, dv)?;
    if t == 0 {
        return Ok(());
    }
    for_each_head(&p, state, out, chunked_head);
    Ok(())
}

/// `dst[m×n] (row stride dst_rs) ← alpha·dst + beta·lhs·rhs` when
/// `alpha = Some(..)`, else `dst ← beta·lhs·rhs`. `lhs` is `m×kd` with
/// strides (`lhs_rs`, `lhs_cs`), `rhs` is `kd×n` with (`rhs_rs`, `rhs_cs`).
/// Single-threaded.
///
/// Panics if a slice is too short for its extent (an internal invariant: all
/// callers are in this module with sizes computed here).
#[allow(clippy::too_many_arguments)]
fn mm(
    m: usize,
    n: usize,
    kd: usize,
    dst: &mut [f32],
    dst_rs: usize,
    lhs: &[f32],
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: &[f32],
    rhs_rs: usize,
    rhs_cs: usize,
    alpha: Option<f32>,
    beta: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    let extent = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs + 1;
    assert!(extent(m, n, dst_rs, 1) <= dst.len(), "mm: dst too short");
    if kd == 0 {
        for r in 0..m {
            let row = &mut dst[r * dst_rs..r * dst_rs + n];
            match alpha {
                Some(a) => row.iter_mut().for_each(|x| *x *= a),
                None => row.fill(0.0),
            }
        }
        return;
    }
    assert!(extent(m, kd, lhs_rs, lhs_cs) <= lhs.len(), "mm: lhs too short");
    assert!(extent(kd, n, rhs_rs, rhs_cs) <= rhs.len(), "mm: rhs too short");
    // SAFETY: every element that gemm reads or writes lies inside the slices
    // (checked above with the same strides); `dst` is a unique borrow, so it
    // cannot alias `lhs` or `rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            kd,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            alpha.is_some(),
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            alpha.unwrap_or(0.0),
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Chunked recurrence of one v-head (`s`: `[dk, dv]`, `o`: head-major `[T, dv]`).
///
/// Per chunk of `l ≤ 64` tokens (`S` = state at chunk start):
/// ```text
/// [K; Q] Kᵀ                     one gemm (2l × l × dk) → A (strictly lower) and P
/// T  = (I − A)⁻¹                forward substitution
/// Vn = T (β⊙V − (β⊙K⊙exp(G)) S)  = U − W S, reassociated: two gemms, no W
/// O  = (Q⊙exp(G)) S + P Vn      two gemms
/// S  = exp(G_last) S + (K⊙exp(G_last − G))ᵀ Vn
/// ```
fn chunked_head(p: &Seq<'_>, j: usize, s: &mut [f32], o: &mut [f32]) {
    const C: usize = GDN_CHUNK;
    let (t, dk, dv) = (p.t, p.dk, p.dv);
    let kh = p.kh(j);

    // Rows 0..l: K (later K ⊙ exp(G_last − G)); rows l..2l: Q (later Q ⊙ exp(G)).
    let mut kq = vec![0.0f32; 2 * C * dk];
    let mut bk = vec![0.0f32; C * dk]; // β ⊙ K ⊙ exp(G)
    let mut r = vec![0.0f32; C * dv]; // β ⊙ V, then R = β⊙V − bk S
    let mut vn = vec![0.0f32; C * dv]; // Vn = T R
    let mut x = vec![0.0f32; 2 * C * C]; // [K; Q] Kᵀ (row stride C); rows 0..l → A → T, rows l..2l → P
                                         // G = cumsum(g), in f64: Γ = exp(G_i − G_m) needs the difference of two
                                         // large sums to f32 accuracy (an f32 cumsum loses ~ulp(|G|) absolute).
    let mut gc = [0.0f64; C];
    let mut eg = [0.0f32; C]; // exp(G)
    let mut bt = [0.0f32; C]; // β
    let mut row = [0.0f32; C];

    let mut t0 = 0;
    while t0 < t {
        let l = C.min(t - t0);

        // Gather the chunk.
        let mut acc = 0.0f64;
        for i in 0..l {
            let tt = t0 + i;
            acc += p.g_at(tt, j) as f64;
            gc[i] = acc;
            eg[i] = decay_exp(acc as f32);
            bt[i] = p.beta_at(tt, j);
            let kr = p.k_row(tt, kh);
            kq[i * dk..(i + 1) * dk].copy_from_slice(kr);
            kq[(l + i) * dk..(l + i + 1) * dk].copy_from_slice(p.q_row(tt, kh));
            let f = bt[i] * eg[i];
            for (d, &kv) in bk[i * dk..(i + 1) * dk].iter_mut().zip(kr) {
                *d = f * kv;
            }
            let b = bt[i];
            for (d, &vv) in r[i * dv..(i + 1) * dv].iter_mut().zip(p.v_row(tt, j)) {
                *d = b * vv;
            }
        }
        let g_last = gc[l - 1];

        // [K; Q] Kᵀ: (2l × l), row stride C.
        mm(2 * l, l, dk, &mut x, C, &kq, dk, 1, &kq, 1, dk, None, 1.0);
        let (tm, pm) = x.split_at_mut(l * C);

        // A = −β K Kᵀ ⊙ Γ (strictly lower) and P = tril(Q Kᵀ ⊙ Γ).
        for i in 0..l {
            let gi = gc[i];
            let bi = bt[i];
            let ti = &mut tm[i * C..i * C + l];
            let pi = &mut pm[i * C..i * C + l];
            for m in 0..i {
                let gam = decay_exp((gi - gc[m]) as f32);
                ti[m] *= -bi * gam;
                pi[m] *= gam;
            }
            ti[i..].fill(0.0);
            pi[i + 1..].fill(0.0);
        }
        // Forward substitution: T[i, :i] = A[i, :i] + Σ_{m<i} A[i, m] T[m, :m].
        for i in 1..l {
            let (above, cur) = tm.split_at_mut(i * C);
            let cur = &mut cur[..i];
            row[..i].copy_from_slice(cur);
            for m in 1..i {
                let a = row[m];
                if a != 0.0 {
                    let tmr = &above[m * C..m * C + m];
                    for (c, &tv) in cur[..m].iter_mut().zip(tmr) {
                        *c += a * tv;
                    }
                }
            }
        }
        for i in 0..l {
            tm[i * C + i] = 1.0;
        }

        // R = β⊙V − (β⊙K⊙exp(G)) S;  Vn = T R.
        mm(l, dv, dk, &mut r, dv, &bk, dk, 1, s, dv, 1, Some(1.0), -1.0);
        mm(l, dv, l, &mut vn, dv, tm, C, 1, &r, dv, 1, None, 1.0);

        // O = (Q ⊙ exp(G)) S + P Vn.
        let (kd, qg) = kq.split_at_mut(l * dk);
        for i in 0..l {
            let e = eg[i];
            qg[i * dk..(i + 1) * dk].iter_mut().for_each(|v| *v *= e);
        }
        let oc = &mut o[t0 * dv..(t0 + l) * dv];
        mm(l, dv, dk, oc, dv, qg, dk, 1, s, dv, 1, None, 1.0);
        mm(l, dv, l, oc, dv, pm, C, 1, &vn, dv, 1, Some(1.0), 1.0);

        // S = exp(G_last) S + (K ⊙ exp(G_last − G))ᵀ Vn.
        for i in 0..l {
            let e = decay_exp((g_last - gc[i]) as f32);
            kd[i * dk..(i + 1) * dk].iter_mut().for_each(|v| *v *= e);
        }
        mm(dk, dv, l, s, dv, kd, 1, dk, &vn, dv, 1, Some(decay_exp(g_last as f32)), 1.0);

        t0 += l;
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests;
