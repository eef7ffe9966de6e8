// Selection kernels on f32 scores: the MoE router (softmax -> top-k ->
// optional renormalisation) and greedy argmax over the vocabulary.
// Preceded by common.cuh.

#define ROUTER_MAX_K 16

// MoE router, one block per row. logits [rows, e] (f32), idx [rows, k] (u32),
// weights [rows, k] (f32). Dynamic shared memory: e floats.
// p = softmax(logits) (p_i = exp(l_i − max) · (1 / Σ)); the k largest p in
// descending order, ties to the lower index (torch.topk on CPU, and
// porter_core::nn::Moe::route); with `renorm`, each weight is divided by the
// sum of the selected p, summed in selection order. A row whose logits are all
// −inf gives p = 0 everywhere, like the CPU softmax.
// Requires 1 <= k <= min(e, ROUTER_MAX_K) (checked by the Rust wrapper).
// `stride` is the row stride of `logits` (e, or wider when the router logits are the
// first e columns of a stacked GEMM output).
extern "C" __global__ void moe_router_f32(const float* __restrict__ logits, u32* __restrict__ idx,
                                          float* __restrict__ weights, u32 e, u32 k, int renorm, u32 stride) {
    extern __shared__ float p[];
    __shared__ float shv[32];
    __shared__ u32 shi[32];
    __shared__ float selw[ROUTER_MAX_K];
    __shared__ u32 seli[ROUTER_MAX_K];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    const u64 r = blockIdx.x;
    const float* l = logits + r * stride;

    float m = PORTER_NEG_INF;
    for (u32 i = tid; i < e; i += nt) m = fmaxf(m, l[i]);
    m = block_max(m, shv, tid, nt);
    if (m == PORTER_NEG_INF) {
        for (u32 i = tid; i < e; i += nt) p[i] = 0.0f;
    } else {
        float s = 0.0f;
        for (u32 i = tid; i < e; i += nt) {
            const float v = expf(l[i] - m);
            p[i] = v;
            s += v;
        }
        s = block_sum(s, shv, tid, nt);
        const float inv = 1.0f / s;
        for (u32 i = tid; i < e; i += nt) p[i] *= inv;
    }
    __syncthreads();

    for (u32 j = 0; j < k; ++j) {
        float bv = PORTER_NEG_INF;
        u32 bi = 0xffffffffu;
        for (u32 i = tid; i < e; i += nt) {
            const float v = p[i];
            if (beats(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        block_argmax(bv, bi, shv, shi, tid, nt);
        if (tid == 0) {
            // bi < e: there are e - j >= 1 unselected entries, all >= 0 or NaN;
            // an all-NaN remainder falls back to the lowest unselected index.
            if (bi >= e) {
                for (u32 i = 0; i < e; ++i) {
                    if (p[i] != PORTER_NEG_INF) {
                        bi = i;
                        break;
                    }
                }
            }
            seli[j] = bi;
            selw[j] = p[bi];
            p[bi] = PORTER_NEG_INF;  // selected: never picked again
        }
        __syncthreads();
    }

    if (tid == 0) {
        float s = 0.0f;
        for (u32 j = 0; j < k; ++j) s += selw[j];
        for (u32 j = 0; j < k; ++j) {
            idx[r * k + j] = seli[j];
            weights[r * k + j] = renorm ? selw[j] / s : selw[j];
        }
    }
}

// The same router, one warp per row with the probabilities in registers, for e ≤
// 32·Q (the block kernel above beyond). Why: decode routes one to a few rows, and
// the block form (k rounds of two barriers and a serial step on thread 0) took
// 8.4 µs of a ~100 µs layer on the H200. Same selection rules, ties, NaN
// handling, fallback and weights as moe_router_f32; only the softmax sum's
// order differs (lane-strided partial sums, then a butterfly), so p can differ
// from it in the last bit. Lane l holds p_i for i = l + 32·q (q < Q); entries
// past e are NaN (never selected); selected entries become −inf, as in the
// block kernel. Each lane keeps its own best entry (its "head", by `beats`:
// the same order as a scan of all entries), so a round is one warp argmax over
// the heads and a rescan of the winning lane's Q entries, not a scan of all e.
template <u32 Q>
__device__ __forceinline__ void lane_head(const float (&p)[Q], u32 lane, float& hv, u32& hi) {
    hv = PORTER_NEG_INF;
    hi = 0xffffffffu;
#pragma unroll
    for (u32 q = 0; q < Q; ++q)
        if (beats(p[q], lane + 32u * q, hv, hi)) {
            hv = p[q];
            hi = lane + 32u * q;
        }
}

template <u32 Q>
__device__ __forceinline__ void router_warp(const float* __restrict__ logits, u32* __restrict__ idx,
                                            float* __restrict__ weights, u32 rows, u32 e, u32 k, int renorm,
                                            u32 stride) {
    const u32 lane = threadIdx.x & 31u;
    const u64 r = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const float* l = logits + r * stride;
    const float nan = __int_as_float(0x7fc00000);
    float p[Q];
    float m = PORTER_NEG_INF;
#pragma unroll
    for (u32 q = 0; q < Q; ++q) {
        const u32 i = lane + 32u * q;
        p[q] = i < e ? __ldg(l + i) : nan;
        if (i < e) m = fmaxf(m, p[q]);
    }
    m = warp_max(m);
    if (m == PORTER_NEG_INF) {
#pragma unroll
        for (u32 q = 0; q < Q; ++q)
            if (lane + 32u * q < e) p[q] = 0.0f;
    } else {
        float s = 0.0f;
#pragma unroll
        for (u32 q = 0; q < Q; ++q)
            if (lane + 32u * q < e) {
                p[q] = expf(p[q] - m);
                s += p[q];
            }
        const float inv = 1.0f / warp_sum(s);
#pragma unroll
        for (u32 q = 0; q < Q; ++q)
            if (lane + 32u * q < e) p[q] *= inv;
    }
    float hv;
    u32 hi;
    lane_head<Q>(p, lane, hv, hi);
    // Lane j < k keeps selection j.
    u32 my_i = 0u;
    float my_w = 0.0f;
    for (u32 j = 0; j < k; ++j) {
        float bv = hv;
        u32 bi = hi;
        warp_argmax(bv, bi);
        if (bi >= e) {
            // The lowest unselected index (p != −inf; NaN counts as unselected).
            u32 lo = 0xffffffffu;
#pragma unroll
            for (u32 q = Q; q-- > 0;)
                if (lane + 32u * q < e && p[q] != PORTER_NEG_INF) lo = lane + 32u * q;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            bi = lo;
        }
        float v = 0.0f;
        if ((bi & 31u) == lane) {
#pragma unroll
            for (u32 q = 0; q < Q; ++q)
                if (lane + 32u * q == bi) {
                    v = p[q];
                    p[q] = PORTER_NEG_INF;  // selected: never picked again
                }
            lane_head<Q>(p, lane, hv, hi);
        }
        v = __shfl_sync(0xffffffffu, v, bi & 31u);
        if (lane == j) {
            my_i = bi;
            my_w = v;
        }
    }
    // Σ of the selected weights in selection order, as the block kernel.
    float s = 0.0f;
    for (u32 j = 0; j < k; ++j) s += __shfl_sync(0xffffffffu, my_w, j);
    if (lane < k) {
        idx[r * k + lane] = my_i;
        weights[r * k + lane] = renorm ? my_w / s : my_w;
    }
}

#define ROUTER_WARP(Q)                                                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                                            \
        moe_router_warp##Q##_f32(const float* logits, u32* idx, float* weights, u32 rows, u32 e, u32 k, int renorm, \
                                 u32 stride) {                                                                   \
        router_warp<Q>(logits, idx, weights, rows, e, k, renorm, stride);                                        \
    }
ROUTER_WARP(8)
ROUTER_WARP(16)
ROUTER_WARP(32)

// Greedy argmax per row (the first index on ties, as torch.argmax and
// porter_core::sampling::argmax). logits [rows, v] (f32), out [rows] (u32).
// One block per row. NaN values never win; an all-NaN row gives 0.
extern "C" __global__ void argmax_f32(const float* __restrict__ logits, u32* __restrict__ out, u32 v) {
    __shared__ float shv[32];
    __shared__ u32 shi[32];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    const u64 r = blockIdx.x;
    const float* l = logits + r * v;
    float bv = PORTER_NEG_INF;
    u32 bi = 0xffffffffu;
    for (u32 i = tid; i < v; i += nt) {
        const float x = l[i];
        if (beats(x, i, bv, bi)) {
            bv = x;
            bi = i;
        }
    }
    block_argmax(bv, bi, shv, shi, tid, nt);
    if (tid == 0) out[r] = bi < v ? bi : 0u;
}
