//! The quantized KV cache on the device (kv_quant.cu, attention.cu): the quantizing append
//! is bit-identical to `cpu::kv_quant::quantize_row` (bytes and scales), and attention over
//! the 1-byte pools matches the CPU attention over the same rows dequantized (and rounded to
//! `T`), decode (split-K) and prefill (CUDA cores and tensor cores), head_dim 256, 2 KV
//! heads, 16 query heads, contexts 1..4096. `#[ignore = "needs a CUDA GPU"]`.

mod common;

use common::*;
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use porter_kernels::cpu::kv_quant::{dequantize_row, quantize_row, KvQuant};
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{AttnMode, AttnTc, CudaFloat, CudaKernels, QuantPools, PAD_SLOT};

const KINDS: [KvQuant; 2] = [KvQuant::Fp8, KvQuant::Int8];

fn up_u8(k: &CudaKernels, v: &[u8]) -> CudaSlice<u8> {
    k.stream().clone_htod(v).expect("htod")
}

fn down_u8(k: &CudaKernels, d: &CudaSlice<u8>) -> Vec<u8> {
    k.stream().synchronize().expect("kernel failed (stream synchronize)");
    k.stream().clone_dtoh(d).expect("dtoh")
}

fn pools(k: &CudaKernels, kind: KvQuant, n_slots: usize, row: usize, kvh: usize) -> QuantPools {
    QuantPools {
        kind,
        k: up_u8(k, &vec![0xAB; n_slots * row]),
        v: up_u8(k, &vec![0xAB; n_slots * row]),
        k_scale: up::<f32>(k, &vec![f32::NAN; n_slots * kvh]),
        v_scale: up::<f32>(k, &vec![f32::NAN; n_slots * kvh]),
    }
}

fn append_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, kind: KvQuant) {
    let (kvh, hd, n_slots) = (2, 256, 24);
    let row = kvh * hd;
    let slots: Vec<u32> = vec![20, PAD_SLOT, 0, 5, 23, 7, n_slots as u32 + 3];
    let t = slots.len();
    let mut kx = rnd_vec::<T>(&rng.vec(t * row, 2.0));
    let vx = rnd_vec::<T>(&rng.vec(t * row, 0.5));
    // An all-zero head (scale 1).
    kx[row..row + hd].iter_mut().for_each(|x| *x = 0.0);
    kx[3 * row + 7] = rnd::<T>(40.0); // an outlier
    let mut p = pools(k, kind, n_slots, row, kvh);
    k.kv_append_quant::<T>(&up::<T>(k, &kx), &up::<T>(k, &vx), &up_u32(k, &slots), &mut p, t, kvh, hd)
        .expect("kv_append_quant");
    let (gk, gv, gks, gvs) = (down_u8(k, &p.k), down_u8(k, &p.v), down(k, &p.k_scale), down(k, &p.v_scale));
    for (r, &sl) in slots.iter().enumerate() {
        let sl = sl as usize;
        if sl >= n_slots {
            continue;
        }
        for (x, g, gs, what) in [(&kx, &gk, &gks, "K"), (&vx, &gv, &gvs, "V")] {
            let (mut q, mut s) = (vec![0u8; row], vec![0f32; kvh]);
            quantize_row(kind, &x[r * row..(r + 1) * row], hd, &mut q, &mut s);
            assert_eq!(&g[sl * row..(sl + 1) * row], &q[..], "{kind:?} {} {what} bytes of row {r}", T::NAME);
            let gsl = &gs[sl * kvh..(sl + 1) * kvh];
            assert!(
                gsl.iter().zip(&s).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kind:?} {what} scales {gsl:?} vs {s:?}"
            );
        }
    }
    println!("  kv_append_quant {} {kind:?}: bit-identical to the CPU", T::NAME);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kv_append_quant_matches_the_cpu_bit_for_bit() {
    let k = gpu("kv_append_quant_matches_the_cpu_bit_for_bit");
    let mut rng = Rng::new(21);
    for kind in KINDS {
        append_case::<f32>(&k, &mut rng, kind);
        append_case::<bf16>(&k, &mut rng, kind);
        append_case::<f16>(&k, &mut rng, kind);
    }
}

/// One sequence of `ctx` keys (quantized on the host into shuffled 16-row blocks), the last
/// `q_len` positions queried; the device result vs `ops::causal_attention` on the dequantized
/// rows rounded to `T`.
#[allow(clippy::too_many_arguments)]
fn attention_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    kind: KvQuant,
    ctx: usize,
    q_len: usize,
    window: Option<usize>,
    mode: AttnMode,
) -> f32 {
    let (heads, kvh, hd, bs) = (16, 2, 256, 16);
    let row = kvh * hd;
    let kx = rnd_vec::<T>(&rng.vec(ctx * row, 1.0));
    let vx = rnd_vec::<T>(&rng.vec(ctx * row, 1.0));
    let (mut kq, mut vq) = (vec![0u8; ctx * row], vec![0u8; ctx * row]);
    let (mut ks, mut vs) = (vec![0f32; ctx * kvh], vec![0f32; ctx * kvh]);
    for j in 0..ctx {
        let (r, s) = (j * row..(j + 1) * row, j * kvh..(j + 1) * kvh);
        quantize_row(kind, &kx[r.clone()], hd, &mut kq[r.clone()], &mut ks[s.clone()]);
        quantize_row(kind, &vx[r.clone()], hd, &mut vq[r], &mut vs[s]);
    }
    let (mut kd, mut vd) = (vec![0f32; ctx * row], vec![0f32; ctx * row]);
    for j in 0..ctx {
        let (r, s) = (j * row..(j + 1) * row, j * kvh..(j + 1) * kvh);
        dequantize_row(kind, &kq[r.clone()], &ks[s.clone()], hd, &mut kd[r.clone()], &rnd::<T>);
        dequantize_row(kind, &vq[r.clone()], &vs[s], hd, &mut vd[r], &rnd::<T>);
    }
    // Paged pools: blocks in a random order, two spare blocks.
    let nb = ctx.div_ceil(bs);
    let total = nb + 2;
    let mut perm: Vec<u32> = (0..total as u32).collect();
    for i in (1..total).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let n_slots = total * bs;
    let (mut pk, mut pv) = (vec![0u8; n_slots * row], vec![0u8; n_slots * row]);
    let (mut pks, mut pvs) = (vec![f32::NAN; n_slots * kvh], vec![f32::NAN; n_slots * kvh]);
    for j in 0..ctx {
        let slot = perm[j / bs] as usize * bs + j % bs;
        pk[slot * row..(slot + 1) * row].copy_from_slice(&kq[j * row..(j + 1) * row]);
        pv[slot * row..(slot + 1) * row].copy_from_slice(&vq[j * row..(j + 1) * row]);
        pks[slot * kvh..(slot + 1) * kvh].copy_from_slice(&ks[j * kvh..(j + 1) * kvh]);
        pvs[slot * kvh..(slot + 1) * kvh].copy_from_slice(&vs[j * kvh..(j + 1) * kvh]);
    }
    let p = QuantPools {
        kind,
        k: up_u8(k, &pk),
        v: up_u8(k, &pv),
        k_scale: up::<f32>(k, &pks),
        v_scale: up::<f32>(k, &pvs),
    };
    let pos0 = ctx - q_len;
    let q = rnd_vec::<T>(&rng.vec(q_len * heads * hd, 1.0));
    let scale = 1.0 / (hd as f32).sqrt();
    let mut want = vec![0f32; q_len * heads * hd];
    ops::causal_attention(&q, &kd, &vd, &mut want, q_len, pos0, heads, kvh, hd, scale, window);
    let want = rnd_vec::<T>(&want);
    let tables = up_u32(k, &perm[..nb]);
    let spans = up_u32(k, &[0, q_len as u32, pos0 as u32]);
    let mut out = poisoned::<T>(k, q_len * heads * hd);
    k.attention_quant::<T>(
        &up::<T>(k, &q),
        &p,
        &tables,
        nb,
        bs,
        &spans,
        &mut out,
        q_len,
        1,
        q_len,
        heads,
        kvh,
        hd,
        scale,
        window,
        mode,
    )
    .expect("attention_quant");
    let what = format!("attention_quant {} {kind:?} ctx {ctx} q_len {q_len} window {window:?} {mode:?}", T::NAME);
    check(&what, &down(k, &out), &want, tol::<T>())
}

fn attention_all<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng) {
    for kind in KINDS {
        // Decode (split-K over 128-key splits) and verify-sized spans.
        for ctx in [1, 17, 128, 129, 1000, 4096] {
            attention_case::<T>(k, rng, kind, ctx, 1, None, AttnMode::Fast);
        }
        attention_case::<T>(k, rng, kind, 700, 4, Some(256), AttnMode::Fast);
        // Prefill: tensor cores for 16-bit T in Fast mode (and each tensor-core kernel
        // forced), CUDA cores in Invariant.
        let modes = [
            AttnMode::Fast,
            AttnMode::Invariant,
            AttnMode::Tc(AttnTc::Wmma),
            AttnMode::Tc(AttnTc::MmaW8),
            AttnMode::Tc(AttnTc::MmaW4),
        ];
        let modes = if T::NAME == "f32" { &modes[..2] } else { &modes[..] };
        for (ctx, q_len) in [(64, 64), (300, 300), (1500, 200)] {
            for &mode in modes {
                attention_case::<T>(k, rng, kind, ctx, q_len, None, mode);
            }
        }
        for &mode in modes {
            attention_case::<T>(k, rng, kind, 400, 400, Some(100), mode);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_quant_matches_the_cpu_on_dequantized_rows() {
    let k = gpu("attention_quant_matches_the_cpu_on_dequantized_rows");
    let mut rng = Rng::new(22);
    attention_all::<f32>(&k, &mut rng);
    attention_all::<bf16>(&k, &mut rng);
    attention_all::<f16>(&k, &mut rng);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quant_pools_are_checked() {
    let k = gpu("quant_pools_are_checked");
    let mut p = pools(&k, KvQuant::Int8, 8, 2 * 64, 2);
    p.k_scale = up::<f32>(&k, &[0.0; 3]);
    assert!(p.slots(2, 64).is_err());
    let x = up::<f32>(&k, &[0.0; 2 * 64]);
    assert!(k.kv_append_quant::<f32>(&x, &x, &up_u32(&k, &[0]), &mut p, 1, 2, 64).is_err());
}
