//! Per-block time accounting for `porter bench`. `PORTER_PROFILE=1`: each profiled block
//! synchronises the stream before and after itself, so the numbers are the device time of
//! the block alone (the synchronisation slows the whole run; use for shares, not for
//! throughput). `PORTER_PROFILE=host`: no synchronisation; the numbers are the host's time to
//! issue each block (argument checks, uploads, allocations, launches), which is what bounds
//! a step when the host issue time reaches the step time. Nested blocks (the GEMMs inside a
//! MoE) are counted in both.

use crate::tensor::cuda::Gpu;
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

fn table() -> &'static Mutex<BTreeMap<&'static str, (f64, usize)>> {
    static T: OnceLock<Mutex<BTreeMap<&'static str, (f64, usize)>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Whether `PORTER_PROFILE` is set (read once).
pub fn enabled() -> bool {
    mode() != Mode::Off
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    /// Device time per block (synchronised).
    Device,
    /// Host issue time per block (not synchronised).
    Host,
}

fn mode() -> Mode {
    static E: OnceLock<Mode> = OnceLock::new();
    *E.get_or_init(|| match std::env::var("PORTER_PROFILE").as_deref() {
        Err(_) | Ok("") | Ok("0") => Mode::Off,
        Ok("host") => Mode::Host,
        Ok(_) => Mode::Device,
    })
}

/// A timed region; `None` (free) unless profiling is on.
pub struct Span<'a> {
    name: &'static str,
    gpu: &'a Gpu,
    t0: Instant,
}

pub fn span<'a>(name: &'static str, gpu: &'a Gpu) -> Option<Span<'a>> {
    if !enabled() {
        return None;
    }
    if mode() == Mode::Device {
        let _ = gpu.sync();
    }
    Some(Span { name, gpu, t0: Instant::now() })
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        if mode() == Mode::Device {
            let _ = self.gpu.sync();
        }
        let dt = self.t0.elapsed().as_secs_f64();
        let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
        let e = t.entry(self.name).or_insert((0.0, 0));
        e.0 += dt;
        e.1 += 1;
    }
}

/// `(block, seconds, calls)` since the last reset, and resets.
pub fn take() -> Vec<(&'static str, f64, usize)> {
    let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
    let v = t.iter().map(|(k, (s, n))| (*k, *s, *n)).collect();
    t.clear();
    v
}

/// A region timed on the host only (`PORTER_PROFILE=host`; `None` otherwise): model-level
/// steps around the kernels (cache preparation, whole layers, the logits).
pub struct HostSpan {
    name: &'static str,
    t0: Instant,
}

pub fn host_span(name: &'static str) -> Option<HostSpan> {
    (mode() == Mode::Host).then(|| HostSpan { name, t0: Instant::now() })
}

impl Drop for HostSpan {
    fn drop(&mut self) {
        let dt = self.t0.elapsed().as_secs_f64();
        let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
        let e = t.entry(self.name).or_insert((0.0, 0));
        e.0 += dt;
        e.1 += 1;
    }
}
