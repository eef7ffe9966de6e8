// Cost model, 80B dims (hv 32, dk = dv = 128), one 4096-token span (64
// chunks), H200 (132 SMs, ~1 LDS wavefront / clk / SM, 128 FMA / clk / SM):
//   before (measured total 3465 µs):
//   wu    2048 blocks, 64 regs, 34 KiB -> 4 blocks/SM, 3.9 waves. 1.5 M FMA /
//         block at ~1 LDS per FMA (row x 16 broadcast columns): ~49 k LDS
//         wavefronts / block, x 15.5 blocks / SM -> ~400 µs; forward subst.
//         126 barriers + chains of up to 63 FMAs: ~50 µs.
//   state 128 blocks (1 / SM), 64 sequential chunks; per chunk ~14 dependent
//         global round trips (4 W tiles, 8 K̃ tiles, uncoalesced U, gl, each
//         behind a barrier) ~15-20 µs + ~3 µs math -> ~1.2-1.6 ms.
//   out   2048 blocks, 79 regs, 90 KiB -> 2 blocks/SM, 7.8 waves; 2 M FMA /
//         block register-blocked (~130 µs at FMA peak) plus 32-way bank
//         conflicts transposing Q, K (16 k wavefronts / block, ~130 µs).
//   scratch traffic: wt, ut, kt 67 MB each, hs 134 MB, ~0.8 GB moved: ~170 µs.
//   after (estimate):
//   wu    48 regs -> 5 blocks/SM; 4x4 register blocking, 0.5 LDS per FMA
//         (~190 µs); the inverse (now blockwise, 4 barriers) ~5 µs.
//   state inputs of chunk c + 1 stream in with cp.async while chunk c computes
//         (3 barriers / chunk, no global latency on the chain): ~3-4 µs /
//         chunk -> ~250 µs (173 KiB shared, 187 regs, 1 block / SM).
//   out   transposing stores 4-way (swizzle): ~150-200 µs.
//   total ~0.6-0.7 ms (bandwidth of the scratch overlaps the math).
//
// Gated DeltaNet, chunked form (chunks of GC_C = 64 tokens) over spans of a
// batch: the prefill path of porter_kernels::cpu::gdn::chunked_gated_delta_rule
// with the span / state-pool conventions of gdn_delta_seq (gdn_seq.cu). All
// math in f32 on CUDA cores (cumulative log-decays in f64, as the CPU code).
// Preceded by common.cuh. Launch wrapper: kernels/src/cuda/gdn_chunk.rs.
//
// Inputs: qkv [t, 2·hk·dk + hv·dv] (the activation type T: q at 0, k at hk·dk, v at 2·hk·dk);
// g, beta [t, hv] (f32); state pool [num_slots, nbuf, hv, dk, dv] (f32);
// spans [n_spans, 5] = (row0, len, slot, src_buf, snapshot) (snapshot is
// ignored: treated as 0); out [t, hv, dv] (T).
//
// Per chunk of l <= 64 tokens of a span and value head j (S = state at the
// chunk start, q, k L2-normalised, G = cumsum(g) within the chunk):
//   A  = −β_i (k_i·k_m) exp(G_i − G_m) (m < i),  T = (I − A)⁻¹ (gc_tril_inverse)
//   W  = T (β ⊙ exp(G) ⊙ K),  U = T (β ⊙ V)            (gdn_chunk_wu)
//   Vn = U − W S;  S ← exp(G_last) S + (K ⊙ exp(G_last − G))ᵀ Vn   (gdn_chunk_state)
//   O  = (Q ⊙ exp(G)) S + (tril(Q Kᵀ) ⊙ exp(G_i − G_m)) Vn       (gdn_chunk_out)
// exp(x) is flushed to 0 below x = −60 (decay_exp of the CPU code).
//
// Scratch is indexed by a global chunk index: span s's chunk c is
// off[s] + c, off from gdn_chunk_prep (an exclusive scan of ceil(len / 64)
// over the spans, GC_INVALID for an invalid span).
//   wt [cap, hv, dk, 64]   W transposed (token index fastest)
//   ut [cap, hv, dv, 64]   U transposed, overwritten with Vn by gdn_chunk_state
//   kt [cap, hv, 64, dk]   K ⊙ exp(G_last − G)
//   gl [cap, hv]           exp(G_last)
//   hs [cap, hv, dk, dv]   the state at each chunk start
// Rows of a chunk past its length are zero in wt / ut / kt.

#define GC_C 64
#define GC_INVALID 0xffffffffu
#define GC_THREADS 256

__device__ __forceinline__ float gc_decay(float x) { return x < -60.0f ? 0.0f : expf(x); }
// Swizzle of the token index in the transposed [d][64] tiles of gdn_chunk_out
// (float4 groups stay intact; the transposing stores are 4-way instead of
// 32-way bank conflicts).
__device__ __forceinline__ u32 gc_sw(u32 d) { return (d & 7u) << 2; }

// Chunk c of span s (spans [n, 5]): its first row r0 and length l (1..64);
// false where the span is shorter than c + 1 chunks.
__device__ __forceinline__ bool gc_chunk_rows(const u32* __restrict__ spans, u32 s, u32 c, u32& r0, u32& l) {
    const u32* sp = spans + 5 * s;
    const u32 len = sp[1];
    if (c * GC_C >= len) return false;
    l = len - c * GC_C < GC_C ? len - c * GC_C : GC_C;
    r0 = sp[0] + c * GC_C;
    return true;
}

// acc[a][b] += x[a] · y[b] (4 × 4, registers).
__device__ __forceinline__ void gc_fma4x4(float (&acc)[4][4], const float (&x)[4], const float (&y)[4]) {
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(x[a], y[b], acc[a][b]);
}

// Per chunk (rows r0 .. r0 + l − 1) and value head j, for both forms: 1/‖q‖
// times q_scale (`rq` may be null), 1/‖k‖, β (`bt` may be null), the
// cumulative log-decay G (f64, summed in row order as the CPU code) and, where
// `eg` / `ek` are not null, exp(G) and exp(G_last − G). GC_THREADS threads;
// ends with a barrier. Rows past l get zeros (G: the last value). Every g is
// loaded (into Gd) before one thread sums them: the sum waits on no load.
template <typename Q>
__device__ __forceinline__ void gc_chunk_gates(const Q* __restrict__ qbase, const Q* __restrict__ kbase,
                                               const float* __restrict__ g, const float* __restrict__ beta, u64 rw,
                                               u32 r0, u32 l, u32 hv, u32 j, u32 dk, float q_scale, float* rq,
                                               float* rk, float* bt, double* Gd, float* eg, float* ek, u32 tid) {
    const u32 lane = tid & 31u, wid = tid >> 5;
    // 8 rows a warp, 2 at a time; β and g load with the row (not after its sums).
#pragma unroll 2
    for (u32 i = wid; i < GC_C; i += GC_THREADS / 32) {
        float sq = 0.0f, sk = 0.0f, bv = 0.0f, gv = 0.0f;
        if (i < l) {
            if (bt) bv = beta[(u64)(r0 + i) * hv + j];
            gv = g[(u64)(r0 + i) * hv + j];
            const Q* qr = qbase + (u64)(r0 + i) * rw;
            const Q* kr = kbase + (u64)(r0 + i) * rw;
            for (u32 d = lane; d < dk; d += 32) {
                const float qv = rq ? to_f(qr[d]) : 0.0f, kv = to_f(kr[d]);
                sq += qv * qv;
                sk += kv * kv;
            }
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        if (lane == 0) {
            if (rq) rq[i] = i < l ? (1.0f / sqrtf(sq + 1e-6f)) * q_scale : 0.0f;
            rk[i] = i < l ? 1.0f / sqrtf(sk + 1e-6f) : 0.0f;
            if (bt) bt[i] = bv;
            Gd[i] = (double)gv;
        }
    }
    __syncthreads();
    if (wid == 0) {
        if (lane == 0) {
            double acc = 0.0;
            for (u32 i = 0; i < GC_C; ++i) {
                if (i < l) acc += Gd[i];
                Gd[i] = acc;
            }
        }
        __syncwarp();
        if (eg)
            for (u32 i = lane; i < GC_C; i += 32) {
                eg[i] = i < l ? gc_decay((float)Gd[i]) : 0.0f;
                if (ek) ek[i] = i < l ? gc_decay((float)(Gd[l - 1] - Gd[i])) : 0.0f;
            }
    }
    __syncthreads();
}

// Stages rows i < 64 of a chunk, columns d < n, of an f32 matrix (row r0 + i
// at base + (r0 + i) · rw; rows >= l read as zero) into shared memory:
// x = base[..] · rs[i] (`rs` null: x = base[..]) rounded to D at dst[i·ld + d],
// columns n .. np − 1 of dst zeroed (np >= n); with `dst2`, also x · s2[i]
// rounded to D2 at dst2[i·ld2 + d] (d < n only). GC_THREADS threads, no barrier.
// The loads go out GC_STAGE at a time before any of them is used (a loop that
// stored each value before loading the next waited a global round trip per
// element: 32 per thread for a 64 × 128 tile).
#define GC_STAGE 8
template <typename D, typename D2, typename Q>
__device__ __forceinline__ void gc_stage_rows(const Q* __restrict__ base, u64 rw, u32 r0, u32 l, u32 n,
                                              u32 np, const float* __restrict__ rs, D* __restrict__ dst, u32 ld,
                                              D2* __restrict__ dst2, const float* __restrict__ s2, u32 ld2,
                                              u32 tid) {
    const u32 total = GC_C * np;
    for (u32 x0 = tid; x0 < total; x0 += GC_STAGE * GC_THREADS) {
        float v[GC_STAGE];
#pragma unroll
        for (int u = 0; u < GC_STAGE; ++u) {
            const u32 x = x0 + u * GC_THREADS, i = x / np, d = x % np;
            v[u] = (x < total && i < l && d < n) ? to_f(base[(u64)(r0 + i) * rw + d]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GC_STAGE; ++u) {
            const u32 x = x0 + u * GC_THREADS, i = x / np, d = x % np;
            if (x >= total) break;
            float vv = v[u];
            if (rs && i < l && d < n) vv *= rs[i];
            dst[i * ld + d] = from_f<D>(vv);
            if (dst2 && d < n) dst2[i * ld2 + d] = from_f<D2>(vv * s2[i]);
        }
    }
}

// The rows r0 .. r0 + l − 1 (clipped to t) of value head j of out [t, hv, dv]
// set to NaN (the outputs of an invalid span). GC_THREADS threads.
template <typename T>
__device__ __forceinline__ void gc_nan_rows(T* __restrict__ out, u32 r0, u32 l, u32 t, u32 hv, u32 j, u32 dv,
                                            u32 tid) {
    for (u32 x = tid; x < l * dv; x += GC_THREADS) {
        const u64 r = (u64)r0 + x / dv;
        if (r < t) out[(r * hv + j) * dv + x % dv] = from_f<T>(PORTER_NAN);
    }
}

// ---------------------------------------------------------------------------
// Chunk offsets. One block of 1024 threads (a multiple of 32). A span is valid when slot <
// num_slots, src_buf < nbuf, row0 + len <= t and len <= max_len; it then gets
// chunks off[s] .. off[s] + ceil(len / 64), if those fit in `cap`.
// ---------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(1024)
    gdn_chunk_prep(const u32* __restrict__ spans, u32* __restrict__ off, u32 n_spans, u32 t, u32 num_slots,
                   u32 nbuf, u32 max_len, u32 cap) { porter_pdl_enter();
    __shared__ u64 wsum[32];
    const u32 tid = threadIdx.x, nt = blockDim.x, lane = tid & 31u, w = tid >> 5;
    const u32 per = (n_spans + nt - 1) / nt;
    const u32 s0 = tid * per;
    const u32 s1 = s0 + per < n_spans ? s0 + per : n_spans;
    u32 sum = 0;
    for (u32 s = s0; s < s1; ++s) {
        const u32* sp = spans + 5 * s;
        const bool ok = sp[2] < num_slots && sp[3] < nbuf && (u64)sp[0] + sp[1] <= t && sp[1] <= max_len;
        if (ok) sum += (sp[1] + GC_C - 1) / GC_C;  // <= cap + 1 each: no overflow below 2^32 / 1024 spans
    }
    // Exclusive prefix of the threads' sums, exact in u64 (a warp scan, then the warps' totals
    // scanned by warp 0), clamped to 2^32 − 1: what a saturating running sum gives. (A serial
    // sum by one thread over the 1,024 partials took 14 µs, session 20, H100.)
    u64 v = sum;
#pragma unroll
    for (u32 d = 1; d < 32; d <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += y;
    }
    if (lane == 31) wsum[w] = v;
    __syncthreads();
    if (w == 0) {
        u64 x = lane < nt / 32 ? wsum[lane] : 0;
#pragma unroll
        for (u32 d = 1; d < 32; d <<= 1) {
            const u64 y = __shfl_up_sync(0xffffffffu, x, d);
            if (lane >= d) x += y;
        }
        wsum[lane] = x;  // inclusive totals of warps 0 .. lane
    }
    __syncthreads();
    const u64 excl = v - sum + (w > 0 ? wsum[w - 1] : 0);
    u32 acc = excl > 0xffffffffull ? 0xffffffffu : (u32)excl;
    for (u32 s = s0; s < s1; ++s) {
        const u32* sp = spans + 5 * s;
        const bool ok = sp[2] < num_slots && sp[3] < nbuf && (u64)sp[0] + sp[1] <= t && sp[1] <= max_len;
        const u32 nch = (sp[1] + GC_C - 1) / GC_C;
        if (ok && (u64)acc + nch <= cap) {
            off[s] = acc;
            acc += nch;
        } else {
            off[s] = GC_INVALID;
            if (ok) acc = 0xffffffffu;  // later spans cannot fit either (keeps the order simple)
        }
    }
}

// T = (I − A)⁻¹ for a strictly lower 64×64 A (f32, row-major, ld LD), in
// place, blockwise on 16×16 blocks (the scheme of flash-linear-attention's
// solve_tril) instead of 63 dependent rows with a barrier each:
//   (a) the diagonal blocks T_bb = (I − A_bb)⁻¹ overwrite A_bb (gc_inv_diag:
//       one half-warp per block, no barrier);
//   (b) T_ij = T_ii Σ_{m=j}^{i−1} A_im T_mj for i > j (from L T = I with
//       L = I − A), level by level: (1,0), (2,1), (3,2) -> (2,0), (3,1) ->
//       (3,0), a barrier after each (gc_inv_block). A_ij is still needed at
//       the next levels, so T_ij goes to the unused upper block (j, i).
// All in f32 on CUDA cores (16 products of 16×16×16, 65 k FMA: little next
// to the chunk's other products; no operand rounding, so T is as accurate
// as the row-by-row forward substitution's, which this replaces: 63 rows with
// a barrier each). Zero rows of A (past the chunk's length) give
// identity rows of T, zero columns zero columns: the products stay exact.
// Afterwards T_rm (r in block i, m in block j <= i) is at
// a[(16 j + r % 16) · LD + 16 i + m % 16] (gc_tril_at). GC_THREADS
// threads; A must be complete (barrier) on entry; ends with a barrier.

// (a) Lane c of a half-warp keeps column c of T_bb in registers:
// T[r][c] = Σ_{m<r} A[r][m] T[m][c] (T[c][c] = 1, T[r][c] = 0 for r < c),
// row after row; the half-warp reads A's rows as broadcasts.
template <u32 LD>
__device__ __forceinline__ void gc_inv_diag(float* a, u32 b, u32 c) {
    float* ab = a + 16 * b * (LD + 1);
    float t[16];
#pragma unroll
    for (u32 r = 0; r < 16; ++r) {
        float v = 0.0f;
#pragma unroll
        for (u32 m = 0; m < r; ++m) v = fmaf(ab[r * LD + m], t[m], v);
        t[r] = r < c ? 0.0f : (r == c ? 1.0f : v);
    }
    __syncwarp();  // every lane has read A_bb
#pragma unroll
    for (u32 r = 0; r < 16; ++r) ab[r * LD + c] = t[r];
}

// (b) One warp: columns c0 .. c0 + 2·NC − 1 of T_ij (lane: row lane / 2,
// NC columns), through X = Σ_m A_im T_mj kept in T_ij's place.
template <u32 LD, int NC>
__device__ __forceinline__ void gc_inv_block(float* a, u32 i, u32 j, u32 c0, u32 lane) {
    const u32 r = lane >> 1, cb = c0 + NC * (lane & 1u);
    float x[NC];
#pragma unroll
    for (int n = 0; n < NC; ++n) x[n] = 0.0f;
    for (u32 m = j; m < i; ++m) {
        const float* am = a + (16 * i + r) * LD + 16 * m;  // A_im, row r
        const float* tm = a + 16 * j * LD + 16 * m + cb;   // T_mj (diagonal block when m == j)
#pragma unroll
        for (u32 k = 0; k < 16; ++k) {
            const float av = am[k];
#pragma unroll
            for (int n = 0; n < NC; ++n) x[n] = fmaf(av, tm[k * LD + n], x[n]);
        }
    }
    float* tij = a + 16 * j * LD + 16 * i + cb;
#pragma unroll
    for (int n = 0; n < NC; ++n) tij[r * LD + n] = x[n];
    __syncwarp();  // X complete (this warp's columns)
    const float* tii = a + (16 * i + r) * LD + 16 * i;  // T_ii, row r (zeros above the diagonal)
#pragma unroll
    for (int n = 0; n < NC; ++n) x[n] = 0.0f;
#pragma unroll
    for (u32 k = 0; k < 16; ++k) {
        const float tv = tii[k];
#pragma unroll
        for (int n = 0; n < NC; ++n) x[n] = fmaf(tv, tij[k * LD + n], x[n]);
    }
    __syncwarp();  // every lane has read X
#pragma unroll
    for (int n = 0; n < NC; ++n) tij[r * LD + n] = x[n];
}

template <u32 LD>
__device__ __forceinline__ void gc_tril_inverse(float* a, u32 w, u32 lane) {
    if (w < 2) gc_inv_diag<LD>(a, 2 * w + (lane >> 4), lane & 15u);
    __syncthreads();
    if (w < 6) gc_inv_block<LD, 4>(a, (w >> 1) + 1, w >> 1, 8 * (w & 1u), lane);  // (1,0) (2,1) (3,2), 8 columns a warp
    __syncthreads();
    gc_inv_block<LD, 2>(a, (w >> 2) + 2, w >> 2, 4 * (w & 3u), lane);  // (2,0) (3,1), 4 columns a warp
    __syncthreads();
    gc_inv_block<LD, 1>(a, 3, 0, 2 * w, lane);  // (3,0), 2 columns a warp
    __syncthreads();
}

// Element (r, m) of T (r, m < 64) after gc_tril_inverse: 0 above the diagonal.
template <u32 LD>
__device__ __forceinline__ float gc_tril_at(const float* a, u32 r, u32 m) {
    const u32 br = r >> 4, bm = m >> 4;
    return bm <= br ? a[(16 * bm + (r & 15u)) * LD + 16 * br + (m & 15u)] : 0.0f;
}

// ---------------------------------------------------------------------------
// Per (chunk, value head): W, U, K̃, exp(G_last). grid (max_chunks, hv,
// n_spans), block GC_THREADS. Static shared memory (~34 KiB).
// ---------------------------------------------------------------------------
template <typename Q>
__device__ __forceinline__ void gdn_chunk_wu_impl(const Q* __restrict__ qkv, const float* __restrict__ g,
                                                  const float* __restrict__ beta, const u32* __restrict__ spans,
                                                  const u32* __restrict__ off, float* __restrict__ wt,
                                                  float* __restrict__ ut, float* __restrict__ kt,
                                                  float* __restrict__ gl, u32 hk, u32 hv, u32 dk, u32 dv) {
    __shared__ float Ts[GC_C][GC_C + 1];  // A, then staged 64-column blocks of β exp(G) K / β V
    __shared__ float Xs[GC_C][GC_C + 1];  // staged 64-column blocks of K, then T
    __shared__ double Gd[GC_C];
    __shared__ float rk[GC_C], bt[GC_C], eg[GC_C], ek[GC_C];
    const u32 tid = threadIdx.x, lane = tid & 31u, wid = tid >> 5;
    const u32 s = blockIdx.z, c = blockIdx.x, j = blockIdx.y, kh = j / (hv / hk);
    const u32 o = off[s];
    if (o == GC_INVALID) return;
    u32 r0, l;
    if (!gc_chunk_rows(spans, s, c, r0, l)) return;
    const u64 gci = (u64)o + c;
    const u64 rw = 2ull * hk * dk + (u64)hv * dv;
    const Q* kbase = qkv + (u64)hk * dk + (u64)kh * dk;  // + row · rw
    const Q* vbase = qkv + 2ull * hk * dk + (u64)j * dv;
    const u64 ch = gci * hv + j;  // (chunk, head)

    gc_chunk_gates(kbase, kbase, g, beta, rw, r0, l, hv, j, dk, 1.0f, nullptr, rk, bt, Gd, eg, ek, tid);
    if (tid == 0) gl[ch] = gc_decay((float)Gd[l - 1]);

    // Gram K Kᵀ: thread owns rows ri + 16a and columns 4cq + b (a, b < 4):
    // 8 shared loads per 16 FMAs (rows conflict-free, columns broadcast).
    const u32 ri = tid & 15u, cq = tid >> 4;
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
    for (u32 d0 = 0; d0 < dk; d0 += GC_C) {
        __syncthreads();
        const u32 n = dk - d0 < GC_C ? dk - d0 : GC_C;
        gc_stage_rows(kbase + d0, rw, r0, l, n, GC_C, rk, &Xs[0][0], GC_C + 1, kt + ch * GC_C * dk + d0, ek, dk, tid);
        __syncthreads();
#pragma unroll 4
        for (u32 dd = 0; dd < GC_C; ++dd) {
            float xa[4], xb[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) xa[a] = Xs[ri + 16 * a][dd];
#pragma unroll
            for (int b = 0; b < 4; ++b) xb[b] = Xs[4 * cq + b][dd];
            gc_fma4x4(acc, xa, xb);
        }
    }
    __syncthreads();
    // A = −β_i (k_i·k_m) Γ_im, strictly lower.
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const u32 i = ri + 16 * a, m = 4 * cq + b;
            Ts[i][m] = (m < i && i < l) ? acc[a][b] * (-bt[i] * gc_decay((float)(Gd[i] - Gd[m]))) : 0.0f;
        }
    __syncthreads();
    gc_tril_inverse<GC_C + 1>(&Ts[0][0], wid, lane);
    // T to Xs, row-major (zero above the diagonal), for the products below.
    for (u32 x = tid; x < GC_C * GC_C; x += GC_THREADS) {
        const u32 i = x / GC_C, m = x % GC_C;
        Xs[i][m] = gc_tril_at<GC_C + 1>(&Ts[0][0], i, m);
    }
    // W = T (β exp(G) K) and U = T (β V) (T in Xs, the 64-column blocks of
    // β exp(G) K / β V staged in Ts): thread owns rows ri + 16a and
    // columns 4cq + b of each 64-column block; written transposed (16
    // consecutive tokens per column).
    for (u32 pass = 0; pass < 2; ++pass) {
        const u32 dim = pass == 0 ? dk : dv;
        float* dst = pass == 0 ? wt + ch * dk * GC_C : ut + ch * dv * GC_C;
        for (u32 d0 = 0; d0 < dim; d0 += GC_C) {
            __syncthreads();
            for (u32 x = tid; x < GC_C * GC_C; x += GC_THREADS) {
                const u32 i = x / GC_C, dd = x % GC_C, d = d0 + dd;
                float xv = 0.0f;
                if (i < l && d < dim) {
                    xv = pass == 0 ? (bt[i] * eg[i]) * (to_f(kbase[(u64)(r0 + i) * rw + d]) * rk[i])
                                   : bt[i] * to_f(vbase[(u64)(r0 + i) * rw + d]);
                }
                Ts[i][dd] = xv;
            }
            __syncthreads();
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
            for (u32 m = 0; m < l; ++m) {
                float ta[4], xb[4];
#pragma unroll
                for (int a = 0; a < 4; ++a) ta[a] = Xs[ri + 16 * a][m];
#pragma unroll
                for (int b = 0; b < 4; ++b) xb[b] = Ts[m][4 * cq + b];
                gc_fma4x4(acc, ta, xb);
            }
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const u32 d = d0 + 4 * cq + b;
                if (d < dim) {
#pragma unroll
                    for (int a = 0; a < 4; ++a) {
                        const u32 i = ri + 16 * a;
                        dst[(u64)d * GC_C + i] = i < l ? acc[a][b] : 0.0f;
                    }
                }
            }
        }
    }
}
// Q: the conv output's type, the model's activation type (f32 scratch in every case).
#define GDN_CHUNK_WU(Q, NAME)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        gdn_chunk_wu_##NAME(const Q* qkv, const float* g, const float* beta, const u32* spans, const u32* off,     \
                            float* wt, float* ut, float* kt, float* gl, u32 hk, u32 hv, u32 dk, u32 dv) {          \
        porter_pdl_enter();                                                                                       \
        gdn_chunk_wu_impl<Q>(qkv, g, beta, spans, off, wt, ut, kt, gl, hk, hv, dk, dv);                            \
    }
GDN_CHUNK_WU(float, f32)
GDN_CHUNK_WU(bf16, bf16)
GDN_CHUNK_WU(f16, f16)

// ---------------------------------------------------------------------------
// Sequential over the chunks of a span: grid (ceil(dv / 32), hv, n_spans),
// block GC_THREADS (8 warps). Lane = state column (32 per block); warp w
// holds rows w·RK .. w·RK + RK − 1 of the state in registers (RK·8 >= dk).
// A chunk's inputs (W [dk][64], K̃ [64][dk], the block's 32 columns of U)
// do not depend on the state: they are copied to shared memory with
// cp.async, NST stages (NST = 2: chunk c + 1 streams in while chunk c
// computes), so the sequential path has no global-memory round trip.
// Dynamic shared memory (floats): Ss [DKP][32] + Vs [64][33] + NST × (Wb
// [DKP][64] + Kb [64][DKP] + Ub [32][68]), DKP = 8·RK (gc_state_smem).
// Per chunk: the state goes to hs and Ss; Vn = U − W S (thread: column lane,
// tokens 8w .. 8w + 7) to Vs, then to ut (in place, coalesced);
// S ← exp(G_last) S + K̃ᵀ Vn. The final state goes back to state[slot, src_buf, j].
// ---------------------------------------------------------------------------
#if defined(PORTER_SM80)
__device__ __forceinline__ void gc_cp16(float* dst, const float* src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void gc_cp4(float* dst, const float* src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void gc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gc_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ void gc_cp16(float* dst, const float* src) {
    *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
}
__device__ __forceinline__ void gc_cp4(float* dst, const float* src) { *dst = *src; }
__device__ __forceinline__ void gc_cp_commit() {}
template <int N>
__device__ __forceinline__ void gc_cp_wait() {}
#endif

#define GC_UP 68  // row stride of Ub (16-byte aligned rows)
#define GC_VP 33  // row stride of Vs (conflict-free both ways)

// Issue the copies of chunk `ch` (global (chunk, head) index) into one stage.
template <u32 DKP>
__device__ __forceinline__ void gc_state_load(float* __restrict__ stage, const float* __restrict__ wt,
                                              const float* __restrict__ ut, const float* __restrict__ kt, u64 ch,
                                              u32 dk, u32 dv, u32 col0, u32 ncol, u32 tid) {
    float* Wb = stage;              // [DKP][64]
    float* Kb = Wb + DKP * GC_C;    // [64][DKP]
    float* Ub = Kb + GC_C * DKP;    // [32][GC_UP]
    const float* ws = wt + ch * dk * GC_C;  // [dk][64], contiguous, 16-byte aligned
    for (u32 x = tid; x < dk * (GC_C / 4); x += GC_THREADS) gc_cp16(Wb + 4 * x, ws + 4 * x);
    const float* ks = kt + ch * GC_C * dk;  // [64][dk]
    if ((dk & 3u) == 0) {
        const u32 q = dk / 4;
        for (u32 x = tid; x < GC_C * q; x += GC_THREADS) {
            const u32 i = x / q, d4 = x - i * q;
            gc_cp16(Kb + i * DKP + 4 * d4, ks + (u64)i * dk + 4 * d4);
        }
    } else {
        for (u32 x = tid; x < GC_C * dk; x += GC_THREADS) {
            const u32 i = x / dk, d = x - i * dk;
            gc_cp4(Kb + i * DKP + d, ks + (u64)i * dk + d);
        }
    }
    const float* us = ut + (ch * dv + col0) * GC_C;  // [ncol][64]
    for (u32 x = tid; x < ncol * (GC_C / 4); x += GC_THREADS) {
        const u32 cc = x / (GC_C / 4), p = x % (GC_C / 4);
        gc_cp16(Ub + cc * GC_UP + 4 * p, us + (u64)cc * GC_C + 4 * p);
    }
    gc_cp_commit();
}

template <int RK, int NST>
__device__ __forceinline__ void gdn_chunk_state_impl(float* __restrict__ state, const u32* __restrict__ spans,
                                                     const u32* __restrict__ off, const float* __restrict__ wt,
                                                     float* __restrict__ ut, const float* __restrict__ kt,
                                                     const float* __restrict__ gl, float* __restrict__ hs, u32 hv,
                                                     u32 dk, u32 dv, u32 nbuf) {
    extern __shared__ float4 gc_smem4[];
    constexpr u32 DKP = 8 * RK;  // padded dk
    constexpr u32 STG = DKP * GC_C * 2 + 32 * GC_UP;
    float* Ss = reinterpret_cast<float*>(gc_smem4);  // [DKP][32]
    float* Vs = Ss + DKP * 32;                       // [64][GC_VP]
    float* Stg = Vs + GC_C * GC_VP;                  // NST stages of STG floats
    const u32 tid = threadIdx.x, lane = tid & 31u, w = tid >> 5;
    const u32 s = blockIdx.z, j = blockIdx.y;
    const u32 col0 = blockIdx.x * 32, col = col0 + lane;
    const bool active = col < dv;
    const u32 ncol = dv - col0 < 32 ? dv - col0 : 32;
    const u32 o = off[s];
    if (o == GC_INVALID) return;
    const u32* sp = spans + 5 * s;
    const u32 len = sp[1], slot = sp[2], src = sp[3];
    if (len == 0) return;
    const u64 hsz = (u64)dk * dv;
    float* st = state + (((u64)slot * nbuf + src) * hv + j) * hsz;

    // Zero the parts of the stages the copies never write (K̃ columns >= dk,
    // U columns >= ncol), then start chunk 0.
    for (u32 b = 0; b < (u32)NST; ++b) {
        float* Kb = Stg + b * STG + DKP * GC_C;
        float* Ub = Kb + GC_C * DKP;
        if (dk < DKP)
            for (u32 x = tid; x < GC_C * DKP; x += GC_THREADS)
                if (x % DKP >= dk) Kb[x] = 0.0f;
        if (ncol < 32)
            for (u32 x = tid; x < 32 * GC_UP; x += GC_THREADS)
                if (x / GC_UP >= ncol) Ub[x] = 0.0f;
    }
    gc_state_load<DKP>(Stg, wt, ut, kt, (u64)o * hv + j, dk, dv, col0, ncol, tid);

    float Sr[RK];
#pragma unroll
    for (int r = 0; r < RK; ++r) {
        const u32 d = w * RK + r;
        Sr[r] = (active && d < dk) ? st[(u64)d * dv + col] : 0.0f;
    }
    const u32 nch = (len + GC_C - 1) / GC_C;
    for (u32 c = 0; c < nch; ++c) {
        const u32 l = len - c * GC_C < GC_C ? len - c * GC_C : GC_C;
        const u64 ch = ((u64)o + c) * hv + j;
        const float e = gl[ch];  // used after Vn: its latency is hidden
        const float* stage = Stg + (c % NST) * STG;
        if (NST > 1) {
            if (c + 1 < nch) {
                gc_state_load<DKP>(Stg + ((c + 1) % NST) * STG, wt, ut, kt, ch + hv, dk, dv, col0, ncol, tid);
                gc_cp_wait<1>();
            } else {
                gc_cp_wait<0>();
            }
        } else {
            if (c > 0) gc_state_load<DKP>(Stg, wt, ut, kt, ch, dk, dv, col0, ncol, tid);
            gc_cp_wait<0>();
        }
        const float* Wb = stage;
        const float* Kb = Wb + DKP * GC_C;
        const float* Ub = Kb + GC_C * DKP;
#pragma unroll
        for (int r = 0; r < RK; ++r) {
            const u32 d = w * RK + r;
            Ss[d * 32 + lane] = Sr[r];
            if (active && d < dk) hs[ch * hsz + (u64)d * dv + col] = Sr[r];
        }
        __syncthreads();  // Ss and this chunk's stage are ready
        // Vn = U − W S for tokens 8w .. 8w + 7 of column lane.
        float acc[8];
        {
            const float4 ua = *reinterpret_cast<const float4*>(Ub + lane * GC_UP + 8 * w);
            const float4 ub = *reinterpret_cast<const float4*>(Ub + lane * GC_UP + 8 * w + 4);
            acc[0] = ua.x, acc[1] = ua.y, acc[2] = ua.z, acc[3] = ua.w;
            acc[4] = ub.x, acc[5] = ub.y, acc[6] = ub.z, acc[7] = ub.w;
        }
#pragma unroll 4
        for (u32 d = 0; d < dk; ++d) {
            const float sv = Ss[d * 32 + lane];
            const float4 wa = *reinterpret_cast<const float4*>(Wb + d * GC_C + 8 * w);
            const float4 wb = *reinterpret_cast<const float4*>(Wb + d * GC_C + 8 * w + 4);
            acc[0] = fmaf(-wa.x, sv, acc[0]);
            acc[1] = fmaf(-wa.y, sv, acc[1]);
            acc[2] = fmaf(-wa.z, sv, acc[2]);
            acc[3] = fmaf(-wa.w, sv, acc[3]);
            acc[4] = fmaf(-wb.x, sv, acc[4]);
            acc[5] = fmaf(-wb.y, sv, acc[5]);
            acc[6] = fmaf(-wb.z, sv, acc[6]);
            acc[7] = fmaf(-wb.w, sv, acc[7]);
        }
#pragma unroll
        for (int a = 0; a < 8; ++a) Vs[(8 * w + a) * GC_VP + lane] = acc[a];
        __syncthreads();  // Vs complete
        // Vn to ut, coalesced over tokens.
        {
            float* ud = ut + (ch * dv + col0) * GC_C;
            for (u32 x = tid; x < ncol * GC_C; x += GC_THREADS) {
                const u32 cc = x / GC_C, i = x % GC_C;
                ud[(u64)cc * GC_C + i] = Vs[i * GC_VP + cc];
            }
        }
        // S ← exp(G_last) S + K̃ᵀ Vn.
#pragma unroll
        for (int r = 0; r < RK; ++r) Sr[r] *= e;
#pragma unroll(RK >= 32 ? 1 : 2)
        for (u32 i = 0; i < l; ++i) {
            const float v = Vs[i * GC_VP + lane];
            const float4* k4 = reinterpret_cast<const float4*>(Kb + i * DKP + w * RK);
#pragma unroll
            for (int r = 0; r < RK; r += 4) {
                const float4 kk = k4[r / 4];
                Sr[r] = fmaf(kk.x, v, Sr[r]);
                Sr[r + 1] = fmaf(kk.y, v, Sr[r + 1]);
                Sr[r + 2] = fmaf(kk.z, v, Sr[r + 2]);
                Sr[r + 3] = fmaf(kk.w, v, Sr[r + 3]);
            }
        }
        __syncthreads();  // done with Vs, Ss and this stage
    }
#pragma unroll
    for (int r = 0; r < RK; ++r) {
        const u32 d = w * RK + r;
        if (active && d < dk) st[(u64)d * dv + col] = Sr[r];
    }
}

#define GDN_CHUNK_STATE(RK, NST)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        gdn_chunk_state_rk##RK(float* state, const u32* spans, const u32* off, const float* wt, float* ut,        \
                               const float* kt, const float* gl, float* hs, u32 hv, u32 dk, u32 dv, u32 nbuf) { porter_pdl_enter();  \
        gdn_chunk_state_impl<RK, NST>(state, spans, off, wt, ut, kt, gl, hs, hv, dk, dv, nbuf);                  \
    }
GDN_CHUNK_STATE(8, 2)
GDN_CHUNK_STATE(16, 2)
GDN_CHUNK_STATE(32, 1)

// acc[a][b] += x[a] · y[b] (a < 4, b < CT; y 16-byte aligned, read as float4).
template <int CT>
__device__ __forceinline__ void gc_outer4(float (&acc)[4][CT], const float (&x)[4], const float* __restrict__ y) {
    const float4* y4 = reinterpret_cast<const float4*>(y);
#pragma unroll
    for (int b = 0; b < CT; b += 4) {
        const float4 yy = y4[b / 4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            acc[a][b] = fmaf(x[a], yy.x, acc[a][b]);
            acc[a][b + 1] = fmaf(x[a], yy.y, acc[a][b + 1]);
            acc[a][b + 2] = fmaf(x[a], yy.z, acc[a][b + 2]);
            acc[a][b + 3] = fmaf(x[a], yy.w, acc[a][b + 3]);
        }
    }
}

// ---------------------------------------------------------------------------
// Outputs per (chunk, value head): grid (max_chunks, hv, n_spans), block
// GC_THREADS. Thread: rows 4·(tid / 16) .. + 3, columns (tid % 16)·CT .. + CT − 1
// (16·CT >= dv). Dynamic shared memory (floats): Qt [dkp][64] + Kt [dkp][64]
// + Pt [64][64] + Bs [16][16·CT], dkp = dk rounded up to 4.
// P = tril(Q Kᵀ) ⊙ Γ; O = (Q ⊙ exp(G)) S + P Vn. An invalid span gets NaN rows.
// ---------------------------------------------------------------------------
template <typename T, int CT>
__device__ __forceinline__ void gdn_chunk_out_impl(const T* __restrict__ qkv, const float* __restrict__ g,
                                                   const u32* __restrict__ spans, const u32* __restrict__ off,
                                                   const float* __restrict__ ut, const float* __restrict__ hs,
                                                   T* __restrict__ out, u32 t, u32 hk, u32 hv, u32 dk, u32 dv,
                                                   float q_scale) {
    extern __shared__ float4 gc_smem4[];
    __shared__ double Gd[GC_C];
    __shared__ float rq[GC_C], rk[GC_C];
    constexpr u32 DVP = 16 * CT;
    const u32 dkp = (dk + 3) & ~3u;
    float* Qt = reinterpret_cast<float*>(gc_smem4);  // [dkp][64]
    float* Kt = Qt + dkp * GC_C;                     // [dkp][64]
    float* Pt = Kt + dkp * GC_C;                     // [64][64]: Pt[m][i] = P[i][m]
    float* Bs = Pt + GC_C * GC_C;                    // [16][DVP]
    const u32 tid = threadIdx.x;
    const u32 s = blockIdx.z, c = blockIdx.x, j = blockIdx.y, kh = j / (hv / hk);
    u32 r0, l;
    if (!gc_chunk_rows(spans, s, c, r0, l)) return;
    const u32 o = off[s];
    if (o == GC_INVALID) {
        gc_nan_rows(out, r0, l, t, hv, j, dv, tid);
        return;
    }
    const u64 ch = ((u64)o + c) * hv + j;
    const u64 rw = 2ull * hk * dk + (u64)hv * dv;
    const T* qbase = qkv + (u64)kh * dk;
    const T* kbase = qkv + (u64)hk * dk + (u64)kh * dk;

    gc_chunk_gates(qbase, kbase, g, nullptr, rw, r0, l, hv, j, dk, q_scale, rq, rk, nullptr, Gd, nullptr, nullptr, tid);
    // Normalised q, k, transposed (token index fastest).
    for (u32 x = tid; x < dkp * GC_C; x += GC_THREADS) {
        const u32 i = x / dkp, d = x % dkp;
        float qv = 0.0f, kv = 0.0f;
        if (i < l && d < dk) {
            qv = to_f(qbase[(u64)(r0 + i) * rw + d]) * rq[i];
            kv = to_f(kbase[(u64)(r0 + i) * rw + d]) * rk[i];
        }
        Qt[d * GC_C + (i ^ gc_sw(d))] = qv;
        Kt[d * GC_C + (i ^ gc_sw(d))] = kv;
    }
    __syncthreads();
    const u32 ib = 4 * (tid / 16), cb = tid % 16;
    // P: thread rows ib .. ib + 3, key columns 4·cb .. 4·cb + 3.
    {
        float p[4][4];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) p[a][b] = 0.0f;
        for (u32 d = 0; d < dk; ++d) {
            const float4 q4 = *reinterpret_cast<const float4*>(Qt + d * GC_C + (ib ^ gc_sw(d)));
            const float4 k4 = *reinterpret_cast<const float4*>(Kt + d * GC_C + ((4 * cb) ^ gc_sw(d)));
            const float qa[4] = {q4.x, q4.y, q4.z, q4.w}, ka[4] = {k4.x, k4.y, k4.z, k4.w};
            gc_fma4x4(p, qa, ka);
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const u32 i = ib + a, m = 4 * cb + b;
                float v = 0.0f;
                if (m < i && i < l) v = p[a][b] * gc_decay((float)(Gd[i] - Gd[m]));
                else if (m == i && i < l) v = p[a][b];
                Pt[m * GC_C + i] = v;
            }
    }
    __syncthreads();
    // Q ⊙ exp(G).
    for (u32 x = tid; x < dkp * GC_C; x += GC_THREADS) {
        const u32 i = (x % GC_C) ^ gc_sw(x / GC_C);
        Qt[x] *= i < l ? gc_decay((float)Gd[i]) : 0.0f;
    }
    float acc[4][CT];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < CT; ++b) acc[a][b] = 0.0f;
    // (Q ⊙ exp(G)) S, 16 state rows at a time.
    const float* hc = hs + ch * dk * dv;
    for (u32 d0 = 0; d0 < dk; d0 += 16) {
        __syncthreads();
        for (u32 x = tid; x < 16 * DVP; x += GC_THREADS) {
            const u32 dd = x / DVP, cc = x % DVP;
            Bs[x] = (d0 + dd < dk && cc < dv) ? hc[(u64)(d0 + dd) * dv + cc] : 0.0f;
        }
        __syncthreads();
        const u32 de = dk - d0 < 16 ? dk - d0 : 16;
        for (u32 dd = 0; dd < de; ++dd) {
            const float4 q4 = *reinterpret_cast<const float4*>(Qt + (d0 + dd) * GC_C + (ib ^ gc_sw(d0 + dd)));
            const float qa[4] = {q4.x, q4.y, q4.z, q4.w};
            gc_outer4<CT>(acc, qa, Bs + dd * DVP + cb * CT);
        }
    }
    // + P Vn, 16 tokens at a time (Vn is ut, [dv][64]).
    const float* vc = ut + ch * dv * GC_C;
    for (u32 m0 = 0; m0 < l; m0 += 16) {
        __syncthreads();
        for (u32 x = tid; x < 16 * DVP; x += GC_THREADS) {
            const u32 cc = x / 16, mm = x % 16;
            Bs[mm * DVP + cc] = (cc < dv && m0 + mm < l) ? vc[(u64)cc * GC_C + m0 + mm] : 0.0f;
        }
        __syncthreads();
        const u32 me = l - m0 < 16 ? l - m0 : 16;
        for (u32 mm = 0; mm < me; ++mm) {
            const float4 p4 = *reinterpret_cast<const float4*>(Pt + (m0 + mm) * GC_C + ib);
            const float pa[4] = {p4.x, p4.y, p4.z, p4.w};
            gc_outer4<CT>(acc, pa, Bs + mm * DVP + cb * CT);
        }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const u32 i = ib + a;
        if (i >= l) continue;
        T* orow = out + ((u64)(r0 + i) * hv + j) * dv;
#pragma unroll
        for (int b = 0; b < CT; ++b) {
            const u32 cc = cb * CT + b;
            if (cc < dv) orow[cc] = from_f<T>(acc[a][b]);
        }
    }
}

#define GDN_CHUNK_OUT(T, NAME, CT)                                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                                      \
        gdn_chunk_out_c##CT##_##NAME(const T* qkv, const float* g, const u32* spans, const u32* off,          \
                                     const float* ut, const float* hs, T* out, u32 t, u32 hk, u32 hv, u32 dk,     \
                                     u32 dv, float q_scale) { porter_pdl_enter();                                                     \
        gdn_chunk_out_impl<T, CT>(qkv, g, spans, off, ut, hs, out, t, hk, hv, dk, dv, q_scale);                   \
    }
#define GDN_CHUNK_OUT_ALL(CT) GDN_CHUNK_OUT(float, f32, CT) GDN_CHUNK_OUT(bf16, bf16, CT) GDN_CHUNK_OUT(f16, f16, CT)
GDN_CHUNK_OUT_ALL(4)
GDN_CHUNK_OUT_ALL(8)
GDN_CHUNK_OUT_ALL(16)
