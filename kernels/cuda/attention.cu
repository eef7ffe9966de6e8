// Causal GQA attention over a paged KV cache and KV append (kernels/src/cuda/attention.rs
// has the launch wrappers; attention_tc.cu and attention_mma.cu, the tensor-core prefill paths,
// and sampling.cu follow in one module).
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
        u32 n_slots, u32 tiles_m, u32 qcap, u32 nz, const float* ksc, const float* vsc) { porter_pdl_enter();                        \
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
        const float* part, const u32* spans, T* out, u32 t, u32 heads, u32 D, u32 window, u32 qcap, u32 nz) { porter_pdl_enter();      \
        attention_combine_impl<T>(part, spans, out, t, heads, D, window, qcap, nz);                                \
    }                                                                                                              \
    extern "C" __global__ void kv_append_##NAME(const T* k, const T* v, const u32* slots, T* kp, T* vp, u32 t,     \
                                                u32 row_len, u32 n_slots) { porter_pdl_enter();                                        \
        kv_append_impl<T>(k, v, slots, kp, vp, t, row_len, n_slots);                                               \
    }

#ifndef PORTER_ATTN_HELPERS_ONLY  // the mma module (attention_mma.cu) takes the helpers only
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
#endif

