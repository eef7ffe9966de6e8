// On-device sampling (one row per block): appended to attention.cu and attention_tc.cu in
// one module (kernels/src/cuda/compile.rs; launch wrapper in kernels/src/cuda/attention.rs).

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
                u32 vocab) { porter_pdl_enter();
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
