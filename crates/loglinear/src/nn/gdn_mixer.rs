//! The log-linear Gated DeltaNet mixer ("H-GDN", spec §5.1): fla's GatedDeltaNet layer with the
//! level weights λ of the log-linear op, its init and its decoding state.
//!
//! ```text
//! q = silu(conv(W_q x)), k = silu(conv(W_k x)), v = silu(conv(W_v x))   (depthwise causal, no bias)
//! q̂ = q / sqrt(Σq² + 1e-6), k̂ likewise (per head)
//! β = σ(W_b x),  g = −exp(A_log) · softplus(W_a x + dt_bias),  λ from dl = W_l x (any λ mode)
//! o = gdn_attn(q̂, k̂, v, g, β, λ)
//! y = W_o · (RMSNorm_per_head(o) ⊙ w ⊙ silu(W_g x))       (normalise, then gate)
//! ```
//!
//! Sizes use the op's names: `heads` = H, `d_state` = N (key width per head, fla's `head_dim`),
//! `head_dim` = P (value width per head, fla's `expand_v · head_dim`).

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, silu, softplus};

use super::check::{ConfigError, positive};
use super::init::{Dense, Init, causal_conv, rms_norm, to_dtype, wide};
use super::lambda::{LambdaConfig, LevelWeights};
use super::mixer::{MixerOutput, MixerState};
use crate::fenwick;
use crate::ops::gdn::{GdnInput, gdn_attn};
use crate::ops::{FenwickState, Form};

/// Epsilon of the L2 normalisation of q and k (fla's `l2norm`).
pub const L2_NORM_EPS: f64 = 1e-6;

/// Sizes and choices of one Gated DeltaNet mixer. The defaults are the published
/// `h_gated_deltanet_mid` layer's (H = 6, N = d_k = 192, P = d_v = 2·192 = 384, conv width 4,
/// norm eps 1e-6, 15 levels, linear λ); only `d_model` has none.
#[derive(Config, Debug, PartialEq)]
pub struct GdnConfig {
    /// Model width `D`.
    pub d_model: usize,
    /// Heads `H`.
    #[config(default = 6)]
    pub heads: usize,
    /// Key (and query) width per head `N` (fla's `head_dim`).
    #[config(default = 192)]
    pub d_state: usize,
    /// Value width per head `P` (fla's `expand_v · head_dim`).
    #[config(default = 384)]
    pub head_dim: usize,
    /// Causal depthwise convolution width `K` of the q, k and v short convolutions.
    #[config(default = 4)]
    pub conv_kernel: usize,
    /// λ.
    #[config(default = "LambdaConfig::new()")]
    pub lambda: LambdaConfig,
    /// Epsilon of the per-head output RMSNorm.
    #[config(default = 1e-6)]
    pub norm_eps: f64,
    /// Lower end of the log-uniform Δ at init.
    #[config(default = 1e-3)]
    pub dt_min: f64,
    /// Upper end of the log-uniform Δ at init.
    #[config(default = 0.1)]
    pub dt_max: f64,
    /// Floor of Δ at init.
    #[config(default = 1e-4)]
    pub dt_init_floor: f64,
    /// Upper end of the uniform `A = exp(A_log)` at init (`U(0, a_init_max)`, 16 in fla).
    #[config(default = 16.0)]
    pub a_init_max: f64,
}

impl GdnConfig {
    /// Channels of the short convolutions: `q | k | v = 2·H·N + H·P`.
    pub fn conv_dim(&self) -> usize {
        self.heads * (2 * self.d_state + self.head_dim)
    }

    /// Parameters of one mixer, counted without allocating (equals `init(..).num_params()`).
    pub fn num_params(&self) -> usize {
        let (d, h, n, p) = (self.d_model, self.heads, self.d_state, self.head_dim);
        let l = self.lambda.levels;
        let lambda = match self.lambda.mode {
            super::LambdaMode::Linear => h * l + d * h * l,
            super::LambdaMode::MlpSoftplus | super::LambdaMode::MlpSoftmax => {
                let hid = self.lambda.mlp_hidden;
                2 * l * hid + hid + l + d * h * l
            }
            super::LambdaMode::Ones => 0,
        };
        // q, k, v, a, b, g, o projections; conv; A_log, dt_bias; norm weight; λ.
        d * (2 * h * n + h * p)
            + 2 * d * h
            + d * h * p
            + h * p * d
            + self.conv_dim() * self.conv_kernel
            + 2 * h
            + p
            + lambda
    }

    /// Checks the sizes and that they fit together, naming the field that does not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive(&[
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("d_state", self.d_state),
            ("head_dim", self.head_dim),
            ("conv_kernel", self.conv_kernel),
        ])?;
        check_key_width(self.d_state)?;
        self.lambda.validate().map_err(|e| e.within("lambda"))?;
        if !(self.dt_min > 0.0 && self.dt_min <= self.dt_max) {
            return Err(ConfigError::new(
                "dt_min",
                format!(
                    "must lie in (0, dt_max = {}], got {}",
                    self.dt_max, self.dt_min
                ),
            ));
        }
        if !(self.a_init_max > 0.0 && self.a_init_max.is_finite()) {
            return Err(ConfigError::new(
                "a_init_max",
                format!("must be positive and finite, got {}", self.a_init_max),
            ));
        }
        if !(self.norm_eps > 0.0 && self.norm_eps.is_finite()) {
            return Err(ConfigError::new(
                "norm_eps",
                format!("must be positive and finite, got {}", self.norm_eps),
            ));
        }
        Ok(())
    }

    /// Builds a mixer with the init of spec §5.1 (H-GDN `_init_weights`): every projection and
    /// the conv weights `N(0, std²)` (the convs have no bias), `A = U(0, a_init_max)` and
    /// `A_log = ln A`, `dt_bias` = inverse softplus of a log-uniform Δ in `[dt_min, dt_max]`
    /// floored at `dt_init_floor` (drawn as the Mamba-2 mixer draws it, [`Init::dt_bias`]), the
    /// λ scale `L = 1`, the norm weight 1, and `o_proj` re-drawn kaiming-uniform and scaled by
    /// `out_scale` (`1/√(2·layers)` in the model, spec §2.5, as the Mamba-2 mixer's `out_proj`).
    /// The λ-MLP modes keep their own init (see [`LevelWeights`]), as in the Mamba-2 mixer.
    ///
    /// # Panics
    /// If [`GdnConfig::validate`] fails.
    pub fn init(&self, init: &mut Init, std: f64, out_scale: f64) -> LogLinearGatedDeltaNet {
        if let Err(e) = self.validate() {
            panic!("LogLinearGatedDeltaNet: {e}");
        }
        let (d, h, n, p) = (self.d_model, self.heads, self.d_state, self.head_dim);
        let q_proj = Dense::normal(init, d, h * n, std);
        let k_proj = Dense::normal(init, d, h * n, std);
        let v_proj = Dense::normal(init, d, h * p, std);
        let a_proj = Dense::normal(init, d, h, std);
        let b_proj = Dense::normal(init, d, h, std);
        let lambda = LevelWeights::new(init, &self.lambda, h, std);
        let dl_proj =
            (lambda.dl_width() > 0).then(|| Dense::normal(init, d, lambda.dl_width(), std));
        let g_proj = Dense::normal(init, d, h * p, std);
        let conv_weight = init.normal([self.conv_dim(), self.conv_kernel], std);
        let a_log = init.a_log_uniform(h, self.a_init_max);
        let dt_bias = init.dt_bias(h, self.dt_min, self.dt_max, self.dt_init_floor);
        let norm_weight = init.constant([p], 1.0);
        let o_proj = Dense::kaiming_uniform(init, h * p, d, out_scale);
        LogLinearGatedDeltaNet {
            q_proj,
            k_proj,
            v_proj,
            a_proj,
            b_proj,
            dl_proj,
            g_proj,
            conv_weight,
            a_log,
            dt_bias,
            lambda,
            norm_weight,
            o_proj,
            config: self.clone(),
        }
    }
}

/// The key width `d_state` of a Gated DeltaNet op: at least 2. A unit vector of width 1 is ±1,
/// so every key would be the same direction up to sign and the delta rule would erase the whole
/// state at each token.
pub(crate) fn check_key_width(d_state: usize) -> Result<(), ConfigError> {
    if d_state < 2 {
        return Err(ConfigError::new(
            "d_state",
            format!(
                "(the key width of Gated DeltaNet) must be at least 2: keys are L2-normalised \
                 per head, got {d_state}"
            ),
        ));
    }
    Ok(())
}

/// The log-linear Gated DeltaNet mixer.
#[derive(Module, Debug)]
pub struct LogLinearGatedDeltaNet {
    /// `D → H·N`, no bias.
    pub q_proj: Dense,
    /// `D → H·N`, no bias.
    pub k_proj: Dense,
    /// `D → H·P`, no bias.
    pub v_proj: Dense,
    /// `D → H` (the Δ of the decay), no bias.
    pub a_proj: Dense,
    /// `D → H` (β), no bias.
    pub b_proj: Dense,
    /// `D → H·L` (the `dl` that λ reads; absent for λ ≡ 1), no bias.
    pub dl_proj: Option<Dense>,
    /// `D → H·P` (the output gate), no bias.
    pub g_proj: Dense,
    /// Depthwise causal conv weights of the `q | k | v` channels `[2·H·N + H·P, K]`, no bias
    /// (fla's three `ShortConvolution`s side by side).
    pub conv_weight: Param<Tensor<2>>,
    /// `A = exp(A_log)`, `[H]`.
    pub a_log: Param<Tensor<1>>,
    /// `[H]`.
    pub dt_bias: Param<Tensor<1>>,
    /// λ.
    pub lambda: LevelWeights,
    /// Per-head RMSNorm weight `[P]`, shared by the heads (fla's `FusedRMSNormGated(head_v_dim)`).
    pub norm_weight: Param<Tensor<1>>,
    /// `H·P → D`, no bias.
    pub o_proj: Dense,
    /// Sizes.
    #[module(skip)]
    pub config: GdnConfig,
}

/// `x / sqrt(Σx² + eps)` over the last axis.
fn l2_normalise(x: Tensor<4>) -> Tensor<4> {
    let norm = (x.clone().square().sum_dim(3) + L2_NORM_EPS).sqrt();
    x / norm
}

impl LogLinearGatedDeltaNet {
    /// An empty decoding state for a batch of `b`: a zero conv window `[B, K−1, 2·H·N + H·P]`
    /// and empty Fenwick levels `[B, H, L, N, P]`.
    pub fn init_state(&self, b: usize, device: &Device) -> MixerState {
        let c = &self.config;
        let dtype = self.conv_weight.val().dtype();
        MixerState {
            conv: Tensor::zeros([b, c.conv_kernel - 1, c.conv_dim()], (device, dtype)),
            fenwick: FenwickState::empty(
                b,
                c.heads,
                c.lambda.levels,
                c.d_state,
                c.head_dim,
                dtype,
                device,
            ),
        }
    }

    /// The inputs of the core op for `x` (q̂, k̂, v, g, β, λ) and the conv window after `x`,
    /// continuing from `state`'s window if given.
    ///
    /// # Shapes
    /// `x: [B, T, D]` → see [`GdnInput`]; window `[B, K−1, 2·H·N + H·P]`.
    pub fn op_input(&self, x: Tensor<3>, state: Option<&MixerState>) -> (GdnInput, Tensor<3>) {
        let c = &self.config;
        let [b, t, d] = x.dims();
        assert_eq!(
            d, c.d_model,
            "LogLinearGatedDeltaNet: input width {d}, expected d_model = {}",
            c.d_model
        );
        let (h, n, p, k) = (c.heads, c.d_state, c.head_dim, c.conv_kernel);
        let conv_dim = c.conv_dim();
        // Activations stay in x's dtype (bf16 under mixed precision); the decays, β, λ and the
        // normalisations are computed in `acc` (f32 then).
        let dtype = x.dtype();
        let acc = wide(dtype);

        // Projections of q | k | v, then the causal depthwise conv over [previous K−1 | new], SiLU.
        let qkv = Tensor::cat(
            vec![
                self.q_proj.forward(x.clone()),
                self.k_proj.forward(x.clone()),
                self.v_proj.forward(x.clone()),
            ],
            2,
        ); // [B, T, conv_dim]
        let window = match state {
            Some(s) => to_dtype(s.conv.clone(), dtype),
            None => Tensor::zeros([b, k - 1, conv_dim], (&qkv.device(), dtype)),
        };
        let padded = Tensor::cat(vec![window, qkv], 1); // [B, T+K−1, conv_dim]
        let conv = causal_conv(padded.clone(), self.conv_weight.val(), None);
        let new_window = padded.narrow(1, t, k - 1);
        let qkv = silu(conv); // [B, T, conv_dim]

        let q = to_dtype(qkv.clone().narrow(2, 0, h * n), acc).reshape([b, t, h, n]);
        let key = to_dtype(qkv.clone().narrow(2, h * n, h * n), acc).reshape([b, t, h, n]);
        let v = qkv.narrow(2, 2 * h * n, h * p).reshape([b, t, h, p]); // [B, T, H, P]

        // β = σ(W_b x), g = −exp(A_log)·softplus(W_a x + dt_bias), λ from W_l x.
        let beta = sigmoid(to_dtype(self.b_proj.forward(x.clone()), acc)); // [B, T, H]
        let delta = softplus(
            to_dtype(self.a_proj.forward(x.clone()), acc)
                + to_dtype(self.dt_bias.val(), acc).unsqueeze(),
            1.0,
        ); // [B, T, H]
        let g = delta * to_dtype(self.a_log.val(), acc).exp().neg().unsqueeze();
        let dl = self.dl_proj.as_ref().map(|w| w.forward(x));
        let lambda = self.lambda.forward(dl, &g);
        let input = GdnInput {
            q: to_dtype(l2_normalise(q), dtype),
            k: to_dtype(l2_normalise(key), dtype),
            v,
            g: to_dtype(g, dtype),
            beta: to_dtype(beta, dtype),
            lambda: to_dtype(lambda, dtype),
        };
        (input, new_window)
    }

    /// Training / prefill forward over a sequence with the core op in `form` (the op maps
    /// [`Form::Auto`] and [`Form::Fused`] to its chunked form), continuing from `state` if given
    /// and returning the final state if `return_state`.
    ///
    /// # Shapes
    /// `x: [B, T, D]` → `y: [B, T, D]`, `lambda: [B, T, H, L]`.
    pub fn forward(
        &self,
        x: Tensor<3>,
        form: Form,
        state: Option<&MixerState>,
        return_state: bool,
    ) -> MixerOutput {
        let c = &self.config;
        let [b, t, _] = x.dims();
        let (h, p) = (c.heads, c.head_dim);
        let start = state.map_or(0, |s| s.fenwick.position);
        fenwick::check_levels("LogLinearGatedDeltaNet", c.lambda.levels, start + t);
        let dtype = x.dtype();
        let gate = self.g_proj.forward(x.clone()); // [B, T, H·P]
        let (input, new_window) = self.op_input(x, state);
        let lambda = input.lambda.clone();
        let out = gdn_attn(&input, form, state.map(|s| &s.fenwick), return_state);

        // Per-head RMSNorm over P, times the shared weight, then the SiLU gate.
        let normed = rms_norm(out.o, self.norm_weight.val(), c.norm_eps); // [B, T, H, P]
        let gated = to_dtype(normed, dtype) * silu(gate).reshape([b, t, h, p]);
        MixerOutput {
            y: self.o_proj.forward(gated.reshape([b, t, h * p])),
            lambda,
            state: out.state.map(|fenwick| MixerState {
                conv: new_window,
                fenwick,
            }),
        }
    }

    /// One decoding step with the recurrent form, from and into `state`.
    ///
    /// # Shapes
    /// `x: [B, D]` → `[B, D]`.
    pub fn step(&self, x: Tensor<2>, state: &mut MixerState) -> Tensor<2> {
        let out = self.forward(x.unsqueeze_dim(1), Form::Recurrent, Some(state), true);
        *state = out.state.expect("the recurrent form returns its state");
        out.y.squeeze_dim(1)
    }
}
