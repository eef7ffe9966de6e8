//! GPU tests of the raw mma.sync prefill attention (kernels/cuda/attention_mma.cu) and the
//! Hopper wgmma one (kernels/cuda/attention_wgmma.cu) against the CPU reference: every
//! tensor-core shape of `tc_prefill_cases` on each form (8 warps × 64 keys; 4 warps × 32 keys
//! and the warp pairs splitting head_dim, at head_dim 256; wgmma at padded head_dim 128 /
//! 256), the 80B layout (16 query heads, 2 KV heads, head_dim 256, causal) timed side by side
//! with the wmma kernel (attention_tc.cu) at 4k and 16k tokens, and the error the P_hi + P_lo
//! split saves. `#[ignore = "needs a CUDA GPU"]`; `PORTER_CUDA_SEED` replays a seed. The
//! `nvrtc_*` test needs NVRTC only.

mod common;

use common::attn::*;
use common::*;
use half::bf16;
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{AttnMode, AttnTc, CudaFloat, CudaKernels};
use std::time::Instant;

/// Parity of the mma kernels on every tensor-core shape: the 8-warp tiles at every head dim,
/// the 4-warp tiles and the warp-pair form at the head dims they exist for (padded 256).
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_mma_prefill() {
    let k = gpu("attention_mma_prefill");
    let mut rng = Rng::new(31);
    let all = |_| true;
    let d256 = |hd| hd > 128;
    let kernels: [(AttnTc, &dyn Fn(usize) -> bool); 3] =
        [(AttnTc::MmaW8, &all), (AttnTc::MmaW4, &d256), (AttnTc::MmaX2, &d256)];
    for (tc, keep) in kernels {
        let mode = AttnMode::Tc(tc);
        for hd in [64, 128, 256] {
            println!("{tc:?} head_dim {hd}: {:?}", k.attention_tc_kernel::<bf16>(hd, 100, mode));
        }
        tc_prefill_cases(&k, &mut rng, mode, keep);
    }
}

/// Parity of the wgmma kernel (sm_90; elsewhere the plan falls back to the mma kernel, which
/// this then tests again) on every tensor-core shape at padded head_dim 128 and 256: block
/// sizes 1..128, GQA, windows, prefixes, unaligned buffers, bf16 and f16, the tolerance of the
/// other tensor-core kernels.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_wgmma_prefill() {
    let k = gpu("attention_wgmma_prefill");
    let mut rng = Rng::new(34);
    let mode = AttnMode::Tc(AttnTc::Wgmma);
    for hd in [64, 128, 256] {
        println!("Wgmma head_dim {hd}: {:?}", k.attention_tc_kernel::<bf16>(hd, 100, mode));
    }
    tc_prefill_cases(&k, &mut rng, mode, &|hd| hd > 64);
}

/// `ptxas -v` of the wgmma module for sm_90a (NVRTC only): every entry point compiled to
/// wgmma instructions (not the trap of the non-sm_90a build), no spills, and no wgmma
/// serialization (ptxas warns when it has to wait for each wgmma, e.g. when the accumulator
/// registers are touched while one is in flight).
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_attention_wgmma_ptxas_info() {
    let (log, ptx) = ptxas_log_arch("nvrtc_attention_wgmma_ptxas_info", "attention_wgmma.cu", "sm_90a");
    for line in log.lines().filter(|l| l.contains("entry function") || l.contains("registers") || l.contains("spill")) {
        println!("{}", line.trim());
    }
    let entries = ptx.matches(".entry attention_wgmma_").count();
    assert_eq!(entries, 4, "entry points");
    // Per kernel: DP / 16 S steps and 4 P·V steps (64 keys), at DP = 256 and 128, bf16 and f16.
    assert_eq!(ptx.matches("wgmma.mma_async").count(), 2 * (20 + 12), "wgmma instructions in the PTX");
    assert!(!ptx.contains("trap;"), "the sm_90a build must not trap");
    for line in log.lines() {
        assert!(!line.contains("spill") || line.contains(" 0 bytes spill stores, 0 bytes spill loads"), "{line}");
        assert!(!line.to_ascii_lowercase().contains("serializ"), "{line}");
    }
}

/// One prefill span of the 80B layout: `q_len` rows at positions `pos0..` (a prefix of
/// `pos0` keys already cached), bf16, block size 16 on a shuffled pool; each kernel's output
/// checked against the CPU reference on three 64-row chunks (first, middle and last rows)
/// and against the wmma kernel's on every element, then timed over `iters` calls.
fn prefill_side_by_side(k: &CudaKernels, rng: &mut Rng, q_len: usize, pos0: usize, iters: usize) {
    let (h, kvh, hd, bs) = (ATT_HEADS, ATT_KV_HEADS, ATT_HEAD_DIM, 16);
    let (kv_row, ctx, row) = (kvh * hd, pos0 + q_len, h * hd);
    let scale = 1.0 / (hd as f32).sqrt();
    let q = rnd_vec::<bf16>(&rng.vec(q_len * row, 2.0));
    let kh = rnd_vec::<bf16>(&rng.vec(ctx * kv_row, 2.0));
    let vh = rnd_vec::<bf16>(&rng.vec(ctx * kv_row, 1.0));
    let pool = Pool::<bf16>::new(k, rng, &[(kh.clone(), vh.clone())], kv_row, bs, 0);
    let tables = pool.tables(k, &[0], pool.width);
    let spans = up_u32(k, &[0, q_len as u32, pos0 as u32]);
    let qd = up::<bf16>(k, &q);
    let n = 64.min(q_len);
    let chunks = [0, (q_len - n) / 2, q_len - n];
    let refs: Vec<Vec<f32>> = chunks
        .iter()
        .map(|&r0| {
            let mut o = vec![0.0f32; n * row];
            let qc = &q[r0 * row..(r0 + n) * row];
            ops::causal_attention(qc, &kh, &vh, &mut o, n, pos0 + r0, h, kvh, hd, scale, None);
            rnd_vec::<bf16>(&o)
        })
        .collect();
    let keys: f64 = (0..q_len).map(|i| (pos0 + i + 1) as f64).sum();
    let flops = 4.0 * keys * (h * hd) as f64;
    let mut base: Option<(Vec<f32>, f64)> = None;
    for tc in [AttnTc::Wmma, AttnTc::MmaW8, AttnTc::MmaW4, AttnTc::MmaP1, AttnTc::MmaX2, AttnTc::Wgmma] {
        let mode = AttnMode::Tc(tc);
        let name = k.attention_tc_kernel::<bf16>(hd, q_len, mode).unwrap_or_else(|| "CUDA cores".into());
        let mut out = poisoned::<bf16>(k, q_len * row);
        let mut run = || {
            k.attention::<bf16>(
                &qd, &pool.k, &pool.v, &tables, pool.width, bs, &spans, &mut out, q_len, 1, q_len, h, kvh, hd, scale,
                None, mode,
            )
        };
        run().expect("attention");
        k.stream().synchronize().expect("attention");
        let t0 = Instant::now();
        for _ in 0..iters {
            run().expect("attention");
        }
        k.stream().synchronize().expect("attention");
        let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let got = down(k, &out);
        let what = format!("prefill {q_len} at {pos0} {tc:?} ({name})");
        for (&r0, want) in chunks.iter().zip(&refs) {
            check(&format!("{what} rows {r0}..{}", r0 + n), &got[r0 * row..(r0 + n) * row], want, tol::<bf16>());
        }
        let speedup = base.as_ref().map_or(String::new(), |(_, b)| format!(", {:.2}x the wmma kernel", b / us));
        println!("  TIME {what}: {us:.1} us per call, {:.1} TFLOP/s{speedup}", flops / us / 1e6);
        match &base {
            None => base = Some((got, us)),
            Some((w, _)) => {
                check(&format!("{what} vs the wmma kernel, every element"), &got, w, tol::<bf16>());
            }
        }
    }
}

/// The 80B layout at 4k and 16k tokens from position 0 and a 2k chunk after a 2k prefix:
/// µs and TFLOP/s of the wmma kernel, both mma tile shapes, the single-MMA P form (`MmaP1`),
/// the warp-pair form (`MmaX2`) and the wgmma kernel (`Wgmma`, sm_90), side by side.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_mma_vs_wmma_timing() {
    let k = gpu("attention_mma_vs_wmma_timing");
    let mut rng = Rng::new(32);
    prefill_side_by_side(&k, &mut rng, 4096, 0, 10);
    prefill_side_by_side(&k, &mut rng, 2048, 2048, 10);
    prefill_side_by_side(&k, &mut rng, 16384, 0, 4);
}

/// What the P_hi + P_lo split buys: the 8-warp mma kernel with and without it
/// (`AttnTc::MmaP1`) and the wgmma kernel (P rounded once, `AttnTc::Wgmma`) on the same inputs, errors against the unrounded f32 reference (max,
/// RMS and mean signed error, relative to max |ref|, and the fraction of elements that are
/// not the correctly rounded bf16 / f16 value). Both must be within the 16-bit tolerance; the
/// printed numbers (and the model parity tests with `PORTER_ATTN_TC=mma1`) decide whether
/// the split can go.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_mma_p_split_error() {
    let k = gpu("attention_mma_p_split_error");
    let mut rng = Rng::new(33);
    for (q_len, pos0, h, kvh, hd) in [(1024, 0, 16, 2, 256), (512, 1536, 16, 2, 256), (600, 100, 8, 2, 128)] {
        p_split_case::<bf16>(&k, &mut rng, q_len, pos0, h, kvh, hd);
        p_split_case::<half::f16>(&k, &mut rng, q_len, pos0, h, kvh, hd);
    }
}

fn p_split_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    q_len: usize,
    pos0: usize,
    h: usize,
    kvh: usize,
    hd: usize,
) {
    let (kv_row, ctx, bs) = (kvh * hd, pos0 + q_len, 16);
    let scale = 1.0 / (hd as f32).sqrt();
    let q = rnd_vec::<T>(&rng.vec(q_len * h * hd, 2.0));
    let kh = rnd_vec::<T>(&rng.vec(ctx * kv_row, 2.0));
    let vh = rnd_vec::<T>(&rng.vec(ctx * kv_row, 1.0));
    let mut want = vec![0.0f32; q_len * h * hd];
    ops::causal_attention(&q, &kh, &vh, &mut want, q_len, pos0, h, kvh, hd, scale, None);
    let pool = Pool::<T>::new(k, rng, &[(kh, vh)], kv_row, bs, 0);
    let tables = pool.tables(k, &[0], pool.width);
    let spans = up_u32(k, &[0, q_len as u32, pos0 as u32]);
    let qd = up::<T>(k, &q);
    let amax = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    for tc in [AttnTc::MmaW8, AttnTc::MmaP1, AttnTc::Wgmma] {
        let mode = AttnMode::Tc(tc);
        let mut out = poisoned::<T>(k, q_len * h * hd);
        k.attention::<T>(
            &qd, &pool.k, &pool.v, &tables, pool.width, bs, &spans, &mut out, q_len, 1, q_len, h, kvh, hd, scale, None,
            mode,
        )
        .expect("attention");
        let got = down(k, &out);
        let what = format!("p split {tc:?} {} {q_len} at {pos0} heads {h}/{kvh} d {hd}", T::NAME);
        check(&what, &got, &rnd_vec::<T>(&want), tol::<T>());
        let n = got.len() as f64;
        let (mut sq, mut signed, mut off) = (0.0f64, 0.0f64, 0usize);
        for (g, w) in got.iter().zip(&want) {
            let d = (g - w) as f64;
            sq += d * d;
            signed += d;
            off += usize::from(*g != rnd::<T>(*w));
        }
        println!(
            "  {what}: RMS err {:.3e}, mean signed err {:.3e} (rel to max|ref|), {:.2}% not the rounded reference",
            (sq / n).sqrt() / amax as f64,
            signed / n / amax as f64,
            100.0 * off as f64 / n
        );
    }
}
