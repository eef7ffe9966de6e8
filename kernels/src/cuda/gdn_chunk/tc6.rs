//! The `tc6` form of [`CudaKernels::gdn_chunked_seq`](super::CudaKernels::gdn_chunked_seq)
//! (`PORTER_GDN_CHUNK=tc6`, opt-in): tc5 with the wu launch `gdn_chunk_tc6_wu_d<dk>_<T>`
//! (kernels/cuda/gdn_chunk_tc6.cu), one block per (chunk, pair of value heads 2p, 2p + 1),
//! which share a key head where hv / hk is even: K and Q are loaded, normalised and multiplied
//! (Q Kᵀ, K Kᵀ) once for both heads instead of once each. It writes tc4's scratch with tc4's
//! bits, and the launch itself is queued by [`CudaKernels::gdn_tc3`](super::CudaKernels) with
//! `hv / 2` blocks in y. Where hv / hk is odd, tc5 did not get its own state sweep, or the
//! shared memory does not fit, the call runs exactly as tc5.

use super::super::DeviceCaps;
use super::tc3::Tc3Smem;
use super::GC_C;

/// Static shared memory of `gdn_chunk_tc6_wu` counted against the device's limit besides the
/// dynamic part: G (f64) and β, e^G, e^(G_last − G) (f32) for two heads, 2,560 bytes (ptxas),
/// rounded up.
const TC6_STATIC_SMEM: usize = 3072;

/// Dynamic shared memory of `gdn_chunk_tc6_wu_d<dk>` (`GT6_WU_SMEM`), bytes: Kb, Qb
/// (`T [64][dk + 8]`), Vb (`T [2][64][dv + 8]`), As (`f32 [2][64][68]`).
pub(super) fn tc6_wu_smem(dk: usize, dv: usize) -> usize {
    4 * GC_C * (dk + 8) + 4 * GC_C * (dv + 8) + 8 * GC_C * 68
}

/// `m` (tc5's choice) with the tc6 wu launch where it applies: hv / hk even (each block's two
/// value heads share a key head, tc4's mapping `j / (hv / hk)`), `m` running tc4's wu launch
/// and tc5's state sweep, and the shared memory fitting the device; else `m` unchanged.
pub(super) fn tc6_wu(m: Tc3Smem, dk: usize, dv: usize, hk: usize, hv: usize, caps: DeviceCaps) -> Tc3Smem {
    let pairs = hk > 0 && hv.is_multiple_of(hk) && (hv / hk).is_multiple_of(2);
    let wu = tc6_wu_smem(dk, dv);
    if pairs && m.tc4 && m.pair && wu + TC6_STATIC_SMEM <= caps.smem_limit() {
        Tc3Smem { wu, tc6: true, ..m }
    } else {
        m
    }
}

#[cfg(test)]
mod tests {
    use super::super::tc3::{tc3_smem, tc4_wu, tc5_state};
    use super::*;

    fn caps(major: i32, smem_optin: usize) -> DeviceCaps {
        DeviceCaps { major, minor: 0, smem_optin, forced: false, sms: 132 }
    }

    /// tc5's choice for the dims (as `gdn_chunked_impl`).
    fn tc5(dk: usize, dv: usize, caps: DeviceCaps) -> Tc3Smem {
        let m = tc3_smem(dk, dv, 2, caps).expect("tc3 fits");
        tc5_state(tc4_wu(m, dk, dv, caps), dk, dv, caps)
    }

    #[test]
    fn tc6_wu_smem_layout() {
        let h200 = caps(9, 227 * 1024);
        // 80B dims: Kb, Qb 2 · 17 408, Vb 2 · 17 408, As 2 · 17 408 = 102 KiB: with 2.5 KiB static
        // and 1 KiB reserved a block, still 2 blocks an SM (228 KiB), as tc4.
        assert_eq!(tc6_wu_smem(128, 128), 104_448);
        assert!(2 * (tc6_wu_smem(128, 128) + 2560 + 1024) <= 228 * 1024);
        assert_eq!(tc6_wu_smem(64, 64), 4 * 64 * 72 * 2 + 8 * 64 * 68);
        assert_eq!(tc6_wu_smem(128, 256), 34_816 + 67_584 + 34_816);
        let m5 = tc5(128, 128, h200);
        assert!(m5.pair && m5.tc4 && !m5.tc6);
        let m6 = tc6_wu(m5, 128, 128, 16, 32, h200);
        assert_eq!((m6.wu, m6.tc4, m6.tc6, m6.nw, m6.state, m6.pair), (104_448, true, true, 2, m5.state, true));
        // hv / hk = 4 pairs too; 1 and 3 do not (and a zero hk, before the dims are checked).
        assert!(tc6_wu(m5, 128, 128, 8, 32, h200).tc6);
        for (hk, hv) in [(32, 32), (1, 3), (2, 6), (0, 32), (5, 32)] {
            assert_eq!(tc6_wu(m5, 128, 128, hk, hv, h200), m5, "hk {hk} hv {hv}");
        }
        // Without tc5's state sweep or tc4's wu launch: unchanged (exactly what tc5 runs).
        let m4 = Tc3Smem { pair: false, ..m5 };
        assert_eq!(tc6_wu(m4, 128, 128, 16, 32, h200), m4);
        let m3 = Tc3Smem { tc4: false, ..m5 };
        assert_eq!(tc6_wu(m3, 128, 128, 16, 32, h200), m3);
        // Too little shared memory for the pair's block: unchanged.
        let small = caps(8, 100 * 1024);
        assert_eq!(tc6_wu(m5, 128, 128, 16, 32, small), m5);
        // An A100 (163 KiB): dk = 64 keeps tc5's pairs, and tc6 fits.
        let a100 = caps(8, 163 * 1024);
        assert!(tc6_wu(tc5(64, 64, a100), 64, 64, 1, 2, a100).tc6);
    }
}
