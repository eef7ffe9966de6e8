//! Running a model: the serving engine (scheduler, continuous batching over the paged
//! cache, per-request sampling), single-request generation on top of it, and speculative
//! decoding.

pub mod batcher;
pub mod generate;
pub mod handle;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod speculative;

pub use batcher::{EngineConfig, EngineCore, SpecConfig};
pub use handle::{Engine, RequestStream};
pub use request::{EngineStats, Event, Finish, Finished, PromptToken, RequestId, TokenOut};
pub use sampling::{SamplingParams, StopParams};
