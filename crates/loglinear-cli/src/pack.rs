//! Packed training: several runs of one shape trained together as one batched model
//! ([`PackedSyntheticLm`]: parameters stacked on a replica axis, one batched matmul per layer, the
//! core op once over replicas × batch). Each replica is the run it would be alone
//! ([`crate::train::train`]): its own data stream, learning-rate schedule, gradient clipping (per
//! replica), optimiser state, evaluations, best checkpoint, early stop and NaN guard, and its own
//! run folder in `train`'s format (`config.toml`, `metrics.jsonl`, `summary.json`, `best/`,
//! `checkpoints/`), so `summarize`, `eval`, `viz` and `--resume` work on it as on any run, and a
//! killed pack resumes each replica from its own latest checkpoint.
//!
//! The loop mirrors `train::train` step for step; a replica that finishes (its last step, an
//! early stop, or a non-finite loss) stops changing while the pack runs on.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::TensorData;
use loglinear::nn::{PackedSyntheticLm, cross_entropy_rows};
use serde_json::json;

use crate::checkpoint::{self, TrainState};
use crate::config::{ExperimentConfig, Network};
use crate::model::Model;
use crate::optim::{Adam, Hyper, ReplicaStep};
use crate::tasks::{Example, IGNORE, batch, masked_accuracy};
use crate::train::{
    Accumulator, EvalMetrics, RunData, RunSummary, fmt_acc, log_metrics, lr_at, progress_bar,
    summarise, truncate_metrics,
};

/// One run of a pack: its resolved config and its folder.
#[derive(Clone, Debug)]
pub struct PackRun {
    /// The run's config (as `train` would get it).
    pub config: ExperimentConfig,
    /// Its run folder.
    pub out: PathBuf,
}

/// What decides whether two runs can share a pack: the tensor shapes of their models and of
/// their batches (training and evaluation), the core-op form and the optimiser family. `None`
/// for runs that train alone (language models, architectures other than `paper_synthetic`, the
/// `gated_deltanet` mixer: [`loglinear::nn::packable`] says why).
pub fn pack_key(cfg: &ExperimentConfig) -> Option<String> {
    let Ok(Network::PaperSynthetic(m)) = cfg.network() else {
        return None;
    };
    if loglinear::nn::packable(std::slice::from_ref(&m)).is_err() {
        return None;
    }
    if cfg.task.is_lm() {
        return None;
    }
    let layout = match m.lambda.mode {
        loglinear::nn::LambdaMode::Linear => "linear",
        loglinear::nn::LambdaMode::MlpSoftplus | loglinear::nn::LambdaMode::MlpSoftmax => "mlp",
        loglinear::nn::LambdaMode::Ones => "ones",
    };
    Some(
        json!({
            "vocab": cfg.task.vocab_size(),
            "seq_len": cfg.task.seq_len(),
            "batch": cfg.train.batch_size,
            "optimizer": format!("{:?}", cfg.train.optimizer),
            "model": [m.d_model, m.n_layers, m.heads, m.d_state, m.head_dim, m.lambda.mlp_hidden, m.lambda.levels],
            "lambda_layout": layout,
            "form": format!("{:?}", cfg.model.form()),
            "precision": format!("{:?}", m.precision),
            "eval": [cfg.eval.examples, cfg.eval.batch_size],
            "test_seq_len": cfg.eval.test_seq_len,
        })
        .to_string(),
    )
}

/// `LOGLINEAR_PROFILE_PACK=START:COUNT` (GPU builds): profiles pack steps START..START+COUNT
/// kernel by kernel (host work of the step included: data, logging, evaluation) and prints the
/// table of `bench train --profile` to stderr, to see where a pack step's time goes.
struct PackProfiler {
    window: Option<(usize, usize)>,
    #[cfg(feature = "persistence")]
    running: Option<(crate::profile::KernelProfile, Instant)>,
}

impl PackProfiler {
    fn from_env() -> Self {
        let window = std::env::var("LOGLINEAR_PROFILE_PACK").ok().and_then(|v| {
            let (a, b) = v.split_once(':')?;
            Some((a.parse().ok()?, b.parse::<usize>().ok()?.max(1)))
        });
        Self {
            window,
            #[cfg(feature = "persistence")]
            running: None,
        }
    }

    /// Called before pack step `tick` (0-based) starts.
    #[cfg(feature = "persistence")]
    fn at_step(&mut self, tick: usize, device: &Device) {
        let Some((start, count)) = self.window else {
            return;
        };
        if tick == start {
            device.sync().ok();
            self.running = Some((crate::profile::KernelProfile::start(), Instant::now()));
        } else if tick == start + count
            && let Some((profile, began)) = self.running.take()
        {
            device.sync().ok();
            let wall_ms = began.elapsed().as_secs_f64() * 1e3 / count as f64;
            eprintln!(
                "\nprofile of pack steps {start}..{}:\n\n{}",
                start + count,
                profile.finish().table(count, wall_ms, 25)
            );
            self.window = None;
        }
    }

    #[cfg(not(feature = "persistence"))]
    fn at_step(&mut self, tick: usize, _device: &Device) {
        if self.window.is_some_and(|(start, _)| tick == start) {
            eprintln!("LOGLINEAR_PROFILE_PACK needs a GPU build (`--features cuda`)");
        }
    }
}

/// A replica's progress.
struct Replica {
    run: PackRun,
    data: std::rc::Rc<RunData>,
    state: TrainState,
    /// Still training.
    active: bool,
    /// Why it stopped early with an error (a non-finite loss).
    failed: Option<String>,
    last: (f64, f64),
    window_steps: usize,
    window: Instant,
}

/// Options of a pack.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Device to train on.
    pub device: Device,
    /// Show a progress bar.
    pub progress: bool,
    /// Stop (as if killed) after this many steps of this invocation: for tests of resuming.
    pub stop_after: Option<usize>,
}

/// Trains the runs of `runs` (at least one; shapes as [`pack_key`] requires) as one pack, each
/// resuming from its own latest checkpoint if it has one. Returns each run's summary, or the
/// error that stopped it (a non-finite loss); the others are unaffected.
pub fn train_pack(runs: &[PackRun], opts: &PackOptions) -> Result<Vec<Result<RunSummary>>> {
    train_pack_from(runs, opts, 0.0)
}

/// Whether a pack of `size` replicas, `running` of them still training with at most
/// `steps_left` steps to go out of the longest such run's `steps`, should continue as a smaller
/// pack of those: once at most half of it trains on and they have at least a quarter of their
/// steps left. A finished replica still costs its share of every pack step (it is fed a dummy
/// batch); a new pack costs a few seconds to build from the checkpoints.
fn should_repack(size: usize, running: usize, steps_left: usize, steps: usize) -> bool {
    running >= 1 && 2 * running <= size && 4 * steps_left >= steps
}

/// [`train_pack`] with `spent` seconds already spent on these runs by an earlier pack (their
/// summaries' `seconds` count from the first one).
fn train_pack_from(
    runs: &[PackRun],
    opts: &PackOptions,
    spent: f64,
) -> Result<Vec<Result<RunSummary>>> {
    let started = Instant::now();
    let elapsed = || spent + started.elapsed().as_secs_f64();
    let Some(first) = runs.first() else {
        return Ok(Vec::new());
    };
    let key = pack_key(&first.config);
    for run in runs {
        if key.is_none() || pack_key(&run.config) != key {
            bail!(
                "{} cannot share a pack with {}: only paper_synthetic runs of equal shapes pack",
                run.out.display(),
                first.out.display()
            );
        }
    }
    let device = opts.device.clone().autodiff();
    // Pools are shared by runs with the same task, seed and sizes (e.g. runs differing in λ).
    let mut pools: HashMap<String, std::rc::Rc<RunData>> = HashMap::new();
    let mut replicas = Vec::new();
    let mut models = Vec::new();
    let mut optim_states = Vec::new();
    for run in runs {
        let cfg = run.config.resolved()?;
        prepare_folder(&cfg, &run.out)?;
        let pool_key =
            json!({"task": &cfg.task, "seed": cfg.seed, "train": cfg.train.train_examples,
            "eval": [cfg.eval.examples, cfg.eval.seed_offset], "test": cfg.eval.test_seq_len})
            .to_string();
        let data = match pools.get(&pool_key) {
            Some(d) => d.clone(),
            None => {
                let d = std::rc::Rc::new(RunData::load(&cfg)?);
                pools.insert(pool_key, d.clone());
                d
            }
        };
        let mut model = Model::new(&cfg, &device);
        let metrics = run.out.join("metrics.jsonl");
        let mut state = TrainState::default();
        let mut moments = None;
        if let Some(dir) = checkpoint::latest_checkpoint(&run.out)? {
            checkpoint::load_weights(&mut model, &dir.join("model.safetensors"))?;
            moments = Some(checkpoint::read_optimizer_state(&dir)?);
            state = checkpoint::read_state(&dir.join("state.json"))?;
            truncate_metrics(&metrics, state.step)?;
        } else if metrics.exists() {
            fs::remove_file(&metrics)?;
        }
        let Model::PaperSynthetic(synthetic) = model else {
            unreachable!("pack_key admits paper_synthetic runs only")
        };
        models.push(synthetic);
        optim_states.push(moments);
        let active = state.step < cfg.train.steps && !state.stopped_early;
        replicas.push(Replica {
            run: PackRun {
                config: cfg,
                out: run.out.clone(),
            },
            data,
            state,
            active,
            failed: None,
            last: (f64::NAN, f64::NAN),
            window_steps: 0,
            window: Instant::now(),
        });
    }
    let resumed: Vec<usize> = replicas
        .iter()
        .filter(|r| r.active && r.state.step > 0)
        .map(|r| r.state.step)
        .collect();
    if let (Some(lo), Some(hi)) = (resumed.iter().min(), resumed.iter().max()) {
        eprintln!(
            "pack of {}: {} runs resume from their checkpoints (steps {lo}–{hi})",
            replicas.len(),
            resumed.len()
        );
    }
    let params = models[0].num_params();
    let mut packed = PackedSyntheticLm::stack(&models);
    drop(models);
    let hyper: Vec<Hyper> = replicas
        .iter()
        .map(|r| Hyper::of(&r.run.config.train))
        .collect();
    let mut optim = Adam::new(hyper, true);
    optim.load_state(&optim_states, &device);
    for (i, r) in replicas.iter().enumerate() {
        optim.set_time(i, r.state.step);
    }

    let cfg0 = replicas[0].run.config.clone();
    let (b, t) = (cfg0.train.batch_size, cfg0.task.seq_len());
    let form = cfg0.model.form();
    let total_steps = replicas
        .iter()
        .map(|r| r.run.config.train.steps)
        .max()
        .unwrap_or(0);
    let bar = progress_bar(
        opts.progress,
        total_steps,
        replicas.iter().map(|r| r.state.step).min().unwrap_or(0),
        &format!("pack of {}", replicas.len()),
    );
    let mut ticks = 0usize;
    let mut repack = false;
    let mut profiler = PackProfiler::from_env();
    while replicas.iter().any(|r| r.active) {
        if crate::stop::requested() {
            bar.abandon();
            for (i, r) in replicas.iter().enumerate() {
                let latest = checkpoint::latest_checkpoint_step(&r.run.out)?;
                if r.active && r.state.step > 0 && latest != Some(r.state.step) {
                    save_replica_checkpoint(&packed, &optim, i, r)?;
                }
            }
            return Err(crate::stop::Stopped(format!(
                "stopped by a signal after {ticks} pack steps, with a checkpoint of every \
                 unfinished run's last step: the same sweep again (or `--resume`) continues"
            ))
            .into());
        }
        if opts.stop_after.is_some_and(|n| ticks >= n) {
            bar.abandon();
            bail!("stopped after {ticks} steps as asked (--stop-after)");
        }
        profiler.at_step(ticks, &device);
        ticks += 1;
        // 1) Each replica's batch of its own step (a finished one gets an unscored dummy).
        let mut inputs = Vec::with_capacity(replicas.len() * b * t);
        let mut targets = Vec::with_capacity(replicas.len() * b * t);
        let mut lrs = Vec::new();
        let mut scored = Vec::new();
        for r in &replicas {
            let cfg = &r.run.config;
            if r.active {
                let (x, y) = host_train_batch(&r.data, cfg, r.state.step)?;
                scored.push(y.iter().filter(|&&v| v != IGNORE).count());
                inputs.extend(x);
                targets.extend(y);
                lrs.push(lr_at(&cfg.train, r.state.step));
            } else {
                inputs.extend(std::iter::repeat_n(0i64, b * t));
                targets.extend(std::iter::repeat_n(IGNORE, b * t));
                scored.push(0);
                lrs.push(0.0);
            }
        }
        let n = replicas.len();
        let inputs = Tensor::<3, Int>::from_data(TensorData::new(inputs, [n, b, t]), &device);
        let targets = Tensor::<3, Int>::from_data(TensorData::new(targets, [n, b, t]), &device);
        // 2) Forward, each replica's masked loss, one backward for the sum (replicas share no
        //    parameter, so each gets the gradient of its own loss).
        let logits = packed.run(inputs, form);
        let losses = replica_cross_entropy(logits, targets, &scored);
        let grads = GradientsParams::from_grads(losses.clone().sum().backward(), &packed);
        // 3) One read back per step, once the backward is queued: the losses (the NaN guard)
        //    and each replica's gradient norm (clipping). A read before the backward would leave
        //    the GPU idle while the host queues it.
        //    (Both reads wait for the same queue: the second costs no second wait.)
        let squares = crate::optim::replica_grad_squares(&packed, &grads, n);
        let host = |t: Tensor<1>| -> Vec<f64> {
            t.into_data()
                .convert::<f64>()
                .try_to_vec::<f64>()
                .expect("values per replica")
        };
        let loss_values = host(losses);
        let norms: Vec<f64> = host(squares).into_iter().map(f64::sqrt).collect();
        for (i, r) in replicas.iter_mut().enumerate() {
            if r.active && !loss_values[i].is_finite() {
                r.active = false;
                r.failed = Some(format!(
                    "the loss became {} at step {}; stopping. The last good checkpoint (step {}) is \
                     kept in {}: lower train.lr or set train.grad_clip and resume",
                    loss_values[i],
                    r.state.step,
                    checkpoint::latest_checkpoint_step(&r.run.out)?.unwrap_or(0),
                    checkpoint::checkpoint_root(&r.run.out).display()
                ));
                eprintln!(
                    "{}: {}",
                    r.run.out.display(),
                    r.failed.as_deref().unwrap_or("")
                );
            }
        }
        // Per-replica global-norm clipping, then the step of every active replica (one whose
        // loss just turned non-finite takes none).
        let active: Vec<bool> = replicas.iter().map(|r| r.active).collect();
        let grad_scale: Vec<f64> = replicas
            .iter()
            .zip(&norms)
            .map(|(r, &norm)| match r.run.config.train.grad_clip {
                Some(max) if norm > max && norm.is_finite() => max / (norm + 1e-6),
                _ => 1.0,
            })
            .collect();
        let step = ReplicaStep {
            lr: lrs.clone(),
            grad_scale,
            active: active.clone(),
        };
        packed = optim.step_replicas(packed, grads, &step);

        // 4) Each replica's bookkeeping, as `train` does it: log, evaluate, keep the best,
        //    stop early, checkpoint.
        let mut due_eval = vec![false; n];
        for (i, r) in replicas.iter_mut().enumerate() {
            if !active[i] {
                continue;
            }
            let cfg = &r.run.config;
            r.state.step += 1;
            r.window_steps += 1;
            let s = r.state.step;
            if s % cfg.train.log_every == 0 || s == cfg.train.steps {
                let secs = r.window.elapsed().as_secs_f64().max(1e-9);
                let tps = (b * t) as f64 * r.window_steps as f64 / secs;
                log_metrics(
                    &r.run.out.join("metrics.jsonl"),
                    json!({"step": s, "loss": loss_values[i], "lr": lrs[i], "grad_norm": norms[i], "tokens_per_s": tps}),
                )?;
                r.window = Instant::now();
                r.window_steps = 0;
            }
            due_eval[i] = s % cfg.eval.every == 0 || s == cfg.train.steps;
        }
        if due_eval.iter().any(|&d| d) {
            let valid = packed.valid();
            let eval = evaluate_pack(&valid, &replicas, false, &opts.device)?;
            let test = if cfg0.eval.test_seq_len.is_some() {
                Some(evaluate_pack(&valid, &replicas, true, &opts.device)?)
            } else {
                None
            };
            for (i, r) in replicas.iter_mut().enumerate() {
                if !due_eval[i] {
                    continue;
                }
                let e = eval[i];
                let test = test.as_ref().map(|t| t[i]);
                r.last = (e.acc, e.loss);
                let mut line =
                    json!({"step": r.state.step, "eval_acc": e.acc, "eval_loss": e.loss});
                if let Some(test) = test {
                    line["test_acc"] = json!(test.acc);
                    line["test_loss"] = json!(test.loss);
                }
                log_metrics(&r.run.out.join("metrics.jsonl"), line)?;
                if r.state.best_acc.is_none_or(|best| e.acc > best) {
                    r.state.best_acc = Some(e.acc);
                    r.state.best_step = Some(r.state.step);
                    r.state.best_loss = Some(e.loss);
                    r.state.best_test_acc = test.map(|x| x.acc);
                    r.state.best_batch_mean_loss = Some(e.batch_mean_loss);
                    checkpoint::save_best(&r.run.out, &replica_model(&packed, i), &r.state)?;
                }
                let cfg = &r.run.config;
                if cfg.eval.early_stop_acc.is_some_and(|thr| e.acc >= thr) {
                    r.state.stopped_early = true;
                }
                let since_best =
                    (r.state.step - r.state.best_step.unwrap_or(r.state.step)) / cfg.eval.every;
                if cfg.eval.patience.is_some_and(|p| since_best >= p) {
                    r.state.stopped_early = true;
                }
            }
        }
        for (i, r) in replicas.iter_mut().enumerate() {
            if !active[i] {
                continue;
            }
            let cfg = &r.run.config;
            let s = r.state.step;
            let done = s >= cfg.train.steps || r.state.stopped_early;
            if s % cfg.train.checkpoint_every == 0 || done {
                save_replica_checkpoint(&packed, &optim, i, r)?;
            }
            if done {
                r.active = false;
                let summary = summarise(cfg, &r.run.out, &r.state, params, elapsed())?;
                checkpoint::write_atomic(
                    &r.run.out.join("summary.json"),
                    &serde_json::to_vec_pretty(&summary)?,
                )?;
            }
        }
        let running = replicas.iter().filter(|r| r.active).count();
        let (steps_left, steps) = replicas
            .iter()
            .filter(|r| r.active)
            .map(|r| {
                (
                    r.run.config.train.steps - r.state.step,
                    r.run.config.train.steps,
                )
            })
            .max()
            .unwrap_or((0, 0));
        if should_repack(n, running, steps_left, steps) {
            // Continue the unfinished runs as a pack of their own, from checkpoints of this
            // step (resuming is exact: each step's batch is a function of the seed and step).
            for (i, r) in replicas.iter().enumerate() {
                let latest = checkpoint::latest_checkpoint_step(&r.run.out)?;
                if r.active && latest != Some(r.state.step) {
                    save_replica_checkpoint(&packed, &optim, i, r)?;
                }
            }
            bar.finish_and_clear();
            eprintln!(
                "repacking: {running} of {n} runs still training continue as a pack of {running}"
            );
            repack = true;
            break;
        }
        let best = replicas
            .iter()
            .map(|r| r.last.0)
            .filter(|a| a.is_finite())
            .fold(f64::NAN, f64::max);
        bar.set_message(format!(
            "{running} of {n} training, best acc {}",
            fmt_acc(best)
        ));
        bar.set_position(replicas.iter().map(|r| r.state.step).max().unwrap_or(0) as u64);
    }
    if !repack {
        bar.finish();
    }
    let unfinished: Vec<PackRun> = replicas
        .iter()
        .filter(|r| repack && r.active)
        .map(|r| r.run.clone())
        .collect();
    drop((packed, optim));
    let inner = PackOptions {
        stop_after: opts.stop_after.map(|n| n.saturating_sub(ticks)),
        ..opts.clone()
    };
    let mut continued = if unfinished.is_empty() {
        Vec::new()
    } else {
        train_pack_from(&unfinished, &inner, elapsed())?
    }
    .into_iter();
    replicas
        .into_iter()
        .map(|r| match r.failed {
            Some(e) => Ok(Err(anyhow::anyhow!(e))),
            None if repack && r.active => Ok(continued
                .next()
                .expect("a result for every run of the smaller pack")),
            None => {
                let summary = summarise(&r.run.config, &r.run.out, &r.state, params, elapsed())?;
                checkpoint::write_atomic(
                    &r.run.out.join("summary.json"),
                    &serde_json::to_vec_pretty(&summary)?,
                )?;
                Ok(Ok(summary))
            }
        })
        .collect()
}

/// The run folder as `train --resume` leaves it before its first step: created with its
/// identity, or an existing run of the same config continued (see [`crate::run_dir`]).
fn prepare_folder(cfg: &ExperimentConfig, out: &std::path::Path) -> Result<()> {
    crate::run_dir::open(out, cfg, true, false).map(|_| ())
}

/// Replica `i` as the standalone model its run would have.
fn replica_model(packed: &PackedSyntheticLm, i: usize) -> Model {
    Model::PaperSynthetic(packed.replica(i))
}

/// Writes replica `i`'s checkpoint (its weights, optimiser state and step) into its run folder.
fn save_replica_checkpoint(
    packed: &PackedSyntheticLm,
    optim: &Adam,
    i: usize,
    r: &Replica,
) -> Result<()> {
    checkpoint::save_checkpoint(
        &r.run.out,
        &replica_model(packed, i),
        &optim.replica_state(i),
        &r.state,
    )
}

/// Inputs and targets of training step `step` on the host ([`RunData::train_batch`]).
fn host_train_batch(
    data: &RunData,
    cfg: &ExperimentConfig,
    step: usize,
) -> Result<(Vec<i64>, Vec<i64>)> {
    if let RunData::Lm(_) = data {
        bail!("language-model runs train alone, not in packs");
    }
    let b = data.train_batch(cfg, step)?;
    Ok((b.inputs.iter().map(|&x| i64::from(x)).collect(), b.targets))
}

/// Each replica's mean cross-entropy over its scored positions (`scored[r]` of them): replica
/// `r` of the result is `masked_cross_entropy` of its logits and targets.
///
/// # Shapes
/// `logits: [R, B, T, V]`, `targets: [R, B, T]` → `[R]`.
fn replica_cross_entropy(
    logits: Tensor<4>,
    targets: Tensor<3, Int>,
    scored: &[usize],
) -> Tensor<1> {
    let [r, b, t, v] = logits.dims();
    let device = logits.device();
    let targets = targets.reshape([r * b * t]);
    let mask = targets.clone().not_equal_elem(IGNORE);
    let safe = targets.mask_fill(mask.clone().bool_not(), 0);
    let nll = cross_entropy_rows(logits.reshape([r * b * t, v]), safe); // [R·B·T]
    let dtype = nll.dtype();
    let picked = (nll * mask.float().cast(dtype)).reshape([r, b * t]);
    let counts: Vec<f32> = scored.iter().map(|&c| c.max(1) as f32).collect();
    let counts = Tensor::<1>::from_data(TensorData::new(counts, [r]), &device).cast(dtype);
    picked.sum_dim(1).reshape([r]) / counts
}

/// Held-out metrics of every replica on its own pool (`test`: the test-length pool).
fn evaluate_pack(
    packed: &PackedSyntheticLm,
    replicas: &[Replica],
    test: bool,
    device: &Device,
) -> Result<Vec<EvalMetrics>> {
    let pools: Vec<&[Example]> = replicas
        .iter()
        .map(|r| match &*r.data {
            RunData::Pools { eval, test: t, .. } => Ok(if test {
                t.as_deref()
                    .expect("a test pool where a test length is set")
            } else {
                eval.as_slice()
            }),
            RunData::Lm(_) => bail!("language-model runs train alone, not in packs"),
        })
        .collect::<Result<_>>()?;
    let cfg = &replicas[0].run.config;
    let form = cfg.model.form();
    let examples = pools[0].len();
    if let Some(p) = pools.iter().find(|p| p.len() != examples) {
        bail!(
            "evaluation pools of a pack differ in size ({} and {examples})",
            p.len()
        );
    }
    let n = replicas.len();
    let mut acc: Vec<Accumulator> = (0..n).map(|_| Accumulator::default()).collect();
    let indices: Vec<usize> = (0..examples).collect();
    for chunk in indices.chunks(cfg.eval.batch_size) {
        let batches: Vec<_> = pools.iter().map(|p| batch(p, chunk)).collect();
        let (rows, t) = (batches[0].batch, batches[0].seq_len);
        let inputs: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.inputs.iter().map(|&x| x as i64))
            .collect();
        let target_values: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.targets.iter().copied())
            .collect();
        let scored: Vec<usize> = batches
            .iter()
            .map(|b| b.targets.iter().filter(|&&v| v != IGNORE).count())
            .collect();
        let inputs = Tensor::<3, Int>::from_data(TensorData::new(inputs, [n, rows, t]), device);
        let targets = Tensor::<3, Int>::from_data(
            TensorData::new(target_values.clone(), [n, rows, t]),
            device,
        );
        let logits = packed.run(inputs, form);
        let predictions: Vec<u32> = logits
            .clone()
            .argmax(3)
            .into_data()
            .try_into_vec_as::<i64>()
            .expect("argmax indices")
            .into_iter()
            .map(|p| p as u32)
            .collect();
        let losses: Vec<f64> = replica_cross_entropy(logits, targets, &scored)
            .into_data()
            .convert::<f64>()
            .try_to_vec::<f64>()
            .expect("losses");
        let per = rows * t;
        for i in 0..n {
            let span = i * per..(i + 1) * per;
            let (c, s) = masked_accuracy(&predictions[span.clone()], &target_values[span]);
            debug_assert_eq!(s, scored[i], "accuracy and loss score the same positions");
            acc[i].correct += c;
            acc[i].push(losses[i], s);
        }
    }
    Ok(acc.into_iter().map(Accumulator::finish).collect())
}

/// Device memory one replica of `cfg` takes in a training step (weights, gradients, optimiser
/// state, activations), measured with a pack of two on `device`.
pub fn measure_replica_bytes(cfg: &ExperimentConfig, device: &Device) -> Result<u64> {
    use rand::{Rng, SeedableRng};
    let cfg = cfg.resolved()?;
    let ad = device.clone().autodiff();
    device.sync().ok();
    let before = device.memory_pool_usage().map_or(0, |u| u.bytes_reserved);
    let models: Vec<_> = (0..2)
        .map(|_| match Model::new(&cfg, &ad) {
            Model::PaperSynthetic(m) => Ok(m),
            _ => bail!("only paper_synthetic runs pack"),
        })
        .collect::<Result<_>>()?;
    let params = models[0].num_params() as u64;
    let packed = PackedSyntheticLm::stack(&models);
    let (b, t, v) = (
        cfg.train.batch_size,
        cfg.task.seq_len(),
        cfg.task.vocab_size(),
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let ids: Vec<i64> = (0..2 * b * t)
        .map(|_| rng.random_range(0..v as i64))
        .collect();
    let tokens = Tensor::<3, Int>::from_data(TensorData::new(ids, [2, b, t]), &ad);
    let logits = packed.run(tokens.clone(), cfg.model.form());
    let loss = replica_cross_entropy(logits, tokens, &[b * t, b * t]).sum();
    let grads = loss.backward();
    device.sync().ok();
    let after = device.memory_pool_usage().map_or(0, |u| u.bytes_reserved);
    drop(grads);
    // The step's peak (pages stay reserved) for two replicas, plus each one's Adam moments.
    Ok(after.saturating_sub(before) / 2 + 2 * 4 * params)
}

#[cfg(test)]
mod tests {
    use super::should_repack;

    #[test]
    fn repacks_once_half_has_finished_with_a_quarter_of_the_steps_left() {
        assert!(should_repack(16, 8, 30, 40));
        assert!(should_repack(16, 1, 10, 40));
        assert!(
            !should_repack(16, 9, 30, 40),
            "more than half still training"
        );
        assert!(
            !should_repack(16, 8, 9, 40),
            "less than a quarter of the steps left"
        );
        assert!(!should_repack(16, 0, 0, 0), "nothing left to train");
        assert!(!should_repack(1, 1, 30, 40), "a pack of one");
    }
}
