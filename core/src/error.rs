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
    /// A device that is absent or reported an error (other than out of memory).
    #[error("{0}")]
    Device(String),
    /// The device had not enough free memory for an allocation; the message says what was
    /// being allocated where known.
    #[error("{0}")]
    OutOfMemory(String),
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

    /// Whether the error, under its [`Error::Context`] wrappers, is [`Error::OutOfMemory`].
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self.root(), Error::OutOfMemory(_))
    }

    /// `message` as [`Error::OutOfMemory`] when `e` is the driver's out-of-memory result,
    /// else as [`Error::Device`].
    pub(crate) fn cuda(e: &impl CudaFailure, message: String) -> Self {
        if e.out_of_memory() {
            Error::OutOfMemory(message)
        } else {
            Error::Device(message)
        }
    }

    /// A config-key error: `key` had `value`, which violates `reason`.
    pub fn key(key: impl Into<String>, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        Error::ConfigKey { key: key.into(), value: value.to_string(), reason: reason.into() }
    }
}

/// A failed CUDA call, which may be the driver's out-of-memory result.
pub(crate) trait CudaFailure {
    /// Whether the driver reported `CUDA_ERROR_OUT_OF_MEMORY`.
    fn out_of_memory(&self) -> bool;
}

impl CudaFailure for cudarc::driver::DriverError {
    fn out_of_memory(&self) -> bool {
        self.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
    }
}

impl CudaFailure for porter_kernels::cuda::CudaError {
    fn out_of_memory(&self) -> bool {
        matches!(self, porter_kernels::cuda::CudaError::Driver(e) if e.out_of_memory())
    }
}

/// [`Error::OutOfMemory`] for the driver's out-of-memory result, else [`Error::Device`].
impl From<porter_kernels::cuda::CudaError> for Error {
    fn from(e: porter_kernels::cuda::CudaError) -> Self {
        Error::cuda(&e, format!("CUDA: {e}"))
    }
}

/// [`Error::OutOfMemory`] for the driver's out-of-memory result, else [`Error::Device`].
impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::cuda(&e, format!("CUDA: {e}"))
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

    #[test]
    fn out_of_memory_is_typed_and_seen_through_context() {
        use cudarc::driver::{sys::CUresult, DriverError};
        use porter_kernels::cuda::CudaError;
        let oom = DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let other = DriverError(CUresult::CUDA_ERROR_INVALID_VALUE);
        assert!(oom.out_of_memory());
        assert!(!other.out_of_memory());
        assert!(CudaError::Driver(oom).out_of_memory());
        assert!(!CudaError::Driver(other).out_of_memory());
        assert!(!CudaError::Invalid("CUDA_ERROR_OUT_OF_MEMORY".into()).out_of_memory());

        let r: Result<()> = Err(Error::cuda(&CudaError::Driver(oom), "CUDA: a KV pool".into()));
        let e = r.context("x").context("y").unwrap_err();
        assert!(matches!(e.root(), Error::OutOfMemory(m) if m == "CUDA: a KV pool"));
        assert!(e.is_out_of_memory());
        assert_eq!(e.to_string(), "y: x: CUDA: a KV pool");
        let r: Result<()> = Err(Error::cuda(&other, "CUDA: bad value".into()));
        let e = r.context("x").unwrap_err();
        assert!(matches!(e.root(), Error::Device(m) if m == "CUDA: bad value"));
        assert!(!e.is_out_of_memory());
        assert!(!err!(Cache, "the KV pool is full").is_out_of_memory());
    }

    /// The `From` conversions format the driver error, which asks the driver library for its
    /// text (`cuGetErrorString`); cudarc panics where that library is absent, so this test is
    /// ignored by default (reported as such on CPU machines) and run with `--ignored` where a
    /// driver is installed; the rest is covered above without formatting.
    #[test]
    #[ignore = "needs the CUDA driver library (cudarc formats driver errors through it)"]
    fn driver_errors_convert_to_out_of_memory_or_device() {
        use cudarc::driver::{sys::CUresult, DriverError};
        use porter_kernels::cuda::CudaError;
        // SAFETY: only tries to open the library.
        assert!(
            unsafe { cudarc::driver::sys::is_culib_present() },
            "no CUDA driver library to format driver errors with"
        );
        let oom = DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let other = DriverError(CUresult::CUDA_ERROR_INVALID_VALUE);
        for e in [Error::from(oom), Error::from(CudaError::Driver(oom))] {
            assert!(matches!(&e, Error::OutOfMemory(m) if m.starts_with("CUDA: ")), "{e:?}");
            assert!(e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"), "{e}");
            let r: Result<()> = Err(e);
            assert!(r.context("x").unwrap_err().is_out_of_memory());
        }
        for e in [Error::from(other), Error::from(CudaError::Driver(other))] {
            assert!(matches!(&e, Error::Device(m) if m.starts_with("CUDA: ")), "{e:?}");
            assert!(!e.is_out_of_memory());
        }
    }
}
