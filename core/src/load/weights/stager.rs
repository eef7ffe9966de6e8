//! The direct checkpoint → device path's double-buffered pinned staging ([`DeviceStager`]).

use super::*;

/// Bytes of one pinned staging buffer of the direct checkpoint → device path.
const STAGE_BYTES: usize = 64 << 20;

/// Two pinned host buffers that checkpoint bytes are read into and copied to the device from
/// asynchronously: while one buffer's copy runs, the next chunk is read into the other.
pub(super) struct DeviceStager {
    bufs: [cudarc::driver::PinnedHostSlice<u8>; 2],
    ptrs: [usize; 2],
    /// Completion of the last copy out of each buffer.
    done: [Option<cudarc::driver::CudaEvent>; 2],
    next: usize,
}

impl std::fmt::Debug for DeviceStager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceStager")
    }
}

impl DeviceStager {
    pub(super) fn new(g: &Arc<Gpu>) -> Result<Self> {
        let ctx = g.k.context();
        // SAFETY: the buffers are only written by `upload` after the copy that last read
        // them has completed (`done` events), and read by the copies it queues.
        let mut a =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(STAGE_BYTES, 0) }.map_err(crate::tensor::cuda::cuda_err)?;
        let mut b =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(STAGE_BYTES, 0) }.map_err(crate::tensor::cuda::cuda_err)?;
        let pa = a.as_mut_ptr().map_err(crate::tensor::cuda::cuda_err)? as usize;
        let pb = b.as_mut_ptr().map_err(crate::tensor::cuda::cuda_err)? as usize;
        Ok(Self { bufs: [a, b], ptrs: [pa, pb], done: [None, None], next: 0 })
    }

    /// Reads `jobs` (source, byte offset, bytes) into one new device tensor of `shape` and
    /// `dt`, in order.
    pub(super) fn upload(
        &mut self,
        g: &Arc<Gpu>,
        ckpt: &Checkpoint,
        jobs: &[(&str, usize, usize)],
        shape: Vec<usize>,
        dt: DType,
    ) -> Result<Tensor> {
        let total: usize = jobs.iter().map(|j| j.2).sum();
        if total != shape.iter().product::<usize>() * dt.size_in_bytes() {
            bail!(Internal, "staged upload of {total} bytes for {shape:?} {dt}");
        }
        let t = Tensor::empty_on(g, shape, dt)?;
        let base = match t.storage() {
            crate::tensor::Storage::Cuda(c) => match &c.buf {
                crate::tensor::cuda::DevBuf::F32(s) => crate::tensor::cuda::addr(g, s),
                crate::tensor::cuda::DevBuf::BF16(s) => crate::tensor::cuda::addr(g, s),
                crate::tensor::cuda::DevBuf::F16(s) => crate::tensor::cuda::addr(g, s),
                crate::tensor::cuda::DevBuf::F8(_) => bail!(Internal, "staged upload into an fp8 tensor"),
            },
            crate::tensor::Storage::Cpu(_) => bail!(Internal, "staged upload into a host tensor"),
        };
        let mut dst = 0usize;
        for &(src, off, len) in jobs {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(STAGE_BYTES);
                let b = self.next;
                self.next ^= 1;
                if let Some(e) = self.done[b].take() {
                    e.synchronize().map_err(crate::tensor::cuda::cuda_err)?;
                }
                // SAFETY: the buffer is STAGE_BYTES of pinned memory no queued copy reads
                // (its last copy completed above); `n <= STAGE_BYTES`.
                let host = unsafe { std::slice::from_raw_parts_mut(self.ptrs[b] as *mut u8, n) };
                // Parallel positioned reads of 8 MiB pieces.
                host.par_chunks_mut(8 << 20)
                    .enumerate()
                    .try_for_each(|(i, piece)| ckpt.read_bytes_at(src, off + done + i * (8 << 20), piece))?;
                let st = g.stream();
                // SAFETY: `base + dst .. + n` lies inside the tensor's allocation (checked sizes),
                // `host` is pinned and stays untouched until `done[b]` completes.
                unsafe {
                    cudarc::driver::result::memcpy_htod_async((base as usize + dst) as u64, &*host, st.cu_stream())
                }
                .map_err(crate::tensor::cuda::cuda_err)?;
                self.done[b] = Some(st.record_event(None).map_err(crate::tensor::cuda::cuda_err)?);
                dst += n;
                done += n;
            }
        }
        Ok(t)
    }
}

impl Drop for DeviceStager {
    fn drop(&mut self) {
        // The pinned buffers must outlive the copies that read them.
        for e in self.done.iter().flatten() {
            let _ = e.synchronize();
        }
        let _ = &self.bufs;
    }
}
