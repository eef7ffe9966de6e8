//! Host FP8 weights: e4m3fn bytes with 128 × 128 block scales, kept in that form in memory
//! (1 byte per parameter plus the scales) and dequantized inside the CPU GEMM.

use super::DType;
use crate::bail;
use crate::error::Result;
use porter_kernels::cpu::fp8::{e4m3_to_f32, Fp8Rows, BLOCK};

/// A block-quantized `[rows, cols]` weight (any leading dims flattened into rows).
///
/// `W[r, c] = e4m3(q[r, c]) · scales[row_scale[r], c / 128]`, rounded to `dtype` (the model's
/// compute dtype). `row_scale` names the scale row of every weight row, so a weight packed,
/// stacked or regrouped from several checkpoint tensors keeps each tensor's own block scales
/// (for one checkpoint tensor it is `r / 128`).
#[derive(Clone, Debug)]
pub struct Fp8Weight {
    /// `[rows, cols]` e4m3fn bytes.
    pub q: Vec<u8>,
    /// `[scale_rows, ceil(cols/128)]` scales (multiplied, despite the checkpoint name
    /// `weight_scale_inv`).
    pub scales: Vec<f32>,
    /// `[rows]`: the scale row of each weight row.
    pub row_scale: Vec<u32>,
    /// Row length (the input features).
    pub cols: usize,
    /// The dtype dequantized values are rounded to.
    pub dtype: DType,
}

impl Fp8Weight {
    /// One checkpoint tensor `[rows, cols]` with its scales `[ceil(rows/128), ceil(cols/128)]`.
    pub fn new(q: Vec<u8>, scales: Vec<f32>, rows: usize, cols: usize, dtype: DType) -> Result<Self> {
        let (sr, sc) = (rows.div_ceil(BLOCK), cols.div_ceil(BLOCK));
        if q.len() != rows * cols || scales.len() != sr * sc {
            bail!(
                Shape,
                "fp8 weight [{rows}, {cols}] needs {} bytes and {sr}x{sc} scales, got {} and {}",
                rows * cols,
                q.len(),
                scales.len()
            );
        }
        let row_scale = (0..rows).map(|r| (r / BLOCK) as u32).collect();
        Ok(Self { q, scales, row_scale, cols, dtype })
    }

    /// Number of weight rows.
    pub fn rows(&self) -> usize {
        self.row_scale.len()
    }

    /// Bytes held (e4m3 bytes, scales and the row → scale-row map).
    pub fn bytes(&self) -> usize {
        self.q.len() + 4 * self.scales.len() + 4 * self.row_scale.len()
    }

    /// Rows `r0..r1` as a borrowed view for the GEMM.
    pub fn rows_view(&self, r0: usize, r1: usize) -> Result<Fp8Rows<'_>> {
        if r0 > r1 || r1 > self.rows() {
            bail!(Internal, "fp8 rows {r0}..{r1} of {}", self.rows());
        }
        Ok(Fp8Rows {
            q: &self.q[r0 * self.cols..r1 * self.cols],
            scales: &self.scales,
            row_scale: &self.row_scale[r0..r1],
        })
    }

    /// The dequantized values (rounded to `dtype`) as a new `f32` vector.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.q.len()];
        if self.cols == 0 {
            return out;
        }
        let dt = self.dtype;
        let view = Fp8Rows { q: &self.q, scales: &self.scales, row_scale: &self.row_scale };
        for (r, row) in out.chunks_mut(self.cols).enumerate() {
            view.dequant_row(r, row, &|v| dt.round(v));
        }
        out
    }

    /// Concatenates weights with the same row length along the rows; each part keeps its own
    /// scales.
    pub fn concat(parts: Vec<Fp8Weight>) -> Result<Self> {
        let Some(first) = parts.first() else { bail!(Internal, "concat of no fp8 weights") };
        let (cols, dtype) = (first.cols, first.dtype);
        let mut out = Fp8Weight { q: Vec::new(), scales: Vec::new(), row_scale: Vec::new(), cols, dtype };
        let sc = cols.div_ceil(BLOCK);
        for p in parts {
            if p.cols != cols {
                bail!(Shape, "concat of fp8 weights with {cols} and {} columns", p.cols);
            }
            let base = (out.scales.len() / sc.max(1)) as u32;
            out.q.extend_from_slice(&p.q);
            out.scales.extend_from_slice(&p.scales);
            out.row_scale.extend(p.row_scale.iter().map(|r| r + base));
        }
        Ok(out)
    }

    /// Reorders the rows `[groups, Σparts]` into part-major order (the weight map's
    /// `regroup`), moving each row's scale row with it.
    pub fn regroup(self, groups: usize, parts: &[usize]) -> Self {
        let q = super::regroup_rows(&self.q, groups, parts, self.cols);
        let row_scale = super::regroup_rows(&self.row_scale, groups, parts, 1);
        Self { q, row_scale, ..self }
    }
}

/// The value of one e4m3fn byte.
pub fn e4m3(b: u8) -> f32 {
    e4m3_to_f32(b)
}

/// `x` rounded to the nearest e4m3fn byte (ties to even, saturated to ±448).
pub fn encode(x: f32) -> u8 {
    porter_kernels::cpu::fp8::f32_to_e4m3(x)
}
