//! Tensor-parallel sharding plans: which part of a checkpoint tensor each rank loads.
//!
//! A weight-map rule may say how its source tensors split over the ranks of a tensor-parallel
//! group (`shard = ...`, see [`crate::load::map_file`]). The split axis is the first dim
//! (`column`: a column-parallel projection's output rows, a vocab-parallel lm_head) or the last
//! dim (`row`: a row-parallel projection's input columns). Along it the tensor is `groups`
//! blocks (heads, say) of `parts` elements each, laid out group-major (`[g0: p0 p1 …][g1: …]`)
//! or, with `part_major`, part by part (`[p0 of every group][p1 of every group]…`):
//!
//! - `world ≤ groups`: `world` must divide `groups`; rank r takes groups
//!   `r·groups/world .. (r+1)·groups/world`, whole.
//! - `world > groups`: `groups` must divide `world`; the `m = world / groups` ranks of group
//!   `r / m` share it: a part marked `split` is cut in `m` (rank `r % m` takes piece `r % m`),
//!   any other part is replicated (the KV heads of GQA when there are more ranks than KV
//!   heads; the key heads of Gated DeltaNet when there are more ranks than key heads).
//!
//! A plain `column` / `row` split is `groups` = the axis length with one split part of 1.
//! Rules without `shard` are replicated.

use crate::bail;
pub use crate::comm::TpRank;
use crate::error::Result;
use crate::load::checkpoint::{as_bytes_mut, Checkpoint};
use crate::tensor::{CpuStorage, DType};
use half::{bf16, f16};

/// Which axis of a source tensor a shard cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardAxis {
    /// The first dim (output rows of a column-parallel projection).
    Column,
    /// The last dim (input columns of a row-parallel projection).
    Row,
}

/// A resolved sharding plan of one rule (sizes evaluated against the config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub axis: ShardAxis,
    /// Blocks along the axis that are never cut between ranks unless a part is `split`.
    pub groups: usize,
    /// Elements of each part in one group.
    pub parts: Vec<usize>,
    /// Per part: cut among the ranks that share a group (else replicated to them).
    pub split: Vec<bool>,
    /// Parts laid out one after the other, each holding every group (else group-major).
    pub part_major: bool,
}

impl Shard {
    /// A plain even split of `axis` of a tensor whose axis has `len` elements.
    pub fn plain(axis: ShardAxis, len: usize) -> Self {
        Self { axis, groups: len, parts: vec![1], split: vec![true], part_major: false }
    }

    /// Elements along the axis (`groups · Σparts`).
    pub fn len(&self) -> usize {
        self.groups * self.parts.iter().sum::<usize>()
    }

    /// Whether the plan covers nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `(start, len)` ranges along the axis that rank `tp.rank` loads, in order
    /// (adjacent ranges merged). Errors name the sizes that do not divide.
    pub fn ranges(&self, tp: TpRank) -> Result<Vec<(usize, usize)>> {
        let TpRank { rank, world } = tp;
        let (g, per_group) = (self.groups, self.parts.iter().sum::<usize>());
        if world == 0 || rank >= world {
            bail!(Config, "tensor-parallel rank {rank} of {world}");
        }
        if self.parts.len() != self.split.len() || g == 0 {
            bail!(Internal, "shard plan {self:?} is malformed");
        }
        // Offsets of each part inside a group (group-major) or of each part's block (part-major).
        let mut raw = Vec::new();
        if world <= g {
            if !g.is_multiple_of(world) {
                bail!(Config, "tensor-parallel size {world} does not divide {g} (groups of this tensor)");
            }
            let per = g / world;
            if self.part_major {
                let mut off = 0;
                for &p in &self.parts {
                    raw.push((off + rank * per * p, per * p));
                    off += g * p;
                }
            } else {
                raw.push((rank * per * per_group, per * per_group));
            }
        } else {
            if !world.is_multiple_of(g) {
                bail!(Config, "tensor-parallel size {world} is not a multiple of {g} (groups of this tensor)");
            }
            let (m, grp, j) = (world / g, rank / (world / g), rank % (world / g));
            let mut off = 0;
            for (&p, &split) in self.parts.iter().zip(&self.split) {
                let start = if self.part_major { off + grp * p } else { grp * per_group + off };
                if split {
                    if !p.is_multiple_of(m) {
                        bail!(Config, "tensor-parallel size {world}: {m} ranks cannot share a part of {p} elements");
                    }
                    raw.push((start + j * (p / m), p / m));
                } else {
                    raw.push((start, p));
                }
                off += if self.part_major { g * p } else { p };
            }
        }
        let mut out: Vec<(usize, usize)> = Vec::with_capacity(raw.len());
        for (s, l) in raw {
            match out.last_mut() {
                Some((ps, pl)) if *ps + *pl == s => *pl += l,
                _ => out.push((s, l)),
            }
        }
        Ok(out)
    }

    /// The groups and part sizes rank `tp` holds (for a `regroup` that follows the shard).
    pub fn local_layout(&self, tp: TpRank) -> (usize, Vec<usize>) {
        if tp.world <= self.groups {
            (self.groups / tp.world.max(1), self.parts.clone())
        } else {
            let m = tp.world / self.groups;
            (1, self.parts.iter().zip(&self.split).map(|(&p, &s)| if s { p / m } else { p }).collect())
        }
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let axis = match self.axis {
            ShardAxis::Column => "column",
            ShardAxis::Row => "row",
        };
        if self.parts == [1] && self.split == [true] {
            return write!(f, "tp:{axis}");
        }
        let parts: Vec<String> =
            self.parts.iter().zip(&self.split).map(|(p, s)| if *s { format!("{p}/") } else { p.to_string() }).collect();
        let major = if self.part_major { " part-major" } else { "" };
        write!(f, "tp:{axis}({}x[{}]{major})", self.groups, parts.join(", "))
    }
}

/// Copies the selected ranges of a row-major tensor `[d0, …, dn]` along `axis` into a new
/// buffer (`Column`: ranges of dim-0 rows; `Row`: ranges of the last dim in every row).
pub fn select<T: Copy>(v: &[T], shape: &[usize], axis: ShardAxis, ranges: &[(usize, usize)]) -> Vec<T> {
    let last = shape.last().copied().unwrap_or(1).max(1);
    match axis {
        ShardAxis::Column => {
            let row: usize = shape.iter().skip(1).product::<usize>().max(1);
            ranges.iter().flat_map(|&(s, l)| v[s * row..(s + l) * row].iter().copied()).collect()
        }
        ShardAxis::Row => {
            v.chunks(last).flat_map(|r| ranges.iter().flat_map(move |&(s, l)| r[s..s + l].iter().copied())).collect()
        }
    }
}

/// Rows of a row-parallel read taken per positioned read (bounded host memory).
const ROW_CHUNK_BYTES: usize = 16 << 20;

/// Reads rank's shard of checkpoint tensor `src` (`shape` as stored) in its own element type:
/// a column shard reads exactly its rows; a row shard reads the tensor in chunks of whole rows
/// (at most 16 MiB at a time) and keeps its columns of each row.
pub fn read_shard(
    ckpt: &Checkpoint,
    src: &str,
    shape: &[usize],
    axis: ShardAxis,
    ranges: &[(usize, usize)],
) -> Result<CpuStorage> {
    fn go<T: Copy + Default>(
        ckpt: &Checkpoint,
        src: &str,
        shape: &[usize],
        axis: ShardAxis,
        ranges: &[(usize, usize)],
    ) -> Result<Vec<T>> {
        let es = std::mem::size_of::<T>();
        let total: usize = shape.iter().product();
        let last = shape.last().copied().unwrap_or(1).max(1);
        let n: usize = ranges.iter().map(|r| r.1).sum();
        match axis {
            ShardAxis::Column => {
                let row = shape.iter().skip(1).product::<usize>().max(1);
                let mut out = vec![T::default(); n * row];
                let mut at = 0;
                for &(s, l) in ranges {
                    ckpt.read_bytes_at(src, s * row * es, as_bytes_mut(&mut out[at..at + l * row]))?;
                    at += l * row;
                }
                Ok(out)
            }
            ShardAxis::Row => {
                let rows = total / last;
                let per = (ROW_CHUNK_BYTES / (last * es)).max(1);
                let mut out = Vec::with_capacity(rows * n);
                let mut buf = vec![T::default(); per.min(rows) * last];
                let mut r0 = 0;
                while r0 < rows {
                    let k = per.min(rows - r0);
                    let chunk = &mut buf[..k * last];
                    ckpt.read_bytes_at(src, r0 * last * es, as_bytes_mut(chunk))?;
                    out.extend(select(chunk, &[k, last], ShardAxis::Row, ranges));
                    r0 += k;
                }
                Ok(out)
            }
        }
    }
    if cfg!(target_endian = "big") {
        bail!(Checkpoint, "sharded reads need a little-endian host");
    }
    Ok(match ckpt.dtype_of(src) {
        Some(DType::F32) => CpuStorage::F32(go::<f32>(ckpt, src, shape, axis, ranges)?),
        Some(DType::BF16) => CpuStorage::BF16(go::<bf16>(ckpt, src, shape, axis, ranges)?),
        Some(DType::F16) => CpuStorage::F16(go::<f16>(ckpt, src, shape, axis, ranges)?),
        None => bail!(DType, "tensor `{src}`: tensor parallelism loads f32, bf16 and f16 tensors (FP8 not yet)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(rank: usize, world: usize) -> TpRank {
        TpRank { rank, world }
    }

    #[test]
    fn plain_splits_evenly() {
        let s = Shard::plain(ShardAxis::Column, 8);
        assert_eq!(s.ranges(tp(0, 2)).unwrap(), vec![(0, 4)]);
        assert_eq!(s.ranges(tp(3, 4)).unwrap(), vec![(6, 2)]);
        assert!(s.ranges(tp(0, 3)).unwrap_err().to_string().contains("does not divide 8"));
        // More ranks than elements: a split part of 1 cannot be shared.
        assert!(Shard::plain(ShardAxis::Row, 2).ranges(tp(0, 4)).is_err());
    }

    /// KV heads (groups of head_dim, not split): more ranks than heads replicate each head to
    /// the ranks whose query heads use it.
    #[test]
    fn heads_replicate_past_their_count() {
        let kv = Shard { axis: ShardAxis::Column, groups: 2, parts: vec![3], split: vec![false], part_major: false };
        assert_eq!(kv.ranges(tp(1, 2)).unwrap(), vec![(3, 3)]);
        let four: Vec<_> = (0..4).map(|r| kv.ranges(tp(r, 4)).unwrap()).collect();
        assert_eq!(four, vec![vec![(0, 3)], vec![(0, 3)], vec![(3, 3)], vec![(3, 3)]]);
        assert!(kv.ranges(tp(0, 3)).is_err());
    }

    /// Qwen3-Next in_proj_qkvz, checkpoint layout per key head [q | k | v | z] with q, k
    /// replicated and v, z split when ranks outnumber key heads; and the part-major conv1d.
    #[test]
    fn gated_deltanet_groups() {
        let qkvz = Shard {
            axis: ShardAxis::Column,
            groups: 2,
            parts: vec![2, 2, 4, 4],
            split: vec![false, false, true, true],
            part_major: false,
        };
        assert_eq!(qkvz.ranges(tp(1, 2)).unwrap(), vec![(12, 12)]);
        assert_eq!(qkvz.ranges(tp(3, 4)).unwrap(), vec![(12, 4), (18, 2), (22, 2)]);
        assert_eq!(qkvz.local_layout(tp(3, 4)), (1, vec![2, 2, 2, 2]));
        assert_eq!(qkvz.local_layout(tp(1, 2)), (1, vec![2, 2, 4, 4]));
        let conv = Shard { part_major: true, parts: vec![2, 2, 4], split: vec![false, false, true], ..qkvz.clone() };
        // [q0 q1 | k0 k1 | v0 v1] with sizes 2, 2, 4 per group: offsets q 0, k 4, v 8.
        assert_eq!(conv.ranges(tp(1, 2)).unwrap(), vec![(2, 2), (6, 2), (12, 4)]);
        assert_eq!(conv.ranges(tp(2, 4)).unwrap(), vec![(2, 2), (6, 2), (12, 2)]);
        let v: Vec<u32> = (0..16).collect();
        assert_eq!(select(&v, &[16], ShardAxis::Column, &conv.ranges(tp(2, 4)).unwrap()), vec![2, 3, 6, 7, 12, 13]);
    }

    #[test]
    fn select_rows_and_columns() {
        let v: Vec<u32> = (0..12).collect(); // [3, 4]
        assert_eq!(select(&v, &[3, 4], ShardAxis::Column, &[(1, 2)]), (4..12).collect::<Vec<_>>());
        assert_eq!(select(&v, &[3, 4], ShardAxis::Row, &[(2, 2)]), vec![2, 3, 6, 7, 10, 11]);
        assert_eq!(select(&v, &[3, 4], ShardAxis::Row, &[(0, 4)]), v);
    }
}
