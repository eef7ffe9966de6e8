//! CUDA device memory: the per-device handle ([`Gpu`]: one stream, the compiled kernels, a
//! cuBLAS handle and a pinned staging arena), typed device buffers ([`DevBuf`]) and the
//! constructors / accessors of device tensors. The ops on device tensors are in
//! `crate::backend::cuda`.
//!
//! A CUDA tensor holds its values in the model dtype (`f32`, `bf16` or `f16`); the residual
//! stream, router logits and final logits are `f32` tensors as on the CPU. All work goes
//! to one stream per device and is asynchronous: nothing here synchronises except
//! downloads (and the final token ids of a step).

use super::{CpuStorage, Storage, Tensor};
use crate::error::{Error, Result};
use crate::tensor::dtype::DType;
use crate::{bail, err};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use porter_kernels::cuda::{CudaFloat, CudaKernels, Gemm};
use std::sync::{Arc, Mutex, OnceLock};

/// One CUDA device: its stream, the compiled kernels, a cuBLAS handle and a pinned staging
/// arena for the per-step metadata uploads.
#[derive(Debug)]
pub struct Gpu {
    pub k: CudaKernels,
    pub gemm: Gemm,
    pub ordinal: usize,
    staging: Mutex<Staging>,
    /// The device's FP8 dequantization scratch (`backend::cuda::fp8`): one buffer of the
    /// compute dtype, grown to the largest weight (or MoE layer) a prefill GEMM dequantizes.
    pub(crate) fp8_scratch: Mutex<Option<DevBuf>>,
    /// While a CUDA graph is being captured: where the uploads of the captured forward go
    /// ([`Gpu::begin_recording`]).
    recording: Mutex<Option<Recording>>,
}

/// What a small upload of a forward holds, so that a CUDA graph's replay can write the next
/// step's values where the captured copy reads them (`crate::model::graph`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UploadTag {
    /// The batch's token ids (the embedding).
    Ids,
    /// The batch's positions and span table ([`BatchDev`]).
    Batch,
    /// The step's KV slots and block tables ([`PageDev`]).
    Page,
    /// One Gated DeltaNet layer's conv / delta-rule span tables.
    Gdn,
    /// Anything else: a forward that uploads it cannot be replayed from a graph.
    Other,
}

/// The uploads of a forward captured into a CUDA graph, in order. While capturing, each
/// upload becomes a device-to-device copy node out of `arena` (a device buffer outside the
/// graph) at the upload's offset; a replay writes the next step's values into the host
/// `image`, [`Recording::flush`]es it into the arena (one stream-ordered copy, queued before
/// the graph's launch, so the host can prepare the next step while the device runs this one)
/// and launches the graph.
#[derive(Debug)]
pub struct Recording {
    arena: CudaSlice<u8>,
    image: Vec<u8>,
    head: usize,
    /// `(tag, offset, bytes)` of each upload.
    pub entries: Vec<(UploadTag, usize, usize)>,
    /// Why the recorded forward cannot be replayed (an untagged upload, an overflow).
    pub unreplayable: Option<String>,
}

impl Recording {
    /// Writes the next step's values of upload `i` into the host image (they must have the
    /// recorded size).
    pub fn write<T: DeviceRepr + Copy>(&mut self, i: usize, data: &[T]) -> Result<()> {
        let Some(&(tag, off, bytes)) = self.entries.get(i) else {
            bail!(Internal, "graph replay: upload {i} of {} recorded", self.entries.len())
        };
        if std::mem::size_of_val(data) != bytes {
            bail!(
                Internal,
                "graph replay: upload {i} ({tag:?}) has {} bytes, the graph was captured with {bytes}",
                std::mem::size_of_val(data)
            );
        }
        // SAFETY: `T` is plain data of exactly `bytes` bytes, read as bytes.
        let src = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, bytes) };
        self.image[off..off + bytes].copy_from_slice(src);
        Ok(())
    }

    /// Queues the copy of the host image into the arena the graph reads (before its launch).
    pub fn flush(&mut self, g: &Gpu) -> Result<()> {
        let used = self.head.min(self.image.len());
        if used > 0 {
            let (dst, _guard) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut self.arena, g.stream());
            // SAFETY: `dst` is the arena, a live device allocation of at least `used` bytes.
            unsafe { g.copy_to_device(dst, &self.image[..used]) }?;
        }
        Ok(())
    }
}

/// Page-locked host memory that small uploads are copied through: an asynchronous copy from
/// pageable memory may wait for the stream to drain, one from pinned memory never does.
/// Uploads are written forward through the arena; when it wraps, the stream is synchronised
/// once so that no queued copy still reads the bytes being overwritten.
#[derive(Debug)]
struct Staging {
    buf: cudarc::driver::PinnedHostSlice<u8>,
    base: usize,
    head: usize,
}

/// Bytes of the staging arena.
const STAGING_BYTES: usize = 8 << 20;

impl Gpu {
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.k.stream()
    }

    /// Waits for all queued work (surfacing asynchronous errors).
    pub fn sync(&self) -> Result<()> {
        self.stream().synchronize().map_err(|e| Error::cuda(&e, format!("CUDA error (at synchronize): {e}")))
    }
}

/// The process-wide handle of CUDA device `ordinal` (created on first use).
pub fn gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    static DEVS: OnceLock<Mutex<Vec<Option<Arc<Gpu>>>>> = OnceLock::new();
    let mut devs = DEVS.get_or_init(|| Mutex::new(Vec::new())).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(g)) = devs.get(ordinal) {
        return Ok(g.clone());
    }
    let k = CudaKernels::new(ordinal).map_err(|e| Error::cuda(&e, format!("cuda:{ordinal}: {e}")))?;
    // SAFETY: porter issues all work of a device to one stream, so cudarc's per-buffer
    // events (cross-stream ordering) are unnecessary; turning them off before any buffer
    // exists removes an event record per kernel argument.
    unsafe { k.context().disable_event_tracking() };
    keep_pool_memory(&k);
    let gemm = Gemm::new(&k).map_err(|e| Error::cuda(&e, format!("cuda:{ordinal}: {e}")))?;
    // SAFETY: the arena is only written through `Gpu::upload` before the copy reads it.
    let mut buf = unsafe { k.context().alloc_pinned::<u8>(STAGING_BYTES) }.map_err(cuda_err)?;
    let base = buf.as_mut_ptr().map_err(cuda_err)? as usize;
    let staging = Mutex::new(Staging { buf, base, head: 0 });
    let g = Arc::new(Gpu { k, gemm, ordinal, staging, fp8_scratch: Mutex::new(None), recording: Mutex::new(None) });
    if devs.len() <= ordinal {
        devs.resize(ordinal + 1, None);
    }
    devs[ordinal] = Some(g.clone());
    Ok(g)
}

/// Lets the device's default memory pool (stream-ordered `cuMemAllocAsync`) keep freed
/// memory instead of returning it to the driver at every synchronisation: without this,
/// each generation step (which synchronises for its token id) would unmap and remap the
/// activations of the next step. Best effort: a failure only costs speed.
fn keep_pool_memory(k: &CudaKernels) {
    use cudarc::driver::sys;
    let Some(pool) = default_pool(k) else { return };
    let mut threshold: u64 = u64::MAX;
    // SAFETY: a driver call on the live default pool of the context's device; `threshold`
    // outlives it.
    unsafe {
        let _ = sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold) as *mut u64 as *mut std::ffi::c_void,
        );
    }
}

/// The default memory pool of `k`'s device (`None` where the driver has none to give).
fn default_pool(k: &CudaKernels) -> Option<cudarc::driver::sys::CUmemoryPool> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a plain driver query on a live context's device; `pool` outlives it.
    let ok = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, k.context().cu_device()) };
    (ok == sys::CUresult::CUDA_SUCCESS && !pool.is_null()).then_some(pool)
}

/// Typed device memory of a tensor (the variant matches the tensor's dtype; an FP8 weight's
/// tensor keeps its compute dtype).
#[derive(Debug)]
pub enum DevBuf {
    F32(CudaSlice<f32>),
    BF16(CudaSlice<bf16>),
    F16(CudaSlice<f16>),
    /// A block-quantized FP8 weight, read by the FP8 kernels (boxed: the other variants are
    /// one slice).
    F8(Box<DevFp8>),
}

/// An FP8 weight on the device, in the host layout of [`crate::tensor::fp8::Fp8Weight`]
/// uploaded as is: e4m3 bytes, the 128 × 128 block scales and the row → scale-row map (4 bytes
/// per row, so packed, stacked and regrouped weights keep each part's own scales; the kernels
/// read `scales[row_scale[r], c / 128]`).
///
/// # Shapes
/// `q`: `[rows, cols]` u8; `scales`: `[scale_rows, ceil(cols/128)]` f32; `row_scale`: `[rows]`
/// u32, every value `< scale_rows` (checked at upload)
#[derive(Debug)]
pub struct DevFp8 {
    pub q: CudaSlice<u8>,
    pub scales: CudaSlice<f32>,
    pub row_scale: CudaSlice<u32>,
    /// `row_scale[r] == r / 128` for every row (`porter_kernels::cuda::fp8_row_map_affine`): the MoE decode kernels
    /// compute the scale row instead of loading it.
    pub row_scale_affine: bool,
    /// Row length (input features).
    pub cols: usize,
    /// The compute dtype dequantized values are rounded to.
    pub dtype: DType,
}

impl DevFp8 {
    /// Weight rows.
    pub fn rows(&self) -> usize {
        self.row_scale.len()
    }

    /// Bytes held (e4m3 bytes, scales, row map).
    pub fn bytes(&self) -> usize {
        self.q.len() + 4 * self.scales.len() + 4 * self.row_scale.len()
    }

    /// The kernels' view.
    pub fn view(&self) -> porter_kernels::cuda::Fp8Dev<'_> {
        porter_kernels::cuda::Fp8Dev {
            q: &self.q,
            scales: &self.scales,
            row_scale: &self.row_scale,
            row_scale_affine: self.row_scale_affine,
            rows: self.rows(),
            cols: self.cols,
        }
    }

    /// Uploads a host FP8 weight (bytes and scales, no dequantization).
    pub fn upload(g: &Gpu, w: &crate::tensor::fp8::Fp8Weight, dtype: DType) -> Result<Self> {
        let sc = w.cols.div_ceil(porter_kernels::cuda::FP8_BLOCK).max(1);
        let scale_rows = w.scales.len() / sc;
        if w.scales.len() != scale_rows * sc || w.q.len() != w.rows() * w.cols {
            bail!(
                Shape,
                "fp8 weight [{}, {}] with {} bytes and {} scales",
                w.rows(),
                w.cols,
                w.q.len(),
                w.scales.len()
            );
        }
        if let Some(&bad) = w.row_scale.iter().find(|&&r| r as usize >= scale_rows) {
            bail!(Shape, "fp8 weight: scale row {bad} of {scale_rows}");
        }
        let st = g.stream();
        Ok(Self {
            q: st.clone_htod(&w.q).map_err(cuda_err)?,
            scales: st.clone_htod(&w.scales).map_err(cuda_err)?,
            row_scale: st.clone_htod(&w.row_scale).map_err(cuda_err)?,
            row_scale_affine: porter_kernels::cuda::fp8_row_map_affine(&w.row_scale),
            cols: w.cols,
            dtype,
        })
    }

    /// A device-to-device copy.
    fn copy(&self, g: &Gpu) -> Result<Self> {
        fn cp<T: DeviceRepr>(g: &Gpu, s: &CudaSlice<T>) -> Result<CudaSlice<T>> {
            let mut d = alloc::<T>(g, s.len())?;
            g.stream().memcpy_dtod(s, &mut d).map_err(cuda_err)?;
            Ok(d)
        }
        Ok(Self {
            q: cp(g, &self.q)?,
            scales: cp(g, &self.scales)?,
            row_scale: cp(g, &self.row_scale)?,
            row_scale_affine: self.row_scale_affine,
            cols: self.cols,
            dtype: self.dtype,
        })
    }
}

/// A storage type of device tensors.
pub trait DevType: CudaFloat {
    const DTYPE: DType;
    fn wrap(s: CudaSlice<Self>) -> DevBuf;
    fn get(b: &DevBuf) -> Option<&CudaSlice<Self>>;
    fn get_mut(b: &mut DevBuf) -> Option<&mut CudaSlice<Self>>;
}

macro_rules! dev_type {
    ($t:ty, $v:ident, $d:ident) => {
        impl DevType for $t {
            const DTYPE: DType = DType::$d;
            fn wrap(s: CudaSlice<Self>) -> DevBuf {
                DevBuf::$v(s)
            }
            fn get(b: &DevBuf) -> Option<&CudaSlice<Self>> {
                match b {
                    DevBuf::$v(s) => Some(s),
                    _ => None,
                }
            }
            fn get_mut(b: &mut DevBuf) -> Option<&mut CudaSlice<Self>> {
                match b {
                    DevBuf::$v(s) => Some(s),
                    _ => None,
                }
            }
        }
    };
}
dev_type!(f32, F32, F32);
dev_type!(bf16, BF16, BF16);
dev_type!(f16, F16, F16);

/// Calls `$f::<T>($args)` with `T` the storage type of `$dt`.
#[macro_export]
macro_rules! by_dtype {
    ($dt:expr, $f:ident ( $($a:expr),* $(,)? )) => {
        match $dt {
            $crate::tensor::dtype::DType::F32 => $f::<f32>($($a),*),
            $crate::tensor::dtype::DType::BF16 => $f::<half::bf16>($($a),*),
            $crate::tensor::dtype::DType::F16 => $f::<half::f16>($($a),*),
        }
    };
}

/// Device data of a CUDA tensor.
#[derive(Debug)]
pub struct CudaStorage {
    pub gpu: Arc<Gpu>,
    pub buf: DevBuf,
}

impl Clone for CudaStorage {
    fn clone(&self) -> Self {
        // A device-to-device copy; an allocation failure here has no error path in Clone,
        // so device tensors are cloned explicitly with `Tensor::try_clone` on hot paths.
        let buf = match &self.buf {
            DevBuf::F32(s) => DevBuf::F32(s.clone()),
            DevBuf::BF16(s) => DevBuf::BF16(s.clone()),
            DevBuf::F16(s) => DevBuf::F16(s.clone()),
            DevBuf::F8(w) => DevBuf::F8(Box::new(DevFp8 {
                q: w.q.clone(),
                scales: w.scales.clone(),
                row_scale: w.row_scale.clone(),
                row_scale_affine: w.row_scale_affine,
                cols: w.cols,
                dtype: w.dtype,
            })),
        };
        Self { gpu: self.gpu.clone(), buf }
    }
}

/// A failed CUDA call as porter's error: [`Error::OutOfMemory`] for the driver's
/// out-of-memory result, else [`Error::Device`] ("CUDA: …" either way).
pub(crate) fn cuda_err(e: impl Into<Error>) -> Error {
    e.into()
}

/// Uploads host f32 values as `T`.
pub fn upload<T: DevType>(g: &Gpu, data: &[f32]) -> Result<CudaSlice<T>> {
    let host: Vec<T> = data.iter().map(|&v| T::from_f32(v)).collect();
    g.stream().clone_htod(&host).map_err(cuda_err)
}

impl Gpu {
    /// Copies small host data to a new device buffer without waiting for queued work.
    pub fn upload<T: DeviceRepr + Copy>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.upload_as(UploadTag::Other, data)
    }

    /// [`Gpu::upload`] of per-step metadata of kind `tag`: while a graph is recorded the bytes
    /// go to the recording's pinned buffer (where the replay rewrites them), else through the
    /// staging arena.
    pub fn upload_as<T: DeviceRepr + Copy>(&self, tag: UploadTag, data: &[T]) -> Result<CudaSlice<T>> {
        let bytes = std::mem::size_of_val(data);
        if bytes == 0 {
            // A placeholder: a zero-byte allocation is an error in the driver; nothing reads it.
            return alloc::<T>(self, 1);
        }
        let mut dev = alloc::<T>(self, data.len())?;
        let mut rec = self.recording.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rec.as_mut() {
            if tag == UploadTag::Other {
                r.unreplayable.get_or_insert_with(|| format!("an untagged upload of {bytes} bytes"));
            }
            if r.head + bytes > r.image.len() {
                r.unreplayable.get_or_insert_with(|| format!("uploads beyond the {} recorded bytes", r.image.len()));
                // The graph is discarded; any in-bounds source keeps the capture valid.
                r.head = 0;
            }
            let off = r.head;
            if off + bytes > r.image.len() {
                bail!(Internal, "an upload of {bytes} bytes does not fit a graph recording of {}", r.image.len());
            }
            let (src, _gs) = r.arena.device_ptr(self.stream());
            let (dst, _gd) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut dev, self.stream());
            // SAFETY: both are live device allocations holding at least `bytes` bytes from
            // the given addresses (the arena's range was checked above).
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(dst, src + off as u64, bytes, self.stream().cu_stream())
            }
            .map_err(cuda_err)?;
            drop((_gs, _gd));
            r.entries.push((tag, off, bytes));
            r.head = (off + bytes).next_multiple_of(256);
            return Ok(dev);
        }
        drop(rec);
        if bytes > STAGING_BYTES / 4 {
            return self.stream().clone_htod(data).map_err(cuda_err);
        }
        let (dst, _guard) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut dev, self.stream());
        // SAFETY: `dst` is a live device allocation of `data.len()` elements; `T` is plain data.
        unsafe {
            self.copy_to_device(dst, std::slice::from_raw_parts(data.as_ptr() as *const u8, bytes))?;
        }
        drop(_guard);
        Ok(dev)
    }

    /// Queues a copy of `data` (at most a quarter of the staging arena) to device address
    /// `dst` through the pinned staging arena, without waiting for queued work.
    ///
    /// # Safety
    /// `dst` must be a live device allocation of at least `data.len()` bytes on this device.
    unsafe fn copy_to_device(&self, dst: u64, data: &[u8]) -> Result<()> {
        let bytes = data.len();
        if bytes > STAGING_BYTES / 4 {
            bail!(Internal, "a staged upload of {bytes} bytes (at most {})", STAGING_BYTES / 4);
        }
        let mut st = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if st.head + bytes > st.buf.len() {
            // Wrap: every queued copy out of the arena must have run before it is reused.
            self.sync()?;
            st.head = 0;
        }
        // SAFETY: [head, head + bytes) lies inside the pinned arena and no queued copy reads
        // it (it is fresh since the last wrap, and a wrap synchronises).
        let host = unsafe {
            let p = (st.base + st.head) as *mut u8;
            std::ptr::copy_nonoverlapping(data.as_ptr(), p, bytes);
            std::slice::from_raw_parts(p as *const u8, bytes)
        };
        // SAFETY: the caller guarantees `dst`; `host` is pinned memory that stays valid (the
        // arena lives as long as the device).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, host, self.stream().cu_stream()) }.map_err(cuda_err)?;
        st.head = (st.head + bytes).next_multiple_of(256);
        Ok(())
    }

    /// Starts recording uploads into a fresh device arena of `bytes` (before a graph capture:
    /// the arena is allocated outside the graph).
    pub fn begin_recording(&self, bytes: usize) -> Result<()> {
        let bytes = bytes.next_multiple_of(256).max(256);
        let arena = zeros::<u8>(self, bytes)?;
        let mut rec = self.recording.lock().unwrap_or_else(|e| e.into_inner());
        if rec.is_some() {
            bail!(Internal, "cuda:{}: a graph recording is already running", self.ordinal);
        }
        *rec = Some(Recording { arena, image: vec![0; bytes], head: 0, entries: Vec::new(), unreplayable: None });
        Ok(())
    }

    /// Ends the recording [`Gpu::begin_recording`] started.
    pub fn end_recording(&self) -> Option<Recording> {
        self.recording.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A zero-filled device buffer.
pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(g: &Gpu, n: usize) -> Result<CudaSlice<T>> {
    g.stream().alloc_zeros::<T>(n).map_err(cuda_err)
}

/// An uninitialised device buffer of `n` elements (every element is written by the op).
pub fn alloc<T: DeviceRepr>(g: &Gpu, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: callers write every element before reading it.
    unsafe { g.stream().alloc::<T>(n) }.map_err(cuda_err)
}

impl Tensor {
    /// Wraps a device buffer.
    pub fn from_dev<T: DevType>(gpu: &Arc<Gpu>, s: CudaSlice<T>, shape: impl Into<Vec<usize>>) -> Result<Self> {
        let shape = shape.into();
        let n: usize = shape.iter().product();
        if n != s.len() {
            bail!(Internal, "device buffer of {} elements for shape {shape:?}", s.len());
        }
        Ok(Self::from_storage(shape, Storage::Cuda(CudaStorage { gpu: gpu.clone(), buf: T::wrap(s) }), T::DTYPE))
    }

    /// An uninitialised device tensor (for op outputs that write every element).
    pub fn empty_on(gpu: &Arc<Gpu>, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Self> {
        fn mk<T: DevType>(g: &Arc<Gpu>, shape: Vec<usize>) -> Result<Tensor> {
            let n = shape.iter().product();
            Tensor::from_dev(g, alloc::<T>(g, n)?, shape)
        }
        crate::by_dtype!(dtype, mk(gpu, shape.into()))
    }

    /// A zero-filled device tensor.
    pub fn zeros_on(gpu: &Arc<Gpu>, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Self> {
        fn mk<T: DevType>(g: &Arc<Gpu>, shape: Vec<usize>) -> Result<Tensor> {
            let n = shape.iter().product();
            let s = g.stream().alloc_zeros::<T>(n).map_err(cuda_err)?;
            Tensor::from_dev(g, s, shape)
        }
        crate::by_dtype!(dtype, mk(gpu, shape.into()))
    }

    /// The typed device buffer (errors on a CPU tensor or a dtype mismatch).
    pub fn dev<T: DevType>(&self) -> Result<&CudaSlice<T>> {
        match self.storage() {
            Storage::Cuda(c) => T::get(&c.buf)
                .ok_or_else(|| err!(Internal, "device tensor of dtype {} read as {}", self.dtype(), T::DTYPE)),
            Storage::Cpu(_) => bail!(Internal, "a CPU tensor was used by a CUDA op"),
        }
    }

    pub fn dev_mut<T: DevType>(&mut self) -> Result<&mut CudaSlice<T>> {
        let dt = self.dtype();
        match self.storage_mut() {
            Storage::Cuda(c) => T::get_mut(&mut c.buf)
                .ok_or_else(|| err!(Internal, "device tensor of dtype {dt} written as {}", T::DTYPE)),
            Storage::Cpu(_) => bail!(Internal, "a CPU tensor was used by a CUDA op"),
        }
    }
}

/// Uploads host storage as a device buffer of `dtype` (a direct copy when the host already
/// holds `dtype`, else a conversion on the host first).
pub(crate) fn upload_storage(g: &Arc<Gpu>, host: &CpuStorage, dtype: DType) -> Result<DevBuf> {
    let st = g.stream();
    Ok(match (host, dtype) {
        (CpuStorage::BF16(v), DType::BF16) => DevBuf::BF16(st.clone_htod(v).map_err(cuda_err)?),
        (CpuStorage::F16(v), DType::F16) => DevBuf::F16(st.clone_htod(v).map_err(cuda_err)?),
        (CpuStorage::F32(v), DType::F32) => DevBuf::F32(st.clone_htod(v).map_err(cuda_err)?),
        // FP8 weights stay FP8 on the device (bytes, scales and row map uploaded as held);
        // the FP8 kernels dequantize them (backend::cuda::fp8).
        (CpuStorage::F8E4M3(w), dt) => DevBuf::F8(Box::new(DevFp8::upload(g, w, dt)?)),
        (h, dt) => {
            let v = h.to_f32_vec();
            match dt {
                DType::F32 => DevBuf::F32(upload::<f32>(g, &v)?),
                DType::BF16 => DevBuf::BF16(upload::<bf16>(g, &v)?),
                DType::F16 => DevBuf::F16(upload::<f16>(g, &v)?),
            }
        }
    })
}

/// Downloads a device buffer into host storage of the same dtype (an FP8 weight as
/// [`CpuStorage::F8E4M3`]; synchronises the stream).
pub(crate) fn download(c: &CudaStorage) -> Result<CpuStorage> {
    let st = c.gpu.stream();
    Ok(match &c.buf {
        DevBuf::F32(s) => CpuStorage::F32(st.clone_dtoh(s).map_err(cuda_err)?),
        DevBuf::BF16(s) => CpuStorage::BF16(st.clone_dtoh(s).map_err(cuda_err)?),
        DevBuf::F16(s) => CpuStorage::F16(st.clone_dtoh(s).map_err(cuda_err)?),
        DevBuf::F8(w) => CpuStorage::F8E4M3(crate::tensor::fp8::Fp8Weight {
            q: st.clone_dtoh(&w.q).map_err(cuda_err)?,
            scales: st.clone_dtoh(&w.scales).map_err(cuda_err)?,
            row_scale: st.clone_dtoh(&w.row_scale).map_err(cuda_err)?,
            cols: w.cols,
            dtype: w.dtype,
        }),
    })
}

/// A device-to-device copy of a buffer, with allocation errors reported.
pub(crate) fn copy_buf(g: &Arc<Gpu>, b: &DevBuf) -> Result<DevBuf> {
    fn cp<T: DevType>(g: &Gpu, s: &CudaSlice<T>) -> Result<DevBuf> {
        let mut d = alloc::<T>(g, s.len())?;
        g.stream().memcpy_dtod(s, &mut d).map_err(cuda_err)?;
        Ok(T::wrap(d))
    }
    match b {
        DevBuf::F32(s) => cp(g, s),
        DevBuf::BF16(s) => cp(g, s),
        DevBuf::F16(s) => cp(g, s),
        DevBuf::F8(w) => Ok(DevBuf::F8(Box::new(w.copy(g)?))),
    }
}

/// The device of a CUDA tensor, or an error naming the op.
pub fn gpu_of(t: &Tensor, op: &str) -> Result<Arc<Gpu>> {
    t.gpu().cloned().ok_or_else(|| err!(Internal, "{op}: expected a CUDA tensor"))
}

/// A device address (for per-sequence pointer tables).
pub fn addr<T: DevType>(g: &Gpu, s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = s.device_ptr(g.stream());
    p
}

/// The per-forward tables of a batch on the device (one upload, shared by every layer).
///
/// # Shapes
/// `[positions (T) | spans (S × 3: q_row0, q_len, pos0)]` u32
#[derive(Debug)]
pub struct BatchDev {
    pub(crate) ordinal: usize,
    pub(crate) t: usize,
    pub(crate) n: usize,
    pub(crate) buf: CudaSlice<u32>,
}

impl BatchDev {
    pub(crate) fn positions(&self) -> cudarc::driver::CudaView<'_, u32> {
        self.buf.slice(0..self.t)
    }
    pub(crate) fn spans(&self) -> cudarc::driver::CudaView<'_, u32> {
        self.buf.slice(self.t..self.t + 3 * self.n)
    }
}

/// A forward's paging metadata on the device (see [`crate::batch::PageStep`]).
///
/// # Shapes
/// `[slots (T) | block tables (S × max_blocks)]` u32
#[derive(Debug)]
pub struct PageDev {
    pub(crate) ordinal: usize,
    pub(crate) t: usize,
    pub(crate) buf: CudaSlice<u32>,
}

impl PageDev {
    pub(crate) fn slots(&self) -> cudarc::driver::CudaView<'_, u32> {
        self.buf.slice(0..self.t)
    }
    pub(crate) fn tables(&self) -> cudarc::driver::CudaView<'_, u32> {
        self.buf.slice(self.t..)
    }
}

static DETERMINISTIC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the batch-invariant ("deterministic") kernel choices on or off for every CUDA
/// device: with it on, a row's result is bit-identical whatever else is in the batch in
/// every dtype (GEMMs on the row-invariant GEMV path, attention without tensor cores).
/// f32 is batch-invariant either way.
pub fn set_deterministic(on: bool) {
    DETERMINISTIC.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether deterministic mode is on ([`set_deterministic`]).
pub fn deterministic() -> bool {
    DETERMINISTIC.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a kernel over `dtype` data must take its batch-invariant path (one whose per-row
/// arithmetic does not depend on the other rows, even where a faster one exists): always in
/// f32, and in every dtype in deterministic mode (the GEMM's and the MoE's rule).
pub fn batch_invariant(dtype: DType) -> bool {
    dtype == DType::F32 || deterministic()
}

/// `(free, total)` bytes of device memory on CUDA device `ordinal` (opens its context).
///
/// The default memory pool keeps what tensors freed (`keep_pool_memory`), and the driver
/// counts that as used: after a prefill of 32k tokens (or one that ran out of memory half way)
/// gigabytes sit in the pool, reusable by the pool's own allocations only. So this first waits
/// for the device and hands the pool's unused memory back to the driver, and the free figure
/// is what any allocation can get (H100, session 21: 0.07 GB reported free after a failed 32k
/// prefill, with 4.00 GB free before it).
pub fn mem_info(ordinal: usize) -> Result<(usize, usize)> {
    let g = gpu(ordinal)?;
    g.sync()?;
    g.k.context().bind_to_thread().map_err(cuda_err)?;
    trim_pool(&g.k);
    cudarc::driver::result::mem_get_info().map_err(cuda_err)
}

/// Returns the default memory pool's unused memory to the driver (after a sync, when no
/// stream-ordered free is pending). Best effort, like [`keep_pool_memory`]: a failure only
/// makes the free figure of [`mem_info`] smaller than it could be.
fn trim_pool(k: &CudaKernels) {
    let Some(pool) = default_pool(k) else { return };
    // SAFETY: a driver call on the live default pool of the context's device; trimming only
    // releases memory no allocation holds.
    unsafe {
        let _ = cudarc::driver::sys::cuMemPoolTrimTo(pool, 0);
    }
}
