//! The attention test harness shared by cuda_attention.rs and cuda_attention_mma.rs: a
//! shuffled paged KV pool on the device and one checked (optionally timed) attention launch
//! against `ops::causal_attention`.
#![allow(dead_code)]

use super::*;
use cudarc::driver::CudaSlice;
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{AttnMode, CudaFloat, CudaKernels};
use std::time::Instant;

/// A random permutation of `0..n`.
pub fn shuffled(rng: &mut Rng, n: usize) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i + 1));
    }
    v
}

/// A paged KV cache on the device: sequence `s`'s key `j` at pool row
/// `tables[s][j / bs] * bs + j % bs`, blocks a random permutation of the pool's
/// (a few spare ones), every row not written NaN, table entries past a sequence's
/// blocks garbage. The pools carry `off` leading elements (misalignment).
pub struct Pool<T: CudaFloat> {
    pub k: CudaSlice<T>,
    pub v: CudaSlice<T>,
    /// Block table row of each sequence (`width` entries).
    pub rows: Vec<Vec<u32>>,
    pub width: usize,
}

impl<T: CudaFloat> Pool<T> {
    /// `kv[s] = (keys, values)` of sequence `s`, `[ctx, kv_row]` each (rounded to `T`).
    pub fn new(
        k: &CudaKernels,
        rng: &mut Rng,
        kv: &[(Vec<f32>, Vec<f32>)],
        kv_row: usize,
        bs: usize,
        off: usize,
    ) -> Self {
        let nblk: Vec<usize> = kv.iter().map(|(kk, _)| (kk.len() / kv_row).div_ceil(bs)).collect();
        let width = nblk.iter().copied().max().unwrap_or(0).max(1) + 1;
        let total = nblk.iter().sum::<usize>() + 3;
        let perm = shuffled(rng, total);
        let mut kh = vec![f32::NAN; off + total * bs * kv_row];
        let mut vh = kh.clone();
        let (mut next, mut rows) = (0, Vec::new());
        for ((kk, vv), &nb) in kv.iter().zip(&nblk) {
            let mut row = vec![u32::MAX - 7; width];
            for (b, e) in row.iter_mut().enumerate().take(nb) {
                *e = perm[next + b];
            }
            for j in 0..kk.len() / kv_row {
                let at = off + (row[j / bs] as usize * bs + j % bs) * kv_row;
                kh[at..at + kv_row].copy_from_slice(&kk[j * kv_row..(j + 1) * kv_row]);
                vh[at..at + kv_row].copy_from_slice(&vv[j * kv_row..(j + 1) * kv_row]);
            }
            next += nb;
            rows.push(row);
        }
        Pool { k: up::<T>(k, &kh), v: up::<T>(k, &vh), rows, width }
    }

    /// The tables of sequences `which`, `width` wide (cut or padded with garbage).
    pub fn tables(&self, k: &CudaKernels, which: &[usize], width: usize) -> CudaSlice<u32> {
        let mut t = Vec::new();
        for &s in which {
            t.extend(self.rows[s].iter().copied().chain(std::iter::repeat(u32::MAX)).take(width));
        }
        up_u32(k, &t)
    }
}

#[derive(Clone, Copy)]
pub struct AttnCase<'a> {
    pub name: &'a str,
    /// (q_len, pos0) per sequence.
    pub seqs: &'a [(usize, usize)],
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub window: Option<usize>,
    /// Cache block size.
    pub bs: usize,
    pub mode: AttnMode,
    /// GPU iterations to time (0: none).
    pub time_iters: usize,
}

impl<'a> AttnCase<'a> {
    pub fn new(name: &'a str, seqs: &'a [(usize, usize)], heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        let (window, bs, mode, time_iters) = (None, 16, AttnMode::Fast, 0);
        AttnCase { name, seqs, heads, kv_heads, head_dim, window, bs, mode, time_iters }
    }
}

/// One launch of `c` on a shuffled pool (plus a padding span in the middle, its
/// table garbage) against `ops::causal_attention`; returns the output.
pub fn attn_case<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, c: &AttnCase) -> Vec<f32> {
    attn_case_at::<T>(k, rng, c, false)
}

/// [`attn_case`]; `misalign` offsets `q`, `out` and the pools by one element, so
/// that none is 16-byte aligned (the kernels' element-wise paths).
pub fn attn_case_at<T: CudaFloat>(k: &CudaKernels, rng: &mut Rng, c: &AttnCase, misalign: bool) -> Vec<f32> {
    let (h, kvh, hd) = (c.heads, c.kv_heads, c.head_dim);
    let off = usize::from(misalign);
    let kv_row = kvh * hd;
    let t: usize = c.seqs.iter().map(|s| s.0).sum();
    let max_q = c.seqs.iter().map(|s| s.0).max().unwrap_or(0);
    let scale = 1.0 / (hd as f32).sqrt();
    let q = rnd_vec::<T>(&rng.vec(t * h * hd, 2.0));
    let mut kv = Vec::new();
    let mut spans = Vec::new();
    let mut want = vec![0.0f32; t * h * hd];
    let mut row0 = 0;
    for &(ql, pos0) in c.seqs {
        let ctx = pos0 + ql;
        let kh = rnd_vec::<T>(&rng.vec(ctx * kv_row, 2.0));
        let vh = rnd_vec::<T>(&rng.vec(ctx * kv_row, 1.0));
        let (a, b) = (row0 * h * hd, (row0 + ql) * h * hd);
        ops::causal_attention(&q[a..b], &kh, &vh, &mut want[a..b], ql, pos0, h, kvh, hd, scale, c.window);
        kv.push((kh, vh));
        spans.push([row0 as u32, ql as u32, pos0 as u32]);
        row0 += ql;
    }
    // A padding span (q_len 0) with a garbage table row, in the middle.
    let mid = c.seqs.len() / 2;
    spans.insert(mid, [0, 0, 12_345]);
    kv.insert(mid, (vec![], vec![]));
    let want = rnd_vec::<T>(&want);
    let pool = Pool::<T>::new(k, rng, &kv, kv_row, c.bs, off);
    let n = spans.len();
    let tables = pool.tables(k, &(0..n).collect::<Vec<_>>(), pool.width);
    let (kp, vp) = (pool.k.slice(off..), pool.v.slice(off..));
    let mut qh = vec![0.0f32; off];
    qh.extend(&q);
    let qfull = up::<T>(k, &qh);
    let qd = qfull.slice(off..);
    let sd = up_u32(k, &spans.concat());
    let mut outfull = poisoned::<T>(k, off + t * h * hd);
    let (w, bs, mode) = (pool.width, c.bs, c.mode);
    let run = |out: &mut CudaSlice<T>| {
        let mut o = out.slice_mut(off..);
        k.attention::<T>(&qd, &kp, &vp, &tables, w, bs, &sd, &mut o, t, n, max_q, h, kvh, hd, scale, c.window, mode)
    };
    run(&mut outfull).expect("attention");
    let got = down(k, &outfull)[off..].to_vec();
    let what =
        format!("attention {}{} bs {bs} {:?} {}", c.name, if misalign { " (misaligned)" } else { "" }, mode, T::NAME);
    check(&what, &got, &want, tol::<T>());
    // The decode step's pair (`append_attention`): the new rows' pool entries poisoned, then
    // written by the append right before the attention, whose decode kernel reads early: the
    // same bits as above (an early read of a new key would bring its NaN).
    let new_rows: Vec<(usize, usize)> = (0..n)
        .filter(|&s| s != mid)
        .flat_map(|s| {
            let [_, ql, pos0] = spans[s];
            (pos0..pos0 + ql).map(move |p| (s, p as usize))
        })
        .collect();
    let slot = |(s, p): (usize, usize)| pool.rows[s][p / bs] as usize * bs + p % bs;
    let (mut kh, mut vh) = (down(k, &pool.k), down(k, &pool.v));
    let (mut knew, mut vnew) = (Vec::new(), Vec::new());
    for &(s, p) in &new_rows {
        let at = off + slot((s, p)) * kv_row;
        knew.extend_from_slice(&kv[s].0[p * kv_row..(p + 1) * kv_row]);
        vnew.extend_from_slice(&kv[s].1[p * kv_row..(p + 1) * kv_row]);
        kh[at..at + kv_row].fill(f32::NAN);
        vh[at..at + kv_row].fill(f32::NAN);
    }
    let slots: Vec<u32> = new_rows.iter().map(|&r| slot(r) as u32).collect();
    let (mut kp2, mut vp2) = (up::<T>(k, &kh), up::<T>(k, &vh));
    let mut out2 = poisoned::<T>(k, off + t * h * hd);
    k.append_attention::<T>(
        &up::<T>(k, &knew),
        &up::<T>(k, &vnew),
        &up_u32(k, &slots),
        &mut kp2.slice_mut(off..),
        &mut vp2.slice_mut(off..),
        &qd,
        &tables,
        (w, bs),
        &sd,
        &mut out2.slice_mut(off..),
        (t, n, max_q),
        (h, kvh, hd),
        scale,
        c.window,
        mode,
    )
    .expect("append_attention");
    check_bits(&format!("{what}: append_attention"), &down(k, &out2)[off..], &got);
    if c.time_iters > 0 {
        k.stream().synchronize().unwrap();
        let t0 = Instant::now();
        for _ in 0..c.time_iters {
            run(&mut outfull).unwrap();
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
    got
}

/// The tensor-core prefill shapes (16-bit storage, head_dim % 16 == 0, max_q_len >= 16) in
/// `mode`, those whose head dim passes `keep`: head dims 64 / 128 / 256 (and 80, 32: padded),
/// GQA 1 / 3 / 4 / 8 / 12 (item tiles that split a row's heads), chunked prefill (pos0 > 0:
/// a prefix already cached, mixed with decode-sized spans), sliding windows, odd lengths,
/// block sizes 1 / 16 / 32 / 64 / 128 (tiles crossing blocks and blocks holding whole
/// tiles), misaligned q / out / pools (the element-wise loads and stores), bf16 and f16.
pub fn tc_prefill_cases(k: &CudaKernels, rng: &mut Rng, mode: AttnMode, keep: &dyn Fn(usize) -> bool) {
    use half::{bf16, f16};
    let chunked = [(17, 0), (100, 37), (1, 500), (64, 64), (3, 9), (130, 1000)];
    for (i, hd) in [64, 128, 256].into_iter().enumerate().filter(|&(_, hd)| keep(hd)) {
        for (j, (h, kvh)) in [(4, 4), (8, 2), (16, 2)].into_iter().enumerate() {
            let bs = [1, 16, 32][(i + j) % 3];
            println!("head_dim {hd} heads {h} kv_heads {kvh} block size {bs}");
            let c = AttnCase { bs, mode, ..AttnCase::new("tc chunked", &chunked, h, kvh, hd) };
            attn_case::<bf16>(k, rng, &c);
            attn_case::<f16>(k, rng, &c);
        }
    }
    // Odd lengths from position 0, long sequences, large blocks.
    for (seqs, hd, h, kvh, bs) in [
        (&[(17usize, 0usize)][..], 128, 8, 1, 32),
        (&[(100, 0)][..], 256, 16, 2, 32),
        (&[(1000, 0)][..], 128, 8, 2, 32),
        (&[(1000, 0), (17, 3)][..], 64, 4, 1, 32),
        (&[(100, 0), (33, 200)][..], 80, 6, 2, 32),
        (&[(40, 7)][..], 32, 12, 4, 32),
        (&[(700, 0), (300, 700)][..], 256, 16, 2, 64),
        (&[(250, 0), (77, 900)][..], 256, 12, 1, 128),
    ] {
        if !keep(hd) {
            continue;
        }
        println!("odd lengths {seqs:?}: head_dim {hd} heads {h} kv_heads {kvh} block size {bs}");
        let c = AttnCase { bs, mode, ..AttnCase::new("tc odd", seqs, h, kvh, hd) };
        attn_case::<bf16>(k, rng, &c);
        attn_case::<f16>(k, rng, &c);
    }
    // Sliding windows (smaller than, equal to and straddling the 32- and 64-key tiles).
    let wseqs = [(150, 0), (90, 400), (1, 33), (64, 64), (300, 17)];
    for w in [1, 17, 64, 100, 129, 4096] {
        for (hd, h, kvh) in [(128, 8, 2), (256, 16, 2), (64, 8, 8)] {
            if !keep(hd) {
                continue;
            }
            println!("window {w}: head_dim {hd} heads {h} kv_heads {kvh}");
            let c = AttnCase { window: Some(w), mode, ..AttnCase::new("tc window", &wseqs, h, kvh, hd) };
            attn_case::<bf16>(k, rng, &c);
        }
    }
    if keep(128) {
        let c = AttnCase { window: Some(100), bs: 1, mode, ..AttnCase::new("tc window", &wseqs, 8, 1, 128) };
        attn_case::<f16>(k, rng, &c);
        // Unaligned q / out / pools: the element-wise loads and stores.
        let c = AttnCase { mode, ..AttnCase::new("tc", &chunked, 8, 2, 128) };
        attn_case_at::<bf16>(k, rng, &c, true);
        attn_case_at::<f16>(k, rng, &c, true);
    }
    if keep(256) {
        let c = AttnCase { window: Some(70), mode, ..AttnCase::new("tc window", &wseqs, 4, 2, 256) };
        attn_case_at::<bf16>(k, rng, &c, true);
    }
}

/// HBM bandwidth the decode timings are a share of (H200: ~4.19 TB/s measured peak).
pub const HBM_BYTES_PER_S: f64 = 4.19e12;

/// The legacy (CUDA-core, attention.cu) and the mma (attention_decode.cu: `mma`, `mma2`,
/// `mmaw2`, `mma4`, `mma4w2`, `mma4s`, the default split sizes and others) decode kernels side by
/// side: `b` sequences of `ctx` keys, q_len 1, bf16, block size 16 on a shuffled pool, each
/// kernel timed by CUDA events over `iters` back-to-back calls queued behind a hold (per-call
/// partial-scratch allocation included, as the model runs it; no host gaps). For the main
/// forms also `prealloc` (the scratch kept across calls: both kernels, no allocation) and
/// `split` (the split kernel alone, no combine); `combine` = prealloc − split, `alloc` =
/// per call − prealloc. Prints µs per call, GB/s of K/V and the share of
/// [`HBM_BYTES_PER_S`]; checks each mma output against the legacy one (both f32 math on bf16
/// data: within twice the bf16 tolerance, each being within it of the reference) and returns
/// (legacy µs, best per-call mma µs).
pub fn decode_ab(
    k: &CudaKernels,
    rng: &mut Rng,
    hold: &mut super::timing::Hold,
    (h, kvh, hd): (usize, usize, usize),
    b: usize,
    ctx: usize,
    iters: usize,
) -> (f64, f64) {
    use half::bf16;
    use porter_kernels::cuda::{
        force_attn_decode, force_attn_decode_early, force_attn_decode_splits, force_attn_decode_timing, AttnDecode,
        DecodeTiming,
    };
    let row = kvh * hd;
    let nb = ctx.div_ceil(16);
    let kp = up::<bf16>(k, &rng.vec(b * nb * 16 * row, 1.0));
    let vp = up::<bf16>(k, &rng.vec(b * nb * 16 * row, 1.0));
    let tables = up_u32(k, &shuffled(rng, b * nb));
    let spans: Vec<u32> = (0..b).flat_map(|i| [i as u32, 1, (ctx - 1) as u32]).collect();
    let sd = up_u32(k, &spans);
    let q = up::<bf16>(k, &rng.vec(b * h * hd, 2.0));
    let sc = 1.0 / (hd as f32).sqrt();
    let bytes = (b * ctx * row * 2 * std::mem::size_of::<bf16>()) as f64;
    let show = |us: f64| {
        let gbs = bytes / us / 1e3;
        format!("{us:8.1} us {gbs:6.0} GB/s {:5.1} % of 4.19 TB/s", 100.0 * gbs * 1e9 / HBM_BYTES_PER_S)
    };
    println!("  DECODE-AB h{h} kvh{kvh} d{hd} batch {b} ctx {ctx} ({:.1} MB of K/V):", bytes / 1e6);
    let (mut legacy, mut best) = ((0.0, Vec::new()), f64::INFINITY);
    // (kernel, (splits, min keys) or the environment's, also prealloc / split timings, the
    // early loads of `append_attention` before the PDL wait: the launch before each call is the
    // last call's combine, which writes neither Q nor the pools).
    let forms = [
        (AttnDecode::Legacy, None, false, false),
        (AttnDecode::Mma, None, true, false),
        (AttnDecode::Mma2, None, false, false),
        (AttnDecode::MmaW2, None, true, false),
        (AttnDecode::Mma4, None, true, false),
        (AttnDecode::Mma4, None, true, true),
        (AttnDecode::Mma4W2, None, true, false),
        (AttnDecode::Mma4S, None, true, false),
        (AttnDecode::Mma4N8, None, true, false),
        (AttnDecode::Mma4N8, None, true, true),
        (AttnDecode::Mma, Some((128, 128)), false, false),
        (AttnDecode::Mma, Some((32, 512)), false, false),
        (AttnDecode::MmaW2, Some((128, 128)), false, false),
        (AttnDecode::Mma4, Some((128, 256)), true, false),
        (AttnDecode::Mma4, Some((32, 512)), false, false),
        (AttnDecode::Mma4W2, Some((128, 256)), true, false),
        (AttnDecode::Mma4W2, Some((128, 128)), false, false),
        (AttnDecode::Mma4, Some((64, 128)), true, false),
        (AttnDecode::Mma4W2, Some((64, 128)), false, false),
    ];
    for (kind, splits, parts, early) in forms {
        force_attn_decode(Some(kind));
        force_attn_decode_early(early);
        force_attn_decode_splits(splits);
        let sp = splits.map_or("env".to_string(), |(s, m)| format!("{s}/{m}")) + if early { " early" } else { "" };
        let modes: &[DecodeTiming] = if parts {
            &[DecodeTiming::PerCall, DecodeTiming::Prealloc, DecodeTiming::SplitOnly]
        } else {
            &[DecodeTiming::PerCall]
        };
        let mut times = Vec::new();
        for &mode in modes {
            force_attn_decode_timing(mode);
            let mut out = poisoned::<bf16>(k, b * h * hd);
            let sec = {
                let mut run = |_i: usize| {
                    k.attention::<bf16>(
                        &q,
                        &kp,
                        &vp,
                        &tables,
                        nb,
                        16,
                        &sd,
                        &mut out,
                        b,
                        b,
                        1,
                        h,
                        kvh,
                        hd,
                        sc,
                        None,
                        AttnMode::Fast,
                    )
                    .expect("attention")
                };
                super::timing::time_calls(k, hold, iters, &mut run)
            };
            let us = sec * 1e6;
            times.push(us);
            let name =
                k.attention_decode_kernel::<bf16>(hd, 1, AttnMode::Fast).unwrap_or_else(|| "attention.cu".into());
            if kind == AttnDecode::Legacy {
                println!("    legacy {:>30}: {}", "attention.cu", show(us));
                legacy = (us, down(k, &out));
                continue;
            }
            let label = match mode {
                DecodeTiming::PerCall => "per call",
                DecodeTiming::Prealloc => "prealloc",
                DecodeTiming::SplitOnly => "split",
            };
            println!("    {kind:?} {name:>30} splits/min {sp:>7} {label:>8}: {} ({:.2}x)", show(us), legacy.0 / us);
            if mode != DecodeTiming::SplitOnly {
                check(
                    &format!("    decode {kind:?} {label} vs legacy"),
                    &down(k, &out),
                    &legacy.1,
                    2.0 * tol::<bf16>(),
                );
            }
            if mode == DecodeTiming::PerCall {
                best = best.min(us);
            }
        }
        if let [per_call, prealloc, split] = times[..] {
            println!(
                "    {kind:?} splits/min {:>7}: alloc {:.1} us, combine (launch included) {:.1} us, split kernel {:.1} us",
                sp,
                per_call - prealloc,
                prealloc - split,
                split
            );
        }
    }
    force_attn_decode_timing(DecodeTiming::PerCall);
    force_attn_decode(None);
    force_attn_decode_splits(None);
    force_attn_decode_early(false);
    (legacy.0, best)
}
