//! The routed-experts test inputs shared by the MoE tests (cuda_moe.rs, cuda_moe_decode.rs): a
//! call's shape, random / skewed routes, inputs rounded to the storage type, upload, and the
//! CPU reference of `porter_core::nn::Moe::forward`'s math after the router.
#![allow(dead_code)]

use super::*;
use cudarc::driver::CudaSlice;
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{CudaFloat, CudaKernels};
use rayon::prelude::*;

/// Shape of one MoE call. Expert `x` uses weight bank entry `x % bank` (a bank
/// smaller than `e` keeps the host side of the 80B tests small).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub t: usize,
    pub k: usize,
    pub e: usize,
    pub hidden: usize,
    pub inter: usize,
    pub bank: usize,
}

/// Random inputs of one call, already rounded to the storage type.
pub struct Inputs {
    pub x: Vec<f32>,
    pub idx: Vec<u32>,
    pub w: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

/// `k` distinct random experts per row out of `e`.
pub fn random_routes(rng: &mut Rng, t: usize, k: usize, e: usize) -> Vec<u32> {
    let mut idx = Vec::with_capacity(t * k);
    for _ in 0..t {
        let mut row: Vec<u32> = Vec::with_capacity(k);
        while row.len() < k {
            let x = rng.below(e) as u32;
            if !row.contains(&x) {
                row.push(x);
            }
        }
        idx.extend(row);
    }
    idx
}

/// Uneven loads: slot 0 of every row goes to expert `hot`; the other slots to
/// distinct experts among the first `few` (so experts `few..e` get no rows,
/// except `hot` if it lies there).
pub fn skewed_routes(rng: &mut Rng, t: usize, k: usize, hot: usize, few: usize) -> Vec<u32> {
    assert!(k <= few);
    let mut idx = Vec::with_capacity(t * k);
    for _ in 0..t {
        let mut row = vec![hot as u32];
        while row.len() < k {
            let x = rng.below(few) as u32;
            if !row.contains(&x) {
                row.push(x);
            }
        }
        idx.extend(row);
    }
    idx
}

/// Random inputs of shape `d` for routes `idx`.
pub fn inputs<T: CudaFloat>(rng: &mut Rng, d: Dims, idx: Vec<u32>) -> Inputs {
    assert_eq!(idx.len(), d.t * d.k);
    let per = d.inter * d.hidden;
    // Scales keep g, u, h and o of order 1 (products summed over hidden / inter terms).
    let ws = 1.0 / (d.hidden as f32).sqrt() * 1.7;
    let ds = 1.0 / (d.inter as f32).sqrt() * 1.7;
    Inputs {
        x: rnd_vec::<T>(&rng.vec(d.t * d.hidden, 1.0)),
        w: (0..d.t * d.k).map(|_| 0.05 + 0.95 * (rng.f(0.5) + 0.5)).collect(),
        idx,
        gate: rnd_vec::<T>(&rng.vec(d.bank * per, ws)),
        up: rnd_vec::<T>(&rng.vec(d.bank * per, ws)),
        down: rnd_vec::<T>(&rng.vec(d.bank * per, ds)),
    }
}

/// CPU reference (`Moe::forward` after the router): rows grouped per expert,
/// f32 GEMMs, `h = round(silu(round g) · round u)`, `o = round(h · downᵀ)`,
/// `out[r] = Σ_j o[r, j] · w[r, j]` over slots in order; ids `>= e` skipped.
pub fn reference<T: CudaFloat>(d: Dims, inp: &Inputs) -> Vec<f32> {
    let (h, i) = (d.hidden, d.inter);
    let per = h * i;
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); d.e];
    for (p, &x) in inp.idx.iter().enumerate() {
        if (x as usize) < d.e {
            groups[x as usize].push(p);
        }
    }
    let outs: Vec<(usize, Vec<f32>)> = (0..d.e)
        .into_par_iter()
        .filter(|&x| !groups[x].is_empty())
        .map(|x| {
            let pairs = &groups[x];
            let n = pairs.len();
            let b = x % d.bank;
            let mut xs = Vec::with_capacity(n * h);
            for &p in pairs {
                let r = p / d.k;
                xs.extend_from_slice(&inp.x[r * h..(r + 1) * h]);
            }
            let mut g = vec![0.0; n * i];
            let mut u = vec![0.0; n * i];
            ops::matmul_t(&xs, &inp.gate[b * per..(b + 1) * per], &mut g, n, h, i, false);
            ops::matmul_t(&xs, &inp.up[b * per..(b + 1) * per], &mut u, n, h, i, false);
            for (uv, gv) in u.iter_mut().zip(&g) {
                *uv = rnd::<T>(ops::silu(rnd::<T>(*gv)) * rnd::<T>(*uv));
            }
            let mut o = vec![0.0; n * h];
            ops::matmul_t(&u, &inp.down[b * per..(b + 1) * per], &mut o, n, i, h, false);
            o.iter_mut().for_each(|v| *v = rnd::<T>(*v));
            (x, o)
        })
        .collect();
    let mut op = vec![0.0f32; d.t * d.k * h];
    for (x, o) in &outs {
        for (ri, &p) in groups[*x].iter().enumerate() {
            op[p * h..(p + 1) * h].copy_from_slice(&o[ri * h..(ri + 1) * h]);
        }
    }
    let mut out = vec![0.0f32; d.t * h];
    for r in 0..d.t {
        for j in 0..d.k {
            let p = r * d.k + j;
            if (inp.idx[p] as usize) < d.e {
                for c in 0..h {
                    out[r * h + c] += op[p * h + c] * inp.w[p];
                }
            }
        }
    }
    out
}

/// Expert weights `[e, rows, cols]` on the device: bank entry `x % bank` for expert `x`.
pub fn upload_experts<T: CudaFloat>(kern: &CudaKernels, bank: &[f32], d: Dims) -> CudaSlice<T> {
    let per = d.hidden * d.inter;
    if d.bank == d.e {
        return up::<T>(kern, bank);
    }
    let src = up::<T>(kern, bank);
    let s = kern.stream();
    let mut dst = s.alloc_zeros::<T>(d.e * per).expect("alloc");
    for x in 0..d.e {
        let b = x % d.bank;
        s.memcpy_dtod(&src.slice(b * per..(b + 1) * per), &mut dst.slice_mut(x * per..(x + 1) * per)).expect("dtod");
    }
    dst
}

/// The device copy of one call's inputs.
pub struct Device<T> {
    pub x: CudaSlice<T>,
    pub idx: CudaSlice<u32>,
    pub w: CudaSlice<f32>,
    pub gate: CudaSlice<T>,
    pub up: CudaSlice<T>,
    pub down: CudaSlice<T>,
}

/// Uploads one call's inputs.
pub fn upload<T: CudaFloat>(kern: &CudaKernels, d: Dims, inp: &Inputs) -> Device<T> {
    Device {
        x: up::<T>(kern, &inp.x),
        idx: up_u32(kern, &inp.idx),
        w: up::<f32>(kern, &inp.w),
        gate: upload_experts::<T>(kern, &inp.gate, d),
        up: upload_experts::<T>(kern, &inp.up, d),
        down: upload_experts::<T>(kern, &inp.down, d),
    }
}

/// `inp` restricted to the rows `rows` (x, idx and w; the weight banks are shared).
pub fn rows_of(d: Dims, inp: &Inputs, rows: &[usize]) -> (Dims, Inputs) {
    let (h, k) = (d.hidden, d.k);
    let sub = Dims { t: rows.len(), ..d };
    let inp = Inputs {
        x: rows.iter().flat_map(|&r| inp.x[r * h..(r + 1) * h].iter().copied()).collect(),
        idx: rows.iter().flat_map(|&r| inp.idx[r * k..(r + 1) * k].iter().copied()).collect(),
        w: rows.iter().flat_map(|&r| inp.w[r * k..(r + 1) * k].iter().copied()).collect(),
        gate: inp.gate.clone(),
        up: inp.up.clone(),
        down: inp.down.clone(),
    };
    (sub, inp)
}

/// Distinct valid experts of a route set.
pub fn distinct_experts(idx: &[u32], e: usize) -> usize {
    let mut seen = vec![false; e];
    idx.iter().filter(|&&x| (x as usize) < e).for_each(|&x| seen[x as usize] = true);
    seen.iter().filter(|&&b| b).count()
}

/// Qwen3-Next-80B-A3B's expert intermediate size.
pub const MOE_INTER: usize = 512;
/// Distinct random weight sets replicated over the 512 experts.
pub const BANK: usize = 16;

/// The 80B routed-experts shape at `t` rows.
pub fn dims_80b(t: usize) -> Dims {
    Dims { t, k: TOP_K, e: EXPERTS, hidden: HIDDEN, inter: MOE_INTER, bank: BANK }
}
