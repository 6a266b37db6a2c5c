//! The log-linear Mamba-2 mixer ("HAttentionMixer", spec §2.3), its init (§2.5) and its
//! decoding state (§2.6).

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::{silu, softplus};
use serde::{Deserialize, Serialize};

use super::check::{ConfigError, positive};
use super::init::{Dense, Init, causal_conv, rms_norm, to_dtype, wide};
use super::lambda::{LambdaConfig, LevelWeights};
use crate::fenwick;
use crate::ops::{FenwickState, Form, LogLinearInput, log_linear_attn};

/// Which sequence mixer a model's layers use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MixerKind {
    /// Log-linear Mamba-2 (the scalar-decay op, [`LogLinearMamba2`] in the LM).
    #[default]
    #[serde(rename = "mamba2")]
    Mamba2,
    /// Log-linear Gated DeltaNet (the delta-rule op of spec §5,
    /// [`LogLinearGatedDeltaNet`](super::LogLinearGatedDeltaNet) in the LM).
    #[serde(rename = "gated_deltanet")]
    GatedDeltaNet,
}

impl MixerKind {
    /// The config name (`mamba2`, `gated_deltanet`).
    pub fn name(self) -> &'static str {
        match self {
            MixerKind::Mamba2 => "mamba2",
            MixerKind::GatedDeltaNet => "gated_deltanet",
        }
    }
}

impl std::fmt::Display for MixerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Sizes and choices of one mixer; the defaults are the official layer's (E = 2, P = 64, N = 128,
/// G = 1, K = 4, 15 levels, linear λ). `d_inner = expand·d_model = heads·head_dim`.
#[derive(Config, Debug, PartialEq)]
pub struct MixerConfig {
    /// Model width `D`.
    pub d_model: usize,
    /// Inner width factor `E` (`d_inner = E·D`).
    #[config(default = 2)]
    pub expand: usize,
    /// Head width `P`.
    #[config(default = 64)]
    pub head_dim: usize,
    /// State width `N` (width of B and C).
    #[config(default = 128)]
    pub d_state: usize,
    /// Groups `G` sharing B and C (contiguous blocks of heads).
    #[config(default = 1)]
    pub n_groups: usize,
    /// Causal depthwise convolution width `K`.
    #[config(default = 4)]
    pub conv_kernel: usize,
    /// λ.
    #[config(default = "LambdaConfig::new()")]
    pub lambda: LambdaConfig,
    /// Epsilon of the gated RMSNorm.
    #[config(default = 1e-5)]
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
}

impl MixerConfig {
    /// `d_inner = expand · d_model`.
    pub fn d_inner(&self) -> usize {
        self.expand * self.d_model
    }

    /// `H = d_inner / head_dim`.
    pub fn heads(&self) -> usize {
        self.d_inner() / self.head_dim
    }

    /// Channels of the convolution: `x | B | C = d_inner + 2·G·N`.
    pub fn conv_dim(&self) -> usize {
        self.d_inner() + 2 * self.n_groups * self.d_state
    }

    /// Parameters of one mixer, counted without allocating (equals `init(..).num_params()`).
    pub fn num_params(&self) -> usize {
        let (d, di, h) = (self.d_model, self.d_inner(), self.heads());
        let l = self.lambda.levels;
        let lambda = match self.lambda.mode {
            super::LambdaMode::Linear => h * l + d * h * l,
            super::LambdaMode::MlpSoftplus | super::LambdaMode::MlpSoftmax => {
                let hid = self.lambda.mlp_hidden;
                2 * l * hid + hid + l + d * h * l
            }
            super::LambdaMode::Ones => 0,
        };
        // in_proj (z | xBC | dt), conv weight and bias, dt_bias, A_log, D, norm, out_proj, λ.
        d * (di + self.conv_dim() + h)
            + self.conv_dim() * (self.conv_kernel + 1)
            + 3 * h
            + di
            + di * d
            + lambda
    }

    /// Checks the sizes and that they fit together, naming the field that does not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive(&[
            ("d_model", self.d_model),
            ("expand", self.expand),
            ("head_dim", self.head_dim),
            ("d_state", self.d_state),
            ("n_groups", self.n_groups),
            ("conv_kernel", self.conv_kernel),
        ])?;
        self.lambda.validate().map_err(|e| e.within("lambda"))?;
        let di = self.d_inner();
        if !di.is_multiple_of(self.head_dim) {
            return Err(ConfigError::new(
                "head_dim",
                format!(
                    "({}) must divide d_inner = expand·d_model = {di}",
                    self.head_dim
                ),
            ));
        }
        if !self.heads().is_multiple_of(self.n_groups) {
            return Err(ConfigError::new(
                "n_groups",
                format!(
                    "({}) must divide the heads, d_inner/head_dim = {}",
                    self.n_groups,
                    self.heads()
                ),
            ));
        }
        if !(self.dt_min > 0.0 && self.dt_min <= self.dt_max) {
            return Err(ConfigError::new(
                "dt_min",
                format!(
                    "must lie in (0, dt_max = {}], got {}",
                    self.dt_max, self.dt_min
                ),
            ));
        }
        Ok(())
    }

    /// Builds a mixer with the init of spec §2.5: projections and conv `N(0, std²)`, conv bias 0,
    /// `A_log = ln(1..H)`, `D = 1`, norm weight 1, `dt_bias` = inverse softplus of a
    /// log-uniform Δ in `[dt_min, dt_max]`, and `out_proj` re-drawn kaiming-uniform and scaled by
    /// `out_scale` (`1/√(2·layers)` in the model). λ keeps its own init (see [`LevelWeights`]).
    ///
    /// # Panics
    /// If [`MixerConfig::validate`] fails.
    pub fn init(&self, init: &mut Init, std: f64, out_scale: f64) -> LogLinearMamba2 {
        if let Err(e) = self.validate() {
            panic!("LogLinearMamba2: {e}");
        }
        let (d, di, h) = (self.d_model, self.d_inner(), self.heads());
        let conv_dim = self.conv_dim();
        let lambda = LevelWeights::new(init, &self.lambda, h, std);
        let in_width = di + conv_dim + h + lambda.dl_width();
        let in_proj = Dense::normal(init, d, in_width, std);
        let conv_weight = init.normal([conv_dim, self.conv_kernel], std);
        let conv_bias = init.constant([conv_dim], 0.0);
        let dt_bias = init.dt_bias(h, self.dt_min, self.dt_max, self.dt_init_floor);
        let a_log = init.values((0..h).map(|i| ((i + 1) as f64).ln()).collect(), [h]);
        let d_skip = init.constant([h], 1.0);
        let norm_weight = init.constant([di], 1.0);
        let out_proj = Dense::kaiming_uniform(init, di, d, out_scale);
        LogLinearMamba2 {
            in_proj,
            conv_weight,
            conv_bias,
            dt_bias,
            a_log,
            d_skip,
            lambda,
            norm_weight,
            out_proj,
            config: self.clone(),
        }
    }
}

/// Decoding state of one mixer: the last `K − 1` conv inputs and the Fenwick state.
#[derive(Clone, Debug)]
pub struct MixerState {
    /// Raw (pre-conv) `xBC` of the last `K − 1` tokens: `[B, K−1, conv_dim]`.
    pub conv: Tensor<3>,
    /// Fenwick level states `[B, H, L, N, P]`.
    pub fenwick: FenwickState,
}

impl MixerState {
    /// Bytes held on the device.
    pub fn size_bytes(&self) -> usize {
        self.conv.shape().num_elements() * self.conv.dtype().size() + self.fenwick.size_bytes()
    }

    /// Detached from any autodiff graph.
    pub fn detach(self) -> Self {
        Self {
            conv: self.conv.detach(),
            fenwick: self.fenwick.detach(),
        }
    }
}

/// What a mixer forward returns.
#[derive(Clone, Debug)]
pub struct MixerOutput {
    /// `[B, T, D]`.
    pub y: Tensor<3>,
    /// The λ the core op used, `[B, T, H, L]` (for visualisation).
    pub lambda: Tensor<4>,
    /// The state after the last token, when asked for.
    pub state: Option<MixerState>,
}

/// The log-linear Mamba-2 mixer.
#[derive(Module, Debug)]
pub struct LogLinearMamba2 {
    /// `D → z | xBC | dt | dl`, no bias.
    pub in_proj: Dense,
    /// Depthwise causal conv weights `[conv_dim, K]`.
    pub conv_weight: Param<Tensor<2>>,
    /// Conv bias `[conv_dim]`.
    pub conv_bias: Param<Tensor<1>>,
    /// `[H]`.
    pub dt_bias: Param<Tensor<1>>,
    /// `A = −exp(A_log)`, `[H]`.
    pub a_log: Param<Tensor<1>>,
    /// Skip `D`, `[H]`.
    pub d_skip: Param<Tensor<1>>,
    /// λ.
    pub lambda: LevelWeights,
    /// Gated RMSNorm weight `[d_inner]`.
    pub norm_weight: Param<Tensor<1>>,
    /// `d_inner → D`, no bias.
    pub out_proj: Dense,
    /// Sizes.
    #[module(skip)]
    pub config: MixerConfig,
}

impl LogLinearMamba2 {
    /// An empty decoding state for a batch of `b`.
    pub fn init_state(&self, b: usize, device: &Device) -> MixerState {
        let c = &self.config;
        let dtype = self.conv_weight.val().dtype();
        MixerState {
            conv: Tensor::zeros([b, c.conv_kernel - 1, c.conv_dim()], (device, dtype)),
            fenwick: FenwickState::empty(
                b,
                c.heads(),
                c.lambda.levels,
                c.d_state,
                c.head_dim,
                dtype,
                device,
            ),
        }
    }

    /// Training / prefill forward over a sequence with the core op in `form`, continuing from
    /// `state` if given and returning the final state if `return_state`.
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
        let [b, t, d] = x.dims();
        assert_eq!(
            d, c.d_model,
            "LogLinearMamba2: input width {d}, expected d_model = {}",
            c.d_model
        );
        let (di, h, p, n, g) = (c.d_inner(), c.heads(), c.head_dim, c.d_state, c.n_groups);
        let conv_dim = c.conv_dim();
        let start = state.map_or(0, |s| s.fenwick.position);
        fenwick::check_levels("LogLinearMamba2", c.lambda.levels, start + t);

        // Activations stay in x's dtype (bf16 under mixed precision); Δ, the decays, λ and the
        // norm statistics are computed in `acc` (f32 then).
        let dtype = x.dtype();
        let acc = wide(dtype);
        let param = |t: Tensor<1>| to_dtype(t, acc);

        // 1. in_proj, split z | xBC | dt | dl.
        let zx = self.in_proj.forward(x); // [B, T, in_width]
        let z = zx.clone().narrow(2, 0, di);
        let xbc = zx.clone().narrow(2, di, conv_dim);
        let dt_raw = zx.clone().narrow(2, di + conv_dim, h);
        let dl = (self.lambda.dl_width() > 0).then(|| {
            zx.clone()
                .narrow(2, di + conv_dim + h, self.lambda.dl_width())
        });

        // 2. causal depthwise conv over [previous K−1 inputs | xBC], then SiLU.
        let k = c.conv_kernel;
        let window = match state {
            Some(s) => to_dtype(s.conv.clone(), dtype),
            None => Tensor::zeros([b, k - 1, conv_dim], (&xbc.device(), xbc.dtype())),
        };
        let padded = Tensor::cat(vec![window, xbc], 1); // [B, T+K−1, conv_dim]
        let conv = causal_conv(
            padded.clone(),
            self.conv_weight.val(),
            Some(self.conv_bias.val()),
        );
        let new_window = padded.narrow(1, t, k - 1);
        let xbc = silu(conv); // [B, T, conv_dim]

        // 3. split x | B | C; heads of a group share its B and C.
        let xs = xbc.clone().narrow(2, 0, di).reshape([b, t, h, p]);
        let per_head = |m: Tensor<3>| {
            m.reshape([b, t, g, 1, n])
                .expand([b, t, g, h / g, n])
                .reshape([b, t, h, n])
        };
        let keys = per_head(xbc.clone().narrow(2, di, g * n));
        let queries = per_head(xbc.narrow(2, di + g * n, g * n));

        // 4–6. Δ = softplus(dt + dt_bias), g = A·Δ, v = Δ·x.
        let delta = softplus(
            super::init::add_bias(to_dtype(dt_raw, acc), param(self.dt_bias.val())),
            1.0,
        ); // [B, T, H]
        let a = param(self.a_log.val()).exp().neg(); // [H]
        let log_decay = super::init::scale_by(delta.clone(), a);
        let values = xs.clone() * to_dtype(delta, dtype).unsqueeze_dim(3);

        // 7. λ, 8. the core op.
        let lambda = self.lambda.forward(dl, &log_decay);
        let input = LogLinearInput {
            q: queries,
            k: keys,
            v: values,
            g: log_decay,
            lambda: lambda.clone(),
        };
        let out = log_linear_attn(&input, form, state.map(|s| &s.fenwick), return_state);

        // 9. D skip on x (before the Δ scaling), 10. gated RMSNorm (gate, then normalise).
        let y = out.o + xs * to_dtype(self.d_skip.val(), dtype).reshape([1, 1, h, 1]);
        let normed = rms_norm(
            y.reshape([b, t, di]) * silu(z),
            self.norm_weight.val(),
            c.norm_eps,
        );

        // 11. out_proj.
        MixerOutput {
            y: self.out_proj.forward(normed),
            lambda,
            state: out.state.map(|fenwick| MixerState {
                conv: new_window,
                fenwick,
            }),
        }
    }

    /// One decoding step with the recurrent form.
    ///
    /// # Shapes
    /// `x: [B, D]` → `[B, D]`.
    pub fn step(&self, x: Tensor<2>, state: &mut MixerState) -> Tensor<2> {
        let out = self.forward(x.unsqueeze_dim(1), Form::Recurrent, Some(state), true);
        *state = out.state.expect("the recurrent form returns its state");
        out.y.squeeze_dim(1)
    }
}
