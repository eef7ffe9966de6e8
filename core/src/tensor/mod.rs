//! A minimal dense tensor and where its data lives.
//!
//! [`Storage`] is one enum over the backends, matched exhaustively wherever a tensor's data
//! is touched: host memory ([`CpuStorage`]) or device memory ([`cuda::CudaStorage`]). Host
//! storage keeps the dtype it was given: weights stay in their checkpoint dtype (`bf16`,
//! `f16` or `f32`, never inflated), while CPU activations are `f32` buffers whose values are
//! rounded to the tensor's [`DType`] after each op (see [`DType`]). Device storage always
//! holds the dtype itself. The ops on tensors live in [`crate::backend`].

pub mod cuda;
pub mod device;
pub mod dtype;
pub mod fp8;

pub use device::Device;
pub use dtype::DType;
pub use fp8::Fp8Weight;

use crate::bail;
use crate::error::{Context, Result};
use half::{bf16, f16};
use std::borrow::Cow;

/// Whether this build carries a CUDA backend that can execute models.
pub const CUDA_BACKEND_AVAILABLE: bool = true;

/// Host data of a tensor, in the element type it was stored with.
#[derive(Clone, Debug)]
pub enum CpuStorage {
    /// `f32` values (activations; f32 weights), rounded to the tensor's dtype.
    F32(Vec<f32>),
    /// `bf16` values as stored in a checkpoint.
    BF16(Vec<bf16>),
    /// `f16` values as stored in a checkpoint.
    F16(Vec<f16>),
    /// A block-quantized FP8 weight (e4m3 bytes + 128 × 128 scales), dequantized inside the
    /// GEMM; its dequantized values are rounded to [`Fp8Weight::dtype`].
    F8E4M3(Fp8Weight),
}

impl CpuStorage {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::F8E4M3(w) => w.q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as `f32` (borrowed when already `f32`).
    pub fn as_f32(&self) -> Cow<'_, [f32]> {
        match self {
            CpuStorage::F32(v) => Cow::Borrowed(v),
            h => Cow::Owned(h.to_f32_vec()),
        }
    }

    /// The values converted to `f32`.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            CpuStorage::F32(v) => v.clone(),
            CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuStorage::F8E4M3(w) => w.to_f32_vec(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len() * 4,
            CpuStorage::BF16(v) => v.len() * 2,
            CpuStorage::F16(v) => v.len() * 2,
            CpuStorage::F8E4M3(w) => w.bytes(),
        }
    }

    /// Elements `start..end` as a borrowed slice of the same element type (whole rows for an
    /// FP8 weight).
    pub fn range(&self, start: usize, end: usize) -> Result<HostSlice<'_>> {
        if start > end || end > self.len() {
            bail!(Internal, "host range {start}..{end} of {} elements", self.len());
        }
        Ok(match self {
            CpuStorage::F8E4M3(w) => {
                let c = w.cols.max(1);
                if !start.is_multiple_of(c) || !end.is_multiple_of(c) {
                    bail!(Internal, "fp8 host range {start}..{end} does not cover whole rows of {c}");
                }
                HostSlice::F8(w.rows_view(start / c, end / c)?, w.dtype)
            }
            CpuStorage::F32(v) => HostSlice::F32(&v[start..end]),
            CpuStorage::BF16(v) => HostSlice::BF16(&v[start..end]),
            CpuStorage::F16(v) => HostSlice::F16(&v[start..end]),
        })
    }
}

/// A borrowed run of host elements in their stored type (what CPU GEMMs read weights from).
#[derive(Clone, Copy, Debug)]
pub enum HostSlice<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
    /// Rows of an FP8 weight and the dtype its dequantized values are rounded to.
    F8(porter_kernels::cpu::fp8::Fp8Rows<'a>, DType),
}

/// Where a tensor's data lives.
#[derive(Clone, Debug)]
pub enum Storage {
    /// Row-major host memory.
    Cpu(CpuStorage),
    /// Row-major device memory in the tensor's dtype.
    Cuda(cuda::CudaStorage),
}

/// A dense, row-major tensor.
///
/// # Shapes
/// Any rank; activations are usually `[tokens, features]`.
#[derive(Clone, Debug)]
pub struct Tensor {
    shape: Vec<usize>,
    storage: Storage,
    dtype: DType,
}

impl Tensor {
    /// Wraps host `f32` values; they are rounded to `dtype`.
    pub fn from_vec(mut data: Vec<f32>, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Self> {
        let shape = shape.into();
        let n: usize = shape.iter().product();
        if n != data.len() {
            bail!(Shape, "tensor data has {} elements but shape {:?} needs {n}", data.len(), shape);
        }
        dtype.round_slice(&mut data);
        Ok(Self { shape, storage: Storage::Cpu(CpuStorage::F32(data)), dtype })
    }

    /// Wraps host storage as a tensor of `dtype`. Half-precision storage must match `dtype`
    /// (`bf16` values are a `BF16` tensor); `f32` storage may carry any dtype (its values
    /// are then rounded).
    pub fn from_host(host: CpuStorage, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Self> {
        let shape = shape.into();
        let n: usize = shape.iter().product();
        if n != host.len() {
            bail!(Shape, "tensor data has {} elements but shape {:?} needs {n}", host.len(), shape);
        }
        match (&host, dtype) {
            (CpuStorage::F32(_), _) | (CpuStorage::BF16(_), DType::BF16) | (CpuStorage::F16(_), DType::F16) => {}
            (CpuStorage::F8E4M3(w), dt) if w.dtype == dt => {}
            _ => bail!(DType, "host {} storage cannot hold a {dtype} tensor", host_name(&host)),
        }
        let mut t = Self { shape, storage: Storage::Cpu(host), dtype };
        t.round_();
        Ok(t)
    }

    /// A zero-filled host tensor.
    pub fn zeros(shape: impl Into<Vec<usize>>, dtype: DType) -> Self {
        let shape = shape.into();
        let n = shape.iter().product();
        Self { shape, storage: Storage::Cpu(CpuStorage::F32(vec![0.0; n])), dtype }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of the tensor in its dtype (what an FP8 weight really holds: its bytes and scales).
    pub fn bytes(&self) -> usize {
        match &self.storage {
            Storage::Cpu(CpuStorage::F8E4M3(w)) => w.bytes(),
            Storage::Cuda(cuda::CudaStorage { buf: cuda::DevBuf::F8(w), .. }) => w.bytes(),
            _ => self.elem_count() * self.dtype.size_in_bytes(),
        }
    }

    /// Whether this is an FP8 (block-quantized) weight, on the host or on a device.
    pub fn is_fp8(&self) -> bool {
        match &self.storage {
            Storage::Cpu(CpuStorage::F8E4M3(_)) => true,
            Storage::Cuda(c) => matches!(c.buf, cuda::DevBuf::F8(_)),
            _ => false,
        }
    }

    /// Size of dimension `i` (0 when out of range).
    pub fn dim(&self, i: usize) -> usize {
        self.shape.get(i).copied().unwrap_or(0)
    }

    /// Size of the last dimension.
    pub fn last_dim(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows when viewed as `[rows, last_dim]`.
    pub fn rows(&self) -> usize {
        self.elem_count().checked_div(self.last_dim()).unwrap_or(0)
    }

    pub(crate) fn from_storage(shape: Vec<usize>, storage: Storage, dtype: DType) -> Self {
        Self { shape, storage, dtype }
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    pub(crate) fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    /// Where the tensor lives.
    pub fn device(&self) -> Device {
        match &self.storage {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(c) => Device::Cuda(c.gpu.ordinal),
        }
    }

    pub fn is_cuda(&self) -> bool {
        match &self.storage {
            Storage::Cpu(_) => false,
            Storage::Cuda(_) => true,
        }
    }

    /// The device handle of a CUDA tensor.
    pub fn gpu(&self) -> Option<&std::sync::Arc<cuda::Gpu>> {
        match &self.storage {
            Storage::Cpu(_) => None,
            Storage::Cuda(c) => Some(&c.gpu),
        }
    }

    /// The host storage of a CPU tensor.
    pub fn host(&self) -> Result<&CpuStorage> {
        match &self.storage {
            Storage::Cpu(h) => Ok(h),
            Storage::Cuda(_) => bail!(Internal, "host data of a CUDA tensor requested (use to_host)"),
        }
    }

    /// The values of a CPU tensor as `f32` (borrowed when stored as `f32`).
    pub fn host_f32(&self) -> Result<Cow<'_, [f32]>> {
        Ok(self.host()?.as_f32())
    }

    /// The `f32` values of a CPU activation.
    ///
    /// # Panics
    /// On a CUDA tensor or on half-precision host storage (an engine bug: activations on
    /// the CPU are `f32` buffers; weights are read with [`Tensor::host_f32`] / [`Tensor::host`]).
    pub fn data(&self) -> &[f32] {
        match &self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => v,
            _ => panic!("internal: f32 host data of a {} {} tensor requested", self.dtype, self.location()),
        }
    }

    /// # Panics
    /// As [`Tensor::data`].
    pub fn data_mut(&mut self) -> &mut [f32] {
        let (dt, loc) = (self.dtype, self.location());
        match &mut self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => v,
            _ => panic!("internal: f32 host data of a {dt} {loc} tensor requested"),
        }
    }

    fn location(&self) -> &'static str {
        match &self.storage {
            Storage::Cpu(h) => host_name(h),
            Storage::Cuda(_) => "CUDA",
        }
    }

    /// The values as host `f32` (downloaded from the device if needed).
    pub fn host_vec(&self) -> Result<Vec<f32>> {
        match &self.storage {
            Storage::Cpu(h) => Ok(h.to_f32_vec()),
            Storage::Cuda(c) => Ok(cuda::download(c)?.to_f32_vec()),
        }
    }

    /// The values as host `f32`, consuming the tensor.
    pub fn into_vec(self) -> Result<Vec<f32>> {
        match self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(v),
            Storage::Cpu(h) => Ok(h.to_f32_vec()),
            Storage::Cuda(c) => Ok(cuda::download(&c)?.to_f32_vec()),
        }
    }

    /// Row `i` of the `[rows, last_dim]` view of a CPU activation.
    pub fn row(&self, i: usize) -> &[f32] {
        let d = self.last_dim();
        &self.data()[i * d..(i + 1) * d]
    }

    /// Same data, new shape (element count must match).
    pub fn reshape(mut self, shape: impl Into<Vec<usize>>) -> Result<Self> {
        let shape = shape.into();
        let n: usize = shape.iter().product();
        if n != self.elem_count() {
            bail!(Shape, "cannot reshape {:?} to {:?}", self.shape, shape);
        }
        self.shape = shape;
        Ok(self)
    }

    /// Rounds `f32` host values to the tensor's own dtype (after an op that wrote f32
    /// values); a no-op for device and half-precision storage, which hold the dtype itself.
    pub fn round_(&mut self) {
        let dt = self.dtype;
        match &mut self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => dt.round_slice(v),
            Storage::Cpu(CpuStorage::BF16(_) | CpuStorage::F16(_) | CpuStorage::F8E4M3(_)) | Storage::Cuda(_) => {}
        }
    }

    /// Retags an `f32` host tensor as `dtype`, rounding its values (no copy).
    pub(crate) fn retag_host(mut self, dtype: DType) -> Result<Self> {
        match &mut self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => dtype.round_slice(v),
            _ => bail!(Internal, "retag of a non-f32 host tensor"),
        }
        self.dtype = dtype;
        Ok(self)
    }

    /// A copy on the same device, with device errors reported.
    pub fn try_clone(&self) -> Result<Tensor> {
        match &self.storage {
            Storage::Cpu(_) => Ok(self.clone()),
            Storage::Cuda(c) => {
                let buf = cuda::copy_buf(&c.gpu, &c.buf)?;
                Ok(Self::from_storage(
                    self.shape.clone(),
                    Storage::Cuda(cuda::CudaStorage { gpu: c.gpu.clone(), buf }),
                    self.dtype,
                ))
            }
        }
    }

    /// This tensor on `device` (a copy).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        match (device, &self.storage) {
            (Device::Cpu, Storage::Cpu(_)) => Ok(self.clone()),
            (Device::Cpu, Storage::Cuda(_)) => self.to_host(),
            (Device::Cuda(i), Storage::Cpu(h)) => {
                let g = cuda::gpu(i)?;
                let buf = cuda::upload_storage(&g, h, self.dtype)?;
                Ok(Self::from_storage(self.shape.clone(), Storage::Cuda(cuda::CudaStorage { gpu: g, buf }), self.dtype))
            }
            (Device::Cuda(i), Storage::Cuda(c)) if c.gpu.ordinal == i => self.try_clone(),
            (Device::Cuda(_), Storage::Cuda(_)) => self.to_host()?.to_device(device),
        }
    }

    /// A host copy as `f32` values (exact for every dtype; synchronises the stream).
    pub fn to_host(&self) -> Result<Tensor> {
        match &self.storage {
            Storage::Cpu(_) => Ok(self.clone()),
            Storage::Cuda(c) => {
                let h = CpuStorage::F32(cuda::download(c)?.to_f32_vec());
                Ok(Self::from_storage(self.shape.clone(), Storage::Cpu(h), self.dtype))
            }
        }
    }

    /// Moves the tensor to `device` (no copy when it is already there).
    pub fn into_device(self, device: Device) -> Result<Tensor> {
        if self.device() == device {
            return Ok(self);
        }
        // Context, not a new Device error: an out-of-memory error stays one.
        self.to_device(device).with_context(|| format!("moving a {:?} tensor to {device}", self.shape))
    }
}

fn host_name(h: &CpuStorage) -> &'static str {
    match h {
        CpuStorage::F32(_) => "host-f32",
        CpuStorage::BF16(_) => "host-bf16",
        CpuStorage::F16(_) => "host-f16",
        CpuStorage::F8E4M3(_) => "host-fp8",
    }
}

/// Reorders rows `[groups, Σparts, cols]` into part-major order: part 0 of every group,
/// then part 1 of every group, ...
pub fn regroup_rows<T: Copy>(data: &[T], groups: usize, parts: &[usize], cols: usize) -> Vec<T> {
    let per_group: usize = parts.iter().sum();
    let mut out = Vec::with_capacity(data.len());
    let mut off = 0;
    for &p in parts {
        for g in 0..groups {
            let start = (g * per_group + off) * cols;
            out.extend_from_slice(&data[start..start + p * cols]);
        }
        off += p;
    }
    out
}
