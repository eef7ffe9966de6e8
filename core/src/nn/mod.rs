//! Shared building blocks: linear layers, the RMSNorm variants, RoPE, GQA attention,
//! SwiGLU, sparse MoE and Gated DeltaNet, plus the embedding pre-layer and the norm +
//! lm_head post-layer.
//!
//! Each block lives here once; model crates compose them. Each has exactly one `forward`,
//! written against tensors and the backend seam ([`crate::backend::Ops`]); no block knows
//! which device it runs on. Rounding follows the HF reference: on a bf16 model every op's
//! output is rounded to bf16 while reductions (norms, softmax, GEMM accumulation) run in f32.

use crate::backend::{ops, AttnArgs, GdnArgs, GdnWeights, MoeArgs, RopeArgs};
use crate::bail;
use crate::batch::Batch;
use crate::comm::Communicator;
use crate::error::Result;
use crate::layer::{PostLayer, PreLayer};
use crate::state::LayerCache;
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;
use std::sync::Arc;

mod attention;
mod decoder;
mod embedding;
pub mod gdn;
mod head;
mod linear;
mod mlp;
mod moe;
mod norm;
mod rope;
#[cfg(test)]
mod test_util;
mod tp;

pub use crate::backend::{Act, NormKind};
pub use attention::*;
pub use decoder::*;
pub use embedding::*;
pub use gdn::{GatedDeltaNet, GdnConfig};
pub use head::*;
pub use linear::*;
pub use mlp::*;
pub use moe::*;
pub use norm::*;
pub use rope::*;
pub use tp::*;
