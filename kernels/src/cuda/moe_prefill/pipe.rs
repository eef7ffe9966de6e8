//! Host side of the streamed grouped GEMMs (kernels/cuda/moe_prefill.cu §3,
//! `moe_gemm_{gu,down}_pipe{MI}_s{S}_*`, [`super::choice::MOE_GEMM_ENV`] = `pipe`): tile
//! height, cp.async stages and the column blocks a CTA runs.

/// Bytes of a staged row of a k-step (`MOE_PIPE_BK` = 64 elements of 2 bytes).
const ROW_BYTES: usize = 128;
/// Weight rows of a column block (`MOE_PIPE_BN`; gate+up: 128 gate and the 128 matching up
/// rows, 128 h columns; down: 256 o columns).
pub(super) const BN: usize = 256;
/// Threads of the kernels (`MOE_PIPE_THREADS`, 8 warps).
pub(super) const THREADS: u32 = 256;
/// Row fragments built (`MI`: tiles of 64 and 128 rows).
pub(super) const FRAGS: [usize; 2] = [4, 8];
/// cp.async stage counts built, most first.
const STAGES: [usize; 2] = [4, 3];

/// Environment variable: column blocks a CTA runs (1..=nblk; unset or another value: the
/// host's choice, [`cols_per_cta`]). For A/B runs.
pub const MOE_PIPE_COLS_ENV: &str = "PORTER_MOE_PIPE_COLS";

/// Dynamic shared memory of `stages` stages of a tile of `16·mi` rows and [`BN`] weight rows.
pub(super) fn smem(mi: usize, stages: usize) -> usize {
    stages * (16 * mi + BN) * ROW_BYTES
}

/// The most stages built (4, then 3) of tiles of `16·mi` rows within `limit` bytes of shared
/// memory (sm_90: 4; sm_80: 3; sm_86 / sm_89: none, the other GEMMs run).
pub(super) fn stages(mi: usize, limit: usize) -> Option<usize> {
    STAGES.into_iter().find(|&s| smem(mi, s) <= limit)
}

/// Row fragments (tiles of `16·mi` rows, one of [`FRAGS`]) for `t` rows with `k` experts
/// each out of `e`: the smallest tile that holds an expert's rows with high probability
/// (Poisson counts of mean λ = t·k/e: λ + 3√λ + 1 rows), else the largest (experts past 128
/// rows take several tiles). One tile an expert reads its weights once.
pub(super) fn frags(t: usize, k: usize, e: usize) -> usize {
    let lambda = t as f64 * k as f64 / e.max(1) as f64;
    let rows = lambda + 3.0 * lambda.sqrt() + 1.0;
    FRAGS.into_iter().find(|&mi| (16 * mi) as f64 >= rows).unwrap_or(8)
}

/// Column blocks a CTA runs in one pipeline out of `nblk`: the most (a divisor of `nblk`)
/// that still leaves at least 4 CTAs an SM for `tiles` tiles on `sms` multiprocessors, at
/// least 1; [`MOE_PIPE_COLS_ENV`] overrides it with a value in 1..=nblk.
pub(super) fn cols_per_cta(nblk: usize, tiles: usize, sms: usize) -> usize {
    let forced = std::env::var(MOE_PIPE_COLS_ENV).ok().and_then(|v| v.trim().parse::<usize>().ok());
    if let Some(c) = forced.filter(|c| (1..=nblk).contains(c)) {
        return c;
    }
    (1..=nblk.max(1)).rev().filter(|d| nblk.is_multiple_of(*d)).find(|d| tiles * (nblk / d) >= 4 * sms).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::{cols_per_cta, frags, smem, stages};

    #[test]
    fn pipe_shapes() {
        // 80B at t = 4096 (λ = 80: 107 rows), 1024 (λ = 20: 35 rows), 512 (λ = 10).
        assert_eq!(frags(4096, 10, 512), 8);
        assert_eq!(frags(1024, 10, 512), 4);
        assert_eq!(frags(512, 10, 512), 4);
        assert_eq!(frags(1 << 20, 10, 512), 8);
        assert_eq!(smem(8, 4), 192 * 1024);
        assert_eq!(stages(8, 227 * 1024), Some(4));
        assert_eq!(stages(8, 163 * 1024), Some(3));
        assert_eq!(stages(8, 99 * 1024), None);
        assert_eq!(stages(4, 163 * 1024), Some(4));
        // t = 4096: 512 tiles on 132 SMs: gate+up (4 column blocks) 2 a CTA, down (8) 4.
        assert_eq!(cols_per_cta(4, 512, 132), 2);
        assert_eq!(cols_per_cta(8, 512, 132), 4);
        assert_eq!(cols_per_cta(4, 10, 132), 1);
        assert_eq!(cols_per_cta(1, 10_000, 132), 1);
    }
}
