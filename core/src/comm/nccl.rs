//! NCCL collectives between GPUs: one [`NcclComm`] per GPU, each driven by its own thread.
//!
//! `NcclComm::group(devices)` creates a unique id and initialises every rank with
//! `ncclCommInitRank` on its own thread (one thread driving several GPUs can deadlock under
//! graph capture, NCCL warns). Collectives are queued on the GPU's stream like every kernel, so
//! they order with the GEMMs around them and can be captured in a CUDA graph. NVLink multicast
//! (NVLS) is turned off (`NCCL_NVLS_ENABLE=0`) unless the environment sets it.
//!
//! NCCL is loaded at run time (cudarc's dynamic loading): `libnccl.so` must be on the library
//! path. The PyPI wheel `nvidia-nccl-cu13` ships `libnccl.so.2`; a `libnccl.so` link to it is
//! enough. A missing library is an error here, never a panic.

use super::{Communicator, TpRank};
use crate::bail;
use crate::error::Result;
use crate::tensor::cuda::{gpu, Gpu};
use crate::tensor::{DType, Device, Tensor};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use half::{bf16, f16};
use std::fmt;
use std::sync::{Arc, Mutex};

/// One GPU's end of an NCCL group.
pub struct NcclComm {
    tp: TpRank,
    gpu: Arc<Gpu>,
    comm: Mutex<CommCell>,
}

/// `ncclComm_t` is a raw pointer; NCCL allows a communicator to be used from any one thread at
/// a time, which the mutex guarantees.
struct CommCell(Comm);
// SAFETY: the communicator is only touched while holding the `NcclComm`'s mutex (one thread at
// a time), which is how NCCL permits a communicator to be used across threads.
unsafe impl Send for CommCell {}

impl fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclComm").field("tp", &self.tp).field("device", &self.gpu.ordinal).finish()
    }
}

fn nccl_err(e: cudarc::nccl::result::NcclError) -> crate::error::Error {
    crate::err!(Device, "NCCL: {e:?}")
}

/// Whether the NCCL library can be loaded (`libnccl.so` on the library path).
pub fn nccl_available() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

impl NcclComm {
    /// One communicator per device of `devices` (CUDA ordinals, rank i on `devices[i]`),
    /// initialised concurrently, one thread per rank.
    pub fn group(devices: &[usize]) -> Result<Vec<Arc<NcclComm>>> {
        if devices.is_empty() {
            bail!(Config, "an NCCL group needs at least one device");
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(d) = devices.iter().find(|d| !seen.insert(**d)) {
            bail!(Config, "cuda:{d} appears twice in the NCCL group (NCCL needs one GPU per rank)");
        }
        if !nccl_available() {
            bail!(
                Device,
                "NCCL not found: put libnccl.so on LD_LIBRARY_PATH (the nvidia-nccl-cu13 wheel ships libnccl.so.2; link it as libnccl.so)"
            );
        }
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // Before any NCCL call reads it; porter never starts NVLink multicast (see the
            // device notes: it can hang on shared machines).
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
        }
        let gpus = devices.iter().map(|&d| gpu(d)).collect::<Result<Vec<_>>>()?;
        let id = Id::new().map_err(nccl_err)?;
        let world = devices.len();
        let comms: Vec<Result<CommCell>> = std::thread::scope(|s| {
            let hs: Vec<_> = gpus
                .iter()
                .enumerate()
                .map(|(rank, g)| {
                    let stream = g.stream().clone();
                    s.spawn(move || {
                        stream.context().bind_to_thread().map_err(|e| crate::err!(Device, "cuda: {e:?}"))?;
                        Comm::from_rank(stream, rank, world, id).map(CommCell).map_err(nccl_err)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(crate::err!(Internal, "an NCCL init thread panicked"))))
                .collect()
        });
        comms
            .into_iter()
            .zip(gpus)
            .enumerate()
            .map(|(rank, (c, gpu))| Ok(Arc::new(NcclComm { tp: TpRank { rank, world }, gpu, comm: Mutex::new(c?) })))
            .collect()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, CommCell>> {
        self.comm.lock().map_err(|_| crate::err!(Internal, "NCCL communicator lock poisoned"))
    }

    fn check(&self, t: &Tensor, op: &str) -> Result<()> {
        if t.device() != Device::Cuda(self.gpu.ordinal) {
            bail!(Device, "{op}: a tensor on {:?} given to the NCCL rank on cuda:{}", t.device(), self.gpu.ordinal);
        }
        Ok(())
    }
}

impl Communicator for NcclComm {
    fn tp(&self) -> TpRank {
        self.tp
    }

    /// In place, in the tensor's dtype: f32 activations sum in f32; a bf16 partial is summed by
    /// NCCL in bf16 arithmetic (with two ranks one rounding, as the f32 sum rounded once).
    fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()> {
        self.check(t, "all-reduce")?;
        let c = self.lock()?;
        match t.dtype() {
            DType::F32 => c.0.all_reduce_in_place(t.dev_mut::<f32>()?, &ReduceOp::Sum),
            DType::BF16 => c.0.all_reduce_in_place(t.dev_mut::<bf16>()?, &ReduceOp::Sum),
            DType::F16 => c.0.all_reduce_in_place(t.dev_mut::<f16>()?, &ReduceOp::Sum),
        }
        .map_err(nccl_err)?;
        Ok(())
    }

    fn all_gather_last(&self, t: &Tensor) -> Result<Tensor> {
        self.check(t, "all-gather")?;
        let world = self.tp.world;
        if world == 1 {
            return t.try_clone();
        }
        let (rows, cols) = (t.rows(), t.last_dim());
        // NCCL gathers rank-major: [world · rows, cols]; then the ranks' blocks side by side.
        let mut all = Tensor::empty_on(&self.gpu, [world * rows, cols], t.dtype())?;
        {
            let c = self.lock()?;
            match t.dtype() {
                DType::F32 => c.0.all_gather(t.dev::<f32>()?, all.dev_mut::<f32>()?),
                DType::BF16 => c.0.all_gather(t.dev::<bf16>()?, all.dev_mut::<bf16>()?),
                DType::F16 => c.0.all_gather(t.dev::<f16>()?, all.dev_mut::<f16>()?),
            }
            .map_err(nccl_err)?;
        }
        let mut out = all.narrow_rows(0, rows)?;
        for r in 1..world {
            out = out.concat_last(&all.narrow_rows(r * rows, rows)?)?;
        }
        let mut shape = t.shape().to_vec();
        if let Some(l) = shape.last_mut() {
            *l = world * cols;
        }
        out.reshape(shape)
    }
}
