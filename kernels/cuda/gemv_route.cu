// The MoE input GEMV with the router in its last block (part of the misc module,
// kernels/src/cuda/compile.rs; preceded by common.cuh, router_sel.cu and misc.cu). Launch
// wrapper: kernels/src/cuda/misc.rs `CudaKernels::gemv_route`.
//
// Why: at decode the router (softmax, top-k, renormalisation over the first e columns of the
// MoE input product) is a one-warp launch of its own between this GEMV and the experts'
// gate+up kernel: 4.6 µs a layer in place (H100, knock-in, session 23) for about 1.5 µs of
// work; the rest is the dependent launch waiting for this grid to complete and then for its own
// loads. Here the block that finishes last routes, right after the logits exist.
//
// Every block runs gemv_block exactly as gemv_<T>_f32_m<M> does (same split, same column
// blocks: the logits' bits are that kernel's), makes its stores visible (__threadfence by every
// thread that stored) and counts itself done on `counter`. The block that arrives last has
// seen every other block's count, so every logit: it stages the m rows' first e logits in
// shared memory with L2 loads (ld.cg: they were written by other SMs during this grid) and
// warp r < m runs router_warp_row (router_sel.cu: moe_router_warp_f32's code, so the same
// ids and weights bit for bit) on row r. It then zeroes the counter for the next launch: kernels
// of a stream never overlap there (each one waits for its predecessor's completion before its
// first global access, porter_pdl_enter).
//
// Grid ceil(n / (8 / split)), 256 threads, as gemv_<T>_f32_m<M>; m ≤ M ≤ 4 rows (one warp a
// row to route); e ≤ 32 · ROUTER_WARP_J, 1 ≤ topk ≤ min(e, ROUTER_MAX_K) (checked by the host);
// counter: one u32, zero before the launch and after it. idx [m, topk] (u32), wts [m, topk].

template <typename T, int M>
__device__ __forceinline__ void gemv_route_impl(const T* __restrict__ x, const T* __restrict__ w,
                                                float* __restrict__ out, u32 m, u32 k, u32 n, u32 split,
                                                u32* __restrict__ counter, u32 e, u32 topk, int renorm,
                                                u32* __restrict__ idx, float* __restrict__ wts) {
    static_assert(M <= 8, "one warp a row to route");
    __shared__ float red[8][M];
    __shared__ float lg[M][32 * ROUTER_WARP_J];
    __shared__ u32 last;
    gemv_block<T, float, M, false>(x, w, out, m, k, n, split, blockIdx.x, red);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1u;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (u32 i = threadIdx.x; i < m * e; i += blockDim.x) {
        const u32 r = i / e, c = i - r * e;
        lg[r][c] = __ldcg(out + (u64)r * n + c);
    }
    __syncthreads();
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    if (warp < m) router_warp_row(lg[warp], e, topk, renorm, lane, idx + (u64)warp * topk, wts + (u64)warp * topk);
    if (threadIdx.x == 0) *counter = 0u;
}

#define PORTER_GEMV_ROUTE(NT, T, M)                                                                              \
    extern "C" __global__ void __launch_bounds__(256) gemv_route_##NT##_m##M(                                     \
        const T* x, const T* w, float* out, u32 m, u32 k, u32 n, u32 split, u32* counter, u32 e, u32 topk,        \
        int renorm, u32* idx, float* wts) { porter_pdl_enter();                                                   \
        gemv_route_impl<T, M>(x, w, out, m, k, n, split, counter, e, topk, renorm, idx, wts);                    \
    }
#define PORTER_GEMV_ROUTE_M(NT, T) PORTER_GEMV_ROUTE(NT, T, 1) PORTER_GEMV_ROUTE(NT, T, 2) PORTER_GEMV_ROUTE(NT, T, 4)
PORTER_GEMV_ROUTE_M(f32, float)
PORTER_GEMV_ROUTE_M(bf16, bf16)
PORTER_GEMV_ROUTE_M(f16, f16)
