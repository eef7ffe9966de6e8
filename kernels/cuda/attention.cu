// Causal GQA attention over a paged KV cache, KV append, and on-device sampling
// (kernels/src/cuda/attention.rs has the launch wrappers).
//
// KV cache: one pool per layer, k_pool / v_pool laid out [n_slots, kv_heads,
// head_dim] of T; a slot is one token row, slot = block * block_size + offset.
// Sequence s maps its key position j to slot block_tables[s * max_blocks + (j >>
// bs_log2)] * block_size + (j & (block_size - 1)) (block_size a power of two). A
// key whose block index is >= max_blocks or whose slot is >= n_slots is read as
// zeros (never from memory): out-of-contract tables cannot make the kernels read
// outside the pools.
//
// Attention (cpu::ops::causal_attention per sequence): one block takes a tile
// of BM "items" of one sequence and one KV head, an item being a (query row,
// query head of the KV head's group) pair, items ordered row-major (so decode
// packs the whole GQA group into one tile and K/V are read once per group). The
// block walks 64-key tiles staged in shared memory (storage type T) with an
// online softmax in f32; key tiles outside the causal / window range of the
// tile are never visited. The slots of a tile's 64 keys are looked up once, into
// a shared table (two of them: the next tile's is filled while this one is used).
//
// Batch invariance: a row's arithmetic depends only on its own sequence. A
// sequence with q_len <= ATT_SPLIT_Q (decode, draft verification) is split-K
// (flash-decoding) at fixed absolute key boundaries: split z covers key
// positions [z * ATT_KS, (z + 1) * ATT_KS). A row whose keys lo..=p lie in one
// split is finished by that split's block; otherwise each of its splits
// z = lo / ATT_KS ..= p / ATT_KS writes an unnormalised partial (acc[D], running
// max, running sum) and `attention_combine` merges them in increasing z. Longer
// sequences are not split. Tiles a row does not attend (the block's range is the
// union of its items') leave its state bit-identical (corr = 1, p = 0), and the
// item-tile height RA does not change an item's arithmetic (explicit fmaf /
// __fmul_rn, the same order of operations for every RA).
//
// Thread layout (128 threads): ti = tid / 16 (0..7), tj = tid % 16. Thread
// (ti, tj) owns items ti + 8a (a < RA), scores of keys tj + 16b (b < BN / 16), and
// output dimensions tj*4 + 64c + e (c < NC, e < 4). Rows of a 16-lane half warp
// share the item rows, so row reductions are 4 xor-shuffles.
//
// Key tile BN: 64, or 32 / 16 (RA = 1 only) where the 64-key tile needs more shared
// memory than the device has (f32 at head_dim 129..256, or 16-bit at 193..256 on a
// 64 KiB sm_75: docs/older-gpus.md). BN is chosen from the dtype, head_dim and the
// device alone, never from the batch, so batch invariance holds on a given device;
// a smaller BN changes where the online softmax rescales, i.e. rounding only.

#include <mma.h>

#define ATT_THREADS 128
#define ATT_BN 64       // the widest key tile (BN)
#define ATT_SPLIT_Q 8   // longest q_len that is split-K
#define ATT_KS 128      // keys per split (a multiple of ATT_BN and of ATC_BN)
#define ATT_NOSLOT 0xffffffffu

// ---------------------------------------------------------------------------
// KV append
// ---------------------------------------------------------------------------

// Row r goes to slot slots[r]; ATT_NOSLOT (padding) and slots >= n_slots are skipped.
template <typename T>
__device__ __forceinline__ void kv_append_impl(const T* __restrict__ k, const T* __restrict__ v,
                                               const u32* __restrict__ slots, T* __restrict__ kp,
                                               T* __restrict__ vp, u32 t, u32 row_len, u32 n_slots) {
    const u64 n = (u64)t * row_len;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (u64)gridDim.x * blockDim.x) {
        const u32 r = (u32)(idx / row_len), c = (u32)(idx % row_len);
        const u32 slot = slots[r];
        if (slot >= n_slots) continue;
        const u64 dst = (u64)slot * row_len + c;
        kp[dst] = k[idx];
        vp[dst] = v[idx];
    }
}

// ---------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------

// The pool slot of key position `kpos` of the sequence whose block-table row is
// `bt`, or ATT_NOSLOT when the table or the pool does not hold it.
__device__ __forceinline__ u32 key_slot(const u32* __restrict__ bt, u32 kpos, u32 max_blocks, u32 bs_log2,
                                        u32 n_slots) {
    const u32 jb = kpos >> bs_log2;
    if (jb >= max_blocks) return ATT_NOSLOT;
    const u64 slot = ((u64)__ldg(bt + jb) << bs_log2) + (kpos & ((1u << bs_log2) - 1u));
    return slot < n_slots ? (u32)slot : ATT_NOSLOT;
}

// Four consecutive elements of shared memory as f32 (aligned to 4 elements).
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 ld4(const bf16* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}
__device__ __forceinline__ float4 ld4(const f16* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

// Copies 4 elements global -> shared. `full`: all 4 exist and src is aligned to
// 4 elements; otherwise element-wise with `n` (< 4 when partial) valid ones,
// zeros after.
template <typename T>
__device__ __forceinline__ void copy4(T* dst, const T* src, u32 n, bool vec) {
    if (vec && n >= 4) {
        if constexpr (sizeof(T) == 4) {
            *reinterpret_cast<float4*>(dst) = __ldg(reinterpret_cast<const float4*>(src));
        } else {
            *reinterpret_cast<uint2*>(dst) = __ldg(reinterpret_cast<const uint2*>(src));
        }
    } else {
#pragma unroll
        for (u32 e = 0; e < 4; ++e) dst[e] = e < n ? src[e] : from_f<T>(0.0f);
    }
}

// 4 elements global -> shared without waiting (cp.async on sm_80+, then
// `async4_wait` before the barrier; a plain copy4 below sm_80): `src` aligned to
// 4 elements, all 4 in range.
template <typename T>
__device__ __forceinline__ void async4(T* dst, const T* src) {
#if defined(PORTER_SM80)
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    if constexpr (sizeof(T) == 4) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
    }
#else
    copy4(dst, src, 4, true);
#endif
}

__device__ __forceinline__ void async4_wait() {
#if defined(PORTER_SM80)
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}

template <typename T>
__device__ __forceinline__ void zero4(T* dst) {
    if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(0u, 0u);
    }
}

__device__ __forceinline__ float max16(float v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float sum16(float v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The paged-cache arguments shared by the attention kernels.
struct PagedKv {
    u32 max_blocks, bs_log2, n_slots;
};

// Grid: (max(tiles_m, ceil(qcap * group / BM) * nz), n_seqs * kv_heads). A block
// x of a split sequence (q_len <= ATT_SPLIT_Q) takes item tile x % ts and split
// x / ts; of another sequence, item tile tiles_m - 1 - x (heaviest first).
// Partials: part[z][s * qcap + i][h][D + 2] (z < nz). Dynamic shared memory:
// (BM + 2*BN) * DS * sizeof(T) + BM * (BN + 16) * 4 + 2 * BN * 4 bytes.
// KQ: 0 pools of T; KVQ_FP8 / KVQ_I8 pools of bytes with scales ksc / vsc
// [n_slots][kvh] (kv_quant.cu), dequantized into the T tiles as they load.
template <typename T, int KQ, int RA, int NC, int BN>
__device__ __forceinline__ void attention_impl(const T* __restrict__ q, const void* __restrict__ kpool_,
                                               const void* __restrict__ vpool_, const u32* __restrict__ tables,
                                               const u32* __restrict__ spans, T* __restrict__ out,
                                               float* __restrict__ part, u32 t, u32 heads, u32 kvh, u32 D,
                                               float scale, u32 window, PagedKv kv, u32 tiles_m, u32 qcap, u32 nz,
                                               const float* __restrict__ ksc, const float* __restrict__ vsc) {
    const T* kpool = reinterpret_cast<const T*>(kpool_);
    const T* vpool = reinterpret_cast<const T*>(vpool_);
    const unsigned char* kq = reinterpret_cast<const unsigned char*>(kpool_);
    const unsigned char* vq = reinterpret_cast<const unsigned char*>(vpool_);
    constexpr u32 ESZ = KQ == 0 ? sizeof(T) : 1;  // pool element bytes
    constexpr int BM = 8 * RA;
    static_assert(BN == 64 || BN == 32 || BN == 16, "key tile");
    constexpr int NB = BN / 16;  // keys per thread
    constexpr int PS = BN + 16;  // row stride of the staged P tile (floats)
    constexpr int DP = 64 * NC;
    constexpr int DS = DP + 4;  // row stride (elements): conflict-free 4-element reads
    constexpr int G4 = DP / 4;  // 4-element groups per row
    constexpr u32 TPS = ATT_KS / BN;  // tiles per split
    extern __shared__ __align__(16) unsigned char att_smem[];
    T* Qs = reinterpret_cast<T*>(att_smem);
    T* Ks = Qs + BM * DS;
    T* Vs = Ks + BN * DS;
    float* Ps = reinterpret_cast<float*>(Vs + BN * DS);
    u32* Sl = reinterpret_cast<u32*>(Ps + BM * PS);  // [2][BN] key slots

    const u32 tid = threadIdx.x, tj = tid & 15u, ti = tid >> 4;
    const u32 s = blockIdx.y / kvh, kh = blockIdx.y % kvh;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    const u32 group = heads / kvh;
    const bool split = qlen <= ATT_SPLIT_Q;
    // Rows a launch can hold: q_len <= max_q_len and rows < t (out-of-contract spans
    // are clipped, never written outside `out` / `part`).
    const u32 rows = split ? min(qlen, qcap) : qlen;
    const u32 rows_in = row0 < t ? min(rows, t - row0) : 0;
    const u32 n_items = rows_in * group;
    u32 m0, z = 0;
    if (split) {
        const u32 ts = (qcap * group + BM - 1) / BM;
        z = blockIdx.x / ts;
        if (z >= nz) return;
        m0 = (blockIdx.x % ts) * BM;
    } else {
        if (blockIdx.x >= tiles_m) return;
        m0 = (tiles_m - 1 - blockIdx.x) * BM;
    }
    if (m0 >= n_items) return;
    const u32 m_last = min(m0 + (u32)BM, n_items) - 1;
    const u32 p_first = pos0 + m0 / group, p_last = pos0 + m_last / group;
    const u32 lo_first = (window != 0 && p_first + 1 > window) ? p_first + 1 - window : 0;
    u32 ta = lo_first / BN, tb = p_last / BN + 1;
    if (split) {
        ta = max(ta, z * TPS);
        tb = min(tb, (z + 1) * TPS);
        if (ta >= tb) return;
    }
    const u32* bt = tables + (u64)s * kv.max_blocks;

    const bool vec = (D % 4 == 0) && ((reinterpret_cast<u64>(kpool) | reinterpret_cast<u64>(vpool)) % (4 * ESZ) == 0) &&
                     reinterpret_cast<u64>(q) % (4 * sizeof(T)) == 0;

    // This thread's items; `wr`: 0 nothing, 1 the output, 2 a partial.
    bool iv[RA];
    u32 ipos[RA], ilo[RA], irow[RA], ih[RA], wr[RA];  // irow: the row within the span
#pragma unroll
    for (int a = 0; a < RA; ++a) {
        const u32 m = m0 + ti + 8 * a;
        iv[a] = m <= m_last;
        const u32 i = m / group, g = m % group;
        ipos[a] = pos0 + i;
        ilo[a] = (window != 0 && ipos[a] + 1 > window) ? ipos[a] + 1 - window : 0;
        irow[a] = i;
        ih[a] = kh * group + g;
        const u32 zlo = ilo[a] / ATT_KS, zhi = min(ipos[a] / ATT_KS, nz - 1);
        wr[a] = !iv[a] ? 0u : !split ? 1u : (z < zlo || z > zhi) ? 0u : zlo == zhi ? 1u : 2u;
    }

    // Q tile and the first tile's key slots.
    for (u32 gi = tid; gi < (u32)(BM * G4); gi += ATT_THREADS) {
        const u32 slot = gi / G4, d0 = (gi % G4) * 4;
        const u32 m = m0 + slot;
        T* dst = Qs + slot * DS + d0;
        if (m <= m_last && d0 < D) {
            const u32 i = m / group, h = kh * group + m % group;
            copy4(dst, q + ((u64)(row0 + i) * heads + h) * D + d0, D - d0, vec);
        } else {
            zero4(dst);
        }
    }
    if (tid < (u32)BN) Sl[tid] = key_slot(bt, ta * BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
    __syncthreads();

    float m_run[RA], l_run[RA], acc[RA][4 * NC];
#pragma unroll
    for (int a = 0; a < RA; ++a) {
        m_run[a] = PORTER_NEG_INF;
        l_run[a] = 0.0f;
#pragma unroll
        for (int c = 0; c < 4 * NC; ++c) acc[a][c] = 0.0f;
    }

    const u64 kv_stride = (u64)kvh * D;
    for (u32 jt = ta; jt < tb; ++jt) {
        const u32 kbase = jt * BN;
        const u32* sl = Sl + ((jt - ta) & 1u) * BN;
        // The next tile's slots (that table was last read before the previous tile's barriers).
        if (jt + 1 < tb && tid < (u32)BN)
            Sl[((jt + 1 - ta) & 1u) * BN + tid] =
                key_slot(bt, kbase + BN + tid, kv.max_blocks, kv.bs_log2, kv.n_slots);
        for (u32 gi = tid; gi < (u32)(BN * G4); gi += ATT_THREADS) {
            const u32 j = gi / G4, d0 = (gi % G4) * 4;
            const u32 kpos = kbase + j;
            const u32 ks = sl[j];
            T* kd = Ks + j * DS + d0;
            T* vd = Vs + j * DS + d0;
            if (kpos >= lo_first && kpos <= p_last && d0 < D && ks != ATT_NOSLOT) {
                const u64 off = ks * kv_stride + (u64)kh * D + d0;
                if constexpr (KQ != 0) {
                    const u64 si = (u64)ks * kvh + kh;
                    kvq_load4<T, KQ>(kd, kq + off, __ldg(ksc + si), D - d0, vec);
                    kvq_load4<T, KQ>(vd, vq + off, __ldg(vsc + si), D - d0, vec);
                } else if (vec && d0 + 4 <= D) {
                    // Every load of the tile in flight at once (the loop is latency-bound otherwise).
                    async4(kd, kpool + off);
                    async4(vd, vpool + off);
                } else {
                    copy4(kd, kpool + off, D - d0, vec);
                    copy4(vd, vpool + off, D - d0, vec);
                }
            } else {
                zero4(kd);
                zero4(vd);
            }
        }
        async4_wait();
        __syncthreads();

        // S = Q K^T for RA items x 4 keys.
        float sc[RA][NB];
#pragma unroll
        for (int a = 0; a < RA; ++a)
#pragma unroll
            for (int b = 0; b < NB; ++b) sc[a][b] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < DP; d += 4) {
            float4 qv[RA];
#pragma unroll
            for (int a = 0; a < RA; ++a) qv[a] = ld4(Qs + (ti + 8 * a) * DS + d);
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const float4 kv4 = ld4(Ks + (tj + 16 * b) * DS + d);
#pragma unroll
                for (int a = 0; a < RA; ++a) {
                    float x = sc[a][b];
                    x = fmaf(qv[a].x, kv4.x, x);
                    x = fmaf(qv[a].y, kv4.y, x);
                    x = fmaf(qv[a].z, kv4.z, x);
                    x = fmaf(qv[a].w, kv4.w, x);
                    sc[a][b] = x;
                }
            }
        }

        // Mask, online softmax, P to shared memory.
#pragma unroll
        for (int a = 0; a < RA; ++a) {
            float mx = PORTER_NEG_INF;
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const u32 kpos = kbase + tj + 16 * b;
                const bool ok = iv[a] && kpos >= ilo[a] && kpos <= ipos[a];
                sc[a][b] = ok ? __fmul_rn(sc[a][b], scale) : PORTER_NEG_INF;
                mx = fmaxf(mx, sc[a][b]);
            }
            mx = max16(mx);
            const float m_new = fmaxf(m_run[a], mx);
            float corr = 1.0f, psum = 0.0f;
            if (m_new == PORTER_NEG_INF) {
#pragma unroll
                for (int b = 0; b < NB; ++b) sc[a][b] = 0.0f;
            } else {
                corr = expf(__fsub_rn(m_run[a], m_new));
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    sc[a][b] = expf(__fsub_rn(sc[a][b], m_new));
                    psum = __fadd_rn(psum, sc[a][b]);
                }
            }
            m_run[a] = m_new;
            l_run[a] = fmaf(l_run[a], corr, psum);
#pragma unroll
            for (int c = 0; c < 4 * NC; ++c) acc[a][c] = __fmul_rn(acc[a][c], corr);
#pragma unroll
            for (int b = 0; b < NB; ++b) Ps[(ti + 8 * a) * PS + tj + 16 * b] = sc[a][b];
        }
        __syncthreads();

        // O += P V.
#pragma unroll 2
        for (int j = 0; j < BN; ++j) {
            float pa[RA];
#pragma unroll
            for (int a = 0; a < RA; ++a) pa[a] = Ps[(ti + 8 * a) * PS + j];
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const float4 vv = ld4(Vs + j * DS + tj * 4 + 64 * c);
#pragma unroll
                for (int a = 0; a < RA; ++a) {
                    acc[a][4 * c + 0] = fmaf(pa[a], vv.x, acc[a][4 * c + 0]);
                    acc[a][4 * c + 1] = fmaf(pa[a], vv.y, acc[a][4 * c + 1]);
                    acc[a][4 * c + 2] = fmaf(pa[a], vv.z, acc[a][4 * c + 2]);
                    acc[a][4 * c + 3] = fmaf(pa[a], vv.w, acc[a][4 * c + 3]);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int a = 0; a < RA; ++a) {
        const float l = sum16(l_run[a]);
        if (wr[a] == 0) continue;
        if (wr[a] == 1) {
            const float inv = 1.0f / l;
            T* o = out + ((u64)(row0 + irow[a]) * heads + ih[a]) * D;
#pragma unroll
            for (int c = 0; c < NC; ++c)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 d = tj * 4 + 64 * c + e;
                    if (d < D) o[d] = from_f<T>(__fmul_rn(acc[a][4 * c + e], inv));
                }
        } else {
            const u64 nrows = (u64)(gridDim.y / kvh) * qcap;
            const u64 rh = (u64)(s * qcap + irow[a]) * heads + ih[a];
            float* pp = part + ((u64)z * nrows * heads + rh) * (D + 2);
#pragma unroll
            for (int c = 0; c < NC; ++c)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 d = tj * 4 + 64 * c + e;
                    if (d < D) pp[d] = acc[a][4 * c + e];
                }
            if (tj == 0) {
                pp[D] = m_run[a];
                pp[D + 1] = l;
            }
        }
    }
}

// Merges the partials of a split row: one block of ATT_THREADS per (row i < qcap of
// sequence s, head), grid (qcap * heads, n_seqs); rows finished by one split (or
// not split) exit. M = max m_z, L = Σ l_z·exp(m_z − M) and O = Σ part_z·(exp(m_z −
// M) / L), all in increasing z (the weights of ATT_THREADS splits at a time go
// through shared memory), so the result depends on nothing but the row.
// blockDim.x must be ATT_THREADS.
template <typename T>
__device__ __forceinline__ void attention_combine_impl(const float* __restrict__ part,
                                                       const u32* __restrict__ spans, T* __restrict__ out, u32 t,
                                                       u32 heads, u32 D, u32 window, u32 qcap, u32 nz) {
    __shared__ float w[ATT_THREADS], sm[ATT_THREADS], sl[ATT_THREADS];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    const u32 s = blockIdx.y, i = blockIdx.x / heads, h = blockIdx.x % heads;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    if (qlen > ATT_SPLIT_Q || i >= min(qlen, qcap) || row0 >= t || i >= t - row0) return;
    const u32 p = pos0 + i;
    const u32 lo = (window != 0 && p + 1 > window) ? p + 1 - window : 0;
    const u32 zlo = lo / ATT_KS, zhi = min(p / ATT_KS, nz - 1);
    if (zlo >= zhi) return;
    const u64 zstride = (u64)gridDim.y * qcap * heads * (D + 2);
    const float* base = part + ((u64)(s * qcap + i) * heads + h) * (D + 2);
    // (m_z, l_z) of ATT_THREADS splits at a time are loaded in parallel into shared
    // memory; every thread then folds them in increasing z (the same values everywhere).
    auto stage = [&](u32 zc) {
        __syncthreads();
        const u32 zz = zc + tid;
        if (zz <= zhi) {
            const float* pz = base + zz * zstride;
            sm[tid] = pz[D];
            sl[tid] = pz[D + 1];
        }
        __syncthreads();
        return min(nt, zhi + 1 - zc);
    };
    float M = PORTER_NEG_INF;
    for (u32 zc = zlo; zc <= zhi; zc += nt) {
        const u32 n = stage(zc);
        for (u32 k = 0; k < n; ++k)
            if (sl[k] > 0.0f) M = fmaxf(M, sm[k]);
    }
    float L = 0.0f;
    for (u32 zc = zlo; zc <= zhi; zc += nt) {
        const u32 n = stage(zc);
        for (u32 k = 0; k < n; ++k)
            if (sl[k] > 0.0f) L = fmaf(sl[k], expf(__fsub_rn(sm[k], M)), L);
    }
    float o0 = 0.0f, o1 = 0.0f;  // dims tid and tid + nt (D <= 2 * ATT_THREADS)
    for (u32 zc = zlo; zc <= zhi; zc += nt) {
        const u32 n = stage(zc);
        w[tid] = tid < n && sl[tid] > 0.0f ? expf(__fsub_rn(sm[tid], M)) / L : 0.0f;
        __syncthreads();
#pragma unroll 8
        for (u32 k = 0; k < n; ++k) {
            const float* pz = base + (zc + k) * zstride;
            if (tid < D) o0 = fmaf(pz[tid], w[k], o0);
            if (tid + nt < D) o1 = fmaf(pz[tid + nt], w[k], o1);
        }
    }
    T* o = out + ((u64)(row0 + i) * heads + h) * D;
    if (tid < D) o[tid] = from_f<T>(o0);
    if (tid + nt < D) o[tid + nt] = from_f<T>(o1);
}

// __launch_bounds__ takes a literal: ATT_THREADS.
// Name: attention_<NAME><QN>_r<RA>_c<NC><BS>, QN empty (pools of T), _fp8 or _i8; BS
// empty for the 64-key tile, _n32 / _n16 for the smaller ones.
#define ATTENTION_RCQB(T, NAME, KQ, QN, RA, NC, BN, BS)                                                          \
    extern "C" __global__ void __launch_bounds__(128) attention_##NAME##QN##_r##RA##_c##NC##BS(                  \
        const T* q, const void* kpool, const void* vpool, const u32* tables, const u32* spans, T* out,           \
        float* part, u32 t, u32 heads, u32 kvh, u32 D, float scale, u32 window, u32 max_blocks, u32 bs_log2,     \
        u32 n_slots, u32 tiles_m, u32 qcap, u32 nz, const float* ksc, const float* vsc) {                        \
        attention_impl<T, KQ, RA, NC, BN>(q, kpool, vpool, tables, spans, out, part, t, heads, kvh, D, scale,        \
                                      window, PagedKv{max_blocks, bs_log2, n_slots}, tiles_m, qcap, nz, ksc,     \
                                      vsc);                                                                      \
    }
#define ATTENTION_RCB(T, NAME, RA, NC, BN, BS)               \
    ATTENTION_RCQB(T, NAME, 0, , RA, NC, BN, BS)             \
    ATTENTION_RCQB(T, NAME, KVQ_FP8, _fp8, RA, NC, BN, BS)   \
    ATTENTION_RCQB(T, NAME, KVQ_I8, _i8, RA, NC, BN, BS)
#define ATTENTION_RC(T, NAME, RA, NC) ATTENTION_RCB(T, NAME, RA, NC, 64, )

#define ATTENTION_R(T, NAME, RA) \
    ATTENTION_RC(T, NAME, RA, 1) \
    ATTENTION_RC(T, NAME, RA, 2) \
    ATTENTION_RC(T, NAME, RA, 3) \
    ATTENTION_RC(T, NAME, RA, 4)

#define ATTENTION_ALL(T, NAME)                                                                                     \
    ATTENTION_R(T, NAME, 1)                                                                                        \
    ATTENTION_R(T, NAME, 4)                                                                                        \
    extern "C" __global__ void __launch_bounds__(128) attention_combine_##NAME(                                    \
        const float* part, const u32* spans, T* out, u32 t, u32 heads, u32 D, u32 window, u32 qcap, u32 nz) {      \
        attention_combine_impl<T>(part, spans, out, t, heads, D, window, qcap, nz);                                \
    }                                                                                                              \
    extern "C" __global__ void kv_append_##NAME(const T* k, const T* v, const u32* slots, T* kp, T* vp, u32 t,     \
                                                u32 row_len, u32 n_slots) {                                        \
        kv_append_impl<T>(k, v, slots, kp, vp, t, row_len, n_slots);                                               \
    }

ATTENTION_ALL(float, f32)
ATTENTION_ALL(bf16, bf16)
ATTENTION_ALL(f16, f16)
// Small key tiles, only where the 64-key tile can exceed a supported device's opt-in
// shared memory (96 KiB on sm_70 and the forced fallback, 64 KiB on sm_75, 99 KiB on
// sm_86 / sm_89): f32 from head_dim 129, 16-bit from 193 (attention.rs `cc_plan`).
ATTENTION_RCB(float, f32, 1, 2, 32, _n32)
ATTENTION_RCB(float, f32, 1, 3, 32, _n32)
ATTENTION_RCB(float, f32, 1, 4, 32, _n32)
ATTENTION_RCB(float, f32, 1, 4, 16, _n16)
ATTENTION_RCB(bf16, bf16, 1, 4, 32, _n32)
ATTENTION_RCB(f16, f16, 1, 4, 32, _n32)

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
        const float* ksc, const float* vsc) {                                                                  \
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

ATTENTION_TC_ALL(bf16, bf16)
ATTENTION_TC_ALL(f16, f16)

// ---------------------------------------------------------------------------
// Sampling (porter_core::sampling::Sampler::distribution + sample_from)
// ---------------------------------------------------------------------------
//
// One block of SMP_THREADS per row; thread `tid` owns the contiguous index
// range [tid*C, (tid+1)*C) so that "first r ties by index" and the walk in
// ascending index order are prefix scans over threads. The rank cuts (top-k,
// top-p) are radix selections on an order-preserving u32 key of the logit
// (larger logit -> larger key; equal keys are equal logits, ordered by index):
// 4 passes of 8-bit digits with histograms in shared memory (warp-aggregated
// adds), counts for top-k and f64 probability mass for top-p.

#define SMP_THREADS 1024
#define SMP_NONE 0xffffffffu

__device__ __forceinline__ u32 fkey(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float unkey(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double block_sum_d(double v, double* sh) {
    const u32 lane = threadIdx.x & 31u, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double r = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(r);
}

__device__ __forceinline__ u32 block_sum_u(u32 v, u32* sh) {
    const u32 lane = threadIdx.x & 31u, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    u32 r = lane < nw ? sh[lane] : 0u;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
    return r;
}

// Exclusive prefix sum over threads (in thread order). `sh` holds 32 entries.
template <typename V>
__device__ __forceinline__ V block_exscan(V v, V* sh) {
    const u32 lane = threadIdx.x & 31u, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    V x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const V y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= (u32)o) x += y;
    }
    V ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = V(0);
    __syncthreads();
    if (lane == 31) sh[w] = x;
    __syncthreads();
    if (w == 0) {
        V s = lane < nw ? sh[lane] : V(0);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const V y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= (u32)o) s += y;
        }
        if (lane < nw) sh[lane] = s;
    }
    __syncthreads();
    return (w > 0 ? sh[w - 1] : V(0)) + ex;
}

// Block-wide min (and max) of a u32, via a shared word.
__device__ __forceinline__ u32 block_min_u(u32 v, u32* word) {
    __syncthreads();
    if (threadIdx.x == 0) *word = SMP_NONE;
    __syncthreads();
    if (v != SMP_NONE) atomicMin(word, v);
    __syncthreads();
    return *word;
}

__device__ __forceinline__ u32 block_max_u(u32 v, u32* word) {
    __syncthreads();
    if (threadIdx.x == 0) *word = 0;
    __syncthreads();
    atomicMax(word, v);
    __syncthreads();
    return *word;
}

// Adds (val, 1) to bin `bin` of the histograms, aggregated over the lanes of the
// warp with the same bin. All 32 lanes must call it; `bin == SMP_NONE` adds nothing.
__device__ __forceinline__ void warp_bin_add(u32 bin, double val, double* hm, u32* hc) {
    const u32 lane = threadIdx.x & 31u;
    u32 pending = __ballot_sync(0xffffffffu, bin != SMP_NONE);
    while (pending) {
        const int leader = __ffs(pending) - 1;
        const u32 b = __shfl_sync(0xffffffffu, bin, leader);
        const bool mine = ((pending >> lane) & 1u) && bin == b;
        const u32 peers = __ballot_sync(0xffffffffu, mine);
        if (hm != nullptr) {
            const double v = warp_sum_d(mine ? val : 0.0);
            if (lane == (u32)leader) atomicAdd(&hm[b], v);
        }
        if (lane == (u32)leader) atomicAdd(&hc[b], (u32)__popc(peers));
        pending &= ~peers;
    }
}

// Number of elements with key == tau in the ranges of the threads before this one.
__device__ __forceinline__ u32 tie_base(const float* lg, u32 i0, u32 i1, u32 tau, u32* sh) {
    u32 c = 0;
    for (u32 i = i0; i < i1; ++i) c += fkey(lg[i]) == tau;
    return block_exscan<u32>(c, sh);
}

// Kept by the rank cut (tau, r): key > tau, or key == tau among the first r
// ties by index (`tc` counts the ties seen so far, starting at tie_base).
__device__ __forceinline__ bool in_cut(u32 key, bool all, u32 tau, u32 r, u32& tc) {
    if (all || key > tau) return true;
    if (key == tau) return tc++ < r;
    return false;
}

// __launch_bounds__ takes a literal: SMP_THREADS.
extern "C" __global__ void __launch_bounds__(1024) sample_rows(const float* __restrict__ logits, const float* __restrict__ params, u32* __restrict__ out,
                u32 vocab) {
    __shared__ u32 hc[256];
    __shared__ double hm[256];
    __shared__ double shd[32];
    __shared__ u32 shu[32];
    __shared__ float shv[32];
    __shared__ u32 shi[32];
    __shared__ u32 bc_u[4];
    __shared__ double bc_d[1];

    const u32 tid = threadIdx.x, nt = blockDim.x, row = blockIdx.x;
    const float* lg = logits + (u64)row * vocab;
    const float temp = params[4 * row], kf = params[4 * row + 1], tp = params[4 * row + 2];
    const double u = (double)params[4 * row + 3];
    const u32 C = (vocab + nt - 1) / nt;
    const u32 i0 = min(tid * C, vocab), i1 = min(i0 + C, vocab);

    if (!(temp > 0.0f)) {
        float bv = PORTER_NEG_INF;
        u32 bi = SMP_NONE;
        for (u32 i = i0; i < i1; ++i) {
            const float v = lg[i];
            if (beats(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        block_argmax(bv, bi, shv, shi, tid, nt);
        if (tid == 0) out[row] = bi == SMP_NONE ? 0u : bi;
        return;
    }

    float lmax = PORTER_NEG_INF;
    for (u32 i = i0; i < i1; ++i) lmax = fmaxf(lmax, lg[i]);
    lmax = block_max(lmax, shv, tid, nt);
    const float mx = lmax / temp;

    // Top-k: the K-th largest key and how many of its ties are kept.
    const bool all_k = !(kf >= 1.0f && kf < (float)vocab);
    u32 tau_k = 0, r_k = 0;
    if (!all_k) {
        u32 prefix = 0, mask = 0, rem = (u32)kf;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (u32 j = tid; j < 256; j += nt) hc[j] = 0;
            __syncthreads();
            for (u32 k = 0; k < C; ++k) {
                const u32 i = i0 + k;
                u32 bin = SMP_NONE;
                if (i < i1) {
                    const u32 key = fkey(lg[i]);
                    if ((key & mask) == prefix) bin = (key >> shift) & 255u;
                }
                warp_bin_add(bin, 0.0, nullptr, hc);
            }
            __syncthreads();
            if (tid == 0) {
                u32 rm = rem;
                int d = 255;
                for (; d > 0; --d) {
                    if (rm <= hc[d]) break;
                    rm -= hc[d];
                }
                bc_u[0] = (u32)d;
                bc_u[1] = rm;
            }
            __syncthreads();
            prefix |= bc_u[0] << shift;
            mask |= 255u << shift;
            rem = bc_u[1];
        }
        tau_k = prefix;
        r_k = rem;
    }
    const u32 tb_k = all_k ? 0u : tie_base(lg, i0, i1, tau_k, shu);

    // Sum of exp(l/t - max) over the top-k set (f64).
    double S = 0.0;
    {
        u32 tc = tb_k;
        for (u32 i = i0; i < i1; ++i) {
            const float v = lg[i];
            if (in_cut(fkey(v), all_k, tau_k, r_k, tc)) S += (double)expf(v / temp - mx);
        }
    }
    S = block_sum_d(S, shd);

    // Top-p: the smallest prefix (in sorted order) of the top-k set whose
    // normalised mass reaches top_p.
    bool all = all_k;
    u32 tau = tau_k, r = r_k;
    if (tp < 1.0f) {
        const double target = (double)tp;
        double above = 0.0;
        u32 prefix = 0, mask = 0, cnt = 0;
        bool found = true;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (u32 j = tid; j < 256; j += nt) {
                hc[j] = 0;
                hm[j] = 0.0;
            }
            __syncthreads();
            u32 tc = tb_k;
            for (u32 k = 0; k < C; ++k) {
                const u32 i = i0 + k;
                u32 bin = SMP_NONE;
                double val = 0.0;
                if (i < i1) {
                    const float v = lg[i];
                    const u32 key = fkey(v);
                    if (in_cut(key, all_k, tau_k, r_k, tc) && (key & mask) == prefix) {
                        bin = (key >> shift) & 255u;
                        val = (double)expf(v / temp - mx) / S;
                    }
                }
                warp_bin_add(bin, val, hm, hc);
            }
            __syncthreads();
            if (tid == 0) {
                int chosen = -1, last_ne = -1;
                double ab = above, ab_last = above;
                for (int d = 255; d >= 0; --d) {
                    if (hc[d] == 0) continue;
                    if (ab + hm[d] >= target) {
                        chosen = d;
                        break;
                    }
                    last_ne = d;
                    ab_last = ab;
                    ab += hm[d];
                }
                if (chosen < 0 && shift != 24 && last_ne >= 0) {
                    // Rounding: the bin chosen by the previous pass sums to just below target.
                    chosen = last_ne;
                    ab = ab_last;
                }
                bc_u[0] = chosen < 0 ? SMP_NONE : (u32)chosen;
                bc_u[1] = chosen < 0 ? 0u : hc[chosen];
                bc_d[0] = ab;
            }
            __syncthreads();
            if (bc_u[0] == SMP_NONE) {
                found = false;
                break;
            }
            prefix |= bc_u[0] << shift;
            mask |= 255u << shift;
            cnt = bc_u[1];
            above = bc_d[0];
            __syncthreads();
        }
        if (found) {
            if (tid == 0) {
                const double pt = (double)expf(unkey(prefix) / temp - mx) / S;
                double a = above;
                u32 rr = 0;
                while (rr < cnt) {
                    a += pt;
                    ++rr;
                    if (a >= target) break;
                }
                bc_u[2] = rr > 0 ? rr : 1u;
            }
            __syncthreads();
            all = false;
            tau = prefix;
            r = bc_u[2];
        }
    }
    const u32 tb = all ? 0u : (tau == tau_k && !all_k ? tb_k : tie_base(lg, i0, i1, tau, shu));

    // Renormalise over the kept set.
    double mass = 0.0;
    {
        u32 tc = tb;
        for (u32 i = i0; i < i1; ++i) {
            const float v = lg[i];
            if (in_cut(fkey(v), all, tau, r, tc)) mass += (double)expf(v / temp - mx) / S;
        }
    }
    mass = block_sum_d(mass, shd);

    // p as f32; walk in ascending index order.
    double csum = 0.0;
    u32 nz = 0, first_nz = SMP_NONE, last_nz = 0;
    {
        u32 tc = tb;
        for (u32 i = i0; i < i1; ++i) {
            const float v = lg[i];
            if (in_cut(fkey(v), all, tau, r, tc)) {
                const float p = (float)(((double)expf(v / temp - mx) / S) / mass);
                if (p > 0.0f) {
                    csum += (double)p;
                    ++nz;
                    first_nz = min(first_nz, i);
                    last_nz = i;
                }
            }
        }
    }
    const u32 total_nz = block_sum_u(nz, shu);
    u32 result;
    if (total_nz <= 1) {
        result = block_min_u(first_nz, &bc_u[3]);
        if (result == SMP_NONE) result = 0;
    } else {
        double a = block_exscan<double>(csum, shd);
        u32 cand = SMP_NONE;
        if (csum > 0.0) {
            u32 tc = tb;
            for (u32 i = i0; i < i1; ++i) {
                const float v = lg[i];
                if (in_cut(fkey(v), all, tau, r, tc)) {
                    const float p = (float)(((double)expf(v / temp - mx) / S) / mass);
                    if (p > 0.0f) {
                        a += (double)p;
                        if (u < a) {
                            cand = i;
                            break;
                        }
                    }
                }
            }
        }
        result = block_min_u(cand, &bc_u[3]);
        if (result == SMP_NONE) result = block_max_u(nz > 0 ? last_nz : 0u, &bc_u[3]);
    }
    if (tid == 0) out[row] = result;
}
