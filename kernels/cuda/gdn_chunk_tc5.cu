// Gated DeltaNet, chunked form on tensor cores: the state sweep of `PORTER_GDN_CHUNK=tc5`,
// gdn_chunk_tc3_state (gdn_chunk_tc2.cu) with every 16-column warp split into a warp pair.
// Appended to gdn_chunk.cu + gdn_chunk_tc.cu + gdn_chunk_tc2.cu + gdn_chunk_tc4.cu (same
// module; uses Gt2Stage, gt2_load, gt2_ldsm[_t], gt2_movt, PMma<T>); reads the scratch of
// gdn_chunk_tc3_wu / gdn_chunk_tc4_wu unchanged and writes the same outputs and states,
// **bit for bit** (every sum below runs in tc3's order).
//
// Why: the sweep is one sequential chain of chunks per (value head, 32 columns). tc3 runs it
// on 2 warps a block, 128 blocks at the 80B layout (dv = 128, 32 value heads), so each SM
// has 2 of its 4 sub-partitions busy, each warp issuing 212 mma.sync and 106 ldmatrix.x4
// per chunk (≈ 2.5 µs a chunk measured: 163 µs at 4096 tokens, 621 at 16k). Here the same
// 128 blocks run 4 warps: warp w = 2·cw + p serves state columns col0 + 16·cw .. + 15 (as
// tc3's warp cw) and splits that warp's work with its partner w ^ 1:
//   - tokens: the pair's output / Vn token tiles are split by 16-token pairs, p = 0 taking
//     np ∈ {0, 3}, p = 1 np ∈ {1, 2} (the lower-triangular Pb products balance: 5 k16 steps
//     each). Vnᵀ = Uᵀ + Sᵀ (−W)ᵀ and Oᵀ = Sᵀ Qgᵀ for its own tokens need the whole rounded
//     state (all DK rows), which each warp holds as A fragments;
//   - k: the f32 state Sᵀ [16 v][DK k] is split in halves, p owning k ∈ [p·DK/2, (p+1)·DK/2);
//     Sᵀ ← e Sᵀ + Vnᵀ K̃ for its half needs all 64 tokens of Vn.
// So per chunk each warp issues 106 mma.sync and 53 ldmatrix.x4, and the pair swaps, through
// 3 KiB of shared memory a warp, its rounded Vn fragments (after the Vn products) and its
// rounded state half (after the state update), one named barrier (64 threads) each. Every
// element is still computed by one warp in tc3's order (Vn and O over k = 0, 32, 64, 96 then
// the Pb steps kk = 0 .. np; the state scaled by e then kk = 0 .. 3), and rounding is a
// function of the value, so the results are tc3's bits.
//
// Exchange safety without double buffers: Vx[w] is rewritten in chunk c + 1 only after the
// state barrier of chunk c, which the partner reaches after reading Vx[w] in chunk c; Sx[w]
// is rewritten after the Vn barrier of chunk c + 1, which the partner reaches after reading
// Sx[w] in chunk c.
//
// Grid (dv / 32, hv, n_spans), 128 threads; dynamic shared memory GT5_SMEM(DK) (the host
// mirrors it): 3 tc3 stages of 32 columns, then Vx [4 warps][2][32 lanes] and Sx [4 warps]
// [DK / 32][32 lanes] uint4 (220 KiB at DK = 128). Shapes: DK ∈ {64, 128}; dv % 32 == 0.

#define GT5_SMEM(DK) (GT2_STAGES * Gt2Stage<DK, 2, true>::BYTES + 4u * (2u + (DK) / 32u) * 32u * 16u)

#if defined(PORTER_SM80)
// Named barrier 1 + cw over the 64 threads of warp pair cw (immediate ids: ptxas reserves
// every barrier for a register id).
__device__ __forceinline__ void gt5_pair_bar(u32 cw) {
    if (cw == 0) {
        asm volatile("bar.sync 1, 64;\n" ::: "memory");
    } else {
        asm volatile("bar.sync 2, 64;\n" ::: "memory");
    }
}

// Own token tile i = 0..3 of warp P of a pair: n = 2·np + (i & 1), np = {0, 3} (P = 0) or
// {1, 2} (P = 1).
template <int P>
__device__ __forceinline__ constexpr u32 gt5_tn(u32 i) {
    return 2 * (i < 2 ? (P ? 1u : 0u) : (P ? 2u : 3u)) + (i & 1u);
}

// tc5's stages: cp.async, 3 stages, chunk c + 2's copies issued once chunk c's have landed
// (gt2_next_stage). The sweep asks `acquire(smem, c, ch)` for chunk c's stage and calls
// `release(smem, c, ch)` when it is done with it (gdn_chunk_tc6.cu's cluster pipe has the same
// three calls).
// What a state launch's stage pipe works from: the wu launch's scratch, and this block's chunks
// (nch), heads (hv), value dim (dv), first column (col0) and thread (tid).
// tc7 (Gt6Pipe with LEAN) reads kb / qg per (chunk, key head): chunk c's at chk0 + c·hk
// (tc5 / tc6: chk0 = ch0, hk = hv, unused).
template <typename T>
struct Gt5Scratch {
    const T* __restrict__ wn;
    const T* __restrict__ kb;
    const float* __restrict__ uf;
    const T* __restrict__ qg;
    const T* __restrict__ pb;
    u32 nch, hv, dv, col0, tid;
    u64 chk0;
    u32 hk;
};

template <typename T, int DK>
struct Gt5CpPipe {
    typedef Gt2Stage<DK, 2, true> L;  // the stage layout
    static constexpr bool LEAN = false;
    Gt5Scratch<T> a;
    __device__ __forceinline__ explicit Gt5CpPipe(const Gt5Scratch<T>& a_) : a(a_) {}
    // Chunks 0 and 1 in flight.
    __device__ __forceinline__ void start(unsigned char* smem, u64 ch0) {
        gt2_load<T, DK, 2, true, 128>(smem, a.wn, a.kb, a.uf, a.qg, a.pb, ch0, a.dv, a.col0, a.tid);
        if (a.nch > 1) {
            gt2_load<T, DK, 2, true, 128>(smem + Gt2Stage<DK, 2, true>::BYTES, a.wn, a.kb, a.uf, a.qg, a.pb,
                                          ch0 + a.hv, a.dv, a.col0, a.tid);
        }
    }
    __device__ __forceinline__ const unsigned char* acquire(unsigned char* smem, u32 c, u64 ch) {
        gt2_next_stage<T, DK, 2, true, 128>(smem, c, a.nch, a.wn, a.kb, a.uf, a.qg, a.pb, ch, a.hv, a.dv, a.col0,
                                            a.tid);
        return smem + (c % GT2_STAGES) * Gt2Stage<DK, 2, true>::BYTES;
    }
    __device__ __forceinline__ void release(unsigned char*, u32, u64) {}
    __device__ __forceinline__ void produce(unsigned char*, u64) {}  // no producer warp
    __device__ __forceinline__ void finish() {}
};

// The sweep of warp p of its pair (P = p, so that every register index is static).
// With Pipe::LEAN (tc7: the stage is a Gt7Stage, gdn_chunk_tc6.cu) the scratch carries no
// decays: K̂ and Q̂ plain, U in T, e^G and e^(G_last − G) per token beside U. Then U is read
// by ldmatrix.trans, Oᵀ = Sᵀ Q̂ᵀ is scaled per token by e^G before the Pb products, and the
// state update takes Vnᵀ scaled per token by e^(G_last − G) (rounded once more, its own
// fragments, exchanged beside the plain ones) against K̂: the same sums with the decays moved
// from the stored operands to the sweep's registers (not tc6's bits).
template <typename T, int DK, int P, class Pipe>
__device__ __forceinline__ void gt5_sweep(unsigned char* smem, Pipe& pipe, float* __restrict__ st,
                                          const u32* __restrict__ sp, const float* __restrict__ gl,
                                          T* __restrict__ out, u64 ch0, u32 nch, u32 len, u32 hv, u32 j, u32 dv,
                                          u32 col0, u32 tid) {
    typedef typename Pipe::L L;
    constexpr bool LEAN = Pipe::LEAN;
    constexpr u32 NV = LEAN ? 4 : 2;  // uint4 a lane of the Vn exchange (LEAN: plain and scaled)
    constexpr u32 LDK = DK + 8, LDU = 32 + 4, STG = L::BYTES;
    constexpr u32 NK = DK / 8;     // n8 tiles of Sᵀ along k
    constexpr u32 NH = NK / 2;     // ... in this warp's half
    constexpr u32 NS = DK / 16;    // k16 steps of the rounded state (A fragments)
    constexpr u32 NSH = NS / 2;    // ... in this warp's half
    constexpr u32 NP0 = P ? 1 : 0, NP1 = P ? 2 : 3;  // own 16-token pairs (kk / np)
    constexpr u32 MP0 = P ? 0 : 1, MP1 = P ? 3 : 2;  // the partner's
    const u32 lane = tid & 31u, w = tid >> 5, cw = w >> 1;
    const u32 g = lane >> 2, tq = lane & 3u;
    const u32 lr = lane & 7u, lm = lane >> 3;
    const u32 vw = col0 + 16 * cw;  // this pair's first state column
    uint4* Vx = reinterpret_cast<uint4*>(smem + GT2_STAGES * STG);
    uint4* Sx = Vx + 4 * NV * 32;
    uint4* myV = Vx + w * NV * 32 + lane;
    const uint4* ptV = Vx + (w ^ 1u) * NV * 32 + lane;
    uint4* myS = Sx + w * NSH * 32 + lane;
    const uint4* ptS = Sx + (w ^ 1u) * NSH * 32 + lane;

    // This warp's f32 half of Sᵀ: Sh[m] = tile n = P·NH + m, (v = vw + g, k = 8n + 2tq, +1),
    // (v + 8, same k); the whole state rounded as A fragments Af[s] (k16 step s, tiles 2s, 2s + 1).
    float Sh[NH][4];
    u32 Af[NS][4];
#pragma unroll
    for (u32 s = 0; s < NS; ++s) {
        float x[2][4];
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            const u32 k = 8 * (2 * s + h) + 2 * tq;
            x[h][0] = st[(u64)k * dv + vw + g];
            x[h][1] = st[(u64)(k + 1) * dv + vw + g];
            x[h][2] = st[(u64)k * dv + vw + g + 8];
            x[h][3] = st[(u64)(k + 1) * dv + vw + g + 8];
            if (s / NSH == P) {
#pragma unroll
                for (u32 q = 0; q < 4; ++q) Sh[2 * s + h - P * NH][q] = x[h][q];
            }
        }
        Af[s][0] = PMma<T>::pack(x[0][0], x[0][1]);
        Af[s][1] = PMma<T>::pack(x[0][2], x[0][3]);
        Af[s][2] = PMma<T>::pack(x[1][0], x[1][1]);
        Af[s][3] = PMma<T>::pack(x[1][2], x[1][3]);
    }
    float e = gl[ch0];
    for (u32 c = 0; c < nch; ++c) {
        const u64 ch = ch0 + (u64)c * hv;
        const float e_next = c + 1 < nch ? gl[ch + hv] : 0.0f;
        const unsigned char* stage = pipe.acquire(smem, c, ch);
        const T* Wb = reinterpret_cast<const T*>(stage);
        const T* Kb = Wb + GC_C * LDK;
        const float* Ub = reinterpret_cast<const float*>(Kb + GC_C * LDK);
        const T* Qs = reinterpret_cast<const T*>(stage + 2 * L::KB + L::UB);
        const T* Ps = Qs + GC_C * LDK;
        float V[4][4], O[4][4];
        if constexpr (LEAN) {
            // U (T [64][GT7_LDU]) transposed by ldmatrix: matrix m = (own tile 2 hp + m / 2,
            // column half m % 2); lane (g, tq) gets tokens 2 tq, 2 tq + 1 of column g.
            const T* Ut = reinterpret_cast<const T*>(stage + 2 * L::KB);
#pragma unroll
            for (u32 hp = 0; hp < 2; ++hp) {
                u32 r[4];
                gt2_ldsm_t(r, Ut + (8 * gt5_tn<P>(2 * hp + (lm >> 1)) + lr) * GT7_LDU + 16 * cw + 8 * (lm & 1u));
#pragma unroll
                for (u32 x = 0; x < 2; ++x) {
                    const float2 lo = PMma<T>::unpack(r[2 * x]), hi = PMma<T>::unpack(r[2 * x + 1]);
                    V[2 * hp + x][0] = lo.x;
                    V[2 * hp + x][1] = lo.y;
                    V[2 * hp + x][2] = hi.x;
                    V[2 * hp + x][3] = hi.y;
                }
            }
#pragma unroll
            for (u32 i = 0; i < 4; ++i) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.0f;
        } else {
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                const float* u0 = Ub + (8 * gt5_tn<P>(i) + 2 * tq) * LDU + 16 * cw + g;
                V[i][0] = u0[0];
                V[i][1] = u0[LDU];
                V[i][2] = u0[8];
                V[i][3] = u0[LDU + 8];
                O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.0f;
            }
        }
        // Vnᵀ = Uᵀ + Sᵀ (−W)ᵀ and Oᵀ = Sᵀ Qgᵀ, own tokens, k in tc3's order.
#pragma unroll
        for (u32 kp = 0; kp < DK / 32; ++kp) {
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                u32 b[4];
                gt2_ldsm(b, Wb + (8 * gt5_tn<P>(i) + lr) * LDK + 32 * kp + 8 * lm);
                PMma<T>::mma(V[i], Af[2 * kp], b[0], b[1]);
                PMma<T>::mma(V[i], Af[2 * kp + 1], b[2], b[3]);
                gt2_ldsm(b, Qs + (8 * gt5_tn<P>(i) + lr) * LDK + 32 * kp + 8 * lm);
                PMma<T>::mma(O[i], Af[2 * kp], b[0], b[1]);
                PMma<T>::mma(O[i], Af[2 * kp + 1], b[2], b[3]);
            }
        }
        // LEAN: the decays of the chunk's tokens (e^G, then e^(G_last − G), after U in the
        // stage): Oᵀ ⊙ e^G per token.
        if constexpr (LEAN) {
            const float* Eg = reinterpret_cast<const float*>(stage + 2 * L::KB + L::UT);
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                const float2 e2 = *reinterpret_cast<const float2*>(Eg + 8 * gt5_tn<P>(i) + 2 * tq);
                O[i][0] *= e2.x;
                O[i][1] *= e2.y;
                O[i][2] *= e2.x;
                O[i][3] *= e2.y;
            }
        }
        // Vn rounded: own fragments out, the partner's in (Vf[kk], tokens 16 kk ..); LEAN: also
        // Vn ⊙ e^(G_last − G) per token (Vk[kk]) for the state update.
        u32 Vf[4][4], Vk[4][4];
#pragma unroll
        for (u32 q = 0; q < 2; ++q) {
            const u32 kk = q ? NP1 : NP0;
            Vf[kk][0] = PMma<T>::pack(V[2 * q][0], V[2 * q][1]);
            Vf[kk][1] = PMma<T>::pack(V[2 * q][2], V[2 * q][3]);
            Vf[kk][2] = PMma<T>::pack(V[2 * q + 1][0], V[2 * q + 1][1]);
            Vf[kk][3] = PMma<T>::pack(V[2 * q + 1][2], V[2 * q + 1][3]);
            myV[32 * q] = make_uint4(Vf[kk][0], Vf[kk][1], Vf[kk][2], Vf[kk][3]);
            if constexpr (LEAN) {
                const float* Ek = reinterpret_cast<const float*>(stage + 2 * L::KB + L::UT) + GC_C;
                const float2 e0 = *reinterpret_cast<const float2*>(Ek + 16 * kk + 2 * tq);
                const float2 e1 = *reinterpret_cast<const float2*>(Ek + 16 * kk + 8 + 2 * tq);
                Vk[kk][0] = PMma<T>::pack(V[2 * q][0] * e0.x, V[2 * q][1] * e0.y);
                Vk[kk][1] = PMma<T>::pack(V[2 * q][2] * e0.x, V[2 * q][3] * e0.y);
                Vk[kk][2] = PMma<T>::pack(V[2 * q + 1][0] * e1.x, V[2 * q + 1][1] * e1.y);
                Vk[kk][3] = PMma<T>::pack(V[2 * q + 1][2] * e1.x, V[2 * q + 1][3] * e1.y);
                myV[32 * (2 + q)] = make_uint4(Vk[kk][0], Vk[kk][1], Vk[kk][2], Vk[kk][3]);
            }
        }
        gt5_pair_bar(cw);
#pragma unroll
        for (u32 q = 0; q < 2; ++q) {
            const u32 kk = q ? MP1 : MP0;
            const uint4 x = ptV[32 * q];
            Vf[kk][0] = x.x;
            Vf[kk][1] = x.y;
            Vf[kk][2] = x.z;
            Vf[kk][3] = x.w;
            if constexpr (LEAN) {
                const uint4 y = ptV[32 * (2 + q)];
                Vk[kk][0] = y.x;
                Vk[kk][1] = y.y;
                Vk[kk][2] = y.z;
                Vk[kk][3] = y.w;
            }
        }
        // Own half: Sᵀ ← e Sᵀ + Vnᵀ K̃; own tokens: Oᵀ += Vnᵀ Pbᵀ (Pb zero above the diagonal).
#pragma unroll
        for (u32 m = 0; m < NH; ++m) {
#pragma unroll
            for (u32 x = 0; x < 4; ++x) Sh[m][x] *= e;
        }
#pragma unroll
        for (u32 kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (u32 q = 0; q < 2; ++q) {
                const u32 np = q ? NP1 : NP0;
                if (kk <= np) {
                    u32 b[4];
                    gt2_ldsm(b, Ps + (16 * np + 8 * (lm >> 1) + lr) * GT2_LDP + 16 * kk + 8 * (lm & 1u));
                    PMma<T>::mma(O[2 * q], Vf[kk], b[0], b[1]);
                    PMma<T>::mma(O[2 * q + 1], Vf[kk], b[2], b[3]);
                }
            }
#pragma unroll
            for (u32 np = P * NH / 2; np < (P + 1) * NH / 2; ++np) {  // k tiles 2 np, 2 np + 1
                u32 b[4];
                gt2_ldsm_t(b, Kb + (16 * kk + 8 * (lm & 1u) + lr) * LDK + 8 * (2 * np + (lm >> 1)));
                if constexpr (LEAN) {
                    PMma<T>::mma(Sh[2 * np - P * NH], Vk[kk], b[0], b[1]);
                    PMma<T>::mma(Sh[2 * np + 1 - P * NH], Vk[kk], b[2], b[3]);
                } else {
                    PMma<T>::mma(Sh[2 * np - P * NH], Vf[kk], b[0], b[1]);
                    PMma<T>::mma(Sh[2 * np + 1 - P * NH], Vf[kk], b[2], b[3]);
                }
            }
        }
        // The new state rounded: own half out, the partner's in.
#pragma unroll
        for (u32 q = 0; q < NSH; ++q) {
            const u32 s = P * NSH + q;
            Af[s][0] = PMma<T>::pack(Sh[2 * q][0], Sh[2 * q][1]);
            Af[s][1] = PMma<T>::pack(Sh[2 * q][2], Sh[2 * q][3]);
            Af[s][2] = PMma<T>::pack(Sh[2 * q + 1][0], Sh[2 * q + 1][1]);
            Af[s][3] = PMma<T>::pack(Sh[2 * q + 1][2], Sh[2 * q + 1][3]);
            myS[32 * q] = make_uint4(Af[s][0], Af[s][1], Af[s][2], Af[s][3]);
        }
        // Oᵀ rounded, transposed, to the chunk's rows < l (before the barrier: no dependence).
        const u32 l = len - c * GC_C < GC_C ? len - c * GC_C : GC_C;
        T* og = out + ((u64)sp[0] + (u64)c * GC_C) * hv * dv + (u64)j * dv + vw + 2 * tq;
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
            const u32 tok = 8 * gt5_tn<P>(i) + g;
            const u32 lo = gt2_movt(PMma<T>::pack(O[i][0], O[i][1]));
            const u32 hi = gt2_movt(PMma<T>::pack(O[i][2], O[i][3]));
            if (tok < l) {
                *reinterpret_cast<u32*>(og + (u64)tok * hv * dv) = lo;
                *reinterpret_cast<u32*>(og + (u64)tok * hv * dv + 8) = hi;
            }
        }
        gt5_pair_bar(cw);
#pragma unroll
        for (u32 q = 0; q < NSH; ++q) {
            const u32 s = (1 - P) * NSH + q;
            const uint4 x = ptS[32 * q];
            Af[s][0] = x.x;
            Af[s][1] = x.y;
            Af[s][2] = x.z;
            Af[s][3] = x.w;
        }
        e = e_next;
        pipe.release(smem, c, ch);
    }
#pragma unroll
    for (u32 m = 0; m < NH; ++m) {
        const u32 k = 8 * (P * NH + m) + 2 * tq;
        st[(u64)k * dv + vw + g] = Sh[m][0];
        st[(u64)(k + 1) * dv + vw + g] = Sh[m][1];
        st[(u64)k * dv + vw + g + 8] = Sh[m][2];
        st[(u64)(k + 1) * dv + vw + g + 8] = Sh[m][3];
    }
}
#else
// Below sm_80 the launch is never chosen (its body is empty); the entry points still name a pipe.
template <typename T, int DK>
struct Gt5CpPipe {};
#endif

// The state launch of tc5 (Pipe = Gt5CpPipe, 128 threads) and of tc6 (Gt6Pipe,
// gdn_chunk_tc6.cu, 160: warp 4 fills the stages): a Pipe is built from a Gt5Scratch,
// `start`s the first chunks' copies, lets threads 128.. `produce` and `finish`es after the
// sweep.
template <typename T, int DK, class Pipe>
__device__ __forceinline__ void gdn_chunk_tc5_state_impl(float* __restrict__ state, const u32* __restrict__ spans,
                                                         const u32* __restrict__ off, const T* __restrict__ wn,
                                                         const T* __restrict__ kb, const float* __restrict__ uf,
                                                         const float* __restrict__ gl, const T* __restrict__ qg,
                                                         const T* __restrict__ pb, T* __restrict__ out, u32 t,
                                                         u32 mc, u32 hv, u32 dv, u32 nbuf, u32 hk) {
#if defined(PORTER_SM80)
    constexpr u32 BV = 32;
    const u32 NT = blockDim.x;  // 128 (tc5), 160 (tc6: a producer warp besides)
    extern __shared__ __align__(128) unsigned char gt_smem[];
    const u32 tid = threadIdx.x;
    const u32 s = blockIdx.z, j = blockIdx.y, col0 = blockIdx.x * BV;
    const u32 o = off[s];
    const u32* sp = spans + 5 * s;
    const u32 len = sp[1], slot = sp[2], src = sp[3];
    const u32 nch = (len + GC_C - 1) / GC_C;
    if (o == GC_INVALID) {  // NaN rows (this block's columns), as gdn_chunk_tc3_state
        const u32 rows = (nch < mc ? nch : mc) * GC_C < len ? (nch < mc ? nch : mc) * GC_C : len;
        for (u32 x = tid; x < rows * BV; x += NT) {
            const u64 r = (u64)sp[0] + x / BV;
            if (r < t) out[(r * hv + j) * dv + col0 + x % BV] = from_f<T>(PORTER_NAN);
        }
        return;
    }
    if (len == 0) return;
    float* st = state + (((u64)slot * nbuf + src) * hv + j) * ((u64)DK * dv);
    const u64 ch0 = (u64)o * hv + j;
    const u64 chk0 = (u64)o * hk + j / (hv / hk);  // tc7's K̂ / Q̂ (tc5 / tc6: hk = hv)
    Pipe pipe(Gt5Scratch<T>{wn, kb, uf, qg, pb, nch, hv, dv, col0, tid, chk0, hk});
    pipe.start(gt_smem, ch0);
    if (tid >= 128) {
        pipe.produce(gt_smem, ch0);
    } else if (((tid >> 5) & 1u) == 0) {
        gt5_sweep<T, DK, 0>(gt_smem, pipe, st, sp, gl, out, ch0, nch, len, hv, j, dv, col0, tid);
    } else {
        gt5_sweep<T, DK, 1>(gt_smem, pipe, st, sp, gl, out, ch0, nch, len, hv, j, dv, col0, tid);
    }
    pipe.finish();
#endif
}

#define GDN_CHUNK_TC5(T, NAME, DK)                                                                             \
    extern "C" __global__ void __launch_bounds__(128, 1)                                                       \
        gdn_chunk_tc5_state_d##DK##_##NAME(float* state, const u32* spans, const u32* off, const T* wn,        \
                                           const T* kb, const float* uf, const float* gl, const T* qg,          \
                                           const T* pb, T* out, u32 t, u32 mc, u32 hv, u32 dv, u32 nbuf,       \
                                           u32 /* hk: tc7's */) {                                               \
        porter_pdl_enter();                                                                                   \
        gdn_chunk_tc5_state_impl<T, DK, Gt5CpPipe<T, DK>>(state, spans, off, wn, kb, uf, gl, qg, pb, out, t, mc, hv, dv, nbuf, hv); \
    }
GDN_CHUNK_TC5(bf16, bf16, 64)
GDN_CHUNK_TC5(bf16, bf16, 128)
GDN_CHUNK_TC5(f16, f16, 64)
GDN_CHUNK_TC5(f16, f16, 128)
