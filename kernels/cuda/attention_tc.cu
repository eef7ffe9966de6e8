// Causal GQA attention, tensor-core prefill path: appended to attention.cu (same module,
// kernels/src/cuda/compile.rs), whose helpers, constants and tile conventions it uses.

// ---------------------------------------------------------------------------
// Attention, tensor-core prefill path (bf16 / f16, head_dim a multiple of 16)
// ---------------------------------------------------------------------------
//
// FlashAttention-2 over the same items as attention_impl: a block (ATC_THREADS
// = 4 warps) takes ATC_BM = 64 items (query row, query head of the group) of
// one sequence and one KV head, ordered row-major, so the heads of a GQA group
// share the K/V tiles. Warp w owns items 16w..16w+15 of the tile. The Q tile
// (64 x DP, DP = head_dim padded to 64, 128 or 256, zeros beyond head_dim)
// stays in shared memory; 64-key K/V tiles are staged with cp.async into two
// buffers (the next tile loads while this one is used). Per tile and warp:
// S = Q·Kᵀ on tensor cores (wmma 16x16x16, f32 accumulators) into the warp's
// f32 S tile in shared memory; scale, mask (causal, window, the block's key
// range) and the online softmax in f32 by lanes (lane = row (lane/2), half of
// the columns (lane%2)); P rounded to T once into the warp's P tile; the O
// fragments (16 x DP f32, registers) rescaled per row; O += P·V on tensor cores.
// The row of each accumulator-fragment element is found once by loading a
// matrix of row indices into a fragment (the element-to-(row, column) mapping
// of a fragment type is fixed). At the end O / l goes through the S tile to
// global memory, rounded to T once. Key tiles wholly outside a warp's causal /
// window range are skipped by that warp, and those outside the block's by the
// block. K/V rows outside the block's key range, Q rows beyond the span and
// columns beyond head_dim are zero-filled (never read from global memory).
//
// Dynamic shared memory (bytes): (ATC_BM + 4 * ATC_BN) * (DP + 8) * sizeof(T)
// + ATC_WARPS * 16 * (ATC_SS * 4 + 2 * ATC_PSS * sizeof(T) + 4) + 2 * ATC_BN * 4
// (two key-slot tables). Keys are paged as in attention_impl (one slot lookup per
// key, so a tile may cross cache blocks: any power-of-two block size works).
// P is split as P = P_hi + P_lo (both T; P_lo = round(p − P_hi)) and P·V runs as
// two MMAs, so that the probabilities keep ~16 bits: with P in bf16 alone the
// attention output drifts by about one bf16 step from the f32 reference, which is
// enough to cost the whole bf16 parity margin on small models.

#define ATC_THREADS 128
#define ATC_WARPS 4
#define ATC_BM 64
#define ATC_BN 64
#define ATC_SS 72   // f32 row stride of a warp's S tile
#define ATC_PSS 72  // T row stride of a warp's P tile

#if defined(PORTER_SM80)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ unsigned short bits16(bf16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ unsigned short bits16(f16 x) { return __half_as_ushort(x); }

// 8 elements (16 bytes) global -> shared: cp.async when `async` (both
// addresses 16-byte aligned), else element-wise; zeros when !valid (src is then
// not read).
template <typename T>
__device__ __forceinline__ void atc_load8(T* dst, const T* src, bool valid, bool async) {
    if (async) {
        cp_async16(dst, src, valid);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = valid ? src[e] : from_f<T>(0.0f);
    }
}
#endif

// Grid: (item tiles, n_seqs * kv_heads). D % 16 == 0, D <= DP.
// KQ as in attention_impl: quantized K/V tiles are dequantized to T as they are
// stored to shared memory (plain loads instead of cp.async).
template <typename T, int KQ, int DP>
__device__ __forceinline__ void attention_tc_impl(const T* __restrict__ q, const void* __restrict__ kpool_,
                                                  const void* __restrict__ vpool_, const u32* __restrict__ tables,
                                                  const u32* __restrict__ spans, T* __restrict__ out, u32 t,
                                                  u32 heads, u32 kvh, u32 D, float scale, u32 window, PagedKv kv,
                                                  const float* __restrict__ ksc, const float* __restrict__ vsc) {
    const T* kpool = reinterpret_cast<const T*>(kpool_);
    const T* vpool = reinterpret_cast<const T*>(vpool_);
    const unsigned char* kq = reinterpret_cast<const unsigned char*>(kpool_);
    const unsigned char* vq = reinterpret_cast<const unsigned char*>(vpool_);
#if defined(PORTER_SM80)
    using namespace nvcuda;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;
    typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> FragA;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> FragBt;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> FragB;
    constexpr int BM = ATC_BM;
    constexpr int BN = ATC_BN;
    constexpr int LD = DP + 8;  // T row stride of the Q / K / V tiles
    constexpr int NF = DP / 16; // O fragments per warp
    constexpr int CH = DP / 8;  // 16-byte chunks per row
    constexpr int FE = FragC::num_elements;
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(128) unsigned char atc_smem[];

    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    T* Qs = reinterpret_cast<T*>(atc_smem);
    T* Kb = Qs + BM * LD;      // [2][BN][LD]
    T* Vb = Kb + 2 * BN * LD;  // [2][BN][LD]
    float* Sall = reinterpret_cast<float*>(Vb + 2 * BN * LD);
    T* Pall = reinterpret_cast<T*>(Sall + ATC_WARPS * 16 * ATC_SS);
    T* Plall = Pall + ATC_WARPS * 16 * ATC_PSS;
    float* Call = reinterpret_cast<float*>(Plall + ATC_WARPS * 16 * ATC_PSS);
    float* Sw = Sall + warp * 16 * ATC_SS;
    T* Pw = Pall + warp * 16 * ATC_PSS;
    T* Plw = Plall + warp * 16 * ATC_PSS;
    float* Cw = Call + warp * 16;
    u32* Sl = reinterpret_cast<u32*>(Call + ATC_WARPS * 16);  // [2][BN] key slots

    const u32 s = blockIdx.y / kvh, kh = blockIdx.y % kvh;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    const u32 group = heads / kvh;
    const u32 rows_in = row0 < t ? min(qlen, t - row0) : 0;  // rows < t only
    const u32 n_items = rows_in * group;
    // Heaviest (latest) item tiles first.
    const u32 m0 = (gridDim.x - 1 - blockIdx.x) * BM;
    if (m0 >= n_items) return;
    const u32 m_last = min(m0 + (u32)BM, n_items) - 1;
    const u32 p_first = pos0 + m0 / group, p_last = pos0 + m_last / group;
    const u32 lo_first = (window != 0 && p_first + 1 > window) ? p_first + 1 - window : 0;
    const u32 jt0 = lo_first / BN, jt1 = p_last / BN;

    const u32* bt = tables + (u64)s * kv.max_blocks;
    const bool async =
        ((reinterpret_cast<u64>(kpool) | reinterpret_cast<u64>(vpool) | reinterpret_cast<u64>(q)) & 15u) == 0;
    const u64 kv_stride = (u64)kvh * D;

    // Q tile.
    for (u32 c = tid; c < (u32)(BM * CH); c += ATC_THREADS) {
        const u32 slot = c / CH, d0 = (c % CH) * 8;
        const u32 m = m0 + slot;
        const bool ok = m <= m_last && d0 < D;
        const T* src = q;
        if (ok) src = q + ((u64)(row0 + m / group) * heads + kh * group + m % group) * D + d0;
        atc_load8(Qs + slot * LD + d0, src, ok, async);
    }
    // Tile jt's K/V into buffer `buf`, through slot table `buf` (tile jt's slots).
    auto load_kv = [&](u32 jt, u32 buf) {
        T* kd = Kb + buf * BN * LD;
        T* vd = Vb + buf * BN * LD;
        const u32* sl = Sl + buf * BN;
        const u32 kbase = jt * BN;
        for (u32 c = tid; c < (u32)(BN * CH); c += ATC_THREADS) {
            const u32 j = c / CH, d0 = (c % CH) * 8;
            const u32 kpos = kbase + j;
            const u32 ks = sl[j];
            const bool ok = kpos >= lo_first && kpos <= p_last && d0 < D && ks != ATT_NOSLOT;
            const u64 off = ok ? (u64)ks * kv_stride + (u64)kh * D + d0 : 0;
            if constexpr (KQ != 0) {
                const u64 si = ok ? (u64)ks * kvh + kh : 0;
                const float ksv = ok ? __ldg(ksc + si) : 0.0f, vsv = ok ? __ldg(vsc + si) : 0.0f;
                kvq_load8<T, KQ>(kd + j * LD + d0, kq + off, ksv, ok);
                kvq_load8<T, KQ>(vd + j * LD + d0, vq + off, vsv, ok);
            } else {
                atc_load8(kd + j * LD + d0, kpool + off, ok, async);
                atc_load8(vd + j * LD + d0, vpool + off, ok, async);
            }
        }
    };
    // Slot tables of the first two tiles; tile jt + 2's is filled during tile jt.
    if (tid < (u32)BN) {
        Sl[tid] = key_slot(bt, jt0 * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
        if (jt0 < jt1) Sl[BN + tid] = key_slot(bt, (jt0 + 1) * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
    }
    __syncthreads();
    load_kv(jt0, 0);
    cp_async_commit();

    // This lane's softmax row and the warp's item range.
    const u32 r = lane >> 1, hh = lane & 1u;
    const u32 mw0 = m0 + warp * 16;
    const bool warp_any = mw0 <= m_last;
    const u32 wm_last = min(mw0 + 15u, m_last);
    const u32 wp_first = pos0 + mw0 / group, wp_last = pos0 + wm_last / group;
    const u32 wlo = (window != 0 && wp_first + 1 > window) ? wp_first + 1 - window : 0;
    const u32 my_m = mw0 + r;
    const bool my_valid = my_m <= m_last;
    const u32 my_pos = pos0 + my_m / group;
    const u32 my_lo = (window != 0 && my_pos + 1 > window) ? my_pos + 1 - window : 0;
    const float sl2 = scale * LOG2E;
    float m_run = PORTER_NEG_INF, l_run = 0.0f;

    // Row of each accumulator-fragment element.
    int rid[FE];
    for (u32 e = lane; e < 256u; e += 32u) Sw[(e >> 4) * ATC_SS + (e & 15u)] = (float)(e >> 4);
    __syncwarp();
    {
        FragC t;
        wmma::load_matrix_sync(t, Sw, ATC_SS, wmma::mem_row_major);
#pragma unroll
        for (int i = 0; i < FE; ++i) rid[i] = (int)t.x[i];
    }
    __syncwarp();

    FragC ofr[NF];
#pragma unroll
    for (int f = 0; f < NF; ++f) wmma::fill_fragment(ofr[f], 0.0f);

    for (u32 jt = jt0; jt <= jt1; ++jt) {
        const u32 buf = (jt - jt0) & 1u;
        if (jt < jt1) load_kv(jt + 1, buf ^ 1u);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        // Slot table `buf` was last read by load_kv(jt), issued before this barrier.
        if (jt + 2 <= jt1 && tid < (u32)BN)
            Sl[buf * BN + tid] = key_slot(bt, (jt + 2) * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
        const u32 kbase = jt * BN;
        if (warp_any && kbase <= wp_last && kbase + BN - 1 >= wlo) {
            const T* Kt = Kb + buf * BN * LD;
            const T* Vt = Vb + buf * BN * LD;
            // S = Q Kᵀ (16 x 64 per warp).
            FragC sf[4];
#pragma unroll
            for (int n = 0; n < 4; ++n) wmma::fill_fragment(sf[n], 0.0f);
#pragma unroll
            for (int kk = 0; kk < DP / 16; ++kk) {
                if (kk * 16 < (int)D) {
                    FragA af;
                    wmma::load_matrix_sync(af, Qs + warp * 16 * LD + kk * 16, LD);
#pragma unroll
                    for (int n = 0; n < 4; ++n) {
                        FragBt bf;
                        wmma::load_matrix_sync(bf, Kt + n * 16 * LD + kk * 16, LD);
                        wmma::mma_sync(sf[n], af, bf, sf[n]);
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < 4; ++n) wmma::store_matrix_sync(Sw + n * 16, sf[n], ATC_SS, wmma::mem_row_major);
            __syncwarp();

            // Mask and online softmax (log2 domain) of row r, columns 8k + 4hh + e:
            // a pass for the row max, a second one (S re-read) for P and its sum.
            auto masked = [&](u32 c, float v) {
                const u32 kpos = kbase + c;
                return (my_valid && kpos >= my_lo && kpos <= my_pos) ? v * sl2 : PORTER_NEG_INF;
            };
            float mx = PORTER_NEG_INF;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const u32 c0 = 8 * k + 4 * hh;
                const float4 v = *reinterpret_cast<const float4*>(Sw + r * ATC_SS + c0);
                mx = fmaxf(mx, fmaxf(fmaxf(masked(c0, v.x), masked(c0 + 1, v.y)),
                                     fmaxf(masked(c0 + 2, v.z), masked(c0 + 3, v.w))));
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float m_new = fmaxf(m_run, mx);
            // A row with no unmasked key yet keeps O = 0, l = 0 (P = 0, corr = 1).
            const bool none = m_new == PORTER_NEG_INF;
            const float corr = none ? 1.0f : exp2f(m_run - m_new);
            float psum = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const u32 c0 = 8 * k + 4 * hh;
                const float4 v = *reinterpret_cast<const float4*>(Sw + r * ATC_SS + c0);
                const float p0 = none ? 0.0f : exp2f(masked(c0, v.x) - m_new);
                const float p1 = none ? 0.0f : exp2f(masked(c0 + 1, v.y) - m_new);
                const float p2 = none ? 0.0f : exp2f(masked(c0 + 2, v.z) - m_new);
                const float p3 = none ? 0.0f : exp2f(masked(c0 + 3, v.w) - m_new);
                psum += (p0 + p1) + (p2 + p3);
                const T h0 = from_f<T>(p0), h1 = from_f<T>(p1), h2 = from_f<T>(p2), h3 = from_f<T>(p3);
                const u32 lo = (u32)bits16(h0) | ((u32)bits16(h1) << 16);
                const u32 hi = (u32)bits16(h2) | ((u32)bits16(h3) << 16);
                *reinterpret_cast<uint2*>(Pw + r * ATC_PSS + c0) = make_uint2(lo, hi);
                const u32 lo2 = (u32)bits16(from_f<T>(p0 - to_f(h0))) | ((u32)bits16(from_f<T>(p1 - to_f(h1))) << 16);
                const u32 hi2 = (u32)bits16(from_f<T>(p2 - to_f(h2))) | ((u32)bits16(from_f<T>(p3 - to_f(h3))) << 16);
                *reinterpret_cast<uint2*>(Plw + r * ATC_PSS + c0) = make_uint2(lo2, hi2);
            }
            psum += __shfl_xor_sync(0xffffffffu, psum, 1);
            m_run = m_new;
            l_run = l_run * corr + psum;
            if (hh == 0) Cw[r] = corr;
            __syncwarp();

            // O = O * corr + P V.
            float cf[FE];
#pragma unroll
            for (int i = 0; i < FE; ++i) cf[i] = Cw[rid[i]];
#pragma unroll
            for (int f = 0; f < NF; ++f)
#pragma unroll
                for (int i = 0; i < FE; ++i) ofr[f].x[i] *= cf[i];
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                FragA pf, plf;
                wmma::load_matrix_sync(pf, Pw + kk * 16, ATC_PSS);
                wmma::load_matrix_sync(plf, Plw + kk * 16, ATC_PSS);
#pragma unroll
                for (int f = 0; f < NF; ++f) {
                    if (f * 16 < (int)D) {
                        FragB vf;
                        wmma::load_matrix_sync(vf, Vt + kk * 16 * LD + f * 16, LD);
                        wmma::mma_sync(ofr[f], plf, vf, ofr[f]);
                        wmma::mma_sync(ofr[f], pf, vf, ofr[f]);
                    }
                }
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    if (!warp_any) return;

    // O / l through the S tile, 16 x 64 at a time; lane: row r, columns 32hh..32hh+31.
    if (hh == 0) Cw[r] = l_run > 0.0f ? 1.0f / l_run : 0.0f;
    __syncwarp();
    const float inv = Cw[r];
    const bool ovec = (reinterpret_cast<u64>(out) & 15u) == 0;
    T* orow = out + ((u64)(row0 + my_m / group) * heads + kh * group + my_m % group) * D;
#pragma unroll
    for (int fb = 0; fb < NF; fb += 4) {
#pragma unroll
        for (int n = 0; n < 4; ++n) wmma::store_matrix_sync(Sw + n * 16, ofr[fb + n], ATC_SS, wmma::mem_row_major);
        __syncwarp();
        if (my_valid) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const u32 c0 = 32 * hh + 8 * k;
                const u32 d = fb * 16 + c0;
                if (d < D) {
                    const float4 a = *reinterpret_cast<const float4*>(Sw + r * ATC_SS + c0);
                    const float4 b = *reinterpret_cast<const float4*>(Sw + r * ATC_SS + c0 + 4);
                    const float vv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    if (ovec) {
                        u32 w[4];
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            w[e] = (u32)bits16(from_f<T>(vv[2 * e] * inv)) |
                                   ((u32)bits16(from_f<T>(vv[2 * e + 1] * inv)) << 16);
                        *reinterpret_cast<uint4*>(orow + d) = make_uint4(w[0], w[1], w[2], w[3]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; ++e) orow[d + e] = from_f<T>(vv[e] * inv);
                    }
                }
            }
        }
        __syncwarp();
    }
#else
    // Fallback build (below sm_80 or PORTER_FALLBACK): the host never launches this kernel.
    __trap();
#endif
}

// Name: attention_tc_<NAME><QN>_d<DP>, QN as in ATTENTION_RCQ.
#define ATTENTION_TCQ(T, NAME, KQ, QN, DP)                                                                     \
    extern "C" __global__ void __launch_bounds__(128, 1) attention_tc_##NAME##QN##_d##DP(                       \
        const T* q, const void* kpool, const void* vpool, const u32* tables, const u32* spans, T* out, u32 t,  \
        u32 heads, u32 kvh, u32 D, float scale, u32 window, u32 max_blocks, u32 bs_log2, u32 n_slots,          \
        const float* ksc, const float* vsc) { porter_pdl_enter();                                                                  \
        attention_tc_impl<T, KQ, DP>(q, kpool, vpool, tables, spans, out, t, heads, kvh, D, scale, window,     \
                                     PagedKv{max_blocks, bs_log2, n_slots}, ksc, vsc);                         \
    }
#define ATTENTION_TC(T, NAME, DP)              \
    ATTENTION_TCQ(T, NAME, 0, , DP)            \
    ATTENTION_TCQ(T, NAME, KVQ_FP8, _fp8, DP)  \
    ATTENTION_TCQ(T, NAME, KVQ_I8, _i8, DP)

#define ATTENTION_TC_ALL(T, NAME) \
    ATTENTION_TC(T, NAME, 64)     \
    ATTENTION_TC(T, NAME, 128)    \
    ATTENTION_TC(T, NAME, 256)

#ifndef PORTER_ATTN_HELPERS_ONLY  // the mma module (attention_mma.cu) takes the helpers only
ATTENTION_TC_ALL(bf16, bf16)
ATTENTION_TC_ALL(f16, f16)
#endif

