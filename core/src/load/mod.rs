//! Loading: `config.json` parsing and validation, safetensors checkpoints, the declarative
//! weight maps, the model-building helpers and the registry of model crates.

pub mod build;
pub mod checkpoint;
pub mod config;
pub mod map_file;
pub mod quant;
pub mod registry;
pub mod shard;
pub mod weight_map;
pub mod weights;
