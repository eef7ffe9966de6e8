// Shared prelude of porter's CUDA kernels. The Rust side prepends this file to
// every kernels/cuda/*.cu source before NVRTC compiles it (NVRTC gets no file
// system include path for it), followed by a `#line 1 "<file>.cu"` directive so
// that compile errors point at the right file and line.
//
// Conventions (kernels/src/lib.rs: the CPU kernels are the reference):
// - storage types are `float`, `bf16` and `f16` (`__half`); all math is in f32;
// - an output stored as bf16 is rounded once, with round-to-nearest-even
//   (half::bf16::from_f32 on the CPU side), at the points where the CPU model
//   rounds (`round_to<T>`);
// - every kernel is instantiated per storage type as `extern "C"` entry points
//   named `<kernel>_<type>` (`<kernel>_<in>_<out>` where they differ).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// PORTER_SM80: the sm_80+ fast paths (cp.async staging, bf16 / f16 tensor-core MMAs) are
// compiled in. Not below sm_80, and not in a fallback build: the Rust side passes
// -DPORTER_FALLBACK=1 to NVRTC when PORTER_CUDA_FALLBACK=1 forces the fallback paths on any
// GPU (docs/older-gpus.md), so that the same guards apply as on an sm_70 / sm_75 device.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(PORTER_FALLBACK)
#define PORTER_SM80 1
#endif

typedef __nv_bfloat16 bf16;
typedef __half f16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Programmatic dependent launch (PDL, sm_90+). Every kernel's first statement is
// porter_pdl_enter(): it waits until the grid launched before it in the stream has completed
// and its writes are visible (griddepcontrol.wait), then lets the grid after it launch
// (griddepcontrol.launch_dependents), so that grid's launch and block start-up overlap this
// grid's run instead of following it. Both are no-ops below sm_90 and when the grid was not
// launched with the programmatic-serialization attribute (CudaKernels::launch_fn sets it on
// sm_90 unless PORTER_PDL=off). Correct only if *every* kernel waits before its first global
// access: a grid that has not waited may run beside its predecessor (and so may everything
// after it), so a new __global__ function starts with this call (a test checks each one).
//
// The device timeline (PORTER_TIMELINE, kernels/src/cuda/timeline.rs; a diagnostic for `porter
// bench`): only in the modules built with it (the host then prepends `#define PORTER_TIMELINE`
// to every source, so the normal build has none of this). Thread 0 of block 0 appends the
// %globaltimer time at which its wait returned, i.e. when the launch before it had completed,
// to the buffer porter_tl_buf points at (set by the host for each module). Launches pass their
// waits one after another in stream order, so consecutive records are the critical path's cost
// of each launch in place. buf[0]: records taken (an atomic count), buf[1]: the buffer's length
// in u64 words, records from buf[2].
#ifdef PORTER_TIMELINE
__device__ unsigned long long* porter_tl_buf;
#endif
__device__ __forceinline__ void porter_tl_mark(unsigned long long t) {
#ifdef PORTER_TIMELINE
    if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0u) {
        unsigned long long* b = *(unsigned long long* volatile*)&porter_tl_buf;
        if (b != nullptr) {
            const unsigned long long s = atomicAdd(b, 1ull);
            if (s + 2ull < b[1]) b[2 + s] = t;
        }
    }
#endif
}
__device__ __forceinline__ unsigned long long porter_tl_now() {
    unsigned long long t = 0;
#ifdef PORTER_TIMELINE
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
    return t;
}

__device__ __forceinline__ void porter_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    // The time is read at once, written after the dependents' launch is allowed (the record's
    // load and atomic do not delay it).
    const unsigned long long t = porter_tl_now();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    porter_tl_mark(t);
}

// A hint to bring the 128-byte line of `p` into L2 (no data returned; harmless to issue before
// porter_pdl_enter() on data the previous kernel may write: L2 is the point of coherence).
__device__ __forceinline__ void porter_prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#endif
}

// (x, y) rounded to T (nearest even) and packed, x in the low half (every architecture: the
// bf16 conversion is emulated below sm_80).
template <typename T> __device__ __forceinline__ unsigned int pack2_rn(float x, float y);
template <> __device__ __forceinline__ unsigned int pack2_rn<__nv_bfloat16>(float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const unsigned int*>(&h);
}
template <> __device__ __forceinline__ unsigned int pack2_rn<__half>(float x, float y) {
    const __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<const unsigned int*>(&h);
}

#define PORTER_NAN __int_as_float(0x7fc00000)
#define PORTER_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(f16 x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16 from_f<f16>(float x) { return __float2half_rn(x); }

// `DType::round`: round an f32 to the storage type T and back.
template <typename T> __device__ __forceinline__ float round_to(float x) { return to_f(from_f<T>(x)); }

// SiLU `x·σ(x)` as `x / (1 + e^-x)` (the CPU formula).
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
// Logistic sigmoid `1 / (1 + e^-x)`.
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum, returned to every thread. `tid` is the linear thread index,
// `nthreads` the block size (a multiple of 32, at most 1024); `sh` holds at
// least 32 floats. Starts with a barrier, so `sh` may be reused by the next call.
__device__ __forceinline__ float block_sum(float v, float* sh, u32 tid, u32 nthreads) {
    const u32 lane = tid & 31u, w = tid >> 5, nw = nthreads >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(r);
}

// Elements a thread of a one-block-per-row norm kernel holds in registers (norm.cu, misc.cu).
#define NORM_NPT 8

// A one-row norm's weights for this thread on the register path (elements threadIdx.x +
// j·blockDim.x, 0 past d), in f32: rms_norm_pdl (norm.cu) and add_rms_norm_pdl (misc.cu) read
// them before the PDL wait, or after it with the preload off.
template <typename T>
__device__ __forceinline__ void norm_row_weights(const T* __restrict__ w, u32 d, float (&wv)[NORM_NPT]) {
#pragma unroll
    for (int j = 0; j < NORM_NPT; ++j) {
        const u32 i = threadIdx.x + j * blockDim.x;
        wv[j] = i < d ? to_f(w[i]) : 0.0f;
    }
}

// Block-wide max, returned to every thread (same contract as block_sum).
__device__ __forceinline__ float block_max(float v, float* sh, u32 tid, u32 nthreads) {
    const u32 lane = tid & 31u, w = tid >> 5, nw = nthreads >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : PORTER_NEG_INF;
    return warp_max(r);
}

// `(v, i)` beats `(bv, bi)`: larger value, or equal value and lower index.
// NaN values never win.
__device__ __forceinline__ bool beats(float v, u32 i, float bv, u32 bi) {
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_argmax(float& v, u32& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        u32 oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (beats(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// Block-wide argmax (ties to the lower index), returned to every thread.
// `shv` / `shi` hold at least 32 entries each. Starts with a barrier.
__device__ __forceinline__ void block_argmax(float& v, u32& i, float* shv, u32* shi, u32 tid, u32 nthreads) {
    const u32 lane = tid & 31u, w = tid >> 5, nw = nthreads >> 5;
    warp_argmax(v, i);
    __syncthreads();
    if (lane == 0) {
        shv[w] = v;
        shi[w] = i;
    }
    __syncthreads();
    v = lane < nw ? shv[lane] : PORTER_NEG_INF;
    i = lane < nw ? shi[lane] : 0xffffffffu;
    warp_argmax(v, i);
}

#if defined(PORTER_SM80)
// Shared mma.sync helpers of the tensor-core kernels (attention_decode.cu, attention_mma.cu,
// gdn_chunk_tc2.cu).

// Element offset of 16-byte chunk c of row r of a swizzled [rows][DP] tile.
template <int DP>
__device__ __forceinline__ u32 pm_sw(u32 r, u32 c) {
    return r * (u32)DP + ((c ^ (r & 7u)) << 3);
}

// ldmatrix x4 (and its transposed form) from the shared address `addr`.
__device__ __forceinline__ void pm_ldsm(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void pm_ldsm_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The 8 × 8 16-bit matrix whose fragment (lane l: row l / 4, columns 2·(l % 4) + {0, 1}) is
// `x`, transposed in registers (movmatrix, sm_75+): the lane gets row l / 4 of the transpose.
__device__ __forceinline__ u32 pm_movt(u32 x) {
    u32 y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// d += a · b (m16n8k16, f32 accumulators) and the 16-bit pair packing of T.
template <typename T>
struct PMma;
template <>
struct PMma<bf16> {
    static __device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // (x, y) rounded to bf16, x in the low half (the lower column).
    static __device__ __forceinline__ u32 pack(float x, float y) { return pack2_rn<bf16>(x, y); }
    static __device__ __forceinline__ float2 unpack(u32 u) {
        return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
    }
};
template <>
struct PMma<f16> {
    static __device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float x, float y) { return pack2_rn<f16>(x, y); }
    static __device__ __forceinline__ float2 unpack(u32 u) {
        return __half22float2(*reinterpret_cast<const __half2*>(&u));
    }
};
#endif
