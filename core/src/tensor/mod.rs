//! A minimal dense tensor.
//!
//! Storage is a device enum: on the CPU, values live in `f32` buffers and are rounded to
//! the tensor's [`DType`] after each op (see [`DType`]); on a CUDA device they live in
//! device memory in the dtype itself (see [`crate::backend::cuda`]). Ops dispatch on the storage.

pub mod device;
pub mod dtype;

use crate::bail;
use crate::error::Result;
pub use device::Device;
pub use dtype::DType;

/// Whether this build carries a CUDA backend that can execute models.
pub const CUDA_BACKEND_AVAILABLE: bool = true;

/// Device-resident data of a tensor.
#[derive(Clone, Debug)]
pub enum Storage {
    /// Row-major host memory.
    Cpu(Vec<f32>),
    /// Row-major device memory in the tensor's dtype.
    Cuda(crate::backend::cuda::CudaStorage),
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
    /// Wraps host data; values are rounded to `dtype`.
    pub fn from_vec(mut data: Vec<f32>, shape: impl Into<Vec<usize>>, dtype: DType) -> Result<Self> {
        let shape = shape.into();
        let n: usize = shape.iter().product();
        if n != data.len() {
            bail!(Shape, "tensor data has {} elements but shape {:?} needs {n}", data.len(), shape);
        }
        dtype.round_slice(&mut data);
        Ok(Self { shape, storage: Storage::Cpu(data), dtype })
    }

    /// A zero-filled tensor.
    pub fn zeros(shape: impl Into<Vec<usize>>, dtype: DType) -> Self {
        let shape = shape.into();
        let n = shape.iter().product();
        Self { shape, storage: Storage::Cpu(vec![0.0; n]), dtype }
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

    /// The host values.
    ///
    /// # Panics
    /// On a CUDA tensor (an engine bug: device tensors are read with [`Tensor::to_host`]).
    pub fn data(&self) -> &[f32] {
        match &self.storage {
            Storage::Cpu(v) => v,
            Storage::Cuda(_) => panic!("internal: host data of a CUDA tensor requested (use to_host)"),
        }
    }

    /// # Panics
    /// On a CUDA tensor, as [`Tensor::data`].
    pub fn data_mut(&mut self) -> &mut [f32] {
        match &mut self.storage {
            Storage::Cpu(v) => v,
            Storage::Cuda(_) => panic!("internal: host data of a CUDA tensor requested (use to_host)"),
        }
    }

    /// The host values (downloaded from the device if needed).
    pub fn into_vec(self) -> Vec<f32> {
        match self.storage {
            Storage::Cpu(v) => v,
            Storage::Cuda(_) => self.to_host().map(Tensor::into_vec).unwrap_or_default(),
        }
    }

    /// The host values of a CPU or CUDA tensor.
    pub fn host_vec(&self) -> Result<Vec<f32>> {
        match &self.storage {
            Storage::Cpu(v) => Ok(v.clone()),
            Storage::Cuda(_) => Ok(self.to_host()?.into_vec()),
        }
    }

    /// Row `i` of the `[rows, last_dim]` view.
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

    /// Rounds the values to `dtype` and retags the tensor (a cast on the device).
    ///
    /// # Panics
    /// When a device cast fails (out of device memory); code that may see CUDA tensors uses
    /// [`Tensor::try_to_dtype`].
    pub fn to_dtype(mut self, dtype: DType) -> Self {
        if self.is_cuda() {
            if self.dtype == dtype {
                return self;
            }
            return match crate::backend::cuda::cast(&self, dtype) {
                Ok(t) => t,
                Err(e) => panic!("CUDA cast failed: {e:#}"),
            };
        }
        dtype.round_slice(self.data_mut());
        self.dtype = dtype;
        self
    }

    /// As [`Tensor::to_dtype`], with device errors reported.
    pub fn try_to_dtype(self, dtype: DType) -> Result<Self> {
        if self.is_cuda() {
            if self.dtype == dtype {
                return Ok(self);
            }
            return crate::backend::cuda::cast(&self, dtype);
        }
        Ok(self.to_dtype(dtype))
    }

    /// Rounds the values to the tensor's own dtype (after an op that wrote f32 values).
    pub fn round_(&mut self) {
        if self.is_cuda() {
            return;
        }
        let dt = self.dtype;
        dt.round_slice(self.data_mut());
    }

    /// Copies rows `[start, start + n)` of the `[rows, last_dim]` view.
    pub fn narrow_rows(&self, start: usize, n: usize) -> Result<Self> {
        let d = self.last_dim();
        if start + n > self.rows() {
            bail!(Shape, "narrow_rows {start}+{n} out of range for {} rows", self.rows());
        }
        let mut shape = vec![n];
        shape.extend_from_slice(&self.shape[self.shape.len().saturating_sub(1)..]);
        if self.is_cuda() {
            let idx: Vec<usize> = (start..start + n).collect();
            return crate::backend::cuda::gather_rows(self, &idx)?.reshape(shape);
        }
        let data = self.data()[start * d..(start + n) * d].to_vec();
        Ok(Self { shape, storage: Storage::Cpu(data), dtype: self.dtype })
    }

    /// Gathers the given rows of the `[rows, last_dim]` view into a `[idx.len(), last_dim]` tensor.
    pub fn gather_rows(&self, idx: &[usize]) -> Result<Self> {
        if self.is_cuda() {
            return crate::backend::cuda::gather_rows(self, idx);
        }
        let d = self.last_dim();
        let rows = self.rows();
        let mut data = Vec::with_capacity(idx.len() * d);
        for &i in idx {
            if i >= rows {
                bail!(Shape, "row index {i} out of range ({rows} rows)");
            }
            data.extend_from_slice(&self.data()[i * d..(i + 1) * d]);
        }
        Ok(Self { shape: vec![idx.len(), d], storage: Storage::Cpu(data), dtype: self.dtype })
    }

    /// `self += other` elementwise, rounded to the dtype (a residual add).
    pub fn add_(&mut self, other: &Tensor) -> Result<()> {
        if self.shape != other.shape {
            bail!(Shape, "add: shape mismatch {:?} vs {:?}", self.shape, other.shape);
        }
        if self.is_cuda() {
            return crate::backend::cuda::add_into(self, other);
        }
        let dt = self.dtype;
        for (a, b) in self.data_mut().iter_mut().zip(other.data()) {
            *a = dt.round(*a + *b);
        }
        Ok(())
    }

    /// `[rows, d]` times `wᵀ` with `w: [n, d]` → `[rows, n]` (`x @ w.T`), f32 accumulation,
    /// output rounded to the weight's dtype.
    pub fn matmul_t(&self, w: &Tensor) -> Result<Tensor> {
        self.matmul_t_to(w, w.dtype)
    }

    /// As [`Tensor::matmul_t`] with an explicit output dtype (e.g. f32 logits).
    pub fn matmul_t_to(&self, w: &Tensor, out_dtype: DType) -> Result<Tensor> {
        let k = self.last_dim();
        if w.shape.len() != 2 || w.shape[1] != k {
            bail!(Shape, "matmul: activation {:?} vs weight {:?}", self.shape, w.shape);
        }
        if self.is_cuda() {
            return crate::backend::cuda::matmul_t(self, w, out_dtype);
        }
        let m = self.rows();
        let n = w.shape[0];
        let mut out = vec![0.0; m * n];
        porter_kernels::cpu::ops::matmul_t(self.data(), w.data(), &mut out, m, k, n, false);
        let mut shape = self.shape.clone();
        if let Some(l) = shape.last_mut() {
            *l = n;
        }
        let mut t = Tensor { shape, storage: Storage::Cpu(out), dtype: out_dtype };
        t.round_();
        Ok(t)
    }
}
