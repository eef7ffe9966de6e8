// Gated DeltaNet kernels of Qwen3-Next for batches of sequences ("spans": one
// sequence's run of consecutive rows of a batch): causal conv1d + SiLU over a
// per-slot window of raw inputs, gates from the fused [b | a] projection, and
// the gated delta rule over many tokens (recurrent form, optional per-token
// snapshots of the state). The conv, its window update and the gates are one
// launch (gdn_conv_gates_seq). Semantics of porter_kernels::cpu::gdn; all math in
// f32; the conv output (q | k | v) is rounded to the activation type T, as transformers'
// bf16 forward rounds causal_conv1d's output (half the bytes of an f32 copy for every kernel
// that reads it). Preceded by common.cuh. Launch wrappers: kernels/src/cuda/gdn_seq.rs.

__device__ __forceinline__ float gs_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float gs_decay(float x) { return x < -60.0f ? 0.0f : expf(x); }

// ---------------------------------------------------------------------------
// Causal conv1d + SiLU over spans with the conv window update, and the gates,
// in one launch (decode, speculative verify and prefill alike).
// x [t, x_stride] (T; conv channels are columns 0..c); [b | a] columns
// ba_col..ba_col + 2·hv of ba [t, ba_stride] (T; x itself when the gate inputs
// are stacked onto the projections, a tensor of their own when in_proj_ba's
// output is not concatenated, the FP8 model's case); w [c, k] (f32); window [num_slots, c, win] (f32,
// oldest first), updated; spans [n_spans, 4] = (row0, len, slot, lag);
// out [t, c] (T: the conv output rounded once); a_log, dt_bias [hv] (f32); g, beta [t, hv] (f32).
//
// Conv: span rows see u = window[slot, ch, 0..win−lag] ++ x[row0.., ch]; the
// output of span position p is silu(Σ_{i<k} w[ch, i] · u[H + p − (k−1) + i])
// with H = win − lag; afterwards the slot's window holds the last `win`
// entries of u (zeros where u is shorter). An invalid span (slot >=
// num_slots, rows past t, lag too large) gives NaN rows and leaves the window
// alone. Rows outside every span are not written.
// Gates, for every row r < t: g = −exp(a_log) · softplus(a + dt_bias)
// (threshold 20), beta = σ(b).
//
// One launch instead of three (conv, window update, gates) because at decode
// each is a few µs of launch and ramp for almost no bytes. The window update
// cannot simply follow the conv in the same kernel, since other blocks may
// still read the old window; so each (span, channel) has one owner thread,
// in the block whose tile holds the span's first row: it computes the span
// positions p < k − 1 (the only ones that read the window; up to k − 2 rows
// past its tile) and then rewrites that window. Every other row reads only x
// and goes to the block of its tile. Spans use distinct slots, so no thread
// reads a window another one writes. An empty span with a lag (no rows; the
// window just rolls back) is owned by the blocks of row tile 0.
// grid (ceil(t / rows), cblocks + 1), block 256, rows <= CONV_ROWS: blocks
// y < cblocks, thread = channel; block y = cblocks: the gates of the tile.
//
// The proj form (gdn_conv_gates_proj_seq, PROJ): the gate inputs are not read from a
// tensor but computed by the launch, in_proj_ba's product (the FP8 checkpoints keep that
// bf16 projection apart from the FP8 in_proj_qkvz, so no GEMM before produced them): see
// GateProj below. grid (ceil(t / rows), cblocks + gb): the last gb blocks of each tile.
// ---------------------------------------------------------------------------
#define CONV_ROWS 16
#define CONV_MAXK 8
#define CONV_THREADS 256

// The gates of one (row, head) from its gate inputs b, a (f32 values of T).
__device__ __forceinline__ void gs_gate_write(float* __restrict__ g, float* __restrict__ beta, u64 i, float b,
                                              float a, float a_log, float dt_bias) {
    g[i] = -expf(a_log) * gs_softplus(a + dt_bias);
    beta[i] = sigmoid_f(b);
}

// ---------------------------------------------------------------------------
// The gate inputs computed in the conv + gates launch (its proj form): for row r and value
// head hh, b = round_T(Σ_i w[hh, i]·x[r, i]) and a = round_T(Σ_i w[hv + hh, i]·x[r, i]),
// what in_proj_ba's GEMM followed by a read of its output gives: f32 accumulation, one
// rounding to T (the GEMM output's dtype), then the usual gate formulas.
// x [t, k] (T; the normed rows in_proj read), w [2·hv, k] (T; rows 0..hv give b, hv..2·hv a).
//
// The decode GEMV's layout (gemv_block, misc.cu) for one (row, head) item: S = split warps
// of a block, warp `part` summing the 16-byte chunks q ≡ part (mod S) of both weight rows
// (chunk q at lane q mod 32, in increasing q, one f32 FMA chain a lane), butterfly-summed
// (warp_sum), and the S sums added in order 0 .. S−1 through shared memory. With 16-byte
// rows (k·sizeof(T) a multiple of 16, x and w 16-byte aligned) and the host's split of
// in_proj_ba's shape (gemv_split), b and a are therefore the GEMV's outputs bit for bit, for
// every t (the GEMV is batch-invariant too). Otherwise (odd sizes, unaligned rows) the same
// layout over single elements. A gate block of 8 warps holds 8 / S items at a time; the
// tile's nr·hv items are spread over its gb gate blocks (item = gate block · 8 / S + slot,
// striding by gb · 8 / S), so that the heads of a row do not run one after another.
// ---------------------------------------------------------------------------
template <typename T>
struct GateProj {
    const T* x;
    const T* w;
    u32 k;
    u32 gb;     // gate blocks a row tile
    u32 split;  // warps S (1, 2, 4) an item
};

// 16-byte chunks a lane loads per row (b, a and x) before using them: 2 of 16-bit types (a
// lane's whole part of a 2048-wide row at 4 parts; at 4 the unpacked halves took 80 registers,
// and the conv blocks of the launch share the count), 4 of f32.
template <typename T>
struct BaBatch {
    static constexpr int G = sizeof(T) == 4 ? 4 : 2;
};

// Part `part` of S of one item's two dot products (16-byte rows of kv chunks), warp-summed.
template <typename T>
__device__ __forceinline__ float2 ba_part_vec(const uint4* __restrict__ wb, const uint4* __restrict__ wa,
                                              const uint4* __restrict__ xr, u32 kv, u32 part, u32 S, u32 lane) {
    constexpr int E = 16 / sizeof(T), G = BaBatch<T>::G;
    const u32 step = 32u * S;
    float b = 0.0f, a = 0.0f;
#pragma unroll 1
    for (u32 c0 = 32u * part + lane; c0 < kv; c0 += step * G) {
        uint4 bv[G], av[G], xv[G];
#pragma unroll
        for (int u = 0; u < G; ++u) {
            const u32 c = c0 + step * u;
            const bool in = c < kv;
            bv[u] = in ? __ldg(wb + c) : make_uint4(0, 0, 0, 0);
            av[u] = in ? __ldg(wa + c) : make_uint4(0, 0, 0, 0);
            xv[u] = in ? xr[c] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < G; ++u) {
            if (c0 + step * u < kv) {
                const T* be = reinterpret_cast<const T*>(&bv[u]);
                const T* ae = reinterpret_cast<const T*>(&av[u]);
                const T* xe = reinterpret_cast<const T*>(&xv[u]);
#pragma unroll
                for (int i = 0; i < E; ++i) {
                    b = fmaf(to_f(be[i]), to_f(xe[i]), b);
                    a = fmaf(to_f(ae[i]), to_f(xe[i]), a);
                }
            }
        }
    }
    return make_float2(warp_sum(b), warp_sum(a));
}

// The same over single elements (rows that are not 16-byte vectors).
template <typename T>
__device__ __forceinline__ float2 ba_part_scalar(const T* __restrict__ wb, const T* __restrict__ wa,
                                                 const T* __restrict__ xr, u32 k, u32 part, u32 S, u32 lane) {
    float b = 0.0f, a = 0.0f;
    for (u32 i = 32u * part + lane; i < k; i += 32u * S) {
        const float xf = to_f(xr[i]);
        b = fmaf(to_f(wb[i]), xf, b);
        a = fmaf(to_f(wa[i]), xf, a);
    }
    return make_float2(warp_sum(b), warp_sum(a));
}

// Gate block gi (of gp.gb) of the row tile r0 .. r0 + nr: its items' weight rows are asked
// into L2 before the PDL wait (weights: no earlier launch writes them), x (the input of the
// block's projections, which the launch before may still be writing) is read only after it.
template <typename T>
__device__ __forceinline__ void gates_proj_pdl(const GateProj<T> gp, const float* __restrict__ a_log,
                                               const float* __restrict__ dt_bias, float* __restrict__ g,
                                               float* __restrict__ beta, u32 r0, u32 nr, u32 hv, u32 gi) {
    __shared__ float2 red[CONV_THREADS / 32];
    const u32 lane = threadIdx.x & 31u, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const u32 S = gp.split, slots = nw / S, part = wid % S, slot = wid / S;
    const u32 items = nr * hv, first = gi * slots, step = gp.gb * slots;
    const u64 row_bytes = (u64)gp.k * sizeof(T);
    // The lines of both weight rows of each of this warp's items, spread over the item's S warps.
    for (u32 it = first + slot; it < items; it += step) {
        const u32 hh = it % hv;
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            const u64 b0 = reinterpret_cast<u64>(gp.w + (u64)(h * hv + hh) * gp.k);
            for (u64 l = (b0 & ~127ull) + 128ull * (32u * part + lane); l < b0 + row_bytes; l += 128ull * 32u * S)
                porter_prefetch_l2(reinterpret_cast<const void*>(l));
        }
    }
    porter_pdl_enter();
    constexpr u32 E = 16 / sizeof(T);
    const bool vec = row_bytes % 16 == 0 && ((reinterpret_cast<u64>(gp.x) | reinterpret_cast<u64>(gp.w)) & 15) == 0;
    // `base` is the same for every warp of the block, so every warp meets the barriers.
    for (u32 base = first; base < items; base += step) {
        const u32 it = base + slot;
        const bool live = it < items;
        const u32 r = r0 + (live ? it / hv : 0u), hh = live ? it % hv : 0u;
        float2 d = make_float2(0.0f, 0.0f);
        if (live) {
            const T* xr = gp.x + (u64)r * gp.k;
            const T* wb = gp.w + (u64)hh * gp.k;
            const T* wa = gp.w + (u64)(hv + hh) * gp.k;
            d = vec ? ba_part_vec<T>(reinterpret_cast<const uint4*>(wb), reinterpret_cast<const uint4*>(wa),
                                     reinterpret_cast<const uint4*>(xr), gp.k / E, part, S, lane)
                    : ba_part_scalar<T>(wb, wa, xr, gp.k, part, S, lane);
        }
        if (S > 1) {  // the parts added in order, as gemv_block's red[] sum
            if (lane == 0) red[wid] = d;
            __syncthreads();
            if (live && part == 0 && lane == 0) {
                for (u32 p = 1; p < S; ++p) {
                    d.x += red[wid + p].x;
                    d.y += red[wid + p].y;
                }
            }
            __syncthreads();
        }
        // Rounded to T as the GEMM's output would be, then read as f32.
        if (live && part == 0 && lane == 0)
            gs_gate_write(g, beta, (u64)r * hv + hh, round_to<T>(d.x), round_to<T>(d.y), a_log[hh], dt_bias[hh]);
    }
}

__device__ __forceinline__ bool conv_span_ok(const u32* sp, u32 t, u32 k, u32 win, u32 num_slots) {
    return sp[2] < num_slots && (u64)sp[0] + sp[1] <= t && sp[3] + (k - 1) <= win;
}

// Conv output of span position p of channel ch (reads the window where p < k − 1).
template <typename T>
__device__ __forceinline__ float conv_out(const T* __restrict__ x, u32 x_stride, const float (&wr)[CONV_MAXK],
                                          const float* wnd, u32 row0, int p, int h, u32 k, u32 ch) {
    float acc = 0.0f;
#pragma unroll
    for (u32 i = 0; i < CONV_MAXK; ++i) {
        if (i < k) {
            const int j = p + (int)i - (int)(k - 1);
            const float v = j >= 0 ? to_f(x[(u64)(row0 + j) * x_stride + ch]) : wnd[h + j];
            acc += wr[i] * v;
        }
    }
    return silu_f(acc);
}

// The window of one (span, channel) becomes the last `win` entries of
// (effective history ++ span inputs), zeros where that is shorter than `win`.
template <typename T>
__device__ __forceinline__ void conv_window_update(const T* __restrict__ x, u32 x_stride, float* wnd, u32 row0,
                                                   u32 len, u32 lag, u32 win, u32 ch) {
    if (len == 0 && lag == 0) return;
    const long long h = (long long)win - lag;      // effective history length
    const long long shift = (long long)len - lag;  // new[w] = u[w + shift]
    // u[j]: j < 0 → 0, j < h → old window, else input row j − h.
    if (shift >= 0) {
        for (u32 wi = 0; wi < win; ++wi) {
            const long long j = (long long)wi + shift;
            wnd[wi] = j < h ? wnd[j] : to_f(x[(u64)(row0 + (j - h)) * x_stride + ch]);
        }
    } else {  // reads lower indices: go down
        for (u32 wi = win; wi-- > 0;) {
            const long long j = (long long)wi + shift;
            wnd[wi] = j < 0 ? 0.0f : j < h ? wnd[j] : to_f(x[(u64)(row0 + (j - h)) * x_stride + ch]);
        }
    }
}

template <typename T, bool PROJ>
__device__ __forceinline__ void gdn_conv_gates_seq_impl_pdl(const T* __restrict__ x, u32 x_stride,
                                                        const float* __restrict__ w, float* __restrict__ window,
                                                        const u32* __restrict__ spans, T* __restrict__ out,
                                                        const float* __restrict__ a_log,
                                                        const float* __restrict__ dt_bias, float* __restrict__ g,
                                                        float* __restrict__ beta, u32 t, u32 n_spans, u32 c, u32 k,
                                                        u32 win, u32 num_slots, const T* __restrict__ ba,
                                                        u32 ba_stride, u32 ba_col, u32 hv, u32 rows,
                                                        const GateProj<T> gp) {
    const u32 tid = threadIdx.x;
    const u32 r0 = blockIdx.x * rows;
    const u32 nr = t - r0 < rows ? t - r0 : rows;  // rows of this tile (r0 < t)
    if constexpr (PROJ) {
        if (blockIdx.y >= gridDim.y - gp.gb) {  // the gate inputs and gates of the tile's rows
            gates_proj_pdl<T>(gp, a_log, dt_bias, g, beta, r0, nr, hv, blockIdx.y - (gridDim.y - gp.gb));
            return;
        }
    } else if (blockIdx.y == gridDim.y - 1) {  // the gates of the tile's rows
        porter_pdl_enter();  // ba: in_proj's output, the launch before
        for (u32 i = tid; i < nr * hv; i += blockDim.x) {
            const u32 r = r0 + i / hv, hh = i % hv;
            const T* row = ba + (u64)r * ba_stride + ba_col;
            const float b = to_f(row[hh]), a = to_f(row[hv + hh]);
            gs_gate_write(g, beta, (u64)r * hv + hh, b, a, a_log[hh], dt_bias[hh]);
        }
        return;
    }
    __shared__ int row_span[CONV_ROWS];
    __shared__ int rolled;  // tile 0 owns an empty span with a lag
    if (tid < CONV_ROWS) row_span[tid] = -1;
    if (tid == 0) rolled = 0;
    __syncthreads();
    for (u32 s = tid; s < n_spans; s += blockDim.x) {
        const u32 a = spans[4 * s], len = spans[4 * s + 1];
        const u64 e = (u64)a + len;
        const u32 lo = a > r0 ? a : r0;
        const u64 hi = e < (u64)r0 + nr ? e : (u64)r0 + nr;
        for (u64 r = lo; r < hi; ++r) row_span[r - r0] = (int)s;
        if (blockIdx.x == 0 && len == 0 && spans[4 * s + 3] > 0) rolled = 1;
    }
    __syncthreads();
    const u32 ch = blockIdx.y * blockDim.x + tid;
    float wr[CONV_MAXK];
#pragma unroll
    for (u32 i = 0; i < CONV_MAXK; ++i) wr[i] = ch < c && i < k ? w[(u64)ch * k + i] : 0.0f;
    // Up to here only per-step metadata (spans, uploaded before the step) and weights were
    // read, and only shared memory written: all of it may overlap the launch before (in_proj,
    // whose output x is read below) under PDL. The window (this kernel's own state) and every
    // global write come after the wait.
    porter_pdl_enter();
    if (ch >= c) return;
    // Rows that read only x (and the NaN rows of invalid spans).
    for (u32 rr = 0; rr < nr; ++rr) {
        const int s = row_span[rr];
        if (s < 0) continue;
        const u32 r = r0 + rr;
        const u32* sp = spans + 4 * (u32)s;
        if (!conv_span_ok(sp, t, k, win, num_slots)) {
            out[(u64)r * c + ch] = from_f<T>(PORTER_NAN);
            continue;
        }
        const u32 p = r - sp[0];
        if (p + 1 < k) continue;  // the owner's
        out[(u64)r * c + ch] = from_f<T>(conv_out<T>(x, x_stride, wr, nullptr, sp[0], (int)p, 0, k, ch));
    }
    // Spans that start in this tile: their window rows, then their window update.
    for (u32 rr = 0; rr < nr; ++rr) {
        const int s = row_span[rr];
        if (s < 0) continue;
        const u32* sp = spans + 4 * (u32)s;
        const u32 row0 = sp[0], len = sp[1], slot = sp[2], lag = sp[3];
        if (row0 != r0 + rr || !conv_span_ok(sp, t, k, win, num_slots)) continue;
        float* wnd = window + ((u64)slot * c + ch) * win;
        const u32 head = len < k - 1 ? len : k - 1;
        for (u32 p = 0; p < head; ++p) {
            out[(u64)(row0 + p) * c + ch] =
                from_f<T>(conv_out<T>(x, x_stride, wr, wnd, row0, (int)p, (int)(win - lag), k, ch));
        }
        conv_window_update<T>(x, x_stride, wnd, row0, len, lag, win, ch);
    }
    if (rolled) {
        for (u32 s = 0; s < n_spans; ++s) {
            const u32* sp = spans + 4 * s;
            if (sp[1] == 0 && sp[3] > 0 && conv_span_ok(sp, t, k, win, num_slots)) {
                conv_window_update<T>(x, x_stride, window + ((u64)sp[2] * c + ch) * win, sp[0], 0, sp[3], win, ch);
            }
        }
    }
}

#define GDN_CONV_GATES_SEQ(T, NAME)                                                                                 \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS) gdn_conv_gates_seq_##NAME(                           \
        const T* x, u32 x_stride, const float* w, float* window, const u32* spans, T* out, const float* a_log,      \
        const float* dt_bias, float* g, float* beta, u32 t, u32 n_spans, u32 c, u32 k, u32 win, u32 num_slots,      \
        const T* ba, u32 ba_stride, u32 ba_col, u32 hv, u32 rows) {                                                 \
        gdn_conv_gates_seq_impl_pdl<T, false>(x, x_stride, w, window, spans, out, a_log, dt_bias, g, beta, t,         \
                                              n_spans, c, k, win, num_slots, ba, ba_stride, ba_col, hv, rows,         \
                                              GateProj<T>{nullptr, nullptr, 0u, 1u, 1u});                             \
    }
GDN_CONV_GATES_SEQ(float, f32)
GDN_CONV_GATES_SEQ(bf16, bf16)
GDN_CONV_GATES_SEQ(f16, f16)

// The proj form: the gate inputs from xp [t, hidden] and wba [2·hv, hidden] (GateProj), gb gate
// blocks a row tile (the last gb values of blockIdx.y), split the GEMV's parts.
#define GDN_CONV_GATES_PROJ_SEQ(T, NAME)                                                                           \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS) gdn_conv_gates_proj_seq_##NAME(                      \
        const T* x, u32 x_stride, const float* w, float* window, const u32* spans, T* out, const float* a_log,      \
        const float* dt_bias, float* g, float* beta, u32 t, u32 n_spans, u32 c, u32 k, u32 win, u32 num_slots,      \
        const T* xp, const T* wba, u32 hidden, u32 gb, u32 split, u32 hv, u32 rows) {                               \
        gdn_conv_gates_seq_impl_pdl<T, true>(x, x_stride, w, window, spans, out, a_log, dt_bias, g, beta, t,          \
                                             n_spans, c, k, win, num_slots, nullptr, 0u, 0u, hv, rows,                \
                                             GateProj<T>{xp, wba, hidden, gb, split});                                \
    }
GDN_CONV_GATES_PROJ_SEQ(float, f32)
GDN_CONV_GATES_PROJ_SEQ(bf16, bf16)
GDN_CONV_GATES_PROJ_SEQ(f16, f16)

// ---------------------------------------------------------------------------
// The conv window a slot would hold after consuming the first `cut` rows of a
// span (a prefix-cache checkpoint of the recurrent state, saved inside a prefill
// span), launched before that step's gdn_conv_gates_seq rewrites the window.
// x [t, x_stride] (T; conv channels are columns 0..c); window [num_slots, c, win]
// (f32, oldest first), read; saves [n, 5] = (row0, cut, slot, lag, dst);
// dst [num_dst, c, win] (f32), written.
// With u = window[slot, ch, 0..win − lag] ++ x[row0 .. row0 + cut, ch],
// dst[d, ch, w] = u[len(u) − win + w] (0 where that index is negative): what
// conv_window_update leaves after a span of `cut` rows. A save whose slot, dst,
// lag or rows are out of range gets NaN windows (never a silent stale state).
// grid (ceil(c / CONV_THREADS), n), block CONV_THREADS.
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void gdn_window_at_impl(const T* __restrict__ x, u32 x_stride,
                                                   const float* __restrict__ window, const u32* __restrict__ saves,
                                                   float* __restrict__ dst, u32 t, u32 c, u32 win, u32 num_slots,
                                                   u32 num_dst) {
    const u32* sv = saves + 5 * blockIdx.y;
    const u32 row0 = sv[0], cut = sv[1], slot = sv[2], lag = sv[3], d = sv[4];
    const u32 ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c || d >= num_dst) return;
    float* out = dst + ((u64)d * c + ch) * win;
    if (slot >= num_slots || lag > win || (u64)row0 + cut > t) {
        for (u32 wi = 0; wi < win; ++wi) out[wi] = PORTER_NAN;
        return;
    }
    const float* old = window + ((u64)slot * c + ch) * win;
    const long long h = (long long)win - lag;  // history entries
    for (u32 wi = 0; wi < win; ++wi) {
        const long long j = h + (long long)cut - win + wi;  // index into u
        out[wi] = j < 0 ? 0.0f : j < h ? old[j] : to_f(x[(u64)(row0 + (j - h)) * x_stride + ch]);
    }
}

#define GDN_WINDOW_AT(T, NAME)                                                                                      \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS)                                                       \
        gdn_window_at_##NAME(const T* x, u32 x_stride, const float* window, const u32* saves, float* dst, u32 t,    \
                             u32 c, u32 win, u32 num_slots, u32 num_dst) {                                           \
        porter_pdl_enter();                                                                                          \
        gdn_window_at_impl<T>(x, x_stride, window, saves, dst, t, c, win, num_slots, num_dst);                       \
    }
GDN_WINDOW_AT(float, f32)
GDN_WINDOW_AT(bf16, bf16)
GDN_WINDOW_AT(f16, f16)

// ---------------------------------------------------------------------------
// Gated delta rule over spans of tokens (recurrent form).
// qkv [t, 2·hk·dk + hv·dv] (T, the conv output: q at 0, k at hk·dk, v at 2·hk·dk);
// g, beta [t, hv] (f32); state pool [num_slots, nbuf, hv, dk, dv] (f32,
// k-major); spans [n_spans, 5] = (row0, len, slot, src_buf, snapshot);
// out [t, hv, dv] (T, rounded once).
// Per span and value head j (key head j / (hv / hk)), S = state[slot, src, j];
// per token: q, k L2-normalised (q also times q_scale), S ← exp(g)·S,
// δ = β (v − Sᵀk), S ← S + k ⊗ δ, out = Sᵀq; with snapshot ≠ 0 the state after
// token i goes to buffer i, else the final state back to buffer src.
// An invalid span (slot / src out of range, rows past t, a snapshot span
// longer than nbuf) gives NaN rows and leaves every state alone.
//
// Layout: each state column is split over P lanes of one warp (P = 1, 2, 4,
// 8), each holding R rows in registers (rows part·R .. part·R + R − 1, those
// >= dk are zero); the warp holds 32/P columns, the block blockDim.x/P
// columns. Per token, the partial Sᵀk and Sᵀq are summed over the P lanes with
// shuffles; there is no block-wide reduction. Tokens are processed in tiles
// of DS_TT: the tile's normalised q and k (all dk rows, padded per part),
// the block's v columns, decay and β are staged in shared memory at once.
// grid (ceil(dv / (blockDim.x / P)), hv, n_spans).
// ---------------------------------------------------------------------------
#define DS_TT 16
#define DS_PAD 4
#define DS_GROUP 8

// Rows part·R .. part·R + R − 1 (those < dk) of column c of a [dk, dv] state,
// to / from registers. The empty asm hides the pointer from the optimiser, so
// that it cannot hoist R row addresses out of the token loop into registers.
template <int R>
__device__ __forceinline__ void store_rows(const float (&S)[R], float* base, u32 part, u32 dk, u32 dv, u32 c) {
    float* p = base + (u64)part * R * dv + c;
    const u32 n = dk > part * R ? dk - part * R : 0;
#pragma unroll
    for (int m = 0; m < R; ++m) {
        if ((u32)m < n) *p = S[m];
        p += dv;
        asm volatile("" : "+l"(p));
    }
}
template <int R>
__device__ __forceinline__ void load_rows(float (&S)[R], const float* base, bool active, u32 part, u32 dk, u32 dv,
                                          u32 c) {
    const float* p = base + (u64)part * R * dv + c;
    const u32 n = active && dk > part * R ? dk - part * R : 0;
#pragma unroll
    for (int m = 0; m < R; ++m) {
        S[m] = (u32)m < n ? *p : 0.0f;
        p += dv;
        asm volatile("" : "+l"(p));
    }
}

// One token of the gated delta rule on the R register rows of a state column (a lane's part
// of it; the column's P lanes are `cpw` lanes apart in the warp): S ← a·S, δ = b·(v − Sᵀk),
// S ← S + k·δ; returns Sᵀq, both products summed over the P lanes by shuffles. `k4` points to
// this part's R staged k rows (float4), q's are `qo` float4s before them. q / k are read
// through a pointer hidden from the optimiser every DS_GROUP rows, so that the loads are not
// all hoisted ahead of the FMAs (R registers each).
template <int R>
__device__ __forceinline__ float delta_token(float (&S)[R], const float4* k4, u32 qo, float a, float b, float v,
                                             u32 cpw) {
    // Decay, then Sᵀk.
    float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
    {
        const float4* kp = k4;
#pragma unroll
        for (int m = 0; m < R; m += 4) {
            if (m % DS_GROUP == 0) asm volatile("" : "+l"(kp));
            const float4 kk = kp[m / 4];
            S[m] *= a;
            S[m + 1] *= a;
            S[m + 2] *= a;
            S[m + 3] *= a;
            p0 = fmaf(kk.x, S[m], p0);
            p1 = fmaf(kk.y, S[m + 1], p1);
            p2 = fmaf(kk.z, S[m + 2], p2);
            p3 = fmaf(kk.w, S[m + 3], p3);
        }
    }
    float kv = (p0 + p1) + (p2 + p3);
    for (u32 o = 16; o >= cpw; o >>= 1) kv += __shfl_xor_sync(0xffffffffu, kv, o);
    const float delta = b * (v - kv);
    // Rank-1 update, then Sᵀq.
    p0 = p1 = p2 = p3 = 0.0f;
    {
        const float4* kp = k4;
#pragma unroll
        for (int m = 0; m < R; m += 4) {
            if (m % DS_GROUP == 0) asm volatile("" : "+l"(kp));
            const float4 kk = kp[m / 4];
            const float4 qq = kp[m / 4 - (int)qo];
            S[m] = fmaf(kk.x, delta, S[m]);
            S[m + 1] = fmaf(kk.y, delta, S[m + 1]);
            S[m + 2] = fmaf(kk.z, delta, S[m + 2]);
            S[m + 3] = fmaf(kk.w, delta, S[m + 3]);
            p0 = fmaf(qq.x, S[m], p0);
            p1 = fmaf(qq.y, S[m + 1], p1);
            p2 = fmaf(qq.z, S[m + 2], p2);
            p3 = fmaf(qq.w, S[m + 3], p3);
        }
    }
    float o = (p0 + p1) + (p2 + p3);
    for (u32 d = 16; d >= cpw; d >>= 1) o += __shfl_xor_sync(0xffffffffu, o, d);
    return o;
}

// One token's q and k rows (dk each), L2-normalised (q also times q_scale), staged by one
// warp in the delta rule's layout [P][R + DS_PAD] at qs / ks (rows >= dk zero).
template <typename Q>
__device__ __forceinline__ void stage_qk(const Q* qr, const Q* kr, float* qs, float* ks, u32 dk, u32 P, u32 R,
                                         float q_scale, u32 lane) {
    float sq = 0.0f, sk = 0.0f;
    for (u32 i = lane; i < dk; i += 32) {
        const float qv = to_f(qr[i]), kv = to_f(kr[i]);
        sq += qv * qv;
        sk += kv * kv;
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float fq = (1.0f / sqrtf(sq + 1e-6f)) * q_scale;
    const float fk = 1.0f / sqrtf(sk + 1e-6f);
    const u32 rs = R + DS_PAD;
    for (u32 i = lane; i < P * R; i += 32) {
        const u32 o = (i / R) * rs + i % R;
        qs[o] = i < dk ? to_f(qr[i]) * fq : 0.0f;
        ks[o] = i < dk ? to_f(kr[i]) * fk : 0.0f;
    }
}

__device__ __forceinline__ bool delta_span_ok(const u32* sp, u32 t, u32 num_slots, u32 nbuf) {
    return sp[2] < num_slots && sp[3] < nbuf && (u64)sp[0] + sp[1] <= t && (sp[4] == 0 || sp[1] <= nbuf);
}

// The gated RMSNorm with SiLU(z) taken into gdn_delta_seq (out == nullptr: none): z at
// columns zoff + j·dv of row r of z [t, z_stride] (T), weight w [dv] (T), the normalised rows
// to out [t, hv, dv] (T); counters [n_spans, hv] (u32, zero between launches).
template <typename T>
struct DeltaNorm {
    const T* z;
    u32 z_stride, zoff;
    const T* w;
    float eps;
    T* out;
    u32* counters;
};

template <typename T, int R>
__device__ __forceinline__ void gdn_delta_seq_impl_pdl(const T* __restrict__ qkv, const float* __restrict__ g,
                                                   const float* __restrict__ beta, float* __restrict__ state,
                                                   const u32* __restrict__ spans, T* __restrict__ out, u32 t,
                                                   u32 hk, u32 hv, u32 dk, u32 dv, u32 num_slots, u32 nbuf, u32 P,
                                                   float q_scale, const DeltaNorm<T> nz) {
    extern __shared__ float4 ds_smem4[];
    float* smem = reinterpret_cast<float*>(ds_smem4);
    const u32 nt = blockDim.x, tid = threadIdx.x, lane = tid & 31u, wid = tid >> 5, nw = nt >> 5;
    const u32 cpw = 32u / P;  // columns per warp
    const u32 cb = nt / P;    // columns per block
    const u32 part = lane / cpw;
    const u32 cib = wid * cpw + lane % cpw;  // column in block
    const u32 c = blockIdx.x * cb + cib;
    const bool active = c < dv;
    const u32 j = blockIdx.y, kh = j / (hv / hk);
    const u32* sp = spans + 5 * blockIdx.z;
    const u32 row0 = sp[0], len = sp[1], slot = sp[2], src = sp[3], snap = sp[4];
    const u64 rw = 2ull * hk * dk + (u64)hv * dv;  // qkv row width
    const bool span_ok = delta_span_ok(sp, t, num_slots, nbuf);

    const u64 hs = (u64)dk * dv;  // one head's state
    const u64 bufs = (u64)hv * hs;  // one buffer
    float* slot_base = state + (u64)slot * nbuf * bufs + (u64)j * hs;

    // The state rows come in before the PDL wait: they were written by an earlier step (or a
    // state copy at least two launches back: in_proj and conv + gates run between), never by
    // the launch just before, which is the only one a kernel may overlap (a kernel starts
    // once every block of the launch before it is past its own wait). spans is per-step
    // metadata uploaded before the step. q, k, v, g and beta (conv + gates, the launch before)
    // are read after the wait, and nothing is written before it.
    float S[R];
    if (span_ok && len != 0) load_rows<R>(S, slot_base + (u64)src * bufs, active, part, dk, dv, c);
    // The norm's z rows (the in_proj output, two launches back: see above) into L2.
    if (nz.out && span_ok) {
        const u32 lines = (dv * (u32)sizeof(T) + 127u) / 128u;
        if (tid < len * lines)
            porter_prefetch_l2(reinterpret_cast<const char*>(nz.z + ((u64)row0 + tid / lines) * nz.z_stride + nz.zoff +
                                                             (u64)j * dv) +
                               128u * (tid % lines));
    }
    porter_pdl_enter();

    if (!span_ok) {
        if (part == 0 && active) {
            const u64 e = (u64)row0 + len < t ? (u64)row0 + len : t;
            for (u64 r = row0; r < e; ++r) {
                out[(r * hv + j) * dv + c] = from_f<T>(PORTER_NAN);
                if (nz.out) nz.out[(r * hv + j) * dv + c] = from_f<T>(PORTER_NAN);
            }
        }
        return;
    }
    if (len == 0) return;

    const u32 rs = R + DS_PAD;      // row stride of a part in the staged q / k
    const u32 ts = P * rs;          // stride of a token
    float* qs = smem;               // [DS_TT][P][R + PAD]
    float* ks = qs + DS_TT * ts;    // [DS_TT][P][R + PAD]
    float* vs = ks + DS_TT * ts;    // [DS_TT][cb]
    float* as = vs + DS_TT * cb;    // [DS_TT]
    float* bs = as + DS_TT;         // [DS_TT]

    for (u32 t0 = 0; t0 < len; t0 += DS_TT) {
        const u32 tl = len - t0 < DS_TT ? len - t0 : DS_TT;
        __syncthreads();  // the previous tile is consumed
        // q, k of the tile: one warp per token, normalised, padded per part.
        for (u32 tt = wid; tt < tl; tt += nw) {
            const T* qr = qkv + (u64)(row0 + t0 + tt) * rw + (u64)kh * dk;
            stage_qk(qr, qr + (u64)hk * dk, qs + tt * ts, ks + tt * ts, dk, P, R, q_scale, lane);
        }
        for (u32 x = tid; x < tl * cb; x += nt) {
            const u32 tt = x / cb, cc = x % cb, cg = blockIdx.x * cb + cc;
            vs[x] = cg < dv ? to_f(qkv[(u64)(row0 + t0 + tt) * rw + 2ull * hk * dk + (u64)j * dv + cg]) : 0.0f;
        }
        if (tid < tl) {
            const u64 gi = (u64)(row0 + t0 + tid) * hv + j;
            as[tid] = gs_decay(g[gi]);
            bs[tid] = beta[gi];
        }
        __syncthreads();

        for (u32 tt = 0; tt < tl; ++tt) {
            const float4* k4 = reinterpret_cast<const float4*>(ks + tt * ts + part * rs);
            const float o = delta_token<R>(S, k4, DS_TT * ts / 4, as[tt], bs[tt], vs[tt * cb + cib], cpw);
            const u32 row = row0 + t0 + tt;
            if (part == 0 && active) out[((u64)row * hv + j) * dv + c] = from_f<T>(o);
            if (snap && active) store_rows<R>(S, slot_base + (u64)(t0 + tt) * bufs, part, dk, dv, c);
        }
    }
    // The gated norm of the span's rows of head j, by the last of the head's gridDim.x column
    // blocks to finish (an atomic count per (span, head), set back to zero by it): every
    // block's rows of `out` are visible to it (each thread fences its own writes before the
    // count, the last block fences after it), and one warp a row runs gated_norm_row as
    // gated_norm_z does, so the bits are gated_norm_z's. The count comes before the final
    // state store, so that the fence waits for the output rows only and the state drains
    // while the last block normalises.
    // A block holding all dv columns of the head (gridDim.x == 1, the host's whole-head form)
    // needs no count: its barrier makes its own rows of `out` visible to its warps. The last
    // block stores its state after the norm, so that its fence has no state stores to wait for.
    __shared__ int last;
    if (nz.out) {
        if (gridDim.x == 1) {
            __syncthreads();  // the block's own rows of `out`; the block is the last one
        } else {
            __threadfence();
            __syncthreads();
            if (tid == 0) {
                u32* cn = nz.counters + (u64)blockIdx.z * hv + j;
                const int l = atomicAdd(cn, 1u) == gridDim.x - 1;
                if (l) atomicExch(cn, 0u);
                last = l;
            }
            __syncthreads();
        }
    }
    const bool norm_here = nz.out && (gridDim.x == 1 || last);
    if (!snap && active && !norm_here) store_rows<R>(S, slot_base + (u64)src * bufs, part, dk, dv, c);
    if (norm_here) {
        if (gridDim.x != 1) __threadfence();
        for (u32 tt = wid; tt < len; tt += nw) {
            const u64 r = (u64)row0 + tt;
            gated_norm_row<T>(out + (r * hv + j) * dv, nz.z + r * nz.z_stride + nz.zoff + (u64)j * dv, nz.w,
                              nz.out + (r * hv + j) * dv, dv, nz.eps, lane);
        }
        if (!snap && active) store_rows<R>(S, slot_base + (u64)src * bufs, part, dk, dv, c);
    }
}

#define GDN_DELTA_SEQ(T, NAME, R)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256) gdn_delta_seq_r##R##_##NAME(                                 \
        const T* qkv, const float* g, const float* beta, float* state, const u32* spans, T* out, u32 t, u32 hk,     \
        u32 hv, u32 dk, u32 dv, u32 num_slots, u32 nbuf, u32 P, float q_scale, const T* nz_z, u32 nz_z_stride,     \
        u32 nz_zoff, const T* nz_w, float nz_eps, T* nz_out, u32* nz_counters) {                                   \
        gdn_delta_seq_impl_pdl<T, R>(qkv, g, beta, state, spans, out, t, hk, hv, dk, dv, num_slots, nbuf, P, q_scale, \
                                     DeltaNorm<T>{nz_z, nz_z_stride, nz_zoff, nz_w, nz_eps, nz_out, nz_counters});  \
    }
#define GDN_DELTA_SEQ_ALL(R) GDN_DELTA_SEQ(float, f32, R) GDN_DELTA_SEQ(bf16, bf16, R) GDN_DELTA_SEQ(f16, f16, R)
GDN_DELTA_SEQ_ALL(16)
GDN_DELTA_SEQ_ALL(32)
GDN_DELTA_SEQ_ALL(64)
GDN_DELTA_SEQ_ALL(128)
