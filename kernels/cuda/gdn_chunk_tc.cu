// Gated DeltaNet, chunked form on tensor cores (sm_80+, bf16 / f16 outputs):
// the same math, spans, chunk offsets (gdn_chunk_prep) and scratch indexing as
// gdn_chunk.cu (which comes first in this module: GC_C, GC_INVALID,
// gc_decay, gc_chunk_gates, gc_stage_rows, gc_nan_rows, gc_tril_inverse, gc_cp16 /
// gc_cp_commit / gc_cp_wait), with every
// matrix product on wmma 16×16×16 tiles (operands T = bf16 or f16, f32
// accumulators). As in flash-linear-attention's chunk_gated_delta_rule:
// - the operands of the products are rounded to T: the normalised q and k,
//   v, the inverse T of (I − A) (computed in f32, blockwise on 16×16 blocks
//   as FLA's solve_tril, then scaled by β / β exp(G) and rounded), W, K̃, Vn
//   and the chunk-start states hs (rounded copies for the products: the
//   recurrent state itself stays f32, in accumulator fragments, from
//   state[slot, src_buf] back to it);
// - U stays f32 (it seeds the Vn = U − W S accumulators);
// - cumulative log-decays in f64 and exp flushed to 0 below −60 (gc_decay),
//   gates, norms and the decay factors in f32, as gdn_chunk.cu.
//
// Scratch (TC form; chunk-head index ch = (off[s] + c) · hv + j, rows of a
// chunk past its length are zero):
//   wn [cap, hv, 64, dk]  T    −W (token rows; negated so that Vn = U + wn·S)
//   kb [cap, hv, 64, dk]  T    K̃ = K ⊙ exp(G_last − G)
//   uf [cap, hv, 64, dv]  f32  U
//   vb [cap, hv, 64, dv]  T    Vn (gdn_chunk_tc_state)
//   gl [cap, hv]          f32  exp(G_last)
//   hb [cap, hv, dk, dv]  T    the state at each chunk start
// Shapes: DK = dk ∈ {64, 128} (template), dv a multiple of 32, at most 256.
//
// Cost model, 80B dims (hv 32, dk = dv = 128), 4096 tokens (64 chunks), H200:
// per (chunk, head) the products are 10·64²·128 + 6·64·128² FLOP = 11.5 MFLOP
// (23.6 GFLOP in all), ~100 µs at a wmma rate of ~250 TFLOP/s. The scratch is
// written once and read once or twice: wn, kb, vb 16.8 MB each, uf 33.6 MB, hb
// 67 MB (bf16: half of the f32 form's hs), ~0.25 GB moved, ~60 µs at 4.0 TB/s.
// The state sweep runs 128 blocks of 8 warps, 3 barriers per chunk and no
// global round trip on the chain (the next chunk's W, K̃, U stream in with
// cp.async while the current one computes): ~1.5 µs per chunk.

#include <mma.h>

#define GT_LDT 72  // row stride (elements) of the 64×64 T tiles (16-byte rows, 32-byte aligned tiles)
#define GT_LDF 68  // row stride (floats) of the 64×64 f32 tiles
#define GT_BV 32   // state columns per block of gdn_chunk_tc_state
#define GT_LDS 36  // row stride (floats) of the state's f32 [dk][32] tile and U's [64][32]
#define GT_LDB 40  // row stride (elements) of the state's T [dk][32] tile and Vn's [64][32]

// Copies rows × cols elements of E from src (row stride lds elements) to
// shared dst (row stride ld) in 16-byte cp.async pieces (cols, ld, lds and
// both addresses 16-byte multiples). GC_THREADS threads; no commit.
template <typename E>
__device__ __forceinline__ void gt_cp_rows(E* dst, u32 ld, const E* __restrict__ src, u64 lds, u32 rows, u32 cols,
                                           u32 tid) {
    constexpr u32 PE = 16 / sizeof(E);  // elements per piece
    const u32 pr = cols / PE;
    for (u32 x = tid; x < rows * pr; x += GC_THREADS) {
        const u32 i = x / pr, p = x % pr;
        gc_cp16(reinterpret_cast<float*>(dst + i * ld + PE * p),
                reinterpret_cast<const float*>(src + i * lds + PE * p));
    }
}

#if defined(PORTER_SM80)
using namespace nvcuda;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> GtAcc;
template <typename T> using GtA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T> using GtAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T> using GtB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T> using GtBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

// One warp: a 16×16 f32 accumulator tile, rounded to T, to dst (row-major, ld
// elements; rows >= rows skipped), through the warp's 16×16 f32 scratch.
template <typename T>
__device__ __forceinline__ void gt_store(const GtAcc& a, float* scr, T* dst, u64 ld, u32 rows, u32 lane) {
    wmma::store_matrix_sync(scr, a, 16, wmma::mem_row_major);
    __syncwarp();
    const u32 r = lane >> 1, c0 = (lane & 1u) * 8;
    if (r < rows) {
#pragma unroll
        for (int x = 0; x < 8; ++x) dst[r * ld + c0 + x] = from_f<T>(scr[r * 16 + c0 + x]);
    }
    __syncwarp();
}

// One warp's share of X Yᵀ for two [64][DK + 8] T tiles (DK columns), only
// the 16×16 tiles on and below the diagonal (tj <= ti), f32 to dst [64][GT_LDF]
// (K Kᵀ in gdn_chunk_tc_wu, Q Kᵀ in gdn_chunk_tc_out): warp w owns row tile
// w / 2 and column tiles 2 (w % 2) + n.
template <typename T, int DK>
__device__ __forceinline__ void gt_gram_lower(const T* X, const T* Y, float* dst, u32 w) {
    constexpr u32 LDK = DK + 8;
    const u32 ti = w >> 1;
#pragma unroll
    for (u32 n = 0; n < 2; ++n) {
        const u32 tj = 2 * (w & 1u) + n;
        if (tj > ti) continue;
        GtAcc acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (u32 kk = 0; kk < DK / 16; ++kk) {
            GtA<T> a;
            GtBt<T> b;
            wmma::load_matrix_sync(a, X + 16 * ti * LDK + 16 * kk, LDK);
            wmma::load_matrix_sync(b, Y + 16 * tj * LDK + 16 * kk, LDK);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(dst + 16 * ti * GT_LDF + 16 * tj, acc, GT_LDF, wmma::mem_row_major);
    }
}

#endif

// Dynamic shared memory of gdn_chunk_tc_wu, bytes (the host mirrors it):
// Kb, Vb (T [64][dk + 8], [64][dv + 8]), As (f32 [64][68]: K Kᵀ, A, T; then
// the 8 warp scratch tiles, f32 16×16), Tw, Tu (T [64][72]). 69 KiB at
// dk = dv = 128 (+ 1.5 KiB static): 3 blocks per SM on an H100 / H200.
#define GT_WU_SMEM(DK, DV) \
    (2u * GC_C * ((DK) + 8u) + 2u * GC_C * ((DV) + 8u) + 4u * GC_C * GT_LDF + 4u * GC_C * GT_LDT)

// ---------------------------------------------------------------------------
// Per (chunk, value head): −W, K̃, U, exp(G_last). grid (max_chunks, hv,
// n_spans), block GC_THREADS (8 warps).
//   K K^T (lower 16×16 tiles) -> A = −β_i (k_i·k_m) Γ_im (f32) -> T = (I − A)⁻¹
//   (f32, blockwise: gc_tril_inverse, 4 barriers) -> Tw = T diag(β e^G),
//   Tu = T diag(β) rounded to T -> −W = −Tw K, U = Tu V on tensor cores.
// ---------------------------------------------------------------------------
template <typename T, int DK>
__device__ __forceinline__ void gdn_chunk_tc_wu_impl(const T* __restrict__ qkv, const float* __restrict__ g,
                                                     const float* __restrict__ beta, const u32* __restrict__ spans,
                                                     const u32* __restrict__ off, T* __restrict__ wn,
                                                     T* __restrict__ kb, float* __restrict__ uf,
                                                     float* __restrict__ gl, u32 hk, u32 hv, u32 dv) {
#if defined(PORTER_SM80)
    constexpr u32 LDK = DK + 8;
    extern __shared__ __align__(128) unsigned char gt_smem[];
    __shared__ double Gd[GC_C];
    __shared__ float rk[GC_C], bt[GC_C], eg[GC_C], ek[GC_C];
    const u32 ldv = dv + 8;
    T* Kb = reinterpret_cast<T*>(gt_smem);                  // [64][LDK]
    T* Vb = Kb + GC_C * LDK;                                // [64][ldv]
    float* As = reinterpret_cast<float*>(Vb + GC_C * ldv);  // [64][GT_LDF]: K Kᵀ, A, then T
    T* Tw = reinterpret_cast<T*>(As + GC_C * GT_LDF);       // [64][GT_LDT]
    T* Tu = Tw + GC_C * GT_LDT;                             // [64][GT_LDT]
    float* scr = As;                                        // 8 × [16][16], once Tw, Tu are made
    const u32 tid = threadIdx.x, lane = tid & 31u, w = tid >> 5;
    float* wscr = scr + 256 * w;
    const u32 s = blockIdx.z, c = blockIdx.x, j = blockIdx.y, kh = j / (hv / hk);
    const u32 o = off[s];
    if (o == GC_INVALID) return;
    u32 r0, l;
    if (!gc_chunk_rows(spans, s, c, r0, l)) return;
    const u64 rw = 2ull * hk * DK + (u64)hv * dv;
    const T* kbase = qkv + (u64)hk * DK + (u64)kh * DK;
    const T* vbase = qkv + 2ull * hk * DK + (u64)j * dv;
    const u64 ch = ((u64)o + c) * hv + j;

    gc_chunk_gates(kbase, kbase, g, beta, rw, r0, l, hv, j, DK, 1.0f, nullptr, rk, bt, Gd, eg, ek, tid);
    if (tid == 0) gl[ch] = gc_decay((float)Gd[l - 1]);
    // Normalised K and V to T; K̃ = K ⊙ exp(G_last − G) to kb.
    gc_stage_rows<T, T>(kbase, rw, r0, l, DK, DK, rk, Kb, LDK, kb + ch * GC_C * DK, ek, DK, tid);
    gc_stage_rows<T, T>(vbase, rw, r0, l, dv, dv, nullptr, Vb, ldv, nullptr, nullptr, 0, tid);
    __syncthreads();
    gt_gram_lower<T, DK>(Kb, Kb, As, w);  // K Kᵀ
    __syncthreads();
    // A = −β_i (k_i·k_m) Γ_im (m < i < l), zero elsewhere.
    for (u32 x = tid; x < GC_C * GC_C; x += GC_THREADS) {
        const u32 i = x / GC_C, m = x % GC_C;
        As[i * GT_LDF + m] =
            (m < i && i < l) ? As[i * GT_LDF + m] * (-bt[i] * gc_decay((float)(Gd[i] - Gd[m]))) : 0.0f;
    }
    __syncthreads();
    gc_tril_inverse<GT_LDF>(As, w, lane);
    // Tw = T diag(β e^G), Tu = T diag(β) (columns m >= l are zero: β = 0 there,
    // so rows >= l of −W and U are zero too).
    for (u32 x = tid; x < GC_C * GC_C; x += GC_THREADS) {
        const u32 i = x / GC_C, m = x % GC_C;
        const float tv = gc_tril_at<GT_LDF>(As, i, m);
        Tw[i * GT_LDT + m] = from_f<T>(tv * (bt[m] * eg[m]));
        Tu[i * GT_LDT + m] = from_f<T>(tv * bt[m]);
    }
    __syncthreads();  // As is free: the warp scratch tiles
    // −W = −Tw K (64 × DK): warp w owns row tile w % 4, column tiles w / 4 + 2n.
    {
        const u32 ti = w & 3u;
        T* dst = wn + ch * GC_C * DK;
#pragma unroll
        for (u32 n = 0; n < DK / 32; ++n) {
            const u32 tj = (w >> 2) + 2 * n;
            GtAcc acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (u32 kk = 0; kk <= ti; ++kk) {  // T is lower triangular
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
    // U = Tu V (64 × dv), tile q = w + 8n: row tile q % 4, column tile q / 4;
    // f32 straight to uf.
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

// Dynamic shared memory of gdn_chunk_tc_state, bytes: 2 stages of (Wb, Kb:
// T [64][dk + 8], Ub: f32 [64][36]), Sf (f32 [dk][36], also Vn's f32 tiles),
// Sb (T [dk][40]), Vb (T [64][40]).
#define GT_STATE_SMEM(DK) \
    (2u * (4u * GC_C * ((DK) + 8u) + 4u * GC_C * GT_LDS) + 4u * (DK) * GT_LDS + 2u * (DK) * GT_LDB + 2u * GC_C * GT_LDB)

// ---------------------------------------------------------------------------
// Sequential over the chunks of a span: grid (dv / 32, hv, n_spans), block
// GC_THREADS (8 warps); the block owns state columns col0 .. col0 + 31. The
// f32 state lives in accumulator fragments: warp w owns tiles q = w·NS + n
// (NS = DK / 64) at row tile q / 2, column tile q % 2. Per chunk (3 barriers):
//   the state to Sf (f32) -> rounded to Sb and hb (each warp its own tiles);
//   Vn = U + (−W) S (warp w: token tile w / 2, column tile w % 2) -> Vb, vb;
//   S ← exp(G_last) S + K̃ᵀ Vn (K̃ᵀ: col-major view of K̃ [64][dk]).
// The next chunk's −W, K̃ and U columns stream in (cp.async, 2 stages) while
// the current one computes.
// ---------------------------------------------------------------------------
template <typename T, int DK>
__device__ __forceinline__ void gt_state_load(unsigned char* stage, const T* __restrict__ wn,
                                              const T* __restrict__ kb, const float* __restrict__ uf, u64 ch, u32 dv,
                                              u32 col0, u32 tid) {
    constexpr u32 LDK = DK + 8;
    T* Wb = reinterpret_cast<T*>(stage);
    T* Kb = Wb + GC_C * LDK;
    float* Ub = reinterpret_cast<float*>(Kb + GC_C * LDK);
    gt_cp_rows(Wb, LDK, wn + ch * GC_C * DK, DK, GC_C, DK, tid);
    gt_cp_rows(Kb, LDK, kb + ch * GC_C * DK, DK, GC_C, DK, tid);
    gt_cp_rows(Ub, GT_LDS, uf + ch * GC_C * dv + col0, dv, GC_C, GT_BV, tid);
    gc_cp_commit();
}

template <typename T, int DK>
__device__ __forceinline__ void gdn_chunk_tc_state_impl(float* __restrict__ state, const u32* __restrict__ spans,
                                                        const u32* __restrict__ off, const T* __restrict__ wn,
                                                        const T* __restrict__ kb, const float* __restrict__ uf,
                                                        const float* __restrict__ gl, T* __restrict__ vb,
                                                        T* __restrict__ hb, u32 hv, u32 dv, u32 nbuf) {
#if defined(PORTER_SM80)
    constexpr u32 LDK = DK + 8, NS = DK / 64;
    constexpr u32 STG = 4 * GC_C * LDK + 4 * GC_C * GT_LDS;  // bytes per stage
    extern __shared__ __align__(128) unsigned char gt_smem[];
    float* Sf = reinterpret_cast<float*>(gt_smem + 2 * STG);  // [DK][GT_LDS], also Vn's f32 tiles
    T* Sb = reinterpret_cast<T*>(Sf + DK * GT_LDS);           // [DK][GT_LDB]
    T* Vb = Sb + DK * GT_LDB;                                 // [64][GT_LDB]
    const u32 tid = threadIdx.x, lane = tid & 31u, w = tid >> 5;
    const u32 s = blockIdx.z, j = blockIdx.y, col0 = blockIdx.x * GT_BV;
    const u32 o = off[s];
    if (o == GC_INVALID) return;
    const u32* sp = spans + 5 * s;
    const u32 len = sp[1], slot = sp[2], src = sp[3];
    if (len == 0) return;
    const u64 hsz = (u64)DK * dv;
    float* st = state + (((u64)slot * nbuf + src) * hv + j) * hsz + col0;

    gt_state_load<T, DK>(gt_smem, wn, kb, uf, (u64)o * hv + j, dv, col0, tid);
    GtAcc S[NS];
#pragma unroll
    for (u32 n = 0; n < NS; ++n) {
        const u32 q = w * NS + n;
        wmma::load_matrix_sync(S[n], st + (u64)16 * (q >> 1) * dv + 16 * (q & 1u), dv, wmma::mem_row_major);
    }
    const u32 vt = w >> 1, vc = w & 1u;  // Vn tile of this warp
    const u32 nch = (len + GC_C - 1) / GC_C;
    for (u32 c = 0; c < nch; ++c) {
        const u64 ch = ((u64)o + c) * hv + j;
        const float e = gl[ch];
        unsigned char* stage = gt_smem + (c & 1u) * STG;
        if (c + 1 < nch) {
            gt_state_load<T, DK>(gt_smem + ((c + 1) & 1u) * STG, wn, kb, uf, ch + hv, dv, col0, tid);
            gc_cp_wait<1>();
        } else {
            gc_cp_wait<0>();
        }
        const T* Wb = reinterpret_cast<const T*>(stage);
        const T* Kb = Wb + GC_C * LDK;
        const float* Ub = reinterpret_cast<const float*>(Kb + GC_C * LDK);
        // The state at the chunk start, rounded, to Sb and hb.
#pragma unroll
        for (u32 n = 0; n < NS; ++n) {
            const u32 q = w * NS + n, rt = q >> 1, ct = q & 1u;
            float* sf = Sf + 16 * rt * GT_LDS + 16 * ct;
            wmma::store_matrix_sync(sf, S[n], GT_LDS, wmma::mem_row_major);
            __syncwarp();
            const u32 r = lane >> 1, c0 = (lane & 1u) * 8;
            T* sb = Sb + (16 * rt + r) * GT_LDB + 16 * ct + c0;
            T* hg = hb + ch * hsz + (u64)(16 * rt + r) * dv + col0 + 16 * ct + c0;
#pragma unroll
            for (int x = 0; x < 8; ++x) {
                const T v = from_f<T>(sf[r * GT_LDS + c0 + x]);
                sb[x] = v;
                hg[x] = v;
            }
        }
        __syncthreads();  // Sb and this chunk's stage are ready; Sf is free
        // Vn = U + (−W) S.
        {
            GtAcc acc;
            wmma::load_matrix_sync(acc, Ub + 16 * vt * GT_LDS + 16 * vc, GT_LDS, wmma::mem_row_major);
#pragma unroll
            for (u32 kk = 0; kk < DK / 16; ++kk) {
                GtA<T> a;
                GtB<T> b;
                wmma::load_matrix_sync(a, Wb + 16 * vt * LDK + 16 * kk, LDK);
                wmma::load_matrix_sync(b, Sb + 16 * kk * GT_LDB + 16 * vc, GT_LDB);
                wmma::mma_sync(acc, a, b, acc);
            }
            float* vf = Sf + 16 * vt * GT_LDS + 16 * vc;
            wmma::store_matrix_sync(vf, acc, GT_LDS, wmma::mem_row_major);
            __syncwarp();
            const u32 r = lane >> 1, c0 = (lane & 1u) * 8;
            T* vs = Vb + (16 * vt + r) * GT_LDB + 16 * vc + c0;
            T* vg = vb + (ch * GC_C + 16 * vt + r) * dv + col0 + 16 * vc + c0;
#pragma unroll
            for (int x = 0; x < 8; ++x) {
                const T v = from_f<T>(vf[r * GT_LDS + c0 + x]);
                vs[x] = v;
                vg[x] = v;
            }
        }
        __syncthreads();  // Vb complete
        // S ← exp(G_last) S + K̃ᵀ Vn.
#pragma unroll
        for (u32 n = 0; n < NS; ++n) {
            const u32 q = w * NS + n, rt = q >> 1, ct = q & 1u;
#pragma unroll
            for (int x = 0; x < S[n].num_elements; ++x) S[n].x[x] *= e;
#pragma unroll
            for (u32 kk = 0; kk < GC_C / 16; ++kk) {
                GtAt<T> a;
                GtB<T> b;
                wmma::load_matrix_sync(a, Kb + 16 * kk * LDK + 16 * rt, LDK);
                wmma::load_matrix_sync(b, Vb + 16 * kk * GT_LDB + 16 * ct, GT_LDB);
                wmma::mma_sync(S[n], a, b, S[n]);
            }
        }
        __syncthreads();  // done with this stage, Sf and Vb
    }
#pragma unroll
    for (u32 n = 0; n < NS; ++n) {
        const u32 q = w * NS + n;
        wmma::store_matrix_sync(st + (u64)16 * (q >> 1) * dv + 16 * (q & 1u), S[n], dv, wmma::mem_row_major);
    }
#endif
}

// Dynamic shared memory of gdn_chunk_tc_out, bytes: R01 = Qb (T [64][dk + 8])
// + Ps (f32 [64][68]), later Sb (T [dk][dv + 8]); R2 = Kb (T [64][dk + 8]),
// later the 8 warp scratch tiles; Qg (T [64][dk + 8]); Pb (T [64][72]); Vb
// (T [64][dv + 8]).
#define GT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define GT_OUT_R01(DK, DV) GT_MAX(2u * GC_C * ((DK) + 8u) + 4u * GC_C * GT_LDF, 2u * (DK) * ((DV) + 8u))
#define GT_OUT_R2(DK) GT_MAX(2u * GC_C * ((DK) + 8u), 8u * 1024u)
#define GT_OUT_SMEM(DK, DV) \
    (GT_OUT_R01(DK, DV) + GT_OUT_R2(DK) + 2u * GC_C * ((DK) + 8u) + 2u * GC_C * GT_LDT + 2u * GC_C * ((DV) + 8u))

// ---------------------------------------------------------------------------
// Outputs per (chunk, value head): grid (max_chunks, hv, n_spans), block
// GC_THREADS. P = Q Kᵀ (lower tiles) -> Pb = tril(P ⊙ Γ) rounded; then
// O = Pb Vn + (Q ⊙ e^G) S_chunk: output tile q = w + 8n (row tile q % 4,
// column tile q / 4), at most 8 per warp (dv <= 256). Vn loads (cp.async)
// while P is computed, the chunk-start state while Pb Vn is. An invalid span
// gets NaN rows.
// ---------------------------------------------------------------------------
template <typename T, int DK>
__device__ __forceinline__ void gdn_chunk_tc_out_impl(const T* __restrict__ qkv, const float* __restrict__ g,
                                                      const u32* __restrict__ spans, const u32* __restrict__ off,
                                                      const T* __restrict__ vb, const T* __restrict__ hb,
                                                      T* __restrict__ out, u32 t, u32 hk, u32 hv, u32 dv,
                                                      float q_scale) {
#if defined(PORTER_SM80)
    constexpr u32 LDK = DK + 8;
    extern __shared__ __align__(128) unsigned char gt_smem[];
    __shared__ double Gd[GC_C];
    __shared__ float rq[GC_C], rk[GC_C], eg[GC_C];
    const u32 ldv = dv + 8;
    T* Qb = reinterpret_cast<T*>(gt_smem);                                  // [64][LDK]
    float* Ps = reinterpret_cast<float*>(Qb + GC_C * LDK);                  // [64][GT_LDF]
    T* Sb = reinterpret_cast<T*>(gt_smem);                                  // [DK][ldv], after Pb
    unsigned char* r2 = gt_smem + GT_OUT_R01(DK, dv);
    T* Kb = reinterpret_cast<T*>(r2);                                       // [64][LDK]
    float* scr = reinterpret_cast<float*>(r2);                              // 8 × [16][16], after Pb
    T* Qg = reinterpret_cast<T*>(r2 + GT_OUT_R2(DK));                       // [64][LDK]
    T* Pb = Qg + GC_C * LDK;                                                // [64][GT_LDT]
    T* Vb = Pb + GC_C * GT_LDT;                                             // [64][ldv]
    const u32 tid = threadIdx.x, lane = tid & 31u, w = tid >> 5;
    const u32 s = blockIdx.z, c = blockIdx.x, j = blockIdx.y, kh = j / (hv / hk);
    u32 r0, l;
    if (!gc_chunk_rows(spans, s, c, r0, l)) return;
    const u32 o = off[s];
    if (o == GC_INVALID) {
        gc_nan_rows(out, r0, l, t, hv, j, dv, tid);
        return;
    }
    const u64 ch = ((u64)o + c) * hv + j;
    const u64 rw = 2ull * hk * DK + (u64)hv * dv;
    const T* qbase = qkv + (u64)kh * DK;
    const T* kbase = qkv + (u64)hk * DK + (u64)kh * DK;
    gt_cp_rows(Vb, ldv, vb + ch * GC_C * dv, dv, GC_C, dv, tid);
    gc_cp_commit();
    gc_chunk_gates(qbase, kbase, g, nullptr, rw, r0, l, hv, j, DK, q_scale, rq, rk, nullptr, Gd, eg, nullptr, tid);
    // Normalised Q and K, and Q ⊙ exp(G), to T.
    gc_stage_rows<T, T>(qbase, rw, r0, l, DK, DK, rq, Qb, LDK, Qg, eg, LDK, tid);
    gc_stage_rows<T, T>(kbase, rw, r0, l, DK, DK, rk, Kb, LDK, nullptr, nullptr, 0, tid);
    __syncthreads();
    gt_gram_lower<T, DK>(Qb, Kb, Ps, w);  // P = Q Kᵀ
    __syncthreads();
    // Pb = P ⊙ Γ on and below the diagonal (Γ_ii = 1), zero elsewhere.
    for (u32 x = tid; x < GC_C * GC_C; x += GC_THREADS) {
        const u32 i = x / GC_C, m = x % GC_C;
        float v = 0.0f;
        if (m <= i && i < l) v = m < i ? Ps[i * GT_LDF + m] * gc_decay((float)(Gd[i] - Gd[m])) : Ps[i * GT_LDF + m];
        Pb[i * GT_LDT + m] = from_f<T>(v);
    }
    __syncthreads();  // Qb, Ps, Kb are free
    gt_cp_rows(Sb, ldv, hb + ch * (u64)DK * dv, dv, DK, dv, tid);
    gc_cp_commit();
    gc_cp_wait<1>();  // Vn (this thread's copies)
    __syncthreads();  // Vn (everyone's)
    const u32 nq = 4 * (dv / 16);
    GtAcc acc[8];
#pragma unroll
    for (u32 n = 0; n < 8; ++n) {
        const u32 q = w + 8 * n;
        if (q >= nq) break;
        const u32 ti = q & 3u, tj = q >> 2;
        wmma::fill_fragment(acc[n], 0.0f);
        for (u32 kk = 0; kk <= ti; ++kk) {
            GtA<T> a;
            GtB<T> b;
            wmma::load_matrix_sync(a, Pb + 16 * ti * GT_LDT + 16 * kk, GT_LDT);
            wmma::load_matrix_sync(b, Vb + 16 * kk * ldv + 16 * tj, ldv);
            wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
    gc_cp_wait<0>();
    __syncthreads();  // the chunk-start state
#pragma unroll
    for (u32 n = 0; n < 8; ++n) {
        const u32 q = w + 8 * n;
        if (q >= nq) break;
        const u32 ti = q & 3u, tj = q >> 2;
#pragma unroll
        for (u32 kk = 0; kk < DK / 16; ++kk) {
            GtA<T> a;
            GtB<T> b;
            wmma::load_matrix_sync(a, Qg + 16 * ti * LDK + 16 * kk, LDK);
            wmma::load_matrix_sync(b, Sb + 16 * kk * ldv + 16 * tj, ldv);
            wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
    float* wscr = scr + 256 * w;
#pragma unroll
    for (u32 n = 0; n < 8; ++n) {
        const u32 q = w + 8 * n;
        if (q >= nq) break;
        const u32 ti = q & 3u, tj = q >> 2;
        const u32 rows = l > 16 * ti ? (l - 16 * ti < 16 ? l - 16 * ti : 16) : 0;
        gt_store<T>(acc[n], wscr, out + ((u64)(r0 + 16 * ti) * hv + j) * dv + 16 * tj, (u64)hv * dv, rows, lane);
    }
#endif
}

#define GDN_CHUNK_TC(T, NAME, DK)                                                                                \
    extern "C" __global__ void __launch_bounds__(256, 3)                                                        \
        gdn_chunk_tc_wu_d##DK##_##NAME(const T* qkv, const float* g, const float* beta, const u32* spans,     \
                                       const u32* off, T* wn, T* kb, float* uf, float* gl, u32 hk, u32 hv,        \
                                       u32 dv) { porter_pdl_enter();                                                                 \
        gdn_chunk_tc_wu_impl<T, DK>(qkv, g, beta, spans, off, wn, kb, uf, gl, hk, hv, dv);                        \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        gdn_chunk_tc_state_d##DK##_##NAME(float* state, const u32* spans, const u32* off, const T* wn,            \
                                          const T* kb, const float* uf, const float* gl, T* vb, T* hb, u32 hv,    \
                                          u32 dv, u32 nbuf) { porter_pdl_enter();                                                    \
        gdn_chunk_tc_state_impl<T, DK>(state, spans, off, wn, kb, uf, gl, vb, hb, hv, dv, nbuf);                  \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        gdn_chunk_tc_out_d##DK##_##NAME(const T* qkv, const float* g, const u32* spans, const u32* off,       \
                                        const T* vb, const T* hb, T* out, u32 t, u32 hk, u32 hv, u32 dv,          \
                                        float q_scale) { porter_pdl_enter();                                                         \
        gdn_chunk_tc_out_impl<T, DK>(qkv, g, spans, off, vb, hb, out, t, hk, hv, dv, q_scale);                    \
    }
GDN_CHUNK_TC(bf16, bf16, 64)
GDN_CHUNK_TC(bf16, bf16, 128)
GDN_CHUNK_TC(f16, f16, 64)
GDN_CHUNK_TC(f16, f16, 128)
