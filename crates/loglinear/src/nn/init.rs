//! Parameter initialisation from a seeded host RNG: the same seed gives the same weights on
//! every backend (CPU or GPU) and in every run.

use burn::module::{Param, ParamId};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

/// Draws parameters on `device` from a seeded RNG.
pub struct Init {
    rng: StdRng,
    device: Device,
    next_id: u64,
}

impl Init {
    /// A fresh initialiser: `seed` fixes every draw.
    pub fn new(seed: u64, device: &Device) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            device: device.clone(),
            next_id: 0,
        }
    }

    /// The device parameters are created on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A parameter holding `values`. Parameter ids are numbered in creation order, so a model
    /// built twice from the same config has the same ids (optimiser state, keyed by id, then
    /// survives a restart).
    pub fn values<const D: usize>(
        &mut self,
        values: Vec<f64>,
        shape: [usize; D],
    ) -> Param<Tensor<D>> {
        let data = TensorData::new(values, shape.to_vec());
        let mut param = Param::from_tensor(Tensor::from_data(data, &self.device));
        param.id = ParamId::from(self.next_id);
        self.next_id += 1;
        param
    }

    /// `N(0, std²)` entries.
    pub fn normal<const D: usize>(&mut self, shape: [usize; D], std: f64) -> Param<Tensor<D>> {
        let len = shape.iter().product();
        let v = (0..len)
            .map(|_| std * self.rng.sample::<f64, _>(StandardNormal))
            .collect();
        self.values(v, shape)
    }

    /// `U(lo, hi)` entries.
    pub fn uniform<const D: usize>(
        &mut self,
        shape: [usize; D],
        lo: f64,
        hi: f64,
    ) -> Param<Tensor<D>> {
        let len = shape.iter().product();
        let v = (0..len).map(|_| self.rng.random_range(lo..hi)).collect();
        self.values(v, shape)
    }

    /// Every entry `value`.
    pub fn constant<const D: usize>(&mut self, shape: [usize; D], value: f64) -> Param<Tensor<D>> {
        self.values(vec![value; shape.iter().product()], shape)
    }

    /// The Mamba-2 `dt_bias` of `heads` heads: the inverse softplus of a step `Δ₀` drawn
    /// log-uniformly in `[dt_min, dt_max]` and floored at `floor`, so that
    /// `softplus(dt_bias) = Δ₀` at init (spec §2.5).
    pub fn dt_bias(
        &mut self,
        heads: usize,
        dt_min: f64,
        dt_max: f64,
        floor: f64,
    ) -> Param<Tensor<1>> {
        let (lo, hi) = (dt_min.ln(), dt_max.ln());
        let values = (0..heads)
            .map(|_| {
                let dt = (self.rng.random::<f64>() * (hi - lo) + lo).exp().max(floor);
                // inverse softplus: dt + ln(−expm1(−dt))
                dt + (-(-dt).exp_m1()).ln()
            })
            .collect();
        self.values(values, [heads])
    }

    /// `A_log = ln A` with `A ~ U(0, a_max)` per head (fla's Gated DeltaNet, `A_init_range =
    /// (0, 16)`). A draw of exactly 0 (probability 2⁻⁵³) would give −∞, so `A` is floored at
    /// `2⁻⁵²·a_max`.
    pub fn a_log_uniform(&mut self, heads: usize, a_max: f64) -> Param<Tensor<1>> {
        let values = (0..heads)
            .map(|_| {
                (self.rng.random::<f64>() * a_max)
                    .max(f64::EPSILON * a_max)
                    .ln()
            })
            .collect();
        self.values(values, [heads])
    }
}

/// Which dtype a model computes in. Parameters (the master weights) and the optimiser state
/// keep their own dtype (f32); with [`Precision::Bf16`] activations and matrix products are
/// bf16, while normalisations, Δ, the log-decays, λ and the core op's cumulative sums and states
/// are computed in f32, and the logits are returned in f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// The parameters' dtype everywhere (f32 normally; f64 in some tests).
    #[default]
    Full,
    /// bf16 activations and matrix products, f32 where accuracy needs it.
    Bf16,
}

impl Precision {
    /// The activation dtype for parameters of dtype `param`.
    pub fn compute_dtype(self, param: DType) -> DType {
        match self {
            Precision::Full => param,
            Precision::Bf16 => DType::BF16,
        }
    }
}

/// `t` in `dtype` (no copy when it already is).
pub fn to_dtype<const D: usize>(t: Tensor<D>, dtype: DType) -> Tensor<D> {
    if t.dtype() == dtype { t } else { t.cast(dtype) }
}

/// The dtype to accumulate values of `dtype` in: f32 for half precision, itself otherwise.
pub fn wide(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    }
}

/// A bias-free linear map `y = x W` with `W: [d_in, d_out]`.
#[derive(Module, Debug)]
pub struct Dense {
    /// `[d_in, d_out]`.
    pub weight: Param<Tensor<2>>,
}

impl Dense {
    /// # Shapes
    /// `x: [..., d_in]` → `[..., d_out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let weight = to_dtype(self.weight.val(), x.dtype());
        crate::linalg::linear(x, weight)
    }

    /// `N(0, std²)` weights.
    pub fn normal(init: &mut Init, d_in: usize, d_out: usize, std: f64) -> Self {
        Self {
            weight: init.normal([d_in, d_out], std),
        }
    }

    /// Weights `U(−1/√d_in, 1/√d_in) · scale` (PyTorch's default Linear init, i.e.
    /// kaiming-uniform with a = √5, then scaled).
    pub fn kaiming_uniform(init: &mut Init, d_in: usize, d_out: usize, scale: f64) -> Self {
        let bound = 1.0 / (d_in as f64).sqrt() * scale;
        Self {
            weight: init.uniform([d_in, d_out], -bound, bound),
        }
    }
}

/// Root-mean-square normalisation `x / sqrt(mean(x²) + eps) ⊙ weight` over the last axis.
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// `[D]`, initialised to 1.
    pub weight: Param<Tensor<1>>,
    /// Added to the mean square.
    #[module(skip)]
    pub eps: f64,
}

impl RmsNorm {
    /// Weight 1.
    pub fn new(init: &mut Init, width: usize, eps: f64) -> Self {
        Self {
            weight: init.constant([width], 1.0),
            eps,
        }
    }

    /// # Shapes
    /// `x: [..., D]` → `[..., D]`.
    /// Computed in f32 for half-precision inputs; returns the input dtype.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        rms_norm(x, self.weight.val(), self.eps)
    }
}

/// `x / sqrt(mean(x²) + eps) ⊙ weight` over the last axis, computed in f32 for half-precision
/// inputs; returns the input dtype. On CubeCL devices one kernel each way
/// ([`crate::kernels::norm`]); elsewhere the tensor ops below, which the kernels are tested
/// against.
///
/// # Shapes
/// `x: [..., D]`, `weight: [D]` → `[..., D]`.
pub fn rms_norm<const D: usize>(x: Tensor<D>, weight: Tensor<1>, eps: f64) -> Tensor<D> {
    #[cfg(feature = "kernels")]
    if let Some(y) = crate::kernels::fused_norm(&x, &weight, None, eps) {
        return y;
    }
    let dtype = x.dtype();
    let x = to_dtype(x, wide(dtype));
    let rms = (x.clone().square().mean_dim(D - 1) + eps).sqrt();
    let weight = to_dtype(weight, x.dtype());
    to_dtype(x / rms * weight.unsqueeze(), dtype)
}

/// `x + b`, `b` over `x`'s last axes and cast to `x`'s dtype. On CubeCL devices `b`'s gradient
/// is summed over the leading axes by kernels ([`crate::kernels::columns`]: Burn's reductions
/// over 32,768 rows took 0.3 ms each); elsewhere a broadcast add.
///
/// # Shapes
/// `x: [..., W...]`, `b: [W...]` → `x`'s shape.
pub fn add_bias<const D: usize, const R: usize>(x: Tensor<D>, b: Tensor<R>) -> Tensor<D> {
    #[cfg(feature = "kernels")]
    if let Some(y) = crate::kernels::add_columns(&x, &b) {
        return y;
    }
    let b = to_dtype(b, x.dtype());
    x + b.unsqueeze()
}

/// `x ⊙ w`, `w` over `x`'s last axes and cast to `x`'s dtype; `w`'s gradient summed over the
/// leading axes by kernels on CubeCL devices, as [`add_bias`].
///
/// # Shapes
/// `x: [..., W...]`, `w: [W...]` → `x`'s shape.
pub fn scale_by<const D: usize, const R: usize>(x: Tensor<D>, w: Tensor<R>) -> Tensor<D> {
    #[cfg(feature = "kernels")]
    if let Some(y) = crate::kernels::scale_columns(&x, &w) {
        return y;
    }
    let w = to_dtype(w, x.dtype());
    x * w.unsqueeze()
}

/// The mixers' causal depthwise convolution `y[b, t, c] = bias[c] + Σ_j w[c, j] · x[b, t + j, c]`
/// over an input left-padded with the `K − 1` previous positions, in the input's dtype. On
/// CubeCL devices one kernel forward and three backward ([`crate::kernels::conv`], computed in
/// f32); elsewhere the tensor ops below (in the input's dtype), which the kernels are tested
/// against.
///
/// # Shapes
/// `padded: [B, T + K − 1, C]`, `weight: [C, K]`, `bias: [C]` → `[B, T, C]`.
pub fn causal_conv(padded: Tensor<3>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<3> {
    #[cfg(feature = "kernels")]
    if let Some(y) = crate::kernels::fused_causal_conv(&padded, &weight, bias.as_ref()) {
        return y;
    }
    let dtype = padded.dtype();
    let [_, s, c] = padded.dims();
    let k = weight.dims()[1];
    let t = s + 1 - k;
    let weight = to_dtype(weight, dtype);
    let mut conv: Option<Tensor<3>> = bias.map(|bias| to_dtype(bias, dtype).unsqueeze());
    for j in 0..k {
        let w_j = weight.clone().narrow(1, j, 1).reshape([1, 1, c]);
        let term = padded.clone().narrow(1, j, t) * w_j;
        conv = Some(match conv {
            Some(sum) => sum + term,
            None => term,
        });
    }
    conv.expect("causal_conv: a weight of at least one tap")
}

/// Layer normalisation `(x − mean) / sqrt(var + eps) ⊙ weight + bias` over the last axis
/// (biased variance, as PyTorch).
#[derive(Module, Debug)]
pub struct LayerNorm {
    /// `[D]`, initialised to 1.
    pub weight: Param<Tensor<1>>,
    /// `[D]`, initialised to 0.
    pub bias: Param<Tensor<1>>,
    /// Added to the variance.
    #[module(skip)]
    pub eps: f64,
}

impl LayerNorm {
    /// Weight 1, bias 0.
    pub fn new(init: &mut Init, width: usize, eps: f64) -> Self {
        Self {
            weight: init.constant([width], 1.0),
            bias: init.constant([width], 0.0),
            eps,
        }
    }

    /// # Shapes
    /// `x: [..., D]` → `[..., D]`.
    /// Computed in f32 for half-precision inputs; returns the input dtype.
    /// On CubeCL devices one kernel each way ([`crate::kernels::norm`]); elsewhere the tensor
    /// ops below, which the kernels are tested against.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        #[cfg(feature = "kernels")]
        if let Some(y) =
            crate::kernels::fused_norm(&x, &self.weight.val(), Some(&self.bias.val()), self.eps)
        {
            return y;
        }
        let dtype = x.dtype();
        let x = to_dtype(x, wide(dtype));
        let acc = x.dtype();
        let mean = x.clone().mean_dim(D - 1);
        let centered = x - mean;
        let var = centered.clone().square().mean_dim(D - 1);
        let out = centered / (var + self.eps).sqrt() * to_dtype(self.weight.val(), acc).unsqueeze()
            + to_dtype(self.bias.val(), acc).unsqueeze();
        to_dtype(out, dtype)
    }
}

/// Rows of `table` for `tokens`: the embedding lookup, as a gather whose backward is a
/// scatter-add. Burn's `embedding` has the same forward, but its backward walks all B·T tokens
/// serially per column (`select_assign`: one unit per column of the table), which took 11.9 ms
/// of a 199-ms LM step on the H200; a scatter-add runs one unit per value (atomic adds where the
/// device has them; on GPUs the order of the adds into one row then varies from run to run,
/// i.e. the gradient is reproducible to rounding, not bit for bit).
///
/// # Shapes
/// `table: [V, D]`, `tokens: [B, T]` → `[B, T, D]`.
pub fn embed(table: Tensor<2>, tokens: Tensor<2, Int>) -> Tensor<3> {
    let [b, t] = tokens.dims();
    let [_, d] = table.dims();
    let rows = tokens.reshape([b * t, 1]).expand([b * t, d]);
    table.gather(0, rows).reshape([b, t, d])
}

/// Vocabularies are padded to a multiple of this many entries in the head's product.
pub const VOCAB_PAD: usize = 64;

/// Logits over a vocabulary padded for the head's product (see [`vocab_logits`]).
#[derive(Clone, Debug)]
pub struct PaddedLogits {
    /// `[B, T, V']` in the compute dtype, `V'` = `vocab` rounded up to a multiple of
    /// [`VOCAB_PAD`]: the first `vocab` columns are the logits, the rest come from zero weights
    /// and are never scored.
    pub padded: Tensor<3>,
    /// `V`, the vocabulary.
    pub vocab: usize,
}

impl From<Tensor<3>> for PaddedLogits {
    /// Logits with no padding: every column is scored.
    fn from(logits: Tensor<3>) -> Self {
        let vocab = logits.dims()[2];
        Self {
            padded: logits,
            vocab,
        }
    }
}

impl PaddedLogits {
    /// The logits `[B, T, V]`: a view of the first `V` columns. Training hands the loss the
    /// padded tensor instead ([`crate::nn::loss::cross_entropy_padded_tokens`]): under fusion a
    /// view of `[B, T, V']` is copied out, and its backward writes the gradient into a zeroed
    /// padded tensor — 14 ms of the LM step on the H200 (bench/RESULTS.md, session 9).
    pub fn logits(&self) -> Tensor<3> {
        let stored = self.padded.dims()[2];
        if stored == self.vocab {
            self.padded.clone()
        } else {
            self.padded.clone().narrow(2, 0, self.vocab)
        }
    }
}

/// The LM head: logits of `h: [B, T, D]` against `weight`, stored `[V, D]` (a tied embedding
/// table, `vocab_rows`) or `[D, V]` (an untied head), in `h`'s dtype.
///
/// The product runs over `V` rounded up to a multiple of [`VOCAB_PAD`] (zero rows or columns
/// added). With an odd vocabulary (GPT-2's 50,257) every row of the logits and of their
/// gradient has an odd length, which keeps cuBLAS off its vectorised tensor-core kernels: the
/// head's three products ran at 86–150 TFLOP/s on the H200 against ≈ 690 for the layers'
/// (bench/RESULTS.md, session 9). The values of the first `V` columns are those of the unpadded
/// product.
pub fn vocab_logits(h: Tensor<3>, weight: Tensor<2>, vocab_rows: bool) -> PaddedLogits {
    let dtype = h.dtype();
    let weight = to_dtype(weight, dtype);
    let [rows, cols] = weight.dims();
    let vocab = if vocab_rows { rows } else { cols };
    let padded = vocab.next_multiple_of(VOCAB_PAD);
    let pad = |dims: [usize; 2], axis| {
        let zeros = Tensor::<2>::zeros(dims, &weight.device()).cast(dtype);
        Tensor::cat(vec![weight.clone(), zeros], axis)
    };
    let padded = match (vocab_rows, padded == vocab) {
        (true, true) => crate::linalg::linear(h, weight.transpose()),
        (false, true) => crate::linalg::linear(h, weight),
        (true, false) => crate::linalg::linear(h, pad([padded - vocab, cols], 0).transpose()),
        (false, false) => crate::linalg::linear(h, pad([rows, padded - vocab], 1)),
    };
    PaddedLogits { padded, vocab }
}
