//! The backend seam: the ops the shared blocks need ([`Ops`]), with a CPU ([`cpu`]) and a
//! CUDA ([`cuda`]) implementation side by side, and the per-layer state buffers the
//! stateful ops read and write ([`KvCache`], [`RecCache`]).
//!
//! A block calls `ops(&x).rms_norm(..)` once; [`ops`] is one exhaustive `match` on the
//! tensor's [`Storage`], so a new backend is a new `Storage` variant plus one `Ops` impl and
//! the compiler lists every place that must learn about it. The tensor-level ops
//! (`matmul_t`, `add_`, `gather_rows`, …) are methods on [`Tensor`] defined here on top of
//! the same dispatch.

mod attn_args;
pub mod cpu;
mod cpu_state;
pub mod cuda;
mod gate_in;
mod kv_dtype;

pub use attn_args::*;
pub use gate_in::GateIn;
pub use kv_dtype::{KvDtype, KvQuant};
/// The elementwise activations of `hidden_act` (the gate activation of the gated MLPs and
/// MoE experts, and the Gated DeltaNet conv activation).
pub use porter_kernels::cpu::Act;

use crate::bail;
use crate::batch::PageStep;
use crate::batch::{Batch, SeqId};
use crate::error::Result;
use crate::tensor::{DType, Device, Storage, Tensor};

/// Which RMSNorm formula a norm uses (models.md §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// Llama style: `w · round(x·rsqrt(mean(x²)+eps))` (Qwen3, Qwen3-MoE, Mistral, Llama).
    Standard,
    /// Zero-centred: `x·rsqrt(mean(x²)+eps)·(1+w)`, all f32, one rounding (Qwen3-Next).
    ZeroCentred,
}

/// MoE routing of one block.
#[derive(Debug, Clone, Copy)]
pub struct MoeArgs {
    /// Routed experts (the first `experts` columns of the router logits).
    pub experts: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    /// Whether a shared expert is added after the routed experts (backends that round the
    /// MoE output to the model dtype then round after that addition instead).
    pub shared: bool,
    /// The experts' gate activation (`hidden_act`).
    pub act: Act,
}

/// The shared expert of a MoE block, handed to `Ops::moe_experts`, which may fuse it into
/// the routed experts (the CUDA backend's direct decode form) or leave it to the caller.
///
/// # Shapes
/// - `gu`: see [`SharedIn`]
/// - `gate`: f32 `[T, > gate_col]`: the shared expert gate logit at column `gate_col` (as
///   `Ops::shared_expert_add` reads it)
/// - `down`: `[H, inter]`, a plain projection (no bias, no tensor-parallel reduction)
#[derive(Debug, Clone, Copy)]
pub struct MoeShared<'a> {
    pub gu: SharedIn<'a>,
    pub gate: &'a Tensor,
    pub gate_col: usize,
    pub down: &'a Tensor,
    /// Intermediate size `I_s`.
    pub inter: usize,
}

/// The gate / up products of a [`MoeShared`] expert.
///
/// # Shapes
/// - `Cols`: `gu` f32 `[T, ≥ col0 + 2·inter]`: the shared gate at columns `col0 .. col0 +
///   inter`, up at `col0 + inter .. col0 + 2·inter` (as `Ops::swiglu_cols` reads them)
/// - `Weights`: the `[gate; up]` weight `[2·inter, H]`, a plain projection of the block's
///   input `x`: a backend that fuses the shared expert computes the products itself (the
///   FP8 checkpoints hold these rows apart from the bf16 router's, so no input GEMM did);
///   one that does not leaves them to the caller
#[derive(Debug, Clone, Copy)]
pub enum SharedIn<'a> {
    /// f32 columns of a GEMM output.
    Cols { gu: &'a Tensor, col0: usize },
    /// The weight of the products.
    Weights(&'a Tensor),
}

/// Gated DeltaNet geometry (see `nn::GdnConfig`).
#[derive(Debug, Clone, Copy)]
pub struct GdnArgs {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
    /// The activation after the causal conv (`hidden_act`; the gated norm's gate stays SiLU).
    pub act: Act,
}

impl GdnArgs {
    /// Where the `[b | a]` gate inputs are: `(tensor, first column)`, columns
    /// `conv_dim + Hv·dv ..` of `p` (`[T, conv_dim + Hv·dv + 2·Hv]`) without `ba`, else
    /// columns `0..2·Hv` of `ba` (`[T, 2·Hv]`, `p` then `[T, conv_dim + Hv·dv]`). The row
    /// stride is the tensor's last dimension.
    ///
    /// # Errors
    /// [`Error::Shape`](crate::error::Error) when the widths, row counts or dtypes disagree.
    pub fn gate_cols<'a>(&self, p: &'a Tensor, ba: Option<&'a Tensor>) -> Result<(&'a Tensor, usize)> {
        let (hv, proj) = (self.value_heads, self.conv_dim() + self.value_heads * self.value_dim);
        match ba {
            None if p.last_dim() == proj + 2 * hv => Ok((p, proj)),
            Some(b)
                if p.last_dim() == proj && b.last_dim() == 2 * hv && b.rows() == p.rows() && b.dtype() == p.dtype() =>
            {
                Ok((b, 0))
            }
            _ => bail!(
                Shape,
                "Gated DeltaNet projections {:?} ({}) with gate inputs {:?} do not fit {self:?}",
                p.shape(),
                p.dtype(),
                ba.map(|b| (b.shape().to_vec(), b.dtype()))
            ),
        }
    }

    /// Conv channels `2·Hk·dk + Hv·dv`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }
}

/// The small f32 weights of a Gated DeltaNet block, on the activations' device.
///
/// # Shapes
/// `conv_w: [conv_dim, K]`, `a_log`, `dt_bias`: `[Hv]`, all f32
#[derive(Debug, Clone, Copy)]
pub struct GdnWeights<'a> {
    pub conv_w: &'a Tensor,
    pub a_log: &'a Tensor,
    pub dt_bias: &'a Tensor,
}

/// What [`Ops::norm_matmul`] computes.
///
/// # Shapes
/// `normed`: `[T, d]` in the norm's dtype, `out`: `[T, n]`, `sum`: `[T, d]` f32
#[derive(Debug)]
pub struct NormMatmul {
    /// The normalised rows.
    pub normed: Tensor,
    /// `normed · wᵀ`.
    pub out: Tensor,
    /// The new residual `x + y` (when `y` was given).
    pub sum: Option<Tensor>,
}

/// The ops of one backend. Inputs live on that backend; shapes are checked by the callers
/// (the blocks) and again where a kernel needs it.
pub trait Ops: Sync {
    /// `x · wᵀ`: `[.., k] × [n, k]ᵀ → [.., n]` in `out` (f32 accumulation).
    fn matmul_t(&self, x: &Tensor, w: &Tensor, out: DType) -> Result<Tensor>;
    /// `x += y`, rounded to `x`'s dtype (residual adds: `x` is the f32 stream).
    fn add_(&self, x: &mut Tensor, y: &Tensor) -> Result<()>;
    /// `y[r] += b` per row, rounded to `y`'s dtype.
    fn add_bias(&self, y: &mut Tensor, b: &Tensor) -> Result<()>;
    /// The values rounded to `dtype`.
    fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor>;
    /// Rows `idx` of the `[rows, d]` view → `[idx.len(), d]`.
    fn gather_rows(&self, x: &Tensor, idx: &[usize]) -> Result<Tensor>;
    /// Columns `col0..col0 + n` of the `[rows, d]` view → `[rows, n]`.
    fn cols(&self, x: &Tensor, col0: usize, n: usize) -> Result<Tensor>;
    /// `[a | b]` along the last dimension: `[T, d1]`, `[T, d2]` → `[T, d1 + d2]`.
    fn concat_last(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// Parts stacked along the first dimension: `[n_i, ...]` → `[Σ n_i, ...]` (load-time packing).
    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor>;

    /// Rows `ids` of `table: [vocab, hidden]` as the f32 residual stream `[T, hidden]`.
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor>;
    /// RMSNorm over the last `w.len()` values: `[.., d]` → `[.., d]` in `w`'s dtype.
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, kind: NormKind) -> Result<Tensor>;
    /// `x += y` (the f32 residual stream) fused with the RMSNorm of the sum; returns the norm.
    fn add_rms_norm(&self, x: &mut Tensor, y: &Tensor, w: &Tensor, eps: f32, kind: NormKind) -> Result<Tensor>;
    /// The RMSNorm of the f32 residual `x` (with `y`: of `x + y`) and its product with the
    /// plain weight `w` (`[n, d]`, output `out`), in one op where the backend fuses them
    /// (decode-sized batches on CUDA), with the same values as `rms_norm` / `add_rms_norm`
    /// followed by `matmul_t`. `Ok(None)` where it does not: the caller runs those ops. With
    /// `y`, the new residual comes back in [`NormMatmul::sum`] and `x` is left unchanged.
    #[allow(clippy::too_many_arguments)]
    fn norm_matmul(
        &self,
        _x: &Tensor,
        _y: Option<&Tensor>,
        _norm_w: &Tensor,
        _eps: f32,
        _kind: NormKind,
        _w: &Tensor,
        _out: DType,
    ) -> Result<Option<NormMatmul>> {
        Ok(None)
    }
    /// Rotates `x: [T, heads, head_dim]` in place at the batch's positions (NeoX pairing).
    fn rope(&self, x: &mut Tensor, rope: &RopeArgs<'_>, batch: &Batch) -> Result<()>;
    /// An attention block's query / key preparation: the gate split of a gated query
    /// projection, the per-head q / k norms and RoPE at the batch's positions, with the values
    /// of [`qk_prep_composed`] (one launch on CUDA where it applies).
    ///
    /// # Shapes
    /// `qg`: `[T, heads·hd·(1 + gated)]`, `k`: `[T, kv_heads·hd]` → [`QkPrepared`]
    fn qk_prep(&self, qg: Tensor, k: Tensor, p: &QkPrep<'_>, batch: &Batch) -> Result<QkPrepared> {
        qk_prep_composed(self, qg, k, p, batch)
    }
    /// [`Ops::qk_prep`] of a packed projection (one GEMM for q, k and v: each row
    /// `[qg | k | v]`), which also returns v; the values of [`qkv_prep_composed`] (one launch on
    /// CUDA where it applies).
    ///
    /// # Shapes
    /// `qkv`: `[T, heads·hd·(1 + gated) + 2·kv_heads·hd]` → ([`QkPrepared`], v `[T, kv_heads·hd]`)
    fn qkv_prep(&self, qkv: Tensor, p: &QkPrep<'_>, batch: &Batch) -> Result<(QkPrepared, Tensor)> {
        qkv_prep_composed(self, qkv, p, batch)
    }
    /// `act(g) · u` of a stacked `[T, 2I] = [gate | up]` → `[T, I]`, one rounding (SwiGLU for
    /// `act` = SiLU). Backends that fuse SiLU refuse another `act` (the load refuses it first:
    /// `config::check_act_device`).
    fn swiglu(&self, gate_up: &Tensor, act: Act) -> Result<Tensor>;
    /// `x *= sigmoid(gate)` elementwise (same shape; both rounded as the dtype).
    fn sigmoid_gate_mul(&self, x: &mut Tensor, gate: &Tensor) -> Result<()>;
    /// Appends the batch's keys / values to `kv` and attends causally:
    /// `q: [T, heads, hd]`, `k`, `v`: `[T, kv_heads, hd]` → `[T, heads, hd]`.
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        a: &AttnArgs,
        batch: &Batch,
        kv: &mut KvCache,
    ) -> Result<Tensor>;
    /// [`Ops::attention`], then with `gate` (`[T·heads, hd]`, a gated attention's output
    /// gate) [`Ops::sigmoid_gate_mul`] of its output: the two ops by default; the CUDA decode
    /// kernels apply the gate as they write each row (same values).
    #[allow(clippy::too_many_arguments)]
    fn attention_gated(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        gate: Option<&Tensor>,
        a: &AttnArgs,
        batch: &Batch,
        kv: &mut KvCache,
    ) -> Result<Tensor> {
        let out = self.attention(q, k, v, a, batch, kv)?;
        gate_after(self, out, gate, a)
    }
    /// Routed experts: softmax router over the first `m.experts` f32 columns of `logits`
    /// (`[T, ≥ E]`), top-k, optional renormalisation, the grouped expert SwiGLUs
    /// (`act(gate·x) · (up·x)` with `m.act`; `gate`, `up`: `[E, I, H]`, `down`: `[E, H, I]`) and
    /// their weighted sum → `[T, H]` f32,
    /// added to the f32 residual stream. The CPU backend rounds the MoE output's values to
    /// the model dtype once (after the shared expert when `m.shared`), as HF's bf16 hidden
    /// states are; the CUDA backend keeps it in f32 (one kernel fewer per layer; both are
    /// within the parity bounds).
    ///
    /// With `shared`, the backend may add the shared expert
    /// (`y += sigmoid(round(g)) · round(down_s · swiglu_cols(gu))`) in the same kernels; the
    /// flag returned says whether it did (else the caller runs `swiglu_cols`, the down
    /// projection and `shared_expert_add`). Fused or not, the result differs only in the
    /// summation order of the shared down projection's dot products.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts(
        &self,
        x: &Tensor,
        logits: &Tensor,
        m: &MoeArgs,
        gate: &Tensor,
        up: &Tensor,
        down: &Tensor,
        shared: Option<&MoeShared<'_>>,
    ) -> Result<(Tensor, bool)>;
    /// `act(g) · u` from f32 columns `[col0, col0 + I)` (gate) and `[col0 + I, col0 + 2I)`
    /// (up) of `all`, each rounded to `dtype` first as a GEMM output would be → `[T, I]`.
    fn swiglu_cols(&self, all: &Tensor, col0: usize, inter: usize, dtype: DType, act: Act) -> Result<Tensor>;
    /// `y += sigmoid(round(all[:, gate_col])) · so` per row (`y` f32 `[T, H]`).
    fn shared_expert_add(&self, y: &mut Tensor, so: &Tensor, all: &Tensor, gate_col: usize) -> Result<()>;
    /// The Gated DeltaNet core on the stacked projections `p: [T, conv_dim + Hv·dv + 2·Hv]`
    /// (`[q | k | v | z | b | a]`, `gates` = [`GateIn::Packed`]), or `p: [T, conv_dim + Hv·dv]`
    /// and the gate inputs `[b | a]` apart where `in_proj_ba` is held apart: a tensor read in
    /// place ([`GateIn::Cols`]) or `in_proj_ba`'s product for the backend to compute
    /// ([`GateIn::Proj`]): causal conv + `g.act` continuing each slot's window, gates,
    /// L2-normalised q / k, the delta rule on the slot's state (per-token snapshots in a
    /// speculative step) → `[T·Hv, dv]` in `p`'s dtype.
    fn gdn(
        &self,
        p: &Tensor,
        gates: GateIn<'_>,
        w: &GdnWeights<'_>,
        g: &GdnArgs,
        batch: &Batch,
        rec: &mut RecCache,
    ) -> Result<Tensor>;
    /// Gated RMSNorm per value head with SiLU(z), `z` read from columns `zoff..` of `p`:
    /// `o: [T·Hv, dv]` → `[T·Hv, dv]`.
    fn gated_norm(&self, o: &Tensor, p: &Tensor, w: &Tensor, zoff: usize, eps: f32) -> Result<Tensor>;
    /// [`Ops::gdn`] followed by [`Ops::gated_norm`] with `norm_w` (`[dv]`) and z at column
    /// `conv_dim` of `p`: `[T·Hv, dv]`, normalised. A backend may run them as one launch (the
    /// CUDA backend's decode / verify steps with `PORTER_GDN_FUSED=on`); the default runs the
    /// two ops.
    #[allow(clippy::too_many_arguments)]
    fn gdn_gated(
        &self,
        p: &Tensor,
        gates: GateIn<'_>,
        w: &GdnWeights<'_>,
        g: &GdnArgs,
        batch: &Batch,
        rec: &mut RecCache,
        norm_w: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        let core = self.gdn(p, gates, w, g, batch, rec)?;
        self.gated_norm(&core, p, norm_w, g.conv_dim(), eps)
    }
}

/// The ops of the backend `t` lives on.
pub fn ops(t: &Tensor) -> &'static dyn Ops {
    match t.storage() {
        Storage::Cpu(_) => &cpu::CpuOps,
        Storage::Cuda(_) => &cuda::CudaOps,
    }
}

// ---------------------------------------------------------------------------------------
// Tensor-level ops (methods on Tensor, dispatched through `ops`)
// ---------------------------------------------------------------------------------------

impl Tensor {
    /// `[rows, d] × wᵀ` with `w: [n, d]` → `[rows, n]` (`x @ w.T`), f32 accumulation, output
    /// rounded to the weight's dtype.
    pub fn matmul_t(&self, w: &Tensor) -> Result<Tensor> {
        self.matmul_t_to(w, w.dtype())
    }

    /// As [`Tensor::matmul_t`] with an explicit output dtype (e.g. f32 logits).
    pub fn matmul_t_to(&self, w: &Tensor, out: DType) -> Result<Tensor> {
        if w.shape().len() != 2 || w.dim(1) != self.last_dim() {
            bail!(Shape, "matmul: activation {:?} vs weight {:?}", self.shape(), w.shape());
        }
        same_device(self, w, "matmul")?;
        ops(self).matmul_t(self, w, out)
    }

    /// `self += other` elementwise, rounded to `self`'s dtype (a residual add).
    pub fn add_(&mut self, other: &Tensor) -> Result<()> {
        if self.shape() != other.shape() {
            bail!(Shape, "add: shape mismatch {:?} vs {:?}", self.shape(), other.shape());
        }
        same_device(self, other, "add")?;
        ops(self).add_(self, other)
    }

    /// Rounds the values to `dtype` and retags the tensor (a cast on the device).
    pub fn try_to_dtype(self, dtype: DType) -> Result<Self> {
        if self.dtype() == dtype {
            return Ok(self);
        }
        match self.storage() {
            Storage::Cpu(crate::tensor::CpuStorage::F32(_)) => self.retag_host(dtype),
            Storage::Cpu(_) | Storage::Cuda(_) => ops(&self).cast(&self, dtype),
        }
    }

    /// Copies rows `[start, start + n)` of the `[rows, last_dim]` view.
    pub fn narrow_rows(&self, start: usize, n: usize) -> Result<Self> {
        if start + n > self.rows() {
            bail!(Shape, "narrow_rows {start}+{n} out of range for {} rows", self.rows());
        }
        let idx: Vec<usize> = (start..start + n).collect();
        self.gather_rows(&idx)
    }

    /// Gathers the given rows of the `[rows, last_dim]` view into `[idx.len(), last_dim]`.
    pub fn gather_rows(&self, idx: &[usize]) -> Result<Self> {
        let rows = self.rows();
        if let Some(&bad) = idx.iter().find(|&&i| i >= rows) {
            bail!(Shape, "row index {bad} out of range ({rows} rows)");
        }
        ops(self).gather_rows(self, idx)
    }

    /// Columns `col0..col0 + n` of the `[rows, last_dim]` view → `[rows, n]`.
    pub fn cols(&self, col0: usize, n: usize) -> Result<Self> {
        if col0 + n > self.last_dim() {
            bail!(Shape, "columns {col0}+{n} out of range for {:?}", self.shape());
        }
        ops(self).cols(self, col0, n)
    }

    /// `[self | other]` along the last dimension (same dtype, same rows).
    pub fn concat_last(&self, other: &Tensor) -> Result<Self> {
        if self.rows() != other.rows() || self.dtype() != other.dtype() {
            bail!(Shape, "concat: {:?} {} vs {:?} {}", self.shape(), self.dtype(), other.shape(), other.dtype());
        }
        same_device(self, other, "concat")?;
        ops(self).concat_last(self, other)
    }
}

impl Tensor {
    /// Parts with equal trailing dimensions and dtype stacked along the first dimension.
    pub fn concat_rows(parts: &[&Tensor]) -> Result<Tensor> {
        let first = parts.first().ok_or_else(|| crate::err!(Internal, "concat_rows of no tensors"))?;
        for p in parts {
            if p.shape().get(1..) != first.shape().get(1..) || p.dtype() != first.dtype() {
                bail!(Shape, "concat_rows: {:?} {} vs {:?} {}", p.shape(), p.dtype(), first.shape(), first.dtype());
            }
            same_device(p, first, "concat_rows")?;
        }
        ops(first).concat_rows(parts)
    }
}

fn same_device(a: &Tensor, b: &Tensor, op: &str) -> Result<()> {
    if a.device() != b.device() {
        bail!(Internal, "{op}: operands on {} and {}", a.device(), b.device());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Per-layer state buffers
// ---------------------------------------------------------------------------------------

/// Key / value pool of one attention layer, on one backend.
#[derive(Debug, Clone)]
pub enum KvBuf {
    Cpu(cpu::CpuKv),
    Cuda(cuda::CudaKv),
}

/// Paged key / value cache of one attention layer: one pool of `num_blocks` blocks of
/// `block_size` token rows, shared by every sequence. Which blocks a sequence owns is the
/// model cache's business (its block manager); each forward hands every attention layer the
/// same [`PageStep`] (`step`), which says where the step's rows go and where each
/// sequence's keys live.
///
/// # Shapes
/// pool: `k`, `v`: `[num_blocks · block_size, kv_heads, head_dim]` in the model dtype (on the
/// CPU as f32 values rounded to it, grown as blocks are first written; on a GPU allocated up
/// front), or with a quantized `dtype` ([`KvDtype::Fp8`], [`KvDtype::Int8`]) one byte per
/// element plus scales `[num_blocks · block_size, kv_heads]` f32 for each of K and V
#[derive(Debug, Clone)]
pub struct KvCache {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    /// What K and V are stored as.
    pub dtype: KvDtype,
    /// The current forward's paging metadata (set by the model cache before each forward).
    pub step: Option<std::sync::Arc<PageStep>>,
    pub buf: KvBuf,
}

impl KvCache {
    /// A pool of `num_blocks` blocks of `block_size` rows on `device`, of the model dtype
    /// `dtype` or quantized as `kv`.
    ///
    /// # Errors
    /// A device allocation error (the message names the bytes asked for).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: Device,
        kv_heads: usize,
        head_dim: usize,
        dtype: DType,
        kv: KvDtype,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self> {
        crate::ensure!(block_size > 0, Cache, "KV block size must be > 0");
        let rows = num_blocks
            .checked_mul(block_size)
            .filter(|r| *r <= u32::MAX as usize)
            .ok_or_else(|| crate::err!(Cache, "{num_blocks} KV blocks of {block_size} rows exceed 2^32 rows"))?;
        let buf = match device {
            Device::Cpu => KvBuf::Cpu(cpu::CpuKv::new(kv_heads, head_dim, rows, dtype, kv.quant())),
            Device::Cuda(i) => KvBuf::Cuda(cuda::CudaKv::new(
                crate::tensor::cuda::gpu(i)?,
                kv_heads,
                head_dim,
                dtype,
                kv.quant(),
                rows,
            )?),
        };
        Ok(Self { kv_heads, head_dim, block_size, num_blocks, dtype: kv, step: None, buf })
    }

    /// The step's paging metadata, checked against the batch.
    pub fn step_for(&self, batch: &Batch) -> Result<std::sync::Arc<PageStep>> {
        let Some(step) = &self.step else {
            bail!(Internal, "attention layer called without paging metadata (the cache's prepare was not run)")
        };
        if step.slots.len() != batch.len() || step.tables.len() != batch.spans.len() * step.max_blocks {
            bail!(
                Internal,
                "paging metadata of {} rows does not match a batch of {} rows",
                step.slots.len(),
                batch.len()
            );
        }
        if step.block_size != self.block_size {
            bail!(Internal, "paging metadata for blocks of {} rows, pool of {}", step.block_size, self.block_size);
        }
        Ok(step.clone())
    }
}

/// Rollback bookkeeping of one recurrent slot, shared by every backend: which SSM buffer
/// holds the current state and which tokens of the last step can still be rejected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollbackMeta {
    /// Newest conv-window entries rolled back (skipped by the next step).
    pub lag: usize,
    /// SSM buffer holding the current state.
    pub cur: usize,
    /// Tokens consumed before the last step.
    pub base: usize,
    /// Tokens of the last step whose post-token states are kept (buffer j = state after
    /// token `base + j`); 0 when only the final state is kept.
    pub kept: usize,
}

impl RollbackMeta {
    /// Whether the slot can roll back from `from` to `to` consumed tokens.
    pub fn can_rollback(&self, from: usize, to: usize) -> bool {
        to == from || (self.kept > 0 && to > self.base && from == self.base + self.kept)
    }

    /// Records a step of `len` tokens at `pos0`; with snapshots, the state after token j
    /// goes to buffer j.
    pub fn start_step(&mut self, pos0: usize, len: usize, snapshots: bool) {
        self.lag = 0;
        self.base = pos0;
        if snapshots {
            self.kept = len;
            self.cur = len - 1;
        } else {
            self.kept = 0;
        }
    }
}

/// Conv-window and SSM storage of one linear-attention layer, on one backend.
#[derive(Debug, Clone)]
pub enum RecBuf {
    Cpu(cpu::CpuRec),
    Cuda(cuda::CudaRec),
}

/// Conv and SSM state of one linear-attention (Gated DeltaNet) layer for every slot.
///
/// For speculative decoding the layer keeps `spec + 1` SSM buffers and a conv window of
/// `kernel − 1 + spec` inputs per slot (engine.md §4.6): a step of `t ≤ spec + 1` tokens
/// writes the state after each token into its own buffer, so rejecting draft tokens only
/// moves the `cur` index and marks conv inputs as rolled back; nothing is recomputed or
/// copied back. Only tokens of the last step can be rejected.
///
/// # Shapes
/// per slot: conv window `[conv_dim, kernel − 1 + spec]` (oldest first), `spec + 1` SSM
/// states `[Hv, dk, dv]` f32
#[derive(Debug, Clone)]
pub struct RecCache {
    pub conv_dim: usize,
    pub kernel: usize,
    pub state_len: usize,
    /// Maximum draft tokens that can be rolled back (0: no snapshots).
    pub spec: usize,
    pub meta: Vec<RollbackMeta>,
    /// The current forward's checkpoints to save (set by the model cache's prepare).
    pub ckpt_step: Option<std::sync::Arc<Vec<CkptSave>>>,
    pub buf: RecBuf,
}

/// A recurrent-state checkpoint to save during a forward: the state of span `span` after
/// position `pos` (exclusive end; chunk-aligned) goes to checkpoint slot `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CkptSave {
    pub span: usize,
    pub pos: usize,
    pub slot: usize,
}

impl RecCache {
    /// State for `max_slots` slots and `checkpoints` prefix-cache checkpoints on `device`
    /// (allocated up front on a GPU).
    pub fn new(
        device: Device,
        conv_dim: usize,
        kernel: usize,
        state_len: usize,
        spec: usize,
        max_slots: usize,
        checkpoints: usize,
    ) -> Result<Self> {
        let buf = match device {
            Device::Cpu => RecBuf::Cpu(cpu::CpuRec::default()),
            Device::Cuda(i) => RecBuf::Cuda(cuda::CudaRec::new(
                crate::tensor::cuda::gpu(i)?,
                conv_dim,
                kernel.saturating_sub(1) + spec,
                (spec + 1, state_len),
                max_slots,
                checkpoints,
            )?),
        };
        Ok(Self {
            conv_dim,
            kernel,
            state_len,
            spec,
            meta: vec![RollbackMeta::default(); max_slots],
            ckpt_step: None,
            buf,
        })
    }

    /// Makes slot `seq` hold checkpoint `c` as its current state (a prefix-cache hit).
    pub fn restore(&mut self, seq: SeqId, c: usize) -> Result<()> {
        let nbuf = self.spec + 1;
        let state_len = self.state_len;
        *self.meta_mut(seq)? = RollbackMeta::default();
        match &mut self.buf {
            RecBuf::Cpu(b) => b.restore(seq, c, nbuf, state_len),
            RecBuf::Cuda(b) => b.restore(seq, c),
        }
    }

    /// Conv window length per slot.
    pub fn window(&self) -> usize {
        (self.kernel.saturating_sub(1) + self.spec).max(1)
    }

    /// Whether a step of `t` tokens keeps a state per token (rollback possible).
    pub fn snapshots_for(&self, t: usize) -> bool {
        self.spec > 0 && t <= self.spec + 1
    }

    /// The slot's bookkeeping.
    pub fn meta_mut(&mut self, seq: SeqId) -> Result<&mut RollbackMeta> {
        let n = self.meta.len();
        self.meta
            .get_mut(seq.0)
            .ok_or_else(|| crate::err!(Cache, "sequence slot {} exceeds the {n} recurrent slots", seq.0))
    }

    /// Whether slot `seq` can roll back from `from` to `to` consumed tokens.
    pub fn can_rollback(&self, seq: SeqId, from: usize, to: usize) -> bool {
        match self.meta.get(seq.0) {
            Some(m) => m.can_rollback(from, to),
            None => to == from,
        }
    }

    /// Rolls slot `seq` back from `from` to `to` consumed tokens (`to ≤ from`).
    pub fn rollback(&mut self, seq: SeqId, from: usize, to: usize) -> Result<()> {
        if to == from {
            return Ok(());
        }
        if !self.can_rollback(seq, from, to) {
            bail!(
                Cache,
                "cannot roll the recurrent state of slot {} back from {from} to {to} tokens: only the tokens of the last step (at most the speculative window) can be rejected",
                seq.0
            );
        }
        let m = self.meta_mut(seq)?;
        m.cur = to - m.base - 1;
        m.kept = to - m.base;
        m.lag += from - to;
        Ok(())
    }

    /// Resets a slot (zeroed window and state).
    pub fn clear(&mut self, seq: SeqId) -> Result<()> {
        if let Some(m) = self.meta.get_mut(seq.0) {
            *m = RollbackMeta::default();
        }
        match &mut self.buf {
            RecBuf::Cpu(b) => {
                b.clear(seq);
                Ok(())
            }
            RecBuf::Cuda(b) => b.clear(seq),
        }
    }
}
