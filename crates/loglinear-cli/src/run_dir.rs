//! Run folders: what `train --out DIR` may do with DIR, and the identity that ties a run's
//! checkpoints to it.
//!
//! A run folder gets an identity when it is created: `run.json` (a random run id and a
//! fingerprint of the resolved config) beside `config.toml`. Every checkpoint and the best
//! weights carry a copy of it, so `--resume` loads only checkpoints this run wrote.
//!
//! | DIR holds | plain `train` | `--resume` | `--overwrite` |
//! |---|---|---|---|
//! | nothing (or does not exist) | new run | new run, says so | new run |
//! | a run (`run.json`) | refused | continues it if the config is the same | replaces it |
//! | a run from before identities | refused | adopts and continues it | replaces it |
//! | anything else | refused | refused | refused |
//!
//! `--overwrite` first renames the old run aside (one atomic rename in the same parent folder),
//! then deletes it, so a kill at any instant leaves the old run or an empty slot, never a mix.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, write_atomic};
use crate::config::ExperimentConfig;

/// File holding a run folder's identity (also copied into each checkpoint and `best/`).
pub const IDENTITY_FILE: &str = "run.json";

/// Files a sweep writes into a run's folder before the run starts (`loglinear sweep --jobs`):
/// they do not make a folder "hold" anything.
const SWEEP_FILES: [&str; 2] = ["point.toml", "train.log"];

/// What a run folder is: written at creation, copied into every checkpoint it writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunIdentity {
    /// Random id drawn when the folder was created.
    pub run_id: String,
    /// Fingerprint of the resolved config the run was created with ([`fingerprint`]).
    pub config_fingerprint: String,
    /// Set when a run folder from before run identities was adopted by `--resume`: its
    /// unstamped checkpoints are then accepted as its own.
    #[serde(default)]
    pub adopted: bool,
}

impl RunIdentity {
    fn new(config_text: &str, adopted: bool) -> Self {
        Self {
            run_id: format!("{:016x}", rand::random::<u64>()),
            config_fingerprint: fingerprint(config_text),
            adopted,
        }
    }
}

/// Fingerprint of a config's values: a stable 64-bit FNV-1a (std's hasher is not stable across
/// Rust versions) of its sorted `key = value` lines, so that two texts of the same values (key
/// order, formatting) have the same fingerprint.
pub fn fingerprint(config_text: &str) -> String {
    let canonical = match flat(config_text) {
        Ok(map) => map
            .iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect::<String>(),
        Err(_) => config_text.to_string(),
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Reads an identity file.
pub fn read_identity(path: &Path) -> Result<RunIdentity> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a run identity", path.display()))
}

/// The identity of a run folder, if it has one.
pub fn identity_of(run_dir: &Path) -> Result<Option<RunIdentity>> {
    let path = run_dir.join(IDENTITY_FILE);
    if !path.exists() {
        return Ok(None);
    }
    read_identity(&path).map(Some)
}

/// What a folder given as `--out` holds.
#[derive(Debug)]
enum Contents {
    /// Absent, or empty but for the files a sweep writes first.
    Empty,
    /// A run with an identity.
    Run(RunIdentity),
    /// A run written before run identities (config.toml plus metrics or checkpoints).
    LegacyRun,
    /// Something else: these entries.
    Other(Vec<String>),
}

fn contents(dir: &Path) -> Result<Contents> {
    if !dir.exists() {
        return Ok(Contents::Empty);
    }
    if !dir.is_dir() {
        bail!("--out {} is a file, not a folder", dir.display());
    }
    if let Some(id) = identity_of(dir)? {
        return Ok(Contents::Run(id));
    }
    let mut names: Vec<String> = fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    names.retain(|n| !SWEEP_FILES.contains(&n.as_str()));
    names.sort();
    if names.is_empty() {
        return Ok(Contents::Empty);
    }
    let has = |n: &str| names.iter().any(|x| x == n);
    // config.toml alone may be the user's own config, not a run.
    if has("config.toml")
        && ["metrics.jsonl", "checkpoints", "best", "summary.json"]
            .iter()
            .any(|n| has(n))
    {
        return Ok(Contents::LegacyRun);
    }
    Ok(Contents::Other(names))
}

/// One phrase on the state of the run in `dir`, e.g. "an unfinished run (last checkpoint at
/// step 100 of 300)".
fn describe_run(dir: &Path) -> String {
    let steps = fs::read_to_string(dir.join("config.toml"))
        .ok()
        .and_then(|t| toml::from_str::<ExperimentConfig>(&t).ok())
        .map(|c| c.train.steps);
    let of = steps.map_or(String::new(), |s| format!(" of {s}"));
    if dir.join("summary.json").exists() {
        let done = fs::read_to_string(dir.join("summary.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["steps"].as_u64());
        return match done {
            Some(n) => format!("a finished run ({n} steps)"),
            None => "a finished run".into(),
        };
    }
    let last = fs::read_to_string(checkpoint::checkpoint_root(dir).join("latest"))
        .ok()
        .and_then(|name| {
            checkpoint::read_state(
                &checkpoint::checkpoint_root(dir)
                    .join(name.trim())
                    .join("state.json"),
            )
            .ok()
        });
    match last {
        Some(s) => format!("an unfinished run (last checkpoint at step {}{of})", s.step),
        None => "a run with no checkpoint yet".into(),
    }
}

/// A short list of folder entries for messages: `a, b, c and 4 more`.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 4;
    let head = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        format!("{head} and {} more", names.len() - SHOWN)
    } else {
        head
    }
}

/// Prepares `out` for a run of `cfg` (already resolved) and returns the run's identity; called
/// by `train` before it writes anything. See the module doc for what each case does. Nothing
/// in `out` is changed when this returns an error.
pub fn open(
    out: &Path,
    cfg: &ExperimentConfig,
    resume: bool,
    overwrite: bool,
) -> Result<RunIdentity> {
    if resume && overwrite {
        bail!("--resume and --overwrite exclude each other: continue the run or replace it");
    }
    let text = toml::to_string_pretty(cfg).context("cannot serialise the config")?;
    let shown = out.display();
    match contents(out)? {
        Contents::Empty => {
            if resume {
                eprintln!("{shown} holds no run yet: starting from step 0");
            }
            create(out, &text)
        }
        // A creation killed between config.toml and run.json: the same bytes again lose nothing.
        // (Only the same bytes: a config.toml of the same values may be the user's own file.)
        Contents::Other(names)
            if names == ["config.toml"]
                && fs::read_to_string(out.join("config.toml")).is_ok_and(|t| t == text) =>
        {
            create(out, &text)
        }
        Contents::Other(names) => {
            let what = if overwrite {
                "--overwrite replaces only run folders"
            } else {
                "train writes only into a new or empty folder, or a run folder"
            };
            bail!(
                "{shown} is not a run folder and holds {} ({}): {what}; choose another --out",
                names.len(),
                list(&names)
            )
        }
        Contents::Run(_) | Contents::LegacyRun if overwrite => {
            replace(out)?;
            create(out, &text)
        }
        found @ (Contents::Run(_) | Contents::LegacyRun) if !resume => {
            let legacy = if matches!(found, Contents::LegacyRun) {
                " written before run identities"
            } else {
                ""
            };
            bail!(
                "{shown} already holds {}{legacy}: continue it with --resume, or replace it \
                 (checkpoints, best weights and metrics) with --overwrite",
                describe_run(out)
            )
        }
        Contents::Run(id) => {
            let written = check_same_config(out, &text)?;
            // run.json fingerprints config.toml as it was written (by this version or an older
            // one): a mismatch means the file was edited since.
            if id.config_fingerprint != fingerprint(&written) {
                bail!(
                    "{}: config.toml no longer matches the config {shown} was created with (edited by hand?); \
                     replace the run with --overwrite",
                    out.join(IDENTITY_FILE).display()
                );
            }
            announce_resume(out)?;
            Ok(id)
        }
        Contents::LegacyRun => {
            let written = check_same_config(out, &text)?;
            announce_resume(out)?;
            let id = RunIdentity::new(&written, true);
            write_atomic(&out.join(IDENTITY_FILE), &serde_json::to_vec_pretty(&id)?)?;
            eprintln!(
                "{shown} was written before run identities: resuming it as run {}",
                id.run_id
            );
            Ok(id)
        }
    }
}

/// Says where a resume starts; also checks that the latest checkpoint is this run's.
fn announce_resume(out: &Path) -> Result<()> {
    if checkpoint::latest_checkpoint(out)?.is_none() {
        eprintln!(
            "{} has no checkpoint yet: starting from step 0",
            out.display()
        );
    }
    Ok(())
}

/// Creates a fresh run folder: `config.toml`, then `run.json` (a folder with only a config
/// is never taken for a run, so a kill in between leaves nothing that `--resume` would trust).
fn create(out: &Path, config_text: &str) -> Result<RunIdentity> {
    remove_leftovers(out);
    fs::create_dir_all(out)
        .with_context(|| format!("cannot create run directory {}", out.display()))?;
    write_atomic(&out.join("config.toml"), config_text.as_bytes())?;
    let id = RunIdentity::new(config_text, false);
    write_atomic(&out.join(IDENTITY_FILE), &serde_json::to_vec_pretty(&id)?)?;
    Ok(id)
}

/// Name of the folder a replaced run is moved to before it is deleted.
fn aside_prefix(out: &Path) -> Option<(PathBuf, String)> {
    let name = out.file_name()?.to_string_lossy().into_owned();
    let parent = out.parent().map_or(PathBuf::from("."), |p| {
        if p.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            p.to_path_buf()
        }
    });
    Some((parent, format!(".{name}.replaced-")))
}

/// Moves the run in `out` aside with one rename, then deletes it.
fn replace(out: &Path) -> Result<()> {
    let Some((parent, prefix)) = aside_prefix(out) else {
        bail!(
            "--overwrite {}: cannot replace a folder without a name",
            out.display()
        );
    };
    let aside = parent.join(format!("{prefix}{:016x}", rand::random::<u64>()));
    fs::rename(out, &aside).with_context(|| {
        format!(
            "--overwrite: cannot move the old run {} aside to {}",
            out.display(),
            aside.display()
        )
    })?;
    fs::remove_dir_all(&aside).with_context(|| {
        format!(
            "--overwrite: cannot delete the old run in {}",
            aside.display()
        )
    })
}

/// Deletes what a killed `--overwrite` left aside for `out` (best effort: it was being deleted).
fn remove_leftovers(out: &Path) {
    let Some((parent, prefix)) = aside_prefix(out) else {
        return;
    };
    let Ok(entries) = fs::read_dir(&parent) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            fs::remove_dir_all(entry.path()).ok();
        }
    }
}

/// Errors naming the keys whose values differ between the run's `config.toml` and `now`;
/// returns the text of `config.toml`.
fn check_same_config(out: &Path, now: &str) -> Result<String> {
    let path = out.join("config.toml");
    let before = fs::read_to_string(&path)
        .with_context(|| format!("cannot read {} to compare configs", path.display()))?;
    if before == now {
        return Ok(before);
    }
    let diff = config_diff(&normalised(&before), &normalised(now))?;
    if diff.is_empty() {
        // Same values, other text (e.g. an older serialisation): the same config.
        return Ok(before);
    }
    const SHOWN: usize = 6;
    let mut parts: Vec<String> = diff
        .iter()
        .take(SHOWN)
        .map(|(k, (a, b))| format!("{k} ({a} in the run, {b} now)"))
        .collect();
    if diff.len() > SHOWN {
        parts.push(format!("and {} more", diff.len() - SHOWN));
    }
    bail!(
        "{} was trained with a different config: {}; resume with the run's config (see its \
         config.toml), or replace the run with --overwrite",
        out.display(),
        parts.join(", ")
    )
}

/// A run's config text in today's resolved form ([`ExperimentConfig::resolved`]), so that texts
/// compare by the run they describe: one written by an older version states keys its
/// architecture ignores (dropped here) and leaves out values it took by default (written out
/// here). A text that does not read as a config stays as it is.
fn normalised(text: &str) -> String {
    toml::from_str::<ExperimentConfig>(text)
        .ok()
        .and_then(|c| c.resolved().ok())
        .and_then(|c| toml::to_string_pretty(&c).ok())
        .unwrap_or_else(|| text.to_string())
}

/// Dotted key → (value in `a`, value in `b`) for every key whose values differ ("-" = absent).
pub fn config_diff(a: &str, b: &str) -> Result<Vec<(String, (String, String))>> {
    let (a, b) = (flat(a)?, flat(b)?);
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    Ok(keys
        .into_iter()
        .filter_map(|k| {
            let (x, y) = (a.get(k), b.get(k));
            (x != y).then(|| {
                let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "-".into());
                (k.clone(), (show(x), show(y)))
            })
        })
        .collect())
}

/// Dotted key → value (as TOML text) of every leaf of a config.
fn flat(text: &str) -> Result<BTreeMap<String, String>> {
    let table: toml::Table = toml::from_str(text).context("invalid TOML in a run config")?;
    let mut out = BTreeMap::new();
    flatten("", &toml::Value::Table(table), &mut out);
    Ok(out)
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// Copies the run's identity into a checkpoint (or `best/`) folder being written, so that a
/// later load can tell whose it is. A folder without an identity (a library caller that
/// never went through [`open`]) writes unstamped checkpoints.
pub fn stamp(run_dir: &Path, into: &Path) -> Result<()> {
    let src = run_dir.join(IDENTITY_FILE);
    if src.exists() {
        fs::copy(&src, into.join(IDENTITY_FILE))
            .with_context(|| format!("cannot stamp {} with the run identity", into.display()))?;
    }
    Ok(())
}

/// Checks that the checkpoint (or `best/`) folder `dir` was written by the run in `run_dir`.
/// Runs without an identity (written before identities, never resumed since) accept anything.
pub fn check_stamp(run_dir: &Path, dir: &Path) -> Result<()> {
    let Some(run) = identity_of(run_dir)? else {
        return Ok(());
    };
    let path = dir.join(IDENTITY_FILE);
    if !path.exists() {
        if run.adopted {
            return Ok(());
        }
        bail!(
            "{} carries no run identity, so it was not written by the run in {} (run {}): it is \
             not loaded; replace the run with --overwrite",
            dir.display(),
            run_dir.display(),
            run.run_id
        );
    }
    let stamp = read_identity(&path)?;
    if stamp.run_id == run.run_id && stamp.config_fingerprint != run.config_fingerprint {
        bail!(
            "{} was written by this run under another config (run.json was edited?): it is not \
             loaded; replace the run with --overwrite",
            dir.display()
        );
    }
    if stamp.run_id != run.run_id {
        bail!(
            "{} was written by run {}, not by the run in {} (run {}): it is not loaded; replace \
             the run with --overwrite",
            dir.display(),
            stamp.run_id,
            run_dir.display(),
            run.run_id
        );
    }
    Ok(())
}
