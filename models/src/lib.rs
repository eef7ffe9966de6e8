//! The umbrella of model crates.
//!
//! rustc links a crate only when something references it, and a model crate's
//! `inventory::submit!` registration is lost with it (rust-lang/cargo#9391). The runner and
//! the tests reference this crate (`use models as _;`), and this crate references every
//! model crate. Adding a model crate means adding one line here and one in `Cargo.toml`.

use llama as _;
use mistral as _;
use mistral_mtp as _;
use qwen3 as _;
use qwen3_moe as _;
use qwen3_moe_mtp as _;
use qwen3_next as _;
use qwen3_next_mtp as _;

/// Call from a binary or test to make sure every model crate is linked.
pub fn link() {}
