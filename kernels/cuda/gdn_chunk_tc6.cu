// Gated DeltaNet, chunked form on tensor cores: the `wu` launch of `PORTER_GDN_CHUNK=tc6`,
// gdn_chunk_tc4_wu (gdn_chunk_tc4.cu) with one block for the two value heads that share a key
// head. Appended to gdn_chunk.cu + gdn_chunk_tc.cu + gdn_chunk_tc2.cu + gdn_chunk_tc4.cu +
// gdn_chunk_tc5.cu (same module; uses PMma<T>, gt2_ldsm / gt2_ldsm_t, gt4_ldsm_t2, Gt3Rows,
// gc_inv_diag / gc_inv_block, gc_stage_rows) and writes exactly the scratch of
// gdn_chunk_tc4_wu (wn, kb, uf, gl, qg, pb) for both heads, **bit for bit** (every element is
// computed by the same expression, in the same order, as tc4's block for that head), which
// gdn_chunk_tc5_state reads unchanged.
//
// Why: tc4's wu launch is latency-bound (Nsight, session 20: 25 % theoretical occupancy,
// 0.54 eligible warps a scheduler, 7 barriers a block). Where hv / hk is even (the 80B: 32
// value heads on 16 key heads), value heads 2p and 2p + 1 read the same K and Q rows, so tc4
// loads, normalises and multiplies them twice. Here a block takes the pair:
//   1. the gates of both heads (warp h: head 2p + h; f64 scan as tc4's warp 0) while K and Q
//      are in flight (one round trip, once);
//   2. K, Q normalised once -> Kb, Qb; K̃ = K ⊙ e^(G_last − G) and Qg = Q ⊙ e^G written for
//      each head (the per-row factors differ by head, the normalised values do not);
//   3. Q Kᵀ and K Kᵀ once (tc4's warp / tile split); the accumulators stay in registers
//      across two epilogues, one per head's decays, writing P (pb) and A (As[h]). V of head
//      2p is in flight across the products (as tc4's) and stored before the epilogues;
//   4. both inverses T = (I − A)⁻¹ in the same 4 barriers as tc4's one (gt6_tril_inverse2:
//      the same per-element sums, more warps busy at each level), with V of head 2p + 1 in
//      flight across them (one register set of V at a time, as tc4; in flight across the
//      epilogues instead, sm_80 spilled 8 bytes at 128 registers);
//   5. −W and U for each head in turn (tc4's warp / tile split).
// Still 7 barriers a block, for twice the work.
//
// Shared memory (dynamic, GT6_WU_SMEM; the host mirrors it): Kb, Qb (T [64][DK + 8]), Vb
// (T [2][64][dv + 8]), As (f32 [2][64][68]): 102 KiB (104,448 bytes) at DK = dv = 128, so 2
// blocks an SM (as tc4) at __launch_bounds__(256, 2); static 2.5 KiB (G, β, e^G, e^(G_last − G)
// for each head).
//
// Grid (max_chunks, hv / 2, n_spans), 256 threads. Shapes: DK ∈ {64, 128}; dv % 32 == 0,
// dv <= 256; (hv / hk) even (the host checks; elsewhere the tc5 form runs); T = bf16 / f16.

// Dynamic shared memory of gdn_chunk_tc6_wu, bytes (the host mirrors it).
#define GT6_WU_SMEM(DK, DV) (4u * GC_C * ((DK) + 8u) + 4u * GC_C * ((DV) + 8u) + 8u * GC_C * GT_LDF)

#if defined(PORTER_SM80)
// Gt3Rows<DK>::store with `norm` and two per-head outputs: x · (1/sqrt(Σ_row x² + 1e-6) ·
// scale) rounded to T at dst[i · ldk + d] (shared, once) and x · s0[i], x · s1[i] rounded to
// T at d0 / d1 [i · DK + d] (global). The same expressions as Gt3Rows::store, so the same bits.
template <typename T, int DK>
__device__ __forceinline__ void gt6_store2(const Gt3Rows<DK>& r, float scale, T* dst, u32 ldk, T* __restrict__ d0,
                                           const float* s0, T* __restrict__ d1, const float* s1, u32 tid) {
    constexpr u32 LPR = Gt3Rows<DK>::LPR, RPP = Gt3Rows<DK>::RPP, PASSES = Gt3Rows<DK>::PASSES;
    const u32 i0 = tid / LPR, d = 4 * (tid % LPR);
#pragma unroll
    for (u32 u = 0; u < PASSES; ++u) {
        const u32 i = u * RPP + i0;
        float4 x = r.v[u];
        {
            float ss = x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
#pragma unroll
            for (u32 m = LPR / 2; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
            const float rn = (1.0f / sqrtf(ss + 1e-6f)) * scale;
            x = make_float4(x.x * rn, x.y * rn, x.z * rn, x.w * rn);
        }
        uint2 p;
        p.x = PMma<T>::pack(x.x, x.y);
        p.y = PMma<T>::pack(x.z, x.w);
        *reinterpret_cast<uint2*>(dst + i * ldk + d) = p;
        const float f0 = s0[i];
        p.x = PMma<T>::pack(x.x * f0, x.y * f0);
        p.y = PMma<T>::pack(x.z * f0, x.w * f0);
        *reinterpret_cast<uint2*>(d0 + (u64)i * DK + d) = p;
        const float f1 = s1[i];
        p.x = PMma<T>::pack(x.x * f1, x.y * f1);
        p.y = PMma<T>::pack(x.z * f1, x.w * f1);
        *reinterpret_cast<uint2*>(d1 + (u64)i * DK + d) = p;
    }
}

// The epilogue of tc4's phase 3 for one head: acc (row tile ti of Q Kᵀ, or of K Kᵀ with
// `isk`) masked and decayed with that head's G and β; P to pd (T pairs, zero tiles above the
// diagonal), A = −β_i (K Kᵀ)_im Γ_im to As (f32). tc4's expressions, element for element.
template <typename T>
__device__ __forceinline__ void gt6_gram_epilogue(const float (&acc)[8][4], bool isk, u32 ti, u32 g8, u32 tq, u32 l,
                                                  const double* Gd, const float* bt, float* As, T* pd) {
    // acc[n]: (i = 16 ti + g8 (+8 for [2], [3]), m = 8 n + 2 tq (+1)).
    const u32 i0 = 16 * ti + g8;
    const double G0 = Gd[i0], G1 = Gd[i0 + 8];
    const float nb0 = -bt[i0], nb1 = -bt[i0 + 8];
#pragma unroll
    for (u32 n = 0; n < 8; ++n) {
        const u32 m = 8 * n + 2 * tq;
        const bool live = n <= 2 * ti + 1;
        float v[4];
#pragma unroll
        for (u32 e = 0; e < 4; ++e) {
            const u32 i = i0 + 8 * (e >> 1), mm = m + (e & 1u);
            const double gi = e >> 1 ? G1 : G0;
            const float x = live ? acc[n][e] : 0.0f;
            if (isk) {
                v[e] = (mm < i && i < l) ? x * ((e >> 1 ? nb1 : nb0) * gc_decay((float)(gi - Gd[mm]))) : 0.0f;
            } else {
                v[e] = (mm <= i && i < l) ? (mm < i ? x * gc_decay((float)(gi - Gd[mm])) : x) : 0.0f;
            }
        }
        if (isk) {
            if (live) {
                *reinterpret_cast<float2*>(As + i0 * GT_LDF + m) = make_float2(v[0], v[1]);
                *reinterpret_cast<float2*>(As + (i0 + 8) * GT_LDF + m) = make_float2(v[2], v[3]);
            }
        } else {
            *reinterpret_cast<u32*>(pd + i0 * GC_C + m) = PMma<T>::pack(v[0], v[1]);
            *reinterpret_cast<u32*>(pd + (i0 + 8) * GC_C + m) = PMma<T>::pack(v[2], v[3]);
        }
    }
}

// gc_tril_inverse on two matrices at once (a0, a1), in its 4 barriers. Each element of T is
// computed by gc_inv_diag / gc_inv_block with the same (block i, block j) as there; within
// gc_inv_block an element's sums run over m, then k, whatever the columns a lane takes (NC),
// so the bits are gc_tril_inverse's. A must be complete (barrier) on entry; the caller owes
// the 4th barrier (so that it can store what was in flight before it).
template <u32 LD>
__device__ __forceinline__ void gt6_tril_inverse2(float* a0, float* a1, u32 w, u32 lane) {
    // (a) The 4 diagonal blocks of each: warps 0-1 a0's, 2-3 a1's (a half-warp a block).
    if (w < 4) gc_inv_diag<LD>(w < 2 ? a0 : a1, 2 * (w & 1u) + (lane >> 4), lane & 15u);
    __syncthreads();
    // (b) (1,0) (2,1) (3,2) of each: 24 tasks of 4 columns, 3 a warp.
#pragma unroll
    for (u32 r = 0; r < 3; ++r) {
        const u32 x = w + 8 * r, u = x % 12;
        gc_inv_block<LD, 2>(x < 12 ? a0 : a1, (u >> 2) + 1, u >> 2, 4 * (u & 3u), lane);
    }
    __syncthreads();
    // (c) (2,0) (3,1) of each, 4 columns a warp (gc_tril_inverse's split, twice).
    gc_inv_block<LD, 2>(a0, (w >> 2) + 2, w >> 2, 4 * (w & 3u), lane);
    gc_inv_block<LD, 2>(a1, (w >> 2) + 2, w >> 2, 4 * (w & 3u), lane);
    __syncthreads();
    // (d) (3,0) of each, 2 columns a warp; the caller's barrier follows.
    gc_inv_block<LD, 1>(a0, 3, 0, 2 * w, lane);
    gc_inv_block<LD, 1>(a1, 3, 0, 2 * w, lane);
}

// tc4's phase 5 for one head: −W = −T diag(β e^G) K to wd, U = T diag(β) V to ud (T in As
// after the inverse; Kb shared by both heads, Vb this head's). Warp w: row tiles {p, 3 − p}
// (p = w % 2), column quarter q = w / 2. tc4's expressions and mma order.
template <typename T, int DK>
__device__ __forceinline__ void gt6_w_u(const T* Kb, const T* Vb, const float* As, const float* bt, const float* eg,
                                        T* __restrict__ wch, float* __restrict__ uch, u32 dv, u32 ldv, u32 w,
                                        u32 lane) {
    constexpr u32 LDK = DK + 8;
    constexpr u32 NW8 = DK / 32;
    const u32 g8 = lane >> 2, tq = lane & 3u;
    const u32 lr = lane & 7u, lm = lane >> 3;
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
        T* wd = wch + (u64)i0 * DK + cw + 2 * tq;
#pragma unroll
        for (u32 n = 0; n < NW8; ++n) {
            *reinterpret_cast<u32*>(wd + 8 * n) = PMma<T>::pack(-aw[n][0], -aw[n][1]);
            *reinterpret_cast<u32*>(wd + 8 * DK + 8 * n) = PMma<T>::pack(-aw[n][2], -aw[n][3]);
        }
        float* ud = uch + (u64)i0 * dv + cu + 2 * tq;
#pragma unroll
        for (u32 n = 0; n < 8; ++n) {
            if (n >= nu) break;
            *reinterpret_cast<float2*>(ud + 8 * n) = make_float2(au[n][0], au[n][1]);
            *reinterpret_cast<float2*>(ud + 8 * (u64)dv + 8 * n) = make_float2(au[n][2], au[n][3]);
        }
    }
}
#endif

template <typename T, int DK>
__device__ __forceinline__ void gdn_chunk_tc6_wu_impl(const float* __restrict__ qkv, const float* __restrict__ g,
                                                      const float* __restrict__ beta, const u32* __restrict__ spans,
                                                      const u32* __restrict__ off, T* __restrict__ wn,
                                                      T* __restrict__ kb, float* __restrict__ uf,
                                                      float* __restrict__ gl, T* __restrict__ qg,
                                                      T* __restrict__ pb, u32 hk, u32 hv, u32 dv, float q_scale) {
#if defined(PORTER_SM80)
    constexpr u32 LDK = DK + 8;
    extern __shared__ __align__(128) unsigned char gt_smem[];
    __shared__ double Gd[2][GC_C];
    __shared__ float bt[2][GC_C], eg[2][GC_C], ek[2][GC_C];
    const u32 ldv = dv + 8;
    T* Kb = reinterpret_cast<T*>(gt_smem);                      // [64][LDK]
    T* Qb = Kb + GC_C * LDK;                                    // [64][LDK]
    T* Vb = Qb + GC_C * LDK;                                    // [2][64][ldv]
    float* As = reinterpret_cast<float*>(Vb + 2 * GC_C * ldv);  // [2][64][GT_LDF]: A, then T
    const u32 tid = threadIdx.x, lane = tid & 31u, w = tid >> 5;
    const u32 g8 = lane >> 2, tq = lane & 3u;  // fragment row / column pair
    const u32 lr = lane & 7u, lm = lane >> 3;  // ldmatrix: row lr of matrix lm
    // Value heads j0 = 2·blockIdx.y and j0 + 1; (hv / hk) even, so both map to key head kh
    // (tc4's mapping j / (hv / hk)).
    const u32 s = blockIdx.z, c = blockIdx.x, j0 = 2 * blockIdx.y, kh = j0 / (hv / hk);
    const u32 o = off[s];
    if (o == GC_INVALID) return;
    u32 r0, l;
    if (!gc_chunk_rows(spans, s, c, r0, l)) return;
    const u64 rw = 2ull * hk * DK + (u64)hv * dv;
    const float* qbase = qkv + (u64)kh * DK;
    const float* kbase = qkv + (u64)hk * DK + (u64)kh * DK;
    const float* vbase = qkv + 2ull * hk * DK + (u64)j0 * dv;  // head j0 + 1 at + dv
    const u64 ch0 = ((u64)o + c) * hv + j0;                    // head j0 + 1: ch0 + 1

    // 1-2. Gates (warp h: head j0 + h) while K and Q are in flight; K, Q to shared memory
    // once, K̃ and Qg out for each head.
    {
        float ga = 0.0f, gb = 0.0f, ba = 0.0f, bb = 0.0f;
        if (w < 2) {
            const u32 j = j0 + w;
            if (lane < l) {
                ga = g[(u64)(r0 + lane) * hv + j];
                ba = beta[(u64)(r0 + lane) * hv + j];
            }
            if (lane + 32 < l) {
                gb = g[(u64)(r0 + lane + 32) * hv + j];
                bb = beta[(u64)(r0 + lane + 32) * hv + j];
            }
        }
        Gt3Rows<DK> rk, rq;
        rk.load(kbase, rw, r0, l, tid);
        rq.load(qbase, rw, r0, l, tid);
        if (w < 2) {
            // tc4's scan, per head (rows >= l add 0: G keeps the last value there).
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
            Gd[w][lane] = a;
            Gd[w][lane + 32] = b;
            bt[w][lane] = ba;
            bt[w][lane + 32] = bb;
            eg[w][lane] = lane < l ? gc_decay((float)a) : 0.0f;
            eg[w][lane + 32] = lane + 32 < l ? gc_decay((float)b) : 0.0f;
            ek[w][lane] = lane < l ? gc_decay((float)(glast - a)) : 0.0f;
            ek[w][lane + 32] = lane + 32 < l ? gc_decay((float)(glast - b)) : 0.0f;
            if (lane == 0) gl[ch0 + w] = gc_decay((float)glast);
        }
        __syncthreads();
        gt6_store2<T, DK>(rk, 1.0f, Kb, LDK, kb + ch0 * GC_C * DK, ek[0], kb + (ch0 + 1) * GC_C * DK, ek[1], tid);
        gt6_store2<T, DK>(rq, q_scale, Qb, LDK, qg + ch0 * GC_C * DK, eg[0], qg + (ch0 + 1) * GC_C * DK, eg[1], tid);
    }
    Gt3Rows<DK> rv;
    const bool vrows = dv == DK;
    if (vrows) rv.load(vbase, rw, r0, l, tid);  // head j0's V, in flight across the products
    __syncthreads();                            // Kb, Qb

    // 3. Warp w: row tile ti = w / 2 of P = Q Kᵀ (w even) or K Kᵀ (w odd), n8 tiles 0 .. 2 ti + 1
    // (tc4's products), then one epilogue per head.
    {
        const u32 ti = w >> 1;
        const bool isk = w & 1u;
        const T* X = isk ? Kb : Qb;
        float acc[8][4];
#pragma unroll
        for (u32 n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (u32 kp = 0; kp < DK / 32; ++kp) {
            u32 a0[4], a1[4];
            const T* xa = X + (16 * ti + lr + 8 * (lm & 1u)) * LDK + 32 * kp + 8 * (lm >> 1);
            gt2_ldsm(a0, xa);
            gt2_ldsm(a1, xa + 16);
#pragma unroll
            for (u32 n = 0; n < 8; ++n) {
                if (n > 2 * ti + 1) continue;
                u32 b[4];
                gt2_ldsm(b, Kb + (8 * n + lr) * LDK + 32 * kp + 8 * lm);
                PMma<T>::mma(acc[n], a0, b[0], b[1]);
                PMma<T>::mma(acc[n], a1, b[2], b[3]);
            }
        }
        // Head j0's V rows out of registers before the epilogues.
        if (vrows) rv.template store<T>(false, 1.0f, Vb, ldv, static_cast<T*>(nullptr), nullptr, tid);
        gt6_gram_epilogue<T>(acc, isk, ti, g8, tq, l, Gd[0], bt[0], As, pb + ch0 * GC_C * GC_C);
        gt6_gram_epilogue<T>(acc, isk, ti, g8, tq, l, Gd[1], bt[1], As + GC_C * GT_LDF, pb + (ch0 + 1) * GC_C * GC_C);
    }
    if (vrows) {
        rv.load(vbase + dv, rw, r0, l, tid);  // head j0 + 1's V, in flight across the inverses
    } else {
        gc_stage_rows<T, T>(vbase, rw, r0, l, dv, dv, nullptr, Vb, ldv, nullptr, nullptr, 0, tid);
        gc_stage_rows<T, T>(vbase + dv, rw, r0, l, dv, dv, nullptr, Vb + GC_C * ldv, ldv, nullptr, nullptr, 0, tid);
    }
    __syncthreads();  // A of both heads, Vb (head j0's; with dv != DK both)

    // 4. T = (I − A)⁻¹ in place for both heads, then head j0 + 1's V rows to Vb.
    gt6_tril_inverse2<GT_LDF>(As, As + GC_C * GT_LDF, w, lane);
    if (vrows) rv.template store<T>(false, 1.0f, Vb + GC_C * ldv, ldv, static_cast<T*>(nullptr), nullptr, tid);
    __syncthreads();  // T of both heads, Vb

    // 5. −W and U, head after head (no barrier between: separate inputs and outputs).
#pragma unroll 1
    for (u32 h = 0; h < 2; ++h) {
        gt6_w_u<T, DK>(Kb, Vb + h * GC_C * ldv, As + h * GC_C * GT_LDF, bt[h], eg[h], wn + (ch0 + h) * GC_C * DK,
                       uf + (ch0 + h) * GC_C * dv, dv, ldv, w, lane);
    }
#endif
}

#define GDN_CHUNK_TC6_WU(T, NAME, DK)                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 2)                                                      \
        gdn_chunk_tc6_wu_d##DK##_##NAME(const float* qkv, const float* g, const float* beta, const u32* spans,   \
                                        const u32* off, T* wn, T* kb, float* uf, float* gl, T* qg, T* pb,       \
                                        u32 hk, u32 hv, u32 dv, float q_scale) {                                \
        porter_pdl_enter();                                                                                   \
        gdn_chunk_tc6_wu_impl<T, DK>(qkv, g, beta, spans, off, wn, kb, uf, gl, qg, pb, hk, hv, dv, q_scale);    \
    }
GDN_CHUNK_TC6_WU(bf16, bf16, 64)
GDN_CHUNK_TC6_WU(bf16, bf16, 128)
GDN_CHUNK_TC6_WU(f16, f16, 64)
GDN_CHUNK_TC6_WU(f16, f16, 128)
