//! Host side of the warpgroup-MMA grouped GEMMs (kernels/cuda/moe_wgmma.cu,
//! `moe_wg_{gu,down}_*`, [`super::choice::MOE_GEMM_ENV`] = `wgmma`): where they run and their
//! launch shape. Tiles, column blocks and their chaining are the streamed GEMMs'
//! ([`super::pipe`]).

use crate::cuda::DeviceCaps;

/// Threads of the kernels (`MWG_THREADS`: two warpgroups).
pub(super) const THREADS: u32 = 256;
/// Weight rows of a column block (`MWG_WR`; gate+up: 128 gate and the 128 matching up rows,
/// 128 h columns; down: 256 o columns).
pub(super) const WR: usize = 256;
/// Most rows of a tile (`MWG_TM`).
const TM: usize = 128;
/// Dynamic shared memory of a launch: 4 stages of (256 weight + 128 token rows) × 128 bytes,
/// 8 warps' epilogue areas of 128 × 32 bytes, 1024 bytes of alignment slack.
pub(super) const SMEM: usize = 4 * (WR + TM) * 128 + 8 * TM * 32 + 1024;
/// Static shared memory of the kernels (the tile's pair ids).
const STATIC_SMEM: usize = TM * 4;

/// Whether the wgmma GEMMs run on a device of `caps`: sm_90 (their module is compiled for
/// sm_90a; nowhere else has the instructions), not forced to the fallback, their shared
/// memory within the limit.
pub(super) fn fits(caps: &DeviceCaps) -> bool {
    caps.sm90a() && SMEM + STATIC_SMEM <= caps.smem_limit()
}

#[cfg(test)]
mod tests {
    use super::{fits, SMEM};
    use crate::cuda::DeviceCaps;

    #[test]
    fn wg_fits() {
        assert_eq!(SMEM, 230_400);
        let h200 = DeviceCaps { major: 9, minor: 0, smem_optin: 232_448, forced: false, sms: 132 };
        assert!(fits(&h200));
        assert!(!fits(&DeviceCaps { forced: true, ..h200 }));
        assert!(!fits(&DeviceCaps { major: 8, minor: 0, smem_optin: 166_912, forced: false, sms: 108 }));
        assert!(!fits(&DeviceCaps { major: 10, minor: 0, ..h200 }));
    }
}
