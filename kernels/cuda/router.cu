// Selection kernels on f32 scores: the MoE router (softmax -> top-k ->
// optional renormalisation) and greedy argmax over the vocabulary.
// Preceded by common.cuh.

#define ROUTER_MAX_K 16

// MoE router, one block per row. logits [rows, e] (f32), idx [rows, k] (u32),
// weights [rows, k] (f32). Dynamic shared memory: e floats.
// p = softmax(logits) (p_i = exp(l_i − max) · (1 / Σ)); the k largest p in
// descending order, ties to the lower index (torch.topk on CPU, and
// porter_core::nn::Moe::route); a NaN p ranks below every number (ties among
// NaNs to the lower index); with `renorm`, each weight is divided by the
// sum of the selected p, summed in selection order. A row whose logits are all
// −inf gives p = 0 everywhere, like the CPU softmax.
// Requires 1 <= k <= min(e, ROUTER_MAX_K) (checked by the Rust wrapper).
// `stride` is the row stride of `logits` (e, or wider when the router logits are the
// first e columns of a stacked GEMM output).
//
// The selection (why: the first form, moe_router_rounds_f32 below, ran k rounds of a
// block argmax, three barriers and a serial step each: 8–9 µs at e = 512, k = 10 on an
// H200, for ~1 µs of softmax). Each element gets a u64 key that orders it exactly as
// above (router_key), so a larger key is a better element and keys are unique:
// 1. every warp takes the top min(k, its elements) of its slice (thread tid holds
//    elements tid, tid + nt, ...) by warp shuffles only: k rounds of a warp max of the
//    lanes' best keys, the winning lane moving on to its next best (a u32 mask of its
//    taken elements: at most 8192 experts over 256 threads, 32 a thread);
// 2. one barrier; the ≤ nw·k candidates hold the row's top k (each warp's top k holds
//    the row's top-k members of its slice). Every candidate counts the candidates with a
//    larger key: that is its rank, and ranks < k are the selection, in order. One more
//    barrier; thread j < k writes pair j.
// The softmax is the first form's (same threads, max, sum and multiply), so p, the
// selection and the weights are bit-identical to it (but for rows whose p are NaN, where
// it repeated a selected index: see moe_router_rounds_f32).

// p = softmax of a row of e logits into p[0..e) (shared memory), every thread ending
// after a barrier: the max, the exponentials' sum and the multiply of both router forms.
__device__ __forceinline__ void router_softmax(const float* __restrict__ l, float* p, float* shv, u32 e, u32 tid,
                                               u32 nt) {
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
}

// The selection order as one u64: high word 1 + the bits of p for a number (p >= 0, so
// its bits order as its value; −0 as +0, equal values tie), 0 for NaN; low word ~i (the
// lower index wins a tie). 0 is "no element" (below every key).
__device__ __forceinline__ u64 router_key(float v, u32 i) {
    const u32 hi = v == v ? (__float_as_uint(v) & 0x7fffffffu) + 1u : 0u;
    return ((u64)hi << 32) | (u64)(~i);
}

// The best key among thread tid's elements tid + m·nt (m < cnt) not in `taken`.
__device__ __forceinline__ u64 router_local_best(const float* p, u32 tid, u32 nt, u32 cnt, u32 taken) {
    u64 best = 0;
    for (u32 m = 0; m < cnt; ++m) {
        if (taken >> m & 1u) continue;
        const u32 i = tid + m * nt;
        const u64 key = router_key(p[i], i);
        best = key > best ? key : best;
    }
    return best;
}

__device__ __forceinline__ u64 warp_max_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

extern "C" __global__ void moe_router_f32(const float* __restrict__ logits, u32* __restrict__ idx,
                                          float* __restrict__ weights, u32 e, u32 k, int renorm, u32 stride) {
    extern __shared__ float p[];
    __shared__ float shv[32];
    __shared__ u64 cand[32 * ROUTER_MAX_K];
    __shared__ float selw[ROUTER_MAX_K];
    __shared__ u32 seli[ROUTER_MAX_K];
    const u32 tid = threadIdx.x, nt = blockDim.x, lane = tid & 31u, w = tid >> 5, nw = nt >> 5;
    const u64 r = blockIdx.x;
    router_softmax(logits + r * stride, p, shv, e, tid, nt);

    // 1. The warp's top k (key 0 once its slice is exhausted).
    const u32 cnt = tid < e ? (e - tid + nt - 1) / nt : 0u;
    u32 taken = 0u;
    u64 mine = router_local_best(p, tid, nt, cnt, taken);
    for (u32 j = 0; j < k; ++j) {
        const u64 best = warp_max_u64(mine);
        if (best == 0) {
            // Uniform across the warp: its slice is exhausted; the rest of its slots are empty.
            for (u32 q = j + lane; q < k; q += 32u) cand[w * k + q] = 0;
            break;
        }
        if (lane == 0) cand[w * k + j] = best;
        if (mine == best) {
            // Keys are unique: this lane holds the winner, and moves on to its next best.
            taken |= 1u << ((~(u32)best - tid) / nt);
            mine = router_local_best(p, tid, nt, cnt, taken);
        }
    }
    __syncthreads();

    // 2. Rank of each candidate among all of them.
    const u32 nc = nw * k;
    for (u32 c = tid; c < nc; c += nt) {
        const u64 key = cand[c];
        if (key == 0) continue;
        u32 rank = 0;
        for (u32 d = 0; d < nc; ++d) rank += cand[d] > key ? 1u : 0u;
        if (rank < k) {
            const u32 i = ~(u32)key;
            seli[rank] = i;
            selw[rank] = p[i];
        }
    }
    __syncthreads();
    if (tid < k) {
        float s = 0.0f;
        if (renorm)
            for (u32 j = 0; j < k; ++j) s += selw[j];
        idx[r * k + tid] = seli[tid];
        weights[r * k + tid] = renorm ? selw[tid] / s : selw[tid];
    }
}

// The first form of the router (k rounds of a block argmax; kept as the timing baseline
// and oracle of kernels/tests/cuda_router.rs, launched by `moe_router_rounds`): the same
// softmax and, for rows of numbers, the same selection. A row whose p are NaN (a NaN or
// +inf logit) takes index 0 first, then, as a selected entry's −inf mark ties the empty
// start (−inf, ~0) and wins by index, index 0 again with weight −inf each round.
extern "C" __global__ void moe_router_rounds_f32(const float* __restrict__ logits, u32* __restrict__ idx,
                                                 float* __restrict__ weights, u32 e, u32 k, int renorm, u32 stride) {
    extern __shared__ float p[];
    __shared__ float shv[32];
    __shared__ u32 shi[32];
    __shared__ float selw[ROUTER_MAX_K];
    __shared__ u32 seli[ROUTER_MAX_K];
    const u32 tid = threadIdx.x, nt = blockDim.x;
    const u64 r = blockIdx.x;
    router_softmax(logits + r * stride, p, shv, e, tid, nt);
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
