//! Several synthetic-task models trained as one ([`PackedSyntheticLm`]): every parameter of R
//! models of one shape is stacked on a leading replica axis, each layer runs one batched matmul
//! for all replicas, and the core op runs once over replicas × batch. Replica `r` computes
//! exactly what [`SyntheticLm::run`] computes for model `r` (tests compare them): the replicas
//! never mix, so a sweep of small runs costs about what its largest run costs on a GPU, where
//! such runs wait on kernel launches rather than arithmetic.
//!
//! Models may differ in anything that leaves the parameter shapes alone: seed (the weights), λ
//! mode within one parameter layout (`mlp_softplus` with `mlp_softmax`), initializer range.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::{softmax, softplus};

use super::init::{Dense, LayerNorm, to_dtype, wide};
use super::lambda::{LambdaMlp, LambdaMode, LevelWeights};
use super::mixer::MixerKind;
use super::synthetic::{SyntheticConfig, SyntheticLayer, SyntheticLm};
use crate::fenwick;
use crate::linalg::matmul;
use crate::ops::{Form, LogLinearInput, log_linear_attn};

/// `[R, d_in, d_out]`: one bias-free linear map per replica.
#[derive(Module, Debug)]
pub struct PackedDense {
    /// `[R, d_in, d_out]`.
    pub weight: Param<Tensor<3>>,
}

impl PackedDense {
    /// # Shapes
    /// `x: [R, M, d_in]` → `[R, M, d_out]`.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        matmul(x.clone(), to_dtype(self.weight.val(), x.dtype()))
    }
}

/// Per-replica LayerNorm over the last axis.
#[derive(Module, Debug)]
pub struct PackedLayerNorm {
    /// `[R, D]`.
    pub weight: Param<Tensor<2>>,
    /// `[R, D]`.
    pub bias: Param<Tensor<2>>,
    /// Added to the variance.
    #[module(skip)]
    pub eps: f64,
}

impl PackedLayerNorm {
    /// # Shapes
    /// `x: [R, M, D]` → `[R, M, D]`; in f32 for half-precision inputs (as [`LayerNorm`]).
    /// On CubeCL devices the norm kernels, each replica's rows with its own weights
    /// ([`crate::kernels::norm`]).
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        #[cfg(feature = "kernels")]
        if let Some(y) =
            crate::kernels::fused_norm(&x, &self.weight.val(), Some(&self.bias.val()), self.eps)
        {
            return y;
        }
        let dtype = x.dtype();
        let x = to_dtype(x, wide(dtype));
        let acc = x.dtype();
        let mean = x.clone().mean_dim(2);
        let centered = x - mean;
        let var = centered.clone().square().mean_dim(2);
        let out = centered / (var + self.eps).sqrt()
            * to_dtype(self.weight.val(), acc).unsqueeze_dim(1)
            + to_dtype(self.bias.val(), acc).unsqueeze_dim(1);
        to_dtype(out, dtype)
    }
}

/// The λ-MLP of every replica.
#[derive(Module, Debug)]
pub struct PackedLambdaMlp {
    /// `[R, L, hidden]`.
    pub w1: Param<Tensor<3>>,
    /// `[R, hidden]`.
    pub b1: Param<Tensor<2>>,
    /// `[R, hidden, L]`.
    pub w2: Param<Tensor<3>>,
    /// `[R, L]`.
    pub b2: Param<Tensor<2>>,
}

/// λ of every replica: one parameter layout, per-replica modes (`mlp_softplus` and
/// `mlp_softmax` share the MLP's layout).
#[derive(Module, Debug)]
pub struct PackedLevelWeights {
    /// `[R, H, L]` (linear mode).
    pub scale: Option<Param<Tensor<3>>>,
    /// The MLP modes' MLPs.
    pub mlp: Option<PackedLambdaMlp>,
    /// Mode of each replica.
    #[module(skip)]
    pub modes: Vec<LambdaMode>,
    /// Heads.
    #[module(skip)]
    pub heads: usize,
    /// λ slots.
    #[module(skip)]
    pub levels: usize,
}

impl PackedLevelWeights {
    /// λ of every replica, as [`LevelWeights::forward`] computes it for each.
    ///
    /// # Shapes
    /// `dl: [R, M, H·L]` (absent for λ ≡ 1), `like: [R, M, ·]` → `[R, M, H, L]`.
    pub fn forward(&self, dl: Option<Tensor<3>>, like: &Tensor<3>) -> Tensor<4> {
        let [r, m, _] = like.dims();
        let (h, l) = (self.heads, self.levels);
        let Some(dl) = dl else {
            return Tensor::ones([r, m, h, l], (&like.device(), like.dtype()));
        };
        let dl = to_dtype(dl.clone(), wide(dl.dtype())).reshape([r, m, h, l]);
        if let Some(scale) = &self.scale {
            let scale = to_dtype(scale.val(), dl.dtype()).unsqueeze_dim::<4>(1);
            return softplus(dl * scale, 1.0);
        }
        let mlp = self
            .mlp
            .as_ref()
            .expect("PackedLevelWeights: an MLP or a scale");
        #[cfg(feature = "kernels")]
        if let Some(lambda) = crate::kernels::fused_packed_lambda_mlp(&dl, mlp, &self.modes) {
            return lambda;
        }
        let dt = dl.dtype();
        // Each replica's MLP over its [M·H, L] rows: one batched matmul per weight.
        let rows = dl.reshape([r, m * h, l]);
        let hidden = super::lambda::gelu_exact(
            matmul(rows, to_dtype(mlp.w1.val(), dt)) + to_dtype(mlp.b1.val(), dt).unsqueeze_dim(1),
        );
        let logits = (matmul(hidden, to_dtype(mlp.w2.val(), dt))
            + to_dtype(mlp.b2.val(), dt).unsqueeze_dim(1))
        .reshape([r, m, h, l]);
        let softplus_rows = self
            .modes
            .iter()
            .filter(|&&m| m == LambdaMode::MlpSoftplus)
            .count();
        if softplus_rows == r {
            softplus(logits, 1.0)
        } else if softplus_rows == 0 {
            softmax(logits, 3)
        } else {
            let chosen: Vec<bool> = self
                .modes
                .iter()
                .map(|&m| m == LambdaMode::MlpSoftplus)
                .collect();
            let mask = Tensor::<1, Bool>::from_data(
                burn::tensor::TensorData::new(chosen, [r]),
                &logits.device(),
            )
            .reshape([r, 1, 1, 1])
            .expand([r, m, h, l]);
            softmax(logits.clone(), 3).mask_where(mask, softplus(logits, 1.0))
        }
    }
}

/// One layer of every replica (fields as [`SyntheticLayer`]).
#[derive(Module, Debug)]
pub struct PackedSyntheticLayer {
    /// `[R, d, H·N]`.
    pub wq: PackedDense,
    /// `[R, d, H·N]`.
    pub wk: PackedDense,
    /// `[R, d, H·P]`.
    pub wv: PackedDense,
    /// `[R, d, H·L]` (absent for λ ≡ 1).
    pub wdl: Option<PackedDense>,
    /// `[R, d, H]`.
    pub wdt: PackedDense,
    /// `[R, H]`.
    pub dt_bias: Param<Tensor<2>>,
    /// `[R, H]`.
    pub a_log: Param<Tensor<2>>,
    /// λ.
    pub lambda: PackedLevelWeights,
    /// `[R, H·P, d]`.
    pub wo: PackedDense,
    /// Post-residual LayerNorm.
    pub norm: PackedLayerNorm,
}

/// R synthetic-task models of one shape, stacked (see the module docs).
#[derive(Module, Debug)]
pub struct PackedSyntheticLm {
    /// `[R, V, d]`.
    pub embedding: Param<Tensor<3>>,
    /// The layers.
    pub layers: Vec<PackedSyntheticLayer>,
    /// Final LayerNorm.
    pub norm: PackedLayerNorm,
    /// `[R, d, V]`.
    pub head: PackedDense,
    /// The configuration of each replica.
    #[module(skip)]
    pub configs: Vec<SyntheticConfig>,
}

// New parameters are leaves of their own (detached from the tensors they were copied from).
fn stack<const D: usize, const D1: usize>(params: Vec<&Param<Tensor<D>>>) -> Param<Tensor<D1>> {
    let values = params.into_iter().map(|p| p.val()).collect();
    Param::from_tensor(Tensor::stack(values, 0).detach())
}

fn replica<const D1: usize, const D: usize>(
    param: &Param<Tensor<D1>>,
    r: usize,
) -> Param<Tensor<D>> {
    Param::from_tensor(param.val().narrow(0, r, 1).squeeze_dim(0).detach())
}

fn stack_dense(ds: Vec<&Dense>) -> PackedDense {
    PackedDense {
        weight: stack(ds.into_iter().map(|d| &d.weight).collect()),
    }
}

fn stack_norm(ns: Vec<&LayerNorm>) -> PackedLayerNorm {
    PackedLayerNorm {
        eps: ns[0].eps,
        weight: stack(ns.iter().map(|n| &n.weight).collect()),
        bias: stack(ns.iter().map(|n| &n.bias).collect()),
    }
}

fn dense(d: &PackedDense, r: usize) -> Dense {
    Dense {
        weight: replica(&d.weight, r),
    }
}

fn norm(n: &PackedLayerNorm, r: usize) -> LayerNorm {
    LayerNorm {
        weight: replica(&n.weight, r),
        bias: replica(&n.bias, r),
        eps: n.eps,
    }
}

/// Whether models of these configs can be packed: the Mamba-2 op (the packed model has no
/// Gated DeltaNet path: that op's chunked form is already batched over its inputs, and its runs
/// train alone) and the same shapes everywhere (λ modes of one parameter layout). `Err` names
/// the reason or the first field that differs.
pub fn packable(configs: &[SyntheticConfig]) -> Result<(), String> {
    let Some(first) = configs.first() else {
        return Err("no models to pack".into());
    };
    let layout = |m: LambdaMode| match m {
        LambdaMode::Linear => 0,
        LambdaMode::MlpSoftplus | LambdaMode::MlpSoftmax => 1,
        LambdaMode::Ones => 2,
    };
    if let Some(c) = configs.iter().find(|c| c.mixer != MixerKind::Mamba2) {
        return Err(format!(
            "the {} mixer does not pack: the packed model runs the Mamba-2 op only",
            c.mixer
        ));
    }
    for c in &configs[1..] {
        let checks = [
            ("vocab_size", c.vocab_size == first.vocab_size),
            ("d_model", c.d_model == first.d_model),
            ("n_layers", c.n_layers == first.n_layers),
            ("heads", c.heads == first.heads),
            ("d_state", c.d_state == first.d_state),
            ("head_dim", c.head_dim == first.head_dim),
            ("lambda.levels", c.lambda.levels == first.lambda.levels),
            (
                "lambda.mlp_hidden",
                c.lambda.mlp_hidden == first.lambda.mlp_hidden,
            ),
            ("precision", c.precision == first.precision),
            (
                "lambda.mode (parameter layout)",
                layout(c.lambda.mode) == layout(first.lambda.mode),
            ),
        ];
        if let Some((name, _)) = checks.iter().find(|(_, same)| !same) {
            return Err(format!("the models differ in {name}"));
        }
    }
    Ok(())
}

impl PackedSyntheticLm {
    /// Stacks `models` (at least one) into one packed model.
    ///
    /// # Panics
    /// If their shapes differ ([`packable`]).
    pub fn stack(models: &[SyntheticLm]) -> Self {
        let configs: Vec<SyntheticConfig> = models.iter().map(|m| m.config.clone()).collect();
        if let Err(e) = packable(&configs) {
            panic!("PackedSyntheticLm::stack: {e}");
        }
        let layers = (0..models[0].layers.len())
            .map(|i| {
                let ls: Vec<&SyntheticLayer> = models.iter().map(|m| &m.layers[i]).collect();
                let lambda0 = &ls[0].lambda;
                PackedSyntheticLayer {
                    wq: stack_dense(ls.iter().map(|l| &l.wq).collect()),
                    wk: stack_dense(ls.iter().map(|l| &l.wk).collect()),
                    wv: stack_dense(ls.iter().map(|l| &l.wv).collect()),
                    wdl: ls[0].wdl.as_ref().map(|_| {
                        stack_dense(ls.iter().map(|l| l.wdl.as_ref().expect("dl")).collect())
                    }),
                    wdt: stack_dense(ls.iter().map(|l| &l.wdt).collect()),
                    dt_bias: stack(ls.iter().map(|l| &l.dt_bias).collect()),
                    a_log: stack(ls.iter().map(|l| &l.a_log).collect()),
                    lambda: PackedLevelWeights {
                        scale: lambda0.scale.as_ref().map(|_| {
                            stack(
                                ls.iter()
                                    .map(|l| l.lambda.scale.as_ref().expect("scale"))
                                    .collect(),
                            )
                        }),
                        mlp: lambda0.mlp.as_ref().map(|_| {
                            let ms: Vec<&LambdaMlp> = ls
                                .iter()
                                .map(|l| l.lambda.mlp.as_ref().expect("mlp"))
                                .collect();
                            PackedLambdaMlp {
                                w1: stack(ms.iter().map(|m| &m.w1).collect()),
                                b1: stack(ms.iter().map(|m| &m.b1).collect()),
                                w2: stack(ms.iter().map(|m| &m.w2).collect()),
                                b2: stack(ms.iter().map(|m| &m.b2).collect()),
                            }
                        }),
                        modes: ls.iter().map(|l| l.lambda.mode).collect(),
                        heads: lambda0.heads,
                        levels: lambda0.levels,
                    },
                    wo: stack_dense(ls.iter().map(|l| &l.wo).collect()),
                    norm: stack_norm(ls.iter().map(|l| &l.norm).collect()),
                }
            })
            .collect();
        Self {
            embedding: stack(models.iter().map(|m| &m.embedding).collect()),
            layers,
            norm: stack_norm(models.iter().map(|m| &m.norm).collect()),
            head: stack_dense(models.iter().map(|m| &m.head).collect()),
            configs,
        }
    }

    /// Number of replicas.
    pub fn replicas(&self) -> usize {
        self.configs.len()
    }

    /// Replica `r` as a standalone model (its own weights, copied out).
    pub fn replica(&self, r: usize) -> SyntheticLm {
        let config = self.configs[r].clone();
        let layers = self
            .layers
            .iter()
            .map(|l| SyntheticLayer {
                wq: dense(&l.wq, r),
                wk: dense(&l.wk, r),
                wv: dense(&l.wv, r),
                wdl: l.wdl.as_ref().map(|d| dense(d, r)),
                wdt: dense(&l.wdt, r),
                wb: None,
                dt_bias: replica(&l.dt_bias, r),
                a_log: replica(&l.a_log, r),
                lambda: LevelWeights {
                    scale: l.lambda.scale.as_ref().map(|s| replica(s, r)),
                    mlp: l.lambda.mlp.as_ref().map(|m| LambdaMlp {
                        w1: replica(&m.w1, r),
                        b1: replica(&m.b1, r),
                        w2: replica(&m.w2, r),
                        b2: replica(&m.b2, r),
                    }),
                    mode: l.lambda.modes[r],
                    heads: l.lambda.heads,
                    levels: l.lambda.levels,
                },
                wo: dense(&l.wo, r),
                norm: norm(&l.norm, r),
            })
            .collect();
        SyntheticLm {
            embedding: replica(&self.embedding, r),
            layers,
            norm: norm(&self.norm, r),
            head: dense(&self.head, r),
            config,
        }
    }

    /// Logits of every replica on its own tokens: replica `r` of the result is
    /// `SyntheticLm::run` of model `r` on `tokens[r]`.
    ///
    /// # Shapes
    /// `tokens: [R, B, T]` → `[R, B, T, V]`.
    pub fn run(&self, tokens: Tensor<3, Int>, form: Form) -> Tensor<4> {
        let [r, b, t] = tokens.dims();
        assert_eq!(
            r,
            self.replicas(),
            "PackedSyntheticLm::run: tokens {:?} for {} replicas",
            tokens.dims(),
            self.replicas()
        );
        let c = &self.configs[0];
        fenwick::check_levels("PackedSyntheticLm", c.lambda.levels, t);
        let (h, n, p, v, d) = (c.heads, c.d_state, c.head_dim, c.vocab_size, c.d_model);
        let m = b * t;
        let table = self.embedding.val();
        let dtype = c.precision.compute_dtype(table.dtype());
        let acc = wide(dtype);
        // One lookup in the replicas' tables laid end to end: token x of replica r is row
        // r·V + x.
        let offsets =
            Tensor::<1, Int>::arange(0..r as i64, &tokens.device()).reshape([r, 1, 1]) * v as i64;
        let rows = (tokens + offsets).reshape([r * b, t]);
        let embedded = super::init::embed(table.reshape([r * v, d]), rows);
        let mut x = to_dtype(embedded.reshape([r, m, d]), dtype);
        for layer in &self.layers {
            let delta = softplus(
                to_dtype(layer.wdt.forward(x.clone()), acc)
                    + to_dtype(layer.dt_bias.val(), acc).unsqueeze_dim(1),
                1.0,
            );
            let g = delta
                * to_dtype(layer.a_log.val(), acc)
                    .exp()
                    .neg()
                    .unsqueeze_dim(1);
            let dl = layer.wdl.as_ref().map(|w| w.forward(x.clone()));
            let lambda = layer.lambda.forward(dl, &g);
            let l = lambda.dims()[3];
            let input = LogLinearInput {
                q: layer.wq.forward(x.clone()).reshape([r * b, t, h, n]),
                k: layer.wk.forward(x.clone()).reshape([r * b, t, h, n]),
                v: layer.wv.forward(x.clone()).reshape([r * b, t, h, p]),
                g: g.reshape([r * b, t, h]),
                lambda: lambda.reshape([r * b, t, h, l]),
            };
            let y = log_linear_attn(&input, form, None, false)
                .o
                .reshape([r, m, h * p]);
            x = layer.norm.forward(x + layer.wo.forward(y));
        }
        let logits = self.head.forward(self.norm.forward(x));
        to_dtype(logits, acc).reshape([r, b, t, v])
    }
}
