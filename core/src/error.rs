//! The crate's typed error.
//!
//! Every fallible function of porter-core returns [`Result`]. The variant says what went
//! wrong; the message says where and with which values. Use the [`bail!`](crate::bail) /
//! [`err!`](crate::err) macros with a variant name (`bail!(Shape, "…")`), and
//! [`Context`] to wrap an error with what was being done (`.context("layer 3")`).

use std::fmt;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `config.json` / `generation_config.json` key with a value porter cannot accept.
    #[error("config key `{key}` = {value}: {reason}")]
    ConfigKey { key: String, value: String, reason: String },
    /// A malformed or unsupported configuration that is not about one key.
    #[error("{0}")]
    Config(String),
    /// Tensor shapes that do not fit together.
    #[error("{0}")]
    Shape(String),
    /// A dtype that is not supported where it was used.
    #[error("{0}")]
    DType(String),
    /// A checkpoint that does not match its weight map (missing, unexpected or mis-shaped
    /// tensors), or a malformed weight map.
    #[error("{0}")]
    WeightMap(String),
    /// A checkpoint file that cannot be read (missing, truncated, corrupt).
    #[error("{0}")]
    Checkpoint(String),
    /// An unknown or ambiguous architecture / draft layout.
    #[error("{0}")]
    Registry(String),
    /// A device that is absent, out of memory, or reported an error.
    #[error("{0}")]
    Device(String),
    /// A state-cache operation that is not possible (full cache, bad slot, refused rollback).
    #[error("{0}")]
    Cache(String),
    /// A request that cannot be served as given (token ids, lengths, sampling parameters).
    #[error("{0}")]
    Input(String),
    /// A file-system error on `path`.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// An I/O error (wrapped with [`Context`] to say which file).
    #[error("{0}")]
    IoError(#[from] std::io::Error),
    /// A JSON document that does not parse.
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A TOML document (a weight map) that does not parse.
    #[error("invalid TOML: {0}")]
    Toml(#[from] toml::de::Error),
    /// An engine invariant that does not hold (a bug in porter).
    #[error("internal error: {0}")]
    Internal(String),
    /// An error with what was being done when it happened.
    #[error("{context}: {source}")]
    Context { context: String, source: Box<Error> },
}

/// `Result` with porter's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error without its [`Error::Context`] wrappers.
    pub fn root(&self) -> &Error {
        match self {
            Error::Context { source, .. } => source.root(),
            e => e,
        }
    }

    /// A config-key error: `key` had `value`, which violates `reason`.
    pub fn key(key: impl Into<String>, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        Error::ConfigKey { key: key.into(), value: value.to_string(), reason: reason.into() }
    }
}

impl From<porter_kernels::cuda::CudaError> for Error {
    fn from(e: porter_kernels::cuda::CudaError) -> Self {
        Error::Device(format!("CUDA: {e}"))
    }
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Device(format!("CUDA: {e}"))
    }
}

/// Adds what was being done to an error (`anyhow::Context`'s shape, typed).
pub trait Context<T> {
    /// Wraps the error with `context`.
    fn context(self, context: impl fmt::Display) -> Result<T>;
    /// Wraps the error with a lazily built context.
    fn with_context<C: fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Error::Context { context: context.to_string(), source: Box::new(e.into()) })
    }

    fn with_context<C: fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| Error::Context { context: f().to_string(), source: Box::new(e.into()) })
    }
}

/// Builds an [`Error`] of the given variant from a format string: `err!(Shape, "bad {x}")`.
#[macro_export]
macro_rules! err {
    ($kind:ident, $($arg:tt)+) => {
        $crate::error::Error::$kind(format!($($arg)+))
    };
}

/// Returns early with an [`Error`] of the given variant: `bail!(Shape, "bad {x}")`.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)+) => {
        return Err($crate::err!($kind, $($arg)+))
    };
}

/// Returns early with an [`Error`] of the given variant unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $kind:ident, $($arg:tt)+) => {
        if !$cond {
            $crate::bail!($kind, $($arg)+);
        }
    };
}

/// An I/O error on `path`.
pub fn io(path: &std::path::Path, source: std::io::Error) -> Error {
    Error::Io { path: path.display().to_string(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_wraps_and_root_unwraps() {
        let r: Result<()> = Err(err!(Shape, "bad {}", 3));
        let e = r.context("layer 2").context("forward").unwrap_err();
        assert_eq!(e.to_string(), "forward: layer 2: bad 3");
        assert!(matches!(e.root(), Error::Shape(m) if m == "bad 3"));
        assert_eq!(
            Error::key("rms_norm_eps", -1, "must be > 0").to_string(),
            "config key `rms_norm_eps` = -1: must be > 0"
        );
    }
}
