//! GPU tests of the attention kernels (kernels/cuda/attention.cu): KV append,
//! batched causal GQA attention over per-sequence caches (decode, chunked
//! prefill, sliding window, head dims, GQA ratios, the Qwen3-Next sizes) and
//! on-device sampling, each against the CPU reference. The GPU tests are
//! `#[ignore = "needs a CUDA GPU"]` (run them with `--include-ignored`; without a GPU they
//! then fail, saying so); the ptxas check needs only NVRTC. `PORTER_CUDA_SEED` replays a seed.

mod common;

use common::*;
use cudarc::driver::{CudaSlice, DevicePtr};
use half::{bf16, f16};
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{CudaFloat, CudaKernels};
use std::time::Instant;

/// Raw device addresses of a list of buffers, uploaded as `u64`.
fn addrs<T: CudaFloat>(k: &CudaKernels, bufs: &[CudaSlice<T>]) -> CudaSlice<u64> {
    let v: Vec<u64> = bufs.iter().map(|b| b.device_ptr(k.stream()).0).collect();
    k.stream().clone_htod(&v).expect("htod")
}

// ---------------------------------------------------------------------------
// KV append
// ---------------------------------------------------------------------------

fn kv_append_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng) {
    let (kvh, hd) = (2, 96);
    let row = kvh * hd;
    let caps = [5usize, 40, 17];
    // Rows: some positions of each sequence, at offsets, interleaved.
    let mut rows: Vec<(usize, usize)> = vec![(1, 30), (0, 0), (2, 16), (1, 31), (0, 4), (1, 7), (2, 3)];
    rows.push((1, 39));
    let t = rows.len();
    let kx = rnd_vec::<T>(&rng.vec(t * row, 1.0));
    let vx = rnd_vec::<T>(&rng.vec(t * row, 1.0));
    let kb: Vec<CudaSlice<T>> = caps.iter().map(|&c| poisoned::<T>(k, c * row)).collect();
    let vb: Vec<CudaSlice<T>> = caps.iter().map(|&c| poisoned::<T>(k, c * row)).collect();
    let (kp, vp) = (addrs(k, &kb), addrs(k, &vb));
    let seq: Vec<u32> = rows.iter().map(|r| r.0 as u32).collect();
    let pos: Vec<u32> = rows.iter().map(|r| r.1 as u32).collect();
    k.kv_append::<T>(&up::<T>(k, &kx), &up::<T>(k, &vx), &up_u32(k, &seq), &up_u32(k, &pos), &kp, &vp, t, kvh, hd)
        .expect("kv_append");
    for (s, &cap) in caps.iter().enumerate() {
        let mut wk = vec![f32::NAN; cap * row];
        let mut wv = vec![f32::NAN; cap * row];
        for (r, &(rs, p)) in rows.iter().enumerate() {
            if rs == s {
                wk[p * row..(p + 1) * row].copy_from_slice(&kx[r * row..(r + 1) * row]);
                wv[p * row..(p + 1) * row].copy_from_slice(&vx[r * row..(r + 1) * row]);
            }
        }
        let (gk, gv) = (down(k, &kb[s]), down(k, &vb[s]));
        for (g, w) in gk.iter().zip(&wk).chain(gv.iter().zip(&wv)) {
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "kv_append {}: seq {s}", T::NAME);
        }
    }
    println!("  kv_append {}: exact", T::NAME);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kv_append_per_sequence() {
    let k = gpu("kv_append_per_sequence");
    let mut rng = Rng::new(1);
    kv_append_case::<f32>(&k, &mut rng);
    kv_append_case::<bf16>(&k, &mut rng);
    kv_append_case::<f16>(&k, &mut rng);
}

// ---------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------

struct AttnCase<'a> {
    name: &'a str,
    /// (q_len, pos0) per sequence.
    seqs: &'a [(usize, usize)],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    /// GPU iterations to time (0: none).
    time_iters: usize,
}

fn attn_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, c: &AttnCase) {
    attn_case_at::<T>(k, rng, c, false);
}

/// [`attn_case`]; `misalign` offsets `q`, `out` and every cache buffer by one
/// element, so that none is 16-byte aligned (the kernels' element-wise paths).
fn attn_case_at<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, c: &AttnCase, misalign: bool) {
    let (h, kvh, hd) = (c.heads, c.kv_heads, c.head_dim);
    let off = usize::from(misalign);
    let kv_row = kvh * hd;
    let t: usize = c.seqs.iter().map(|s| s.0).sum();
    let max_q = c.seqs.iter().map(|s| s.0).max().unwrap_or(0);
    let scale = 1.0 / (hd as f32).sqrt();
    let q = rnd_vec::<T>(&rng.vec(t * h * hd, 2.0));
    let mut kbufs = Vec::new();
    let mut vbufs = Vec::new();
    let mut spans = Vec::new();
    let mut want = vec![0.0f32; t * h * hd];
    let mut row0 = 0;
    for &(ql, pos0) in c.seqs {
        let ctx = pos0 + ql;
        let cap = ctx + 3; // a poisoned tail that must never be read
        let kh = rnd_vec::<T>(&rng.vec(ctx * kv_row, 2.0));
        let vh = rnd_vec::<T>(&rng.vec(ctx * kv_row, 1.0));
        let mut kp = vec![f32::NAN; off];
        kp.extend(&kh);
        kp.extend(std::iter::repeat_n(f32::NAN, (cap - ctx) * kv_row));
        let mut vp = vec![f32::NAN; off];
        vp.extend(&vh);
        vp.extend(std::iter::repeat_n(f32::NAN, (cap - ctx) * kv_row));
        kbufs.push(up::<T>(k, &kp));
        vbufs.push(up::<T>(k, &vp));
        let qs = &q[row0 * h * hd..(row0 + ql) * h * hd];
        ops::causal_attention(
            qs,
            &kh,
            &vh,
            &mut want[row0 * h * hd..(row0 + ql) * h * hd],
            ql,
            pos0,
            h,
            kvh,
            hd,
            scale,
            c.window,
        );
        spans.extend([row0 as u32, ql as u32, pos0 as u32]);
        row0 += ql;
    }
    let want = rnd_vec::<T>(&want);
    let (kp, vp) = if misalign {
        let shift = |bufs: &[CudaSlice<T>]| -> CudaSlice<u64> {
            let v: Vec<u64> =
                bufs.iter().map(|b| b.device_ptr(k.stream()).0 + std::mem::size_of::<T>() as u64).collect();
            k.stream().clone_htod(&v).expect("htod")
        };
        (shift(&kbufs), shift(&vbufs))
    } else {
        (addrs(k, &kbufs), addrs(k, &vbufs))
    };
    let mut qh = vec![0.0f32; off];
    qh.extend(&q);
    let qfull = up::<T>(k, &qh);
    let qd = qfull.slice(off..);
    let sd = up_u32(k, &spans);
    let mut outfull = poisoned::<T>(k, off + t * h * hd);
    let n = c.seqs.len();
    {
        let mut out = outfull.slice_mut(off..);
        k.attention::<T>(&qd, &kp, &vp, &sd, &mut out, t, n, max_q, h, kvh, hd, scale, c.window).expect("attention");
    }
    let got = down(k, &outfull)[off..].to_vec();
    let what = format!("attention {}{} {}", c.name, if misalign { " (misaligned)" } else { "" }, T::NAME);
    check(&what, &got, &want, tol::<T>());
    let mut out = outfull.slice_mut(off..);
    if c.time_iters > 0 {
        k.stream().synchronize().unwrap();
        let t0 = Instant::now();
        for _ in 0..c.time_iters {
            k.attention::<T>(&qd, &kp, &vp, &sd, &mut out, t, n, max_q, h, kvh, hd, scale, c.window).unwrap();
        }
        k.stream().synchronize().unwrap();
        let us = t0.elapsed().as_secs_f64() * 1e6 / c.time_iters as f64;
        let kv_bytes: usize = c.seqs.iter().map(|s| (s.0 + s.1) * kv_row * 2 * std::mem::size_of::<T>()).sum::<usize>();
        // 4 flops per (query row, head, attended key, dimension): Q·K and P·V.
        let keys: f64 = c
            .seqs
            .iter()
            .map(|&(ql, pos0)| {
                (0..ql)
                    .map(|i| {
                        let p = pos0 + i;
                        let lo = match c.window {
                            Some(w) if p + 1 > w => p + 1 - w,
                            _ => 0,
                        };
                        (p + 1 - lo) as f64
                    })
                    .sum::<f64>()
            })
            .sum();
        let flops = 4.0 * keys * (h * hd) as f64;
        println!(
            "  TIME attention {} {}: {us:.1} us per call ({:.0} GB/s of K/V, {:.1} TFLOP/s)",
            c.name,
            T::NAME,
            kv_bytes as f64 / us / 1e3,
            flops / us / 1e6
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_decode_batch() {
    let k = gpu("attention_decode_batch");
    let mut rng = Rng::new(2);
    let seqs = [(1, 0), (1, 1), (1, 64), (1, 299), (1, 2100), (1, 3000), (1, 63)];
    for (h, kvh) in [(16, 2), (8, 8), (16, 4)] {
        let c = AttnCase {
            name: "decode",
            seqs: &seqs,
            heads: h,
            kv_heads: kvh,
            head_dim: 128,
            window: None,
            time_iters: 0,
        };
        println!("heads {h} kv_heads {kvh}");
        attn_case::<f32>(&k, &mut rng, &c);
        attn_case::<bf16>(&k, &mut rng, &c);
        attn_case::<f16>(&k, &mut rng, &c);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_chunked_prefill() {
    let k = gpu("attention_chunked_prefill");
    let mut rng = Rng::new(3);
    let seqs = [(37, 0), (100, 250), (1, 70), (200, 1000), (5, 3)];
    for hd in [64, 128, 256, 80] {
        for (h, kvh) in [(4, 4), (8, 2), (16, 2)] {
            println!("head_dim {hd} heads {h} kv_heads {kvh}");
            let c = AttnCase {
                name: "prefill",
                seqs: &seqs,
                heads: h,
                kv_heads: kvh,
                head_dim: hd,
                window: None,
                time_iters: 0,
            };
            attn_case::<f32>(&k, &mut rng, &c);
            attn_case::<bf16>(&k, &mut rng, &c);
        }
    }
    let c =
        AttnCase { name: "prefill", seqs: &seqs, heads: 8, kv_heads: 1, head_dim: 128, window: None, time_iters: 0 };
    attn_case::<f16>(&k, &mut rng, &c);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_sliding_window() {
    let k = gpu("attention_sliding_window");
    let mut rng = Rng::new(4);
    let prefill = [(150, 0), (90, 400), (1, 33), (64, 64)];
    let decode = [(1, 0), (1, 99), (1, 100), (1, 1500)];
    for w in [1, 100, 129] {
        for seqs in [&prefill[..], &decode[..]] {
            println!("window {w}");
            let c =
                AttnCase { name: "window", seqs, heads: 8, kv_heads: 2, head_dim: 128, window: Some(w), time_iters: 0 };
            attn_case::<f32>(&k, &mut rng, &c);
            attn_case::<bf16>(&k, &mut rng, &c);
        }
    }
}

/// The tensor-core prefill path (16-bit storage, head_dim % 16 == 0,
/// max_q_len >= 16): head dims 64 / 128 / 256 (and 80, 32: padded), GQA 1 / 4 /
/// 8, chunked prefill (pos0 > 0, mixed with decode-sized spans), sliding
/// windows, odd lengths, bf16 and f16.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_tensor_core_prefill() {
    let k = gpu("attention_tensor_core_prefill");
    let mut rng = Rng::new(8);
    let chunked = [(17, 0), (100, 37), (1, 500), (64, 64), (3, 9), (130, 1000)];
    for hd in [64, 128, 256] {
        for (h, kvh) in [(4, 4), (8, 2), (16, 2)] {
            println!("head_dim {hd} heads {h} kv_heads {kvh}");
            let c = AttnCase {
                name: "tc chunked",
                seqs: &chunked,
                heads: h,
                kv_heads: kvh,
                head_dim: hd,
                window: None,
                time_iters: 0,
            };
            attn_case::<bf16>(&k, &mut rng, &c);
            attn_case::<f16>(&k, &mut rng, &c);
        }
    }
    // Odd lengths from position 0, one long sequence.
    for (seqs, hd, h, kvh) in [
        (&[(17usize, 0usize)][..], 128, 8, 1),
        (&[(100, 0)][..], 256, 16, 2),
        (&[(1000, 0)][..], 128, 8, 2),
        (&[(1000, 0), (17, 3)][..], 64, 4, 1),
        (&[(100, 0), (33, 200)][..], 80, 6, 2),
        (&[(40, 7)][..], 32, 12, 4),
    ] {
        println!("odd lengths {seqs:?}: head_dim {hd} heads {h} kv_heads {kvh}");
        let c = AttnCase { name: "tc odd", seqs, heads: h, kv_heads: kvh, head_dim: hd, window: None, time_iters: 0 };
        attn_case::<bf16>(&k, &mut rng, &c);
        attn_case::<f16>(&k, &mut rng, &c);
    }
    // Sliding windows (smaller than, equal to and straddling the 64-key tiles).
    let wseqs = [(150, 0), (90, 400), (1, 33), (64, 64), (300, 17)];
    for w in [1, 17, 64, 100, 129, 4096] {
        for (hd, h, kvh) in [(128, 8, 2), (256, 16, 2), (64, 8, 8)] {
            println!("window {w}: head_dim {hd} heads {h} kv_heads {kvh}");
            let c = AttnCase {
                name: "tc window",
                seqs: &wseqs,
                heads: h,
                kv_heads: kvh,
                head_dim: hd,
                window: Some(w),
                time_iters: 0,
            };
            attn_case::<bf16>(&k, &mut rng, &c);
        }
    }
    let c = AttnCase {
        name: "tc window",
        seqs: &wseqs,
        heads: 8,
        kv_heads: 1,
        head_dim: 128,
        window: Some(100),
        time_iters: 0,
    };
    attn_case::<f16>(&k, &mut rng, &c);
    // Unaligned q / out / caches: the element-wise loads and stores.
    let c = AttnCase { name: "tc", seqs: &chunked, heads: 8, kv_heads: 2, head_dim: 128, window: None, time_iters: 0 };
    attn_case_at::<bf16>(&k, &mut rng, &c, true);
    attn_case_at::<f16>(&k, &mut rng, &c, true);
    let c = AttnCase {
        name: "tc window",
        seqs: &wseqs,
        heads: 4,
        kv_heads: 2,
        head_dim: 256,
        window: Some(70),
        time_iters: 0,
    };
    attn_case_at::<bf16>(&k, &mut rng, &c, true);
    // The CUDA-core path on misaligned buffers too (f32, and max_q_len < 16).
    let c = AttnCase { name: "cc", seqs: &chunked, heads: 8, kv_heads: 2, head_dim: 128, window: None, time_iters: 0 };
    attn_case_at::<f32>(&k, &mut rng, &c, true);
    let c = AttnCase {
        name: "cc decode",
        seqs: &[(1, 100), (3, 40)],
        heads: 8,
        kv_heads: 2,
        head_dim: 128,
        window: None,
        time_iters: 0,
    };
    attn_case_at::<bf16>(&k, &mut rng, &c, true);
}

/// Registers and spills of the attention kernels for sm_90 (NVRTC + ptxas, no
/// GPU); the tensor-core kernels must not spill.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_attention_ptxas_info() {
    let lines = ptxas_info("nvrtc_attention_ptxas_info", "attention.cu");
    let mut tc_seen = 0;
    for (func, line) in lines {
        if func.starts_with("attention") {
            println!("{func}: {line}");
        }
        if func.starts_with("attention_tc_") && line.contains("spill stores") {
            tc_seen += 1;
            assert!(line.contains(" 0 bytes spill stores, 0 bytes spill loads"), "{func} spills: {line}");
        }
    }
    assert_eq!(tc_seen, 6, "ptxas reported {tc_seen} tensor-core attention kernels, expected 6");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_rejects_bad_dims() {
    let k = gpu("attention_rejects_bad_dims");
    let q = poisoned::<f32>(&k, 2 * 300);
    let mut o = poisoned::<f32>(&k, 2 * 300);
    let p = k.stream().clone_htod(&[0u64]).unwrap();
    let s = up_u32(&k, &[0, 1, 0]);
    assert!(k.attention::<f32>(&q, &p, &p, &s, &mut o, 1, 1, 1, 2, 1, 300, 1.0, None).is_err());
    let q = poisoned::<f32>(&k, 3 * 64);
    let mut o = poisoned::<f32>(&k, 3 * 64);
    assert!(k.attention::<f32>(&q, &p, &p, &s, &mut o, 1, 1, 1, 3, 2, 64, 1.0, None).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_qwen3_next_prefill_4k() {
    let k = gpu("attention_qwen3_next_prefill_4k");
    let mut rng = Rng::new(5);
    let c = AttnCase {
        name: "qwen3-next prefill 4096",
        seqs: &[(4096, 0)],
        heads: ATT_HEADS,
        kv_heads: ATT_KV_HEADS,
        head_dim: ATT_HEAD_DIM,
        window: None,
        time_iters: 10,
    };
    attn_case::<bf16>(&k, &mut rng, &c);
    attn_case::<f16>(&k, &mut rng, &c);
    let c = AttnCase { name: "qwen3-next prefill 2048 at 2048", seqs: &[(2048, 2048)], ..c };
    attn_case::<bf16>(&k, &mut rng, &c);
    let c = AttnCase { name: "qwen3-next prefill 4 x 1024", seqs: &[(1024, 0); 4], ..c };
    attn_case::<bf16>(&k, &mut rng, &c);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_qwen3_next_decode() {
    let k = gpu("attention_qwen3_next_decode");
    let mut rng = Rng::new(6);
    let mk = |seqs| AttnCase {
        name: "qwen3-next decode",
        seqs,
        heads: ATT_HEADS,
        kv_heads: ATT_KV_HEADS,
        head_dim: ATT_HEAD_DIM,
        window: None,
        time_iters: 20,
    };
    println!("batch 1, context 32768");
    attn_case::<bf16>(&k, &mut rng, &mk(&[(1, 32767)]));
    println!("batch 64, context 4096");
    attn_case::<bf16>(&k, &mut rng, &mk(&[(1, 4095); 64]));
    println!("batch 4 chunked prefill 512 at 8k");
    attn_case::<bf16>(&k, &mut rng, &mk(&[(512, 8192); 4]));
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
