//! porter-core: the engine's model-independent core.
//!
//! Modules, each depending only on those above it (enforced by `tests/layering.rs`):
//! - [`error`]: the crate's typed [`Error`].
//! - [`tensor`]: [`Tensor`], its [`tensor::Storage`], [`DType`] and [`Device`].
//! - [`batch`]: [`Batch`] — the token ids and spans of one forward.
//! - [`backend`]: the ops the blocks need, with a CPU and a CUDA implementation side by side.
//! - [`comm`]: collectives of a tensor-parallel group ([`comm::Communicator`], the in-process
//!   [`comm::LocalGroup`]).
//! - [`state`]: the per-request state caches ([`StateCache`], [`ModelCache`]).
//! - [`layer`]: the layer traits [`PreLayer`], [`TransformerLayer`], [`PostLayer`].
//! - [`nn`]: the shared blocks (linear, norms, RoPE, attention, SwiGLU, MoE, Gated DeltaNet, …).
//! - [`model`]: [`Model`] (drives the layers over a batch) and the MTP draft heads.
//! - [`load`]: config parsing, checkpoints, declarative weight maps, model building, registry.
//! - [`engine`]: sampling, generation and speculative decoding.

pub mod backend;
pub mod batch;
pub mod comm;
pub mod engine;
pub mod error;
pub mod layer;
pub mod load;
pub mod model;
pub mod nn;
pub mod state;
pub mod tensor;

pub use batch::{Batch, SeqId, SeqSpan};
pub use engine::{generate, sampling, speculative};
pub use error::{Error, Result};
pub use layer::{LayerCost, LayerKind, PostLayer, PreLayer, TransformerLayer};
pub use load::registry::{LoadContext, ModelEntry};
pub use load::weight_map::{MapContext, Weights};
pub use load::{build, checkpoint, config, quant, registry, weight_map};
pub use model::{draft, ForwardOutput, LogitsFor, Model, ModelInfo};
pub use state::{LayerCache, ModelCache, StateCache};
pub use tensor::{device, DType, Device, Tensor};

// Re-exported so model crates can `inventory::submit!` without depending on inventory themselves.
pub use inventory;
