// Gated DeltaNet, chunked form on tensor cores, second form (`PORTER_GDN_CHUNK=tc2`): the
// sequential state sweep on raw mma.sync m16n8k16 + ldmatrix with the state in registers.
// Appended to gdn_chunk.cu + gdn_chunk_tc.cu (same module): it reads the scratch that
// gdn_chunk_tc_wu writes (wn, kb, uf, gl) and writes vb / hb in the layouts that
// gdn_chunk_tc_out reads, so only the `state` launch changes.
//
// Why: gdn_chunk_tc_state keeps S in wmma accumulators whose layout is opaque, so every
// chunk S goes through shared memory twice (store_matrix_sync f32 -> round -> Sb, and Vn the
// same way) behind 3 barriers; at 80B dims it ran ~7 µs per chunk (472 µs for 64 chunks).
//
// Here each warp owns 16 state columns (v) and all DK rows (k) of the transposed state
// Sᵀ [16 v][DK k] as m16n8 f32 accumulators (DK/8 tiles, 4 floats a lane: 64 registers at
// DK = 128). Per chunk, with no shared-memory round trip of S or Vn and one barrier:
//   Vnᵀ [16 v][64 tok] = Uᵀ + Sᵀ · (−W)ᵀ     A = Sᵀ rounded (accumulator pairs -> A pairs,
//                                             the FA2 register reuse), B = −W [tok][k]
//                                             (ldmatrix, k contiguous: non-transposed)
//   Sᵀ ← e · Sᵀ + Vnᵀ · K̃                    A = Vnᵀ rounded (accumulators again),
//                                             B = K̃ [tok][k] (ldmatrix.trans)
// Uᵀ seeds the Vn accumulators straight from the staged U tile (f32, [64][BV + 4]: the
// 8 × 4 lanes of a fragment hit 32 distinct banks). The chunk-start state (rounded: the
// values the product used) goes to hb [dk][dv] and Vn to vb [64][dv] through movmatrix
// (8 × 8 b16 transposes in registers: pairs along v, 4-byte stores).
// The next two chunks' −W, K̃ and U stream in with cp.async (3 stages) while this one
// computes. Grid (dv / (16·NW), hv, n_spans), 32·NW threads (NW warps, BV = 16·NW columns).
//
// Cost, 80B dims (dk = dv = 128), per chunk and warp: 64 + 64 mma.sync (2 × 16·64·128·2
// FLOP = 0.5 MFLOP), 32 + 32 ldmatrix.x4, 48 movmatrix, 48 4-byte stores; the chain per
// chunk is ~128 dependent-free mma issues (~1 k cycles at one warp per SM sub-partition,
// ~0.6 µs) against ~7 µs before. Shared memory: 3 × (2 · 64 · (DK + 8) · 2 + 64 · (BV + 4)
// · 4) bytes (130 KiB at DK = 128, NW = 2).
//
// tc3 (`PORTER_GDN_CHUNK=tc3`, FUSE below): gdn_chunk_tc3_wu also writes Qg and the masked
// P (the state-free half of the outputs), and the same sweep writes the outputs, so there is
// no hb (67 MB at 4096 tokens), no vb and no out launch. Per chunk and warp 64 + 64 + 64 + 20
// mma.sync and 106 ldmatrix.x4 (~1.2 µs, ~80 µs at 64 chunks); the stages grow to 69 KiB
// (3 stages: 207 KiB, NW = 2, or NW = 1). At 128 blocks the sweep reads ~70 KiB of L2 per
// block and chunk (~0.6 GB at 4096 tokens: ~100-150 µs at L2 rates), against today's state
// (472 µs) + out (312 µs) launches. gdn_chunk_tc3_wu loads q / k / v rows 4 elements at a
// time with every load of a tile in flight at once and the L2 norms in the same pass (no
// separate norm pass).
//
// Shapes: DK ∈ {64, 128}; dv % (16·NW) == 0; T = bf16 / f16.

#define GT2_STAGES 3

#if defined(PORTER_SM80)
__device__ __forceinline__ void gt2_ldsm(u32 (&r)[4], const void* p) {
    pm_ldsm(r, (u32)__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void gt2_ldsm_t(u32 (&r)[4], const void* p) {
    pm_ldsm_t(r, (u32)__cvta_generic_to_shared(p));
}
// 8 × 8 b16 transpose across the warp: lane (r, c) = (lane / 4, 2 (lane % 4)) holds
// elements (r, c), (r, c + 1) before and (r, c), (r, c + 1) of the transpose after.
__device__ __forceinline__ u32 gt2_movt(u32 x) {
    u32 y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// The m16n8k16 MMA and the pair packing: common.cuh's PMma<T>.

// Stage layout (bytes from the stage start): Wb, Kb (T [64][DK + 8]), Ub (f32 [64][16·NW +
// 4]); fused (tc3) also Qg (T [64][DK + 8]) and Pb (T [64][72]) after Ub.
#define GT2_LDP 72
template <int DK, int NW, bool FUSE>
struct Gt2Stage {
    static constexpr u32 LDK = DK + 8, LDU = 16 * NW + 4;
    static constexpr u32 KB = 2 * GC_C * LDK, UB = 4 * GC_C * LDU;
    static constexpr u32 BYTES = 2 * KB + UB + (FUSE ? KB + 2 * GC_C * GT2_LDP : 0);
};

// One chunk's −W, K̃ ([64][DK + 8] T each), U columns col0 .. col0 + BV − 1 ([64][BV + 4]
// f32) and (FUSE) Q ⊙ e^G, masked P into a stage, NT threads (32·NW: tc2 / tc3; 64·NW: the
// warp pairs of tc5), one commit group.
template <typename T, int DK, int NW, bool FUSE, int NT = 32 * NW>
__device__ __forceinline__ void gt2_load(unsigned char* stage, const T* __restrict__ wn, const T* __restrict__ kb,
                                         const float* __restrict__ uf, const T* __restrict__ qg,
                                         const T* __restrict__ pb, u64 ch, u32 dv, u32 col0, u32 tid) {
    typedef Gt2Stage<DK, NW, FUSE> L;
    constexpr u32 LDK = DK + 8, BV = 16 * NW, LDU = BV + 4;
    constexpr u32 PK = DK / 8;  // 16-byte pieces per K row
    T* Wb = reinterpret_cast<T*>(stage);
    T* Kb = Wb + GC_C * LDK;
    float* Ub = reinterpret_cast<float*>(Kb + GC_C * LDK);
    const T* ws = wn + ch * GC_C * DK;
    const T* ks = kb + ch * GC_C * DK;
#pragma unroll 4
    for (u32 x = tid; x < GC_C * PK; x += NT) {
        const u32 i = x / PK, p = x % PK;
        gc_cp16(reinterpret_cast<float*>(Wb + i * LDK + 8 * p), reinterpret_cast<const float*>(ws + i * DK + 8 * p));
        gc_cp16(reinterpret_cast<float*>(Kb + i * LDK + 8 * p), reinterpret_cast<const float*>(ks + i * DK + 8 * p));
    }
    if constexpr (FUSE) {
        T* Qb = reinterpret_cast<T*>(stage + 2 * L::KB + L::UB);
        T* Pb = Qb + GC_C * LDK;
        const T* qs = qg + ch * GC_C * DK;
        const T* ps = pb + ch * GC_C * GC_C;
#pragma unroll 4
        for (u32 x = tid; x < GC_C * PK; x += NT) {
            const u32 i = x / PK, p = x % PK;
            gc_cp16(reinterpret_cast<float*>(Qb + i * LDK + 8 * p),
                    reinterpret_cast<const float*>(qs + i * DK + 8 * p));
        }
#pragma unroll 4
        for (u32 x = tid; x < GC_C * 8; x += NT) {
            const u32 i = x / 8, p = x % 8;
            gc_cp16(reinterpret_cast<float*>(Pb + i * GT2_LDP + 8 * p),
                    reinterpret_cast<const float*>(ps + i * GC_C + 8 * p));
        }
    }
    const float* us = uf + ch * GC_C * dv + col0;
#pragma unroll 4
    for (u32 x = tid; x < GC_C * (BV / 4); x += NT) {
        const u32 i = x / (BV / 4), p = x % (BV / 4);
        gc_cp16(Ub + i * LDU + 4 * p, us + (u64)i * dv + 4 * p);
    }
    gc_cp_commit();
}
#endif

#if defined(PORTER_SM80)
// Chunk c (of nch, chunk index ch) of a sweep: waits for its stage (this thread's copies, then
// everyone's; the stage chunk c − 1 used is then free) and starts chunk c + 2's copies there.
template <typename T, int DK, int NW, bool FUSE, int NT = 32 * NW>
__device__ __forceinline__ void gt2_next_stage(unsigned char* smem, u32 c, u32 nch, const T* __restrict__ wn,
                                               const T* __restrict__ kb, const float* __restrict__ uf,
                                               const T* __restrict__ qg, const T* __restrict__ pb, u64 ch, u32 hv,
                                               u32 dv, u32 col0, u32 tid) {
    if (c + 1 < nch) {
        gc_cp_wait<1>();
    } else {
        gc_cp_wait<0>();
    }
    __syncthreads();
    if (c + 2 < nch) {
        gt2_load<T, DK, NW, FUSE, NT>(smem + ((c + 2) % GT2_STAGES) * Gt2Stage<DK, NW, FUSE>::BYTES, wn, kb, uf, qg,
                                      pb, ch + 2ull * hv, dv, col0, tid);
    }
}
#endif

// Dynamic shared memory of gdn_chunk_tc2_state / gdn_chunk_tc3_state, bytes: GT2_STAGES ×
// Gt2Stage<DK, NW, FUSE>::BYTES (the host mirrors it).
//
// FUSE (tc3): the outputs too, so that neither hb nor vb exists and gdn_chunk_tc_out does not
// run. gdn_chunk_tc3_wu has written Qg = Q ⊙ e^G (normalised, scaled, rounded) and
// Pb = tril(Q Kᵀ ⊙ Γ) (rounded) per chunk; per chunk and warp
//   Oᵀ [16 v][64 tok] = Sᵀ · Qgᵀ + Vnᵀ · Pbᵀ
// with the same A fragments as the state products (the rounded chunk-start state and the
// rounded Vn) and B = Qg [tok][k], Pb [tok][tok'] by non-transposed ldmatrix (Pb's tiles above
// the diagonal skipped); Oᵀ rounded, transposed by movmatrix, to out rows r0 + tok < r0 + l.
// An invalid span's rows (as far as max_chunks reaches, clipped to t) become NaN.
template <typename T, int DK, int NW, bool FUSE>
__device__ __forceinline__ void gdn_chunk_tc2_state_impl(float* __restrict__ state, const u32* __restrict__ spans,
                                                         const u32* __restrict__ off, const T* __restrict__ wn,
                                                         const T* __restrict__ kb, const float* __restrict__ uf,
                                                         const float* __restrict__ gl, T* __restrict__ vb,
                                                         T* __restrict__ hb, const T* __restrict__ qg,
                                                         const T* __restrict__ pb, T* __restrict__ out, u32 t,
                                                         u32 mc, u32 hv, u32 dv, u32 nbuf) {
#if defined(PORTER_SM80)
    typedef Gt2Stage<DK, NW, FUSE> L;
    constexpr u32 LDK = DK + 8, BV = 16 * NW, LDU = BV + 4;
    constexpr u32 STG = L::BYTES;  // bytes per stage
    constexpr u32 NK = DK / 8;                             // n8 tiles of Sᵀ along k
    extern __shared__ __align__(128) unsigned char gt_smem[];
    const u32 tid = threadIdx.x, lane = tid & 31u, w = tid >> 5;
    const u32 g = lane >> 2, tq = lane & 3u;  // fragment row / column pair
    const u32 s = blockIdx.z, j = blockIdx.y, col0 = blockIdx.x * BV;
    const u32 o = off[s];
    const u32* sp = spans + 5 * s;
    const u32 len = sp[1], slot = sp[2], src = sp[3];
    const u32 nch = (len + GC_C - 1) / GC_C;
    const u32 vw = col0 + 16 * w;  // this warp's first state column
    if (o == GC_INVALID) {
        if constexpr (FUSE) {  // NaN rows (this block's columns) as gdn_chunk_tc_out writes them
            const u32 rows = (nch < mc ? nch : mc) * GC_C < len ? (nch < mc ? nch : mc) * GC_C : len;
            for (u32 x = tid; x < rows * BV; x += 32 * NW) {
                const u64 r = (u64)sp[0] + x / BV;
                if (r < t) out[(r * hv + j) * dv + col0 + x % BV] = from_f<T>(PORTER_NAN);
            }
        }
        return;
    }
    if (len == 0) return;
    const u64 hsz = (u64)DK * dv;
    float* st = state + (((u64)slot * nbuf + src) * hv + j) * hsz;
    const u64 ch0 = (u64)o * hv + j;

    gt2_load<T, DK, NW, FUSE>(gt_smem, wn, kb, uf, qg, pb, ch0, dv, col0, tid);
    if (nch > 1) gt2_load<T, DK, NW, FUSE>(gt_smem + STG, wn, kb, uf, qg, pb, ch0 + hv, dv, col0, tid);

    // Sᵀ: S[n][0..1] = (v = vw + g, k = 8n + 2tq, +1), S[n][2..3] = (v + 8, same k).
    float S[NK][4];
#pragma unroll
    for (u32 n = 0; n < NK; ++n) {
        const u32 k = 8 * n + 2 * tq;
        S[n][0] = st[(u64)k * dv + vw + g];
        S[n][1] = st[(u64)(k + 1) * dv + vw + g];
        S[n][2] = st[(u64)k * dv + vw + g + 8];
        S[n][3] = st[(u64)(k + 1) * dv + vw + g + 8];
    }
    float e = gl[ch0];
    // ldmatrix row addresses: lane l serves row l % 8 of matrix l / 8.
    const u32 lr = lane & 7u, lm = lane >> 3;
    for (u32 c = 0; c < nch; ++c) {
        const u64 ch = ch0 + (u64)c * hv;
        const float e_next = c + 1 < nch ? gl[ch + hv] : 0.0f;
        gt2_next_stage<T, DK, NW, FUSE>(gt_smem, c, nch, wn, kb, uf, qg, pb, ch, hv, dv, col0, tid);
        const unsigned char* stage = gt_smem + (c % GT2_STAGES) * STG;
        const T* Wb = reinterpret_cast<const T*>(stage);
        const T* Kb = Wb + GC_C * LDK;
        const float* Ub = reinterpret_cast<const float*>(Kb + GC_C * LDK);
        const T* Qs = reinterpret_cast<const T*>(stage + 2 * L::KB + L::UB);  // FUSE only
        const T* Ps = Qs + GC_C * LDK;                                          // FUSE only
        float O[8][4];  // FUSE: Oᵀ, (v = g / g + 8, tok = 8n + 2tq, +1)
#pragma unroll
        for (u32 n = 0; n < 8; ++n) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;

        // Vnᵀ = Uᵀ + Sᵀ (−W)ᵀ: V[n] = (v = g / g + 8, tok = 8n + 2tq, +1).
        float V[8][4];
#pragma unroll
        for (u32 n = 0; n < 8; ++n) {
            const float* u0 = Ub + (8 * n + 2 * tq) * LDU + 16 * w + g;
            V[n][0] = u0[0];
            V[n][1] = u0[LDU];
            V[n][2] = u0[8];
            V[n][3] = u0[LDU + 8];
        }
        T* hg = FUSE ? nullptr : hb + (ch0 + (u64)c * hv) * hsz + vw + 2 * tq;
#pragma unroll
        for (u32 kp = 0; kp < DK / 32; ++kp) {  // k = 32 kp .. 32 kp + 31: two k16 steps
            u32 a0[4], a1[4];
#pragma unroll
            for (u32 h = 0; h < 2; ++h) {
                u32(&a)[4] = h ? a1 : a0;
                const u32 n0 = 4 * kp + 2 * h;
                a[0] = PMma<T>::pack(S[n0][0], S[n0][1]);
                a[1] = PMma<T>::pack(S[n0][2], S[n0][3]);
                a[2] = PMma<T>::pack(S[n0 + 1][0], S[n0 + 1][1]);
                a[3] = PMma<T>::pack(S[n0 + 1][2], S[n0 + 1][3]);
                // The rounded chunk-start state to hb[k][v]: transposed pairs along v.
                if constexpr (!FUSE) {
#pragma unroll
                    for (u32 x = 0; x < 4; ++x) {
                        const u32 k = 8 * (n0 + (x >> 1)) + g, v8 = 8 * (x & 1u);
                        *reinterpret_cast<u32*>(hg + (u64)k * dv + v8) = gt2_movt(a[x]);
                    }
                }
            }
#pragma unroll
            for (u32 n = 0; n < 8; ++n) {  // token tiles
                u32 b[4];
                gt2_ldsm(b, Wb + (8 * n + lr) * LDK + 32 * kp + 8 * lm);
                PMma<T>::mma(V[n], a0, b[0], b[1]);
                PMma<T>::mma(V[n], a1, b[2], b[3]);
                if constexpr (FUSE) {  // Oᵀ += Sᵀ Qgᵀ
                    gt2_ldsm(b, Qs + (8 * n + lr) * LDK + 32 * kp + 8 * lm);
                    PMma<T>::mma(O[n], a0, b[0], b[1]);
                    PMma<T>::mma(O[n], a1, b[2], b[3]);
                }
            }
        }
        // Sᵀ ← e Sᵀ + Vnᵀ K̃.
#pragma unroll
        for (u32 n = 0; n < NK; ++n) {
#pragma unroll
            for (u32 x = 0; x < 4; ++x) S[n][x] *= e;
        }
        T* vg = FUSE ? nullptr : vb + (ch * GC_C) * dv + vw + 2 * tq;
#pragma unroll
        for (u32 kk = 0; kk < GC_C / 16; ++kk) {  // tokens 16 kk .. 16 kk + 15
            u32 a[4];
            a[0] = PMma<T>::pack(V[2 * kk][0], V[2 * kk][1]);
            a[1] = PMma<T>::pack(V[2 * kk][2], V[2 * kk][3]);
            a[2] = PMma<T>::pack(V[2 * kk + 1][0], V[2 * kk + 1][1]);
            a[3] = PMma<T>::pack(V[2 * kk + 1][2], V[2 * kk + 1][3]);
            if constexpr (FUSE) {
                // Oᵀ += Vnᵀ Pbᵀ over tokens tok' = 16 kk ..: output tiles n = 2 np, 2 np + 1
                // with np >= kk (Pb is zero above the diagonal).
#pragma unroll
                for (u32 np = kk; np < 4; ++np) {
                    u32 b[4];
                    gt2_ldsm(b, Ps + (16 * np + 8 * (lm >> 1) + lr) * GT2_LDP + 16 * kk + 8 * (lm & 1u));
                    PMma<T>::mma(O[2 * np], a, b[0], b[1]);
                    PMma<T>::mma(O[2 * np + 1], a, b[2], b[3]);
                }
            } else {
                // Vn (rounded) to vb[tok][v].
#pragma unroll
                for (u32 x = 0; x < 4; ++x) {
                    const u32 tok = 16 * kk + 8 * (x >> 1) + g, v8 = 8 * (x & 1u);
                    *reinterpret_cast<u32*>(vg + (u64)tok * dv + v8) = gt2_movt(a[x]);
                }
            }
#pragma unroll
            for (u32 np = 0; np < NK / 2; ++np) {  // k tiles 2 np, 2 np + 1
                u32 b[4];
                gt2_ldsm_t(b, Kb + (16 * kk + 8 * (lm & 1u) + lr) * LDK + 8 * (2 * np + (lm >> 1)));
                PMma<T>::mma(S[2 * np], a, b[0], b[1]);
                PMma<T>::mma(S[2 * np + 1], a, b[2], b[3]);
            }
        }
        if constexpr (FUSE) {  // Oᵀ rounded, transposed, to the chunk's rows < l
            const u32 l = len - c * GC_C < GC_C ? len - c * GC_C : GC_C;
            T* og = out + ((u64)sp[0] + (u64)c * GC_C) * hv * dv + (u64)j * dv + vw + 2 * tq;
#pragma unroll
            for (u32 n = 0; n < 8; ++n) {
                const u32 tok = 8 * n + g;
                const u32 lo = gt2_movt(PMma<T>::pack(O[n][0], O[n][1]));
                const u32 hi = gt2_movt(PMma<T>::pack(O[n][2], O[n][3]));
                if (tok < l) {
                    *reinterpret_cast<u32*>(og + (u64)tok * hv * dv) = lo;
                    *reinterpret_cast<u32*>(og + (u64)tok * hv * dv + 8) = hi;
                }
            }
        }
        e = e_next;
    }
#pragma unroll
    for (u32 n = 0; n < NK; ++n) {
        const u32 k = 8 * n + 2 * tq;
        st[(u64)k * dv + vw + g] = S[n][0];
        st[(u64)(k + 1) * dv + vw + g] = S[n][1];
        st[(u64)k * dv + vw + g + 8] = S[n][2];
        st[(u64)(k + 1) * dv + vw + g + 8] = S[n][3];
    }
#endif
}

// Four consecutive elements of a conv-output row of type Q (bf16 / f16: the tensor-core forms'
// activation types), loaded as 8 bytes and widened to f32 when used.
template <typename Q> struct Gt3Vec;
template <> struct Gt3Vec<bf16> {
    typedef uint2 V;
    static __device__ __forceinline__ V zero() { return make_uint2(0, 0); }
    static __device__ __forceinline__ float4 f(V v) {
        return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                           __uint_as_float(v.y & 0xffff0000u));
    }
};
template <> struct Gt3Vec<f16> {
    typedef uint2 V;
    static __device__ __forceinline__ V zero() { return make_uint2(0, 0); }
    static __device__ __forceinline__ float h(u32 x) { return __half2float(__ushort_as_half((unsigned short)x)); }
    static __device__ __forceinline__ float4 f(V v) { return make_float4(h(v.x), h(v.x >> 16), h(v.y), h(v.y >> 16)); }
};

// Loads rows i < 64 of a chunk, DK columns of Q (row r0 + i at base + (r0 + i) · rw; rows >= l
// zero), 4 elements at once: pass u holds row u · RPP + tid / LPR, columns 4 (tid % LPR) .. + 3
// (LPR = DK / 4 lanes a row, RPP = 1024 / DK rows a pass). Every load is in flight before any is
// used (gc_stage_rows issues 8 scalar loads at a time: 4 round trips for a 64 × 128 tile; here 1).
template <int DK, typename Q>
struct Gt3Rows {
    static constexpr u32 LPR = DK / 4, RPP = GC_THREADS / LPR, PASSES = GC_C / RPP;
    typename Gt3Vec<Q>::V v[PASSES];
    __device__ __forceinline__ void load(const Q* __restrict__ base, u64 rw, u32 r0, u32 l, u32 tid) {
        const u32 i0 = tid / LPR, d = 4 * (tid % LPR);
#pragma unroll
        for (u32 u = 0; u < PASSES; ++u) {
            const u32 i = u * RPP + i0;
            v[u] = i < l ? *reinterpret_cast<const typename Gt3Vec<Q>::V*>(base + (u64)(r0 + i) * rw + d)
                         : Gt3Vec<Q>::zero();
        }
    }
    // 1/sqrt(Σ_row x² + 1e-6) · scale of the rows of the passes. The sums by a
    // reduce-scatter over the row's LPR lanes: at each of the first log2(PASSES) steps a lane
    // keeps half of its partial sums and adds its partner's other half (masks LPR / 2 ..
    // LPR / PASSES), then the last two steps add whole; lane L then holds the sum of pass
    // (L / 4) % PASSES, and returns its scale; lane (L & ~(LPR − 1)) + 4 u has pass u's (store
    // fetches each where it uses it). 9 + 8 shuffles at DK = 128 instead of 8 · 5.
    __device__ __forceinline__ float row_scale(float scale, u32 tid) const {
        static_assert(LPR == 4 * PASSES, "the last two steps add whole sums");
        const u32 lane = tid & 31u;
        float s[PASSES];
#pragma unroll
        for (u32 u = 0; u < PASSES; ++u) {
            const float4 x = Gt3Vec<Q>::f(v[u]);
            s[u] = x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
        }
#pragma unroll
        for (u32 h = PASSES / 2, m = LPR / 2; h >= 1; h >>= 1, m >>= 1) {
#pragma unroll
            for (u32 k = 0; k < h; ++k) {
                const bool up = lane & m;
                const float give = __shfl_xor_sync(0xffffffffu, up ? s[k] : s[k + h], m);
                s[k] = (up ? s[k + h] : s[k]) + give;
            }
        }
        s[0] += __shfl_xor_sync(0xffffffffu, s[0], 2);
        s[0] += __shfl_xor_sync(0xffffffffu, s[0], 1);
        return (1.0f / sqrtf(s[0] + 1e-6f)) * scale;
    }
    // With `norm`, x · (1/sqrt(Σ_row x² + 1e-6) · scale) (the factor of gc_chunk_gates;
    // row_scale), else x; rounded to T at dst[i · LDK + d] (shared) and, with dst2, x · s2[i]
    // (x without s2) rounded to T at dst2[i · ld2 + d] (global; ld2 = DK, or DK + 8 with the 8
    // pad elements of each row zeroed).
    template <typename T>
    __device__ __forceinline__ void store(bool norm, float scale, T* dst, u32 ldk, T* __restrict__ dst2,
                                          const float* s2, u32 tid, u32 ld2 = DK) {
        const u32 i0 = tid / LPR, d = 4 * (tid % LPR);
        const float mine = norm ? row_scale(scale, tid) : 1.0f;
        const u32 base = (tid & 31u) & ~(LPR - 1u);
#pragma unroll
        for (u32 u = 0; u < PASSES; ++u) {
            const u32 i = u * RPP + i0;
            float4 x = Gt3Vec<Q>::f(v[u]);
            if (norm) {
                const float r = __shfl_sync(0xffffffffu, mine, base + 4 * u);
                x = make_float4(x.x * r, x.y * r, x.z * r, x.w * r);
            }
            uint2 p;
            p.x = PMma<T>::pack(x.x, x.y);
            p.y = PMma<T>::pack(x.z, x.w);
            *reinterpret_cast<uint2*>(dst + i * ldk + d) = p;
            if (dst2) {
                const float f = s2 ? s2[i] : 1.0f;
                p.x = PMma<T>::pack(x.x * f, x.y * f);
                p.y = PMma<T>::pack(x.z * f, x.w * f);
                *reinterpret_cast<uint2*>(dst2 + (u64)i * ld2 + d) = p;
                if (ld2 != DK && d + 4 == DK) *reinterpret_cast<uint4*>(dst2 + (u64)i * ld2 + DK) = make_uint4(0, 0, 0, 0);
            }
        }
    }
};

// β, the cumulative log-decay G (f64, summed in row order by one thread as gc_chunk_gates),
// exp(G), exp(G_last − G) of a chunk (rows >= l: zeros, G the last value). Ends with a barrier.
__device__ __forceinline__ void gt3_gates(const float* __restrict__ g, const float* __restrict__ beta, u32 r0,
                                          u32 l, u32 hv, u32 j, float* bt, double* Gd, float* eg, float* ek,
                                          u32 tid) {
    if (tid < GC_C) {
        const bool in = tid < l;
        bt[tid] = in ? beta[(u64)(r0 + tid) * hv + j] : 0.0f;
        Gd[tid] = in ? (double)g[(u64)(r0 + tid) * hv + j] : 0.0;
    }
    __syncthreads();
    if (tid == 0) {
        double acc = 0.0;
        for (u32 i = 0; i < GC_C; ++i) {
            if (i < l) acc += Gd[i];
            Gd[i] = acc;
        }
    }
    __syncthreads();
    if (tid < GC_C) {
        eg[tid] = tid < l ? gc_decay((float)Gd[tid]) : 0.0f;
        ek[tid] = tid < l ? gc_decay((float)(Gd[l - 1] - Gd[tid])) : 0.0f;
    }
    __syncthreads();
}

// Dynamic shared memory of gdn_chunk_tc3_wu, bytes (the host mirrors it): Kb (T [64][dk + 8]),
// QV (Q, later V: T [64][max(dk, dv) + 8]), As (f32 [64][68]: Q Kᵀ, then K Kᵀ, A, T, then the
// warp scratch tiles), Tw, Tu (T [64][72]): as gdn_chunk_tc_wu's at dk = dv.
#define GT3_WU_SMEM(DK, DV)                                                                            \
    (2u * GC_C * ((DK) + 8u) + 2u * GC_C * (((DK) > (DV) ? (DK) : (DV)) + 8u) + 4u * GC_C * GT_LDF + \
     4u * GC_C * GT_LDT)

// ---------------------------------------------------------------------------
// gdn_chunk_tc_wu plus the state-free half of gdn_chunk_tc_out, so that the tc3 state sweep
// can write the outputs: per (chunk, value head) also
//   qg [cap, hv, 64, dk] T   Q ⊙ e^G (Q normalised, times dk^-½)
//   pb [cap, hv, 64, 64] T   tril(Q Kᵀ ⊙ Γ) (Γ_ii = 1; rows >= l zero)
// the same values gdn_chunk_tc_out computes in shared memory. Q Kᵀ first (Q in the region
// that V takes afterwards), then everything as gdn_chunk_tc_wu. grid (max_chunks, hv,
// n_spans), GC_THREADS threads.
// ---------------------------------------------------------------------------
template <typename T, int DK>
__device__ __forceinline__ void gdn_chunk_tc3_wu_impl(const T* __restrict__ qkv, const float* __restrict__ g,
                                                      const float* __restrict__ beta, const u32* __restrict__ spans,
                                                      const u32* __restrict__ off, T* __restrict__ wn,
                                                      T* __restrict__ kb, float* __restrict__ uf,
                                                      float* __restrict__ gl, T* __restrict__ qg,
                                                      T* __restrict__ pb, u32 hk, u32 hv, u32 dv, float q_scale) {
#if defined(PORTER_SM80)
    constexpr u32 LDK = DK + 8;
    extern __shared__ __align__(128) unsigned char gt_smem[];
    __shared__ double Gd[GC_C];
    __shared__ float bt[GC_C], eg[GC_C], ek[GC_C];
    const u32 ldv = dv + 8, ldqv = (DK > dv ? DK : dv) + 8;
    T* Kb = reinterpret_cast<T*>(gt_smem);                   // [64][LDK]
    T* Qb = Kb + GC_C * LDK;                                 // [64][LDK], then V
    T* Vb = Qb;                                              // [64][ldv]
    float* As = reinterpret_cast<float*>(Qb + GC_C * ldqv);  // [64][GT_LDF]
    T* Tw = reinterpret_cast<T*>(As + GC_C * GT_LDF);        // [64][GT_LDT]
    T* Tu = Tw + GC_C * GT_LDT;                              // [64][GT_LDT]
    float* scr = As;
    const u32 tid = threadIdx.x, lane = tid & 31u, w = tid >> 5;
    float* wscr = scr + 256 * w;
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

    {
        Gt3Rows<DK, T> rows;
        rows.load(kbase, rw, r0, l, tid);  // in flight across the gates
        gt3_gates(g, beta, r0, l, hv, j, bt, Gd, eg, ek, tid);
        if (tid == 0) gl[ch] = gc_decay((float)Gd[l - 1]);
        // Normalised K to T; K̃ = K ⊙ exp(G_last − G) to kb; then Q (times dk^-½), Q ⊙ e^G to qg.
        rows.template store<T>(true, 1.0f, Kb, LDK, kb + ch * GC_C * DK, ek, tid);
        rows.load(qbase, rw, r0, l, tid);
        rows.template store<T>(true, q_scale, Qb, LDK, qg + ch * GC_C * DK, eg, tid);
    }
    __syncthreads();
    gt_gram_lower<T, DK>(Qb, Kb, As, w);  // P = Q Kᵀ
    __syncthreads();
    {
        T* dst = pb + ch * GC_C * GC_C;
        for (u32 x = tid; x < GC_C * GC_C; x += GC_THREADS) {
            const u32 i = x / GC_C, m = x % GC_C;
            float v = 0.0f;
            if (m <= i && i < l) v = m < i ? As[i * GT_LDF + m] * gc_decay((float)(Gd[i] - Gd[m])) : As[i * GT_LDF + m];
            dst[x] = from_f<T>(v);
        }
    }
    __syncthreads();  // Q and As are free
    if (dv == DK) {  // V rows, 4 elements a load (one round trip), in flight during K Kᵀ
        Gt3Rows<DK, T> rows;
        rows.load(vbase, rw, r0, l, tid);
        gt_gram_lower<T, DK>(Kb, Kb, As, w);  // K Kᵀ
        rows.template store<T>(false, 1.0f, Vb, ldv, static_cast<T*>(nullptr), nullptr, tid);
    } else {
        gc_stage_rows<T, T>(vbase, rw, r0, l, dv, dv, nullptr, Vb, ldv, nullptr, nullptr, 0, tid);
        gt_gram_lower<T, DK>(Kb, Kb, As, w);  // K Kᵀ
    }
    __syncthreads();
    for (u32 x = tid; x < GC_C * GC_C; x += GC_THREADS) {
        const u32 i = x / GC_C, m = x % GC_C;
        As[i * GT_LDF + m] =
            (m < i && i < l) ? As[i * GT_LDF + m] * (-bt[i] * gc_decay((float)(Gd[i] - Gd[m]))) : 0.0f;
    }
    __syncthreads();
    gc_tril_inverse<GT_LDF>(As, w, lane);
    for (u32 x = tid; x < GC_C * GC_C; x += GC_THREADS) {
        const u32 i = x / GC_C, m = x % GC_C;
        const float tv = gc_tril_at<GT_LDF>(As, i, m);
        Tw[i * GT_LDT + m] = from_f<T>(tv * (bt[m] * eg[m]));
        Tu[i * GT_LDT + m] = from_f<T>(tv * bt[m]);
    }
    __syncthreads();
    {
        const u32 ti = w & 3u;
        T* dst = wn + ch * GC_C * DK;
#pragma unroll
        for (u32 n = 0; n < DK / 32; ++n) {
            const u32 tj = (w >> 2) + 2 * n;
            GtAcc acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (u32 kk = 0; kk <= ti; ++kk) {
                GtA<T> a;
                GtB<T> b;
                wmma::load_matrix_sync(a, Tw + 16 * ti * GT_LDT + 16 * kk, GT_LDT);
                wmma::load_matrix_sync(b, Kb + 16 * kk * LDK + 16 * tj, LDK);
                wmma::mma_sync(acc, a, b, acc);
            }
#pragma unroll
            for (int e = 0; e < acc.num_elements; ++e) acc.x[e] = -acc.x[e];
            gt_store<T>(acc, wscr, dst + 16 * ti * DK + 16 * tj, DK, 16, lane);
        }
    }
    {
        float* dst = uf + ch * GC_C * dv;
        const u32 nq = 4 * (dv / 16);
        for (u32 q = w; q < nq; q += 8) {
            const u32 ti = q & 3u, tj = q >> 2;
            GtAcc acc;
            wmma::fill_fragment(acc, 0.0f);
            for (u32 kk = 0; kk <= ti; ++kk) {
                GtA<T> a;
                GtB<T> b;
                wmma::load_matrix_sync(a, Tu + 16 * ti * GT_LDT + 16 * kk, GT_LDT);
                wmma::load_matrix_sync(b, Vb + 16 * kk * ldv + 16 * tj, ldv);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(dst + (u64)16 * ti * dv + 16 * tj, acc, dv, wmma::mem_row_major);
        }
    }
#endif
}

#define GDN_CHUNK_TC2(T, NAME, DK, NW)                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * NW)                                                     \
        gdn_chunk_tc2_state_d##DK##_##NAME##_w##NW(float* state, const u32* spans, const u32* off,             \
                                                   const T* wn, const T* kb, const float* uf, const float* gl,  \
                                                   T* vb, T* hb, u32 hv, u32 dv, u32 nbuf) { porter_pdl_enter();                  \
        gdn_chunk_tc2_state_impl<T, DK, NW, false>(state, spans, off, wn, kb, uf, gl, vb, hb, nullptr, nullptr, \
                                                   nullptr, 0, 0, hv, dv, nbuf);                              \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * NW)                                                     \
        gdn_chunk_tc3_state_d##DK##_##NAME##_w##NW(float* state, const u32* spans, const u32* off,             \
                                                   const T* wn, const T* kb, const float* uf, const float* gl,  \
                                                   const T* qg, const T* pb, T* out, u32 t, u32 mc, u32 hv,     \
                                                   u32 dv, u32 nbuf, u32 /* hk: tc7's */) {                     \
        porter_pdl_enter();                                                                                   \
        gdn_chunk_tc2_state_impl<T, DK, NW, true>(state, spans, off, wn, kb, uf, gl, nullptr, nullptr, qg, pb,  \
                                                  out, t, mc, hv, dv, nbuf);                                  \
    }
#define GDN_CHUNK_TC2_NW(T, NAME, DK) \
    GDN_CHUNK_TC2(T, NAME, DK, 1)     \
    GDN_CHUNK_TC2(T, NAME, DK, 2)     \
    GDN_CHUNK_TC2(T, NAME, DK, 4)
#define GDN_CHUNK_TC3_WU(T, NAME, DK)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 3)                                                    \
        gdn_chunk_tc3_wu_d##DK##_##NAME(const T* qkv, const float* g, const float* beta, const u32* spans, \
                                        const u32* off, T* wn, T* kb, float* uf, float* gl, T* qg, T* pb,     \
                                        u32 hk, u32 hv, u32 dv, float q_scale) { porter_pdl_enter();                             \
        gdn_chunk_tc3_wu_impl<T, DK>(qkv, g, beta, spans, off, wn, kb, uf, gl, qg, pb, hk, hv, dv, q_scale);  \
    }
GDN_CHUNK_TC3_WU(bf16, bf16, 64)
GDN_CHUNK_TC3_WU(bf16, bf16, 128)
GDN_CHUNK_TC3_WU(f16, f16, 64)
GDN_CHUNK_TC3_WU(f16, f16, 128)
GDN_CHUNK_TC2_NW(bf16, bf16, 64)
GDN_CHUNK_TC2_NW(bf16, bf16, 128)
GDN_CHUNK_TC2_NW(f16, f16, 64)
GDN_CHUNK_TC2_NW(f16, f16, 128)
