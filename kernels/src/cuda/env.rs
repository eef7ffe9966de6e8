//! Environment knobs of the CUDA kernels: the include directory, the forced fallback, the
//! shared-memory cap, PDL, and the parsers every A/B variable uses (`env_count`,
//! `env_on_off`, `one_of_or`, one warning a variable).

use super::{CudaError, Result};
use std::sync::Mutex;

/// Environment variable naming the CUDA include directory for NVRTC.
pub const INCLUDE_ENV: &str = "PORTER_CUDA_INCLUDE";

/// Include directory used when [`INCLUDE_ENV`] is not set.
pub const DEFAULT_INCLUDE: &str = "/usr/local/cuda/include";

/// Environment variable that forces every fallback path on any GPU when set to `1`
/// (`true`, `yes`): the kernels are compiled with `-DPORTER_FALLBACK=1` (no cp.async, no
/// tensor cores, as below sm_80), the launchers pick the kernels and tile configurations
/// of an older GPU, and dynamic shared memory is held to [`FALLBACK_SMEM`] (a V100's limit).
pub const FALLBACK_ENV: &str = "PORTER_CUDA_FALLBACK";

/// Dynamic shared memory a block may use when the fallback is forced: the opt-in limit of
/// an sm_70 device (V100), 96 KiB.
pub const FALLBACK_SMEM: usize = 96 * 1024;

/// Environment variable that holds the dynamic shared memory a block may use to at most the
/// given number of bytes (`65536`, or with a `k` suffix, `64k` = 65,536), to run an older
/// GPU's tile choices on a newer one (a T4 / sm_75 allows 64 KiB). Applies with or without
/// [`FALLBACK_ENV`]; a value that is not a byte count is an error when the kernels open.
pub const SMEM_LIMIT_ENV: &str = "PORTER_CUDA_SMEM_LIMIT";

/// [`SMEM_LIMIT_ENV`]'s value in bytes (`None` when unset).
///
/// # Errors
/// [`CudaError::Invalid`] naming the variable for anything but a positive byte count.
pub fn smem_limit_from(var: Option<std::ffi::OsString>) -> Result<Option<usize>> {
    let Some(v) = var else { return Ok(None) };
    let t = v.to_string_lossy().trim().to_ascii_lowercase();
    let (num, mul) = match t.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => (t.as_str(), 1),
    };
    match num.parse::<usize>() {
        Ok(n) if n > 0 => Ok(Some(n * mul)),
        _ => Err(CudaError::Invalid(format!("{SMEM_LIMIT_ENV}={t:?}: expected a byte count such as 65536 or 64k"))),
    }
}

/// A count from environment variable `var` for A/B runs: `None` when it is unset, or when it
/// does not parse or `accept` refuses it — then with one warning a process that names the
/// variable and what was `expected` (the caller keeps its default).
pub fn env_count(var: &str, accept: impl Fn(usize) -> bool, expected: &str) -> Option<usize> {
    count_from(std::env::var_os(var), accept).unwrap_or_else(|t| {
        warn_once(var, &format!("warning: {var}={t:?} is not {expected}; ignored"));
        None
    })
}

/// An `on` / `off` switch from environment variable `var` for A/B runs (any case, trimmed):
/// `default` when it is unset or empty, or — with one warning a process that names the
/// variable — when it is anything else.
pub fn env_on_off(var: &str, default: bool) -> bool {
    on_off_from(std::env::var_os(var))
        .unwrap_or_else(|t| {
            let word = if default { "on" } else { "off" };
            warn_once(var, &format!("warning: {var}={t:?} is not on or off; using {word}"));
            None
        })
        .unwrap_or(default)
}

/// A `fused` / `apart` switch from environment variable `var` for A/B runs (any case, trimmed):
/// `true` for `fused`, `false` for `apart`, and `default` when it is unset or empty — or, with
/// one warning a process that names the variable, anything else. Read on every call: callers
/// that read it once keep the value.
pub fn env_fused(var: &str, default: bool) -> bool {
    let word = if default { "fused" } else { "apart" };
    one_of_or(var, fused_from(std::env::var_os(var).as_deref()), &["fused", "apart"], word, None).unwrap_or(default)
}

/// A parser's reading `parsed` of environment variable `var`, or — when it refused the value
/// (`Err` with the value's text) — `default`, with one warning a process that names the
/// variable, the `words` it accepts and what is used instead (`using`): `warning: VAR="value"
/// is not one of a, b, c; using a`.
pub(super) fn one_of_or<T>(
    var: &str,
    parsed: std::result::Result<T, String>,
    words: &[&str],
    using: impl std::fmt::Display,
    default: T,
) -> T {
    parsed.unwrap_or_else(|bad| {
        warn_once(var, &one_of_warning(var, &bad, words, using));
        default
    })
}

/// The warning of [`one_of_or`] about value `bad` of variable `var`.
fn one_of_warning(var: &str, bad: &str, words: &[&str], using: impl std::fmt::Display) -> String {
    format!("warning: {var}={bad:?} is not one of {}; using {using}", words.join(", "))
}

/// [`env_fused`] of a variable's value `v`: `Ok(None)` unset or empty, `Err` with the text
/// when it is neither `fused` nor `apart`.
fn fused_from(v: Option<&std::ffi::OsStr>) -> std::result::Result<Option<bool>, String> {
    let Some(v) = v else { return Ok(None) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "fused" => Ok(Some(true)),
        "apart" => Ok(Some(false)),
        _ => Err(v.to_string_lossy().into_owned()),
    }
}

/// [`env_on_off`] of a variable's value `v`: `Ok(None)` unset or empty, `Err` with the text
/// when it is neither `on` nor `off`.
fn on_off_from(v: Option<std::ffi::OsString>) -> std::result::Result<Option<bool>, String> {
    let Some(v) = v else { return Ok(None) };
    let t = v.to_string_lossy();
    match t.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "on" => Ok(Some(true)),
        "off" => Ok(Some(false)),
        _ => Err(t.into_owned()),
    }
}

/// Prints `msg` to stderr the first time a process warns about variable `var`; later
/// warnings about the same variable print nothing.
pub(super) fn warn_once(var: &str, msg: &str) {
    static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut w = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if !w.iter().any(|x| x == var) {
        w.push(var.to_string());
        eprintln!("{msg}");
    }
}

/// [`env_count`] of a variable's value `v`: `Err` with the text when it is refused.
fn count_from(
    v: Option<std::ffi::OsString>,
    accept: impl Fn(usize) -> bool,
) -> std::result::Result<Option<usize>, String> {
    let Some(v) = v else { return Ok(None) };
    let t = v.to_string_lossy();
    match t.trim().parse::<usize>() {
        Ok(n) if accept(n) => Ok(Some(n)),
        _ => Err(t.into_owned()),
    }
}

/// Environment variable: `off` launches every kernel without programmatic dependent launch
/// (PDL); unset or `on`: on sm_90+ outside a forced fallback build, every kernel is launched
/// as a programmatic dependent of the grid before it, so that its launch and block start-up
/// overlap that grid's run (each kernel waits for its predecessor first thing:
/// `porter_pdl_enter` in common.cuh). Another value is an error when the kernels open.
pub const PDL_ENV: &str = "PORTER_PDL";

/// [`PDL_ENV`]'s value: `true` for on (or unset), `false` for off.
pub(super) fn pdl_from(var: Option<std::ffi::OsString>) -> Result<bool> {
    let Some(v) = var else { return Ok(true) };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" | "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        other => Err(CudaError::Invalid(format!("{PDL_ENV}={other:?}: expected on or off"))),
    }
}

/// Whether [`FALLBACK_ENV`] forces the fallback paths (read on every call).
pub fn fallback_forced() -> bool {
    fallback_from(std::env::var_os(FALLBACK_ENV))
}

/// [`fallback_forced`] for a given value of the environment variable.
fn fallback_from(var: Option<std::ffi::OsString>) -> bool {
    var.is_some_and(|v| matches!(v.to_string_lossy().trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_env_values() {
        assert!(fallback_from(Some("1".into())) && fallback_from(Some(" TRUE ".into())));
        assert!(!fallback_from(None) && !fallback_from(Some("0".into())) && !fallback_from(Some("".into())));
    }

    #[test]
    fn env_switches_parse_or_are_refused() {
        let v = |s: &str| on_off_from(Some(s.into()));
        assert_eq!(on_off_from(None), Ok(None));
        assert_eq!(v(""), Ok(None));
        assert_eq!(v("on"), Ok(Some(true)));
        assert_eq!(v(" OFF "), Ok(Some(false)));
        assert_eq!(v("maybe"), Err("maybe".to_string()));
        assert_eq!(v("1"), Err("1".to_string()));
    }

    /// The `fused` / `apart` switches (`PORTER_QK_PREP`, `PORTER_GDN_BA`).
    #[test]
    fn fused_apart_switches_parse_or_are_refused() {
        assert_eq!(fused_from(None), Ok(None));
        assert_eq!(fused_from(Some("".as_ref())), Ok(None));
        assert_eq!(fused_from(Some(" Fused ".as_ref())), Ok(Some(true)));
        assert_eq!(fused_from(Some("apart".as_ref())), Ok(Some(false)));
        assert_eq!(fused_from(Some("APART\n".as_ref())), Ok(Some(false)));
        assert_eq!(fused_from(Some("off".as_ref())), Err("off".to_string()));
    }

    /// [`one_of_or`] passes a parsed value through, falls back on a refused one, and its
    /// warning names the variable, the value, the accepted words and the fallback.
    #[test]
    fn one_of_falls_back_on_a_refused_value() {
        const VAR: &str = "PORTER_TEST_ONE_OF";
        assert_eq!(one_of_or(VAR, Ok(3), &["a", "b"], "a", 1), 3);
        assert_eq!(one_of_or(VAR, Err("c".to_string()), &["a", "b"], "a", 1), 1);
        assert_eq!(
            one_of_warning("PORTER_MOE_SHARED", "both", &["fused", "apart"], "fused"),
            "warning: PORTER_MOE_SHARED=\"both\" is not one of fused, apart; using fused"
        );
    }

    #[test]
    fn env_counts_parse_or_are_refused() {
        let v = |s: &str| count_from(Some(s.into()), |n| (1..=64).contains(&n));
        assert_eq!(count_from(None, |_| true), Ok(None));
        assert_eq!(v(" 8 "), Ok(Some(8)));
        assert_eq!(v("64"), Ok(Some(64)));
        assert_eq!(v("0"), Err("0".to_string()));
        assert_eq!(v("65"), Err("65".to_string()));
        assert_eq!(v("eight"), Err("eight".to_string()));
        assert_eq!(v("-1"), Err("-1".to_string()));
    }

    #[test]
    fn smem_limit_values() {
        let v = |s: &str| smem_limit_from(Some(s.into()));
        assert_eq!(smem_limit_from(None).ok(), Some(None));
        assert_eq!(v("65536").ok(), Some(Some(65_536)));
        assert_eq!(v(" 64K ").ok(), Some(Some(65_536)));
        for bad in ["", "0", "64kb", "-1", "lots"] {
            let e = v(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(SMEM_LIMIT_ENV), "{bad:?}: {e}");
        }
    }
}
