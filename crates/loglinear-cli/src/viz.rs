//! What λ learned: a tidy CSV of λ on a fixed batch, heat-maps per layer and head, histograms,
//! the mean λ per level, and the training curves of the run.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use burn::tensor::TensorData;
use loglinear::fenwick;

use crate::checkpoint;
use crate::config::{Arch, ConfigFile, ExperimentConfig};
use crate::data::LmData;
use crate::model::Model;
use crate::report::{self, LineOpts, Series, Shade};
use crate::tasks::TaskConfig;
use crate::train::{batch_tensors, read_metrics};

/// λ of one run on a fixed batch.
#[derive(Clone, Debug)]
pub struct LambdaTrace {
    /// The run's config.
    pub config: ExperimentConfig,
    /// Per layer, `[B, T, H, L]` row-major.
    pub layers: Vec<Vec<f64>>,
    /// `[B, T, H, L]`.
    pub dims: [usize; 4],
}

impl LambdaTrace {
    /// λ at (layer, sample, position, head, level).
    pub fn at(&self, layer: usize, b: usize, t: usize, h: usize, l: usize) -> f64 {
        let [_, tt, hh, ll] = self.dims;
        self.layers[layer][((b * tt + t) * hh + h) * ll + l]
    }
}

/// Whether query `t` reads level `l` at all (bucket non-empty).
pub fn occupied(t: usize, l: usize) -> bool {
    !fenwick::bucket(t, l).is_empty()
}

/// Loads a run's best model and traces λ on the first `samples` held-out sequences (language
/// models: the first windows of the evaluation split of the prepared corpus).
pub fn trace_run(run_dir: &Path, samples: usize, device: &Device) -> Result<LambdaTrace> {
    if samples == 0 {
        bail!("--samples must be at least 1, got 0");
    }
    let file = ConfigFile::load(&run_dir.join("config.toml"), &[])
        .with_context(|| format!("{} is not a run directory", run_dir.display()))?;
    let config = file.config()?;
    if config.model.arch == Arch::Transformer {
        bail!(
            "{} is a softmax Transformer run: it has no λ to plot",
            run_dir.display()
        );
    }
    let mut model = Model::new(&config, device);
    checkpoint::load_run_model(run_dir, &mut model)?;
    let inputs = match &config.task {
        TaskConfig::Lm(lm) => {
            let data = LmData::open(&lm.data)?;
            let (rows, x, _) = data.window_batch(&lm.eval_split, 0, samples, lm.seq_len)?;
            if rows == 0 {
                bail!(
                    "{}: the {} split has no window",
                    lm.data.display(),
                    lm.eval_split
                );
            }
            let x: Vec<i64> = x.into_iter().map(i64::from).collect();
            Tensor::<2, Int>::from_data(TensorData::new(x, vec![rows, lm.seq_len]), device)
        }
        task => {
            let pool = task.generate(samples, config.seed.wrapping_add(config.eval.seed_offset))?;
            let indices: Vec<usize> = (0..pool.len()).collect();
            batch_tensors(&pool, &indices, device).0
        }
    };
    let out = model.forward(inputs, config.model.form(), true);
    let dims = out
        .lambda
        .first()
        .map(|l| l.dims())
        .context("the model has no layers")?;
    let layers = out.lambda.iter().map(loglinear::host::to_f64).collect();
    Ok(LambdaTrace {
        config,
        layers,
        dims,
    })
}

/// Writes the tidy CSV `sample,layer,head,position,level,occupied,lambda`.
pub fn write_csv(trace: &LambdaTrace, path: &Path) -> Result<()> {
    let [b, t, h, l] = trace.dims;
    let mut s = String::from("sample,layer,head,position,level,occupied,lambda\n");
    for layer in 0..trace.layers.len() {
        for bi in 0..b {
            for ti in 0..t {
                for hi in 0..h {
                    for li in 0..l {
                        let _ = writeln!(
                            s,
                            "{bi},{layer},{hi},{ti},{li},{},{:.6}",
                            occupied(ti, li) as u8,
                            trace.at(layer, bi, ti, hi, li)
                        );
                    }
                }
            }
        }
    }
    fs::write(path, s).with_context(|| format!("cannot write {}", path.display()))
}

fn shades(config: &ExperimentConfig) -> Vec<Shade> {
    const COLORS: [(u8, u8, u8); 4] = [
        (46, 160, 67),
        (214, 39, 40),
        (31, 119, 180),
        (148, 103, 189),
    ];
    config
        .task
        .regions()
        .into_iter()
        .enumerate()
        .map(|(i, r)| Shade {
            label: r.name,
            range: r.range,
            color: COLORS[i % COLORS.len()],
        })
        .collect()
}

/// Heat-maps (sample 0, every layer and head), histogram, mean λ per level, and the curves;
/// returns every file written.
/// λ per layer and Fenwick level over the values the queries read (occupied levels; every
/// sample and head): `(layer, level, mean, quantiles)`, levels that no query reads left out.
pub fn level_stats(trace: &LambdaTrace) -> Vec<(usize, usize, f64, report::Spread)> {
    let [b, t, h, l] = trace.dims;
    let mut rows = Vec::new();
    for layer in 0..trace.layers.len() {
        for li in 0..l {
            let vals: Vec<f64> = (0..b)
                .flat_map(|bi| (0..t).map(move |ti| (bi, ti)))
                .filter(|&(_, ti)| occupied(ti, li))
                .flat_map(|(bi, ti)| (0..h).map(move |hi| trace.at(layer, bi, ti, hi, li)))
                .collect();
            if let Some(spread) = report::Spread::of(&vals) {
                let mean = vals.iter().sum::<f64>() / vals.len() as f64;
                rows.push((layer, li, mean, spread));
            }
        }
    }
    rows
}

/// Writes [`level_stats`] as `lambda_per_level.csv`
/// (`layer,level,n,mean,q10,q25,median,q75,q90`): the λ statistics of a trained model in a few
/// hundred bytes, where `lambda.csv` holds every value.
pub fn write_level_stats(trace: &LambdaTrace, path: &Path) -> Result<()> {
    let mut s = String::from("layer,level,n,mean,q10,q25,median,q75,q90\n");
    for (layer, level, mean, q) in level_stats(trace) {
        let _ = writeln!(
            s,
            "{layer},{level},{},{mean:.6},{:.6},{:.6},{:.6},{:.6},{:.6}",
            q.n, q.q10, q.q25, q.median, q.q75, q.q90
        );
    }
    fs::write(path, s).with_context(|| format!("cannot write {}", path.display()))
}

/// Only [`write_level_stats`] for one run (`viz --stats-only`): `OUT/lambda_per_level.csv`.
pub fn level_stats_run(
    run_dir: &Path,
    out: &Path,
    samples: usize,
    device: &Device,
) -> Result<PathBuf> {
    let trace = trace_run(run_dir, samples, device)?;
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("lambda_per_level.csv");
    write_level_stats(&trace, &path)?;
    Ok(path)
}

pub fn visualise_run(
    run_dir: &Path,
    out: &Path,
    samples: usize,
    device: &Device,
) -> Result<Vec<PathBuf>> {
    // Trace first: a run that cannot be traced leaves no empty output folder behind.
    let trace = trace_run(run_dir, samples, device)?;
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut written = Vec::new();
    let csv = out.join("lambda.csv");
    write_csv(&trace, &csv)?;
    written.push(csv);
    let stats = out.join("lambda_per_level.csv");
    write_level_stats(&trace, &stats)?;
    written.push(stats);
    let [b, t, h, l] = trace.dims;
    let mode = trace.config.model.lambda();
    let task = trace.config.task.name();
    for layer in 0..trace.layers.len() {
        for head in 0..h {
            // Rows = levels (0 at the bottom), columns = positions; a level whose bucket is
            // empty for that query is never read, so it stays NaN (grey).
            let mut data = vec![f64::NAN; l * t];
            for li in 0..l {
                for ti in (0..t).filter(|&ti| occupied(ti, li)) {
                    data[li * t + ti] = trace.at(layer, 0, ti, head, li);
                }
            }
            written.extend(report::heatmap(
                out,
                &format!("lambda_layer{layer}_head{head}"),
                &format!("λ ({mode}), layer {layer}, head {head}, one held-out sequence: {task}"),
                "token position",
                "Fenwick level",
                "λ",
                &data,
                l,
                t,
                &shades(&trace.config),
            )?);
        }
    }
    // Values a query actually reads (its bucket is non-empty), all layers, heads and samples.
    let used: Vec<f64> = (0..trace.layers.len())
        .flat_map(|layer| {
            let trace = &trace;
            (0..b).flat_map(move |bi| {
                (0..t).flat_map(move |ti| {
                    (0..h).flat_map(move |hi| {
                        (0..l)
                            .filter(move |&li| occupied(ti, li))
                            .map(move |li| trace.at(layer, bi, ti, hi, li))
                    })
                })
            })
        })
        .collect();
    written.extend(report::histogram(
        out,
        "lambda_histogram",
        &format!("λ values read by the queries ({mode}, {b} sequences, all layers and heads)"),
        "λ",
        &[(mode.to_string(), used)],
        40,
    )?);
    let categories: Vec<String> = (0..l).map(|li| li.to_string()).collect();
    // λ ≥ 0, and its spread over queries is skewed: quantiles, not mean ± std (which dips below 0)
    let groups: Vec<report::SpreadGroup> = (0..trace.layers.len())
        .map(|layer| {
            let spreads = (0..l)
                .map(|li| {
                    let vals: Vec<f64> = (0..b)
                        .flat_map(|bi| {
                            (0..t)
                                .filter(move |&ti| occupied(ti, li))
                                .map(move |ti| (bi, ti))
                        })
                        .flat_map(|(bi, ti)| (0..h).map(move |hi| (bi, ti, hi)))
                        .map(|(bi, ti, hi)| trace.at(layer, bi, ti, hi, li))
                        .collect();
                    report::Spread::of(&vals)
                })
                .collect();
            (format!("layer {layer}"), spreads)
        })
        .collect();
    written.extend(report::spread_chart(
        out,
        "lambda_per_level",
        &format!(
            "λ per Fenwick level ({mode}; queries that read the level: median, 25–75 %, 10–90 %)"
        ),
        "Fenwick level",
        "λ",
        &categories,
        &groups,
    )?);
    written.extend(plot_curves(run_dir, out)?);
    Ok(written)
}

/// Training loss and held-out accuracy against the step, from `metrics.jsonl`.
pub fn plot_curves(run_dir: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    let path = crate::train::run_metrics_path(run_dir)
        .with_context(|| format!("no metrics.jsonl(.gz) in {}", run_dir.display()))?;
    let metrics = read_metrics(&path)?;
    let series = |key: &str, scale: f64| -> Vec<(f64, f64)> {
        metrics
            .iter()
            .filter_map(|m| Some((m["step"].as_f64()?, m[key].as_f64()? * scale)))
            .collect()
    };
    let mut written = report::line_plot(
        out,
        "curve_loss",
        "Training loss",
        "step",
        "cross-entropy (nats)",
        &[Series {
            name: "train loss".into(),
            points: series("loss", 1.0),
            err: None,
        }],
        &LineOpts::default(),
    )?;
    let ppl = series("eval_ppl", 1.0);
    if !ppl.is_empty() {
        // Language models: validation perplexity (log scale), not next-token accuracy.
        written.extend(report::line_plot(
            out,
            "curve_perplexity",
            "Validation perplexity during training",
            "step",
            "perplexity (token-weighted)",
            &[Series {
                name: "validation perplexity".into(),
                points: ppl,
                err: None,
            }],
            &LineOpts {
                log_y: true,
                ..LineOpts::default()
            },
        )?);
        return Ok(written);
    }
    let mut acc = vec![Series {
        name: "held-out accuracy".into(),
        points: series("eval_acc", 100.0),
        err: None,
    }];
    let test = series("test_acc", 100.0);
    if !test.is_empty() {
        acc.push(Series {
            name: "test-length accuracy".into(),
            points: test,
            err: None,
        });
    }
    written.extend(report::line_plot(
        out,
        "curve_accuracy",
        "Held-out accuracy during training",
        "step",
        "accuracy (%)",
        &acc,
        &LineOpts {
            y_range: Some((0.0, 100.0)),
            ..LineOpts::default()
        },
    )?);
    Ok(written)
}

/// Histogram and mean λ per level of several runs side by side (e.g. one per λ mode).
pub fn compare_runs(
    runs: &[PathBuf],
    out: &Path,
    samples: usize,
    device: &Device,
) -> Result<Vec<PathBuf>> {
    let traces = runs
        .iter()
        .map(|r| trace_run(r, samples, device))
        .collect::<Result<Vec<_>>>()?;
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let label = |tr: &LambdaTrace, r: &Path| {
        format!(
            "{} ({})",
            tr.config.model.lambda(),
            r.file_name().and_then(|n| n.to_str()).unwrap_or("")
        )
    };
    let mut series = Vec::new();
    let mut groups = Vec::new();
    let max_l = traces.iter().map(|tr| tr.dims[3]).max().unwrap_or(0);
    for (tr, r) in traces.iter().zip(runs) {
        let [b, t, h, l] = tr.dims;
        let mut all = Vec::new();
        let mut per_level = vec![Vec::new(); max_l];
        for layer in 0..tr.layers.len() {
            for bi in 0..b {
                for ti in 0..t {
                    for hi in 0..h {
                        for li in (0..l).filter(|&li| occupied(ti, li)) {
                            let v = tr.at(layer, bi, ti, hi, li);
                            all.push(v);
                            per_level[li].push(v);
                        }
                    }
                }
            }
        }
        series.push((label(tr, r), all));
        let spreads = per_level.iter().map(|v| report::Spread::of(v)).collect();
        groups.push((label(tr, r), spreads));
    }
    let mut written = report::histogram(
        out,
        "lambda_histogram_by_run",
        "λ values read by the queries, per run",
        "λ",
        &series,
        40,
    )?;
    let categories: Vec<String> = (0..max_l).map(|l| l.to_string()).collect();
    written.extend(report::spread_chart(
        out,
        "lambda_per_level_by_run",
        "λ per Fenwick level, per run (median, 25–75 %, 10–90 %)",
        "Fenwick level",
        "λ",
        &categories,
        &groups,
    )?);
    Ok(written)
}
