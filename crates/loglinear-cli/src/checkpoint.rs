//! Checkpoints: model weights (safetensors), optimiser state, step and best-so-far, written
//! atomically so that a run killed at any instant resumes from its last complete checkpoint.
//!
//! Layout of a run directory:
//! ```text
//! checkpoints/ckpt-00000500/{model.safetensors, optimizer.safetensors, state.json}
//! checkpoints/latest            name of the newest complete checkpoint
//! best/{model.safetensors, state.json}
//! ```
//! A checkpoint is first written into a temporary folder, renamed into place, and only then
//! named in `latest` (itself replaced by rename); older checkpoints are deleted afterwards.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::{DType, TensorData};
use serde::{Deserialize, Serialize};

use crate::model::Model;
use crate::optim::Adam;

/// Training progress stored beside the weights.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimiser steps completed.
    pub step: usize,
    /// Best held-out accuracy so far (fraction), if evaluated.
    pub best_acc: Option<f64>,
    /// Step of the best accuracy.
    pub best_step: Option<usize>,
    /// Best held-out loss so far.
    pub best_loss: Option<f64>,
    /// Accuracy at the test length at the best step, if any.
    pub best_test_acc: Option<f64>,
    /// Batch-mean held-out loss at the best step (the published LM metric).
    #[serde(default)]
    pub best_batch_mean_loss: Option<f64>,
    /// Whether early stopping ended the run.
    pub stopped_early: bool,
}

/// Writes `bytes` to `path` atomically (temporary file in the same folder, then rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("cannot move {} into place", path.display()))
}

/// Saves the weights of `model` as safetensors.
pub fn save_weights(model: &Model, path: &Path) -> Result<()> {
    let mut store = SafetensorsStore::from_file(path).overwrite(true);
    model
        .save_into(&mut store)
        .map_err(|e| anyhow!("cannot save weights to {}: {e}", path.display()))
}

/// Loads weights saved by [`save_weights`] into `model` (which must have the same config).
pub fn load_weights(model: &mut Model, path: &Path) -> Result<()> {
    let mut store = SafetensorsStore::from_file(path);
    let result = model
        .load_from(&mut store)
        .map_err(|e| anyhow!("cannot load weights from {}: {e}", path.display()))?;
    if !result.missing.is_empty() || !result.errors.is_empty() {
        return Err(anyhow!(
            "weights in {} do not fit the model: missing {:?}, errors {:?}",
            path.display(),
            result.missing,
            result.errors
        ));
    }
    Ok(())
}

/// Root of the checkpoints of a run.
pub fn checkpoint_root(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Writes f32 tensors as a safetensors file.
pub fn save_tensors(path: &Path, tensors: &[(String, TensorData)]) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, data)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                data.shape().to_vec(),
                data.as_bytes(),
            )
            .map_err(|e| anyhow!("tensor {name}: {e}"))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::tensor::serialize(views, &None)
        .map_err(|e| anyhow!("cannot serialise {}: {e}", path.display()))?;
    write_atomic(path, &bytes)
}

/// Reads the f32 tensors of a safetensors file written by [`save_tensors`].
pub fn load_tensors(path: &Path) -> Result<HashMap<String, TensorData>> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow!("{} is not a safetensors file: {e}", path.display()))?;
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            if view.dtype() != safetensors::Dtype::F32 {
                bail!("{}: tensor {name} is {:?}, expected F32", path.display(), view.dtype());
            }
            let data = TensorData::from_bytes_vec(view.data().to_vec(), view.shape().to_vec(), DType::F32);
            Ok((name, data))
        })
        .collect()
}

/// Loads the optimiser state of checkpoint `dir` into replica `replica` of `optim` (with the
/// checkpoint's step as its step count): the map of [`Adam::replica_state`].
pub fn read_optimizer_state(dir: &Path) -> Result<HashMap<String, TensorData>> {
    let path = dir.join("optimizer.safetensors");
    if !path.exists() && dir.join("optimizer.bpk").exists() {
        bail!(
            "{} was written by an older loglinear (Burn's optimizer.bpk); it cannot be resumed: \
             start the run afresh in a new folder",
            dir.display()
        );
    }
    load_tensors(&path)
}

/// Writes a complete resumable checkpoint and makes it the latest: the weights, the optimiser
/// state of the run (`optim_state`, as [`Adam::replica_state`] gives it) and `state`.
pub fn save_checkpoint(
    run_dir: &Path,
    model: &Model,
    optim_state: &[(String, TensorData)],
    state: &TrainState,
) -> Result<()> {
    let root = checkpoint_root(run_dir);
    fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let name = format!("ckpt-{:08}", state.step);
    let tmp = root.join(format!(".{name}.tmp"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).ok();
    }
    fs::create_dir_all(&tmp)?;
    save_weights(model, &tmp.join("model.safetensors"))?;
    save_tensors(&tmp.join("optimizer.safetensors"), optim_state)?;
    fs::write(tmp.join("state.json"), serde_json::to_vec_pretty(state)?)?;
    let dest = root.join(&name);
    if dest.exists() {
        fs::remove_dir_all(&dest)?;
    }
    fs::rename(&tmp, &dest)
        .with_context(|| format!("cannot move {} into place", dest.display()))?;
    write_atomic(&root.join("latest"), name.as_bytes())?;
    // Only now that `latest` names the new one may older checkpoints go.
    for entry in fs::read_dir(&root)?.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        if file.starts_with("ckpt-") && file != name.as_str() {
            fs::remove_dir_all(entry.path()).ok();
        }
    }
    Ok(())
}

/// The latest complete checkpoint of a run, if any.
pub fn latest_checkpoint(run_dir: &Path) -> Result<Option<PathBuf>> {
    let root = checkpoint_root(run_dir);
    let latest = root.join("latest");
    if !latest.exists() {
        return Ok(None);
    }
    let name =
        fs::read_to_string(&latest).with_context(|| format!("cannot read {}", latest.display()))?;
    let dir = root.join(name.trim());
    if !dir.join("state.json").exists() {
        return Err(anyhow!(
            "{} names {}, which is incomplete or missing",
            latest.display(),
            dir.display()
        ));
    }
    Ok(Some(dir))
}

/// Loads a checkpoint into a freshly built model and optimiser (one run) of the same config.
pub fn load_checkpoint(dir: &Path, model: &mut Model, optim: &mut Adam) -> Result<TrainState> {
    load_weights(model, &dir.join("model.safetensors"))?;
    let moments = read_optimizer_state(dir)?;
    let state = read_state(&dir.join("state.json"))?;
    let device = burn::module::Module::devices(model)
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("the model has no parameters"))?;
    optim.load_state(&[Some(moments)], &device);
    optim.set_time(0, state.step);
    Ok(state)
}

/// Reads a `state.json`.
pub fn read_state(path: &Path) -> Result<TrainState> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a training state", path.display()))
}

/// Saves the weights of the best model so far.
pub fn save_best(run_dir: &Path, model: &Model, state: &TrainState) -> Result<()> {
    let dir = run_dir.join("best");
    fs::create_dir_all(&dir)?;
    let tmp = dir.join(".model.safetensors.tmp");
    save_weights(model, &tmp)?;
    fs::rename(&tmp, dir.join("model.safetensors"))?;
    write_atomic(&dir.join("state.json"), &serde_json::to_vec_pretty(state)?)
}

/// Loads the model of a finished or running run: the best weights if present, else the latest
/// checkpoint's.
pub fn load_run_model(run_dir: &Path, model: &mut Model) -> Result<PathBuf> {
    let best = run_dir.join("best").join("model.safetensors");
    let path = if best.exists() {
        best
    } else {
        latest_checkpoint(run_dir)?
            .map(|d| d.join("model.safetensors"))
            .ok_or_else(|| anyhow!("{} has no checkpoint yet", run_dir.display()))?
    };
    load_weights(model, &path)?;
    Ok(path)
}

/// Device-independent reproducible batch order: the batch of `step` depends only on the seed and
/// the step, so a resumed run draws exactly the batches an uninterrupted one would.
pub fn step_rng(seed: u64, step: usize) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    let mix = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((step as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    rand::rngs::StdRng::seed_from_u64(mix)
}
