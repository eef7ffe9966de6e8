// The merges of decode attention's split partials (appended to attention_decode.cu in its
// module): the V2 split kernel's own last-block merge (ADEC_LAST), the combine kernels
// (V1's adec_combine, V2's adec_combine2), and the module's entry points.
//
// The last-block merge (PORTER_ATTN_DECODE=mma4-last; flags & ADEC_LAST, V2 only): no combine
// launch. A tile's working splits [za, zb] (tile = (sequence, KV head, m-tile), blockIdx.y ·
// mtiles + mt) fall in groups of ADEC_G consecutive splits (group g: splits g·G .. g·G + G − 1,
// absolute). Each working block stores its partials, then counts itself in its group's word
// (`sync`, ngm + 1 words a tile, ngm = ceil(nzg / G), zero between launches); the group's last
// block (the count reaching the group's working splits) merges, for every item of the tile
// whose own splits [zlo, zhi] lie in more than one split, that item's splits in the group:
// into the output when all of them lie in this group, else into a group partial in the slot of
// the group's first split of the item (max(g·G, zlo)), and counts itself in the tile's last
// word; the last of those (the count reaching the tile's groups) merges the group partials of
// the items that span several groups into the output. Each last block zeroes the word it
// completed. Every merge is M = max m_k, w_k = 2^(m_k − M), L = Σ l_k·w_k and O = Σ O_k·w_k in
// increasing k by one thread a (item, 4 dims), then O / L rounded to T (or O, M, L stored for
// the next level): the order depends on the item's own sequence only (zlo, zhi and G), so rows
// are batch invariant, and on no block's arrival order. Fences: every thread fences its
// partial stores before the block's count (release); the last block fences after learning it
// is last (acquire) and reads the partials through L2 (ld.global.cg).
#define ADEC_G 8u                             // splits of a first-level group
#define ADEC_MAXG (ADEC_MAXZ / ADEC_G)        // most groups of a sequence

// One merge level over the tile's items m0..m_last (at most 16): TOP = false merges group g's
// splits of each item, TOP = true the group partials. `sm`: shared scratch of 2·16·NS + 32
// floats, every thread of the block calling.
template <typename T, int DP, u32 THREADS, bool TOP>
__device__ __forceinline__ void adec_merge_level(float* __restrict__ part, T* __restrict__ out,
                                                 float* __restrict__ sm, u32 g, u32 nzg, u32 m0, u32 m_last,
                                                 u32 group, u32 kh, u32 heads, u32 qcap, u32 s, u32 row0, u32 pos0,
                                                 u32 window, u32 ksl, bool ovec) {
    constexpr u32 PS = DP + 4;
    constexpr u32 NS = TOP ? ADEC_MAXG : ADEC_G;  // most sources of an item
    constexpr u32 C4 = DP / 4;
    float* wm = sm;              // [16][NS]: m_k, then the weight w_k
    float* wl = sm + 16 * NS;    // [16][NS]: l_k
    float* ML = sm + 32 * NS;    // [16][M, L]
    const u32 tid = threadIdx.x;
    // Item r's sources: the first source's split `a`, their count `n` (0: nothing here),
    // whether this level finishes it, and the slot of source k.
    struct Src {
        u32 i, hd, zlo, a, n;
        bool fin;
    };
    const auto src = [&](u32 r) {
        Src x{0, 0, 0, 0, 0, false};
        const u32 m = m0 + r;
        if (m > m_last) return x;
        x.i = m / group;
        x.hd = kh * group + m % group;
        const u32 p = pos0 + x.i;
        const u32 zlo = adec_lo(p, window) >> ksl, zhi = min(p >> ksl, nzg - 1);
        x.zlo = zlo;
        if (zlo >= zhi) return x;  // one split: the split kernel wrote the row
        const u32 glo = zlo / ADEC_G, ghi = zhi / ADEC_G;
        if (TOP) {
            if (glo == ghi) return x;  // finished by its group's merge
            x.a = glo;
            x.n = ghi - glo + 1;
            x.fin = true;
        } else {
            const u32 lo = max(g * ADEC_G, zlo), hi = min(g * ADEC_G + ADEC_G - 1, zhi);
            if (lo > hi) return x;
            x.a = lo;
            x.n = hi - lo + 1;
            x.fin = glo == ghi;
        }
        return x;
    };
    const auto slot = [&](const Src& x, u32 k) {
        const u32 z = TOP ? max((x.a + k) * ADEC_G, x.zlo) : x.a + k;
        return part + ((((u64)s * qcap + x.i) * heads + x.hd) * nzg + z) * PS;
    };
    for (u32 e = tid; e < 16u * NS; e += THREADS) {
        const u32 r = e / NS, k = e % NS;
        const Src x = src(r);
        if (k < x.n) {
            const float2 v = __ldcg(reinterpret_cast<const float2*>(slot(x, k) + DP));
            wm[e] = v.x;
            wl[e] = v.y;
        }
    }
    __syncthreads();
    if (tid < 16u) {
        const Src x = src(tid);
        if (x.n != 0) {
            float M = PORTER_NEG_INF;
            for (u32 k = 0; k < x.n; ++k) M = fmaxf(M, wm[tid * NS + k]);
            float L = 0.0f;
            for (u32 k = 0; k < x.n; ++k) {
                const float mk = wm[tid * NS + k];
                const float w = mk == PORTER_NEG_INF ? 0.0f : exp2f(mk - M);
                wm[tid * NS + k] = w;
                L = fmaf(wl[tid * NS + k], w, L);
            }
            ML[2 * tid] = M;
            ML[2 * tid + 1] = L;
        }
    }
    __syncthreads();
    for (u32 e = tid; e < 16u * C4; e += THREADS) {
        const u32 r = e / C4, d0 = (e % C4) * 4;
        const Src x = src(r);
        if (x.n == 0) continue;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (u32 k0 = 0; k0 < x.n; k0 += 8) {
            float4 v[8];
#pragma unroll
            for (u32 j = 0; j < 8; ++j)
                v[j] = k0 + j < x.n ? __ldcg(reinterpret_cast<const float4*>(slot(x, k0 + j) + d0))
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                if (k0 + j < x.n) {
                    const float w = wm[r * NS + k0 + j];
                    acc.x = fmaf(v[j].x, w, acc.x);
                    acc.y = fmaf(v[j].y, w, acc.y);
                    acc.z = fmaf(v[j].z, w, acc.z);
                    acc.w = fmaf(v[j].w, w, acc.w);
                }
            }
        }
        if (x.fin) {
            adec_store4<T>(out + ((u64)(row0 + x.i) * heads + x.hd) * DP + d0, acc, 1.0f / ML[2 * r + 1], ovec);
        } else {
            // The group partial over the item's first source of this group (read above by
            // this thread only: its own 4 dims; (M, L) were read before the barrier).
            float* pp = slot(x, 0);
            *reinterpret_cast<float4*>(pp + d0) = acc;
            if (d0 == 0) *reinterpret_cast<float2*>(pp + DP) = make_float2(ML[2 * r], ML[2 * r + 1]);
        }
    }
}

template <typename T, int DP, u32 THREADS>
__device__ __forceinline__ void adec_merge_last(float* __restrict__ part, T* __restrict__ out, u32* __restrict__ sync,
                                                float* __restrict__ sm, u32 tile, u32 z, u32 za, u32 zb, u32 nzg,
                                                u32 m0, u32 m_last, u32 group, u32 kh, u32 heads, u32 qcap, u32 s,
                                                u32 row0, u32 pos0, u32 window, u32 ksl, bool ovec) {
    if (za >= zb) return;  // one working split: every row of the tile is written
    const u32 tid = threadIdx.x;
    const u32 ngm = (nzg + ADEC_G - 1) / ADEC_G;
    u32* cnt = sync + (u64)tile * (ngm + 1);
    u32* flag = reinterpret_cast<u32*>(sm);
    float* scratch = sm + 4;
    const u32 g = z / ADEC_G, ga = za / ADEC_G, gb = zb / ADEC_G;
    // Whether this block is the last to count itself in word `w` of `expect`.
    const auto last_of = [&](u32 w, u32 expect) {
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            const u32 old = atomicAdd(cnt + w, 1u);
            const bool last = old + 1 == expect;
            if (last) cnt[w] = 0;  // every other block of the word has counted itself
            *flag = last;
        }
        __syncthreads();
        const bool last = *flag != 0;
        if (last) __threadfence();
        return last;
    };
    const u32 in_group = min(zb, g * ADEC_G + ADEC_G - 1) - max(za, g * ADEC_G) + 1;
    if (!last_of(g, in_group)) return;
    adec_merge_level<T, DP, THREADS, false>(part, out, scratch, g, nzg, m0, m_last, group, kh, heads, qcap, s, row0,
                                            pos0, window, ksl, ovec);
    if (ga == gb || !last_of(ngm, gb - ga + 1)) return;
    adec_merge_level<T, DP, THREADS, true>(part, out, scratch, 0, nzg, m0, m_last, group, kh, heads, qcap, s, row0,
                                           pos0, window, ksl, ovec);
}

// Merges the partials of the split rows: one block of ADEC_CTHREADS per (row i < qcap of
// sequence s, head h), grid (qcap * heads, n_seqs); rows finished by one split exit. M =
// max m_z, L = Σ l_z·2^(m_z − M), O = Σ part_z · 2^(m_z − M) / L, the weights in increasing z
// by every thread alike; thread (grp, c) sums dims 4c..4c+3 over z ≡ grp (mod NG), then the NG
// group sums are added in group order: the order depends on the row's own splits only.
template <typename T, int DP>
__device__ __forceinline__ void adec_combine_impl(const float* __restrict__ part, const u32* __restrict__ spans,
                                                  T* __restrict__ out, u32 t, u32 heads, u32 window, u32 qcap,
                                                  u32 nzg, u32 ks_min_log2, u32 nsplit_log2) {
    constexpr u32 CG = DP / 4;                // threads of a z group (4 dims each)
    constexpr u32 NG = ADEC_CTHREADS / CG;    // z groups
    constexpr u32 PS = DP + 4;
    __shared__ float sm[ADEC_MAXZ], sw[ADEC_MAXZ];
    __shared__ __align__(16) float red[NG][DP];
    const u32 tid = threadIdx.x;
    const u32 s = blockIdx.y, i = blockIdx.x / heads, h = blockIdx.x % heads;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    if (qlen > ATT_SPLIT_Q || i >= min(qlen, qcap) || row0 >= t || i >= t - row0) return;
    const u32 ksl = adec_ks_log2((u64)pos0 + qlen, ks_min_log2, nsplit_log2);
    const u32 p = pos0 + i;
    const u32 zlo = adec_lo(p, window) >> ksl, zhi = min(p >> ksl, nzg - 1);
    if (zlo >= zhi) return;
    const u32 n = zhi - zlo + 1;  // <= nzg <= ADEC_MAXZ
    const float* base = part + (((u64)s * qcap + i) * heads + h) * nzg * PS + (u64)zlo * PS;
    for (u32 k = tid; k < n; k += ADEC_CTHREADS) {
        const float2 ml = *reinterpret_cast<const float2*>(base + (u64)k * PS + DP);
        sm[k] = ml.x;
        sw[k] = ml.y;
    }
    __syncthreads();
    float M = PORTER_NEG_INF;
    for (u32 k = 0; k < n; ++k) M = fmaxf(M, sm[k]);
    float L = 0.0f;
    for (u32 k = 0; k < n; ++k) L = fmaf(sw[k], exp2f(sm[k] - M), L);
    __syncthreads();
    for (u32 k = tid; k < n; k += ADEC_CTHREADS) sw[k] = exp2f(sm[k] - M) / L;
    __syncthreads();
    const u32 grp = tid / CG, c = tid % CG;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (u32 k = grp; k < n; k += NG) {
        const float4 v = *reinterpret_cast<const float4*>(base + (u64)k * PS + 4 * c);
        const float w = sw[k];
        acc.x = fmaf(v.x, w, acc.x);
        acc.y = fmaf(v.y, w, acc.y);
        acc.z = fmaf(v.z, w, acc.z);
        acc.w = fmaf(v.w, w, acc.w);
    }
    *reinterpret_cast<float4*>(&red[grp][4 * c]) = acc;
    __syncthreads();
    T* o = out + ((u64)(row0 + i) * heads + h) * DP;
    for (u32 d = tid; d < DP; d += ADEC_CTHREADS) {
        float x = 0.0f;
#pragma unroll
        for (u32 gq = 0; gq < NG; ++gq) x += red[gq][d];
        o[d] = from_f<T>(x);
    }
}

// The V2 combine (PORTER_ATTN_DECODE=mma4): one block of ADEC_CTHREADS per (row i of
// sequence s, head h, 64 dims d0..d0+63), grid (qcap * heads, DP / 64, n_seqs): 4x the
// blocks of adec_combine, and every partial load of a thread issued before its first use
// (thread (zq, c) loads dims d0+4c..+3 of splits k = zq + 16j, j < 16; thread k the (m, l)
// of split k), so one block costs about two L2 round trips instead of one per 4 splits.
// M = max m_k (exact), L = Σ l_k·2^(m_k − M) by a fixed tree over k (warp xor tree, then
// the 8 warps in order), O = Σ part_k · 2^(m_k − M) / L: each (zq) sums its splits in
// increasing k, the 16 sums added in zq order. k = z − zlo and n depend on the row's own
// sequence only: batch invariant, bit-identical rows.
//
// The spans (host metadata, never written by the split kernel, the launch before) and the
// row's split range are read before porter_pdl_enter(), so that after the wait a block goes
// straight to the partials' loads; every block passes the wait (also those with nothing to
// merge), so that the combine grid never completes before the split grid.
template <typename T, int DP>
__device__ __forceinline__ void adec_combine2_pdl(const float* __restrict__ part, const u32* __restrict__ spans,
                                                  T* __restrict__ out, u32 t, u32 heads, u32 window, u32 qcap,
                                                  u32 nzg, u32 ks_min_log2, u32 nsplit_log2) {
    constexpr u32 PS = DP + 4;
    constexpr u32 ZL = 16;                    // split lanes (zq)
    constexpr u32 NJ = ADEC_MAXZ / ZL;        // splits a thread may load
    constexpr u32 NWARP = ADEC_CTHREADS / 32;
    static_assert(ADEC_CTHREADS == ZL * 16 && ADEC_MAXZ <= ADEC_CTHREADS, "combine2 layout");
    __shared__ float sw[ADEC_MAXZ];
    __shared__ float rm[NWARP], rl[NWARP];
    __shared__ __align__(16) float red[ZL][64];
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 s = blockIdx.z, i = blockIdx.x / heads, h = blockIdx.x % heads, d0 = blockIdx.y * 64u;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    const bool none = qlen > ATT_SPLIT_Q || i >= min(qlen, qcap) || row0 >= t || i >= t - row0;
    const u32 ksl = adec_ks_log2((u64)pos0 + qlen, ks_min_log2, nsplit_log2);
    const u32 p = pos0 + i;
    const u32 zlo = adec_lo(p, window) >> ksl, zhi = min(p >> ksl, nzg - 1);
    porter_pdl_enter();
    if (none || zlo >= zhi) return;
    const u32 n = zhi - zlo + 1;  // <= nzg <= ADEC_MAXZ
    const float* base = part + (((u64)s * qcap + i) * heads + h) * nzg * PS + (u64)zlo * PS;
    const u32 zq = tid / 16u, c = tid % 16u;
    float4 v[NJ];
#pragma unroll
    for (u32 j = 0; j < NJ; ++j) {
        const u32 k = zq + ZL * j;
        v[j] = k < n ? *reinterpret_cast<const float4*>(base + (u64)k * PS + d0 + 4u * c)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float mk = PORTER_NEG_INF, lk = 0.0f;
    if (tid < n) {
        const float2 ml = *reinterpret_cast<const float2*>(base + (u64)tid * PS + DP);
        mk = ml.x;
        lk = ml.y;
    }
    float M = mk;
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) rm[warp] = M;
    __syncthreads();
    M = rm[0];
#pragma unroll
    for (u32 w = 1; w < NWARP; ++w) M = fmaxf(M, rm[w]);
    const float wk = tid < n ? exp2f(mk - M) : 0.0f;
    float L = lk * wk;
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0) rl[warp] = L;
    __syncthreads();
    L = rl[0];
#pragma unroll
    for (u32 w = 1; w < NWARP; ++w) L += rl[w];
    if (tid < ADEC_MAXZ) sw[tid] = wk / L;
    __syncthreads();
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (u32 j = 0; j < NJ; ++j) {
        const u32 k = zq + ZL * j;
        if (k < n) {
            const float w = sw[k];
            acc.x = fmaf(v[j].x, w, acc.x);
            acc.y = fmaf(v[j].y, w, acc.y);
            acc.z = fmaf(v[j].z, w, acc.z);
            acc.w = fmaf(v[j].w, w, acc.w);
        }
    }
    *reinterpret_cast<float4*>(&red[zq][4 * c]) = acc;
    __syncthreads();
    if (tid < 64u) {
        float x = 0.0f;
#pragma unroll
        for (u32 gq = 0; gq < ZL; ++gq) x += red[gq][tid];
        out[((u64)(row0 + i) * heads + h) * DP + d0 + tid] = from_f<T>(x);
    }
}

// Names: attention_decode_<T>_d<DP>_s<ST>[_w2][_v2] (4 warps, one block an SM at DP = 256;
// _w2: 2 warps, two blocks an SM, so that one block's merge overlaps the other's loads;
// _v2: Q by cp.async and two tiles of table lookahead), attention_decode_combine_<T>_d<DP>
// and attention_decode_combine2_<T>_d<DP> (the V2 combine, grid y = DP / 64).
#define ADEC_KERNEL(T, NAME, DP, ST, NW, W, V2, VS)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * NW, 4 / NW) attention_decode_##NAME##_d##DP##_s##ST##W##VS( \
        const T* q, const T* kpool, const T* vpool, const u32* tables, const u32* spans, T* out, float* part,     \
        u32* sync, u32 t, u32 heads, u32 kvh, float scale, u32 window, u32 max_blocks, u32 bs_log2, u32 n_slots,  \
        u32 qcap, u32 nzg, u32 ks_min_log2, u32 nsplit_log2, u32 flags) {                                          \
        adec_pdl<T, DP, ST, NW, V2>(q, kpool, vpool, tables, spans, out, part, sync, t, heads, kvh, scale, window,\
                                    PagedKv{max_blocks, bs_log2, n_slots}, qcap, nzg, ks_min_log2, nsplit_log2,   \
                                    V2 ? flags : flags & ~ADEC_PRE);                                              \
    }
#define ADEC_COMBINE(T, NAME, DP)                                                                             \
    extern "C" __global__ void __launch_bounds__(256) attention_decode_combine_##NAME##_d##DP(                \
        const float* part, const u32* spans, T* out, u32 t, u32 heads, u32 window, u32 qcap, u32 nzg,         \
        u32 ks_min_log2, u32 nsplit_log2) {                                                                   \
        porter_pdl_enter();                                                                                   \
        adec_combine_impl<T, DP>(part, spans, out, t, heads, window, qcap, nzg, ks_min_log2, nsplit_log2);    \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) attention_decode_combine2_##NAME##_d##DP(               \
        const float* part, const u32* spans, T* out, u32 t, u32 heads, u32 window, u32 qcap, u32 nzg,         \
        u32 ks_min_log2, u32 nsplit_log2) {                                                                   \
        adec_combine2_pdl<T, DP>(part, spans, out, t, heads, window, qcap, nzg, ks_min_log2, nsplit_log2);    \
    }
#define ADEC_DP(T, NAME, DP)                                  \
    ADEC_KERNEL(T, NAME, DP, 2, 4, , false, )                 \
    ADEC_KERNEL(T, NAME, DP, 3, 4, , false, )                 \
    ADEC_KERNEL(T, NAME, DP, 3, 2, _w2, false, )              \
    ADEC_KERNEL(T, NAME, DP, 3, 4, , true, _v2)               \
    ADEC_KERNEL(T, NAME, DP, 3, 2, _w2, true, _v2)            \
    ADEC_COMBINE(T, NAME, DP)
#define ADEC_ALL(T, NAME)   \
    ADEC_DP(T, NAME, 64)    \
    ADEC_DP(T, NAME, 128)   \
    ADEC_DP(T, NAME, 256)

ADEC_ALL(bf16, bf16)
ADEC_ALL(f16, f16)
