//! The device timeline ([`TIMELINE_ENV`]): where a graphed decode step's time goes, launch by
//! launch, measured in place on the device.
//!
//! Why: there is no Nsight Systems on the GPU machine, and under programmatic dependent launch
//! a kernel timed alone says little about what it costs a step (its start overlaps the launch
//! before it). Knock-out and knock-in ([`super::KNOCKOUT_ENV`], [`super::KNOCKIN_ENV`]) change
//! the step they measure (a knocked-out router leaves stale expert ids; a knocked-in weight
//! stream finds its bytes in L2). The timeline adds one timer read, a load and an atomic per
//! launch, and that only in the timeline's own build of the kernels (the sources get `#define
//! PORTER_TIMELINE`; the normal build has no trace of it): thread 0 of block 0 of every kernel
//! appends the `%globaltimer` time at which its PDL wait returned (`porter_tl_mark`,
//! kernels/cuda/common.cuh), which is when the launch before it completed. Launches pass their
//! waits one after another in stream order, so the difference between consecutive records is
//! each launch's cost on the critical path. (A first form read the buffer pointer in every
//! build, before the dependents' launch: that alone cost 3 % of the batch-1 step, session 26.)
//!
//! Use: `PORTER_TIMELINE=1 porter bench … --batch 1` prints, after a decode row, the captured
//! graph's launches in order with their mean in-place µs, and the totals by kernel name. The
//! records map to names through the launches issued while the stream was capturing.

use cudarc::driver::{CudaModule, CudaSlice, CudaStream};
use std::collections::BTreeMap;
use std::sync::Arc;

use super::{CudaError, Result};

/// Environment variable (diagnostic): `1` (or any record count from 1,000 up) turns the device
/// timeline on, with room for that many records (`1`: 1,048,576).
pub const TIMELINE_ENV: &str = "PORTER_TIMELINE";

/// The device symbol every module's `porter_tl_mark` reads (common.cuh).
const SYMBOL: &str = "porter_tl_buf";

/// Records kept when [`TIMELINE_ENV`] is `1`.
const DEFAULT_RECORDS: usize = 1 << 20;

/// The record count [`TIMELINE_ENV`] asks for, if any (a warning and none for a bad value);
/// read once a process (the kernels' text depends on it: `KernelSource::full_text`).
pub(crate) fn records_from_env() -> Option<usize> {
    static R: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *R.get_or_init(read_env)
}

fn read_env() -> Option<usize> {
    match super::env_count(TIMELINE_ENV, |n| n <= 1 || n >= 1000, "0, 1 or a record count >= 1000") {
        None | Some(0) => None,
        Some(1) => Some(DEFAULT_RECORDS),
        n => n,
    }
}

/// The timeline's device buffer: `[count, length, records...]` in u64 words.
#[derive(Debug)]
pub(crate) struct Timeline {
    buf: CudaSlice<u64>,
    /// The names of the launches issued while the stream was capturing.
    log: CaptureLog,
}

/// Entry-point names of the launches issued while the stream was capturing, in order, one list
/// a capture (a launch outside a capture ends the list: a graph's capture follows an eager run
/// of the same forward).
#[derive(Debug, Default)]
struct CaptureLog {
    captures: Vec<Vec<String>>,
    /// Whether the last launch noted was captured.
    in_capture: bool,
}

impl CaptureLog {
    fn note(&mut self, name: &str, captured: bool) {
        if captured {
            if !self.in_capture {
                self.captures.push(Vec::new());
            }
            if let Some(g) = self.captures.last_mut() {
                g.push(name.to_owned());
            }
        }
        self.in_capture = captured;
    }

    /// The last capture's names (none before any capture).
    fn last(&self) -> Vec<String> {
        self.captures.last().cloned().unwrap_or_default()
    }
}

impl Timeline {
    /// A buffer of `records` records on `stream`, empty.
    pub(crate) fn new(stream: &Arc<CudaStream>, records: usize) -> Result<Self> {
        let mut buf = stream.alloc_zeros::<u64>(records + 2)?;
        stream.memcpy_htod(&[0u64, (records + 2) as u64], &mut buf.slice_mut(0..2))?;
        Ok(Self { buf, log: CaptureLog::default() })
    }

    /// Points module `m`'s `porter_tl_buf` at the buffer.
    pub(crate) fn attach(&self, m: &Arc<CudaModule>, stream: &Arc<CudaStream>) -> Result<()> {
        let (addr, _g) = cudarc::driver::DevicePtr::device_ptr(&self.buf, stream);
        let mut sym = m.get_global(SYMBOL, stream)?;
        if sym.len() != 8 {
            return Err(CudaError::Invalid(format!("{SYMBOL}: {} bytes, expected 8", sym.len())));
        }
        stream.memcpy_htod(&addr.to_le_bytes(), &mut sym)?;
        Ok(())
    }

    /// Notes a launch: `captured`, issued while the stream was capturing.
    pub(crate) fn note(&mut self, name: &str, captured: bool) {
        self.log.note(name, captured);
    }

    /// Forgets the records and the captured names.
    pub(crate) fn reset(&mut self, stream: &Arc<CudaStream>, names: bool) -> Result<()> {
        stream.memcpy_htod(&[0u64], &mut self.buf.slice_mut(0..1))?;
        if names {
            self.log = CaptureLog::default();
        }
        Ok(())
    }

    /// The records taken since the last reset (synchronises the stream), and the last capture's
    /// launch names.
    pub(crate) fn read(&self, stream: &Arc<CudaStream>) -> Result<(Vec<u64>, Vec<String>)> {
        // The count first, then only the records taken (not the whole buffer).
        let count = stream.clone_dtoh(&self.buf.slice(0..1))?;
        let n = usize::try_from(count[0]).unwrap_or(usize::MAX).min(self.buf.len() - 2);
        let rec = stream.clone_dtoh(&self.buf.slice(2..2 + n))?;
        Ok((rec, self.log.last()))
    }
}

/// One launch of a graph's step: its name and mean cost in place (ns).
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineRow {
    /// Entry-point name.
    pub name: String,
    /// Mean time from the previous launch's record to this one's next neighbour's (ns): the
    /// time this launch held the critical path.
    pub mean_ns: f64,
}

/// A decode row's timeline, analysed ([`analyse`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineReport {
    /// Launches a step (the captured graph's).
    pub per_step: usize,
    /// Steps analysed.
    pub steps: usize,
    /// The step's launches in order.
    pub rows: Vec<TimelineRow>,
    /// Mean time from the last launch's record of a step to the first one's of the next (ns):
    /// the last launch and the host's gap between replays.
    pub between_ns: f64,
    /// Records left over in front of the whole steps (0 when every step replayed the graph
    /// whose names are given; more when other launches ran between them).
    pub leftover: usize,
}

/// Analyses `records` (timer values in record order) taken over replays of a graph whose
/// launches are `names`: record `i` of a step is launch `i`'s wait returning, so launch `i`'s
/// cost in place is record `i + 1` − record `i` (the last launch's runs into the next step's
/// first record, with the host's gap: [`TimelineReport::between_ns`]). Records before the
/// first whole step (warm-up launches outside the graph) are skipped from the front until the
/// count is a multiple of the step.
///
/// # Errors
/// A message when there are no names or fewer than two steps of records.
pub fn analyse(records: &[u64], names: &[String]) -> std::result::Result<TimelineReport, String> {
    let m = names.len();
    if m == 0 {
        return Err("no launches were captured (a graphed decode step is needed)".into());
    }
    let steps = records.len() / m;
    if steps < 2 {
        return Err(format!("{} records for a step of {m} launches: fewer than two steps", records.len()));
    }
    let r = &records[records.len() - steps * m..];
    let mut sum = vec![0f64; m];
    let mut between = 0f64;
    for s in 0..steps {
        let st = &r[s * m..(s + 1) * m];
        for i in 0..m - 1 {
            sum[i] += st[i + 1].saturating_sub(st[i]) as f64;
        }
        if s + 1 < steps {
            between += r[(s + 1) * m].saturating_sub(st[m - 1]) as f64;
        }
    }
    let rows = names
        .iter()
        .zip(&sum)
        .enumerate()
        .map(|(i, (n, &v))| TimelineRow {
            name: n.clone(),
            mean_ns: if i + 1 < m { v / steps as f64 } else { f64::NAN },
        })
        .collect();
    Ok(TimelineReport {
        per_step: m,
        steps,
        rows,
        between_ns: between / (steps - 1) as f64,
        leftover: records.len() - steps * m,
    })
}

impl TimelineReport {
    /// Totals by entry-point name: (name, launches a step, µs a step), largest first.
    pub fn by_name(&self) -> Vec<(String, usize, f64)> {
        let mut t: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
        for r in &self.rows {
            if r.mean_ns.is_finite() {
                let e = t.entry(r.name.as_str()).or_default();
                e.0 += 1;
                e.1 += r.mean_ns / 1e3;
            }
        }
        let mut v: Vec<(String, usize, f64)> = t.into_iter().map(|(n, (c, us))| (n.to_owned(), c, us)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_log_keeps_each_capture_apart() {
        let mut l = CaptureLog::default();
        assert!(l.last().is_empty());
        for (n, c) in [("eager", false), ("a", true), ("b", true), ("eager", false), ("c", true)] {
            l.note(n, c);
        }
        assert_eq!(l.captures, vec![vec!["a".to_string(), "b".to_string()], vec!["c".to_string()]]);
        assert_eq!(l.last(), vec!["c".to_string()]);
    }

    #[test]
    fn analyse_takes_differences_of_whole_steps() {
        let names: Vec<String> = ["a", "b", "a"].iter().map(|s| s.to_string()).collect();
        // One warm-up record, then two steps: a at 100, b at 103, a at 110; then 200, 204, 209.
        let rec = [7, 100, 103, 110, 200, 204, 209];
        let r = analyse(&rec, &names).expect("two steps");
        assert_eq!((r.per_step, r.steps, r.leftover), (3, 2, 1));
        assert_eq!(r.rows[0].mean_ns, 3.5);
        assert_eq!(r.rows[1].mean_ns, 6.0);
        assert!(r.rows[2].mean_ns.is_nan());
        assert_eq!(r.between_ns, 90.0);
        let by = r.by_name();
        assert_eq!(by[0], ("b".to_string(), 1, 0.006));
        assert_eq!(by[1], ("a".to_string(), 1, 0.0035));
        assert!(analyse(&rec[..4], &names).is_err());
        assert!(analyse(&rec, &[]).is_err());
    }
}
