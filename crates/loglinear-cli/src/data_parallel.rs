//! Data-parallel training: one replica of the model per device, each taking its slice of the
//! global batch, gradients summed across the devices before the optimiser step.
//!
//! Every replica starts from the same weights (forks of the first), receives the same summed
//! gradient and takes the same AdamW step with its own optimiser, so the replicas stay identical
//! without broadcasting weights; [`Replicas::check_identical`] verifies it (the training loop
//! calls it after the first step and at every checkpoint). The loss of replica `i` is
//! `Σ_{its rows} NLL / N` with `N` the scored positions of the *global* batch, so the summed
//! gradient is exactly the gradient of the single-device loss `Σ NLL / N`, even where the
//! replicas score different numbers of positions (MQAR masks most of them).
//!
//! How the gradients are summed ([`GradSync`]):
//! - **collective** (CUDA): Burn's distributed machinery. Each parameter is marked distributed
//!   (`Tensor::set_distributed`) before the forward; during the backward, as soon as every
//!   device has produced a parameter's gradient, Burn launches its all-reduce (NCCL, through
//!   cubecl-cuda), so communication overlaps the rest of the backward, and the backward returns
//!   once every reduction is done. Each replica runs on its own thread (a device's backward
//!   waits for the others' gradients).
//! - **host** (every other device, the CPU above all: Burn's CPU backend has no collectives):
//!   after the backward, each gradient is summed on the first device and copied back. It exists
//!   so that the data-parallel logic — batch split, loss scaling, clipping, identical updates,
//!   checkpoints and resume with another number of devices — is tested on the CPU; it is not a
//!   way to train fast.
//!
//! Clipping uses the global norm of the summed gradient computed once, on the first replica, and
//! applies the same factor on every replica (per-device reductions could round differently).

use std::ops::Range;

use anyhow::{Result, bail};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;

use crate::checkpoint::{self, TrainState};
use crate::model::{Model, masked_mean_cross_entropy, masked_sum_cross_entropy};
use crate::optim::Adam;
use crate::tasks::{Batch, IGNORE};
use crate::train::{global_grad_norm, param_ids, rows_to_tensors, scale_grads};

/// How the replicas' gradients are summed (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradSync {
    /// One device: nothing to sum.
    None,
    /// Burn's collective all-reduce (NCCL on CUDA), overlapped with the backward.
    Collective,
    /// Summed on the first device after the backward, and copied back (tests, CPU).
    Host,
}

impl GradSync {
    /// The way gradients are summed over `devices` (as `--device` names them): collective on
    /// CUDA, which then needs NCCL (checked here, before any training, so that a run without it
    /// stops with the reason rather than in the first backward); host elsewhere.
    pub fn for_devices(names: &[String]) -> Result<Self> {
        if names.len() < 2 {
            return Ok(GradSync::None);
        }
        let kind = |n: &str| n.split(':').next().unwrap_or(n).to_string();
        let first = kind(&names[0]);
        if let Some(other) = names.iter().find(|n| kind(n) != first) {
            bail!(
                "--device {}: a data-parallel run takes devices of one kind, but {other:?} is not \
                 a {first} device",
                names.join(",")
            );
        }
        if first == "cuda" {
            crate::device::require_nccl()?;
            return Ok(GradSync::Collective);
        }
        Ok(GradSync::Host)
    }
}

/// The replicas of one run, one per device (module docs).
pub struct Replicas {
    /// The autodiff devices; the first holds the primary replica (evaluation, checkpoints).
    devices: Vec<Device>,
    /// One model per device, identical weights.
    models: Vec<Model>,
    /// One optimiser per replica, identical state.
    optims: Vec<Adam>,
    sync: GradSync,
    /// Keeps Burn's gradient-sync server alive while the replicas train (collective only).
    _context: Option<burn::tensor::distributed::DistributedContext>,
}

/// What one training step reports.
pub struct StepReport {
    /// The loss of the global batch (mean NLL over its scored positions).
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
}

impl Replicas {
    /// `model` (on `devices[0]`) and `optim` become the primary replica; every other device gets
    /// a fork of the model and a copy of the optimiser's state.
    pub fn new(model: Model, optim: Adam, devices: Vec<Device>, sync: GradSync) -> Self {
        assert!(!devices.is_empty(), "Replicas::new: no device");
        assert_eq!(
            sync == GradSync::None,
            devices.len() == 1,
            "Replicas::new: {} devices with gradient sync {sync:?}",
            devices.len()
        );
        let mut models = vec![model];
        let mut optims = vec![optim];
        for device in &devices[1..] {
            models.push(models[0].clone().fork(device));
            optims.push(optims[0].fork(device));
        }
        let context = (sync == GradSync::Collective).then(|| {
            burn::tensor::distributed::DistributedContext::init(
                devices.clone(),
                burn::tensor::distributed::DistributedConfig {
                    all_reduce_op: burn::tensor::distributed::ReduceOperation::Sum,
                },
            )
        });
        Self {
            devices,
            models,
            optims,
            sync,
            _context: context,
        }
    }

    /// The number of replicas.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Whether there are no replicas (never: [`Replicas::new`] takes at least one device).
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// The primary replica (on the first device).
    pub fn primary(&self) -> &Model {
        &self.models[0]
    }

    /// Writes a resumable checkpoint of the run (the primary replica's weights and optimiser
    /// state: a run resumes from it on any number of devices).
    pub fn save_checkpoint(&self, run_dir: &std::path::Path, state: &TrainState) -> Result<()> {
        checkpoint::save_checkpoint(
            run_dir,
            &self.models[0],
            &self.optims[0].replica_state(0),
            state,
        )
    }

    /// The rows of `batch` that replica `i` of `n` takes: as even as the batch allows, the
    /// first `B mod n` replicas one row more.
    pub fn rows(batch: usize, n: usize, i: usize) -> Range<usize> {
        let (base, extra) = (batch / n, batch % n);
        let start = i * base + i.min(extra);
        start..start + base + usize::from(i < extra)
    }

    /// One training step on the global `batch`: forward and backward on every replica, the
    /// gradients summed, clipped to `grad_clip` by their global norm, and one optimiser step
    /// with learning rate `lr` on every replica. Errors if the batch has fewer rows than there
    /// are replicas.
    pub fn step(
        &mut self,
        batch: &Batch,
        lr: f64,
        grad_clip: Option<f64>,
        form: loglinear::Form,
    ) -> Result<StepReport> {
        let n = self.len();
        if batch.batch < n {
            bail!(
                "a data-parallel step over {n} devices needs at least one row per device, but \
                 the batch has {} (train.batch_size)",
                batch.batch
            );
        }
        let (losses, mut grads) = if n == 1 {
            let (inputs, targets) = rows_on(batch, 0..batch.batch, &self.devices[0]);
            let logits = self.models[0].forward(inputs, form, false).logits;
            let loss = masked_mean_cross_entropy(logits, targets);
            // The backward is queued before the loss is read (a read first would leave the GPU
            // idle while the host queues it).
            let grads = GradientsParams::from_grads(loss.clone().backward(), &self.models[0]);
            (vec![loss], vec![grads])
        } else {
            self.replica_backwards(batch, form)
        };
        if self.sync == GradSync::Host {
            sum_on_first(&self.models[0], &mut grads, &self.devices);
        }
        let mut loss = 0.0;
        for l in losses {
            loss += l.into_scalar::<f64>();
        }
        let grad_norm = global_grad_norm(&self.models[0], &grads[0]);
        if let Some(max) = grad_clip
            && grad_norm > max
            && grad_norm.is_finite()
        {
            let factor = max / (grad_norm + 1e-6);
            for (model, g) in self.models.iter().zip(&mut grads) {
                scale_grads(model, g, factor);
            }
        }
        if loss.is_finite() {
            let models = std::mem::take(&mut self.models);
            self.models = models
                .into_iter()
                .zip(grads)
                .zip(&mut self.optims)
                .map(|((model, g), optim)| optim.step(lr, model, g))
                .collect();
        }
        Ok(StepReport { loss, grad_norm })
    }

    /// Forward and backward of every replica on its rows, each on its own thread; the losses
    /// are the replicas' shares of the global loss (`Σ NLL / N` over their rows).
    fn replica_backwards(
        &mut self,
        batch: &Batch,
        form: loglinear::Form,
    ) -> (Vec<Tensor<1>>, Vec<GradientsParams>) {
        let n = self.len();
        let scored = batch
            .targets
            .iter()
            .filter(|&&t| t != IGNORE)
            .count()
            .max(1);
        if self.sync == GradSync::Collective {
            let models = std::mem::take(&mut self.models);
            self.models = models
                .into_iter()
                .map(|m| m.map(&mut MarkDistributed))
                .collect();
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .models
                .iter()
                .zip(&self.devices)
                .enumerate()
                .map(|(i, (model, device))| {
                    let (inputs, targets) = rows_on(batch, Self::rows(batch.batch, n, i), device);
                    s.spawn(move || {
                        let logits = model.forward(inputs, form, false).logits;
                        let loss = masked_sum_cross_entropy(logits, targets) / scored as f32;
                        let grads = GradientsParams::from_grads(loss.clone().backward(), model);
                        (loss, grads)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a replica's forward or backward panicked"))
                .unzip()
        })
    }

    /// Errors unless every replica's weights equal the primary's bit for bit (they take the same
    /// steps from the same start, so any difference is a bug or a device that computes
    /// differently; training on would average models that are not one).
    pub fn check_identical(&self) -> Result<()> {
        if self.len() == 1 {
            return Ok(());
        }
        let primary = weights(&self.models[0]);
        for (i, model) in self.models.iter().enumerate().skip(1) {
            for ((path, want), (_, got)) in primary.iter().zip(weights(model)) {
                if want != &got {
                    let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
                    bail!(
                        "data-parallel replicas diverged: {path} of replica {i} differs from the \
                         first replica's in {differ} of {} values",
                        want.len()
                    );
                }
            }
        }
        Ok(())
    }
}

/// Rows `rows` of `batch` as `[rows, T]` input and target tensors on `device`.
fn rows_on(batch: &Batch, rows: Range<usize>, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let t = batch.seq_len;
    let span = rows.start * t..rows.end * t;
    let (inputs, targets) = (
        batch.inputs[span.clone()].to_vec(),
        batch.targets[span].to_vec(),
    );
    rows_to_tensors(inputs, targets, rows.len(), t, device)
}

/// Marks every trainable parameter distributed, so that Burn all-reduces its gradient during
/// the backward (the marks live on the autodiff leaves, which each optimiser step replaces, so
/// they are set again before every forward).
struct MarkDistributed;

impl ModuleMapper for MarkDistributed {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = if tensor.is_require_grad() {
            tensor.set_distributed(id)
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Replaces every replica's gradient by the sum over the replicas: added up on the first device,
/// then copied to each.
fn sum_on_first(model: &Model, grads: &mut [GradientsParams], devices: &[Device]) {
    fn sum<const D: usize>(id: ParamId, grads: &mut [GradientsParams], devices: &[Device]) {
        let parts: Vec<Tensor<D>> = grads.iter_mut().filter_map(|g| g.remove::<D>(id)).collect();
        if parts.is_empty() {
            return;
        }
        assert_eq!(
            parts.len(),
            grads.len(),
            "data parallel: parameter {id} has a gradient on {} of {} replicas",
            parts.len(),
            grads.len()
        );
        let total = parts
            .into_iter()
            .map(|p| p.to_device(&devices[0]))
            .reduce(|a, b| a + b)
            .expect("at least one part");
        for (g, device) in grads.iter_mut().zip(devices) {
            g.register(id, total.clone().to_device(device));
        }
    }
    for (id, rank) in param_ids(model) {
        match rank {
            1 => sum::<1>(id, grads, devices),
            2 => sum::<2>(id, grads, devices),
            3 => sum::<3>(id, grads, devices),
            4 => sum::<4>(id, grads, devices),
            r => panic!("data parallel: a parameter of rank {r}"),
        }
    }
}

/// Every float parameter of `model` as `(path, values as bits)`, in visiting order.
fn weights(model: &Model) -> Vec<(String, Vec<u32>)> {
    struct All {
        path: Vec<String>,
        out: Vec<(String, Vec<u32>)>,
    }
    impl ModuleVisitor for All {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = param.val().into_data().convert::<f32>();
            let bits = values
                .try_to_vec::<f32>()
                .expect("f32 weights")
                .into_iter()
                .map(f32::to_bits)
                .collect();
            self.out.push((self.path.join("."), bits));
        }
    }
    let mut all = All {
        path: Vec::new(),
        out: Vec::new(),
    };
    model.visit(&mut all);
    all.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_the_batch_evenly_and_completely() {
        for batch in 1..20 {
            for n in 1..=batch.min(8) {
                let parts: Vec<_> = (0..n).map(|i| Replicas::rows(batch, n, i)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[n - 1].end, batch);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let sizes: Vec<_> = parts.iter().map(|r| r.len()).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "batch {batch} over {n}: {sizes:?}");
            }
        }
    }

    #[test]
    fn devices_of_mixed_kinds_are_refused() {
        let names = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            GradSync::for_devices(&names("cpu")).unwrap(),
            GradSync::None
        );
        assert_eq!(
            GradSync::for_devices(&names("cpu,cpu")).unwrap(),
            GradSync::Host
        );
        let err = GradSync::for_devices(&names("cpu,cuda:0"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("devices of one kind"), "{err}");
    }
}
