//! porter-core: the engine's model-independent core.
//!
//! - [`tensor`]: a small tensor type with a device/storage abstraction (CPU and CUDA).
//! - [`gpu`]: the CUDA backend (device handle, device buffers, device ops and caches).
//! - [`layers`]: the layer traits [`PreLayer`], [`TransformerLayer`], [`PostLayer`] and the
//!   generic [`Model`] that drives them (LightLLM's pre / transformer / post split).
//! - [`cache`]: the [`StateCache`] trait and the slot-indexed per-request state pools.
//! - [`registry`]: the `inventory` registry of model crates, keyed by HF `architectures`.
//! - [`weight_map`] + [`checkpoint`]: declarative checkpoint-name → engine-slot maps and
//!   memory-mapped safetensors loading.
//! - [`nn`]: shared blocks (RMSNorm variants, RoPE, GQA attention, SwiGLU, MoE).
//! - [`config`]: HF `config.json` / `generation_config.json` helpers.
//! - [`sampling`]: greedy / temperature / top-k / top-p sampling.

pub mod cache;
pub mod checkpoint;
pub mod config;
pub mod device;
pub mod draft;
pub mod dtype;
pub mod generate;
pub mod gpu;
pub mod gpu_blocks;
pub mod layers;
pub mod linear_attn;
pub mod nn;
pub mod registry;
pub mod sampling;
pub mod speculative;
pub mod tensor;
pub mod weight_map;

pub use cache::{LayerCache, ModelCache, SeqId, StateCache};
pub use device::Device;
pub use dtype::DType;
pub use layers::{
    Batch, ForwardOutput, LayerKind, LogitsFor, Model, ModelInfo, PostLayer, PreLayer, SeqSpan, TransformerLayer,
};
pub use registry::{LoadContext, ModelEntry};
pub use tensor::Tensor;
pub use weight_map::{MapContext, Weights};

// Re-exported so model crates can `inventory::submit!` without depending on inventory themselves.
pub use inventory;
