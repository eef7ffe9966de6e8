// Gathers and element-wise kernels: embedding, SwiGLU activation,
// sigmoid-gate multiply, partial NeoX RoPE.
// Preceded by common.cuh (prepended by the Rust side).

// ---------------------------------------------------------------------------
// Embedding gather: out[r, :] = table[ids[r], :] as f32 (the residual stream is
// f32). An id >= vocab gives a NaN row (the table is never read out of bounds;
// callers validate ids first, as Model::forward does).
// grid (rows), block (any multiple of 32).
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void embedding_impl(const T* __restrict__ table, const u32* __restrict__ ids,
                                               float* __restrict__ out, u32 hidden, u32 vocab) {
    const u64 r = blockIdx.x;
    const u32 id = ids[r];
    float* o = out + r * hidden;
    if (id >= vocab) {
        for (u32 i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = PORTER_NAN;
        return;
    }
    const T* src = table + (u64)id * hidden;
    for (u32 i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = to_f(src[i]);
}

extern "C" __global__ void embedding_f32(const float* table, const u32* ids, float* out, u32 hidden, u32 vocab) { porter_pdl_enter();
    embedding_impl<float>(table, ids, out, hidden, vocab);
}
extern "C" __global__ void embedding_bf16(const bf16* table, const u32* ids, float* out, u32 hidden, u32 vocab) { porter_pdl_enter();
    embedding_impl<bf16>(table, ids, out, hidden, vocab);
}
extern "C" __global__ void embedding_f16(const f16* table, const u32* ids, float* out, u32 hidden, u32 vocab) { porter_pdl_enter();
    embedding_impl<f16>(table, ids, out, hidden, vocab);
}

// ---------------------------------------------------------------------------
// SwiGLU activation, one rounding: out = round(silu(g) · u).
// Separate form: g, u, out all [n]. Fused form: gu [rows, 2·inter] holding
// [gate | up] per row, out [rows, inter]. Grid-stride loop over n elements.
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void swiglu_impl(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ out,
                                            u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        out[i] = from_f<T>(silu_f(to_f(g[i])) * to_f(u[i]));
    }
}

template <typename T>
__device__ __forceinline__ void swiglu_fused_impl(const T* __restrict__ gu, T* __restrict__ out, u64 rows, u32 inter) {
    const u64 n = rows * inter;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / inter, c = i % inter;
        const T* row = gu + r * 2 * inter;
        out[i] = from_f<T>(silu_f(to_f(row[c])) * to_f(row[inter + c]));
    }
}

extern "C" __global__ void swiglu_f32(const float* g, const float* u, float* out, u64 n) { porter_pdl_enter(); swiglu_impl<float>(g, u, out, n); }
extern "C" __global__ void swiglu_bf16(const bf16* g, const bf16* u, bf16* out, u64 n) { porter_pdl_enter(); swiglu_impl<bf16>(g, u, out, n); }
extern "C" __global__ void swiglu_f16(const f16* g, const f16* u, f16* out, u64 n) { porter_pdl_enter(); swiglu_impl<f16>(g, u, out, n); }
extern "C" __global__ void swiglu_fused_f32(const float* gu, float* out, u64 rows, u32 inter) { porter_pdl_enter();
    swiglu_fused_impl<float>(gu, out, rows, inter);
}
extern "C" __global__ void swiglu_fused_bf16(const bf16* gu, bf16* out, u64 rows, u32 inter) { porter_pdl_enter();
    swiglu_fused_impl<bf16>(gu, out, rows, inter);
}
extern "C" __global__ void swiglu_fused_f16(const f16* gu, f16* out, u64 rows, u32 inter) { porter_pdl_enter();
    swiglu_fused_impl<f16>(gu, out, rows, inter);
}

// ---------------------------------------------------------------------------
// Sigmoid-gate multiply, in place (attention output gate of Qwen3-Next):
// x = round(x · round(σ(gate))). x [rows, d]; gate [rows, gd] with gd = d
// (element-wise) or gd = 1 (one gate per row).
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void sigmoid_gate_mul_impl(T* __restrict__ x, const T* __restrict__ gate, u64 rows, u32 d,
                                                      u32 gd) {
    const u64 n = rows * d;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / d, c = i % d;
        const float gv = to_f(gate[r * gd + (gd == 1 ? 0 : c)]);
        x[i] = from_f<T>(to_f(x[i]) * round_to<T>(sigmoid_f(gv)));
    }
}

extern "C" __global__ void sigmoid_gate_mul_f32(float* x, const float* gate, u64 rows, u32 d, u32 gd) { porter_pdl_enter();
    sigmoid_gate_mul_impl<float>(x, gate, rows, d, gd);
}
extern "C" __global__ void sigmoid_gate_mul_bf16(bf16* x, const bf16* gate, u64 rows, u32 d, u32 gd) { porter_pdl_enter();
    sigmoid_gate_mul_impl<bf16>(x, gate, rows, d, gd);
}
extern "C" __global__ void sigmoid_gate_mul_f16(f16* x, const f16* gate, u64 rows, u32 d, u32 gd) { porter_pdl_enter();
    sigmoid_gate_mul_impl<f16>(x, gate, rows, d, gd);
}

// ---------------------------------------------------------------------------
// Partial NeoX RoPE, in place. x [t, heads, head_dim]; positions [t];
// inv_freq [rot_dim/2] (f32, as porter_core::nn::Rope computes it).
// Dimension d < half pairs with d + half; dims rot_dim..head_dim pass through.
// The angle is pos·inv_freq[d] in f32; cos/sin times attn_scale (YaRN's attention
// factor, 1 otherwise) are rounded to T (the tables of
// Rope::tables), the rotated values are rounded to T once.
// One thread per (token, head, d < half).
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void rope_neox_impl(T* __restrict__ x, const u32* __restrict__ positions,
                                               const float* __restrict__ inv_freq, u32 t, u32 heads, u32 head_dim,
                                               u32 half, float attn_scale) {
    const u64 n = (u64)t * heads * half;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u32 d = (u32)(i % half);
        const u64 th = i / half;  // token * heads + head
        const u64 ti = th / heads;
        const float a = (float)positions[ti] * inv_freq[d];
        float s, c;
        sincosf(a, &s, &c);
        c = round_to<T>(c * attn_scale);
        s = round_to<T>(s * attn_scale);
        T* h = x + th * head_dim;
        const float x1 = to_f(h[d]), x2 = to_f(h[d + half]);
        h[d] = from_f<T>(x1 * c - x2 * s);
        h[d + half] = from_f<T>(x2 * c + x1 * s);
    }
}

extern "C" __global__ void rope_neox_f32(float* x, const u32* positions, const float* inv_freq, u32 t, u32 heads,
                                         u32 head_dim, u32 half, float attn_scale) { porter_pdl_enter();
    rope_neox_impl<float>(x, positions, inv_freq, t, heads, head_dim, half, attn_scale);
}
extern "C" __global__ void rope_neox_bf16(bf16* x, const u32* positions, const float* inv_freq, u32 t, u32 heads,
                                          u32 head_dim, u32 half, float attn_scale) { porter_pdl_enter();
    rope_neox_impl<bf16>(x, positions, inv_freq, t, heads, head_dim, half, attn_scale);
}
extern "C" __global__ void rope_neox_f16(f16* x, const u32* positions, const float* inv_freq, u32 t, u32 heads,
                                          u32 head_dim, u32 half, float attn_scale) { porter_pdl_enter();
    rope_neox_impl<f16>(x, positions, inv_freq, t, heads, head_dim, half, attn_scale);
}
