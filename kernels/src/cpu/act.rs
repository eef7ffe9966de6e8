//! Elementwise activations: the `hidden_act` names of transformers' `ACT2CLS`
//! (`transformers/activations.py`) that need no learned parameters.
//!
//! [`Act::apply`] computes in `f32` in the order of operations torch uses for an `f32`
//! tensor: the composite Python forms (`gelu_new`, `gelu_fast`, `quick_gelu`, `laplace`, …)
//! round after every torch op as those ops do, and the fused aten kernels (`gelu`,
//! `gelu_pytorch_tanh`, `silu`, `mish`, `hardswish`, …) follow their C++ formula. Where torch
//! calls a transcendental (`exp`, `tanh`, `log1p`) this uses Rust's `f32` one (libm), and
//! `erf` is [`erf`] (`f64`) rounded to `f32`; so results match torch's to
//! an ulp of the terms involved (see the tests for the measured differences).
//! [`Act::eval_f64`] is the same function in `f64` with exact constants (a test reference).
//!
//! Not here: `prelu` and `xielu` (learned parameters). Both stay errors at load.

use super::erf::erf;
use super::ops;

/// `√(2/π)` rounded to `f32` (torch: `math.sqrt(2 / math.pi)` and aten's
/// `M_SQRT2 * M_2_SQRTPI * 0.5`, both the same `f32`).
const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4_f64 as f32;
/// `gelu_fast`'s literal `0.7978845608` (the same `f32` as [`SQRT_2_OVER_PI`]).
const GELU_FAST_C: f32 = 0.797_884_560_8_f64 as f32;
/// The cubic coefficient of the tanh approximations.
const KAPPA: f32 = 0.044_715;
/// aten's `M_SQRT1_2` rounded to `f32` (exact `gelu`).
const SQRT1_2: f32 = std::f64::consts::FRAC_1_SQRT_2 as f32;
/// `math.sqrt(2.0)` rounded to `f32` (`gelu_python` divides by it).
const SQRT_2: f32 = std::f64::consts::SQRT_2 as f32;
/// `laplace`'s `mu`: transformers' literal `0.707107` (close to, but not, `1/√2`).
#[allow(clippy::approx_constant)]
const LAPLACE_MU_F64: f64 = 0.707_107;
/// [`LAPLACE_MU_F64`] as the `f32` scalar torch uses.
const LAPLACE_MU: f32 = LAPLACE_MU_F64 as f32;
/// `laplace`'s `sigma * math.sqrt(2.0)`, computed in `f64` by Python, then an `f32` scalar.
const LAPLACE_DIV: f32 = (0.282_095_f64 * std::f64::consts::SQRT_2) as f32;
/// `nn.LeakyReLU`'s default `negative_slope`.
const LEAKY_SLOPE: f32 = 0.01;
/// `nn.functional.softplus`'s default threshold (`beta = 1`).
const SOFTPLUS_THRESHOLD: f32 = 20.0;

/// An activation of transformers' `ACT2FN`, by its `hidden_act` name.
///
/// The default is [`Act::Silu`] (transformers' default `hidden_act` for every model porter
/// runs). `silu` and `swish` are the same function; each name keeps its own variant so that
/// [`Act::name`] gives back what the config said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Act {
    /// `silu`: `x·σ(x)` = `x / (1 + e^{−x})`.
    #[default]
    Silu,
    /// `swish` (`nn.SiLU`): the same as [`Act::Silu`].
    Swish,
    /// `gelu` (`nn.functional.gelu`): `x·½·(1 + erf(x·(1/√2)))`.
    Gelu,
    /// `gelu_python`: `x·½·(1 + erf(x / √2))`.
    GeluPython,
    /// `gelu_new`: `½x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluNew,
    /// `gelu_pytorch_tanh` (`gelu(approximate="tanh")`): as [`Act::GeluNew`].
    GeluPytorchTanh,
    /// `gelu_python_tanh`: as [`Act::GeluNew`], written `x·½·(…)`.
    GeluPythonTanh,
    /// `gelu_fast`: `½x·(1 + tanh(x·0.7978845608·(1 + 0.044715·x²)))`.
    GeluFast,
    /// `gelu_accurate`: as [`Act::GeluNew`].
    GeluAccurate,
    /// `gelu_10`: [`Act::Gelu`] clipped to `[−10, 10]`.
    Gelu10,
    /// `quick_gelu`: `x·σ(1.702·x)`.
    QuickGelu,
    /// `relu`: `max(x, 0)`.
    Relu,
    /// `relu2`: `relu(x)²`.
    Relu2,
    /// `relu6`: `min(max(x, 0), 6)`.
    Relu6,
    /// `leaky_relu` (`nn.LeakyReLU()`): `x` for `x > 0`, else `0.01·x`.
    LeakyRelu,
    /// `sigmoid`: `1 / (1 + e^{−x})`.
    Sigmoid,
    /// `tanh`.
    Tanh,
    /// `mish`: `x·tanh(ln(1 + eˣ))`.
    Mish,
    /// `linear`: the identity.
    Linear,
    /// `laplace`: `½·(1 + erf((x − 0.707107) / (0.282095·√2)))`.
    Laplace,
    /// `hardswish`: `x·min(max(x + 3, 0), 6) / 6`.
    Hardswish,
    /// `sqrtsoftplus`: `√softplus(x)` (softplus with threshold 20).
    SqrtSoftplus,
}

impl Act {
    /// Every activation, in the order of [`Act::NAMES`].
    pub const ALL: [Act; 22] = [
        Act::Silu,
        Act::Swish,
        Act::Gelu,
        Act::GeluPython,
        Act::GeluNew,
        Act::GeluPytorchTanh,
        Act::GeluPythonTanh,
        Act::GeluFast,
        Act::GeluAccurate,
        Act::Gelu10,
        Act::QuickGelu,
        Act::Relu,
        Act::Relu2,
        Act::Relu6,
        Act::LeakyRelu,
        Act::Sigmoid,
        Act::Tanh,
        Act::Mish,
        Act::Linear,
        Act::Laplace,
        Act::Hardswish,
        Act::SqrtSoftplus,
    ];

    /// The `hidden_act` names porter implements, in the order of [`Act::ALL`].
    pub const NAMES: [&'static str; 22] = [
        "silu",
        "swish",
        "gelu",
        "gelu_python",
        "gelu_new",
        "gelu_pytorch_tanh",
        "gelu_python_tanh",
        "gelu_fast",
        "gelu_accurate",
        "gelu_10",
        "quick_gelu",
        "relu",
        "relu2",
        "relu6",
        "leaky_relu",
        "sigmoid",
        "tanh",
        "mish",
        "linear",
        "laplace",
        "hardswish",
        "sqrtsoftplus",
    ];

    /// The activation of a `hidden_act` name (exact, case-sensitive, as `ACT2FN` looks it
    /// up); `None` for a name porter does not implement.
    pub fn from_name(name: &str) -> Option<Act> {
        Self::NAMES.iter().position(|n| *n == name).map(|i| Self::ALL[i])
    }

    /// The `hidden_act` name.
    pub fn name(self) -> &'static str {
        // ALL and NAMES are in the same order (checked by a test).
        let i = Self::ALL.iter().position(|a| *a == self).unwrap_or(0);
        Self::NAMES[i]
    }

    /// Whether this is SiLU (`silu` or `swish`), the activation the CUDA kernels fuse.
    pub fn is_silu(self) -> bool {
        matches!(self, Act::Silu | Act::Swish)
    }

    /// The activation of one `f32` value, as torch computes it for an `f32` tensor.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            // The bit-exact SiLU every SiLU path of porter uses.
            Act::Silu | Act::Swish => ops::silu(x),
            Act::Gelu => gelu(x),
            Act::GeluPython => x * 0.5 * (1.0 + erf_f32(x / SQRT_2)),
            Act::GeluNew | Act::GeluPytorchTanh | Act::GeluPythonTanh | Act::GeluAccurate => {
                let inner = SQRT_2_OVER_PI * (x + KAPPA * (x * x * x));
                0.5 * x * (1.0 + inner.tanh())
            }
            Act::GeluFast => 0.5 * x * (1.0 + (x * GELU_FAST_C * (1.0 + KAPPA * x * x)).tanh()),
            Act::Gelu10 => clip(gelu(x), -10.0, 10.0),
            Act::QuickGelu => x * ops::sigmoid(1.702 * x),
            Act::Relu => relu(x),
            Act::Relu2 => {
                let r = relu(x);
                r * r
            }
            Act::Relu6 => clip(x, 0.0, 6.0),
            Act::LeakyRelu => {
                if x > 0.0 {
                    x
                } else {
                    x * LEAKY_SLOPE
                }
            }
            Act::Sigmoid => ops::sigmoid(x),
            Act::Tanh => x.tanh(),
            Act::Mish => x * x.exp().ln_1p().tanh(),
            Act::Linear => x,
            Act::Laplace => 0.5 * (1.0 + erf_f32((x - LAPLACE_MU) / LAPLACE_DIV)),
            Act::Hardswish => x * clip(x + 3.0, 0.0, 6.0) / 6.0,
            Act::SqrtSoftplus => softplus(x).sqrt(),
        }
    }

    /// `apply` on every value of `xs`, in place.
    pub fn apply_slice(self, xs: &mut [f32]) {
        match self {
            Act::Silu | Act::Swish => xs.iter_mut().for_each(|v| *v = ops::silu(*v)),
            a => xs.iter_mut().for_each(|v| *v = a.apply(*v)),
        }
    }

    /// The same function in `f64` with exact constants and an exact `erf` (a reference for
    /// tests; no torch rounding order).
    pub fn eval_f64(self, x: f64) -> f64 {
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        let gelu = |x: f64| 0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2));
        let tanh_gelu = |x: f64| {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        };
        let relu = |x: f64| if x < 0.0 { 0.0 } else { x };
        match self {
            Act::Silu | Act::Swish => x * sigmoid(x),
            Act::Gelu | Act::GeluPython => gelu(x),
            Act::GeluNew | Act::GeluPytorchTanh | Act::GeluPythonTanh | Act::GeluAccurate => tanh_gelu(x),
            Act::GeluFast => 0.5 * x * (1.0 + (x * 0.7978845608 * (1.0 + 0.044715 * x * x)).tanh()),
            Act::Gelu10 => gelu(x).clamp(-10.0, 10.0),
            Act::QuickGelu => x * sigmoid(1.702 * x),
            Act::Relu => relu(x),
            Act::Relu2 => relu(x) * relu(x),
            Act::Relu6 => x.clamp(0.0, 6.0),
            Act::LeakyRelu => {
                if x > 0.0 {
                    x
                } else {
                    0.01 * x
                }
            }
            Act::Sigmoid => sigmoid(x),
            Act::Tanh => x.tanh(),
            Act::Mish => x * (if x > 20.0 { x } else { x.exp().ln_1p() }).tanh(),
            Act::Linear => x,
            Act::Laplace => 0.5 * (1.0 + erf((x - LAPLACE_MU_F64) / (0.282095 * std::f64::consts::SQRT_2))),
            Act::Hardswish => x * (x + 3.0).clamp(0.0, 6.0) / 6.0,
            Act::SqrtSoftplus => (if x > 20.0 { x } else { x.exp().ln_1p() }).sqrt(),
        }
    }
}

impl std::fmt::Display for Act {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An `f32` erf: the `f64` [`erf`] rounded once.
#[inline]
fn erf_f32(x: f32) -> f32 {
    erf(f64::from(x)) as f32
}

/// aten's exact GELU for `f32`: `x·½·(1 + erf(x·M_SQRT1_2))`.
#[inline]
fn gelu(x: f32) -> f32 {
    x * 0.5 * (1.0 + erf_f32(x * SQRT1_2))
}

/// `max(x, 0)`, NaN passed through (as torch's `relu`).
#[inline]
fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// `x` clamped to `[lo, hi]`, NaN passed through (as torch's `clamp` / `hardtanh`).
#[inline]
fn clip(x: f32, lo: f32, hi: f32) -> f32 {
    if x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
    }
}

/// torch's `softplus` with `beta = 1`, `threshold = 20`.
#[inline]
fn softplus(x: f32) -> f32 {
    if x > SOFTPLUS_THRESHOLD {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(test)]
#[path = "act_tests.rs"]
mod tests;
