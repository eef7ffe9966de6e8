//! GPU timing of short calls: CUDA events around calls queued behind a hold (device-to-device
//! copies), so that the calls run back to back on the GPU even when the host takes longer to
//! submit one than the GPU takes to run it (the MoE decode calls: ~20 µs of host work each,
//! against 10–30 µs on the GPU; without a hold the events time the host). In a CUDA graph,
//! as the model runs them, there is no host work between the kernels either.

use cudarc::driver::CudaSlice;
use porter_kernels::cuda::CudaKernels;

/// Bytes of each copy of the hold (read + write: ~130 µs at the H200's ~4.2 TB/s).
const HOLD_BYTES: usize = 256 << 20;
/// Host time per queued call that the hold covers (µs; generous).
const HOST_US_PER_CALL: f64 = 60.0;

/// Two device buffers whose copies keep the stream busy.
pub struct Hold {
    src: CudaSlice<u8>,
    dst: CudaSlice<u8>,
}

impl Hold {
    /// Allocates the buffers (2 × 256 MiB).
    pub fn new(kern: &CudaKernels) -> Self {
        let s = kern.stream();
        Hold {
            src: s.alloc_zeros::<u8>(HOLD_BYTES).expect("alloc"),
            dst: s.alloc_zeros::<u8>(HOLD_BYTES).expect("alloc"),
        }
    }

    /// Queues at least `us` µs of copies (at least one; sized for 5 TB/s, faster than any
    /// GPU this runs on, so they last longer on a slower one).
    pub fn queue(&mut self, kern: &CudaKernels, us: f64) {
        let per_us = 2.0 * HOLD_BYTES as f64 / 5e12 * 1e6;
        let n = (us / per_us).ceil().max(1.0) as usize;
        for _ in 0..n {
            kern.stream().memcpy_dtod(&self.src, &mut self.dst).expect("dtod");
        }
    }
}

/// Seconds per call of `f(i)`, i = 0 .. iters: two warm-up calls, then a hold covering the
/// host's submission of all of them, then CUDA events around the `iters` calls.
pub fn time_calls(kern: &CudaKernels, hold: &mut Hold, iters: usize, f: &mut dyn FnMut(usize)) -> f64 {
    f(0);
    f(1);
    let s = kern.stream().clone();
    s.synchronize().expect("sync");
    hold.queue(kern, 1000.0 + HOST_US_PER_CALL * iters as f64);
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let a = s.record_event(flags).expect("event");
    for i in 0..iters {
        f(i);
    }
    let b = s.record_event(flags).expect("event");
    let sec = a.elapsed_ms(&b).expect("elapsed") as f64 / 1e3 / iters as f64;
    s.synchronize().expect("sync");
    sec
}
