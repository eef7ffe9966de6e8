//! The CUDA backend of [`Tensor`]: a device handle (kernels + cuBLAS on one stream) and
//! typed device buffers.
//!
//! A CUDA tensor holds its values in the model dtype (`f32`, `bf16` or `f16`); the residual
//! stream, router logits and final logits are `f32` tensors as on the CPU. All work goes
//! to one stream per device and is asynchronous: nothing here synchronises except
//! [`Tensor::to_host`] (and the final token ids of a step).

use crate::tensor::device::Device;
use crate::tensor::dtype::DType;
use crate::tensor::{Storage, Tensor};
pub mod blocks;

use crate::error::{Context, Result};
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
        self.stream().synchronize().map_err(|e| err!(Device, "CUDA error (at synchronize): {e}"))
    }
}

/// The process-wide handle of CUDA device `ordinal` (created on first use).
pub fn gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    static DEVS: OnceLock<Mutex<Vec<Option<Arc<Gpu>>>>> = OnceLock::new();
    let mut devs = DEVS.get_or_init(|| Mutex::new(Vec::new())).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(g)) = devs.get(ordinal) {
        return Ok(g.clone());
    }
    let k = CudaKernels::new(ordinal).map_err(|e| err!(Device, "cuda:{ordinal}: {e}"))?;
    // SAFETY: porter issues all work of a device to one stream, so cudarc's per-buffer
    // events (cross-stream ordering) are unnecessary; turning them off before any buffer
    // exists removes an event record per kernel argument.
    unsafe { k.context().disable_event_tracking() };
    keep_pool_memory(&k);
    let gemm = Gemm::new(&k).map_err(|e| err!(Device, "cuda:{ordinal}: {e}"))?;
    // SAFETY: the arena is only written through `Gpu::upload` before the copy reads it.
    let mut buf = unsafe { k.context().alloc_pinned::<u8>(STAGING_BYTES) }.map_err(cuda_err)?;
    let base = buf.as_mut_ptr().map_err(cuda_err)? as usize;
    let staging = Mutex::new(Staging { buf, base, head: 0 });
    let g = Arc::new(Gpu { k, gemm, ordinal, staging });
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
    let dev = k.context().cu_device();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: plain driver queries on a live context's device; `pool` and `threshold` outlive
    // the calls.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, dev) == sys::CUresult::CUDA_SUCCESS && !pool.is_null() {
            let mut threshold: u64 = u64::MAX;
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold) as *mut u64 as *mut std::ffi::c_void,
            );
        }
    }
}

/// Typed device memory of a tensor (the variant matches the tensor's dtype).
#[derive(Debug)]
pub enum DevBuf {
    F32(CudaSlice<f32>),
    BF16(CudaSlice<bf16>),
    F16(CudaSlice<f16>),
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
        };
        Self { gpu: self.gpu.clone(), buf }
    }
}

pub(crate) fn cuda_err(e: impl std::fmt::Display) -> crate::error::Error {
    err!(Device, "CUDA: {e}")
}

/// Uploads host f32 values as `T`.
pub fn upload<T: DevType>(g: &Gpu, data: &[f32]) -> Result<CudaSlice<T>> {
    let host: Vec<T> = data.iter().map(|&v| T::from_f32(v)).collect();
    g.stream().clone_htod(&host).map_err(cuda_err)
}

impl Gpu {
    /// Copies small host data to a new device buffer without waiting for queued work.
    pub fn upload<T: DeviceRepr + Copy>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        let bytes = std::mem::size_of_val(data);
        if bytes == 0 {
            // A placeholder: a zero-byte allocation is an error in the driver; nothing reads it.
            return alloc::<T>(self, 1);
        }
        let mut dev = alloc::<T>(self, data.len())?;
        if bytes > STAGING_BYTES / 4 {
            return self.stream().clone_htod(data).map_err(cuda_err);
        }
        let mut st = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if st.head + bytes > st.buf.len() {
            // Wrap: every queued copy out of the arena must have run before it is reused.
            self.sync()?;
            st.head = 0;
        }
        // SAFETY: [head, head + bytes) lies inside the pinned arena, no queued copy reads it
        // (it is fresh since the last wrap, and a wrap synchronises), and `T` is plain data.
        let host = unsafe {
            let p = (st.base + st.head) as *mut T;
            std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len());
            std::slice::from_raw_parts(p as *const T, data.len())
        };
        let (dst, _guard) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut dev, self.stream());
        // SAFETY: `dst` is a live device allocation of `data.len()` elements on this stream;
        // `host` is pinned memory that stays valid (the arena lives as long as the device).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, host, self.stream().cu_stream()) }.map_err(cuda_err)?;
        drop(_guard);
        st.head = (st.head + bytes).next_multiple_of(256);
        Ok(dev)
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
            bail!(Device, "device buffer of {} elements for shape {shape:?}", s.len());
        }
        Ok(Self::from_storage(shape, Storage::Cuda(CudaStorage { gpu: gpu.clone(), buf: T::wrap(s) }), T::DTYPE))
    }

    /// An uninitialised device tensor (for op outputs that write every element).
    pub fn empty_on(gpu: &Arc<Gpu>, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Self> {
        fn mk<T: DevType>(g: &Arc<Gpu>, shape: Vec<usize>) -> Result<Tensor> {
            let n = shape.iter().product();
            Tensor::from_dev(g, alloc::<T>(g, n)?, shape)
        }
        by_dtype!(dtype, mk(gpu, shape.into()))
    }

    /// A zero-filled device tensor.
    pub fn zeros_on(gpu: &Arc<Gpu>, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Self> {
        fn mk<T: DevType>(g: &Arc<Gpu>, shape: Vec<usize>) -> Result<Tensor> {
            let n = shape.iter().product();
            let s = g.stream().alloc_zeros::<T>(n).map_err(cuda_err)?;
            Tensor::from_dev(g, s, shape)
        }
        by_dtype!(dtype, mk(gpu, shape.into()))
    }

    /// The device handle of a CUDA tensor.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        match self.storage() {
            Storage::Cuda(c) => Some(&c.gpu),
            Storage::Cpu(_) => None,
        }
    }

    pub fn is_cuda(&self) -> bool {
        matches!(self.storage(), Storage::Cuda(_))
    }

    pub fn device(&self) -> Device {
        match self.storage() {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(c) => Device::Cuda(c.gpu.ordinal),
        }
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

    /// This tensor on `device` (a copy; values rounded to the dtype).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        match (device, self.storage()) {
            (Device::Cpu, Storage::Cpu(_)) => Ok(self.clone()),
            (Device::Cpu, Storage::Cuda(_)) => self.to_host(),
            (Device::Cuda(i), Storage::Cpu(v)) => {
                let g = gpu(i)?;
                fn up<T: DevType>(g: &Arc<Gpu>, v: &[f32], shape: Vec<usize>) -> Result<Tensor> {
                    Tensor::from_dev(g, upload::<T>(g, v)?, shape)
                }
                by_dtype!(self.dtype(), up(&g, v, self.shape().to_vec())).context("uploading a tensor")
            }
            (Device::Cuda(i), Storage::Cuda(c)) if c.gpu.ordinal == i => self.try_clone(),
            (Device::Cuda(_), Storage::Cuda(_)) => self.to_host()?.to_device(device),
        }
    }

    /// A host copy (synchronises the stream).
    pub fn to_host(&self) -> Result<Tensor> {
        match self.storage() {
            Storage::Cpu(_) => Ok(self.clone()),
            Storage::Cuda(c) => {
                fn down<T: DevType>(g: &Gpu, b: &DevBuf) -> Result<Vec<f32>> {
                    let s = T::get(b).ok_or_else(|| err!(Internal, "dtype mismatch"))?;
                    let h: Vec<T> = g.stream().clone_dtoh(s).map_err(cuda_err)?;
                    Ok(h.into_iter().map(|v| v.to_f32()).collect())
                }
                let v = by_dtype!(self.dtype(), down(&c.gpu, &c.buf))?;
                Tensor::from_vec(v, self.shape().to_vec(), self.dtype())
            }
        }
    }

    /// A copy on the same device, with device errors reported.
    pub fn try_clone(&self) -> Result<Tensor> {
        match self.storage() {
            Storage::Cpu(_) => Ok(self.clone()),
            Storage::Cuda(c) => {
                fn cp<T: DevType>(g: &Arc<Gpu>, t: &Tensor) -> Result<Tensor> {
                    let src = t.dev::<T>()?;
                    let mut dst = alloc::<T>(g, src.len())?;
                    g.stream().memcpy_dtod(src, &mut dst).map_err(cuda_err)?;
                    Tensor::from_dev(g, dst, t.shape().to_vec())
                }
                by_dtype!(self.dtype(), cp(&c.gpu, self))
            }
        }
    }
}

/// The device of a CUDA tensor, or an error naming the op.
pub fn gpu_of(t: &Tensor, op: &str) -> Result<Arc<Gpu>> {
    t.gpu().cloned().ok_or_else(|| err!(Internal, "{op}: expected a CUDA tensor"))
}

/// `x · wᵀ` on the device: `[rows, k] × [n, k]ᵀ → [rows, n]` in `out_dtype`.
pub fn matmul_t(x: &Tensor, w: &Tensor, out_dtype: DType) -> Result<Tensor> {
    let g = gpu_of(x, "matmul")?;
    let _p = profile::span("gemm", &g);
    let (m, k, n) = (x.rows(), x.last_dim(), w.dim(0));
    if x.dtype() != w.dtype() {
        bail!(Internal, "matmul of a {} activation with a {} weight", x.dtype(), w.dtype());
    }
    let mut shape = x.shape().to_vec();
    if let Some(l) = shape.last_mut() {
        *l = n;
    }
    let mut out = Tensor::empty_on(&g, shape, out_dtype)?;
    fn go<A: DevType>(g: &Gpu, x: &Tensor, w: &Tensor, out: &mut Tensor, m: usize, k: usize, n: usize) -> Result<()> {
        let (xs, ws) = (x.dev::<A>()?, w.dev::<A>()?);
        // Decode-sized GEMMs take porter's skinny kernel (one light launch instead of a
        // cuBLAS call); the rest cuBLAS.
        match out.dtype() {
            DType::F32 if m <= porter_kernels::cuda::GEMV_MAX_ROWS && CudaKernels::gemv_fits::<A, f32>(m, k) => {
                return g.k.gemv::<A, f32>(xs, ws, out.dev_mut::<f32>()?, m, k, n).map_err(cuda_err)
            }
            dt if dt == A::DTYPE
                && m <= porter_kernels::cuda::GEMV_MAX_ROWS
                && CudaKernels::gemv_fits::<A, A>(m, k) =>
            {
                return g.k.gemv::<A, A>(xs, ws, out.dev_mut::<A>()?, m, k, n).map_err(cuda_err)
            }
            _ => {}
        }
        match out.dtype() {
            DType::F32 => g.gemm.matmul_t::<A, f32>(xs, ws, out.dev_mut::<f32>()?, m, k, n),
            DType::BF16 => g.gemm.matmul_t::<A, bf16>(xs, ws, out.dev_mut::<bf16>()?, m, k, n),
            DType::F16 => g.gemm.matmul_t::<A, f16>(xs, ws, out.dev_mut::<f16>()?, m, k, n),
        }
        .map_err(cuda_err)
    }
    by_dtype!(x.dtype(), go(&g, x, w, &mut out, m, k, n))?;
    Ok(out)
}

/// `x (f32) += y` on the device.
pub fn add_into(x: &mut Tensor, y: &Tensor) -> Result<()> {
    let g = gpu_of(x, "add")?;
    if x.dtype() != DType::F32 {
        bail!(Internal, "device residual adds need an f32 accumulator, got {}", x.dtype());
    }
    fn go<T: DevType>(g: &Gpu, x: &mut Tensor, y: &Tensor) -> Result<()> {
        let ys = y.dev::<T>()?;
        g.k.add_into_f32::<T>(x.dev_mut::<f32>()?, ys).map_err(cuda_err)
    }
    by_dtype!(y.dtype(), go(&g, x, y))
}

/// Casts a device tensor to `dtype`.
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return x.try_clone();
    }
    let g = gpu_of(x, "cast")?;
    let mut out = Tensor::empty_on(&g, x.shape().to_vec(), dtype)?;
    fn go<A: DevType>(g: &Gpu, x: &Tensor, out: &mut Tensor) -> Result<()> {
        let xs = x.dev::<A>()?;
        match out.dtype() {
            DType::F32 => g.k.cast::<A, f32>(xs, out.dev_mut::<f32>()?),
            DType::BF16 => g.k.cast::<A, bf16>(xs, out.dev_mut::<bf16>()?),
            DType::F16 => g.k.cast::<A, f16>(xs, out.dev_mut::<f16>()?),
        }
        .map_err(cuda_err)
    }
    by_dtype!(x.dtype(), go(&g, x, &mut out))?;
    Ok(out)
}

/// Columns `col0..col0+ncols` of the `[rows, last_dim]` view, as `[rows, ncols]`.
pub fn cols(x: &Tensor, rows: usize, stride: usize, col0: usize, ncols: usize) -> Result<Tensor> {
    let g = gpu_of(x, "cols")?;
    let mut out = Tensor::empty_on(&g, [rows, ncols], x.dtype())?;
    fn go<T: DevType>(g: &Gpu, x: &Tensor, o: &mut Tensor, r: usize, s: usize, c0: usize, nc: usize) -> Result<()> {
        g.k.copy_cols::<T>(x.dev::<T>()?, o.dev_mut::<T>()?, r, s, c0, nc).map_err(cuda_err)
    }
    by_dtype!(x.dtype(), go(&g, x, &mut out, rows, stride, col0, ncols))?;
    Ok(out)
}

/// Rows `idx` of the `[rows, last_dim]` view.
pub fn gather_rows(x: &Tensor, idx: &[usize]) -> Result<Tensor> {
    let g = gpu_of(x, "gather_rows")?;
    let (rows, d) = (x.rows(), x.last_dim());
    if let Some(&bad) = idx.iter().find(|&&i| i >= rows) {
        bail!(Device, "row index {bad} out of range ({rows} rows)");
    }
    let ids: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
    let dev_idx = g.upload(&ids)?;
    let mut out = Tensor::empty_on(&g, [idx.len(), d], x.dtype())?;
    fn go<T: DevType>(g: &Gpu, x: &Tensor, i: &CudaSlice<u32>, o: &mut Tensor, rows: usize, d: usize) -> Result<()> {
        g.k.gather_rows::<T>(x.dev::<T>()?, i, o.dev_mut::<T>()?, rows, d).map_err(cuda_err)
    }
    by_dtype!(x.dtype(), go(&g, x, &dev_idx, &mut out, rows, d))?;
    Ok(out)
}

/// A device address (for per-sequence pointer tables).
pub fn addr<T: DevType>(g: &Gpu, s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = s.device_ptr(g.stream());
    p
}

/// `[a | b]` along the last dimension on the device.
///
/// # Shapes
/// `[T, d1]`, `[T, d2]` → `[T, d1 + d2]`
pub fn concat_last(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let g = gpu_of(a, "concat")?;
    if a.dtype() != b.dtype() {
        bail!(Internal, "concat of {} and {}", a.dtype(), b.dtype());
    }
    let (rows, da, db) = (a.rows(), a.last_dim(), b.last_dim());
    let mut out = Tensor::empty_on(&g, [rows, da + db], a.dtype())?;
    fn go<T: DevType>(g: &Gpu, a: &Tensor, b: &Tensor, o: &mut Tensor, r: usize, da: usize, db: usize) -> Result<()> {
        g.k.concat_cols::<T>(a.dev::<T>()?, b.dev::<T>()?, o.dev_mut::<T>()?, r, da, db).map_err(cuda_err)
    }
    by_dtype!(a.dtype(), go(&g, a, b, &mut out, rows, da, db))?;
    Ok(out)
}

/// Measured device-to-device copy bandwidth in bytes/s (read + write counted), the HBM
/// roofline `porter bench` reports fractions of: the best of several 1 GiB copies.
pub fn copy_bandwidth(g: &Gpu) -> Result<f64> {
    let n = 1usize << 28; // 256 Mi f32 = 1 GiB
    let src = zeros::<f32>(g, n)?;
    let mut dst = zeros::<f32>(g, n)?;
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        g.sync()?;
        let t0 = std::time::Instant::now();
        g.stream().memcpy_dtod(&src, &mut dst).map_err(cuda_err)?;
        g.sync()?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(2.0 * (n * 4) as f64 / best)
}

/// `[a; b]` stacked along the first dimension (weights fused at load time).
///
/// # Shapes
/// `[n1, k]`, `[n2, k]` → `[n1 + n2, k]`
pub fn stack_rows(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let g = gpu_of(a, "stack_rows")?;
    if a.last_dim() != b.last_dim() || a.dtype() != b.dtype() {
        bail!(Internal, "stacking {:?} {} with {:?} {}", a.shape(), a.dtype(), b.shape(), b.dtype());
    }
    let mut out = Tensor::empty_on(&g, [a.rows() + b.rows(), a.last_dim()], a.dtype())?;
    fn go<T: DevType>(g: &Gpu, a: &Tensor, b: &Tensor, o: &mut Tensor) -> Result<()> {
        let (sa, sb) = (a.dev::<T>()?, b.dev::<T>()?);
        let (na, nb) = (sa.len(), sb.len());
        let d = o.dev_mut::<T>()?;
        g.stream().memcpy_dtod(sa, &mut d.slice_mut(0..na)).map_err(cuda_err)?;
        g.stream().memcpy_dtod(sb, &mut d.slice_mut(na..na + nb)).map_err(cuda_err)
    }
    by_dtype!(a.dtype(), go(&g, a, b, &mut out))?;
    Ok(out)
}

/// Per-block GPU time accounting for `porter bench` (`PORTER_PROFILE=1`): each profiled
/// block synchronises the stream before and after itself, so the numbers are the device
/// time of the block alone (the synchronisation slows the whole run; use for shares, not
/// for throughput). Nested blocks (the GEMMs inside a MoE) are counted in both.
pub mod profile {
    use super::Gpu;
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;

    fn table() -> &'static Mutex<BTreeMap<&'static str, (f64, usize)>> {
        static T: OnceLock<Mutex<BTreeMap<&'static str, (f64, usize)>>> = OnceLock::new();
        T.get_or_init(|| Mutex::new(BTreeMap::new()))
    }

    /// Whether `PORTER_PROFILE` is set (read once).
    pub fn enabled() -> bool {
        static E: OnceLock<bool> = OnceLock::new();
        *E.get_or_init(|| std::env::var_os("PORTER_PROFILE").is_some_and(|v| !v.is_empty() && v != "0"))
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
        let _ = gpu.sync();
        Some(Span { name, gpu, t0: Instant::now() })
    }

    impl Drop for Span<'_> {
        fn drop(&mut self) {
            let _ = self.gpu.sync();
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
}
