//! FP8 test helpers shared by the FP8 test binaries: a block-quantized random weight with its
//! device copy, stacked expert tensors, and the CPU reference of the routed experts.

use super::{rnd, Rng};
use cudarc::driver::CudaSlice;
use porter_kernels::cpu::fp8::{quantize_blocks, Fp8Rows, BLOCK};
use porter_kernels::cpu::ops;
use porter_kernels::cuda::{fp8_row_map_affine, CudaFloat, CudaKernels, Fp8Dev};

/// A host FP8 weight `[rows, cols]` (block-quantized random values) and its device copy.
pub struct W8 {
    pub q: Vec<u8>,
    pub scales: Vec<f32>,
    pub rs: Vec<u32>,
    pub rows: usize,
    pub cols: usize,
    pub dq: CudaSlice<u8>,
    pub ds: CudaSlice<f32>,
    pub drs: CudaSlice<u32>,
    /// `rs[r] == r / 128` for every row ([`Fp8Dev::row_scale_affine`]).
    pub affine: bool,
}

impl W8 {
    pub fn new(k: &CudaKernels, rng: &mut Rng, rows: usize, cols: usize) -> Self {
        let v = rng.vec(rows * cols, 0.05);
        let (q, scales) = quantize_blocks(&v, rows, cols);
        let rs: Vec<u32> = (0..rows).map(|r| (r / BLOCK) as u32).collect();
        let st = k.stream();
        let (dq, ds, drs) = (st.clone_htod(&q).unwrap(), st.clone_htod(&scales).unwrap(), st.clone_htod(&rs).unwrap());
        let affine = fp8_row_map_affine(&rs);
        Self { q, scales, rs, rows, cols, dq, ds, drs, affine }
    }
    pub fn dev(&self) -> Fp8Dev<'_> {
        Fp8Dev {
            q: &self.dq,
            scales: &self.ds,
            row_scale: &self.drs,
            row_scale_affine: self.affine,
            rows: self.rows,
            cols: self.cols,
        }
    }
    /// [`W8::dev`] reading its bytes from `q` (a copy of them: timing loops rotate copies so
    /// that each call streams from HBM).
    pub fn dev_with<'a>(&'a self, q: &'a CudaSlice<u8>) -> Fp8Dev<'a> {
        Fp8Dev { q, ..self.dev() }
    }
    pub fn host(&self) -> Fp8Rows<'_> {
        Fp8Rows { q: &self.q, scales: &self.scales, row_scale: &self.rs }
    }
    /// Dequantized values rounded to T.
    pub fn dense<T: CudaFloat>(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, row) in out.chunks_mut(self.cols).enumerate() {
            self.host().dequant_row(r, row, &|v| rnd::<T>(v));
        }
        out
    }
}

/// CPU reference of the routed experts on dequantized (rounded to T) weights; `bank` experts
/// of weights, expert x using bank entry x % bank.
#[allow(clippy::too_many_arguments)]
pub fn moe_ref<T: CudaFloat>(
    x: &[f32],
    idx: &[u32],
    wt: &[f32],
    g: &[f32],
    u: &[f32],
    d: &[f32],
    dims: [usize; 5],
    bank: usize,
) -> Vec<f32> {
    let [t, k, _e, h, i] = dims;
    let mut out = vec![0.0f32; t * h];
    for r in 0..t {
        for j in 0..k {
            let b = idx[r * k + j] as usize % bank;
            let xr = &x[r * h..(r + 1) * h];
            let (mut gv, mut uv) = (vec![0.0; i], vec![0.0; i]);
            ops::matmul_t(xr, &g[b * i * h..(b + 1) * i * h], &mut gv, 1, h, i, false);
            ops::matmul_t(xr, &u[b * i * h..(b + 1) * i * h], &mut uv, 1, h, i, false);
            let hv: Vec<f32> =
                gv.iter().zip(&uv).map(|(a, c)| rnd::<T>(ops::silu(rnd::<T>(*a)) * rnd::<T>(*c))).collect();
            let mut o = vec![0.0; h];
            ops::matmul_t(&hv, &d[b * h * i..(b + 1) * h * i], &mut o, 1, i, h, false);
            for c in 0..h {
                out[r * h + c] += rnd::<T>(o[c]) * wt[r * k + j];
            }
        }
    }
    out
}

/// A stacked expert tensor of `e` experts whose bytes repeat the `bank` experts of `w`.
pub fn stack(k: &CudaKernels, w: &W8, e: usize, bank: usize) -> W8 {
    let per = w.rows / bank;
    let mut q = Vec::with_capacity(e * per * w.cols);
    let mut rs = Vec::with_capacity(e * per);
    for x in 0..e {
        let b = x % bank;
        q.extend_from_slice(&w.q[b * per * w.cols..(b + 1) * per * w.cols]);
        rs.extend(w.rs[b * per..(b + 1) * per].iter().copied());
    }
    let st = k.stream();
    let (dq, ds, drs) = (st.clone_htod(&q).unwrap(), st.clone_htod(&w.scales).unwrap(), st.clone_htod(&rs).unwrap());
    let affine = fp8_row_map_affine(&rs);
    W8 { q: Vec::new(), scales: w.scales.clone(), rs: Vec::new(), rows: e * per, cols: w.cols, dq, ds, drs, affine }
}
