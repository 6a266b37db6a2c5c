//! The level weights λ: the published linear baseline, the adaptive-decay MLP (softplus and
//! softmax heads), and λ ≡ 1 (plain Mamba-2). Spec §2.3 step 7 and §6.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::{softmax, softplus};
use serde::{Deserialize, Serialize};

use super::check::{ConfigError, positive};
use super::init::{Init, to_dtype, wide};
use crate::linalg::linear;

/// How λ is computed from the `dl` projection of a token (`[H, L]` per token).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LambdaMode {
    /// `λ = softplus(L ⊙ dl)` with a per-head, per-level scale `L` (init 1): the published
    /// log-linear Mamba-2 baseline ("fixed" in the adaptive-decay code).
    #[default]
    Linear,
    /// `λ = softplus(W2·gelu(W1·dl + b1) + b2)`, one MLP shared across heads; `W2 = 0`,
    /// `b2 = 0.54` at init so `λ ≡ softplus(0.54) ≈ 0.99916` (the adaptive-decay method).
    MlpSoftplus,
    /// The same MLP with a softmax over levels; `W2 = 0`, `b2 = 0` so `λ ≡ 1/L` at init.
    MlpSoftmax,
    /// `λ ≡ 1`: no `dl` projection at all, i.e. plain Mamba-2 (the linear-time baseline).
    Ones,
}

impl LambdaMode {
    /// Whether the mode reads a `dl` projection.
    pub fn uses_dl(self) -> bool {
        self != LambdaMode::Ones
    }

    /// Every mode, in a fixed order.
    pub const ALL: [LambdaMode; 4] = [
        LambdaMode::Linear,
        LambdaMode::MlpSoftplus,
        LambdaMode::MlpSoftmax,
        LambdaMode::Ones,
    ];

    /// The config name (`linear`, `mlp_softplus`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LambdaMode::Linear => "linear",
            LambdaMode::MlpSoftplus => "mlp_softplus",
            LambdaMode::MlpSoftmax => "mlp_softmax",
            LambdaMode::Ones => "ones",
        }
    }
}

impl std::fmt::Display for LambdaMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for LambdaMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        LambdaMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown lambda mode {s:?}; expected one of linear, mlp_softplus, mlp_softmax, ones")
            })
    }
}

/// Bias of the softplus head at init: `softplus(0.54) = 0.99916…`, so λ starts at ≈ 1.
pub const SOFTPLUS_INIT_BIAS: f64 = 0.54;

/// How the λ-MLP's weights start (the linear mode's scale `L` starts at 1 either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LambdaInit {
    /// The init the adaptive-decay paper describes: `W1` Xavier-uniform, `b1 = 0`, `W2 = 0`,
    /// `b2 = 0.54` (softplus: λ ≡ 0.99916 at step 0) or `0` (softmax: λ ≡ 1/L).
    #[default]
    Identity,
    /// What the published scripts ran (spec §6.4.1): their global re-init redrew every linear
    /// layer of the λ-MLP, so `W1` and `W2` are `N(0, σ²)` with σ the model's
    /// `initializer_range` (0.02 in the synthetic-task scripts) and `b1 = b2 = 0`. At step 0
    /// softplus λ ≈ ln 2 ≈ 0.693 with small random cross-level terms, softmax λ ≈ 1/L with noise.
    Published,
}

impl LambdaInit {
    /// The config name (`identity`, `published`).
    pub fn name(self) -> &'static str {
        match self {
            LambdaInit::Identity => "identity",
            LambdaInit::Published => "published",
        }
    }
}

/// λ configuration.
#[derive(Config, Debug, PartialEq)]
pub struct LambdaConfig {
    /// How λ is computed.
    #[config(default = "LambdaMode::Linear")]
    pub mode: LambdaMode,
    /// λ slots per head, `L`: sequences up to `2^(L−1)` tokens. 15 in the released models.
    #[config(default = 15)]
    pub levels: usize,
    /// Hidden width of the λ-MLP (64 in the paper).
    #[config(default = 64)]
    pub mlp_hidden: usize,
    /// How the λ-MLP starts ([`LambdaInit`]); the MLP modes only.
    #[config(default = "LambdaInit::Identity")]
    pub init: LambdaInit,
}

impl LambdaConfig {
    /// Checks the sizes, naming the field that is out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive(&[("levels", self.levels), ("mlp_hidden", self.mlp_hidden)])
    }
}

/// `λ = head(W2 · gelu(W1 · dl + b1) + b2)` applied to every (batch, token, head) vector;
/// weights are shared across heads and tokens.
///
/// Init ([`LambdaInit::Identity`]): `W1` Xavier-uniform, `b1 = 0`, `W2 = 0`, `b2` = 0.54
/// (softplus) or 0 (softmax). This init is set here and nothing re-initialises it later (the
/// published runs lost it to a global re-init, spec §6.4; [`LambdaInit::Published`] reproduces
/// what they ran instead).
#[derive(Module, Debug)]
pub struct LambdaMlp {
    /// `[L, hidden]`.
    pub w1: Param<Tensor<2>>,
    /// `[hidden]`.
    pub b1: Param<Tensor<1>>,
    /// `[hidden, L]`.
    pub w2: Param<Tensor<2>>,
    /// `[L]`.
    pub b2: Param<Tensor<1>>,
}

impl LambdaMlp {
    /// The documented init for `mode` (an MLP mode): [`LambdaInit::Identity`].
    pub fn new(init: &mut Init, levels: usize, hidden: usize, mode: LambdaMode) -> Self {
        let bound = (6.0 / (levels + hidden) as f64).sqrt();
        let b2 = match mode {
            LambdaMode::MlpSoftplus => SOFTPLUS_INIT_BIAS,
            _ => 0.0,
        };
        Self {
            w1: init.uniform([levels, hidden], -bound, bound),
            b1: init.constant([hidden], 0.0),
            w2: init.constant([hidden, levels], 0.0),
            b2: init.constant([levels], b2),
        }
    }

    /// The init the published runs ended up with ([`LambdaInit::Published`]): both weights
    /// `N(0, std²)`, both biases 0, whatever the mode.
    pub fn published(init: &mut Init, levels: usize, hidden: usize, std: f64) -> Self {
        Self {
            w1: init.normal([levels, hidden], std),
            b1: init.constant([hidden], 0.0),
            w2: init.normal([hidden, levels], std),
            b2: init.constant([levels], 0.0),
        }
    }

    /// The pre-activation logits `W2 · gelu(W1 · dl + b1) + b2`.
    ///
    /// # Shapes
    /// `dl: [B, T, H, L]` → `[B, T, H, L]`.
    pub fn logits(&self, dl: Tensor<4>) -> Tensor<4> {
        let dt = dl.dtype();
        let p = |t: Tensor<2>| to_dtype(t, dt);
        let q = |t: Tensor<1>| to_dtype(t, dt).unsqueeze::<4>();
        let hidden = gelu_exact(linear(dl, p(self.w1.val())) + q(self.b1.val()));
        linear(hidden, p(self.w2.val())) + q(self.b2.val())
    }

    /// The head of an MLP mode over the levels (last axis): softplus or softmax.
    ///
    /// # Panics
    /// For a mode without an MLP.
    pub fn head(logits: Tensor<4>, mode: LambdaMode) -> Tensor<4> {
        match mode {
            LambdaMode::MlpSoftplus => softplus(logits, 1.0),
            LambdaMode::MlpSoftmax => softmax(logits, 3),
            other => panic!("LambdaMlp::head: mode {other} has no MLP"),
        }
    }

    /// λ of `dl` for an MLP mode: the fused kernels on a CubeCL device
    /// ([`crate::kernels::fused_lambda_mlp`]: one launch each way, nothing of the hidden width
    /// kept), [`Self::logits`] and [`Self::head`] elsewhere.
    ///
    /// # Shapes
    /// `dl: [B, T, H, L]` → `[B, T, H, L]`.
    pub fn forward(&self, dl: Tensor<4>, mode: LambdaMode) -> Tensor<4> {
        #[cfg(feature = "kernels")]
        if let Some(lambda) = crate::kernels::fused_lambda_mlp(&dl, self, mode) {
            return lambda;
        }
        Self::head(self.logits(dl), mode)
    }
}

/// `gelu(x) = x · Φ(x) = x · (1 + erf(x / √2)) / 2` (PyTorch's `nn.GELU()`, which the λ-MLP
/// uses), written through `erf` so that autodiff takes its exact derivative: Burn 0.22's `gelu`
/// has the exact forward but the backward of the tanh approximation (burn-backend
/// `ActivationOps::gelu_backward`), off by up to ≈ 1e-3.
pub(crate) fn gelu_exact<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    (x.clone() * std::f64::consts::FRAC_1_SQRT_2)
        .erf()
        .add_scalar(1.0)
        * x
        * 0.5
}

/// Computes λ for one mixer.
#[derive(Module, Debug)]
pub struct LevelWeights {
    /// `L: [H, L]` of the linear mode.
    pub scale: Option<Param<Tensor<2>>>,
    /// The MLP of the MLP modes.
    pub mlp: Option<LambdaMlp>,
    /// The mode.
    #[module(skip)]
    pub mode: LambdaMode,
    /// Heads.
    #[module(skip)]
    pub heads: usize,
    /// λ slots.
    #[module(skip)]
    pub levels: usize,
}

impl LevelWeights {
    /// Parameters for `mode` and nothing else (no dead parameters: the MLP modes have no `L`).
    /// `std` is the model's `initializer_range`, which [`LambdaInit::Published`] draws the
    /// λ-MLP's weights with.
    pub fn new(init: &mut Init, config: &LambdaConfig, heads: usize, std: f64) -> Self {
        let mode = config.mode;
        assert!(
            config.levels > 0,
            "LevelWeights: lambda needs at least one level"
        );
        let (levels, hidden) = (config.levels, config.mlp_hidden);
        Self {
            scale: (mode == LambdaMode::Linear).then(|| init.constant([heads, levels], 1.0)),
            mlp: matches!(mode, LambdaMode::MlpSoftplus | LambdaMode::MlpSoftmax).then(|| {
                match config.init {
                    LambdaInit::Identity => LambdaMlp::new(init, levels, hidden, mode),
                    LambdaInit::Published => LambdaMlp::published(init, levels, hidden, std),
                }
            }),
            mode,
            heads,
            levels: config.levels,
        }
    }

    /// Width of the `dl` projection this mode reads: `H·L`, or 0 for λ ≡ 1.
    pub fn dl_width(&self) -> usize {
        if self.mode.uses_dl() {
            self.heads * self.levels
        } else {
            0
        }
    }

    /// λ from `dl` (head-major: `dl[h·L + ℓ]`); `None` (and ones) for [`LambdaMode::Ones`].
    /// `like` gives the batch, length, dtype and device. λ is computed in f32 for half-precision
    /// `dl` (it multiplies the level states in the core op, which runs in f32).
    ///
    /// # Shapes
    /// `dl: [B, T, H·L]`, `like: [B, T, ·]` → `λ: [B, T, H, L]`.
    pub fn forward(&self, dl: Option<Tensor<3>>, like: &Tensor<3>) -> Tensor<4> {
        let [b, t, _] = like.dims();
        let (h, l) = (self.heads, self.levels);
        let dl = match (self.mode, dl) {
            (LambdaMode::Ones, _) => {
                return Tensor::ones([b, t, h, l], (&like.device(), like.dtype()));
            }
            (_, Some(dl)) => {
                let dt = wide(dl.dtype());
                to_dtype(dl, dt).reshape([b, t, h, l])
            }
            (mode, None) => panic!("LevelWeights: mode {mode} needs the dl projection"),
        };
        match self.mode {
            LambdaMode::Linear => {
                let scale = self.scale.as_ref().expect("linear λ has a scale").val();
                softplus(super::init::scale_by(dl, scale), 1.0)
            }
            LambdaMode::MlpSoftplus | LambdaMode::MlpSoftmax => {
                let mlp = self.mlp.as_ref().expect("MLP λ has an MLP");
                mlp.forward(dl, self.mode)
            }
            LambdaMode::Ones => unreachable!("handled above"),
        }
    }
}
