//! GPU tests of the attention kernels (kernels/cuda/attention.cu): KV append into
//! a paged pool (padding rows skipped), batched causal GQA attention over shuffled
//! block tables (decode, chunked prefill, sliding window, head dims, GQA ratios,
//! block sizes 1 / 16 / 32, padded spans, the Qwen3-Next sizes), batch invariance
//! (bit-identical rows alone and among 31 other sequences) and on-device
//! sampling, each against the CPU reference. The GPU tests are
//! `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`; without a GPU they
//! then fail, saying so); the ptxas check needs only NVRTC. `PORTER_CUDA_SEED` replays a seed.

mod common;

use common::attn::*;
use common::timing::Hold;
use common::*;
use half::{bf16, f16};
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{force_attn_decode, AttnDecode, AttnMode, CudaFloat, CudaKernels, PAD_SLOT};
use std::time::Instant;

// ---------------------------------------------------------------------------
// KV append
// ---------------------------------------------------------------------------

fn kv_append_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng) {
    let (kvh, hd, n_slots) = (2, 96, 40);
    let row = kvh * hd;
    // Shuffled slots, padding rows and one slot beyond the pool (both skipped).
    let slots: Vec<u32> = vec![30, PAD_SLOT, 0, 16, 31, PAD_SLOT, 4, 7, 3, 39, n_slots as u32 + 5];
    let t = slots.len();
    let kx = rnd_vec::<T>(&rng.vec(t * row, 1.0));
    let vx = rnd_vec::<T>(&rng.vec(t * row, 1.0));
    let (mut kp, mut vp) = (poisoned::<T>(k, n_slots * row), poisoned::<T>(k, n_slots * row));
    k.kv_append::<T>(&up::<T>(k, &kx), &up::<T>(k, &vx), &up_u32(k, &slots), &mut kp, &mut vp, t, kvh, hd)
        .expect("kv_append");
    let mut wk = vec![f32::NAN; n_slots * row];
    let mut wv = wk.clone();
    for (r, &sl) in slots.iter().enumerate() {
        if (sl as usize) < n_slots {
            let at = sl as usize * row;
            wk[at..at + row].copy_from_slice(&kx[r * row..(r + 1) * row]);
            wv[at..at + row].copy_from_slice(&vx[r * row..(r + 1) * row]);
        }
    }
    let (gk, gv) = (down(k, &kp), down(k, &vp));
    for (i, (g, w)) in gk.iter().zip(&wk).chain(gv.iter().zip(&wv)).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "kv_append {}: element {i}", T::NAME);
    }
    println!("  kv_append {}: exact", T::NAME);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kv_append_paged() {
    let k = gpu("kv_append_paged");
    let mut rng = Rng::new(1);
    kv_append_case::<f32>(&k, &mut rng);
    kv_append_case::<bf16>(&k, &mut rng);
    kv_append_case::<f16>(&k, &mut rng);
}

// ---------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_decode_batch() {
    let k = gpu("attention_decode_batch");
    let mut rng = Rng::new(2);
    let seqs = [(1, 0), (1, 1), (1, 64), (1, 299), (1, 2100), (1, 3000), (1, 63), (3, 510), (8, 1020)];
    for (h, kvh) in [(16, 2), (8, 8), (16, 4)] {
        for bs in [1, 16, 32] {
            println!("heads {h} kv_heads {kvh} block size {bs}");
            let c = AttnCase { bs, ..AttnCase::new("decode", &seqs, h, kvh, 128) };
            attn_case::<f32>(&k, &mut rng, &c);
            attn_case::<bf16>(&k, &mut rng, &c);
            attn_case::<f16>(&k, &mut rng, &c);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_chunked_prefill() {
    let k = gpu("attention_chunked_prefill");
    let mut rng = Rng::new(3);
    let seqs = [(37, 0), (100, 250), (1, 70), (200, 1000), (5, 3)];
    for (i, hd) in [64, 128, 256, 80].into_iter().enumerate() {
        for (j, (h, kvh)) in [(4, 4), (8, 2), (16, 2)].into_iter().enumerate() {
            let bs = [1, 16, 32][(i + j) % 3];
            println!("head_dim {hd} heads {h} kv_heads {kvh} block size {bs}");
            let c = AttnCase { bs, ..AttnCase::new("prefill", &seqs, h, kvh, hd) };
            attn_case::<f32>(&k, &mut rng, &c);
            attn_case::<bf16>(&k, &mut rng, &c);
            attn_case::<bf16>(&k, &mut rng, &AttnCase { mode: AttnMode::Invariant, ..c });
        }
    }
    attn_case::<f16>(&k, &mut rng, &AttnCase::new("prefill", &seqs, 8, 1, 128));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_sliding_window() {
    let k = gpu("attention_sliding_window");
    let mut rng = Rng::new(4);
    let prefill = [(150, 0), (90, 400), (1, 33), (64, 64)];
    let decode = [(1, 0), (1, 99), (1, 100), (1, 1500), (4, 600)];
    for (i, w) in [1, 100, 129, 300].into_iter().enumerate() {
        for seqs in [&prefill[..], &decode[..]] {
            println!("window {w}");
            let c = AttnCase { window: Some(w), bs: [1, 16, 32, 16][i], ..AttnCase::new("window", seqs, 8, 2, 128) };
            attn_case::<f32>(&k, &mut rng, &c);
            attn_case::<bf16>(&k, &mut rng, &c);
        }
    }
}

/// The tensor-core prefill path in [`AttnMode::Fast`] (the default kernel or
/// `PORTER_ATTN_TC`'s) on every shape of [`tc_prefill_cases`], then the CUDA-core path on
/// misaligned buffers (f32, and max_q_len < 16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_tensor_core_prefill() {
    let k = gpu("attention_tensor_core_prefill");
    let mut rng = Rng::new(8);
    println!("kernel at head_dim 256: {:?}", k.attention_tc_kernel::<bf16>(256, 100, AttnMode::Fast));
    tc_prefill_cases(&k, &mut rng, AttnMode::Fast, &|_| true);
    let chunked = [(17, 0), (100, 37), (1, 500), (64, 64), (3, 9), (130, 1000)];
    attn_case_at::<f32>(&k, &mut rng, &AttnCase::new("cc", &chunked, 8, 2, 128), true);
    attn_case_at::<bf16>(&k, &mut rng, &AttnCase::new("cc decode", &[(1, 100), (3, 40)], 8, 2, 128), true);
}

/// Batch invariance: each target sequence (decode over one and over many key
/// splits, a short multi-row span, prefill chunks with a cached prefix) alone in a
/// launch, then among 27 other sequences of mixed lengths and a padding span in
/// one launch of 32 sequences (other `t`, `n_seqs`, `max_q_len`, table width,
/// rows): its output rows must be bit-identical (and match the CPU reference).
fn invariance_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, mode: AttnMode, window: Option<usize>) {
    let targets = [(1usize, 3000usize), (1, 100), (5, 777), (40, 700), (130, 250)];
    let lens = [1, 1, 1, 2, 3, 8, 9, 17, 64, 130];
    invariance_case_with::<T>(k, rng, mode, window, &targets, &lens, (8, 2, 128));
}

/// [`invariance_case`] with other targets (at most 5), other q_lens for the 27 others and
/// other (heads, kv_heads, head_dim).
#[allow(clippy::too_many_arguments)]
fn invariance_case_with<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    mode: AttnMode,
    window: Option<usize>,
    targets: &[(usize, usize)],
    lens: &[usize],
    (h, kvh, hd): (usize, usize, usize),
) {
    let bs = 16;
    let kv_row = kvh * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let nt = targets.len();
    let mut seqs: Vec<(usize, usize)> = targets.to_vec();
    while seqs.len() < 32 {
        seqs.push((lens[rng.below(lens.len())], rng.below(6000)));
    }
    let kv: Vec<(Vec<f32>, Vec<f32>)> = seqs
        .iter()
        .map(|&(ql, p0)| {
            let n = (ql + p0) * kv_row;
            (rnd_vec::<T>(&rng.vec(n, 2.0)), rnd_vec::<T>(&rng.vec(n, 1.0)))
        })
        .collect();
    let pool = Pool::<T>::new(k, rng, &kv, kv_row, bs, 0);
    let qs: Vec<Vec<f32>> = seqs.iter().map(|s| rnd_vec::<T>(&rng.vec(s.0 * h * hd, 2.0))).collect();
    let launch = |which: &[usize], width: usize| -> (Vec<f32>, Vec<usize>) {
        let (mut q, mut spans, mut starts, mut max_q) = (Vec::new(), Vec::new(), Vec::new(), 0);
        for (i, &s) in which.iter().enumerate() {
            if i == which.len() / 2 && which.len() > 1 {
                spans.extend([0, 0, 0]); // padding
            }
            starts.push(q.len() / (h * hd));
            spans.extend([starts[i] as u32, seqs[s].0 as u32, seqs[s].1 as u32]);
            q.extend(&qs[s]);
            max_q = max_q.max(seqs[s].0);
        }
        let mut which_t: Vec<usize> = which.to_vec();
        if which.len() > 1 {
            which_t.insert(which.len() / 2, which[0]); // the padding span's table row
        }
        let t = q.len() / (h * hd);
        let tables = pool.tables(k, &which_t, width);
        let mut out = poisoned::<T>(k, t * h * hd);
        let n = which_t.len();
        let (kp, vp, sd) = (&pool.k, &pool.v, up_u32(k, &spans));
        k.attention::<T>(
            &up::<T>(k, &q),
            kp,
            vp,
            &tables,
            width,
            bs,
            &sd,
            &mut out,
            t,
            n,
            max_q,
            h,
            kvh,
            hd,
            scale,
            window,
            mode,
        )
        .expect("attention");
        (down(k, &out), starts)
    };
    // A different order, so that each target sits at other rows and sequence indices.
    let mut order: Vec<usize> = (nt..32).collect();
    for (i, tg) in (0..nt).enumerate() {
        order.insert(3 + 6 * i, tg);
    }
    let (mixed, starts) = launch(&order, pool.width + 2);
    for (ti, &(ql, p0)) in targets.iter().enumerate() {
        let (alone, _) = launch(&[ti], pool.rows[ti].iter().take_while(|&&b| b != u32::MAX - 7).count().max(1));
        let at = starts[order.iter().position(|&s| s == ti).unwrap_or(0)] * h * hd;
        let m = &mixed[at..at + ql * h * hd];
        let mut want = vec![0.0f32; ql * h * hd];
        ops::causal_attention(&qs[ti], &kv[ti].0, &kv[ti].1, &mut want, ql, p0, h, kvh, hd, scale, window);
        check(
            &format!("invariance target ({ql}, {p0}) {mode:?} {}", T::NAME),
            &alone,
            &rnd_vec::<T>(&want),
            tol::<T>(),
        );
        let diff = alone.iter().zip(m).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(diff, 0, "target ({ql}, {p0}) {mode:?} {}: {diff} elements differ alone vs mixed", T::NAME);
        println!("  target ({ql}, {p0}) {mode:?} {} window {window:?}: bit-identical", T::NAME);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_batch_invariant() {
    let k = gpu("attention_batch_invariant");
    let mut rng = Rng::new(10);
    for window in [None, Some(700)] {
        invariance_case::<f32>(&k, &mut rng, AttnMode::Fast, window);
        invariance_case::<f32>(&k, &mut rng, AttnMode::Invariant, window);
        invariance_case::<bf16>(&k, &mut rng, AttnMode::Invariant, window);
    }
}

// ---------------------------------------------------------------------------
// Tensor-core decode (attention_decode.cu, PORTER_ATTN_DECODE=mma)
// ---------------------------------------------------------------------------

/// The tensor-core decode forms the parity and invariance tests check: V1 (`Mma`), the V2
/// kernel with its combine (4 and 2 warps), and V2 with its 8-item form where a block has
/// at most 8 items (`Mma4N8`).
const MMA_FORMS: [AttnDecode; 4] = [AttnDecode::Mma, AttnDecode::Mma4, AttnDecode::Mma4W2, AttnDecode::Mma4N8];

/// Forces the mma decode kernel `form` on this thread and checks that the device takes it
/// for `T` at `hd` (sm_80+); the caller's launches then run it wherever it applies.
fn force_mma<T: CudaFloat>(k: &CudaKernels, hd: usize, form: AttnDecode) {
    force_attn_decode(Some(form));
    let name = k.attention_decode_kernel::<T>(hd, 1, AttnMode::Fast);
    assert!(name.is_some(), "the mma decode kernel does not apply ({} head_dim {hd}: sm_80+ needed)", T::NAME);
    println!("decode form {form:?}, kernel {} d{hd}: {name:?}", T::NAME);
}

/// The mma decode kernel against the CPU reference (the tolerances of the CUDA-core cases):
/// batch 1 / 8 / 64, contexts 1, 15, 16, 17, 1000, 4095, 32767 (one split, a split
/// boundary, up to 64 splits), q_len 1..4 (draft verification), block sizes 1 / 16 / 128,
/// GQA 8 / 4 / 16 / 1 at head dims 256 / 128 / 64, sliding windows, a padding span in every
/// launch and garbage table entries past each sequence's blocks (attn_case), bf16 and f16;
/// misaligned pools fall back to the CUDA-core kernels. Every form of [`MMA_FORMS`].
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_decode_mma_parity() {
    let k = gpu("attention_decode_mma_parity");
    for form in MMA_FORMS {
        let mut rng = Rng::new(11);
        force_mma::<bf16>(&k, 256, form);
        decode_parity_cases(&k, &mut rng);
    }
    force_attn_decode(None);
}

/// The cases of [`attention_decode_mma_parity`] with the decode form in force.
fn decode_parity_cases(k: &CudaKernels, rng: &mut Rng) {
    let (h, kvh, hd) = (ATT_HEADS, ATT_KV_HEADS, ATT_HEAD_DIM);
    let ctxs = [1usize, 15, 16, 17, 1000, 4095, 32767];
    for (i, &ctx) in ctxs.iter().enumerate() {
        let seqs = [(1usize, ctx - 1)];
        let c = AttnCase { bs: [1, 16, 128][i % 3], ..AttnCase::new("mma decode b1", &seqs, h, kvh, hd) };
        attn_case::<bf16>(k, rng, &c);
        attn_case::<f16>(k, rng, &c);
    }
    let b8 = [(1, 0), (2, 13), (1, 14), (3, 13), (4, 996), (1, 4094), (2, 32765), (1, 16)];
    for bs in [1, 16, 128] {
        for (hh, kk, dd) in [(16, 2, 256), (8, 2, 128), (16, 4, 64), (32, 2, 256), (8, 8, 128)] {
            println!("batch 8: heads {hh} kv_heads {kk} head_dim {dd} block size {bs}");
            let c = AttnCase { bs, ..AttnCase::new("mma decode b8", &b8, hh, kk, dd) };
            attn_case::<bf16>(k, rng, &c);
        }
        attn_case::<f16>(k, rng, &AttnCase { bs, ..AttnCase::new("mma decode b8", &b8, h, kvh, hd) });
    }
    let b64: Vec<(usize, usize)> = (0..64)
        .map(|i| {
            let ql = 1 + i % 4;
            let ctx = if i == 37 { 32767 } else { ctxs[i % 6].max(ql) };
            (ql, ctx - ql)
        })
        .collect();
    for bs in [16, 128] {
        let c = AttnCase { bs, ..AttnCase::new("mma decode b64", &b64, h, kvh, hd) };
        attn_case::<bf16>(k, rng, &c);
        attn_case::<f16>(k, rng, &c);
    }
    let wseqs = [(1, 0), (1, 99), (1, 100), (1, 1500), (4, 600), (2, 255), (3, 5000), (1, 32766)];
    for (i, w) in [1, 100, 256, 300, 1000, 4096].into_iter().enumerate() {
        println!("window {w}");
        let c = AttnCase {
            window: Some(w),
            bs: [16, 1, 128][i % 3],
            ..AttnCase::new("mma decode window", &wseqs, h, kvh, hd)
        };
        attn_case::<bf16>(k, rng, &c);
    }
    let c = AttnCase { window: Some(300), ..AttnCase::new("mma decode window", &wseqs, 8, 2, 128) };
    attn_case::<f16>(k, rng, &c);
    attn_case_at::<bf16>(k, rng, &AttnCase::new("mma decode", &b8, h, kvh, hd), true);
}

/// Batch invariance of the mma decode kernel: decode / verification targets (up to 32k
/// keys, 64 splits) alone, then among 27 other sequences of q_len <= 8 (another grid, table
/// width, partial layout): bit-identical rows, within tolerance of the CPU reference. Every
/// form of [`MMA_FORMS`].
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_decode_mma_batch_invariant() {
    let k = gpu("attention_decode_mma_batch_invariant");
    let targets = [(1usize, 3000usize), (1, 100), (4, 777), (1, 32767), (2, 5000)];
    let lens = [1, 1, 1, 2, 3, 4, 8];
    for form in MMA_FORMS {
        let mut rng = Rng::new(12);
        force_mma::<bf16>(&k, 256, form);
        for window in [None, Some(700)] {
            invariance_case_with::<bf16>(&k, &mut rng, AttnMode::Fast, window, &targets, &lens, (16, 2, 256));
            invariance_case_with::<f16>(&k, &mut rng, AttnMode::Fast, window, &targets, &lens, (8, 2, 128));
        }
    }
    force_attn_decode(None);
}

/// `append_attention_gated` against `append_attention` then `sigmoid_gate_mul` on the same
/// inputs, bit for bit: sequences `seqs` ((q_len, pos0), every row in a span), gate values in
/// [-4, 4), the gate `goff` elements past a 16-byte boundary (the split kernel's element-wise
/// gate loads). Both calls append the new rows to the pool that holds them already.
#[allow(clippy::too_many_arguments)]
fn gated_case<T: CudaFloat>(
    k: &CudaKernels,
    rng: &mut Rng,
    seqs: &[(usize, usize)],
    (h, kvh, hd): (usize, usize, usize),
    bs: usize,
    window: Option<usize>,
    goff: usize,
) {
    let (kv_row, n) = (kvh * hd, seqs.len());
    let t: usize = seqs.iter().map(|s| s.0).sum();
    let max_q = seqs.iter().map(|s| s.0).max().unwrap_or(0);
    let kv: Vec<(Vec<f32>, Vec<f32>)> = seqs
        .iter()
        .map(|&(ql, p0)| {
            let len = (ql + p0) * kv_row;
            (rnd_vec::<T>(&rng.vec(len, 2.0)), rnd_vec::<T>(&rng.vec(len, 1.0)))
        })
        .collect();
    let mut pool = Pool::<T>::new(k, rng, &kv, kv_row, bs, 0);
    let tables = pool.tables(k, &(0..n).collect::<Vec<_>>(), pool.width);
    let (mut spans, mut slots, mut knew, mut vnew, mut row0) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0);
    for (s, &(ql, p0)) in seqs.iter().enumerate() {
        spans.extend([row0 as u32, ql as u32, p0 as u32]);
        for p in p0..p0 + ql {
            slots.push(pool.rows[s][p / bs] * bs as u32 + (p % bs) as u32);
            knew.extend_from_slice(&kv[s].0[p * kv_row..(p + 1) * kv_row]);
            vnew.extend_from_slice(&kv[s].1[p * kv_row..(p + 1) * kv_row]);
        }
        row0 += ql;
    }
    let q = up::<T>(k, &rng.vec(t * h * hd, 2.0));
    let gfull = up::<T>(k, &rng.vec(goff + t * h * hd, 4.0));
    let gate = gfull.slice(goff..);
    let (kn, vn, sl, sd) = (up::<T>(k, &knew), up::<T>(k, &vnew), up_u32(k, &slots), up_u32(k, &spans));
    let scale = 1.0 / (hd as f32).sqrt();
    let mut outs = Vec::new();
    for gated in [false, true] {
        let mut out = poisoned::<T>(k, t * h * hd);
        let g = gated.then_some(&gate);
        let (p, r, d) = ((pool.width, bs), (t, n, max_q), (h, kvh, hd));
        k.append_attention_gated::<T>(
            &kn,
            &vn,
            &sl,
            &mut pool.k,
            &mut pool.v,
            &q,
            &tables,
            p,
            &sd,
            &mut out,
            r,
            d,
            scale,
            window,
            AttnMode::Fast,
            g,
        )
        .expect("append_attention_gated");
        if !gated {
            k.sigmoid_gate_mul::<T>(&mut out, &gate, t * h, hd, hd).expect("sigmoid_gate_mul");
        }
        outs.push(down(k, &out));
    }
    let kernel = k.attention_decode_kernel::<T>(hd, max_q, AttnMode::Fast).unwrap_or_else(|| "unfused".into());
    let what = format!("gated {} {seqs:?} h{h} kvh{kvh} d{hd} bs {bs} {window:?} gate +{goff}: {kernel}", T::NAME);
    assert!(outs[1].iter().all(|x| !x.is_nan()), "{what}: NaN (an unwritten row?)");
    check_bits(&what, &outs[1], &outs[0]);
    println!("  {what}: bit-identical");
}

/// The attention output gate of [`CudaKernels::append_attention_gated`], bit for bit
/// `append_attention` then `sigmoid_gate_mul`: fused in the tensor-core decode kernels (every
/// form, also the plain combine launch of `Mma4S`; batch 1 over one split and up to 64, batch 8
/// and 64 mixing split and unsplit rows, q_len up to 4, windows, head dims 256 / 128 / 64, bf16
/// and f16, an unaligned gate), then the unfused paths (`Legacy`, a prefill-sized call on the
/// tensor-core prefill kernel, f32).
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_decode_gated_bit_exact() {
    let k = gpu("attention_decode_gated_bit_exact");
    let mut rng = Rng::new(14);
    let qwen = (ATT_HEADS, ATT_KV_HEADS, ATT_HEAD_DIM);
    let b8 = [(1, 0), (2, 13), (1, 14), (3, 13), (4, 996), (1, 4094), (2, 32765), (1, 16)];
    let b64: Vec<(usize, usize)> =
        (0..64).map(|i| (1 + i % 4, if i == 37 { 32766 } else { [0, 14, 300, 999, 4094][i % 5] })).collect();
    let forms = [MMA_FORMS.as_slice(), &[AttnDecode::Mma4S, AttnDecode::Legacy]].concat();
    for form in forms {
        force_attn_decode(Some(form));
        println!("decode form {form:?}");
        for ctx in [1usize, 17, 1000, 4095, 32767] {
            gated_case::<bf16>(&k, &mut rng, &[(1, ctx - 1)], qwen, 16, None, 0);
            gated_case::<f16>(&k, &mut rng, &[(1, ctx - 1)], qwen, 128, None, 0);
        }
        gated_case::<bf16>(&k, &mut rng, &[(1, 32767)], qwen, 16, None, 1);
        gated_case::<bf16>(&k, &mut rng, &[(1, 40)], qwen, 16, None, 3);
        for (dims, bs) in [(qwen, 16), ((8, 2, 128), 1), ((16, 4, 64), 128), ((8, 8, 128), 16)] {
            gated_case::<bf16>(&k, &mut rng, &b8, dims, bs, None, 0);
        }
        gated_case::<f16>(&k, &mut rng, &b8, qwen, 16, Some(300), 0);
        gated_case::<bf16>(&k, &mut rng, &b64, qwen, 16, None, 0);
        gated_case::<f16>(&k, &mut rng, &b64, (8, 2, 128), 16, Some(1000), 0);
    }
    force_attn_decode(None);
    // Unfused: prefill-sized (max_q_len > 8: the tensor-core prefill kernel), f32 decode.
    gated_case::<bf16>(&k, &mut rng, &[(37, 0), (100, 250), (1, 70), (9, 4000)], qwen, 16, None, 0);
    gated_case::<f16>(&k, &mut rng, &[(64, 64), (3, 9)], (8, 2, 128), 16, Some(100), 1);
    gated_case::<f32>(&k, &mut rng, &b8, (8, 2, 128), 16, None, 0);
}

/// Legacy vs mma decode, side by side (CUDA-event timing, back-to-back calls): the
/// Qwen3-Next shape at batch 1 × 32k / 8k / 128k, batch 8 × 8k, batch 64 × 4k, and a
/// head_dim-128 shape; µs per call, GB/s of K/V and % of 4.19 TB/s. `PORTER_ATTN_DECODE_SPLITS`
/// / `PORTER_ATTN_DECODE_MIN_KEYS` change the mma kernel's split sizes for A/B.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_decode_mma_timing() {
    let k = gpu("attention_decode_mma_timing");
    let mut rng = Rng::new(13);
    let mut hold = Hold::new(&k);
    let qwen = (ATT_HEADS, ATT_KV_HEADS, ATT_HEAD_DIM);
    // 32k keys at batch 1, 2, 4, 8 (the 70 % bar is set at 32k context), then the
    // other shapes.
    for (b, ctx) in [
        (1, 32768),
        (2, 32768),
        (4, 32768),
        (8, 32768),
        (1, 8192),
        (8, 8192),
        (64, 4096),
        (1, 131_072),
        (8, 1024),
        (64, 1024),
    ] {
        decode_ab(&k, &mut rng, &mut hold, qwen, b, ctx, 50);
    }
    for (b, ctx) in [(1, 32768), (64, 4096)] {
        decode_ab(&k, &mut rng, &mut hold, (32, 8, 128), b, ctx, 50);
    }
}

/// Registers and spills of the attention kernels for sm_90 (NVRTC + ptxas, no
/// GPU); the tensor-core kernels (wmma and mma.sync) must not spill.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_attention_ptxas_info() {
    // The wmma kernels (attention.cu's module) and the mma.sync ones (their own module).
    let mut lines = ptxas_info("nvrtc_attention_ptxas_info", "attention.cu");
    lines.extend(
        ptxas_info("nvrtc_attention_ptxas_info", "attention_mma.cu")
            .into_iter()
            .filter(|(f, _)| f.starts_with("attention_mma_")),
    );
    let (mut tc_seen, mut mma_seen) = (0, 0);
    for (func, line) in lines {
        if func.starts_with("attention") {
            println!("{func}: {line}");
        }
        let tc = func.starts_with("attention_tc_");
        let mma = func.starts_with("attention_mma_");
        if (tc || mma) && line.contains("spill stores") {
            tc_seen += usize::from(tc);
            mma_seen += usize::from(mma);
            assert!(line.contains(" 0 bytes spill stores, 0 bytes spill loads"), "{func} spills: {line}");
        }
    }
    // bf16 / f16 × head dims 64, 128, 256 × pools of T, fp8 and int8 (kv_quant.cu).
    assert_eq!(tc_seen, 18, "ptxas reported {tc_seen} wmma attention kernels, expected 18");
    // The same with the 8-warp tiles, and with the 4-warp tiles at head dim 256; the
    // single-MMA P form (8 warps, pools of T): bf16 / f16 × 3 head dims; the warp-pair form
    // (head dim 256, pools of T): bf16 / f16.
    assert_eq!(mma_seen, 32, "ptxas reported {mma_seen} mma attention kernels, expected 32");
}

/// Registers and spills of the tensor-core decode kernels (attention_decode.cu) for sm_90
/// (NVRTC + ptxas, no GPU): none may spill.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_attention_decode_ptxas_info() {
    let mut seen = 0;
    for (func, line) in ptxas_info("nvrtc_attention_decode_ptxas_info", "attention_decode.cu") {
        if !func.starts_with("attention_decode_") {
            continue;
        }
        println!("{func}: {line}");
        if line.contains("spill stores") {
            seen += 1;
            assert!(line.contains(" 0 bytes spill stores, 0 bytes spill loads"), "{func} spills: {line}");
        }
    }
    // bf16 / f16 x head dims 64, 128, 256 x (2 and 3 stages, 2 warps, the V2 kernel with 4
    // and 2 warps, the combine and the V2 combine).
    assert_eq!(seen, 42, "ptxas reported {seen} decode kernels, expected 42");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_rejects_bad_args() {
    let k = gpu("attention_rejects_bad_args");
    let q = poisoned::<f32>(&k, 2 * 300);
    let mut o = poisoned::<f32>(&k, 2 * 300);
    let (kp, tb, s) = (poisoned::<f32>(&k, 16 * 300), up_u32(&k, &[0]), up_u32(&k, &[0, 1, 0]));
    let f = AttnMode::Fast;
    assert!(k.attention::<f32>(&q, &kp, &kp, &tb, 1, 16, &s, &mut o, 1, 1, 1, 2, 1, 300, 1.0, None, f).is_err());
    let q = poisoned::<f32>(&k, 3 * 64);
    let mut o = poisoned::<f32>(&k, 3 * 64);
    let kp = poisoned::<f32>(&k, 16 * 2 * 64);
    assert!(k.attention::<f32>(&q, &kp, &kp, &tb, 1, 16, &s, &mut o, 1, 1, 1, 3, 2, 64, 1.0, None, f).is_err());
    // Block size not a power of two; empty table; pool not whole rows.
    let q = poisoned::<f32>(&k, 2 * 64);
    let mut o = poisoned::<f32>(&k, 2 * 64);
    assert!(k.attention::<f32>(&q, &kp, &kp, &tb, 1, 12, &s, &mut o, 1, 1, 1, 2, 2, 64, 1.0, None, f).is_err());
    assert!(k.attention::<f32>(&q, &kp, &kp, &tb, 0, 16, &s, &mut o, 1, 1, 1, 2, 2, 64, 1.0, None, f).is_err());
    let odd = poisoned::<f32>(&k, 16 * 2 * 64 + 1);
    assert!(k.attention::<f32>(&q, &odd, &odd, &tb, 1, 16, &s, &mut o, 1, 1, 1, 2, 2, 64, 1.0, None, f).is_err());
    assert!(k.attention::<f32>(&q, &kp, &kp, &tb, 1, 16, &s, &mut o, 1, 1, 1, 2, 2, 64, 1.0, None, f).is_ok());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_qwen3_next_prefill_4k() {
    let k = gpu("attention_qwen3_next_prefill_4k");
    let mut rng = Rng::new(5);
    let c = AttnCase {
        time_iters: 10,
        ..AttnCase::new("qwen3-next prefill 4096", &[(4096, 0)], ATT_HEADS, ATT_KV_HEADS, ATT_HEAD_DIM)
    };
    attn_case::<bf16>(&k, &mut rng, &c);
    attn_case::<f16>(&k, &mut rng, &c);
    let c = AttnCase { name: "qwen3-next prefill 2048 at 2048", seqs: &[(2048, 2048)], ..c };
    attn_case::<bf16>(&k, &mut rng, &c);
    let c = AttnCase { name: "qwen3-next prefill 4 x 1024", seqs: &[(1024, 0); 4], ..c };
    attn_case::<bf16>(&k, &mut rng, &c);
    let c = AttnCase { name: "qwen3-next prefill 4 x 1024 (invariant)", mode: AttnMode::Invariant, ..c };
    attn_case::<bf16>(&k, &mut rng, &c);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_qwen3_next_decode() {
    let k = gpu("attention_qwen3_next_decode");
    let mut rng = Rng::new(6);
    let mk = |seqs| AttnCase {
        time_iters: 20,
        ..AttnCase::new("qwen3-next decode", seqs, ATT_HEADS, ATT_KV_HEADS, ATT_HEAD_DIM)
    };
    println!("batch 1, context 32768");
    attn_case::<bf16>(&k, &mut rng, &mk(&[(1, 32767)]));
    println!("batch 64, context 4096");
    attn_case::<bf16>(&k, &mut rng, &mk(&[(1, 4095); 64]));
    println!("batch 4 chunked prefill 512 at 8k");
    attn_case::<bf16>(&k, &mut rng, &mk(&[(512, 8192); 4]));
}

/// Decode timing grid: batch 1 / 8 / 64 x context 1k / 4k / 8k, bf16, block size
/// 16 on a shuffled pool (no reference; `attention_decode_batch` checks the numbers).
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_decode_timing() {
    let k = gpu("attention_decode_timing");
    let mut rng = Rng::new(9);
    for (h, kvh, hd) in [(16, 2, 256), (32, 8, 128)] {
        for ctx in [1024usize, 4096, 8192] {
            for b in [1usize, 8, 64] {
                let row = kvh * hd;
                let nb = ctx.div_ceil(16);
                let kp = up::<bf16>(&k, &rng.vec(b * nb * 16 * row, 1.0));
                let vp = up::<bf16>(&k, &rng.vec(b * nb * 16 * row, 1.0));
                let tables = up_u32(&k, &shuffled(&mut rng, b * nb));
                let spans: Vec<u32> = (0..b).flat_map(|i| [i as u32, 1, (ctx - 1) as u32]).collect();
                let sd = up_u32(&k, &spans);
                let q = up::<bf16>(&k, &rng.vec(b * h * hd, 1.0));
                let mut out = poisoned::<bf16>(&k, b * h * hd);
                let (sc, f) = (1.0 / (hd as f32).sqrt(), AttnMode::Invariant);
                let mut run = || {
                    k.attention::<bf16>(&q, &kp, &vp, &tables, nb, 16, &sd, &mut out, b, b, 1, h, kvh, hd, sc, None, f)
                        .unwrap()
                };
                run();
                k.stream().synchronize().unwrap();
                let iters = 50;
                let t0 = Instant::now();
                for _ in 0..iters {
                    run();
                }
                k.stream().synchronize().unwrap();
                let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
                println!("  DECODE h{h} kvh{kvh} d{hd} batch {b} ctx {ctx}: {us:.1} us");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Sampling
// ---------------------------------------------------------------------------

fn cpu_argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in xs.iter().enumerate() {
        if v > xs[best] {
            best = i;
        }
    }
    best
}

/// `porter_core::sampling::Sampler::{distribution, sample_from}` with a given `u`.
fn cpu_sample(logits: &[f32], temp: f32, top_k: usize, top_p: f32, u: f64) -> u32 {
    let n = logits.len();
    if temp == 0.0 {
        return cpu_argmax(logits) as u32;
    }
    let mut p = vec![0.0f32; n];
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let k = if top_k == 0 { n } else { top_k.min(n) };
    let kept = &idx[..k];
    let max = logits[kept[0]] / temp;
    let mut probs: Vec<f64> = kept.iter().map(|&i| ((logits[i] / temp - max) as f64).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|v| *v /= sum);
    let mut keep = k;
    if top_p < 1.0 {
        let mut acc = 0.0;
        for (i, v) in probs.iter().enumerate() {
            acc += v;
            if acc >= top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    let mass: f64 = probs[..keep].iter().sum();
    for (j, &i) in kept[..keep].iter().enumerate() {
        p[i] = (probs[j] / mass) as f32;
    }
    let nonzero = p.iter().filter(|&&v| v > 0.0).count();
    if nonzero <= 1 {
        return cpu_argmax(&p) as u32;
    }
    let mut acc = 0.0f64;
    let mut last = 0;
    for (i, &v) in p.iter().enumerate() {
        if v > 0.0 {
            acc += v as f64;
            last = i;
            if u < acc {
                return i as u32;
            }
        }
    }
    last as u32
}

fn sample_case(k: &CudaKernels, rng: &mut Rng, vocab: usize, params: &[[f32; 4]], logit_scale: f32) {
    let rows = params.len();
    let logits = rng.vec(rows * vocab, logit_scale);
    let flat: Vec<f32> = params.iter().flatten().copied().collect();
    let mut out = poisoned_u32(k, rows);
    let ld = up::<f32>(k, &logits);
    let pd = up::<f32>(k, &flat);
    k.sample_rows(&ld, &pd, &mut out, rows, vocab).expect("sample_rows");
    let got = down_u32(k, &out);
    for (r, p) in params.iter().enumerate() {
        let want = cpu_sample(&logits[r * vocab..(r + 1) * vocab], p[0], p[1] as usize, p[2], p[3] as f64);
        assert_eq!(got[r], want, "sample row {r} (vocab {vocab}, params {p:?})");
    }
    println!("  sample vocab {vocab}: {rows} rows match");
    let t0 = Instant::now();
    let iters = 10;
    for _ in 0..iters {
        k.sample_rows(&ld, &pd, &mut out, rows, vocab).unwrap();
    }
    k.stream().synchronize().unwrap();
    println!("  TIME sample_rows {rows} x {vocab}: {:.1} us", t0.elapsed().as_secs_f64() * 1e6 / iters as f64);
}

fn sample_params(rng: &mut Rng, rows: usize) -> Vec<[f32; 4]> {
    let temps = [0.0, 0.7, 1.0, 1.3];
    let ks = [0.0, 1.0, 20.0, 50.0, 1000.0];
    let ps = [1.0, 0.9, 0.5, 0.95, 0.05];
    (0..rows)
        .map(|_| {
            let u = (rng.next() >> 40) as f32 / (1u64 << 24) as f32;
            [temps[rng.below(temps.len())], ks[rng.below(ks.len())], ps[rng.below(ps.len())], u]
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sampling_matches_cpu() {
    let k = gpu("sampling_matches_cpu");
    let mut rng = Rng::new(7);
    // Fixed combinations: greedy, temperature only, top-k, top-p, both.
    let u = 0.37;
    let fixed = [
        [0.0, 0.0, 1.0, u],
        [1.0, 0.0, 1.0, u],
        [0.8, 40.0, 1.0, u],
        [0.8, 0.0, 0.9, u],
        [0.7, 50.0, 0.8, u],
        [1.0, 1.0, 1.0, 0.99],
        [1.0, 0.0, 1.0, 0.999],
    ];
    for vocab in [7, 1000, VOCAB, 262_144] {
        sample_case(&k, &mut rng, vocab, &fixed, 8.0);
        let rp = sample_params(&mut rng, 32);
        sample_case(&k, &mut rng, vocab, &rp, 4.0);
        sample_case(&k, &mut rng, vocab, &rp, 20.0);
    }
    // Exact ties: many equal logits (only 16 distinct values).
    let vocab = 5000;
    let rows = 16;
    let params = sample_params(&mut rng, rows);
    let logits: Vec<f32> = (0..rows * vocab).map(|_| (rng.below(16) as f32) * 0.25).collect();
    let flat: Vec<f32> = params.iter().flatten().copied().collect();
    let mut out = poisoned_u32(&k, rows);
    k.sample_rows(&up::<f32>(&k, &logits), &up::<f32>(&k, &flat), &mut out, rows, vocab).unwrap();
    let got = down_u32(&k, &out);
    for (r, p) in params.iter().enumerate() {
        let want = cpu_sample(&logits[r * vocab..(r + 1) * vocab], p[0], p[1] as usize, p[2], p[3] as f64);
        assert_eq!(got[r], want, "tied sample row {r} params {p:?}");
    }
    println!("  sample with ties: {rows} rows match");
}
