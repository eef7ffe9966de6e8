#line 1 "kv_quant.cu"
// Quantized KV cache (1 byte per element, one f32 scale per (token, KV head)):
// the device encoders / decoders and the quantizing append. Compiled as the
// first part of the attention source (attention.cu's kernels read quantized
// pools through kvq_load4 / kvq_load8 below; kernels/src/cuda/kv_quant.rs has
// the launch wrappers).
//
// KQ = 1: float8 e4m3fn, scale = amax / 448, q = e4m3(x / scale) (round to
// nearest even, saturated to +-448). KQ = 2: int8, scale = amax / 127, q =
// clamp(rint(x / scale), -127, 127). amax = 0 (or not finite): scale 1. The same
// f32 division and rounding as porter_kernels::cpu::kv_quant, so the bytes and
// scales are bit-identical to the CPU backend's. Dequantized values are
// decode(q) * scale in f32, then rounded to the model dtype T (as a T cache
// would hold them): the attention kernels stage them in T like an unquantized
// tile.

#define KVQ_FP8 1
#define KVQ_I8 2

// x (finite or not) to the nearest e4m3fn byte: ties to even, saturated to
// +-448, NaN -> 0x7F (cpu::fp8::f32_to_e4m3).
__device__ __forceinline__ u32 kvq_e4m3(float x) {
    const u32 bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fu;
    const u32 sign = (bits >> 24) & 0x80u;
    const float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7eu;
    const u32 ab = __float_as_uint(a);
    const int ex = (int)(ab >> 23) - 127;
    if (ex < -6) return sign | (u32)rintf(a * 512.0f);
    u32 m = (ab & 0x7fffffu) >> 20, e = (u32)(ex + 7);
    const u32 rem = ab & 0xfffffu, half = 1u << 19;
    if (rem > half || (rem == half && (m & 1u))) {
        if (++m == 8u) {
            m = 0u;
            ++e;
        }
    }
    const u32 c = (e << 3) | m;
    return sign | (c > 0x7eu ? 0x7eu : c);
}

// The value of an e4m3fn byte (exact; 0x7f / 0xff, never written, decode as 480).
__device__ __forceinline__ float kvq_e4m3_val(u32 b) {
    const u32 e = (b >> 3) & 15u, m = b & 7u;
    const float mag = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -mag : mag;
}

template <int KQ>
__device__ __forceinline__ u32 kvq_encode(float x, float s) {
    const float y = __fdiv_rn(x, s);
    if constexpr (KQ == KVQ_FP8) {
        return kvq_e4m3(y);
    } else {
        const float r = y != y ? 0.0f : fminf(fmaxf(rintf(y), -127.0f), 127.0f);
        return (u32)(unsigned char)(signed char)(int)r;
    }
}

template <int KQ>
__device__ __forceinline__ float kvq_decode(u32 b) {
    if constexpr (KQ == KVQ_FP8) {
        return kvq_e4m3_val(b & 0xffu);
    } else {
        return (float)(signed char)(unsigned char)(b & 0xffu);
    }
}

// Four quantized bytes at `src` (aligned to 4 when `vec` and n >= 4, else n < 4
// valid, zeros after) -> four T at `dst`, dequantized with scale `s`.
template <typename T, int KQ>
__device__ __forceinline__ void kvq_load4(T* dst, const unsigned char* src, float s, u32 n, bool vec) {
    if (vec && n >= 4) {
        const u32 w = __ldg(reinterpret_cast<const unsigned int*>(src));
#pragma unroll
        for (u32 e = 0; e < 4; ++e) dst[e] = from_f<T>(__fmul_rn(kvq_decode<KQ>(w >> (8 * e)), s));
    } else {
#pragma unroll
        for (u32 e = 0; e < 4; ++e) dst[e] = e < n ? from_f<T>(__fmul_rn(kvq_decode<KQ>(src[e]), s)) : from_f<T>(0.0f);
    }
}

// Eight quantized bytes (8-byte aligned) -> eight T, or zeros when !valid.
template <typename T, int KQ>
__device__ __forceinline__ void kvq_load8(T* dst, const unsigned char* src, float s, bool valid) {
    if (!valid) {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = from_f<T>(0.0f);
        return;
    }
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(src));
#pragma unroll
    for (u32 e = 0; e < 4; ++e) {
        dst[e] = from_f<T>(__fmul_rn(kvq_decode<KQ>(w.x >> (8 * e)), s));
        dst[4 + e] = from_f<T>(__fmul_rn(kvq_decode<KQ>(w.y >> (8 * e)), s));
    }
}

// One head row of D values (one warp, lane = threadIdx.x % 32): amax, scale,
// bytes.
template <typename T, int KQ>
__device__ __forceinline__ void kvq_head(const T* __restrict__ x, unsigned char* __restrict__ q,
                                         float* __restrict__ sc, u32 D, u32 lane) {
    float amax = 0.0f;
    for (u32 i = lane; i < D; i += 32) amax = fmaxf(amax, fabsf(to_f(x[i])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float qmax = KQ == KVQ_FP8 ? 448.0f : 127.0f;
    const float s = (amax > 0.0f && amax <= 3.402823466e38f) ? __fdiv_rn(amax, qmax) : 1.0f;
    for (u32 i = lane; i < D; i += 32) q[i] = (unsigned char)kvq_encode<KQ>(to_f(x[i]), s);
    if (lane == 0) *sc = s;
}

// One warp per (batch row r, KV head h): row r's head h goes to slot slots[r]
// (bytes [slot][h][D], scale [slot][h]); padding (slot >= n_slots) is skipped.
// Grid: ceil(t * kvh * 32 / blockDim.x) blocks, blockDim.x a multiple of 32.
template <typename T, int KQ>
__device__ __forceinline__ void kv_append_q_impl(const T* __restrict__ k, const T* __restrict__ v,
                                                 const u32* __restrict__ slots, unsigned char* __restrict__ kp,
                                                 unsigned char* __restrict__ vp, float* __restrict__ ksc,
                                                 float* __restrict__ vsc, u32 t, u32 kvh, u32 D, u32 n_slots) {
    const u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31u;
    if (w >= (u64)t * kvh) return;  // whole warps
    const u32 r = (u32)(w / kvh), h = (u32)(w % kvh);
    const u32 slot = slots[r];
    if (slot >= n_slots) return;
    const u64 src = ((u64)r * kvh + h) * D, dst = ((u64)slot * kvh + h) * D, si = (u64)slot * kvh + h;
    kvq_head<T, KQ>(k + src, kp + dst, ksc + si, D, lane);
    kvq_head<T, KQ>(v + src, vp + dst, vsc + si, D, lane);
}

#define KV_APPEND_Q(T, NAME, KQ, QN)                                                                            \
    extern "C" __global__ void kv_append_##NAME##_##QN(const T* k, const T* v, const u32* slots,               \
                                                       unsigned char* kp, unsigned char* vp, float* ksc,       \
                                                       float* vsc, u32 t, u32 kvh, u32 D, u32 n_slots) { porter_pdl_enter();       \
        kv_append_q_impl<T, KQ>(k, v, slots, kp, vp, ksc, vsc, t, kvh, D, n_slots);                            \
    }

#ifndef PORTER_ATTN_HELPERS_ONLY  // the mma module (attention_mma.cu) takes the helpers only
KV_APPEND_Q(float, f32, KVQ_FP8, fp8)
KV_APPEND_Q(bf16, bf16, KVQ_FP8, fp8)
KV_APPEND_Q(f16, f16, KVQ_FP8, fp8)
KV_APPEND_Q(float, f32, KVQ_I8, i8)
KV_APPEND_Q(bf16, bf16, KVQ_I8, i8)
KV_APPEND_Q(f16, f16, KVQ_I8, i8)
#endif

