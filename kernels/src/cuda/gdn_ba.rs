//! The Gated DeltaNet conv + gates launch with its gate inputs computed in the launch
//! (`gdn_conv_gates_proj_seq_*`, kernels/cuda/gdn_seq.cu): the FP8 checkpoints keep
//! `in_proj_ba` (bf16) apart from the FP8 `in_proj_qkvz`, so its `[b | a]` product is not a
//! column range of the input GEMM's output; at decode it cost a GEMV launch of its own a layer
//! (2.3 µs in place on an H100, 18 layers a step), which this form folds into conv + gates.

use super::gdn_seq::{ConvGatesDims, GateArgs};
use super::misc::gemv_split;
use super::{prod, u32_of, CudaError, CudaFloat, CudaKernels, Result};
use cudarc::driver::{DevicePtr, DevicePtrMut};

/// Environment variable: `apart` computes the Gated DeltaNet gate inputs `[b | a]` with a GEMV
/// of their own before the conv + gates launch (`in_proj_ba` held apart, the FP8 checkpoints),
/// instead of inside it ([`CudaKernels::gdn_conv_gates_proj_seq`]), for A/B; `fused` or unset
/// is the default (read once; another value warns once and means the default).
pub const GDN_BA_ENV: &str = "PORTER_GDN_BA";

/// Most rows (tokens of a step) whose gate inputs the conv + gates launch computes itself: one
/// warp a (row, value head) re-reads the `[2·Hv, hidden]` weight from L2 per row, which suits
/// decode and speculative verify; prefill steps take the GEMM.
pub const GDN_BA_FUSED_MAX_ROWS: usize = 16;

/// Warps of a gate block of the proj form (the kernel's 256 threads).
const GATE_WARPS: usize = 8;
/// Most gate blocks a row tile of the proj form (a block's warps loop over more items).
const MAX_GATE_BLOCKS: usize = 16;

/// Whether the backend computes the Gated DeltaNet gate inputs inside the conv + gates launch
/// where it can ([`GDN_BA_ENV`], read once).
pub fn gdn_ba_fused_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::env::env_fused(GDN_BA_ENV, true))
}

/// Gate blocks a row tile of the proj form for `rows` rows a tile, `hv` value heads and
/// `split` warps an item: a warp for every (item, part) where [`MAX_GATE_BLOCKS`] allow (32
/// heads of one row at 4 parts: 16 blocks).
fn gate_blocks(rows: usize, hv: usize, split: usize) -> usize {
    rows.saturating_mul(hv).saturating_mul(split).div_ceil(GATE_WARPS).clamp(1, MAX_GATE_BLOCKS)
}

/// The gate inputs of [`CudaKernels::gdn_conv_gates_proj_seq`]: `x · wᵀ`.
///
/// # Shapes
/// - `x`: `[t, hidden]` (`T`; the rows the block's input projection read)
/// - `w`: `[2·hv, hidden]` (`T`; rows `0..hv` give `b`, `hv..2·hv` give `a`), a weight: the
///   launch reads it before its programmatic-dependent-launch wait
pub struct GateProj<'a, X, W> {
    pub x: &'a X,
    pub w: &'a W,
    pub hidden: usize,
}

impl CudaKernels {
    /// [`CudaKernels::gdn_conv_gates_seq`] with the gate inputs computed by the launch instead
    /// of read from a tensor: for row `r` and value head `h`,
    /// `b = round_T(Σ_i w[h, i]·x[r, i])`, `a = round_T(Σ_i w[hv + h, i]·x[r, i])` (f32
    /// accumulation, rounded to `T` as a GEMM's output), then the same gates. The conv, its
    /// outputs and the window updates are the other form's, bit for bit.
    ///
    /// Each (row, head) is summed by the warps of one block as [`CudaKernels::gemv`] sums a
    /// column (the same split over warps for `w`'s shape, the same order): where
    /// `hidden · size_of::<T>()` is a multiple of 16 and `x`, `w` are 16-byte aligned, `b` and
    /// `a` are the GEMV's outputs for `x · wᵀ` bit for bit, for every `t`; otherwise the same
    /// layout over single elements (within an ulp of `T` of a GEMM). Meant for decode-sized
    /// steps (`t ≤` [`GDN_BA_FUSED_MAX_ROWS`]: every row re-reads the weight from L2), though
    /// any `t` is computed.
    ///
    /// # Shapes
    /// As [`CudaKernels::gdn_conv_gates_seq`] without `ba`, and [`GateProj`]; `x` holds only the
    /// conv channels (columns `0..c` of rows of `x_stride`).
    ///
    /// # Errors
    /// [`CudaError::Invalid`] as [`CudaKernels::gdn_conv_gates_seq`], if `hidden` is 0, or on a
    /// length mismatch of the projection's `x` or `w`; driver errors.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_conv_gates_proj_seq<T: CudaFloat>(
        &self,
        x: &impl DevicePtr<T>,
        x_stride: usize,
        proj: GateProj<'_, impl DevicePtr<T>, impl DevicePtr<T>>,
        w: &impl DevicePtr<f32>,
        a_log: &impl DevicePtr<f32>,
        dt_bias: &impl DevicePtr<f32>,
        window: &mut impl DevicePtrMut<f32>,
        spans: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<T>,
        g: &mut impl DevicePtrMut<f32>,
        beta: &mut impl DevicePtrMut<f32>,
        t: usize,
        n_spans: usize,
        c: usize,
        k: usize,
        win: usize,
        num_slots: usize,
        hv: usize,
    ) -> Result<()> {
        const NAME: &str = "gdn_conv_gates_proj_seq";
        let hidden = proj.hidden;
        if hidden == 0 {
            return Err(CudaError::Invalid(format!("{NAME}: hidden must be > 0")));
        }
        self.check("projection x", proj.x, prod(&[t, hidden])?)?;
        self.check("projection w", proj.w, prod(&[2, hv, hidden])?)?;
        // The decode GEMV's split for in_proj_ba's shape ([2·hv, hidden]): the same parts, so
        // the same bits (the kernel's vector path; the split does not matter to the other).
        let e = 16 / std::mem::size_of::<T>();
        let split = gemv_split(2 * hv, hidden / e, self.caps().sms);
        let rows_per_tile = super::gdn_seq::conv_tile_rows(t);
        let gb = gate_blocks(rows_per_tile, hv, split);
        let (px, _gx) = proj.x.device_ptr(&self.stream);
        let (pw, _gw) = proj.w.device_ptr(&self.stream);
        let gates =
            GateArgs::Proj { x: px, w: pw, hidden: u32_of("hidden", hidden)?, gb: gb as u32, split: split as u32 };
        let d = ConvGatesDims { t, n_spans, c, k, win, num_slots, hv };
        self.conv_gates_launch(NAME, x, x_stride, w, a_log, dt_bias, window, spans, out, g, beta, d, gates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A warp an (item, part) up to 16 blocks: 32 heads of one row at 4 parts → 16 blocks, at
    /// 1 part → 4, 8 heads at 2 parts → 2; 16 rows of 32 heads → the cap.
    #[test]
    fn gate_blocks_by_items() {
        assert_eq!(gate_blocks(1, 32, 4), 16);
        assert_eq!(gate_blocks(1, 32, 1), 4);
        assert_eq!(gate_blocks(1, 8, 2), 2);
        assert_eq!(gate_blocks(1, 3, 1), 1);
        assert_eq!(gate_blocks(16, 32, 4), MAX_GATE_BLOCKS);
        assert_eq!(gate_blocks(0, 32, 4), 1);
    }
}
