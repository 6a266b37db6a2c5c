//! Adam and AdamW with Burn's update rules term for term (a test checks them against Burn's
//! optimisers), over the parameters of one model or of a pack of models stacked on a leading
//! replica axis, each replica with its own learning rate, step count, hyper-parameters and
//! gradient scale. The state is kept per parameter path (not per parameter id), so a checkpoint
//! of one replica of a pack is exactly the checkpoint of that run trained alone, and either can
//! resume the other.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::TensorData;

use crate::config::{OptimizerName, TrainConfig};

/// The hyper-parameters of one replica.
#[derive(Clone, Debug, PartialEq)]
pub struct Hyper {
    /// AdamW (decoupled weight decay) rather than Adam (L2 penalty added to the gradient).
    pub decoupled: bool,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Weight decay (0: none).
    pub weight_decay: f32,
}

impl Hyper {
    /// The optimiser of a run config.
    pub fn of(cfg: &TrainConfig) -> Self {
        Self {
            decoupled: cfg.optimizer == OptimizerName::Adamw,
            beta1: cfg.beta1 as f32,
            beta2: cfg.beta2 as f32,
            eps: cfg.eps as f32,
            weight_decay: cfg.weight_decay as f32,
        }
    }
}

/// What one optimiser step does to each replica.
#[derive(Clone, Debug)]
pub struct ReplicaStep {
    /// Learning rate of each replica.
    pub lr: Vec<f64>,
    /// Factor on each replica's gradient (gradient clipping; 1 for none).
    pub grad_scale: Vec<f64>,
    /// Replicas that take this step; the others keep their weights and state.
    pub active: Vec<bool>,
}

/// First and second moments of one parameter, `[R, n]` (`n` entries per replica).
struct Moments {
    m: Tensor<2>,
    v: Tensor<2>,
}

/// Adam/AdamW over a module (see the module docs).
pub struct Adam {
    hyper: Vec<Hyper>,
    replica_axis: bool,
    /// Updates taken by each replica (Adam's bias-correction step count).
    time: Vec<usize>,
    moments: HashMap<String, Moments>,
    /// Shape of each parameter per replica (without the replica axis).
    shapes: HashMap<String, Vec<usize>>,
}

/// A per-replica factor: a plain scalar for one model (no extra tensors), a `[R, 1]` column for
/// a pack.
// The tensor variant is larger, but there are two of these per optimiser step: boxing buys nothing.
#[allow(clippy::large_enum_variant)]
enum Coef {
    Scalar(f32),
    Rows(Tensor<2>),
}

impl Coef {
    fn new(values: &[f32], rows: bool, device: &Device) -> Self {
        if rows {
            let column = TensorData::new(values.to_vec(), [values.len(), 1]);
            Coef::Rows(Tensor::from_data(column, device))
        } else {
            Coef::Scalar(values[0])
        }
    }
    fn mul(&self, t: Tensor<2>) -> Tensor<2> {
        match self {
            Coef::Scalar(x) => t.mul_scalar(*x),
            Coef::Rows(c) => t * c.clone(),
        }
    }
    fn div(&self, t: Tensor<2>) -> Tensor<2> {
        match self {
            Coef::Scalar(x) => t.div_scalar(*x),
            Coef::Rows(c) => t / c.clone(),
        }
    }
    fn add(&self, t: Tensor<2>) -> Tensor<2> {
        match self {
            Coef::Scalar(x) => t.add_scalar(*x),
            Coef::Rows(c) => t + c.clone(),
        }
    }
}

/// The factors of one step, each a column over the replicas.
struct StepCoefs {
    /// Gradient factor (clipping), and whether any replica needs it.
    grad_scale: Option<Coef>,
    /// Rows of replicas that sit this step out.
    inactive: Option<Tensor<2, Bool>>,
    beta1: Coef,
    one_minus_beta1: Coef,
    beta2: Coef,
    one_minus_beta2: Coef,
    /// Adam: L2 penalty added to the gradient (None when no replica has one).
    penalty: Option<Coef>,
    /// Adam: `√(1−β2ᵗ) / (1−β1ᵗ)`, unused and `ε √(1−β2ᵗ)`. AdamW: `1−β1ᵗ`, `1−β2ᵗ` and `ε`.
    numerator: Coef,
    denominator: Coef,
    eps: Coef,
    lr: Coef,
    /// AdamW: `1 − lr·wd` (None when no replica decays).
    decay: Option<Coef>,
}

impl Adam {
    /// An optimiser for `hyper.len()` replicas; `replica_axis`: whether the parameters carry a
    /// leading replica axis (false for one model, whose parameters have none).
    pub fn new(hyper: Vec<Hyper>, replica_axis: bool) -> Self {
        assert!(
            replica_axis || hyper.len() == 1,
            "Adam: one model has one set of hyper-parameters"
        );
        let mixed = hyper.iter().any(|h| h.decoupled != hyper[0].decoupled);
        assert!(!mixed, "Adam: a pack mixes Adam and AdamW");
        Self {
            time: vec![0; hyper.len()],
            hyper,
            replica_axis,
            moments: HashMap::new(),
            shapes: HashMap::new(),
        }
    }

    /// The optimiser of one run.
    pub fn single(cfg: &TrainConfig) -> Self {
        Self::new(vec![Hyper::of(cfg)], false)
    }

    /// Updates taken by each replica.
    pub fn time(&self) -> &[usize] {
        &self.time
    }

    /// Sets the updates already taken by replica `r` (when resuming it).
    pub fn set_time(&mut self, r: usize, time: usize) {
        self.time[r] = time;
    }

    /// One step of a single model with learning rate `lr` (gradients already clipped).
    pub fn step<M: Module>(&mut self, lr: f64, model: M, grads: GradientsParams) -> M {
        let step = ReplicaStep {
            lr: vec![lr],
            grad_scale: vec![1.0],
            active: vec![true],
        };
        self.step_replicas(model, grads, &step)
    }

    /// One step of every active replica.
    pub fn step_replicas<M: Module>(
        &mut self,
        model: M,
        mut grads: GradientsParams,
        step: &ReplicaStep,
    ) -> M {
        let r = self.hyper.len();
        assert_eq!(
            step.lr.len(),
            r,
            "Adam::step_replicas: one learning rate per replica"
        );
        for (t, &active) in self.time.iter_mut().zip(&step.active) {
            if active {
                *t += 1;
            }
        }
        let Some(device) = first_device(&model) else {
            return model;
        };
        let coefs = self.coefs(step, &device);
        let mut mapper = Mapper {
            optim: self,
            grads: &mut grads,
            coefs: &coefs,
            path: Vec::new(),
        };
        model.map(&mut mapper)
    }

    fn coefs(&self, step: &ReplicaStep, device: &Device) -> StepCoefs {
        let rows = self.replica_axis;
        let per = |f: &dyn Fn(usize, &Hyper) -> f32| -> Vec<f32> {
            self.hyper
                .iter()
                .enumerate()
                .map(|(i, h)| f(i, h))
                .collect()
        };
        let coef = |values: Vec<f32>| Coef::new(&values, rows, device);
        // Bias corrections of a replica that sat out from the start stay finite (t ≥ 1).
        let t = |i: usize| self.time[i].max(1) as i32;
        let inactive = step.active.iter().any(|a| !a).then(|| {
            let mask = TensorData::new(
                step.active.iter().map(|a| !a).collect::<Vec<_>>(),
                [step.active.len(), 1],
            );
            Tensor::<2, Bool>::from_data(mask, device)
        });
        let scaled = step.grad_scale.iter().any(|&s| s != 1.0);
        let decoupled = self.hyper[0].decoupled;
        let any_decay = self.hyper.iter().any(|h| h.weight_decay > 0.0);
        let (numerator, denominator, eps) = if decoupled {
            (
                coef(per(&|i, h| 1.0 - h.beta1.powi(t(i)))),
                coef(per(&|i, h| 1.0 - h.beta2.powi(t(i)))),
                coef(per(&|_, h| h.eps)),
            )
        } else {
            let bc2 = |i: usize, h: &Hyper| (1.0 - h.beta2.powi(t(i))).sqrt();
            (
                coef(per(&|i, h| bc2(i, h) / (1.0 - h.beta1.powi(t(i))))),
                Coef::Scalar(1.0),
                coef(per(&|i, h| h.eps * bc2(i, h))),
            )
        };
        StepCoefs {
            grad_scale: scaled.then(|| coef(step.grad_scale.iter().map(|&s| s as f32).collect())),
            inactive,
            beta1: coef(per(&|_, h| h.beta1)),
            one_minus_beta1: coef(per(&|_, h| 1.0 - h.beta1)),
            beta2: coef(per(&|_, h| h.beta2)),
            one_minus_beta2: coef(per(&|_, h| 1.0 - h.beta2)),
            penalty: (!decoupled && any_decay).then(|| coef(per(&|_, h| h.weight_decay))),
            numerator,
            denominator,
            eps,
            lr: coef(step.lr.iter().map(|&x| x as f32).collect()),
            decay: (decoupled && any_decay).then(|| {
                coef(
                    step.lr
                        .iter()
                        .zip(&self.hyper)
                        .map(|(&lr, h)| (1.0 - lr * h.weight_decay as f64) as f32)
                        .collect(),
                )
            }),
        }
    }

    /// `p` after one step given its gradient `g` (both `[R, n]`), updating the moments of `path`.
    fn update(&mut self, path: &str, p: Tensor<2>, g: Tensor<2>, c: &StepCoefs) -> Tensor<2> {
        let mut g = match &c.grad_scale {
            Some(s) => s.mul(g),
            None => g,
        };
        let inactive = c
            .inactive
            .as_ref()
            .map(|rows| rows.clone().expand(p.dims()));
        if let Some(rows) = &inactive {
            // Zero, not scaled: a replica that stopped on a NaN loss has NaN gradients.
            g = g.mask_fill(rows.clone(), 0.0);
        }
        if let Some(penalty) = &c.penalty {
            g = penalty.mul(p.clone()).add(g);
        }
        let old = self.moments.remove(path).unwrap_or_else(|| Moments {
            m: p.zeros_like(),
            v: p.zeros_like(),
        });
        // Burn's first step sets m = (1−β1)·g; 0·β1 + (1−β1)·g is the same number.
        let m = c
            .beta1
            .mul(old.m.clone())
            .add(c.one_minus_beta1.mul(g.clone()));
        let v = c
            .beta2
            .mul(old.v.clone())
            .add(c.one_minus_beta2.mul(g.square()));
        let delta = if self.hyper[0].decoupled {
            // AdamW: (m/(1−β1ᵗ)) / (√(v/(1−β2ᵗ)) + ε).
            c.numerator
                .div(m.clone())
                .div(c.eps.add(c.denominator.div(v.clone()).sqrt()))
        } else {
            // Adam: m·(√(1−β2ᵗ)/(1−β1ᵗ)) / (√v + ε√(1−β2ᵗ)).
            c.numerator.mul(m.clone()).div(c.eps.add(v.clone().sqrt()))
        };
        let decayed = match &c.decay {
            Some(d) => d.mul(p.clone()),
            None => p.clone(),
        };
        let updated = decayed - c.lr.mul(delta);
        let (updated, m, v) = match inactive {
            // A replica that sits out keeps its weights and its state exactly.
            Some(rows) => (
                updated.mask_where(rows.clone(), p),
                m.mask_where(rows.clone(), old.m),
                v.mask_where(rows, old.v),
            ),
            None => (updated, m, v),
        };
        self.moments.insert(path.to_string(), Moments { m, v });
        updated
    }

    /// The state of replica `r`: `m.<path>` and `v.<path>` in each parameter's own shape.
    pub fn replica_state(&self, r: usize) -> Vec<(String, TensorData)> {
        let mut out = Vec::new();
        let mut paths: Vec<&String> = self.moments.keys().collect();
        paths.sort();
        for path in paths {
            let moments = &self.moments[path];
            let shape = self.shapes[path].clone();
            for (name, t) in [("m", &moments.m), ("v", &moments.v)] {
                let row = t.clone().narrow(0, r, 1).into_data();
                let values: Vec<f32> = row.convert::<f32>().try_to_vec::<f32>().expect("f32 state");
                out.push((
                    format!("{name}.{path}"),
                    TensorData::new(values, shape.clone()),
                ));
            }
        }
        out
    }

    /// A copy of this optimiser with its state on `device` (a data-parallel replica's).
    pub fn fork(&self, device: &Device) -> Adam {
        let moments = self
            .moments
            .iter()
            .map(|(path, mv)| {
                let moved = Moments {
                    m: mv.m.clone().to_device(device),
                    v: mv.v.clone().to_device(device),
                };
                (path.clone(), moved)
            })
            .collect();
        Adam {
            hyper: self.hyper.clone(),
            replica_axis: self.replica_axis,
            time: self.time.clone(),
            moments,
            shapes: self.shapes.clone(),
        }
    }

    /// Sets the state of every replica: `states[r]` as written by [`Adam::replica_state`] (its
    /// step count set with [`Adam::set_time`]), or `None` for a replica starting afresh.
    pub fn load_state(&mut self, states: &[Option<HashMap<String, TensorData>>], device: &Device) {
        assert_eq!(
            states.len(),
            self.hyper.len(),
            "Adam::load_state: one state per replica"
        );
        let mut paths: Vec<String> = states
            .iter()
            .flatten()
            .flat_map(|s| s.keys())
            .filter_map(|k| k.strip_prefix("m.").map(str::to_string))
            .collect();
        paths.sort();
        paths.dedup();
        self.moments.clear();
        for path in paths {
            let shape = states
                .iter()
                .flatten()
                .find_map(|s| s.get(&format!("m.{path}")))
                .map(|d| d.shape().to_vec())
                .expect("a state that names the path");
            let n: usize = shape.iter().product();
            let rows = |name: &str| -> Tensor<2> {
                let mut values = Vec::with_capacity(n * states.len());
                for s in states {
                    match s.as_ref().and_then(|s| s.get(&format!("{name}.{path}"))) {
                        Some(d) => values.extend(
                            d.clone()
                                .convert::<f32>()
                                .try_to_vec::<f32>()
                                .expect("f32 state"),
                        ),
                        None => values.extend(std::iter::repeat_n(0.0f32, n)),
                    }
                }
                Tensor::from_data(TensorData::new(values, [states.len(), n]), device)
            };
            let moments = Moments {
                m: rows("m"),
                v: rows("v"),
            };
            self.shapes.insert(path.clone(), shape);
            self.moments.insert(path, moments);
        }
    }
}

fn first_device<M: Module>(model: &M) -> Option<Device> {
    model.devices().into_iter().next()
}

struct Mapper<'a> {
    optim: &'a mut Adam,
    grads: &'a mut GradientsParams,
    coefs: &'a StepCoefs,
    path: Vec<String>,
}

impl ModuleMapper for Mapper<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let path = self.path.join(".");
        let require_grad = tensor.is_require_grad();
        let inner = tensor.inner();
        let dims = inner.dims();
        let replicas = if self.optim.replica_axis { dims[0] } else { 1 };
        let n = inner.shape().num_elements() / replicas.max(1);
        let own_shape = if self.optim.replica_axis {
            dims[1..].to_vec()
        } else {
            dims.to_vec()
        };
        self.optim.shapes.insert(path.clone(), own_shape);
        let updated = self.optim.update(
            &path,
            inner.reshape([replicas, n]),
            grad.reshape([replicas, n]),
            self.coefs,
        );
        let mut tensor = Tensor::from_inner(updated.reshape(dims));
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// The squared global gradient norm of each replica of a pack, `[replicas]` on the device (not
/// read back: the caller reads it with the losses): `grads` of `model`, whose parameters carry a
/// leading axis of `replicas` (the square of the norm `train::global_grad_norm` computes for
/// one run).
pub fn replica_grad_squares<M: Module>(
    model: &M,
    grads: &GradientsParams,
    replicas: usize,
) -> Tensor<1> {
    struct Squares<'a> {
        grads: &'a GradientsParams,
        rows: Vec<Tensor<2>>,
        replicas: usize,
    }
    impl burn::module::ModuleVisitor for Squares<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(param.id) {
                let n = g.shape().num_elements() / self.replicas;
                self.rows
                    .push(g.reshape([self.replicas, n]).square().sum_dim(1));
            }
        }
    }
    let mut squares = Squares {
        grads,
        rows: Vec::new(),
        replicas,
    };
    model.visit(&mut squares);
    match first_device(model) {
        Some(_) if !squares.rows.is_empty() => {
            Tensor::cat(squares.rows, 1).sum_dim(1).reshape([replicas])
        }
        Some(device) => Tensor::zeros([replicas], &device),
        None => Tensor::zeros([replicas], &Device::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ModuleVisitor;
    use burn::optim::{AdamConfig, AdamWConfig, decay::WeightDecayConfig};
    use loglinear::nn::{LambdaConfig, LambdaMode, SyntheticConfig, SyntheticLm};

    fn model(device: &Device) -> SyntheticLm {
        SyntheticConfig {
            d_model: 8,
            d_state: 4,
            head_dim: 4,
            ..SyntheticConfig::new(
                11,
                LambdaConfig {
                    mode: LambdaMode::MlpSoftplus,
                    levels: 5,
                    mlp_hidden: 3,
                    init: loglinear::nn::LambdaInit::Identity,
                },
            )
        }
        .init(7, device)
    }

    fn loss(m: &SyntheticLm, step: usize, device: &Device) -> Tensor<1> {
        let ids: Vec<i64> = (0..2 * 9)
            .map(|i| ((i * 7 + step * 3) % 11) as i64)
            .collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [2, 9]), device);
        let logits = m
            .run(tokens, loglinear::Form::Chunked { chunk: 4 }, false)
            .0;
        (logits.clone() * logits.sin()).sum()
    }

    fn params(m: &SyntheticLm) -> Vec<f32> {
        struct All(Vec<f32>);
        impl ModuleVisitor for All {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                self.0
                    .extend(p.val().into_data().convert::<f32>().iter::<f32>());
            }
        }
        let mut all = All(Vec::new());
        m.visit(&mut all);
        all.0
    }

    /// Six steps of our Adam/AdamW and Burn's from the same weights on the same losses leave
    /// the same weights (the same f32 operations in the same order).
    #[test]
    fn adam_and_adamw_match_burn_step_for_step() {
        let device = Device::flex().autodiff();
        for decoupled in [false, true] {
            let cfg = TrainConfig {
                optimizer: if decoupled {
                    OptimizerName::Adamw
                } else {
                    OptimizerName::Adam
                },
                weight_decay: 0.05,
                beta1: 0.8,
                beta2: 0.95,
                eps: 1e-6,
                ..TrainConfig::default()
            };
            let mut ours = Adam::single(&cfg);
            let mut burn_optim = if decoupled {
                AdamWConfig::new()
                    .with_beta_1(0.8)
                    .with_beta_2(0.95)
                    .with_epsilon(1e-6)
                    .with_weight_decay(0.05)
                    .init()
            } else {
                AdamConfig::new()
                    .with_beta_1(0.8)
                    .with_beta_2(0.95)
                    .with_epsilon(1e-6)
                    .with_weight_decay(Some(WeightDecayConfig::new(0.05)))
                    .init()
            };
            let (mut a, mut b) = (model(&device), model(&device));
            for step in 0..6 {
                let lr = 1e-2 / (step + 1) as f64;
                let ga = GradientsParams::from_grads(loss(&a, step, &device).backward(), &a);
                a = ours.step(lr, a, ga);
                let gb = GradientsParams::from_grads(loss(&b, step, &device).backward(), &b);
                b = burn_optim.step(lr, b, gb);
                let (pa, pb) = (params(&a), params(&b));
                let worst = pa
                    .iter()
                    .zip(&pb)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    worst <= 1e-7,
                    "decoupled {decoupled}, step {step}: differs by {worst:e}"
                );
                assert!(pa != params(&model(&device)), "the weights moved");
            }
        }
    }

    /// A replica that sits out a step keeps its weights and moments exactly, even with NaN
    /// gradients; the others move.
    #[test]
    fn an_inactive_replica_keeps_weights_and_state() {
        let device = Device::flex().autodiff();
        let w = Tensor::<2>::from_data(
            TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]),
            &device,
        )
        .require_grad();
        let p = Param::from_tensor(w);
        #[derive(Module, Debug)]
        struct One {
            w: Param<Tensor<2>>,
        }
        let mut m = One { w: p };
        let mut optim = Adam::new(vec![Hyper::of(&TrainConfig::default()); 2], true);
        let nan = Tensor::<2>::from_data(
            TensorData::new(vec![1.0f32, 1.0, f32::NAN, 1.0], [2, 2]),
            &device,
        );
        let grads = GradientsParams::from_grads((m.w.val() * nan).sum().backward(), &m);
        let step = ReplicaStep {
            lr: vec![0.1, 0.1],
            grad_scale: vec![1.0, 1.0],
            active: vec![true, false],
        };
        m = optim.step_replicas(m, grads, &step);
        let after: Vec<f32> =
            m.w.val()
                .into_data()
                .convert::<f32>()
                .iter::<f32>()
                .collect();
        assert_eq!(
            &after[2..],
            &[3.0, 4.0],
            "the inactive replica is untouched"
        );
        assert!(
            after[0] < 1.0 && after[1] < 2.0,
            "the active replica moved: {after:?}"
        );
        assert_eq!(optim.time(), &[1, 0]);
        let state = optim.replica_state(1);
        assert!(
            state.iter().all(|(_, d)| d.iter::<f32>().all(|x| x == 0.0)),
            "its moments stay zero"
        );
    }
}
