//! Running a model: sampling, generation and speculative decoding.

pub mod generate;
pub mod sampling;
pub mod speculative;
