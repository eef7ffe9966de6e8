// Gated DeltaNet kernels of Qwen3-Next (decode path and conv prefill):
// gates, causal depthwise conv1d + SiLU (decode update and prefill), and one
// recurrent step of the gated delta rule. Semantics of
// porter_kernels::cpu::gdn; all math in f32. Preceded by common.cuh.

// ---------------------------------------------------------------------------
// Gates: g = −exp(A_log) · softplus(a + dt_bias) (threshold 20), beta = σ(b).
// a, b [n] = [T, Hv] (T); a_log, dt_bias [Hv] (f32); g, beta [n] (f32).
// ---------------------------------------------------------------------------
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

template <typename T>
__device__ __forceinline__ void gdn_gates_impl(const T* __restrict__ a, const T* __restrict__ b,
                                               const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                               float* __restrict__ g, float* __restrict__ beta, u64 n, u32 hv) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u32 h = (u32)(i % hv);
        const float neg_a = -expf(a_log[h]);
        g[i] = neg_a * softplus_f(to_f(a[i]) + dt_bias[h]);
        beta[i] = sigmoid_f(to_f(b[i]));
    }
}

extern "C" __global__ void gdn_gates_f32(const float* a, const float* b, const float* a_log, const float* dt_bias,
                                         float* g, float* beta, u64 n, u32 hv) { porter_pdl_enter();
    gdn_gates_impl<float>(a, b, a_log, dt_bias, g, beta, n, hv);
}
extern "C" __global__ void gdn_gates_bf16(const bf16* a, const bf16* b, const float* a_log, const float* dt_bias,
                                          float* g, float* beta, u64 n, u32 hv) { porter_pdl_enter();
    gdn_gates_impl<bf16>(a, b, a_log, dt_bias, g, beta, n, hv);
}
extern "C" __global__ void gdn_gates_f16(const f16* a, const f16* b, const float* a_log, const float* dt_bias,
                                          float* g, float* beta, u64 n, u32 hv) { porter_pdl_enter();
    gdn_gates_impl<f16>(a, b, a_log, dt_bias, g, beta, n, hv);
}

// ---------------------------------------------------------------------------
// Causal conv1d + SiLU, decode update (one token per sequence), in the
// arithmetic order of cpu::gdn::causal_conv1d_update:
//   y[c] = silu(Σ_{i<K−1} w[c,i]·state[c,i] + w[c,K−1]·x[c] + bias[c])
// then state[c,:] shifts left by one and takes x[c].
// x [n, C]; w [C, K]; bias [C] or null; state pool [num_slots, C, K−1];
// slots [n] or null (row r uses slot r); out [n, C]. A slot >= num_slots gives
// a NaN output row and touches no state. One thread per (row, channel).
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void conv1d_update_impl(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ bias, T* __restrict__ state,
                                                   const u32* __restrict__ slots, T* __restrict__ out, u32 n, u32 c,
                                                   u32 k, u32 num_slots) {
    const u64 total = (u64)n * c;
    const u32 km1 = k - 1;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u32 r = (u32)(i / c), ch = (u32)(i % c);
        const u32 s = slots ? slots[r] : r;
        if (s >= num_slots) {
            out[i] = from_f<T>(PORTER_NAN);
            continue;
        }
        T* st = state + ((u64)s * c + ch) * km1;
        const T* wr = w + (u64)ch * k;
        const float xv = to_f(x[i]);
        float acc = 0.0f;
        for (u32 j = 0; j < km1; ++j) acc += to_f(wr[j]) * to_f(st[j]);
        acc += to_f(wr[km1]) * xv;
        if (bias) acc += to_f(bias[ch]);
        out[i] = from_f<T>(silu_f(acc));
        if (km1 > 0) {
            for (u32 j = 0; j + 1 < km1; ++j) st[j] = st[j + 1];
            st[km1 - 1] = x[i];
        }
    }
}

extern "C" __global__ void conv1d_update_f32(const float* x, const float* w, const float* bias, float* state,
                                             const u32* slots, float* out, u32 n, u32 c, u32 k, u32 num_slots) { porter_pdl_enter();
    conv1d_update_impl<float>(x, w, bias, state, slots, out, n, c, k, num_slots);
}
extern "C" __global__ void conv1d_update_bf16(const bf16* x, const bf16* w, const bf16* bias, bf16* state,
                                              const u32* slots, bf16* out, u32 n, u32 c, u32 k, u32 num_slots) { porter_pdl_enter();
    conv1d_update_impl<bf16>(x, w, bias, state, slots, out, n, c, k, num_slots);
}
extern "C" __global__ void conv1d_update_f16(const f16* x, const f16* w, const f16* bias, f16* state,
                                              const u32* slots, f16* out, u32 n, u32 c, u32 k, u32 num_slots) { porter_pdl_enter();
    conv1d_update_impl<f16>(x, w, bias, state, slots, out, n, c, k, num_slots);
}

// ---------------------------------------------------------------------------
// Causal conv1d + SiLU, prefill of T tokens of one sequence, continuing from
// `state` (cpu::gdn::causal_conv1d_prefill). Two launches: conv1d_prefill
// reads the old state, then conv1d_prefill_state writes the new one (the last
// K−1 inputs of [state; x], oldest first).
// x [T, C]; w [C, K]; bias [C] or null; state [C, K−1]; out [T, C].
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ float conv_virt(const T* x, const T* state, u32 c, u32 km1, u32 ch, u32 idx) {
    // Row idx of the virtual sequence [state; x] (K−1 + T rows), channel ch.
    return idx < km1 ? to_f(state[(u64)ch * km1 + idx]) : to_f(x[(u64)(idx - km1) * c + ch]);
}

template <typename T>
__device__ __forceinline__ void conv1d_prefill_impl(const T* __restrict__ x, const T* __restrict__ w,
                                                    const T* __restrict__ bias, const T* __restrict__ state,
                                                    T* __restrict__ out, u32 t, u32 c, u32 k) {
    const u64 total = (u64)t * c;
    const u32 km1 = k - 1;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u32 tt = (u32)(i / c), ch = (u32)(i % c);
        const T* wr = w + (u64)ch * k;
        float acc = 0.0f;
        for (u32 j = 0; j < k; ++j) acc += to_f(wr[j]) * conv_virt(x, state, c, km1, ch, tt + j);
        if (bias) acc += to_f(bias[ch]);
        out[i] = from_f<T>(silu_f(acc));
    }
}

template <typename T>
__device__ __forceinline__ void conv1d_prefill_state_impl(const T* __restrict__ x, T* state, u32 t, u32 c, u32 k) {
    const u32 km1 = k - 1;
    for (u32 ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x) {
        // In place, ascending: entry i reads virtual row t + i > i, never one
        // this loop has already overwritten.
        for (u32 i = 0; i < km1; ++i) {
            const u32 src = t + i;
            const T v = src < km1 ? state[(u64)ch * km1 + src] : x[(u64)(src - km1) * c + ch];
            state[(u64)ch * km1 + i] = v;
        }
    }
}

extern "C" __global__ void conv1d_prefill_f32(const float* x, const float* w, const float* bias, const float* state,
                                              float* out, u32 t, u32 c, u32 k) { porter_pdl_enter();
    conv1d_prefill_impl<float>(x, w, bias, state, out, t, c, k);
}
extern "C" __global__ void conv1d_prefill_bf16(const bf16* x, const bf16* w, const bf16* bias, const bf16* state,
                                               bf16* out, u32 t, u32 c, u32 k) { porter_pdl_enter();
    conv1d_prefill_impl<bf16>(x, w, bias, state, out, t, c, k);
}
extern "C" __global__ void conv1d_prefill_f16(const f16* x, const f16* w, const f16* bias, const f16* state,
                                               f16* out, u32 t, u32 c, u32 k) { porter_pdl_enter();
    conv1d_prefill_impl<f16>(x, w, bias, state, out, t, c, k);
}
extern "C" __global__ void conv1d_prefill_state_f32(const float* x, float* state, u32 t, u32 c, u32 k) { porter_pdl_enter();
    conv1d_prefill_state_impl<float>(x, state, t, c, k);
}
extern "C" __global__ void conv1d_prefill_state_bf16(const bf16* x, bf16* state, u32 t, u32 c, u32 k) { porter_pdl_enter();
    conv1d_prefill_state_impl<bf16>(x, state, t, c, k);
}
extern "C" __global__ void conv1d_prefill_state_f16(const f16* x, f16* state, u32 t, u32 c, u32 k) { porter_pdl_enter();
    conv1d_prefill_state_impl<f16>(x, state, t, c, k);
}

// ---------------------------------------------------------------------------
// One recurrent step of the gated delta rule (decode), for n rows that are
// each one token of a distinct sequence. Per row r and value head j (key head
// kh = j / (Hv / Hk)), with S = state[slot(r), j] ([dk, dv], f32, k-major):
//   q ← q · rsqrt(Σq² + 1e-6) · q_scale,  k ← k · rsqrt(Σk² + 1e-6)   (f32)
//   S ← decay(g) · S;  kv = Sᵀk;  δ = β · (v − kv);  S ← S + k ⊗ δ;  out = Sᵀq
// where decay(g) = exp(g), flushed to 0 below g = −60 (cpu::gdn).
// q, k [n, Hk, dk] (T); v [n, Hv, dv] (T); g, beta [n, Hv] (f32);
// state pool [num_slots, Hv, dk, dv] (f32, updated in place); slots [n] or
// null (row r uses slot r); out [n, Hv, dv] (T, rounded once).
// A slot >= num_slots gives NaN outputs and touches no state. Slots of the n
// rows must be distinct.
// grid (ceil(dv / 32), Hv, n), block (32, REC_NW): lane = state column,
// warp w holds rows w, w + REC_NW, ... in registers. Needs dk <= REC_NW·REC_MAXR.
// ---------------------------------------------------------------------------
#define REC_NW 8
#define REC_MAXR 32
#define REC_MAX_DK (REC_NW * REC_MAXR)

__device__ __forceinline__ float decay_exp_f(float x) { return x < -60.0f ? 0.0f : expf(x); }

template <typename T>
__device__ __forceinline__ void gdn_recurrent_step_impl(const T* __restrict__ q, const T* __restrict__ k,
                                                        const T* __restrict__ v, const float* __restrict__ g,
                                                        const float* __restrict__ beta, float* __restrict__ state,
                                                        const u32* __restrict__ slots, T* __restrict__ out, u32 hk,
                                                        u32 hv, u32 dk, u32 dv, u32 num_slots, float q_scale) {
    __shared__ float qs[REC_MAX_DK];
    __shared__ float ks[REC_MAX_DK];
    __shared__ float red[REC_NW][33];
    __shared__ float sh[32];
    const u32 lane = threadIdx.x, w = threadIdx.y;
    const u32 tid = w * 32 + lane, nt = 32 * REC_NW;
    const u32 r = blockIdx.z, j = blockIdx.y;
    const u32 c = blockIdx.x * 32 + lane;
    const bool col = c < dv;
    const u32 kh = j / (hv / hk);
    const u32 s = slots ? slots[r] : r;
    T* o = out + ((u64)r * hv + j) * dv;
    if (s >= num_slots) {  // uniform over the block: no barrier has been reached yet
        if (w == 0 && col) o[c] = from_f<T>(PORTER_NAN);
        return;
    }

    // L2 norms of q and k (f32, eps inside the sum).
    const T* qr = q + ((u64)r * hk + kh) * dk;
    const T* kr = k + ((u64)r * hk + kh) * dk;
    float sq = 0.0f, sk = 0.0f;
    for (u32 i = tid; i < dk; i += nt) {
        const float qv = to_f(qr[i]), kv = to_f(kr[i]);
        qs[i] = qv;
        ks[i] = kv;
        sq += qv * qv;
        sk += kv * kv;
    }
    sq = block_sum(sq, sh, tid, nt);
    sk = block_sum(sk, sh, tid, nt);
    const float rq = (1.0f / sqrtf(sq + 1e-6f)) * q_scale;
    const float rk = 1.0f / sqrtf(sk + 1e-6f);
    for (u32 i = tid; i < dk; i += nt) {
        qs[i] *= rq;
        ks[i] *= rk;
    }
    __syncthreads();

    const float a = decay_exp_f(g[(u64)r * hv + j]);
    const float b = beta[(u64)r * hv + j];
    float* S = state + ((u64)s * hv + j) * dk * dv;

    // Decay and kv = Sᵀk (this thread's rows of column c).
    float sr[REC_MAXR];
    float part = 0.0f;
#pragma unroll
    for (u32 m = 0; m < REC_MAXR; ++m) {
        const u32 i = m * REC_NW + w;
        float sv = 0.0f;
        if (col && i < dk) {
            sv = S[(u64)i * dv + c] * a;
            part += ks[i] * sv;
        }
        sr[m] = sv;
    }
    red[w][lane] = part;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (u32 ww = 0; ww < REC_NW; ++ww) kv += red[ww][lane];
    __syncthreads();

    const float delta = col ? b * (to_f(v[((u64)r * hv + j) * dv + c]) - kv) : 0.0f;
    part = 0.0f;
#pragma unroll
    for (u32 m = 0; m < REC_MAXR; ++m) {
        const u32 i = m * REC_NW + w;
        if (col && i < dk) {
            const float sv = fmaf(ks[i], delta, sr[m]);
            S[(u64)i * dv + c] = sv;
            part = fmaf(qs[i], sv, part);
        }
    }
    red[w][lane] = part;
    __syncthreads();
    if (w == 0 && col) {
        float acc = 0.0f;
#pragma unroll
        for (u32 ww = 0; ww < REC_NW; ++ww) acc += red[ww][lane];
        o[c] = from_f<T>(acc);
    }
}

extern "C" __global__ void __launch_bounds__(256) gdn_recurrent_step_f32(const float* q, const float* k,
                                                                         const float* v, const float* g,
                                                                         const float* beta, float* state,
                                                                         const u32* slots, float* out, u32 hk, u32 hv,
                                                                         u32 dk, u32 dv, u32 num_slots,
                                                                         float q_scale) { porter_pdl_enter();
    gdn_recurrent_step_impl<float>(q, k, v, g, beta, state, slots, out, hk, hv, dk, dv, num_slots, q_scale);
}
extern "C" __global__ void __launch_bounds__(256) gdn_recurrent_step_bf16(const bf16* q, const bf16* k, const bf16* v,
                                                                          const float* g, const float* beta,
                                                                          float* state, const u32* slots, bf16* out,
                                                                          u32 hk, u32 hv, u32 dk, u32 dv,
                                                                          u32 num_slots, float q_scale) { porter_pdl_enter();
    gdn_recurrent_step_impl<bf16>(q, k, v, g, beta, state, slots, out, hk, hv, dk, dv, num_slots, q_scale);
}
extern "C" __global__ void __launch_bounds__(256) gdn_recurrent_step_f16(const f16* q, const f16* k, const f16* v,
                                                                          const float* g, const float* beta,
                                                                          float* state, const u32* slots, f16* out,
                                                                          u32 hk, u32 hv, u32 dk, u32 dv,
                                                                          u32 num_slots, float q_scale) { porter_pdl_enter();
    gdn_recurrent_step_impl<f16>(q, k, v, g, beta, state, slots, out, hk, hv, dk, dv, num_slots, q_scale);
}
