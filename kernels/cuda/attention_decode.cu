// Decode attention over a paged KV cache on tensor cores (16-bit pools of the model dtype,
// sm_80+): the split path of attention.cu (q_len <= ATT_SPLIT_Q rows a sequence) rewritten
// for bandwidth. Appended to the helpers of kv_quant.cu / attention.cu / attention_tc.cu
// (key_slot, cp_async16, PORTER_ATTN_HELPERS_ONLY), a module of its own; launch wrappers in
// kernels/src/cuda/attention/decode.rs.
//
// Work split. Block (x = z * mtiles + mt, y = s * kvh + kh): 16 items (query row, head of
// KV head kh's GQA group, row-major as in attention.cu: item m = i * group + g) of sequence
// s, m-tile mt, over the keys of split z. Split z of a sequence covers key positions
// [z * ks, (z + 1) * ks), ks = 2^ksl with ksl = adec_ks_log2(pos0 + q_len): a function of the
// sequence's own length only (about 2^nsplit_log2 splits, at least 2^ks_min_log2 keys each),
// never of the batch. Inside a block, 16-key tiles (tile index = key / 16, absolute) go to
// warp tile % NW (NW = 4, or 2 in the _w2 kernels): each warp runs its own online softmax over its tiles with O (16 × DP, f32)
// in mma.sync m16n8k16 accumulators, then the NW warps merge in a fixed order through shared
// memory. A row whose keys all lie in split z is written by that block; otherwise each of
// its splits writes an unnormalised partial and `adec_combine` merges them in increasing z.
// So a row's arithmetic depends on its own sequence only (batch invariance), and not on
// the m-tile it shares with other rows (MMA rows are independent).
//
// Per warp and 16-key tile: S = Q·Kᵀ (16 × 16, K = DP: DP/16 k-steps × 2 MMAs, Q and K
// fragments by ldmatrix.x4), masked online softmax in exp2 units (scores × scale · log2 e),
// P rounded to T once (FlashAttention-2), O += P·V (DP/8 MMAs, V by ldmatrix.x4.trans).
// K / V tiles (16 rows × DP, 16 KiB a K+V pair at DP = 256) stream through a private ring
// of ST stages per warp by cp.async (16-byte chunks, XOR-swizzled: chunk c of row r at
// c ^ (r % 8), so ldmatrix's 8 rows hit distinct banks); no block barrier in the loop, only
// __syncwarp. Each lane looks up the slot of key lane % 16 of the next tile one tile ahead
// (the table load overlaps the current tile's copies); a key outside the block's range
// [klo, khi] or without a slot is zero-filled (cp.async src-size 0), never read.
//
// Bytes in flight: ST − 1 tiles per warp while it computes one: at DP = 256, ST = 3, 4 warps
// that is 128 KiB an SM (one 200 KiB block an SM), enough to cover HBM latency; the _w2
// kernels (104 KiB) run two blocks an SM with as much in flight, and one block's merge
// overlaps the other's loads.
//
// V2 (`_v2`, PORTER_ATTN_DECODE=mma4 / mma4w2 / mma4s): the same math and layout with less
// latency exposed: Q by cp.async (overlapping the table lookups and the first K/V copies),
// the block-table slots looked up two tiles ahead (pair registers), the next tile issued
// before waiting on the current one (ST − 1 tiles in flight during every wait), and on
// sm_90+ the split kernel triggers the combine's programmatic launch after its key loop;
// `adec_combine2` (4x the blocks, every partial load in flight at once) merges the splits.
// V2's 8-item form (flags bit 0, PORTER_ATTN_DECODE=mma4-n8; where a block has at most 8
// items: batch-1 decode at GQA group 8): the products transposed, S^T = K·Q^T and
// O^T += V^T·P^T, so the 8 items are the MMAs' n8 and no row of an m16 tile is padding: half
// the MMAs and half the O registers, Q's fragments held in registers across the key loop,
// P^T by movmatrix (comment below).
// V1 and V2 round differently (the combine's sum order): a process runs one form.
// Measured and reverted (session 28, docs/benchmarks.md): merging the splits in the split
// kernel's last blocks instead (device counters, every thread fencing its partials, one block
// merging each group of 8 splits, then one the groups) was correct and batch invariant but
// 11–16 µs slower a call than this combine at batch 1; and the combine reading its spans
// before its PDL wait measured no faster.

#define ADEC_BN 16            // keys per warp tile
#define ADEC_MAXZ 256         // most splits of one sequence (2^nsplit_log2 <= this)
#define ADEC_CTHREADS 256     // threads of a combine block

// log2 of the split size of a sequence with `ctx` keys: the smallest power of two >=
// ceil(ctx / 2^nsplit_log2), at least 2^ks_min_log2, at most 2^31 (decode.rs `ks_log2`).
__device__ __forceinline__ u32 adec_ks_log2(u64 ctx, u32 ks_min_log2, u32 nsplit_log2) {
    const u64 per = (ctx + (1ull << nsplit_log2) - 1) >> nsplit_log2;
    u32 l = 0;
    while (l < 31 && (1ull << l) < per) ++l;
    return min(max(l, ks_min_log2), 31u);
}

// The window's first key of position p (0 without a window).
__device__ __forceinline__ u32 adec_lo(u32 p, u32 window) { return (window != 0 && p + 1 > window) ? p + 1 - window : 0; }

// Programmatic dependent launch (sm_90+; a no-op below, and when the grid was not launched
// with the attribute): the V2 split kernel lets the V2 combine launch once every block is
// past its key loop (if porter_pdl_enter() has not already let it); every combine block
// (also one with nothing to merge) first waits in porter_pdl_enter() for the split grid to
// complete, so that its partials are visible and the combine grid never completes before it.
__device__ __forceinline__ void adec_pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The attention output gate (Qwen3-Next), fused into the final write of `out` (gate null:
// none): out = round(o · round(σ(g))), o the output rounded to T, the two roundings of
// sigmoid_gate_mul (elementwise.cu), bit for bit. The gate [t, heads, DP] (T) is written by
// an earlier kernel: read after porter_pdl_enter(), or before it where Q is (ADEC_PRE: it comes
// from before the append, like Q). adec_gate_f: round(σ(g)).
template <typename T> __device__ __forceinline__ float adec_gate_f(T g) { return round_to<T>(sigmoid_f(to_f(g))); }
template <typename T> __device__ __forceinline__ T adec_gated(T o, float gf) { return from_f<T>(to_f(o) * gf); }

// pm_sw, pm_ldsm[_t] and PMma<T> (the mma.sync helpers) are common.cuh's.

// Grid (nzg * mtiles, n_seqs * kvh), 32·NW threads, mtiles = ceil(qcap * group / 16).
// D == DP; pools 16-byte aligned (the host checks). Partials: part[((s * qcap + i) * heads +
// h) * nzg + z][DP + 4] (O unnormalised, then the running max in exp2 units and the sum).
// Dynamic shared memory: 16·DP·2 (Q) + max(NW·ST·2·16·DP·2 (K/V rings), NW·16·(DP+8)·4 +
// NW·16·2·4 (the merge)) bytes (decode.rs `smem`). gate: the output gate or null (adec_gated).
// V2's launches from the decode step's append (flags & ADEC_PRE, kernels/src/cuda/attention.rs
// `append_attention`): the block reads the spans, the block table, its Q tile and the first
// ST − 1 K/V tiles BEFORE porter_pdl_enter(), so that its start-up (three dependent round trips:
// spans, table, first tiles) overlaps the append's run. Safe only because the launch before
// this one is that append, which writes the pools at the spans' new positions (pos0 and on)
// and nothing else a block reads early: the spans and tables come from the host, Q from a launch
// before the append (complete once the append has passed its own wait, which is when this grid
// may start), and of the early tiles only the rows before pos0 (the rows in range at pos0 and
// after are copied after the wait: `ipart` below). Without the flag (and in V1) the block waits
// first. Every block passes the wait once, also when it has nothing to do (the chain's order
// rests on it).
#define ADEC_PRE 2u

template <typename T, int DP, int ST, int NW, bool V2>
__device__ __forceinline__ void adec_pdl(const T* __restrict__ q, const T* __restrict__ kpool,
                                          const T* __restrict__ vpool, const u32* __restrict__ tables,
                                          const u32* __restrict__ spans, T* __restrict__ out, float* __restrict__ part,
                                          const T* __restrict__ gate, u32 t, u32 heads, u32 kvh, float scale,
                                          u32 window, PagedKv kv, u32 qcap, u32 nzg, u32 ks_min_log2,
                                          u32 nsplit_log2, u32 flags) {
#if defined(PORTER_SM80)
    static_assert(DP == 64 || DP == 128 || DP == 256, "head dim");
    static_assert(ST >= 2 && ST <= 4, "stages");
    static_assert(NW == 2 || NW == 4, "warps");
    constexpr u32 THREADS = 32u * NW;
    constexpr u32 CH = DP / 8;              // 16-byte chunks per row
    constexpr u32 TILE = ADEC_BN * DP;      // elements of a K (or V) tile
    constexpr int NO = DP / 8;              // O accumulator tiles (dims 8f..8f+7)
    constexpr int KK = DP / 16;             // k-steps of S = Q·Kᵀ
    constexpr u32 OS = DP + 8;              // f32 row stride of the merge buffers
    constexpr u32 PS = DP + 4;              // f32 stride of a partial
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(128) unsigned char adec_smem[];
    T* Qs = reinterpret_cast<T*>(adec_smem);  // [16][DP], swizzled
    T* Ws = Qs + 16 * DP;                      // [NW][ST][K, V][16][DP], swizzled

    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 group = heads / kvh;
    const u32 mtiles = (qcap * group + 15u) / 16u;
    const u32 mt = blockIdx.x % mtiles, z = blockIdx.x / mtiles;
    // The PDL wait: here, or (V2 with ADEC_PRE) after the early loads.
    bool waited = false;
    const auto enter = [&]() {
        if (!waited) {
            porter_pdl_enter();
            waited = true;
        }
    };
    if (!(flags & ADEC_PRE)) enter();
    if (z >= nzg) {
        enter();
        return;
    }
    const u32 s = blockIdx.y / kvh, kh = blockIdx.y % kvh;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    const u32 rows = min(qlen, qcap);
    const u32 rows_in = row0 < t ? min(rows, t - row0) : 0;
    const u32 n_items = rows_in * group;
    const u32 m0 = mt * 16u;
    // qlen > ATT_SPLIT_Q: never sent (max_q_len <= ATT_SPLIT_Q).
    if (qlen > ATT_SPLIT_Q || m0 >= n_items) {
        enter();
        return;
    }
    const u32 m_last = min(m0 + 16u, n_items) - 1;
    const u32 ksl = adec_ks_log2((u64)pos0 + qlen, ks_min_log2, nsplit_log2);
    const u32 p_first = pos0 + m0 / group, p_last = pos0 + m_last / group;
    const u64 zk0 = (u64)z << ksl;
    const u64 klo64 = max(zk0, (u64)adec_lo(p_first, window));
    const u64 khi64 = min(zk0 + (1ull << ksl) - 1, (u64)p_last);
    if (klo64 > khi64) {
        enter();
        return;
    }
    const u32 klo = (u32)klo64, khi = (u32)khi64;
    const u32* bt = tables + (u64)s * kv.max_blocks;

    // Q tile (items beyond m_last zero). V2: by cp.async (its own commit group, the first),
    // so that its latency overlaps the table lookups and the first K/V copies.
    const bool qvec = (reinterpret_cast<u64>(q) & 15u) == 0;
    for (u32 c = tid; c < 16u * CH; c += THREADS) {
        const u32 r = c / CH, ch = c % CH, m = m0 + r;
        T* dst = Qs + pm_sw<DP>(r, ch);
        if (V2 && qvec) {
            const bool ok = m <= m_last;
            const u64 qo = ok ? ((u64)(row0 + m / group) * heads + kh * group + m % group) * DP + ch * 8 : 0;
            cp_async16(dst, q + qo, ok);
        } else if (m <= m_last) {
            const T* src = q + ((u64)(row0 + m / group) * heads + kh * group + m % group) * DP + ch * 8;
            if (qvec) {
                *reinterpret_cast<uint4*>(dst) = __ldg(reinterpret_cast<const uint4*>(src));
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) dst[e] = src[e];
            }
        } else {
            *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
        }
    }

    // This lane's two rows of the S / O fragments: g and g + 8 (empty range when invalid).
    const u32 g = lane >> 2, t4 = lane & 3u;
    // Item m's position and first key (an empty key range past m_last), for either form.
    auto item_keys = [&](u32 m, u32& p, u32& lo) {
        p = m <= m_last ? pos0 + m / group : 0u;
        lo = m <= m_last ? adec_lo(p, window) : 1u;
    };
    u32 rp[2], rlo[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) item_keys(m0 + g + 8u * h, rp[h], rlo[h]);

    // This warp's tiles: t0, t0 + 4, ... < tb (tile index = key / 16).
    const u32 ta = klo / ADEC_BN, tb = khi / ADEC_BN + 1;
    const u32 t0 = ta + ((warp + NW - (ta % NW)) % NW);
    const u32 n_my = t0 < tb ? (tb - t0 + NW - 1) / NW : 0u;
    T* Wb = Ws + warp * (ST * 2 * TILE);
    const u32 ring = (u32)__cvta_generic_to_shared(Wb);
    const u32 qaddr = (u32)__cvta_generic_to_shared(Qs);
    const u64 rs = (u64)kvh * DP, hoff = (u64)kh * DP;
    // V2: a pair register holds the slots of tiles 2p (lanes 0..15) and 2p + 1 (lanes
    // 16..31), key lane % 16; the pair of the tile after next is loaded when a pair starts
    // (two tiles of lookahead for the table load, where slot_of has one).
    auto pair_of = [&](u32 p) {
        const u32 i = 2u * p + (lane >> 4);
        return i < n_my ? key_slot(bt, (t0 + NW * i) * ADEC_BN + (lane & 15u), kv.max_blocks, kv.bs_log2,
                                   kv.n_slots)
                        : ATT_NOSLOT;
    };
    auto slot_of = [&](u32 i) {
        return i < n_my ? key_slot(bt, (t0 + NW * i) * ADEC_BN + (lane & 15u), kv.max_blocks, kv.bs_log2,
                                   kv.n_slots)
                        : ATT_NOSLOT;
    };
    // Tile i of this warp into stage i % ST; `sl`: the slot of key lane % 16 (V2: the pair
    // register of tile i).
    // `ipart`: 0 every row of the tile; 1 (before the wait) all but the keys in range at pos0
    // and after, which the append writes; 2 (after it) only those. A row left out is not copied
    // at all (no zero fill racing the other part's copy into the same shared row); every row is
    // in one part (the masked ones are zero-filled: P = 0 must not meet stale V).
    u32 ipart = 0;
    auto issue = [&](u32 i, u32 sl) {
        T* kd = Wb + (i % ST) * 2 * TILE;
        T* vd = kd + TILE;
        const u32 kbase = (t0 + NW * i) * ADEC_BN;
#pragma unroll
        for (u32 c = 0; c < ADEC_BN * CH / 32; ++c) {
            const u32 idx = lane + 32u * c, j = idx / CH, ch = idx % CH;
            const u32 sj = __shfl_sync(0xffffffffu, sl, V2 ? j + 16u * (i & 1u) : j);
            const u32 kpos = kbase + j;
            const bool inr = kpos >= klo && kpos <= khi;
            if (ipart != 0 && (inr && kpos >= pos0) != (ipart == 2)) continue;
            const bool ok = sj != ATT_NOSLOT && inr;
            const u64 off = ok ? (u64)sj * rs + hoff + ch * 8 : 0;
            cp_async16(kd + pm_sw<DP>(j, ch), kpool + off, ok);
            cp_async16(vd + pm_sw<DP>(j, ch), vpool + off, ok);
        }
    };

    float o[NO][4];
#pragma unroll
    for (int f = 0; f < NO; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.0f;
    float mrun[2] = {PORTER_NEG_INF, PORTER_NEG_INF}, lrun[2] = {0.0f, 0.0f};
    const float sl2 = scale * LOG2E;

    if (V2) cp_async_commit();  // the Q group
    // ADEC_PRE: the first ST − 1 tiles before the wait, without the keys the append writes.
    const bool early = !waited;
    if (early) ipart = 1;
    // V1: slot_next = the slot of the next tile to issue. V2: slot_next = the pair of the
    // next tile to issue, pair_nx = the pair after it.
    u32 slot_next = V2 ? pair_of(0) : slot_of(0);
    u32 pair_nx = V2 ? pair_of(1) : 0u;
    // Issues tile `ni` (if any) and moves the lookup state past it.
    auto step = [&](u32 ni) {
        if (V2) {
            if (ni < n_my) issue(ni, slot_next);
            if (ni & 1u) {
                slot_next = pair_nx;
                pair_nx = pair_of((ni + 1u) / 2u + 1u);
            }
        } else {
            const u32 sl = slot_next;
            slot_next = slot_of(ni + 1);
            if (ni < n_my) issue(ni, sl);
        }
        cp_async_commit();
    };
    // own(m): item m's keys lie in split z alone, so this block writes its row (zlo, zhi: its
    // splits). The gate of those rows into L1 now, read back as the rows are written: with
    // ADEC_PRE before the PDL wait (the gate, like Q, comes from the launch before the append,
    // complete when this grid may start), so that it has the whole main loop to land.
    const auto own = [&](u32 m, u32& zlo, u32& zhi) {
        const u32 p = pos0 + m / group;
        zlo = adec_lo(p, window) >> ksl;
        zhi = min(p >> ksl, nzg - 1);
        return zlo == zhi && z == zlo;
    };
    for (u32 c = tid; gate != nullptr && c < 16u * (DP / 64); c += THREADS) {  // 128-byte lines
        const u32 m = m0 + c / (DP / 64);
        u32 zl, zh;
        const u64 at = ((u64)(row0 + m / group) * heads + kh * group + m % group) * DP + (c % (DP / 64)) * 64;
        if (m <= m_last && own(m, zl, zh)) asm volatile("prefetch.global.L1 [%0];\n" ::"l"(gate + at));
    }
#pragma unroll
    for (u32 i = 0; i < ST - 1; ++i) step(i);
    enter();
    if (early) {
        // The early tiles' keys at pos0 and after (the block holding the spans' new rows: at
        // short context the only one), copied now, then awaited with the rest of the prologue
        // (their group is not in the loop's count).
        const u32 n_pro = min(n_my, (u32)(ST - 1)), nlo = max(pos0, klo);
        bool late = false;
        for (u32 i = 0; i < n_pro; ++i) {
            const u32 kb = (t0 + NW * i) * ADEC_BN;
            late |= kb <= khi && kb + ADEC_BN - 1 >= nlo;
        }
        ipart = 2;
        if (late) {
            for (u32 i = 0; i < n_pro; ++i) issue(i, V2 ? pair_of(i / 2u) : slot_of(i));
            cp_async_commit();
            cp_async_wait<0>();
        }
        ipart = 0;
    }
    if (V2) cp_async_wait<ST - 1>();  // the Q group (this thread's copies)
    __syncthreads();                   // the Q tile

    float* Ob = reinterpret_cast<float*>(Ws);  // [NW][16][OS] (the merge, through the K/V rings)
    float* Ml = Ob + NW * 16 * OS;              // [NW][16][m, l]
    if (V2 && (flags & 1u) && m_last - m0 < 8u) {
        // At most 8 items (batch-1 decode at GQA group 8: one query row, the 8 heads of a KV
        // head), transposed: S^T = K·Q^T (m16 = 16 keys, n8 = 8 items) and O^T += V^T·P^T
        // (m16 = 16 dims, n8 = the items), so no MMA row is padding: half the MMAs and the O
        // accumulators of the form below, and Q's B fragments stay in registers for the whole
        // key loop. P^T's B fragments are S^T's C fragments transposed in registers
        // (movmatrix). The choice depends on the block's own items (its sequence's rows), so
        // the batch does not change a row's arithmetic.
        constexpr int NM = DP / 16;  // O^T m-tiles (16 dims each)
        u32 qb[KK][2];
#pragma unroll
        for (int k2 = 0; k2 < KK / 2; ++k2) {
            u32 r[4];
            pm_ldsm(r, qaddr + 2u * pm_sw<DP>(lane & 7u, 4u * k2 + (lane >> 3)));
            qb[2 * k2][0] = r[0];
            qb[2 * k2][1] = r[1];
            qb[2 * k2 + 1][0] = r[2];
            qb[2 * k2 + 1][1] = r[3];
        }
        // This lane's two items (S^T / O^T columns): 2·t4 and 2·t4 + 1.
        u32 cp[2], clo[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) item_keys(m0 + 2u * t4 + h, cp[h], clo[h]);
        float ot[NM][4];
#pragma unroll
        for (int f = 0; f < NM; ++f) ot[f][0] = ot[f][1] = ot[f][2] = ot[f][3] = 0.0f;
        float mr[2] = {PORTER_NEG_INF, PORTER_NEG_INF}, lr[2] = {0.0f, 0.0f};
        for (u32 i = 0; i < n_my; ++i) {
            __syncwarp();
            step(i + ST - 1);
            cp_async_wait<ST - 1>();
            __syncwarp();
            const u32 kaddr = ring + (i % ST) * 2 * TILE * 2, vaddr = kaddr + TILE * 2;
            const u32 kbase = (t0 + NW * i) * ADEC_BN;
            // S^T: keys g, g + 8 (rows) × items 2·t4, 2·t4 + 1 (columns).
            float st[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                u32 a[4];
                pm_ldsm(a, kaddr + 2u * pm_sw<DP>((lane & 7u) + ((lane >> 3) & 1u) * 8u, 2u * kk + (lane >> 4)));
                PMma<T>::mma(st, a, qb[kk][0], qb[kk][1]);
            }
            float mx[2] = {PORTER_NEG_INF, PORTER_NEG_INF};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int h = e & 1;
                const u32 kpos = kbase + g + 8u * (e >> 1);
                const float x = (kpos >= clo[h] && kpos <= cp[h]) ? st[e] * sl2 : PORTER_NEG_INF;
                st[e] = x;
                mx[h] = fmaxf(mx[h], x);
            }
            float corr[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 4));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 8));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 16));
                const float mn = fmaxf(mr[h], mx[h]);
                const bool none = mn == PORTER_NEG_INF;
                corr[h] = none ? 1.0f : exp2f(mr[h] - mn);
                float ps = 0.0f;
#pragma unroll
                for (int e = h; e < 4; e += 2) {
                    const float p = none ? 0.0f : exp2f(st[e] - mn);
                    st[e] = p;
                    ps += p;
                }
                lr[h] = fmaf(lr[h], corr[h], ps);
                mr[h] = mn;
            }
            // P^T's B fragments (keys 2·t4.. × item g): the two 8 × 8 blocks of S^T
            // (keys 0..7, keys 8..15), rounded to T and transposed.
            const u32 pb0 = pm_movt(PMma<T>::pack(st[0], st[1]));
            const u32 pb1 = pm_movt(PMma<T>::pack(st[2], st[3]));
#pragma unroll
            for (int f = 0; f < NM; ++f) {
                ot[f][0] *= corr[0];
                ot[f][1] *= corr[1];
                ot[f][2] *= corr[0];
                ot[f][3] *= corr[1];
            }
#pragma unroll
            for (int f = 0; f < NM; ++f) {
                // ldmatrix.trans of the V tile: (keys 0..7, dims 16f..), (keys 8..15, 16f..),
                // (keys 0..7, 16f + 8..), (keys 8..15, 16f + 8..); V^T's A fragment takes them
                // as (dims 16f.., keys 0..7), (16f + 8.., 0..7), (16f.., 8..15), (16f + 8.., 8..15).
                u32 v[4];
                pm_ldsm_t(v, vaddr + 2u * pm_sw<DP>((lane & 7u) + ((lane >> 3) & 1u) * 8u, 2u * f + (lane >> 4)));
                const u32 a[4] = {v[0], v[2], v[1], v[3]};
                PMma<T>::mma(ot[f], a, pb0, pb1);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            lr[h] += __shfl_xor_sync(0xffffffffu, lr[h], 4);
            lr[h] += __shfl_xor_sync(0xffffffffu, lr[h], 8);
            lr[h] += __shfl_xor_sync(0xffffffffu, lr[h], 16);
        }
        adec_pdl_trigger();
        cp_async_wait<0>();
        __syncthreads();
        // Rows 2·t4 + h of this warp's merge buffers (rows 8..15 stay unread: m > m_last).
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float* orow = Ob + (warp * 16u + 2u * t4 + h) * OS + g;
#pragma unroll
            for (int f = 0; f < NM; ++f) {
                orow[16 * f] = ot[f][h];
                orow[16 * f + 8] = ot[f][2 + h];
            }
            if (g == 0) {
                Ml[(warp * 16u + 2u * t4 + h) * 2] = mr[h];
                Ml[(warp * 16u + 2u * t4 + h) * 2 + 1] = lr[h];
            }
        }
    } else {
        for (u32 i = 0; i < n_my; ++i) {
            // The stage of tile i + ST - 1 was last read by tile i - 1 (every lane is past it
            // after the __syncwarp). V1 issues it once tile i has landed (ST - 2 tiles in flight
            // during the wait); V2 before waiting (ST - 1 in flight: 3 tiles, 48 KiB a warp at
            // DP = 256, 192 KiB an SM, where V1 has 128).
            if (V2) {
                __syncwarp();
                step(i + ST - 1);
                cp_async_wait<ST - 1>();
                __syncwarp();
            } else {
                cp_async_wait<ST - 2>();
                __syncwarp();
                step(i + ST - 1);
            }
            const u32 kaddr = ring + (i % ST) * 2 * TILE * 2, vaddr = kaddr + TILE * 2;
            const u32 kbase = (t0 + NW * i) * ADEC_BN;

            // S = Q·Kᵀ: rows g, g + 8; keys 8·nt + 2·t4 + {0, 1}.
            float sc[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                u32 a[4], b[4];
                pm_ldsm(a, qaddr + 2u * pm_sw<DP>((lane & 7u) + ((lane >> 3) & 1u) * 8u, 2u * kk + (lane >> 4)));
                pm_ldsm(b, kaddr + 2u * pm_sw<DP>((lane & 7u) + (lane >> 4) * 8u, 2u * kk + ((lane >> 3) & 1u)));
                PMma<T>::mma(sc[0], a, b[0], b[1]);
                PMma<T>::mma(sc[1], a, b[2], b[3]);
            }

            // Mask, online softmax (exp2 units), P rounded to T.
            float mx[2] = {PORTER_NEG_INF, PORTER_NEG_INF};
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e >> 1;
                    const u32 kpos = kbase + 8u * nt + 2u * t4 + (e & 1);
                    const float x = (kpos >= rlo[h] && kpos <= rp[h]) ? sc[nt][e] * sl2 : PORTER_NEG_INF;
                    sc[nt][e] = x;
                    mx[h] = fmaxf(mx[h], x);
                }
            float corr[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                const float mn = fmaxf(mrun[h], mx[h]);
                const bool none = mn == PORTER_NEG_INF;
                corr[h] = none ? 1.0f : exp2f(mrun[h] - mn);
                float ps = 0.0f;
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e) {
                        const float p = none ? 0.0f : exp2f(sc[nt][e] - mn);
                        sc[nt][e] = p;
                        ps += p;
                    }
                lrun[h] = fmaf(lrun[h], corr[h], ps);
                mrun[h] = mn;
            }
            u32 pa[4];
            pa[0] = PMma<T>::pack(sc[0][0], sc[0][1]);
            pa[1] = PMma<T>::pack(sc[0][2], sc[0][3]);
            pa[2] = PMma<T>::pack(sc[1][0], sc[1][1]);
            pa[3] = PMma<T>::pack(sc[1][2], sc[1][3]);

            // O = O·corr + P·V.
#pragma unroll
            for (int f = 0; f < NO; ++f) {
                o[f][0] *= corr[0];
                o[f][1] *= corr[0];
                o[f][2] *= corr[1];
                o[f][3] *= corr[1];
            }
#pragma unroll
            for (int f2 = 0; f2 < NO / 2; ++f2) {
                u32 b[4];
                pm_ldsm_t(b, vaddr + 2u * pm_sw<DP>((lane & 7u) + ((lane >> 3) & 1u) * 8u, 2u * f2 + (lane >> 4)));
                PMma<T>::mma(o[2 * f2], pa, b[0], b[1]);
                PMma<T>::mma(o[2 * f2 + 1], pa, b[2], b[3]);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            lrun[h] += __shfl_xor_sync(0xffffffffu, lrun[h], 1);
            lrun[h] += __shfl_xor_sync(0xffffffffu, lrun[h], 2);
        }

        if (V2) adec_pdl_trigger();
        // Merge the warps (in warp order) through the K/V rings.
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float* orow = Ob + (warp * 16u + g + 8u * h) * OS + 2u * t4;
#pragma unroll
            for (int f = 0; f < NO; ++f)
                *reinterpret_cast<float2*>(orow + 8 * f) = make_float2(o[f][2 * h], o[f][2 * h + 1]);
            if (t4 == 0) {
                Ml[(warp * 16u + g + 8u * h) * 2] = mrun[h];
                Ml[(warp * 16u + g + 8u * h) * 2 + 1] = lrun[h];
            }
        }
    }
    __syncthreads();
    const bool ovec = (reinterpret_cast<u64>(out) & 7u) == 0;
    for (u32 idx = tid; idx < 16u * (DP / 4); idx += THREADS) {
        const u32 r = idx / (DP / 4), d0 = (idx % (DP / 4)) * 4;
        const u32 m = m0 + r;
        if (m > m_last) continue;
        const u32 i = m / group, hd = kh * group + m % group;
        u32 zlo, zhi;
        own(m, zlo, zhi);
        if (z < zlo || z > zhi) continue;
        float M = PORTER_NEG_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, Ml[(w * 16 + r) * 2]);
        float L = 0.0f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float mw = Ml[(w * 16 + r) * 2];
            const float c = mw == PORTER_NEG_INF ? 0.0f : exp2f(mw - M);
            L = fmaf(Ml[(w * 16 + r) * 2 + 1], c, L);
            const float4 v = *reinterpret_cast<const float4*>(Ob + (w * 16 + r) * OS + d0);
            acc.x = fmaf(v.x, c, acc.x);
            acc.y = fmaf(v.y, c, acc.y);
            acc.z = fmaf(v.z, c, acc.z);
            acc.w = fmaf(v.w, c, acc.w);
        }
        if (zlo == zhi) {
            const float inv = 1.0f / L;
            T* dst = out + ((u64)(row0 + i) * heads + hd) * DP + d0;
            T e0 = from_f<T>(acc.x * inv), e1 = from_f<T>(acc.y * inv), e2 = from_f<T>(acc.z * inv),
              e3 = from_f<T>(acc.w * inv);
            if (gate != nullptr) {  // prefetched into L1 above
                const T* gs = gate + ((u64)(row0 + i) * heads + hd) * DP + d0;
                e0 = adec_gated(e0, adec_gate_f(gs[0]));
                e1 = adec_gated(e1, adec_gate_f(gs[1]));
                e2 = adec_gated(e2, adec_gate_f(gs[2]));
                e3 = adec_gated(e3, adec_gate_f(gs[3]));
            }
            if (ovec) {
                const u32 lo = (u32)bits16(e0) | ((u32)bits16(e1) << 16);
                const u32 hi = (u32)bits16(e2) | ((u32)bits16(e3) << 16);
                *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
            } else {
                dst[0] = e0;
                dst[1] = e1;
                dst[2] = e2;
                dst[3] = e3;
            }
        } else {
            float* pp = part + ((((u64)s * qcap + i) * heads + hd) * nzg + z) * PS;
            *reinterpret_cast<float4*>(pp + d0) = acc;
            if (d0 == 0) *reinterpret_cast<float2*>(pp + DP) = make_float2(M, L);
        }
    }
#else
    // Fallback build (below sm_80 or PORTER_FALLBACK): the host never launches this kernel.
    __trap();
#endif
}

// Merges the partials of the split rows: one block of ADEC_CTHREADS per (row i < qcap of
// sequence s, head h), grid (qcap * heads, n_seqs); rows finished by one split exit. M =
// max m_z, L = Σ l_z·2^(m_z − M), O = Σ part_z · 2^(m_z − M) / L, the weights in increasing z
// by every thread alike; thread (grp, c) sums dims 4c..4c+3 over z ≡ grp (mod NG), then the NG
// group sums are added in group order: the order depends on the row's own splits only.
template <typename T, int DP>
__device__ __forceinline__ void adec_combine_impl(const float* __restrict__ part, const u32* __restrict__ spans,
                                                  T* __restrict__ out, const T* __restrict__ gate, u32 t, u32 heads,
                                                  u32 window, u32 qcap, u32 nzg, u32 ks_min_log2, u32 nsplit_log2) {
    constexpr u32 CG = DP / 4;                // threads of a z group (4 dims each)
    constexpr u32 NG = ADEC_CTHREADS / CG;    // z groups
    constexpr u32 PS = DP + 4;
    __shared__ float sm[ADEC_MAXZ], sw[ADEC_MAXZ];
    __shared__ __align__(16) float red[NG][DP];
    const u32 tid = threadIdx.x;
    const u32 s = blockIdx.y, i = blockIdx.x / heads, h = blockIdx.x % heads;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    if (qlen > ATT_SPLIT_Q || i >= min(qlen, qcap) || row0 >= t || i >= t - row0) return;
    const u32 ksl = adec_ks_log2((u64)pos0 + qlen, ks_min_log2, nsplit_log2);
    const u32 p = pos0 + i;
    const u32 zlo = adec_lo(p, window) >> ksl, zhi = min(p >> ksl, nzg - 1);
    if (zlo >= zhi) return;
    const u32 n = zhi - zlo + 1;  // <= nzg <= ADEC_MAXZ
    const float* base = part + (((u64)s * qcap + i) * heads + h) * nzg * PS + (u64)zlo * PS;
    const u64 orow = ((u64)(row0 + i) * heads + h) * DP;
    // The gate of dim tid (DP <= ADEC_CTHREADS), loaded now, used at the end.
    const T gv = gate != nullptr && tid < DP ? gate[orow + tid] : from_f<T>(0.0f);
    for (u32 k = tid; k < n; k += ADEC_CTHREADS) {
        const float2 ml = *reinterpret_cast<const float2*>(base + (u64)k * PS + DP);
        sm[k] = ml.x;
        sw[k] = ml.y;
    }
    __syncthreads();
    float M = PORTER_NEG_INF;
    for (u32 k = 0; k < n; ++k) M = fmaxf(M, sm[k]);
    float L = 0.0f;
    for (u32 k = 0; k < n; ++k) L = fmaf(sw[k], exp2f(sm[k] - M), L);
    __syncthreads();
    for (u32 k = tid; k < n; k += ADEC_CTHREADS) sw[k] = exp2f(sm[k] - M) / L;
    __syncthreads();
    const u32 grp = tid / CG, c = tid % CG;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (u32 k = grp; k < n; k += NG) {
        const float4 v = *reinterpret_cast<const float4*>(base + (u64)k * PS + 4 * c);
        const float w = sw[k];
        acc.x = fmaf(v.x, w, acc.x);
        acc.y = fmaf(v.y, w, acc.y);
        acc.z = fmaf(v.z, w, acc.z);
        acc.w = fmaf(v.w, w, acc.w);
    }
    *reinterpret_cast<float4*>(&red[grp][4 * c]) = acc;
    __syncthreads();
    if (tid < DP) {
        float x = 0.0f;
#pragma unroll
        for (u32 gq = 0; gq < NG; ++gq) x += red[gq][tid];
        const T v = from_f<T>(x);
        out[orow + tid] = gate != nullptr ? adec_gated(v, adec_gate_f(gv)) : v;
    }
}

// The V2 combine (PORTER_ATTN_DECODE=mma4): one block of ADEC_CTHREADS per (row i of
// sequence s, head h, 64 dims d0..d0+63), grid (qcap * heads, DP / 64, n_seqs): 4x the
// blocks of adec_combine, and every partial load of a thread issued before its first use
// (thread (zq, c) loads dims d0+4c..+3 of splits k = zq + 16j, j < 16; thread k the (m, l)
// of split k), so one block costs about two L2 round trips instead of one per 4 splits.
// M = max m_k (exact), L = Σ l_k·2^(m_k − M) by a fixed tree over k (warp xor tree, then
// the 8 warps in order), O = Σ part_k · 2^(m_k − M) / L: each (zq) sums its splits in
// increasing k, the 16 sums added in zq order. k = z − zlo and n depend on the row's own
// sequence only: batch invariant, bit-identical rows.
template <typename T, int DP>
__device__ __forceinline__ void adec_combine2_impl(const float* __restrict__ part, const u32* __restrict__ spans,
                                                   T* __restrict__ out, const T* __restrict__ gate, u32 t, u32 heads,
                                                   u32 window, u32 qcap, u32 nzg, u32 ks_min_log2, u32 nsplit_log2) {
    constexpr u32 PS = DP + 4;
    constexpr u32 ZL = 16;                    // split lanes (zq)
    constexpr u32 NJ = ADEC_MAXZ / ZL;        // splits a thread may load
    constexpr u32 NWARP = ADEC_CTHREADS / 32;
    static_assert(ADEC_CTHREADS == ZL * 16 && ADEC_MAXZ <= ADEC_CTHREADS, "combine2 layout");
    __shared__ float sw[ADEC_MAXZ];
    __shared__ float rm[NWARP], rl[NWARP];
    __shared__ __align__(16) float red[ZL][64];
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 s = blockIdx.z, i = blockIdx.x / heads, h = blockIdx.x % heads, d0 = blockIdx.y * 64u;
    const u32 row0 = spans[3 * s], qlen = spans[3 * s + 1], pos0 = spans[3 * s + 2];
    if (qlen > ATT_SPLIT_Q || i >= min(qlen, qcap) || row0 >= t || i >= t - row0) return;
    const u32 ksl = adec_ks_log2((u64)pos0 + qlen, ks_min_log2, nsplit_log2);
    const u32 p = pos0 + i;
    const u32 zlo = adec_lo(p, window) >> ksl, zhi = min(p >> ksl, nzg - 1);
    if (zlo >= zhi) return;
    const u32 n = zhi - zlo + 1;  // <= nzg <= ADEC_MAXZ
    const float* base = part + (((u64)s * qcap + i) * heads + h) * nzg * PS + (u64)zlo * PS;
    const u64 oat = ((u64)(row0 + i) * heads + h) * DP + d0 + tid;  // thread tid < 64's element
    const T gv = gate != nullptr && tid < 64u ? gate[oat] : from_f<T>(0.0f);  // the gate, early
    const u32 zq = tid / 16u, c = tid % 16u;
    float4 v[NJ];
#pragma unroll
    for (u32 j = 0; j < NJ; ++j) {
        const u32 k = zq + ZL * j;
        v[j] = k < n ? *reinterpret_cast<const float4*>(base + (u64)k * PS + d0 + 4u * c)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float mk = PORTER_NEG_INF, lk = 0.0f;
    if (tid < n) {
        const float2 ml = *reinterpret_cast<const float2*>(base + (u64)tid * PS + DP);
        mk = ml.x;
        lk = ml.y;
    }
    const float gf = gate != nullptr && tid < 64u ? adec_gate_f(gv) : 1.0f;  // off the tail
    float M = mk;
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) rm[warp] = M;
    __syncthreads();
    M = rm[0];
#pragma unroll
    for (u32 w = 1; w < NWARP; ++w) M = fmaxf(M, rm[w]);
    const float wk = tid < n ? exp2f(mk - M) : 0.0f;
    float L = lk * wk;
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0) rl[warp] = L;
    __syncthreads();
    L = rl[0];
#pragma unroll
    for (u32 w = 1; w < NWARP; ++w) L += rl[w];
    if (tid < ADEC_MAXZ) sw[tid] = wk / L;
    __syncthreads();
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (u32 j = 0; j < NJ; ++j) {
        const u32 k = zq + ZL * j;
        if (k < n) {
            const float w = sw[k];
            acc.x = fmaf(v[j].x, w, acc.x);
            acc.y = fmaf(v[j].y, w, acc.y);
            acc.z = fmaf(v[j].z, w, acc.z);
            acc.w = fmaf(v[j].w, w, acc.w);
        }
    }
    *reinterpret_cast<float4*>(&red[zq][4 * c]) = acc;
    __syncthreads();
    if (tid < 64u) {
        float x = 0.0f;
#pragma unroll
        for (u32 gq = 0; gq < ZL; ++gq) x += red[gq][tid];
        const T v = from_f<T>(x);
        out[oat] = gate != nullptr ? adec_gated(v, gf) : v;
    }
}

// Names: attention_decode_<T>_d<DP>_s<ST>[_w2][_v2] (4 warps, one block an SM at DP = 256;
// _w2: 2 warps, two blocks an SM, so that one block's merge overlaps the other's loads;
// _v2: Q by cp.async and two tiles of table lookahead), attention_decode_combine_<T>_d<DP>
// and attention_decode_combine2_<T>_d<DP> (the V2 combine, grid y = DP / 64).
#define ADEC_KERNEL(T, NAME, DP, ST, NW, W, V2, VS)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * NW, 4 / NW) attention_decode_##NAME##_d##DP##_s##ST##W##VS( \
        const T* q, const T* kpool, const T* vpool, const u32* tables, const u32* spans, T* out, float* part,     \
        const T* gate, u32 t, u32 heads, u32 kvh, float scale, u32 window, u32 max_blocks, u32 bs_log2,           \
        u32 n_slots, u32 qcap, u32 nzg, u32 ks_min_log2, u32 nsplit_log2, u32 flags) {                             \
        adec_pdl<T, DP, ST, NW, V2>(q, kpool, vpool, tables, spans, out, part, gate, t, heads, kvh, scale, window,\
                                    PagedKv{max_blocks, bs_log2, n_slots}, qcap, nzg, ks_min_log2, nsplit_log2,   \
                                    V2 ? flags : flags & ~ADEC_PRE);                                              \
    }
#define ADEC_COMBINE(T, NAME, DP, C, IMPL)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) attention_decode_##C##_##NAME##_d##DP(                  \
        const float* part, const u32* spans, T* out, const T* gate, u32 t, u32 heads, u32 window, u32 qcap,   \
        u32 nzg, u32 ks_min_log2, u32 nsplit_log2) {                                                          \
        porter_pdl_enter();                                                                                   \
        IMPL<T, DP>(part, spans, out, gate, t, heads, window, qcap, nzg, ks_min_log2, nsplit_log2);           \
    }
#define ADEC_DP(T, NAME, DP)                                  \
    ADEC_KERNEL(T, NAME, DP, 2, 4, , false, )                 \
    ADEC_KERNEL(T, NAME, DP, 3, 4, , false, )                 \
    ADEC_KERNEL(T, NAME, DP, 3, 2, _w2, false, )              \
    ADEC_KERNEL(T, NAME, DP, 3, 4, , true, _v2)               \
    ADEC_KERNEL(T, NAME, DP, 3, 2, _w2, true, _v2)            \
    ADEC_COMBINE(T, NAME, DP, combine, adec_combine_impl)     \
    ADEC_COMBINE(T, NAME, DP, combine2, adec_combine2_impl)
#define ADEC_ALL(T, NAME)   \
    ADEC_DP(T, NAME, 64)    \
    ADEC_DP(T, NAME, 128)   \
    ADEC_DP(T, NAME, 256)

ADEC_ALL(bf16, bf16)
ADEC_ALL(f16, f16)
