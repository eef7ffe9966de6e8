// Gated DeltaNet, chunked form on tensor cores: the state sweep of `PORTER_GDN_CHUNK=tc6`,
// tc5's sweep (gdn_chunk_tc5.cu, same warps, same products, **same bits**) with its stages
// filled once per thread-block cluster instead of once per block. Appended to gdn_chunk.cu +
// gdn_chunk_tc.cu + gdn_chunk_tc2.cu + gdn_chunk_tc4.cu + gdn_chunk_tc5.cu (same module,
// compiled for sm_90a on an sm_90 device); reads the scratch of gdn_chunk_tc4_wu's `_pad`
// entries (tc4's values in the stage layout).
//
// Why: a head's dv / 32 column blocks (4 at the 80B layout) each stage the same −W, K̃, Qg and
// Pb tiles of every chunk (56 KiB of a 64 KiB stage at DK = 128): 128 blocks pull ≈ 8.4 MB
// out of L2 per chunk step, ≈ 4.5 TB/s at 16k tokens (1.86 µs a step), and that is the
// sweep's pace (tc3's estimate of the L2 time, 100-150 µs at 4k, is what tc5 measures).
// Nsight Compute on tc5 at 4k tokens (H100, session 32): L2 throughput 80.9 % of peak (7.27
// TB/s), DRAM 50.7 %, the tensor pipe 18.7 % busy.
// Here CL blocks of a head form a cluster (__cluster_dims__(CL, 1, 1)); rank r copies rows
// [r·64/CL, (r + 1)·64/CL) of the four shared tiles with one-dimensional bulk copies
// multicast to every block of the cluster (cp.async.bulk ... .multicast::cluster, one L2 read
// for CL blocks), and its own U block to itself: one copy a tile, since gdn_chunk_tc4_wu's
// `_pad` entries write the scratch in the stage layout (row-sized copies, 320 a chunk, made the
// sweep 4× slower than tc5: ≈ 30 ns of the issuing SM a copy, by those timings). Per block
// and chunk L2 gives 64/CL rows of the shared tiles plus U (39 KiB at CL = 2, pads included,
// against tc5's 64).
// H100, 80B layout, sweep at 4k / 16k tokens: CL = 2 89.9 / 320.1 µs, CL = 4 154.0 / 567.5 (a
// cluster of 4 blocks of 224 KiB finds fewer places: slower), CL = 1 (no sharing: the producer
// warp alone) 100.9 / 367.3; tc5 126.9 / 476.9. CL = 2 is the default.
//
// Stages: tc5's layout (3 × Gt2Stage<DK, 2, true>, the exchange after them). Each stage has
// a `full` mbarrier (one arrival, this block's expect_tx of the stage's bytes, completed by
// the copies of every rank) and an `empty` mbarrier (4·CL arrivals: each sweeping warp of
// each block of the cluster once it has read the stage). Chunk c sits in stage c % 3; before
// a rank multicasts chunk c + 3 into stage c % 3 of every block, its producer warp (warp 4,
// 160 threads a block) waits on its own `empty`, which completes once every block has
// finished chunk c. Parity of chunk c's phase: (c / 3) & 1.
//
// Shapes: DK ∈ {64, 128}; dv / 32 (grid x) a multiple of CL; T = bf16 / f16.

// tc7 (`PORTER_GDN_CHUNK=tc7`): the same sweep and pipe on the wu launch's `_lean` scratch
// (gdn_chunk_tc4.cu, FORM 2): K̂ and Q̂ without decays, one per key head (the two value heads of
// the 80B layout share them), U in T, and the decays beside U; the sweep applies them in its
// registers (gt5_sweep with Pipe::LEAN). Why: the tc6 call's scratch round trip, 98,304 bytes
// a (chunk, value head) written by the wu launch and read back by this one, is most of the
// call at 16k tokens (session 35: the sweep at 85 % of the H100's copy bandwidth); tc7 moves
// 65,024. Stage (Gt7Stage): W, K̂ (T [64][DK + 8]), U (T [64][GT7_LDU]), e^G and
// e^(G_last − G) (f32 [2][64]), Q̂ (T [64][DK + 8]), Pb (T [64][GT2_LDP]); then the exchange,
// with the scaled Vn fragments beside the plain ones (GT7_SMEM).
#if defined(PORTER_SM80)
template <int DK>
struct Gt7Stage {
    static constexpr u32 LDK = DK + 8;
    static constexpr u32 KB = 2 * GC_C * LDK;            // one T [64][LDK] tile
    static constexpr u32 UT = 2 * GC_C * GT7_LDU;        // U, T [64][GT7_LDU]
    static constexpr u32 UB = UT + 8 * GC_C;             // U, then the decays f32 [2][64]
    static constexpr u32 BYTES = 3 * KB + UB + 2 * GC_C * GT2_LDP;
};
#define GT7_SMEM(DK) (GT2_STAGES * Gt7Stage<DK>::BYTES + 4u * (4u + (DK) / 32u) * 32u * 16u)

template <bool B, class X, class Y>
struct GtSel {
    typedef X type;
};
template <class X, class Y>
struct GtSel<false, X, Y> {
    typedef Y type;
};
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GT6_CLUSTER(CL) __cluster_dims__(CL, 1, 1)
#else
#define GT6_CLUSTER(CL)
#endif

#if defined(PORTER_SM80) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ u32 gt6_sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void gt6_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void gt6_wait(const u64* bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(gt6_sa(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

// Arrival on the mbarrier at `bar`'s offset in the shared memory of cluster rank `rank`
// (release at CTA scope, CUTLASS's consumer release: it orders this warp's reads of the stage;
// release at cluster scope would also wait for its output stores, measured slow).
__device__ __forceinline__ void gt6_arrive_at(const u64* bar, u32 rank) {
    asm volatile(
        "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(gt6_sa(bar)),
        "r"(rank)
        : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory to `dst` of
// every block of the cluster in `mask` (dst's offset in each), completing on `bar` there.
__device__ __forceinline__ void gt6_copy_mc(void* dst, const void* src, u32 bytes, const u64* bar, unsigned short mask) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
        "%4;\n" ::"r"(gt6_sa(dst)),
        "l"(src), "r"(bytes), "r"(gt6_sa(bar)), "h"(mask)
        : "memory");
}

// The same into this block only.
__device__ __forceinline__ void gt6_copy(void* dst, const void* src, u32 bytes, const u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     gt6_sa(dst)),
                 "l"(src), "r"(bytes), "r"(gt6_sa(bar))
                 : "memory");
}

// The stage pipe of the tc6 sweep (the interface of tc5's Gt5CpPipe). Warps 0-3 sweep: they
// wait on `full` and, done with a stage, each arrives on `empty` in every block of the
// cluster (4·CL arrivals a phase). Warp 4 produces: it waits on its block's `empty` and
// sends its rank's share of the chunk three ahead, so no sweeping warp ever waits on the
// cluster.
// LEAN_: tc7's stage (Gt7Stage) and scratch.
template <typename T, int DK, u32 CL, bool LEAN_ = false>
struct Gt6Pipe {
    static constexpr bool LEAN = LEAN_;
    typedef typename GtSel<LEAN, Gt7Stage<DK>, Gt2Stage<DK, 2, true>>::type L;
    static constexpr u32 LDK = DK + 8, LDU = 32 + 4;
    static constexpr u32 R = GC_C / CL;                     // rows of each shared tile a rank copies
    static constexpr unsigned short MASK = (1u << CL) - 1;  // every block of the cluster
    // Bytes a block receives per stage: the four shared tiles whole, its U block (pads
    // included; LEAN: and the decays).
    static constexpr u32 TX = GC_C * (3 * LDK + GT2_LDP) * (u32)sizeof(T) + L::UB;
    Gt5Scratch<T> a;
    u32 rank;
    u64* full;   // [3]
    u64* empty;  // [3]

    __device__ __forceinline__ explicit Gt6Pipe(const Gt5Scratch<T>& a_) : a(a_) {
        __shared__ __align__(8) u64 bars[6];
        full = bars;
        empty = bars + 3;
        asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    }

    // Chunk `ch` into `stage` (by one thread): this rank's rows of the shared tiles to every
    // block, its U columns to itself, one copy each (the scratch is in the stage layout:
    // gdn_chunk_tc4_wu's `_pad` entries; LEAN: its `_lean` entries, K̂ / Q̂ of the key head's
    // chunk `chk`, the decays a sixth copy); the stage's bytes expected on `bar` first.
    __device__ __forceinline__ void issue(unsigned char* stage, u64 ch, u64 chk, const u64* bar) {
        asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(gt6_sa(bar)),
                     "r"(TX)
                     : "memory");
        T* Wb = reinterpret_cast<T*>(stage);
        T* Kb = Wb + GC_C * LDK;
        float* Ub = reinterpret_cast<float*>(Kb + GC_C * LDK);
        T* Qb = reinterpret_cast<T*>(stage + 2 * L::KB + L::UB);
        T* Pb = Qb + GC_C * LDK;
        const u32 r0 = R * rank;
        const u64 row = ch * GC_C + r0, rowk = (LEAN ? chk : ch) * GC_C + r0;
        gt6_copy_mc(Wb + r0 * LDK, a.wn + row * LDK, R * LDK * sizeof(T), bar, MASK);
        gt6_copy_mc(Kb + r0 * LDK, a.kb + rowk * LDK, R * LDK * sizeof(T), bar, MASK);
        gt6_copy_mc(Qb + r0 * LDK, a.qg + rowk * LDK, R * LDK * sizeof(T), bar, MASK);
        gt6_copy_mc(Pb + r0 * GT2_LDP, a.pb + row * GT2_LDP, R * GT2_LDP * sizeof(T), bar, MASK);
        if constexpr (LEAN) {
            // uf per (chunk, value head): the decays, then dv / 32 U blocks (GT7_UFB).
            const unsigned char* src = reinterpret_cast<const unsigned char*>(a.uf) + ch * GT7_UFB(a.dv);
            unsigned char* dst = reinterpret_cast<unsigned char*>(Ub);
            gt6_copy(dst, src + 8 * GC_C + (a.col0 / 32) * L::UT, L::UT, bar);
            gt6_copy(dst + L::UT, src, 8 * GC_C, bar);
        } else {
            gt6_copy(Ub, a.uf + (ch * (a.dv / 32) + a.col0 / 32) * GC_C * LDU, GC_C * LDU * 4, bar);
        }
    }

    // Barriers set up and visible to the cluster, then chunks 0..2 in flight (every thread).
    __device__ __forceinline__ void start(unsigned char* smem, u64 ch0) {
        if (a.tid == 0) {
            for (u32 s = 0; s < 3; ++s) {
                asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(gt6_sa(full + s)) : "memory");
                asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(gt6_sa(empty + s)), "r"(4 * CL)
                             : "memory");
            }
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        gt6_cluster_sync();
        if (a.tid == 0) {
            for (u32 c = 0; c < 3 && c < a.nch; ++c) {
                issue(smem + c * L::BYTES, ch0 + (u64)c * a.hv, a.chk0 + (u64)c * a.hk, full + c);
            }
        }
    }

    // Warp 4 (its first lane): chunk c goes out once every block has finished chunk c − 3.
    __device__ __forceinline__ void produce(unsigned char* smem, u64 ch0) {
        if ((a.tid & 31u) != 0) return;
        for (u32 c = 3; c < a.nch; ++c) {
            gt6_wait(empty + c % 3, ((c - 3) / 3) & 1u);
            issue(smem + (c % 3) * L::BYTES, ch0 + (u64)c * a.hv, a.chk0 + (u64)c * a.hk, full + c % 3);
        }
    }

    __device__ __forceinline__ const unsigned char* acquire(unsigned char* smem, u32 c, u64) {
        gt6_wait(full + c % 3, (c / 3) & 1u);
        return smem + (c % 3) * L::BYTES;
    }

    // This warp is done with chunk c's stage: one arrival in each block of the cluster (none
    // past the last refill, which nobody waits for).
    __device__ __forceinline__ void release(unsigned char*, u32 c, u64) {
        if (c + 3 >= a.nch) return;
        __syncwarp();
        const u32 lane = a.tid & 31u;
        if (lane < CL) gt6_arrive_at(empty + c % 3, lane);
    }

    // No block leaves while a peer may still signal its barriers or copy into it.
    __device__ __forceinline__ void finish() { gt6_cluster_sync(); }
};
#endif

#define GDN_CHUNK_TC6(T, NAME, DK, CL)                                                                         \
    extern "C" __global__ void __launch_bounds__(160, 1) GT6_CLUSTER(CL)                                       \
        gdn_chunk_tc6_state_d##DK##_##NAME##_c##CL(float* state, const u32* spans, const u32* off, const T* wn, \
                                                   const T* kb, const float* uf, const float* gl, const T* qg,  \
                                                   const T* pb, T* out, u32 t, u32 mc, u32 hv, u32 dv,          \
                                                   u32 nbuf, u32 /* hk: tc7's */) {                            \
        porter_pdl_enter();                                                                                   \
        GT6_BODY(T, DK, CL)                                                                                   \
    }
#if defined(PORTER_SM80) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GT6_BODY(T, DK, CL)                                                                                 \
    gdn_chunk_tc5_state_impl<T, DK, Gt6Pipe<T, DK, CL>>(state, spans, off, wn, kb, uf, gl, qg, pb, out, t, mc, hv, \
                                                        dv, nbuf, hv);
#define GT7_BODY(T, DK, CL)                                                                                  \
    gdn_chunk_tc5_state_impl<T, DK, Gt6Pipe<T, DK, CL, true>>(state, spans, off, wn, kb, uf, gl, qg, pb, out, t, mc, \
                                                              hv, dv, nbuf, hk);
#else
#define GT6_BODY(T, DK, CL) __trap();
#define GT7_BODY(T, DK, CL) __trap();
#endif
// Every cluster size per type and key head dim: 2 (the default), 4, and 1
// (PORTER_GDN_TC6_CLUSTER=1, an A/B: the bulk-copy pipe without sharing).
#define GDN_CHUNK_TC6_CLUSTERS(T, NAME, DK) \
    GDN_CHUNK_TC6(T, NAME, DK, 1)           \
    GDN_CHUNK_TC6(T, NAME, DK, 2)           \
    GDN_CHUNK_TC6(T, NAME, DK, 4)
GDN_CHUNK_TC6_CLUSTERS(bf16, bf16, 64)
GDN_CHUNK_TC6_CLUSTERS(bf16, bf16, 128)
GDN_CHUNK_TC6_CLUSTERS(f16, f16, 64)
GDN_CHUNK_TC6_CLUSTERS(f16, f16, 128)

// tc7: clusters of 2 only (tc6's default; where PORTER_GDN_TC6_CLUSTER asks for another size,
// tc7 runs as tc6). Dynamic shared memory GT7_SMEM(DK); `hk` last.
#define GDN_CHUNK_TC7(T, NAME, DK)                                                                             \
    extern "C" __global__ void __launch_bounds__(160, 1) GT6_CLUSTER(2)                                        \
        gdn_chunk_tc7_state_d##DK##_##NAME##_c2(float* state, const u32* spans, const u32* off, const T* wn,    \
                                                const T* kb, const float* uf, const float* gl, const T* qg,     \
                                                const T* pb, T* out, u32 t, u32 mc, u32 hv, u32 dv, u32 nbuf,   \
                                                u32 hk) {                                                      \
        porter_pdl_enter();                                                                                   \
        GT7_BODY(T, DK, 2)                                                                                    \
    }
GDN_CHUNK_TC7(bf16, bf16, 64)
GDN_CHUNK_TC7(bf16, bf16, 128)
GDN_CHUNK_TC7(f16, f16, 64)
GDN_CHUNK_TC7(f16, f16, 128)
