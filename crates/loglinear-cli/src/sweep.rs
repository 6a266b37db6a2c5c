//! Sweeps: the cartesian product of a config's `[sweep]` table, one run directory each,
//! restartable (finished runs are skipped, interrupted ones resume), then a summary over seeds.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use burn::prelude::Device;

use crate::config::{ConfigFile, ExperimentConfig};
use crate::pack::{PackOptions, PackRun, pack_key};
use crate::report::{self, LineOpts, Series};
use crate::train::{self, RunOptions, RunSummary};

/// Sweep keys that are not grouped on: results are averaged over them.
pub const SEED_KEY: &str = "seed";
/// The key whose values become the plot's series.
pub const LAMBDA_KEY: &str = "model.lambda";

/// One point of a sweep, as recorded in `sweep.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SweepPoint {
    /// Run directory name (inside the sweep directory).
    pub dir: String,
    /// Swept key → value (as text).
    pub values: BTreeMap<String, String>,
}

/// `sweep.json`: the axes and the points, so a summary can be rebuilt later.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SweepIndex {
    /// Swept keys in order.
    pub keys: Vec<String>,
    /// Every run.
    pub points: Vec<SweepPoint>,
}

/// How a sweep runs its points.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// Device name (`cpu`, `cuda[:N]`, `wgpu`), or several separated by commas
    /// (`cuda:0,cuda:1`): then every run or pack is a child process on one of them.
    pub device: String,
    /// Processes at a time per device (each a run or a pack).
    pub jobs: usize,
    /// Runs per pack (1: every run alone); `None`: as many compatible runs as fit in the
    /// device's memory on a GPU, 1 on the CPU.
    pub pack: Option<usize>,
    /// Show progress bars.
    pub progress: bool,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            device: "cpu".into(),
            jobs: 1,
            pack: None,
            progress: true,
        }
    }
}

/// A point still to run: its index, name, folder and config.
type Todo = (usize, String, PathBuf, ExperimentConfig);

/// Runs every point of `file`'s sweep under `out`, skipping finished runs and resuming
/// interrupted ones. Points that differ only in values that leave the tensor shapes alone
/// (seed, learning rate, λ mode of one parameter layout, K, ...) train together as packs
/// ([`crate::pack`]); `jobs > 1`, or several devices, run that many runs or packs at once per
/// device as child processes (each writes its log to its runs' `train.log`; a pack goes to the
/// device with the fewest processes running). Then summarises.
pub fn run_sweep(file: &ConfigFile, out: &Path, opts: &SweepOptions) -> Result<Vec<SummaryRow>> {
    let points = file.expand()?;
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let keys: Vec<String> = file.sweep.iter().map(|(k, _)| k.clone()).collect();
    let mut index = SweepIndex {
        keys: keys.clone(),
        points: Vec::new(),
    };
    for (name, _) in &points {
        index.points.push(SweepPoint {
            dir: name.clone(),
            values: parse_name(name, &keys),
        });
    }
    crate::checkpoint::write_atomic(&out.join("sweep.json"), &serde_json::to_vec_pretty(&index)?)?;
    let total = points.len();
    let mut todo: Vec<Todo> = Vec::new();
    for (i, (name, config)) in points.into_iter().enumerate() {
        let dir = out.join(&name);
        if is_finished(&dir, &config)? {
            eprintln!("[{}/{total}] {name}: finished, skipped", i + 1);
            continue;
        }
        let config = ExperimentConfig {
            name: format!("{}/{}", config.name, name),
            ..config
        };
        todo.push((i, name, dir, config));
    }
    let devices = crate::device::device_list(&opts.device)?;
    // Packs are sized for the first device: a sweep's devices are expected to be alike.
    let device = crate::device::parse_device(&devices[0])?;
    let size = match opts.pack {
        Some(n) => n.max(1),
        None => default_pack_size(&todo, &device)?,
    };
    let packs = group_packs(todo, size);
    let count = packs.len();
    for (k, pack) in packs.iter().enumerate() {
        if pack.len() > 1 {
            let names: Vec<&str> = pack.iter().map(|p| p.1.as_str()).collect();
            eprintln!(
                "pack {}/{count}: {} runs share one process: {}",
                k + 1,
                pack.len(),
                names.join(" | ")
            );
        }
    }
    if let Some(warning) = concurrency_warning(&packs, opts.jobs, is_gpu(&device)) {
        eprintln!("{warning}");
    }
    if opts.jobs <= 1 && devices.len() == 1 {
        let mut failed = Vec::new();
        for pack in packs {
            if pack.len() == 1 {
                let (i, name, dir, config) = pack.into_iter().next().expect("one run");
                eprintln!("[{}/{total}] {name}", i + 1);
                let run = RunOptions {
                    out: dir,
                    device: device.clone(),
                    more_devices: Vec::new(),
                    grad_sync: crate::data_parallel::GradSync::None,
                    resume: true,
                    overwrite: false,
                    progress: opts.progress,
                    stop_after: None,
                };
                train::train(&config, &run).with_context(|| format!("sweep run {name}"))?;
                continue;
            }
            let runs: Vec<PackRun> = pack
                .iter()
                .map(|(_, _, dir, config)| PackRun {
                    config: config.clone(),
                    out: dir.clone(),
                })
                .collect();
            let pack_opts = PackOptions {
                device: device.clone(),
                progress: opts.progress,
                stop_after: None,
            };
            for ((_, name, _, _), result) in
                pack.iter().zip(crate::pack::train_pack(&runs, &pack_opts)?)
            {
                if let Err(e) = result {
                    eprintln!("{name}: FAILED: {e:#}");
                    failed.push(name.clone());
                }
            }
        }
        if !failed.is_empty() {
            anyhow::bail!("{} sweep runs failed: {}", failed.len(), failed.join("; "));
        }
    } else {
        run_children(packs, total, &devices, opts.jobs.max(1))?;
    }
    summarise(out)
}

/// Processes per GPU beyond which unpacked runs lose throughput (see [`concurrency_warning`]).
const GPU_JOBS_WORTH_IT: usize = 5;

/// A warning when `jobs` processes per GPU would each train a single run: a few small runs side
/// by side fill the gaps between each other's kernel launches, many thrash. Measured on an H200
/// (bench/RESULTS.md, session 15) with the D = 256 language-model step (T = 512 × 8): one
/// process 105 k tokens/s, four side by side 365 k together (3.5×), five D = 256 runs of a sweep
/// 4.1× one alone; eight under MPS 191 k, thirteen 180 k, fifteen without MPS 75 k (session
/// 11). Packs are exempt: a pack is one process for many runs.
fn concurrency_warning<T>(packs: &[Vec<T>], jobs: usize, gpu: bool) -> Option<String> {
    let single = packs.iter().filter(|p| p.len() == 1).count();
    (gpu && jobs > GPU_JOBS_WORTH_IT && single > GPU_JOBS_WORTH_IT).then(|| {
        format!(
            "warning: --jobs {jobs} runs up to {jobs} single runs at once on one GPU; on an H200 \
             four to five small language-model runs side by side trained at 3.5-4× the tokens/s \
             of one alone, eight to fifteen at 0.75-1.8× (bench/RESULTS.md, sessions 11 and 15). \
             --jobs {GPU_JOBS_WORTH_IT} or fewer is faster for runs that cannot be packed."
        )
    })
}

/// Groups runs into packs of at most `size`: runs of one [`pack_key`], in sweep order; runs
/// without a key (language models) alone.
fn group_packs(todo: Vec<Todo>, size: usize) -> Vec<Vec<Todo>> {
    let mut groups: Vec<(Option<String>, Vec<Todo>)> = Vec::new();
    for point in todo {
        let key = (size > 1).then(|| pack_key(&point.3)).flatten();
        match groups
            .iter_mut()
            .find(|(k, g)| key.is_some() && *k == key && g.len() < size)
        {
            Some((_, g)) => g.push(point),
            None => groups.push((key, vec![point])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Runs per pack when `--pack` is not given: 1 on the CPU; on a GPU, as many as fit in 60 % of
/// its memory, from the memory one training step of a pack of two takes there.
fn default_pack_size(todo: &[Todo], device: &Device) -> Result<usize> {
    if todo.len() < 2 || !is_gpu(device) {
        return Ok(1);
    }
    let Some(first) = todo.iter().find(|p| pack_key(&p.3).is_some()) else {
        return Ok(1);
    };
    let per_replica = crate::pack::measure_replica_bytes(&first.3, device)?;
    let capacity = memory_capacity(device);
    let size = match capacity {
        Some(cap) => ((0.6 * cap as f64) / per_replica.max(1) as f64).floor() as usize,
        None => 8,
    }
    .clamp(1, 256);
    eprintln!(
        "packing: one replica takes {:.0} MiB in a training step; device memory {}; up to {size} runs per pack \
         (--pack N to choose)",
        per_replica as f64 / (1u64 << 20) as f64,
        capacity.map_or("unknown".to_string(), |c| format!(
            "{:.0} GiB",
            c as f64 / (1u64 << 30) as f64
        ))
    );
    Ok(size)
}

fn is_gpu(device: &Device) -> bool {
    #[cfg(feature = "kernels")]
    {
        loglinear::kernels::is_cube_device(device)
    }
    #[cfg(not(feature = "kernels"))]
    {
        let _ = device;
        false
    }
}

fn memory_capacity(device: &Device) -> Option<u64> {
    #[cfg(feature = "kernels")]
    {
        loglinear::kernels::memory_capacity(device)
    }
    #[cfg(not(feature = "kernels"))]
    {
        let _ = device;
        None
    }
}

/// Runs packs as child processes, `jobs` at a time on each of `devices`: a single run as
/// `loglinear train`, a pack as `loglinear train-pack` over its runs' folders (each run's
/// resolved config in its `point.toml`, the log in its `train.log`). The next pack goes to the
/// device with the fewest processes running (the first such in the list).
fn run_children(
    packs: Vec<Vec<Todo>>,
    total: usize,
    devices: &[String],
    jobs: usize,
) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the loglinear binary to start runs")?;
    let mut queue = packs.into_iter();
    // (label, device index, child)
    let mut running: Vec<(String, usize, std::process::Child)> = Vec::new();
    let mut failed = Vec::new();
    let mut any_stopped = false;
    let mut stopping = false;
    loop {
        // A stop asked for by a signal: no new run starts; the running ones (signalled with
        // their process group) checkpoint and exit, and are waited for.
        if crate::stop::requested() && !stopping {
            stopping = true;
            queue = Vec::new().into_iter();
            eprintln!(
                "stopping: no new run starts; waiting for the {} running",
                running.len()
            );
        }
        loop {
            let load = |d: usize| running.iter().filter(|r| r.1 == d).count();
            let Some(slot) = (0..devices.len())
                .filter(|&d| load(d) < jobs)
                .min_by_key(|&d| load(d))
            else {
                break;
            };
            let Some(pack) = queue.next() else {
                break;
            };
            let device = &devices[slot];
            for (_, _, dir, config) in &pack {
                fs::create_dir_all(dir)?;
                let point = dir.join("point.toml");
                crate::checkpoint::write_atomic(
                    &point,
                    toml::to_string_pretty(config)?.as_bytes(),
                )?;
            }
            let (i, name, dir, _) = &pack[0];
            let log = fs::File::create(dir.join("train.log"))?;
            let mut command = std::process::Command::new(&exe);
            if pack.len() == 1 {
                command
                    .arg("train")
                    .arg(dir.join("point.toml"))
                    .arg("--out")
                    .arg(dir)
                    .arg("--resume");
            } else {
                command.arg("train-pack");
                for (_, _, dir, _) in &pack {
                    command.arg(dir);
                }
            }
            let child = command
                .args(["--device", device.as_str()])
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("cannot start the run {name}"))?;
            let label = if pack.len() == 1 {
                name.clone()
            } else {
                format!("pack of {} from {name}", pack.len())
            };
            eprintln!("[{}/{total}] {label}: started on {device}", i + 1);
            running.push((label, slot, child));
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut still = Vec::new();
        for (name, slot, mut child) in running {
            match child.try_wait()? {
                Some(status) if status.success() => eprintln!("{name}: finished"),
                // Its own stop, not a failure: the checkpoint is written (see train.log).
                Some(status) if status.code() == Some(crate::stop::EXIT_STOPPED) => {
                    eprintln!("{name}: stopped by the signal, with a checkpoint of its last step");
                    any_stopped = true;
                }
                Some(status) => {
                    eprintln!("{name}: FAILED ({status}); see its train.log");
                    failed.push(name);
                }
                None => still.push((name, slot, child)),
            }
        }
        running = still;
    }
    if !failed.is_empty() {
        anyhow::bail!("{} sweep runs failed: {}", failed.len(), failed.join("; "));
    }
    // The sweep's own stop, or runs signalled alone: unfinished either way, so not a success.
    if stopping || any_stopped {
        return Err(crate::stop::Stopped(
            "stopped by a signal: the runs that were running wrote a checkpoint of their last \
             step (see their train.log); the same sweep again continues"
                .into(),
        )
        .into());
    }
    Ok(())
}

/// Whether `dir` holds a finished run of exactly `config` (whose values its `config.toml`
/// states, in today's form or in that of an older version).
pub fn is_finished(dir: &Path, config: &ExperimentConfig) -> Result<bool> {
    let (summary, cfg) = (dir.join("summary.json"), dir.join("config.toml"));
    if !summary.exists() || !cfg.exists() {
        return Ok(false);
    }
    let previous: ExperimentConfig = toml::from_str(&fs::read_to_string(&cfg)?)
        .with_context(|| format!("cannot read {}", cfg.display()))?;
    // Both resolved: a run folder written before the library configs owned the defaults states
    // keys its architecture ignores, which resolving drops. The run name carries the sweep
    // prefix; everything else must match.
    let config = config.resolved()?;
    Ok(ExperimentConfig {
        name: config.name.clone(),
        ..previous.resolved()?
    } == config)
}

fn parse_name(name: &str, keys: &[String]) -> BTreeMap<String, String> {
    // Names are `short=value,short=value` in key order (see ConfigFile::expand).
    keys.iter()
        .zip(name.split(','))
        .map(|(k, part)| {
            let value = part.split_once('=').map_or(part, |(_, v)| v);
            (k.clone(), value.to_string())
        })
        .collect()
}

/// One row of `summary.csv`: a setting (every swept key but the seed) over its seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    /// Swept key → value, without the seed.
    pub setting: BTreeMap<String, String>,
    /// Finished runs.
    pub n: usize,
    /// Mean and sample standard deviation of the best held-out accuracy (fractions).
    pub best: (f64, f64),
    /// Mean and standard deviation of the last held-out accuracy.
    pub last: (f64, f64),
    /// Mean and standard deviation of the test-length accuracy at the best step, if any.
    pub test: Option<(f64, f64)>,
    /// Per-seed best accuracies, in seed order.
    pub per_seed: Vec<f64>,
    /// Per run, in the order of `per_seed` and `curves`: its place within the setting — the
    /// pooled keys' values and the seed (`"32,1"`), or the seed alone. Runs of two settings with
    /// the same label share their seed (and pooled values), hence their training and held-out
    /// data, so their outcomes pair up.
    pub labels: Vec<String>,
    /// Per seed, the held-out accuracy at each evaluation `(step, accuracy)` (empty for
    /// language models).
    pub curves: Vec<Vec<(usize, f64)>>,
    /// Runs included from their metrics although they never finished (no `summary.json`: cut
    /// short by a time budget or killed), with the last step each reached.
    pub cut_short: Vec<usize>,
    /// Language-model runs: every figure is a validation perplexity instead of an accuracy
    /// (`best` = lowest token-weighted perplexity, `last` = at the last evaluation, `test` = the
    /// published batch-mean definition at the best step).
    pub lm: bool,
}

/// Mean and sample standard deviation (0 for a single value).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, var.sqrt())
}

/// Reads every finished run of a sweep directory and writes `summary.md`, `summary.csv` and
/// the plots (accuracy vs the swept variable, one series per λ mode), with the default
/// [`SummaryOptions`].
pub fn summarise(sweep_dir: &Path) -> Result<Vec<SummaryRow>> {
    summarise_with(sweep_dir, &SummaryOptions::default())
}

/// [`summarise`] with the comparison settings of `options`. Runs that never finished but logged
/// evaluations (cut short by a time budget) are included from their metrics and marked as such.
pub fn summarise_with(sweep_dir: &Path, options: &SummaryOptions) -> Result<Vec<SummaryRow>> {
    let index = read_index(sweep_dir)?;
    for key in &options.pool {
        if !index.keys.contains(key) || key == SEED_KEY || *key == options.compare {
            anyhow::bail!(
                "--pool {key}: expected a swept key other than `{SEED_KEY}` and the compared \
                 `{}`; this sweep's keys: {}",
                options.compare,
                index.keys.join(", ")
            );
        }
    }
    // Runs that differ only in the seed — and in the pooled keys — are one setting.
    let pooled = |k: &str| k == SEED_KEY || options.pool.iter().any(|p| p == k);
    let mut groups: BTreeMap<Setting, Vec<(String, RunInfo)>> = BTreeMap::new();
    for point in &index.points {
        let run_dir = sweep_dir.join(&point.dir);
        let path = run_dir.join("summary.json");
        let curve = match train::run_metrics_path(&run_dir) {
            Some(metrics) => eval_curve(&metrics)?,
            None => Vec::new(),
        };
        let info = match fs::read(&path) {
            Ok(bytes) => RunInfo {
                summary: serde_json::from_slice(&bytes)
                    .with_context(|| format!("{} is not a run summary", path.display()))?,
                curve,
                cut_short: false,
            },
            Err(_) => match partial_summary(&curve) {
                Some(summary) => RunInfo {
                    summary,
                    curve,
                    cut_short: true,
                },
                None => continue,
            },
        };
        let info = match options.at_step {
            None => info,
            Some(_) if info.summary.best_ppl.is_some() => anyhow::bail!(
                "--at-step reads the held-out accuracies of a run's evaluations; {} is a \
                 language model (its evaluations log perplexities)",
                run_dir.display()
            ),
            // Finished by then: as it is.
            Some(step) if !info.cut_short && info.summary.steps <= step => info,
            // Still training at `step` (or cut short before it): its evaluations up to there.
            Some(step) => {
                let curve: Vec<(usize, f64)> =
                    info.curve.into_iter().filter(|e| e.0 <= step).collect();
                match partial_summary(&curve) {
                    Some(summary) => RunInfo {
                        summary,
                        curve,
                        cut_short: true,
                    },
                    None => continue,
                }
            }
        };
        let setting: Vec<(String, String)> = point
            .values
            .iter()
            .filter(|(k, _)| !pooled(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // The run's place within its setting: the pooled keys' values, then the seed.
        let label: Vec<&str> = options
            .pool
            .iter()
            .chain(std::iter::once(&SEED_KEY.to_string()))
            .filter_map(|k| point.values.get(k).map(String::as_str))
            .collect();
        groups
            .entry(setting)
            .or_default()
            .push((label.join(","), info));
    }
    // Settings in natural order (K = 4, 8, 16, not 16, 4, 8).
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| {
        let key = |g: &Vec<(String, String)>| g.iter().map(|(_, v)| natural(v)).collect::<Vec<_>>();
        key(&a.0).cmp(&key(&b.0))
    });
    let rows: Vec<SummaryRow> = groups
        .into_iter()
        .map(|(setting, mut runs)| {
            runs.sort_by_key(|r| natural(&r.0));
            let lm = runs.iter().any(|(_, r)| r.summary.best_ppl.is_some());
            let pick = |f: &dyn Fn(&RunSummary) -> Option<f64>| -> Vec<f64> {
                runs.iter().filter_map(|(_, r)| f(&r.summary)).collect()
            };
            let (best, last, test) = if lm {
                (
                    pick(&|s| s.best_ppl),
                    pick(&|s| Some(s.last_loss.exp())),
                    pick(&|s| s.best_ppl_batch_mean),
                )
            } else {
                (
                    pick(&|s| Some(s.best_acc)),
                    pick(&|s| Some(s.last_acc)),
                    pick(&|s| s.best_test_acc),
                )
            };
            SummaryRow {
                setting: setting.into_iter().collect(),
                n: runs.len(),
                best: mean_std(&best),
                last: mean_std(&last),
                test: (!test.is_empty()).then(|| mean_std(&test)),
                per_seed: best,
                labels: runs.iter().map(|(label, _)| label.clone()).collect(),
                curves: if lm {
                    Vec::new()
                } else {
                    runs.iter().map(|(_, r)| r.curve.clone()).collect()
                },
                cut_short: runs
                    .iter()
                    .filter(|(_, r)| r.cut_short)
                    .map(|(_, r)| r.summary.steps)
                    .collect(),
                lm,
            }
        })
        .collect();
    let keys: Vec<String> = index.keys.iter().filter(|k| !pooled(k)).cloned().collect();
    let mut markdown = summary_markdown(&rows, &keys, &index);
    if let Some(step) = options.at_step {
        // A view as of one step, beside the sweep's own summary, which it leaves alone.
        markdown = markdown.replacen(
            "# Sweep summary\n\n",
            &format!(
                "# Sweep summary as of step {step}\n\nEvery run read as of step {step}: only \
                 its evaluations at steps ≤ {step} count (`summarize --at-step {step}`); a run \
                 still training then is marked as cut short at its last evaluation by then.\n\n"
            ),
            1,
        );
    }
    if !options.pool.is_empty() {
        let over = options.pool.join(", ");
        markdown = markdown.replacen(
            "over seeds (n = seeds finished)",
            &format!("over seeds and the values of {over}, pooled (n = runs finished)"),
            1,
        );
    }
    if !options.pool.is_empty() || options.at_step.is_some() {
        // A pooled view, or one as of a step, is written beside the sweep's own summary, which
        // it leaves alone.
        markdown.push_str(&crate::compare::comparisons(&rows, options));
        fs::write(sweep_dir.join(summary_file_name(options)), markdown)?;
        return Ok(rows);
    }
    fs::write(sweep_dir.join("summary.csv"), summary_csv(&rows, &keys))?;
    markdown.push_str(&crate::compare::comparisons(&rows, options));
    fs::write(sweep_dir.join("summary.md"), markdown)?;
    plot_summary(sweep_dir, &rows, &keys)?;
    plot_all_curves(sweep_dir, &index)?;
    Ok(rows)
}

/// The file a summary pooled over `keys` is written to: `summary_pooled_<keys>.md`.
pub fn pooled_summary_name(keys: &[String]) -> String {
    format!("summary_pooled_{}.md", keys.join("+"))
}

/// The file `summarize` writes its markdown to with `options`: `summary.md`, or beside it
/// `summary_pooled_<keys>.md` (with `--pool`) and `summary[_pooled_<keys>]_at_step_<N>.md` (with
/// `--at-step`), which leave `summary.md` alone.
pub fn summary_file_name(options: &SummaryOptions) -> String {
    let base = if options.pool.is_empty() {
        "summary".to_string()
    } else {
        pooled_summary_name(&options.pool)
            .trim_end_matches(".md")
            .to_string()
    };
    match options.at_step {
        Some(step) => format!("{base}_at_step_{step}.md"),
        None => format!("{base}.md"),
    }
}

/// How `summarize` compares the values of one swept key (by default the λ modes).
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryOptions {
    /// Best held-out accuracy at or above which a run counts as having solved the task.
    pub solved_at: f64,
    /// Steps at which to count the runs that had solved the task by then (from the metrics).
    pub by_steps: Vec<usize>,
    /// The swept key whose values are compared.
    pub compare: String,
    /// The value the others are compared against (if the sweep has it; else the first value).
    pub baseline: String,
    /// Swept keys whose values are pooled like seeds (e.g. `task.num_kv_pairs`: one comparison
    /// over all K); the result goes to [`pooled_summary_name`], not `summary.md`.
    pub pool: Vec<String>,
    /// Read every run as of this step: only its evaluations at steps ≤ N count, so runs that
    /// stopped at different steps (cut short by a budget) are compared at the same training
    /// length; the result goes to [`summary_file_name`], not `summary.md`.
    pub at_step: Option<usize>,
}

impl Default for SummaryOptions {
    fn default() -> Self {
        Self {
            solved_at: 0.5,
            by_steps: Vec::new(),
            compare: LAMBDA_KEY.into(),
            baseline: "linear".into(),
            pool: Vec::new(),
            at_step: None,
        }
    }
}

/// Swept key → value pairs of a setting (the seed left out), in key order.
type Setting = Vec<(String, String)>;

/// A run as the summary reads it.
struct RunInfo {
    summary: RunSummary,
    /// `(step, held-out accuracy)` of every evaluation.
    curve: Vec<(usize, f64)>,
    /// No `summary.json`: included from its metrics.
    cut_short: bool,
}

/// Every evaluation's `(step, accuracy)` in a run's `metrics.jsonl` (none for language models,
/// whose evaluations log perplexities).
fn eval_curve(metrics: &Path) -> Result<Vec<(usize, f64)>> {
    Ok(train::read_metrics(metrics)?
        .iter()
        .filter_map(|m| {
            Some((
                m.get("step")?.as_u64()? as usize,
                m.get("eval_acc")?.as_f64()?,
            ))
        })
        .collect())
}

/// The summary of a run that never finished, from its evaluations so far: best and last
/// held-out accuracy, the step it reached. `None` without any evaluation.
fn partial_summary(curve: &[(usize, f64)]) -> Option<RunSummary> {
    let &(last_step, last_acc) = curve.last()?;
    let &(best_step, best_acc) = curve
        .iter()
        .fold(&curve[0], |best, e| if e.1 > best.1 { e } else { best });
    Some(RunSummary {
        steps: last_step,
        best_acc,
        best_step,
        last_acc,
        last_loss: f64::NAN,
        best_loss: f64::NAN,
        ..RunSummary::default()
    })
}

/// The sweep's `sweep.json`; a single run folder (from `loglinear train`) is a sweep of one
/// point, itself.
fn read_index(dir: &Path) -> Result<SweepIndex> {
    let index_path = dir.join("sweep.json");
    if !index_path.exists() && dir.join("config.toml").exists() {
        if !dir.join("summary.json").exists() {
            anyhow::bail!(
                "{} is a run folder whose run has not finished (no summary.json): nothing to summarise yet",
                dir.display()
            );
        }
        return Ok(SweepIndex {
            keys: Vec::new(),
            points: vec![SweepPoint {
                dir: ".".into(),
                values: BTreeMap::new(),
            }],
        });
    }
    if !index_path.exists() {
        anyhow::bail!(
            "{} is neither a sweep folder (no sweep.json) nor a run folder (no config.toml)",
            dir.display()
        );
    }
    serde_json::from_slice(
        &fs::read(&index_path).with_context(|| format!("cannot read {}", index_path.display()))?,
    )
    .with_context(|| format!("{} is not a sweep index", index_path.display()))
}

/// Sort key that puts numbers in numeric order and before words.
fn natural(s: &str) -> (u64, String) {
    (s.parse::<u64>().unwrap_or(u64::MAX), s.to_string())
}

fn pct(x: (f64, f64)) -> String {
    format!("{:.1} ± {:.1}", 100.0 * x.0, 100.0 * x.1)
}

/// A figure of a row as shown: accuracies in %, perplexities as they are.
fn shown(lm: bool, x: (f64, f64)) -> String {
    if lm {
        format!("{:.1} ± {:.1}", x.0, x.1)
    } else {
        pct(x)
    }
}

fn summary_csv(rows: &[SummaryRow], keys: &[String]) -> String {
    let mut s = keys.join(",");
    if rows.iter().any(|r| r.lm) {
        s.push_str(",n,best_ppl_mean,best_ppl_std,last_ppl_mean,last_ppl_std,batch_mean_ppl_mean,batch_mean_ppl_std,best_ppl_per_seed\n");
    } else {
        s.push_str(",n,best_acc_mean,best_acc_std,last_acc_mean,last_acc_std,test_acc_mean,test_acc_std,best_acc_per_seed\n");
    }
    for r in rows {
        let cells: Vec<String> = keys
            .iter()
            .map(|k| r.setting.get(k).cloned().unwrap_or_default())
            .collect();
        let (tm, ts) = r.test.map_or((String::new(), String::new()), |t| {
            (format!("{:.6}", t.0), format!("{:.6}", t.1))
        });
        let seeds: Vec<String> = r.per_seed.iter().map(|v| format!("{v:.6}")).collect();
        s.push_str(&format!(
            "{},{},{:.6},{:.6},{:.6},{:.6},{},{},{}\n",
            cells.join(","),
            r.n,
            r.best.0,
            r.best.1,
            r.last.0,
            r.last.1,
            tm,
            ts,
            seeds.join(" ")
        ));
    }
    s
}

fn summary_markdown(rows: &[SummaryRow], keys: &[String], index: &SweepIndex) -> String {
    let lm = rows.iter().any(|r| r.lm);
    let has_test = rows.iter().any(|r| r.test.is_some());
    let mut s = String::from("# Sweep summary\n\n");
    let what = if lm {
        "validation perplexity (token-weighted, lower is better); best = lowest during training, \
         last = at the final evaluation, batch-mean = the published definition exp(mean of batch-mean \
         NLL) at the best step"
    } else {
        "held-out accuracy in %; best = best during training, last = at the final evaluation"
    };
    s.push_str(&format!(
        "{} runs over {} settings; mean ± sample std over seeds (n = seeds finished); {what}.\n\n",
        rows.iter().map(|r| r.n).sum::<usize>(),
        rows.len()
    ));
    let missing = index.points.len() - rows.iter().map(|r| r.n).sum::<usize>();
    if missing > 0 {
        s.push_str(&format!(
            "**{missing} runs have not finished (and logged no evaluation) and are not included.**\n\n"
        ));
    }
    let cut: usize = rows.iter().map(|r| r.cut_short.len()).sum();
    if cut > 0 {
        s.push_str(&format!(
            "**{cut} runs never finished (cut short by a time budget or killed): they are included \
             with their evaluations so far and marked in the n column with the step they reached.**\n\n"
        ));
    }
    let mut header: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    if header.is_empty() {
        header.push("setting".into());
    }
    let test_name = if lm {
        "batch-mean"
    } else {
        "test length (at best)"
    };
    header.extend(["n".into(), "best".into(), "last".into()]);
    if has_test {
        header.push(test_name.into());
    }
    header.push("per-seed best".into());
    s.push_str(&format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        "---|".repeat(header.len())
    ));
    for r in rows {
        let mut cells: Vec<String> = keys
            .iter()
            .map(|k| r.setting.get(k).cloned().unwrap_or_default())
            .collect();
        if cells.is_empty() {
            cells.push("all".into());
        }
        let n = if r.cut_short.is_empty() {
            r.n.to_string()
        } else {
            let steps: Vec<String> = r.cut_short.iter().map(|s| s.to_string()).collect();
            format!(
                "{} ({} cut short, at step {})",
                r.n,
                r.cut_short.len(),
                steps.join(", ")
            )
        };
        cells.extend([n, shown(lm, r.best), shown(lm, r.last)]);
        if has_test {
            cells.push(r.test.map_or("–".into(), |t| shown(lm, t)));
        }
        let seeds: Vec<String> = r
            .per_seed
            .iter()
            .map(|v| {
                if lm {
                    format!("{v:.1}")
                } else {
                    format!("{:.1}", 100.0 * v)
                }
            })
            .collect();
        cells.push(seeds.join(", "));
        s.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    s
}

/// One plot per combination of the keys that are neither the λ mode nor the x variable:
/// x = the last swept key other than the λ mode (numeric if possible), one series per λ mode.
fn plot_summary(dir: &Path, rows: &[SummaryRow], keys: &[String]) -> Result<Vec<PathBuf>> {
    let lm = rows.iter().any(|r| r.lm);
    // Accuracies are plotted in %, perplexities as they are.
    let scale = if lm { 1.0 } else { 100.0 };
    let (metric, y_label, y_range) = if lm {
        ("validation perplexity", "perplexity", None)
    } else {
        ("held-out accuracy", "accuracy (%)", Some((0.0, 100.0)))
    };
    let Some(x_key) = keys
        .iter()
        .rev()
        .find(|k| k.as_str() != LAMBDA_KEY)
        .cloned()
    else {
        return plot_modes_only(dir, rows);
    };
    let numeric = rows.iter().all(|r| {
        r.setting
            .get(&x_key)
            .is_some_and(|v| v.parse::<f64>().is_ok())
    });
    // facet → series (λ mode) → points (x, mean, std, category).
    type Points = Vec<(f64, f64, f64, String)>;
    let mut facets: BTreeMap<Setting, BTreeMap<String, Points>> = BTreeMap::new();
    let mut categories: Vec<String> = Vec::new();
    for r in rows {
        let facet: Vec<(String, String)> = r
            .setting
            .iter()
            .filter(|(k, _)| **k != x_key && k.as_str() != LAMBDA_KEY)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mode = r
            .setting
            .get(LAMBDA_KEY)
            .cloned()
            .unwrap_or_else(|| "run".into());
        let xv = r.setting.get(&x_key).cloned().unwrap_or_default();
        if !categories.contains(&xv) {
            categories.push(xv.clone());
        }
        let x = if numeric {
            xv.parse::<f64>().unwrap_or(0.0)
        } else {
            0.0
        };
        facets
            .entry(facet)
            .or_default()
            .entry(mode)
            .or_default()
            .push((x, r.best.0, r.best.1, xv));
    }
    let mut paths = Vec::new();
    for (facet, modes) in facets {
        let label: Vec<String> = facet
            .iter()
            .map(|(k, v)| format!("{}={v}", k.rsplit('.').next().unwrap_or(k)))
            .collect();
        let stem = if label.is_empty() {
            "accuracy".to_string()
        } else {
            format!("accuracy_{}", label.join("_"))
        };
        let series: Vec<Series> = modes
            .into_iter()
            .map(|(mode, mut pts)| {
                if !numeric {
                    for p in &mut pts {
                        p.0 = categories.iter().position(|c| *c == p.3).unwrap_or(0) as f64;
                    }
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: mode,
                    points: pts.iter().map(|p| (p.0, scale * p.1)).collect(),
                    err: Some(pts.iter().map(|p| scale * p.2).collect()),
                }
            })
            .collect();
        let title = if label.is_empty() {
            format!("Best {metric} (mean ± std over seeds)")
        } else {
            format!(
                "Best {metric}, {} (mean ± std over seeds)",
                label.join(", ")
            )
        };
        let log_x = numeric && {
            let xs: Vec<f64> = series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0))
                .collect();
            let (lo, hi) = xs
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            lo > 0.0 && hi / lo >= 8.0
        };
        let x_label = if numeric {
            x_key.clone()
        } else {
            format!("{x_key} ({})", categories.join(", "))
        };
        paths.extend(report::line_plot(
            dir,
            &stem,
            &title,
            &x_label,
            y_label,
            &series,
            &LineOpts {
                log_x,
                log_y: false,
                y_range,
            },
        )?);
    }
    Ok(paths)
}

fn plot_modes_only(dir: &Path, rows: &[SummaryRow]) -> Result<Vec<PathBuf>> {
    let lm = rows.iter().any(|r| r.lm);
    let scale = if lm { 1.0 } else { 100.0 };
    let categories: Vec<String> = rows
        .iter()
        .map(|r| {
            let v: Vec<String> = r.setting.values().cloned().collect();
            if v.is_empty() {
                "all".into()
            } else {
                v.join(",")
            }
        })
        .collect();
    let (name, title, y) = if lm {
        (
            "best perplexity",
            "Best validation perplexity (mean ± std over seeds)",
            "perplexity",
        )
    } else {
        (
            "best accuracy",
            "Best held-out accuracy (mean ± std over seeds)",
            "accuracy (%)",
        )
    };
    let groups = vec![(
        name.to_string(),
        rows.iter().map(|r| scale * r.best.0).collect(),
        Some(rows.iter().map(|r| scale * r.best.1).collect()),
    )];
    report::bar_chart(dir, "accuracy", title, "setting", y, &categories, &groups)
}

/// Held-out accuracy (or perplexity for language models) against the step, one line per run.
/// Beyond ten runs (the palette's colours), where settings have several seeds, the runs of one
/// setting (the same values but the seed) share a colour and one legend entry, `setting (n
/// runs)`: thirty runs named one by one would fill the plot with their legend.
fn plot_all_curves(dir: &Path, index: &SweepIndex) -> Result<Vec<PathBuf>> {
    let mut series = Vec::new();
    let mut lm = false;
    for point in &index.points {
        let Some(Ok(metrics)) =
            train::run_metrics_path(&dir.join(&point.dir)).map(|p| train::read_metrics(&p))
        else {
            continue;
        };
        lm |= metrics.iter().any(|m| m.get("eval_ppl").is_some());
        let key = if lm { "eval_ppl" } else { "eval_acc" };
        let scale = if lm { 1.0 } else { 100.0 };
        let points: Vec<(f64, f64)> = metrics
            .iter()
            .filter_map(|m| Some((m["step"].as_f64()?, m[key].as_f64()? * scale)))
            .collect();
        if !points.is_empty() {
            series.push(Series {
                name: point.dir.clone(),
                points,
                err: None,
            });
        }
    }
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let settings: Vec<String> = series.iter().map(|s| setting_label(&s.name)).collect();
    let seeds_repeat = settings
        .iter()
        .any(|a| settings.iter().filter(|b| *b == a).count() > 1);
    if series.len() > 10 && seeds_repeat {
        for (s, setting) in series.iter_mut().zip(&settings) {
            let n = settings.iter().filter(|x| *x == setting).count();
            let runs = if n == 1 { "run" } else { "runs" };
            s.name = match setting.is_empty() {
                true => format!("{n} {runs}"),
                false => format!("{setting} ({n} {runs})"),
            };
        }
    }
    let (title, y, opts) = if lm {
        (
            "Validation perplexity of every run",
            "perplexity",
            LineOpts {
                log_y: true,
                ..LineOpts::default()
            },
        )
    } else {
        (
            "Held-out accuracy of every run",
            "accuracy (%)",
            LineOpts {
                y_range: Some((0.0, 100.0)),
                ..LineOpts::default()
            },
        )
    };
    report::line_plot(dir, "curves", title, "step", y, &series, &opts)
}

/// A run's folder name (`lambda=linear,seq_len=256,seed=3`) without its seed: the setting.
fn setting_label(run: &str) -> String {
    let seed = format!("{SEED_KEY}=");
    let parts: Vec<&str> = run.split(',').filter(|p| !p.starts_with(&seed)).collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::{concurrency_warning, setting_label};

    #[test]
    fn a_runs_setting_is_its_name_without_the_seed() {
        assert_eq!(
            setting_label("lambda=linear,seq_len=256,seed=3"),
            "lambda=linear,seq_len=256"
        );
        assert_eq!(setting_label("seed=0,lr=0.001"), "lr=0.001");
        assert_eq!(setting_label("seed=4"), "");
        assert_eq!(setting_label("lambda=ones"), "lambda=ones");
    }

    #[test]
    fn warns_only_for_many_single_runs_at_once_on_a_gpu() {
        let singles: Vec<Vec<u8>> = vec![vec![0]; 12];
        let packs: Vec<Vec<u8>> = vec![vec![0; 10]; 12];
        let warning = concurrency_warning(&singles, 12, true).expect("12 single runs on a GPU");
        assert!(warning.contains("--jobs 12"), "{warning}");
        assert!(
            concurrency_warning(&singles, 5, true).is_none(),
            "five at a time"
        );
        assert!(concurrency_warning(&singles, 6, true).is_some(), "six");
        assert!(
            concurrency_warning(&singles, 12, false).is_none(),
            "the CPU"
        );
        assert!(concurrency_warning(&packs, 12, true).is_none(), "packs");
        assert!(
            concurrency_warning(&singles[..5], 12, true).is_none(),
            "five runs"
        );
    }
}
