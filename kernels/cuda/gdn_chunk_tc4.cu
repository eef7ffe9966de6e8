// Gated DeltaNet, chunked form on tensor cores, the `wu` launch of `PORTER_GDN_CHUNK=tc4`:
// gdn_chunk_tc3_wu (gdn_chunk_tc2.cu) on raw mma.sync m16n8k16 + ldmatrix with the fragments
// in registers. Appended to gdn_chunk.cu + gdn_chunk_tc.cu + gdn_chunk_tc2.cu (same module;
// uses PMma<T> (common.cuh), gt2_ldsm / gt2_ldsm_t, Gt3Rows, gc_tril_inverse) and writes exactly the scratch
// of gdn_chunk_tc3_wu (wn, kb, uf, gl, qg, pb), which gdn_chunk_tc3_state reads unchanged.
//
// Why: gdn_chunk_tc3_wu (264.7 µs at 4096 tokens of the 80B layout, 24 TFLOP/s) runs ~14
// barriers per block in a long serial chain: the cumulative decays on one thread, K then Q
// (two global round trips), wmma products whose accumulators go through shared memory
// (store_matrix_sync into scratch tiles, then scalar 2-byte global stores), element passes
// over shared memory for P, A, Tw and Tu with a barrier each. Here (7 barriers):
//   1. g / β (warp 0), K and Q rows (every thread, 4 elements of T in one 8-byte load, all in
//      flight at once: one round trip); the cumulative log-decay G as a warp scan in f64 (warp 0;
//      kept in f32 for the masks);
//   2. K, Q normalised -> T in shared memory (the row norms by a reduce-scatter, Gt3Rows), K̃ -> kb,
//      Qg -> qg; V rows go out;
//   3. Q Kᵀ and K Kᵀ (lower 16-row tiles) on mma.sync: a warp takes row tiles {t, 3 − t} of one
//      gram and every other n8 tile, 5 of the 20 either way; the masks and decays (f32 G, fast
//      exp) applied in registers: P straight to pb (4-byte pair stores, zero tiles above the
//      diagonal), A = −β_i (K Kᵀ)_im Γ_im (f32) to shared memory for the inverse; V -> T in
//      shared memory;
//   4. T = (I − A)⁻¹ blockwise (gc_tril_inverse, f32 on CUDA cores, 4 barriers);
//   5. −W = −T diag(β e^G) K and U = T diag(β) V on mma.sync: the A fragments straight from
//      T (f32, scaled, rounded: no Tw / Tu pass), B by ldmatrix.trans of K and V; warp w
//      takes row tiles {w % 2, 3 − w % 2} (5 k16 steps for every warp) and a quarter of the
//      columns; −W (T pairs) and U (f32 pairs) from the accumulators to global memory.
// Shared memory: Kb, Qb (T [64][DK + 8]), Vb (T [64][dv + 8]), As (f32 [64][68]): 68 KiB at
// DK = dv = 128 (2 blocks an SM at __launch_bounds__(256, 2): K and Q in flight take 32
// registers a thread, 64 when the conv output was f32; at (256, 3), 80 registers, no spills
// since it is in the activation type, 108 bytes of spills before).
//
// Shapes: DK ∈ {64, 128}; dv % 32 == 0, dv <= 256; T = bf16 / f16.

#if defined(PORTER_SM80)
// Two 8 × 8 b16 matrices, transposed: lanes 0-15 address rows (l % 8) of matrix l / 8.
__device__ __forceinline__ void gt4_ldsm_t2(u32 (&r)[2], const void* p) {
    const u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
#endif

// e^x, flushed to 0 below x = −60 as gc_decay, on the fast exp (ex2.approx of x · log2 e: a
// relative error of about |x| · 2⁻²² against expf's 2⁻²³, far below the bf16 / f16 rounding
// of everything it scales). For the masks' decays, one per element.
__device__ __forceinline__ float gc_decay_fast(float x) { return x < -60.0f ? 0.0f : __expf(x); }

// The tc7 scratch (FORM 2 below; the host mirrors both): the row stride of U's [64][..] blocks
// in T (32 columns and a pad of 8: 80-byte rows, conflict-free for the sweep's ldmatrix), and
// the bytes a (chunk, value head) of `uf` takes: the decays (f32 [2][64]) then dv / 32 U blocks.
#define GT7_LDU 40u
#define GT7_UFB(DV) (8u * GC_C + ((DV) / 32u) * GC_C * GT7_LDU * 2u)

// Dynamic shared memory of gdn_chunk_tc4_wu, bytes (the host mirrors it).
#define GT4_WU_SMEM(DK, DV) (4u * GC_C * ((DK) + 8u) + 2u * GC_C * ((DV) + 8u) + 4u * GC_C * GT_LDF)

// FORM 1 (the `_pad` entries, for gdn_chunk_tc6.cu's sweep): the scratch in the state sweep's
// stage layout, so that each tile of a chunk is one contiguous copy: wn, kb, qg [64][DK + 8],
// pb [64][GT2_LDP], uf [dv / 32][64][36] per (chunk, value head); pads written as zeros.
// FORM 2 (the `_lean` entries, for the tc7 sweep of gdn_chunk_tc6.cu, Gt7Stage): wn and pb as
// FORM 1; kb and qg hold K̂ and Q̂ (normalised, Q̂ times q_scale, **no decays**) per (chunk, key
// head) at ((o + c)·hk + kh), written by the first value head of each key head's group; uf
// per (chunk, value head) holds GT7_UFB(dv) bytes: e^G and e^(G_last − G) (f32 [2][64]), then
// U rounded to T in blocks [dv / 32][64][GT7_LDU] (pads zeroed). 65,024 bytes a (chunk, value
// head) at the 80B layout against FORM 1's 98,304 (K̂ / Q̂ shared by two value heads, U in T).
template <typename T, int DK, int FORM = 0>
__device__ __forceinline__ void gdn_chunk_tc4_wu_impl(const T* __restrict__ qkv, const float* __restrict__ g,
                                                      const float* __restrict__ beta, const u32* __restrict__ spans,
                                                      const u32* __restrict__ off, T* __restrict__ wn,
                                                      T* __restrict__ kb, float* __restrict__ uf,
                                                      float* __restrict__ gl, T* __restrict__ qg,
                                                      T* __restrict__ pb, u32 hk, u32 hv, u32 dv, float q_scale) {
#if defined(PORTER_SM80)
    constexpr bool PAD = FORM >= 1, LEAN = FORM == 2;
    constexpr u32 LDK = DK + 8;
    constexpr u32 GK = PAD ? LDK : DK, GP = PAD ? GT2_LDP : GC_C;  // global row strides
    extern __shared__ __align__(128) unsigned char gt_smem[];
    // G in f32 for the masks: G_i − G_m from f32 values errs by ≤ |G| · 2⁻²³ in the exponent
    // (|G| ≤ 64 · max |g|), far below the rounding of P and A to T / of T's fragments.
    __shared__ __align__(8) float Gf[GC_C];
    __shared__ float bt[GC_C], eg[GC_C], ek[GC_C];
    const u32 ldv = dv + 8;
    T* Kb = reinterpret_cast<T*>(gt_smem);                  // [64][LDK]
    T* Qb = Kb + GC_C * LDK;                                // [64][LDK]
    T* Vb = Qb + GC_C * LDK;                                // [64][ldv]
    float* As = reinterpret_cast<float*>(Vb + GC_C * ldv);  // [64][GT_LDF]: A, then T
    const u32 tid = threadIdx.x, lane = tid & 31u, w = tid >> 5;
    const u32 g8 = lane >> 2, tq = lane & 3u;  // fragment row / column pair
    const u32 lr = lane & 7u, lm = lane >> 3;  // ldmatrix: row lr of matrix lm
    const u32 s = blockIdx.z, c = blockIdx.x, j = blockIdx.y, kh = j / (hv / hk);
    const u32 o = off[s];
    if (o == GC_INVALID) return;
    u32 r0, l;
    if (!gc_chunk_rows(spans, s, c, r0, l)) return;
    const u64 rw = 2ull * hk * DK + (u64)hv * dv;
    const T* qbase = qkv + (u64)kh * DK;
    const T* kbase = qkv + (u64)hk * DK + (u64)kh * DK;
    const T* vbase = qkv + 2ull * hk * DK + (u64)j * dv;
    const u64 ch = ((u64)o + c) * hv + j;

    // 1-2. Gates (warp 0) while K and Q are in flight; K, Q to shared memory, K̃, Qg out.
    {
        float ga = 0.0f, gb = 0.0f, ba = 0.0f, bb = 0.0f;
        if (w == 0) {
            if (lane < l) {
                ga = g[(u64)(r0 + lane) * hv + j];
                ba = beta[(u64)(r0 + lane) * hv + j];
            }
            if (lane + 32 < l) {
                gb = g[(u64)(r0 + lane + 32) * hv + j];
                bb = beta[(u64)(r0 + lane + 32) * hv + j];
            }
        }
        Gt3Rows<DK, T> rk, rq;
        rk.load(kbase, rw, r0, l, tid);
        rq.load(qbase, rw, r0, l, tid);
        if (w == 0) {
            // Inclusive scan of g over the chunk's rows in f64 (rows >= l add 0: G keeps the
            // last value there, as gc_chunk_gates' running sum).
            double a = ga, b = gb;
#pragma unroll
            for (u32 d = 1; d < 32; d <<= 1) {
                const double x = __shfl_up_sync(0xffffffffu, a, d);
                const double y = __shfl_up_sync(0xffffffffu, b, d);
                if (lane >= d) {
                    a += x;
                    b += y;
                }
            }
            b += __shfl_sync(0xffffffffu, a, 31);
            const double glast = __shfl_sync(0xffffffffu, l <= 32 ? a : b, (l - 1) & 31u);
            Gf[lane] = (float)a;
            Gf[lane + 32] = (float)b;
            bt[lane] = ba;
            bt[lane + 32] = bb;
            eg[lane] = lane < l ? gc_decay((float)a) : 0.0f;
            eg[lane + 32] = lane + 32 < l ? gc_decay((float)b) : 0.0f;
            ek[lane] = lane < l ? gc_decay((float)(glast - a)) : 0.0f;
            ek[lane + 32] = lane + 32 < l ? gc_decay((float)(glast - b)) : 0.0f;
            if (lane == 0) gl[ch] = gc_decay((float)glast);
        }
        __syncthreads();
        if constexpr (LEAN) {
            // K̂, Q̂ of the key head, once (by its group's first value head); the decays go out
            // per value head for the sweep to apply.
            const u64 chk = ((u64)o + c) * hk + kh;
            const bool first = j % (hv / hk) == 0;
            rk.template store<T>(true, 1.0f, Kb, LDK, first ? kb + chk * GC_C * GK : nullptr, nullptr, tid, GK);
            rq.template store<T>(true, q_scale, Qb, LDK, first ? qg + chk * GC_C * GK : nullptr, nullptr, tid, GK);
            float* ge = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(uf) + ch * GT7_UFB(dv));
            if (tid < 2 * GC_C) ge[tid] = tid < GC_C ? eg[tid] : ek[tid - GC_C];
        } else {
            rk.template store<T>(true, 1.0f, Kb, LDK, kb + ch * GC_C * GK, ek, tid, GK);
            rq.template store<T>(true, q_scale, Qb, LDK, qg + ch * GC_C * GK, eg, tid, GK);
        }
    }
    Gt3Rows<DK, T> rv;
    const bool vrows = dv == DK;
    if (vrows) rv.load(vbase, rw, r0, l, tid);  // in flight across the grams
    __syncthreads();                            // Kb, Qb

    // 3. Warp w: P = Q Kᵀ (w even) or K Kᵀ (w odd) on row tiles {tp, 3 − tp} (tp = w / 2 % 2),
    // n8 tiles of parity par = w / 4: 5 of a gram's 20 n8 tiles on or below the diagonal for
    // every warp (one row tile a warp had 2 to 8, and most warps waited at the barrier).
    {
        const bool isk = w & 1u;
        const u32 tp = (w >> 1) & 1u, par = w >> 2;
        const T* X = isk ? Kb : Qb;
        T* pd = pb + ch * GC_C * GP;
#pragma unroll
        for (u32 r = 0; r < 2; ++r) {
            const u32 ti = r ? 3 - tp : tp;
            float acc[4][4];  // n8 tile n = par + 2 x
#pragma unroll
            for (u32 x = 0; x < 4; ++x) acc[x][0] = acc[x][1] = acc[x][2] = acc[x][3] = 0.0f;
#pragma unroll
            for (u32 kp = 0; kp < DK / 32; ++kp) {
                u32 a0[4], a1[4];
                const T* xa = X + (16 * ti + lr + 8 * (lm & 1u)) * LDK + 32 * kp + 8 * (lm >> 1);
                gt2_ldsm(a0, xa);
                gt2_ldsm(a1, xa + 16);
#pragma unroll
                for (u32 x = 0; x < 4; ++x) {
                    const u32 n = par + 2 * x;
                    if (n > 2 * ti + 1) continue;
                    u32 b[4];
                    gt2_ldsm(b, Kb + (8 * n + lr) * LDK + 32 * kp + 8 * lm);
                    PMma<T>::mma(acc[x], a0, b[0], b[1]);
                    PMma<T>::mma(acc[x], a1, b[2], b[3]);
                }
            }
            // acc[x]: (i = 16 ti + g8 (+8 for [2], [3]), m = 8 n + 2 tq (+1)); the decays
            // e^(G_i − G_m) from Gf on the fast exp.
            const u32 i0 = 16 * ti + g8;
            const float G0 = Gf[i0], G1 = Gf[i0 + 8];
            const float nb0 = -bt[i0], nb1 = -bt[i0 + 8];
#pragma unroll
            for (u32 x = 0; x < 4; ++x) {
                const u32 n = par + 2 * x, m = 8 * n + 2 * tq;
                const bool live = n <= 2 * ti + 1;
                const float2 gm = *reinterpret_cast<const float2*>(Gf + m);
                float v[4];
#pragma unroll
                for (u32 e = 0; e < 4; ++e) {
                    const u32 i = i0 + 8 * (e >> 1), mm = m + (e & 1u);
                    const float dec = gc_decay_fast((e >> 1 ? G1 : G0) - (e & 1u ? gm.y : gm.x));
                    const float xv = live ? acc[x][e] : 0.0f;
                    if (isk) {
                        v[e] = (mm < i && i < l) ? xv * ((e >> 1 ? nb1 : nb0) * dec) : 0.0f;
                    } else {
                        v[e] = (mm <= i && i < l) ? (mm < i ? xv * dec : xv) : 0.0f;
                    }
                }
                if (isk) {
                    if (live) {
                        *reinterpret_cast<float2*>(As + i0 * GT_LDF + m) = make_float2(v[0], v[1]);
                        *reinterpret_cast<float2*>(As + (i0 + 8) * GT_LDF + m) = make_float2(v[2], v[3]);
                    }
                } else {
                    *reinterpret_cast<u32*>(pd + i0 * GP + m) = PMma<T>::pack(v[0], v[1]);
                    *reinterpret_cast<u32*>(pd + (i0 + 8) * GP + m) = PMma<T>::pack(v[2], v[3]);
                }
            }
            if (PAD && !isk && par == 0 && tq == 0) {  // the pads of rows i0, i0 + 8
                *reinterpret_cast<uint4*>(pd + i0 * GP + GC_C) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4*>(pd + (i0 + 8) * GP + GC_C) = make_uint4(0, 0, 0, 0);
            }
        }
    }
    if (vrows) {
        rv.template store<T>(false, 1.0f, Vb, ldv, static_cast<T*>(nullptr), nullptr, tid);
    } else {
        gc_stage_rows<T, T>(vbase, rw, r0, l, dv, dv, nullptr, Vb, ldv, nullptr, nullptr, 0, tid);
    }
    __syncthreads();  // A, Vb

    // 4. T = (I − A)⁻¹ in place (ends with a barrier).
    gc_tril_inverse<GT_LDF>(As, w, lane);

    // 5. −W = −T diag(β e^G) K, U = T diag(β) V: warp w, row tiles {p, 3 − p} (p = w % 2),
    // column quarter q = w / 2 (W: DK / 32 n8 tiles, U: dv / 32).
    {
        constexpr u32 NW8 = DK / 32;
        const u32 p = w & 1u, q = w >> 1, nu = dv / 32;
        const u32 cw = q * (DK / 4), cu = q * (dv / 4);
#pragma unroll
        for (u32 r = 0; r < 2; ++r) {
            const u32 ti = r ? 3 - p : p;
            float aw[NW8][4], au[8][4];
#pragma unroll
            for (u32 n = 0; n < NW8; ++n) aw[n][0] = aw[n][1] = aw[n][2] = aw[n][3] = 0.0f;
#pragma unroll
            for (u32 n = 0; n < 8; ++n) au[n][0] = au[n][1] = au[n][2] = au[n][3] = 0.0f;
            for (u32 kk = 0; kk <= ti; ++kk) {  // T is lower triangular
                // A fragments: T (i = 16 ti + g8 (+8), m = 16 kk + 2 tq (+1) (+8)), at
                // As[(16 kk + i % 16) · LD + 16 ti + m % 16] (gc_tril_at, block kk <= ti).
                u32 fw[4], fu[4];
#pragma unroll
                for (u32 x = 0; x < 4; ++x) {
                    const u32 ir = g8 + 8 * (x & 1u), mr = 2 * tq + 8 * (x >> 1), m = 16 * kk + mr;
                    const float2 t2 = *reinterpret_cast<const float2*>(As + (16 * kk + ir) * GT_LDF + 16 * ti + mr);
                    const float b0 = bt[m], b1 = bt[m + 1];
                    fw[x] = PMma<T>::pack(t2.x * (b0 * eg[m]), t2.y * (b1 * eg[m + 1]));
                    fu[x] = PMma<T>::pack(t2.x * b0, t2.y * b1);
                }
                const u32 tr = 16 * kk + 8 * (lm & 1u) + lr;  // ldmatrix.trans source row (token)
#pragma unroll
                for (u32 np = 0; np < NW8 / 2; ++np) {
                    u32 b[4];
                    gt2_ldsm_t(b, Kb + tr * LDK + cw + 16 * np + 8 * (lm >> 1));
                    PMma<T>::mma(aw[2 * np], fw, b[0], b[1]);
                    PMma<T>::mma(aw[2 * np + 1], fw, b[2], b[3]);
                }
#pragma unroll
                for (u32 n = 0; n < 8; ++n) {
                    if (n >= nu) break;
                    u32 b[2];
                    gt4_ldsm_t2(b, Vb + tr * ldv + cu + 8 * n);
                    PMma<T>::mma(au[n], fu, b[0], b[1]);
                }
            }
            const u32 i0 = 16 * ti + g8;
            T* wd = wn + ch * GC_C * GK + (u64)i0 * GK + cw + 2 * tq;
#pragma unroll
            for (u32 n = 0; n < NW8; ++n) {
                *reinterpret_cast<u32*>(wd + 8 * n) = PMma<T>::pack(-aw[n][0], -aw[n][1]);
                *reinterpret_cast<u32*>(wd + 8 * GK + 8 * n) = PMma<T>::pack(-aw[n][2], -aw[n][3]);
            }
            if (PAD && q == 3 && tq == 0) {  // the pads of rows i0, i0 + 8
                *reinterpret_cast<uint4*>(wn + ch * GC_C * GK + (u64)i0 * GK + DK) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4*>(wn + ch * GC_C * GK + (u64)(i0 + 8) * GK + DK) = make_uint4(0, 0, 0, 0);
            }
            if constexpr (LEAN) {
                // U in T, blocks [dv / 32][64][GT7_LDU] after the decays; the pad (offsets
                // 32..39) by the lane that holds offsets 30, 31.
                T* ub = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(uf) + ch * GT7_UFB(dv) + 8 * GC_C);
#pragma unroll
                for (u32 n = 0; n < 8; ++n) {
                    if (n >= nu) break;
                    const u32 col = cu + 8 * n + 2 * tq;
                    T* u0 = ub + ((u64)(col / 32) * GC_C + i0) * GT7_LDU + col % 32;
                    *reinterpret_cast<u32*>(u0) = PMma<T>::pack(au[n][0], au[n][1]);
                    *reinterpret_cast<u32*>(u0 + 8 * GT7_LDU) = PMma<T>::pack(au[n][2], au[n][3]);
                    if (col % 32 == 30) {
                        *reinterpret_cast<uint4*>(u0 + 2) = make_uint4(0, 0, 0, 0);
                        *reinterpret_cast<uint4*>(u0 + 8 * GT7_LDU + 2) = make_uint4(0, 0, 0, 0);
                    }
                }
            } else if constexpr (PAD) {
                // uf [dv / 32][64][36]: column c at block c / 32, offset c % 32; the pad (offsets
                // 32..35) by the lane that holds offsets 30, 31.
                float* ub = uf + ch * GC_C * (dv / 32) * 36;
#pragma unroll
                for (u32 n = 0; n < 8; ++n) {
                    if (n >= nu) break;
                    const u32 col = cu + 8 * n + 2 * tq;
                    float* u0 = ub + ((u64)(col / 32) * GC_C + i0) * 36 + col % 32;
                    *reinterpret_cast<float2*>(u0) = make_float2(au[n][0], au[n][1]);
                    *reinterpret_cast<float2*>(u0 + 8 * 36) = make_float2(au[n][2], au[n][3]);
                    if (col % 32 == 30) {
                        *reinterpret_cast<float4*>(u0 + 2) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        *reinterpret_cast<float4*>(u0 + 8 * 36 + 2) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    }
                }
            } else {
                float* ud = uf + ch * GC_C * dv + (u64)i0 * dv + cu + 2 * tq;
#pragma unroll
                for (u32 n = 0; n < 8; ++n) {
                    if (n >= nu) break;
                    *reinterpret_cast<float2*>(ud + 8 * n) = make_float2(au[n][0], au[n][1]);
                    *reinterpret_cast<float2*>(ud + 8 * (u64)dv + 8 * n) = make_float2(au[n][2], au[n][3]);
                }
            }
        }
    }
#endif
}

// One entry: SUFFIX names it, OCC is its blocks an SM, PAD its scratch layout.
//   ``: the tc4 wu launch at 2 blocks an SM (PORTER_GDN_WU_OCC=2, an A/B form; the only build
//   at DK = 64);
//   `_o3` (the default at DK = 128): 3 blocks an SM (68 KiB each fits 3 times in
//   228 KiB) at 80 registers a thread. With f32 q / k / v rows it spilled 108 bytes and was
//   slower (session 20: 198 against 175 µs at 4k); with rows in the activation type (half
//   the registers in flight) it does not spill;
//   `_pad`: the scratch in the stage layout of gdn_chunk_tc6.cu's sweep (FORM 1 above);
//   `_pad_o3`: both; `_lean`, `_lean_o3`: the tc7 sweep's scratch (FORM 2).
#define GDN_CHUNK_TC4_WU(T, NAME, DK, SUFFIX, OCC, FORM)                                                      \
    extern "C" __global__ void __launch_bounds__(256, OCC)                                                  \
        gdn_chunk_tc4_wu_d##DK##_##NAME##SUFFIX(const T* qkv, const float* g, const float* beta,          \
                                                const u32* spans, const u32* off, T* wn, T* kb, float* uf,    \
                                                float* gl, T* qg, T* pb, u32 hk, u32 hv, u32 dv,              \
                                                float q_scale) {                                            \
        porter_pdl_enter();                                                                                 \
        gdn_chunk_tc4_wu_impl<T, DK, FORM>(qkv, g, beta, spans, off, wn, kb, uf, gl, qg, pb, hk, hv, dv, q_scale); \
    }
GDN_CHUNK_TC4_WU(bf16, bf16, 64, , 2, 0)
GDN_CHUNK_TC4_WU(bf16, bf16, 128, , 2, 0)
GDN_CHUNK_TC4_WU(f16, f16, 64, , 2, 0)
GDN_CHUNK_TC4_WU(f16, f16, 128, , 2, 0)
GDN_CHUNK_TC4_WU(bf16, bf16, 128, _o3, 3, 0)
GDN_CHUNK_TC4_WU(f16, f16, 128, _o3, 3, 0)
GDN_CHUNK_TC4_WU(bf16, bf16, 64, _pad, 2, 1)
GDN_CHUNK_TC4_WU(bf16, bf16, 128, _pad, 2, 1)
GDN_CHUNK_TC4_WU(f16, f16, 64, _pad, 2, 1)
GDN_CHUNK_TC4_WU(f16, f16, 128, _pad, 2, 1)
GDN_CHUNK_TC4_WU(bf16, bf16, 128, _pad_o3, 3, 1)
GDN_CHUNK_TC4_WU(f16, f16, 128, _pad_o3, 3, 1)
GDN_CHUNK_TC4_WU(bf16, bf16, 64, _lean, 2, 2)
GDN_CHUNK_TC4_WU(bf16, bf16, 128, _lean, 2, 2)
GDN_CHUNK_TC4_WU(f16, f16, 64, _lean, 2, 2)
GDN_CHUNK_TC4_WU(f16, f16, 128, _lean, 2, 2)
GDN_CHUNK_TC4_WU(bf16, bf16, 128, _lean_o3, 3, 2)
GDN_CHUNK_TC4_WU(f16, f16, 128, _lean_o3, 3, 2)
