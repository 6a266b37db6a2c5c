//! The training loop: reads top to bottom (nanoGPT style).
//!
//! `lr_at` → `sample_batch` → forward → masked loss → backward → global-norm clip → optimiser
//! step (on every replica of a data-parallel run: [`crate::data_parallel::Replicas::step`]);
//! every `eval.every` steps `evaluate` on the held-out pool (and at the test length),
//! keep the best weights, stop early at the accuracy threshold; a resumable checkpoint every
//! `train.checkpoint_every` steps; metrics appended to `metrics.jsonl`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::TensorData;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::checkpoint::{self, TrainState};
use crate::config::{ExperimentConfig, Schedule, TrainConfig};
use crate::data::LmData;
use crate::data_parallel::{GradSync, Replicas};
use crate::model::{Model, masked_cross_entropy};
use crate::optim::Adam;
use crate::tasks::{Batch, Example, TaskConfig, batch, masked_accuracy};

/// How a run is executed (not part of the experiment itself).
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Run directory (config, metrics, checkpoints).
    pub out: PathBuf,
    /// Device to train on (with [`RunOptions::more_devices`]: the first replica's, which also
    /// evaluates; checkpoints are the first replica's).
    pub device: Device,
    /// Further devices of a data-parallel run (`--device cuda:0,cuda:1`): each holds a replica
    /// of the model and takes its share of every batch ([`crate::data_parallel`]).
    pub more_devices: Vec<Device>,
    /// How the replicas' gradients are summed ([`GradSync::None`] for one device).
    pub grad_sync: GradSync,
    /// Continue from the latest checkpoint in `out` if there is one.
    pub resume: bool,
    /// Replace the run in `out` (see [`crate::run_dir`]); without it or `resume`, a folder
    /// that holds anything is refused.
    pub overwrite: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Stop (as if killed) after this many steps of this invocation: for tests of resuming.
    pub stop_after: Option<usize>,
}

/// What a finished run reports (also written to `summary.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RunSummary {
    /// Run name.
    pub name: String,
    /// Steps completed.
    pub steps: usize,
    /// Best held-out accuracy (fraction).
    pub best_acc: f64,
    /// Step of the best accuracy.
    pub best_step: usize,
    /// Held-out accuracy at the last evaluation.
    pub last_acc: f64,
    /// Held-out loss at the last evaluation.
    pub last_loss: f64,
    /// Test-length accuracy at the best step (if a test length is set).
    pub best_test_acc: Option<f64>,
    /// Best test-length accuracy over all evaluations (if a test length is set).
    pub max_test_acc: Option<f64>,
    /// Held-out loss at the best step (LM: the lowest).
    pub best_loss: f64,
    /// LM: token-weighted held-out perplexity `exp(Σ NLL / tokens)` at the best step.
    pub best_ppl: Option<f64>,
    /// LM: the published definition, `exp(mean over batches of the batch-mean NLL)`, at the best
    /// step.
    pub best_ppl_batch_mean: Option<f64>,
    /// Whether early stopping (accuracy threshold or patience) ended the run.
    pub stopped_early: bool,
    /// Trainable parameters.
    pub params: usize,
    /// Wall-clock seconds of this invocation.
    pub seconds: f64,
}

/// Held-out metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalMetrics {
    /// Fraction of scored positions predicted right.
    pub acc: f64,
    /// Mean cross-entropy over scored positions (token-weighted).
    pub loss: f64,
    /// Mean over evaluation batches of the batch-mean cross-entropy (the published LM metric).
    pub batch_mean_loss: f64,
    /// Scored positions.
    pub scored: usize,
}

impl EvalMetrics {
    /// Token-weighted perplexity `exp(loss)`.
    pub fn ppl(&self) -> f64 {
        self.loss.exp()
    }
}

/// Where a run's batches come from (one per run: the size difference of the variants costs
/// nothing).
#[allow(clippy::large_enum_variant)]
pub enum RunData {
    /// Synthetic tasks: a fixed training pool, a held-out pool from another seed, and optionally
    /// a pool at the test length.
    Pools {
        /// Training pool.
        train: Vec<Example>,
        /// Held-out pool.
        eval: Vec<Example>,
        /// Held-out pool at `eval.test_seq_len`.
        test: Option<Vec<Example>>,
    },
    /// Language modelling: token files on disk.
    Lm(LmData),
}

impl RunData {
    /// Generates the pools or opens the token directory of `cfg`.
    pub fn load(cfg: &ExperimentConfig) -> Result<Self> {
        if let TaskConfig::Lm(lm) = &cfg.task {
            let data = LmData::open(&lm.data)?;
            let vocab = data.meta().vocab_size;
            if vocab > lm.vocab_size {
                bail!(
                    "{}: the data use a vocabulary of {vocab} tokens but task.vocab_size is {}",
                    lm.data.display(),
                    lm.vocab_size
                );
            }
            data.split(&lm.eval_split)?;
            return Ok(RunData::Lm(data));
        }
        let eval_seed = cfg.seed.wrapping_add(cfg.eval.seed_offset);
        Ok(RunData::Pools {
            train: cfg.task.generate(cfg.train.train_examples, cfg.seed)?,
            eval: cfg.task.generate(cfg.eval.examples, eval_seed)?,
            test: match cfg.eval.test_seq_len {
                Some(len) => Some(
                    cfg.task
                        .with_seq_len(len)
                        .generate(cfg.eval.examples, eval_seed)?,
                ),
                None => None,
            },
        })
    }

    /// The rows of training step `step` on the host (a function of seed and step only).
    pub fn train_batch(&self, cfg: &ExperimentConfig, step: usize) -> Result<Batch> {
        let b = cfg.train.batch_size;
        match self {
            RunData::Pools { train, .. } => {
                let indices = sample_batch(cfg.seed, step, train.len(), b);
                Ok(batch(train, &indices))
            }
            RunData::Lm(data) => {
                let t = cfg.task.seq_len();
                let (inputs, targets) = data.sample_train_batch(cfg.seed, step as u64, b, t)?;
                Ok(Batch {
                    inputs,
                    targets,
                    batch: b,
                    seq_len: t,
                })
            }
        }
    }

    /// Held-out metrics, and the test-length ones when configured.
    pub fn evaluate(
        &self,
        model: &Model,
        cfg: &ExperimentConfig,
        device: &Device,
    ) -> Result<(EvalMetrics, Option<EvalMetrics>)> {
        match self {
            RunData::Pools { eval, test, .. } => Ok((
                evaluate(model, cfg, eval, device),
                test.as_ref().map(|p| evaluate(model, cfg, p, device)),
            )),
            RunData::Lm(data) => {
                let TaskConfig::Lm(lm) = &cfg.task else {
                    unreachable!("LM data with a synthetic task")
                };
                let t = lm.seq_len;
                let mut n = data.windows(&lm.eval_split, t)?;
                if let Some(max) = lm.max_eval_windows {
                    n = n.min(max);
                }
                let mut acc = Accumulator::default();
                let mut first = 0;
                while first < n {
                    let count = cfg.eval.batch_size.min(n - first);
                    let (rows, x, y) = data.window_batch(&lm.eval_split, first, count, t)?;
                    let (inputs, targets) = rows_to_tensors(x, y, rows, t, device);
                    acc.add(model, cfg, inputs, targets);
                    first += count;
                }
                Ok((acc.finish(), None))
            }
        }
    }
}

/// `[B·T]` host rows to `[B, T]` tensors.
pub(crate) fn rows_to_tensors(
    x: Vec<u32>,
    y: Vec<i64>,
    b: usize,
    t: usize,
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let x: Vec<i64> = x.into_iter().map(i64::from).collect();
    (
        Tensor::from_data(TensorData::new(x, vec![b, t]), device),
        Tensor::from_data(TensorData::new(y, vec![b, t]), device),
    )
}

/// Sums over evaluation batches.
#[derive(Default)]
pub(crate) struct Accumulator {
    pub(crate) correct: usize,
    scored: usize,
    nll: f64,
    batch_means: Vec<f64>,
}

impl Accumulator {
    fn add(
        &mut self,
        model: &Model,
        cfg: &ExperimentConfig,
        inputs: Tensor<2, Int>,
        targets: Tensor<2, Int>,
    ) {
        let form = cfg.model.form();
        let logits = model.forward(inputs, form, false).logits;
        let predictions: Vec<u32> = logits
            .logits()
            .argmax(2)
            .into_data()
            .try_into_vec_as::<i64>()
            .expect("argmax indices")
            .into_iter()
            .map(|p| p as u32)
            .collect();
        let target_values: Vec<i64> = targets.to_data().try_into_vec_as::<i64>().expect("targets");
        let (c, s) = masked_accuracy(&predictions, &target_values);
        let (loss, n) = masked_cross_entropy(logits, targets);
        debug_assert_eq!(s, n, "accuracy and loss score the same positions");
        self.correct += c;
        self.push(loss.into_scalar::<f64>(), n);
    }

    pub(crate) fn finish(self) -> EvalMetrics {
        EvalMetrics {
            acc: self.correct as f64 / self.scored.max(1) as f64,
            loss: self.nll / self.scored.max(1) as f64,
            batch_mean_loss: self.batch_means.iter().sum::<f64>()
                / self.batch_means.len().max(1) as f64,
            scored: self.scored,
        }
    }
}

/// Combines per-batch `(mean NLL, scored tokens)` into the token-weighted mean NLL (our
/// perplexity: `exp` of it) and the mean of the batch means (the published definition).
pub fn combine_batches(batches: &[(f64, usize)]) -> (f64, f64) {
    let mut acc = Accumulator::default();
    for &(mean, n) in batches {
        acc.push(mean, n);
    }
    let m = acc.finish();
    (m.loss, m.batch_mean_loss)
}

impl Accumulator {
    pub(crate) fn push(&mut self, mean: f64, n: usize) {
        self.scored += n;
        if n > 0 {
            self.nll += mean * n as f64;
            self.batch_means.push(mean);
        }
    }
}

/// Learning rate at `step` (0-based): 1) linear warm-up from 0, 2) constant, or 3) cosine to
/// `min_lr` at the last step.
pub fn lr_at(cfg: &TrainConfig, step: usize) -> f64 {
    if step < cfg.warmup_steps {
        return cfg.lr * step as f64 / cfg.warmup_steps as f64;
    }
    match cfg.schedule {
        Schedule::Constant => cfg.lr,
        Schedule::Cosine => {
            let span = cfg.steps.saturating_sub(cfg.warmup_steps).max(1) as f64;
            let progress = ((step - cfg.warmup_steps) as f64 / span).min(1.0);
            cfg.min_lr
                + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// The optimiser of a config: Adam or AdamW with the config's betas, eps and weight decay
/// ([`crate::optim`]; the training step clips by the global norm of all gradients,
/// [`global_grad_norm`], as torch's `clip_grad_norm_`,
/// not per tensor).
pub fn optimizer(cfg: &TrainConfig) -> Adam {
    Adam::single(cfg)
}

/// The `batch_size` distinct pool indices of `step` (a function of seed and step only).
pub fn sample_batch(seed: u64, step: usize, pool: usize, batch_size: usize) -> Vec<usize> {
    let mut rng = checkpoint::step_rng(seed, step);
    rand::seq::index::sample(&mut rng, pool, batch_size).into_vec()
}

/// Inputs `[B, T]` and targets `[B, T]` of some examples, on `device`.
pub fn batch_tensors(
    examples: &[Example],
    indices: &[usize],
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let b = batch(examples, indices);
    let inputs: Vec<i64> = b.inputs.iter().map(|&x| x as i64).collect();
    let shape = vec![b.batch, b.seq_len];
    (
        Tensor::from_data(TensorData::new(inputs, shape.clone()), device),
        Tensor::from_data(TensorData::new(b.targets, shape), device),
    )
}

/// Accuracy and loss over every scored position of `examples`.
pub fn evaluate(
    model: &Model,
    cfg: &ExperimentConfig,
    examples: &[Example],
    device: &Device,
) -> EvalMetrics {
    let mut acc = Accumulator::default();
    let indices: Vec<usize> = (0..examples.len()).collect();
    for chunk in indices.chunks(cfg.eval.batch_size) {
        let (inputs, targets) = batch_tensors(examples, chunk, device);
        acc.add(model, cfg, inputs, targets);
    }
    acc.finish()
}

/// The float parameters of `model` with their rank, in visiting order.
pub(crate) fn param_ids(model: &Model) -> Vec<(ParamId, usize)> {
    struct Ids(Vec<(ParamId, usize)>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push((param.id, D));
        }
    }
    let mut ids = Ids(Vec::new());
    model.visit(&mut ids);
    ids.0
}

/// `‖g‖`, the norm of the gradients `grads` of `model` over all its parameters (read back).
pub fn global_grad_norm(model: &Model, grads: &GradientsParams) -> f64 {
    fn sq<const D: usize>(g: &GradientsParams, id: ParamId) -> Option<Tensor<1>> {
        g.get::<D>(id).map(|t| t.square().sum())
    }
    let squares: Vec<Tensor<1>> = param_ids(model)
        .into_iter()
        .filter_map(|(id, rank)| match rank {
            1 => sq::<1>(grads, id),
            2 => sq::<2>(grads, id),
            3 => sq::<3>(grads, id),
            4 => sq::<4>(grads, id),
            _ => None,
        })
        .collect();
    if squares.is_empty() {
        return 0.0;
    }
    Tensor::cat(squares, 0).sum().into_scalar::<f64>().sqrt()
}

/// Multiplies every gradient of `model` in `grads` by `factor`.
pub fn scale_grads(model: &Model, grads: &mut GradientsParams, factor: f64) {
    fn rescale<const D: usize>(g: &mut GradientsParams, id: ParamId, s: f64) {
        if let Some(t) = g.remove::<D>(id) {
            g.register(id, t * s);
        }
    }
    for (id, rank) in param_ids(model) {
        match rank {
            1 => rescale::<1>(grads, id, factor),
            2 => rescale::<2>(grads, id, factor),
            3 => rescale::<3>(grads, id, factor),
            4 => rescale::<4>(grads, id, factor),
            _ => {}
        }
    }
}

/// Appends one JSON line to `metrics.jsonl`.
pub(crate) fn log_metrics(path: &Path, line: serde_json::Value) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    writeln!(f, "{line}")?;
    Ok(())
}

/// Drops metric lines past `step` (written after the checkpoint a resumed run restarts from).
pub(crate) fn truncate_metrics(path: &Path, step: usize) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let text = fs::read_to_string(path)?;
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s as usize <= step)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    checkpoint::write_atomic(path, kept.as_bytes())
}

/// Trains one run to the end (or early stop), resuming if asked; returns its summary.
pub fn train(cfg: &ExperimentConfig, opts: &RunOptions) -> Result<RunSummary> {
    let started = Instant::now();
    let cfg = &cfg.resolved()?;
    let out = &opts.out;
    let replica_count = 1 + opts.more_devices.len();
    if cfg.train.batch_size < replica_count {
        bail!(
            "train.batch_size = {} cannot be split over {replica_count} devices: a data-parallel \
             run needs at least one row per device",
            cfg.train.batch_size
        );
    }
    // The data first, so that a run which cannot start leaves no folder behind; then the run
    // folder: new, resumed or replaced, never mixed with another run (run_dir).
    let data = RunData::load(cfg)?;
    crate::run_dir::open(out, cfg, opts.resume, opts.overwrite)?;
    let metrics = out.join("metrics.jsonl");

    let t = &cfg.train;
    let lm = cfg.task.is_lm();

    let device = opts.device.clone().autodiff();
    let mut model = Model::new(cfg, &device);
    let params = model.num_params();
    let mut optim = optimizer(t);
    let mut state = TrainState::default();
    if opts.resume
        && let Some(dir) = checkpoint::latest_checkpoint(out)?
    {
        state = checkpoint::load_checkpoint(&dir, &mut model, &mut optim)?;
        truncate_metrics(&metrics, state.step)?;
    } else if metrics.exists() {
        fs::remove_file(&metrics)?;
    }
    // One replica per device (one device: the model itself), each a fork of the loaded model.
    let devices = std::iter::once(&opts.device)
        .chain(&opts.more_devices)
        .map(|d| d.clone().autodiff())
        .collect();
    let mut replicas = Replicas::new(model, optim, devices, opts.grad_sync);

    let bar = progress_bar(opts.progress, t.steps, state.step, &cfg.name);
    let form = cfg.model.form();
    let tokens_per_step = (t.batch_size * cfg.task.seq_len()) as f64;
    let mut last = (f64::NAN, f64::NAN);
    let mut window = Instant::now();
    let mut window_steps = 0usize;
    let first_step = state.step;
    while state.step < t.steps && !state.stopped_early {
        if crate::stop::requested() {
            bar.abandon();
            let latest = checkpoint::latest_checkpoint_step(out)?;
            if latest != Some(state.step) && state.step > 0 {
                replicas.save_checkpoint(out, &state)?;
            }
            return Err(crate::stop::Stopped(format!(
                "stopped by a signal at step {}, with a checkpoint of that step in {}: \
                 `--resume` continues from there",
                state.step,
                checkpoint::checkpoint_root(out).display()
            ))
            .into());
        }
        if opts
            .stop_after
            .is_some_and(|n| state.step - first_step >= n)
        {
            bar.abandon();
            bail!(
                "stopped after {} steps as asked (--stop-after)",
                state.step - first_step
            );
        }
        let step = state.step;
        let lr = lr_at(t, step);
        let rows = data.train_batch(cfg, step)?;
        // Forward, backward, gradients summed over the replicas, clipped, one optimiser step
        // (none when the loss is not finite: the run stops below).
        let report = replicas.step(&rows, lr, t.grad_clip, form)?;
        let (loss_value, grad_norm) = (report.loss, report.grad_norm);
        if !loss_value.is_finite() {
            bar.abandon();
            bail!(
                "the loss became {loss_value} at step {step}; stopping. The last good checkpoint \
                 (step {}) is kept in {}: lower train.lr or set train.grad_clip and resume",
                checkpoint::latest_checkpoint_step(out)?.unwrap_or(0),
                checkpoint::checkpoint_root(out).display()
            );
        }
        state.step += 1;
        window_steps += 1;
        if state.step == first_step + 1 {
            replicas.check_identical()?;
        }

        if state.step % t.log_every == 0 || state.step == t.steps {
            let secs = window.elapsed().as_secs_f64().max(1e-9);
            let tps = tokens_per_step * window_steps as f64 / secs;
            log_metrics(
                &metrics,
                json!({"step": state.step, "loss": loss_value, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tps}),
            )?;
            bar.set_message(format!(
                "loss {loss_value:.4} acc {} {:.0} tok/s",
                fmt_acc(last.0),
                tps
            ));
            window = Instant::now();
            window_steps = 0;
        }

        if state.step % cfg.eval.every == 0 || state.step == t.steps {
            let valid = replicas.primary().valid();
            let (e, test) = data.evaluate(&valid, cfg, &opts.device)?;
            last = (e.acc, e.loss);
            let mut line = json!({"step": state.step, "eval_acc": e.acc, "eval_loss": e.loss});
            if lm {
                line["eval_ppl"] = json!(e.ppl());
                line["eval_ppl_batch_mean"] = json!(e.batch_mean_loss.exp());
            }
            if let Some(test) = test {
                line["test_acc"] = json!(test.acc);
                line["test_loss"] = json!(test.loss);
            }
            log_metrics(&metrics, line)?;
            // Synthetic tasks keep the most accurate model, language models the lowest loss.
            let better = if lm {
                state.best_loss.is_none_or(|b| e.loss < b)
            } else {
                state.best_acc.is_none_or(|b| e.acc > b)
            };
            if better {
                state.best_acc = Some(e.acc);
                state.best_step = Some(state.step);
                state.best_loss = Some(e.loss);
                state.best_test_acc = test.map(|x| x.acc);
                state.best_batch_mean_loss = Some(e.batch_mean_loss);
                checkpoint::save_best(out, replicas.primary(), &state)?;
            }
            if cfg.eval.early_stop_acc.is_some_and(|thr| e.acc >= thr) && !lm {
                state.stopped_early = true;
            }
            let since_best = (state.step - state.best_step.unwrap_or(state.step)) / cfg.eval.every;
            if cfg.eval.patience.is_some_and(|p| since_best >= p) {
                state.stopped_early = true;
            }
            let shown = if lm {
                format!("ppl {:.2}", e.ppl())
            } else {
                fmt_acc(e.acc)
            };
            bar.set_message(format!("loss {loss_value:.4} {shown}"));
        }
        if state.step % t.checkpoint_every == 0 || state.step == t.steps || state.stopped_early {
            replicas.check_identical()?;
            replicas.save_checkpoint(out, &state)?;
        }
        bar.set_position(state.step as u64);
    }
    bar.finish();
    let summary = summarise(cfg, out, &state, params, started.elapsed().as_secs_f64())?;
    checkpoint::write_atomic(
        &out.join("summary.json"),
        &serde_json::to_vec_pretty(&summary)?,
    )?;
    Ok(summary)
}

pub(crate) fn fmt_acc(a: f64) -> String {
    if a.is_nan() {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * a)
    }
}

/// The run's summary, read back from its metrics (so it is the same after a resume).
pub(crate) fn summarise(
    cfg: &ExperimentConfig,
    out: &Path,
    state: &TrainState,
    params: usize,
    seconds: f64,
) -> Result<RunSummary> {
    let evals = read_metrics(&out.join("metrics.jsonl"))?
        .into_iter()
        .filter(|m| m.get("eval_acc").is_some())
        .collect::<Vec<_>>();
    let last = evals.last();
    let get = |m: Option<&serde_json::Value>, k: &str| m.and_then(|m| m[k].as_f64());
    Ok(RunSummary {
        name: cfg.name.clone(),
        steps: state.step,
        best_acc: state.best_acc.unwrap_or(0.0),
        best_step: state.best_step.unwrap_or(0),
        last_acc: get(last, "eval_acc").unwrap_or(0.0),
        last_loss: get(last, "eval_loss").unwrap_or(f64::NAN),
        best_test_acc: state.best_test_acc,
        best_loss: state.best_loss.unwrap_or(f64::NAN),
        best_ppl: cfg
            .task
            .is_lm()
            .then(|| state.best_loss.unwrap_or(f64::NAN).exp()),
        best_ppl_batch_mean: cfg
            .task
            .is_lm()
            .then(|| state.best_batch_mean_loss.unwrap_or(f64::NAN).exp()),
        max_test_acc: evals
            .iter()
            .filter_map(|m| m["test_acc"].as_f64())
            .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x)))),
        stopped_early: state.stopped_early,
        params,
        seconds,
    })
}

/// The metrics log of a run folder: `metrics.jsonl` as a run writes it, or
/// `metrics.jsonl.gz` where committed results keep it compressed (a 20,000-step MQAR run logs
/// ≈ 300 kB; everything tracked travels with each GPU call). `None` when neither exists.
pub fn run_metrics_path(run_dir: &Path) -> Option<PathBuf> {
    ["metrics.jsonl", "metrics.jsonl.gz"]
        .iter()
        .map(|name| run_dir.join(name))
        .find(|p| p.exists())
}

/// Every line of a `metrics.jsonl` (gzip-compressed when the name ends in `.gz`).
pub fn read_metrics(path: &Path) -> Result<Vec<serde_json::Value>> {
    let cannot = || format!("cannot read {}", path.display());
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut text = String::new();
        let file = fs::File::open(path).with_context(cannot)?;
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text)
            .with_context(cannot)?;
        text
    } else {
        fs::read_to_string(path).with_context(cannot)?
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).with_context(|| format!("bad line in {}: {l}", path.display()))
        })
        .collect()
}

pub(crate) fn progress_bar(
    show: bool,
    total: usize,
    pos: usize,
    name: &str,
) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] step {pos}/{len} {msg} ETA {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(name.to_string());
    bar.set_position(pos as u64);
    bar
}

/// Evaluates a finished run's best checkpoint on its task (or a modified task).
pub fn evaluate_run(
    run_dir: &Path,
    cfg: &ExperimentConfig,
    device: &Device,
) -> Result<EvalMetrics> {
    let mut model = Model::new(cfg, device);
    checkpoint::load_run_model(run_dir, &mut model)?;
    let data = RunData::load(cfg)?;
    Ok(data.evaluate(&model, cfg, device)?.0)
}
