//! Collective communication between the ranks of a tensor-parallel group.
//!
//! A [`Communicator`] is one rank's end of a group: `all_reduce_sum` after a row-parallel
//! projection, `all_gather_last` after the vocab-parallel lm_head. A [`TpGroup`] runs one
//! closure per rank, each on its own thread, at once (collectives block until every rank
//! arrives) and releases the other ranks when one fails, so an error never becomes a hang.
//!
//! [`LocalGroup`] is the in-process implementation (one thread per rank, shared memory): it
//! runs tensor parallelism on the CPU. [`nccl::NcclComm`] is one GPU's end of an NCCL group
//! (one thread per GPU, `ncclCommInitRank` with a shared unique id). Every rank sums the partials in rank order, so all ranks
//! hold bit-identical results and their replicated computations stay in lockstep.

pub mod nccl;

use crate::bail;
use crate::error::Result;
use crate::tensor::Tensor;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The rank of a tensor-parallel group and the group's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpRank {
    pub rank: usize,
    pub world: usize,
}

impl TpRank {
    /// No tensor parallelism.
    pub const SINGLE: TpRank = TpRank { rank: 0, world: 1 };
}

/// One rank's end of a tensor-parallel group.
pub trait Communicator: Send + Sync + fmt::Debug {
    /// This rank and the group size.
    fn tp(&self) -> TpRank;

    /// Sums `t` over the ranks in place (every rank passes the same shape and dtype); the
    /// result is rounded once to `t`'s dtype and identical on every rank.
    ///
    /// # Shapes
    /// `[.., n]` → `[.., n]`
    fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()>;

    /// Concatenates every rank's `t` along the last dim, in rank order.
    ///
    /// # Shapes
    /// `[R, c_r]` on rank r → `[R, Σ c_r]` on every rank
    fn all_gather_last(&self, t: &Tensor) -> Result<Tensor>;
}

/// A tensor-parallel group: its ranks' communicators and a way to run all ranks at once.
pub trait TpGroup: Send + Sync + fmt::Debug {
    /// Ranks in the group.
    fn world(&self) -> usize;

    /// Rank `rank`'s communicator (`rank < world()`; callers iterate the group's ranks).
    fn comm(&self, rank: usize) -> Arc<dyn Communicator>;

    /// Runs `f(rank)` for every rank, each on its own thread, concurrently, and waits for all.
    /// When a rank fails, the others are released from their collectives with an error; the
    /// first rank's own error is returned (not an "aborted" one), and the group is usable again.
    fn run(&self, f: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()>;
}

/// Runs `f` on every rank of `group` and returns the results in rank order.
pub fn run_ranks<R: Send>(group: &dyn TpGroup, f: impl Fn(usize) -> Result<R> + Sync) -> Result<Vec<R>> {
    let out: Vec<Mutex<Option<R>>> = (0..group.world()).map(|_| Mutex::new(None)).collect();
    group.run(&|r| {
        let v = f(r)?;
        *out[r].lock().map_err(|_| crate::err!(Internal, "rank {r}: result lock poisoned"))? = Some(v);
        Ok(())
    })?;
    out.into_iter()
        .enumerate()
        .map(|(r, m)| m.into_inner().ok().flatten().ok_or_else(|| crate::err!(Internal, "rank {r} returned no result")))
        .collect()
}

/// One rank's contribution to a collective: its tensor's shape and values.
type Part = Arc<(Vec<usize>, Vec<f32>)>;

#[derive(Debug, Default)]
struct State {
    /// Each rank's contribution to the current collective.
    bufs: Vec<Option<Part>>,
    arrived: usize,
    generation: u64,
    aborted: bool,
}

#[derive(Debug)]
struct Shared {
    world: usize,
    state: Mutex<State>,
    cv: Condvar,
}

const ABORTED: &str = "tensor-parallel collective aborted: another rank failed";

impl Shared {
    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| crate::err!(Internal, "tensor-parallel group lock poisoned"))
    }

    /// A barrier that an abort releases with an error.
    fn barrier<'a>(&'a self, mut st: MutexGuard<'a, State>) -> Result<MutexGuard<'a, State>> {
        if st.aborted {
            bail!(Internal, "{ABORTED}");
        }
        let gen = st.generation;
        st.arrived += 1;
        if st.arrived == self.world {
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(st);
        }
        while st.generation == gen && !st.aborted {
            st = self.cv.wait(st).map_err(|_| crate::err!(Internal, "tensor-parallel group lock poisoned"))?;
        }
        if st.generation == gen {
            bail!(Internal, "{ABORTED}");
        }
        Ok(st)
    }

    /// Deposits `mine` for `rank`, waits for every rank, hands back all contributions (rank
    /// order), then waits again so no rank overwrites its slot before everyone has read.
    fn exchange<T>(
        &self,
        rank: usize,
        mine: (Vec<usize>, Vec<f32>),
        f: impl FnOnce(&[Part]) -> Result<T>,
    ) -> Result<T> {
        let mut st = self.lock()?;
        st.bufs[rank] = Some(Arc::new(mine));
        let st = self.barrier(st)?;
        let all: Vec<_> = st.bufs.iter().flatten().cloned().collect();
        drop(st);
        let res = if all.len() == self.world { f(&all) } else { Err(crate::err!(Internal, "{ABORTED}")) };
        let st = self.barrier(self.lock()?)?;
        drop(st);
        res
    }
}

/// One rank of a [`LocalGroup`].
#[derive(Debug)]
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl Communicator for LocalComm {
    fn tp(&self) -> TpRank {
        TpRank { rank: self.rank, world: self.shared.world }
    }

    fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()> {
        if self.shared.world == 1 {
            return Ok(());
        }
        let (shape, dtype, device) = (t.shape().to_vec(), t.dtype(), t.device());
        let sum = self.shared.exchange(self.rank, (shape.clone(), t.host_vec()?), |all| {
            if let Some(bad) = all.iter().position(|b| b.0 != shape) {
                bail!(Shape, "all-reduce: rank {bad} passed {:?}, rank {} {shape:?}", all[bad].0, self.rank);
            }
            let mut sum = all[0].1.clone();
            for b in &all[1..] {
                for (s, v) in sum.iter_mut().zip(&b.1) {
                    *s += v;
                }
            }
            Ok(sum)
        })?;
        *t = Tensor::from_vec(sum, shape, dtype)?.into_device(device)?;
        Ok(())
    }

    fn all_gather_last(&self, t: &Tensor) -> Result<Tensor> {
        let (shape, dtype, device) = (t.shape().to_vec(), t.dtype(), t.device());
        if self.shared.world == 1 {
            return t.try_clone();
        }
        let rows = t.rows();
        let v = self.shared.exchange(self.rank, (shape.clone(), t.host_vec()?), |all| {
            if all.iter().any(|b| b.0.len() != shape.len() || b.0[..b.0.len() - 1] != shape[..shape.len() - 1]) {
                bail!(Shape, "all-gather: ranks passed different leading shapes ({:?} on rank {})", shape, self.rank);
            }
            let widths: Vec<usize> = all.iter().map(|b| b.0.last().copied().unwrap_or(1)).collect();
            let total: usize = widths.iter().sum();
            let mut out = Vec::with_capacity(rows * total);
            for r in 0..rows {
                for (b, &w) in all.iter().zip(&widths) {
                    out.extend_from_slice(&b.1[r * w..(r + 1) * w]);
                }
            }
            Ok((out, total))
        })?;
        let mut out_shape = shape;
        if let Some(l) = out_shape.last_mut() {
            *l = v.1;
        }
        Tensor::from_vec(v.0, out_shape, dtype)?.into_device(device)
    }
}

/// An in-process tensor-parallel group: one thread per rank, collectives through shared
/// memory.
#[derive(Debug, Clone)]
pub struct LocalGroup {
    comms: Vec<Arc<LocalComm>>,
    shared: Arc<Shared>,
}

impl LocalGroup {
    /// A group of `world` ranks.
    pub fn new(world: usize) -> Result<Self> {
        if world == 0 {
            bail!(Config, "tensor-parallel size must be at least 1");
        }
        let shared = Arc::new(Shared {
            world,
            state: Mutex::new(State { bufs: vec![None; world], ..Default::default() }),
            cv: Condvar::new(),
        });
        let comms = (0..world).map(|rank| Arc::new(LocalComm { rank, shared: shared.clone() })).collect();
        Ok(Self { comms, shared })
    }

    fn set_aborted(&self, v: bool) {
        if let Ok(mut st) = self.shared.state.lock() {
            st.aborted = v;
            if v {
                self.shared.cv.notify_all();
            } else {
                st.arrived = 0;
                st.bufs.iter_mut().for_each(|b| *b = None);
            }
        }
    }
}

impl TpGroup for LocalGroup {
    fn world(&self) -> usize {
        self.comms.len()
    }

    fn comm(&self, rank: usize) -> Arc<dyn Communicator> {
        self.comms[rank].clone()
    }

    fn run(&self, f: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()> {
        let world = self.world();
        let go = |r: usize| {
            let res = f(r);
            if res.is_err() {
                self.set_aborted(true);
            }
            res
        };
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (1..world).map(|r| s.spawn(move || go(r))).collect();
            let mut out = vec![go(0)];
            for h in handles {
                out.push(h.join().unwrap_or_else(|_| Err(crate::err!(Internal, "a tensor-parallel rank panicked"))));
            }
            out
        });
        let failed = results.iter().any(|r| r.is_err());
        if failed {
            self.set_aborted(false);
        }
        // The first error that is not another rank's abort.
        let mut first = None;
        for r in results {
            if let Err(e) = r {
                let own = !e.to_string().contains(ABORTED);
                if own {
                    return Err(e);
                }
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn all_reduce_and_all_gather_across_threads() {
        for world in [1, 2, 4] {
            let g = LocalGroup::new(world).unwrap();
            let out = run_ranks(&g, |r| {
                let c = g.comm(r);
                let mut t = Tensor::from_vec(vec![r as f32 + 1.0, 10.0 * r as f32], [1, 2], DType::F32)?;
                c.all_reduce_sum(&mut t)?;
                let part = Tensor::from_vec(vec![r as f32; 2 * (r + 1)], [2, r + 1], DType::F32)?;
                let all = c.all_gather_last(&part)?;
                Ok((t.host_vec()?, all.shape().to_vec(), all.host_vec()?))
            })
            .unwrap();
            let n = world as f32;
            for (sum, shape, gathered) in &out {
                assert_eq!(sum, &vec![n * (n + 1.0) / 2.0, 10.0 * n * (n - 1.0) / 2.0]);
                let w: usize = (1..=world).sum();
                assert_eq!(shape, &vec![2, w]);
                let row: Vec<f32> = (0..world).flat_map(|r| vec![r as f32; r + 1]).collect();
                assert_eq!(gathered, &[row.clone(), row].concat());
            }
        }
    }

    /// Bf16 partials are summed in f32 and rounded once.
    #[test]
    fn bf16_sum_is_rounded_once() {
        let g = LocalGroup::new(2).unwrap();
        let out = run_ranks(&g, |r| {
            let mut t = Tensor::from_vec(vec![if r == 0 { 1.0 } else { 1.0 / 512.0 }], [1, 1], DType::BF16)?;
            g.comm(r).all_reduce_sum(&mut t)?;
            t.host_vec()
        })
        .unwrap();
        assert_eq!(out[0], vec![DType::BF16.round(1.0 + 1.0 / 512.0)]);
        assert_eq!(out[0], out[1]);
    }

    /// A rank that fails before a collective releases the others with an error (no hang),
    /// its own error is the one returned, and the group works again afterwards.
    #[test]
    fn a_failing_rank_releases_the_others() {
        let g = LocalGroup::new(3).unwrap();
        let e = g
            .run(&|r| {
                if r == 1 {
                    bail!(Input, "rank one broke");
                }
                let mut t = Tensor::from_vec(vec![1.0], [1], DType::F32)?;
                g.comm(r).all_reduce_sum(&mut t)
            })
            .unwrap_err();
        assert!(e.to_string().contains("rank one broke"), "{e}");
        let sums = run_ranks(&g, |r| {
            let mut t = Tensor::from_vec(vec![1.0], [1], DType::F32)?;
            g.comm(r).all_reduce_sum(&mut t)?;
            t.host_vec()
        })
        .unwrap();
        assert_eq!(sums, vec![vec![3.0]; 3]);
        // Mismatched shapes are an error on every rank, not a hang.
        let e = g
            .run(&|r| {
                let mut t = Tensor::from_vec(vec![1.0; r + 1], [r + 1], DType::F32)?;
                g.comm(r).all_reduce_sum(&mut t)
            })
            .unwrap_err();
        assert!(e.to_string().contains("all-reduce"), "{e}");
    }
}
