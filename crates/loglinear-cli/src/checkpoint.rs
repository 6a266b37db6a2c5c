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
///
/// Errors are one line: a file that is not safetensors, or whose weights are NaN, infinite or
/// absurdly large, is reported as a corrupt checkpoint; weights that do not fit the model name
/// the first tensor that does not fit and the config key that most likely differs.
pub fn load_weights(model: &mut Model, path: &Path) -> Result<()> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    check_values(&bytes).map_err(|why| {
        anyhow!(
            "{} is a corrupt checkpoint: {why}; it cannot be loaded",
            path.display()
        )
    })?;
    // Structured results instead of the store's own errors (a multi-line dump of every tensor).
    let mut store = SafetensorsStore::from_bytes(Some(bytes))
        .validate(false)
        .allow_partial(true);
    let result = model.load_from(&mut store).map_err(|e| {
        anyhow!(
            "{} is a corrupt checkpoint: {}",
            path.display(),
            one_line(&e.to_string())
        )
    })?;
    if let Some(misfit) = misfit(&result) {
        return Err(anyhow!(
            "the weights in {} do not fit the model: {misfit}",
            path.display()
        ));
    }
    Ok(())
}

/// Weights beyond this magnitude are garbage, not training: a run that grows them stops on a
/// non-finite loss long before (and random bytes read as f32 exceed it almost surely).
const GARBAGE_MAGNITUDE: f64 = 1e6;

/// Checks that `bytes` are a safetensors file whose float tensors are finite and of sane size.
fn check_values(bytes: &[u8]) -> std::result::Result<(), String> {
    use safetensors::{Dtype, SafeTensors};
    let file = SafeTensors::deserialize(bytes).map_err(|e| {
        format!(
            "not a readable safetensors file ({})",
            one_line(&e.to_string())
        )
    })?;
    let mut names = file.names();
    names.sort();
    for name in names {
        let view = file.tensor(name).map_err(|e| one_line(&e.to_string()))?;
        let data = view.data();
        let bad = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .find(|v| !v.is_finite() || v.abs() > GARBAGE_MAGNITUDE),
            Dtype::F64 => data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .find(|v| !v.is_finite() || v.abs() > GARBAGE_MAGNITUDE),
            _ => None,
        };
        if let Some(v) = bad {
            return Err(format!("tensor `{name}` holds {v:e}"));
        }
    }
    Ok(())
}

/// Collapses a multi-line message into one line of bounded length.
fn one_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &flat[..i]),
        None => flat,
    }
}

/// What does not fit between a checkpoint and the model, with the config key that most likely
/// differs; `None` when everything was applied.
fn misfit(result: &burn::store::ApplyResult) -> Option<String> {
    use burn::store::ApplyError;
    // Tensors on one side only: (path, whether the model is the side that has it).
    let one_sided: Vec<(&str, bool)> = result
        .missing
        .iter()
        .map(|(p, _)| (p.as_str(), true))
        .chain(result.unused.iter().map(|p| (p.as_str(), false)))
        .collect();
    let say = |path: &str, in_model: bool, key: &str| {
        let (a, b) = if in_model {
            ("the model has", "the checkpoint lacks")
        } else {
            ("the checkpoint has", "the model lacks")
        };
        format!("{a} tensor `{path}`, which {b}; most likely {key} differs")
    };
    // Not one tensor in common: another architecture (the paths start with the model's kind).
    if result.applied.is_empty()
        && let Some(&(path, in_model)) = one_sided.first()
    {
        return Some(say(path, in_model, "model.arch"));
    }
    // Whole layers on one side only, none of them layer 0: the depth differs. (A λ mode change
    // also leaves tensors on one side, but in every layer, layer 0 included.)
    let layer = |p: &str| -> Option<usize> {
        let parts: Vec<&str> = p.split('.').collect();
        parts
            .windows(2)
            .find(|w| w[0] == "blocks" || w[0] == "layers")
            .and_then(|w| w[1].parse().ok())
    };
    if let Some(&(path, in_model)) = one_sided.first()
        && one_sided
            .iter()
            .all(|&(p, side)| side == in_model && layer(p).is_some_and(|l| l > 0))
    {
        return Some(say(path, in_model, "model.n_layers"));
    }
    for (rule, key) in [
        ("lambda", "model.lambda (the λ mode)"),
        ("wdl", "model.lambda (the λ mode)"),
        ("head", "model.tie_embeddings"),
    ] {
        if let Some(&(path, in_model)) = one_sided.iter().find(|(p, _)| p.contains(rule)) {
            return Some(say(path, in_model, key));
        }
    }
    // λ tensors first: their shapes say which λ setting differs, where the projections that
    // feed them only say "some width".
    let mut errors: Vec<&ApplyError> = result.errors.iter().collect();
    errors.sort_by_key(|e| match e {
        ApplyError::ShapeMismatch { path, .. } => !path.contains("lambda"),
        _ => true,
    });
    if let Some(e) = errors.first() {
        return Some(match e {
            ApplyError::ShapeMismatch {
                path,
                expected,
                found,
            } => {
                let (want, got) = (expected.as_slice(), found.as_slice());
                let axis = (want.len() == got.len())
                    .then(|| want.iter().zip(got).position(|(a, b)| a != b))
                    .flatten();
                format!(
                    "tensor `{path}` is {got:?} in the checkpoint but {want:?} in the model; \
                     most likely {} differs",
                    likely_key(path, axis)
                )
            }
            ApplyError::DTypeMismatch {
                path,
                expected,
                found,
            } => format!(
                "tensor `{path}` is {found:?} in the checkpoint but {expected:?} in the model"
            ),
            other => one_line(&other.to_string()),
        });
    }
    one_sided
        .first()
        .map(|&(path, in_model)| say(path, in_model, "model.arch"))
}

/// The config key behind axis `axis` of the parameter at `path` (from the parameter layouts
/// of `loglinear::nn`); widths default to `model.d_model`.
fn likely_key(path: &str, axis: Option<usize>) -> &'static str {
    let p = path.to_ascii_lowercase();
    let last = p.rsplit('.').next().unwrap_or("");
    if p.contains("lambda") {
        // scale [H, L]; MLP w1 [L, hidden], b1 [hidden], w2 [hidden, L], b2 [L].
        return match (last, axis) {
            ("scale", Some(0)) => "model.d_model (or model.head_dim: the heads)",
            ("scale", _) | ("w1", Some(0)) | ("w2", Some(1)) | ("b2", _) => "model.levels",
            ("w1", _) | ("w2", _) | ("b1", _) => "model.mlp_hidden",
            _ => "model.levels",
        };
    }
    if p.contains("position_embedding") {
        return match axis {
            Some(0) => "task.seq_len (or eval.test_seq_len: the positions)",
            _ => "model.d_model",
        };
    }
    if p.contains("embedding") {
        return match axis {
            Some(0) => "task.vocab_size",
            _ => "model.d_model",
        };
    }
    if p.contains("conv_weight") && axis == Some(1) {
        return "model.conv_kernel";
    }
    if p.contains("in_proj") || p.contains("conv") {
        // in_proj and the conv carry x | B | C | dt | dl: every width and the λ levels.
        return "model.d_model (or d_state, expand, head_dim, levels, lambda)";
    }
    "model.d_model"
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
                bail!(
                    "{}: tensor {name} is {:?}, expected F32",
                    path.display(),
                    view.dtype()
                );
            }
            let data =
                TensorData::from_bytes_vec(view.data().to_vec(), view.shape().to_vec(), DType::F32);
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
    crate::run_dir::stamp(run_dir, &tmp)?;
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

/// The step of a run's latest complete checkpoint, if it has one.
pub fn latest_checkpoint_step(run_dir: &Path) -> Result<Option<usize>> {
    Ok(latest_checkpoint(run_dir)?
        .and_then(|d| read_state(&d.join("state.json")).ok())
        .map(|s| s.step))
}

/// The latest complete checkpoint of a run, if any; an error if it was not written by this run
/// (see [`crate::run_dir`]).
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
    crate::run_dir::check_stamp(run_dir, &dir)?;
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
    write_atomic(&dir.join("state.json"), &serde_json::to_vec_pretty(state)?)?;
    crate::run_dir::stamp(run_dir, &dir)
}

/// Loads the model of a finished or running run: the best weights if present, else the latest
/// checkpoint's.
pub fn load_run_model(run_dir: &Path, model: &mut Model) -> Result<PathBuf> {
    let best = run_dir.join("best").join("model.safetensors");
    let path = if best.exists() {
        crate::run_dir::check_stamp(run_dir, &run_dir.join("best"))?;
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
