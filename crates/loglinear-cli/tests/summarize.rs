//! `loglinear summarize` on sweep folders written here by hand: the solved counts with their
//! exact intervals, the by-step counts from the metrics, the comparisons against the baseline
//! (Fisher's exact test, bootstrap interval), and runs cut short marked rather than dropped.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use loglinear_cli::sweep::{SummaryOptions, SweepIndex, SweepPoint, summarise_with};
use loglinear_cli::train::RunSummary;

/// Writes one run folder: its evaluations `(step, accuracy)` to `metrics.jsonl` and, if
/// `finished`, a `summary.json` that agrees with them.
fn write_run(dir: &Path, evals: &[(usize, f64)], finished: bool) {
    fs::create_dir_all(dir).unwrap();
    let lines: Vec<String> = evals
        .iter()
        .map(|(s, a)| format!("{{\"eval_acc\":{a},\"eval_loss\":1.0,\"step\":{s}}}"))
        .collect();
    fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
    if finished {
        let (best_step, best_acc) = evals
            .iter()
            .copied()
            .fold((0, f64::MIN), |b, e| if e.1 > b.1 { e } else { b });
        let summary = RunSummary {
            name: "run".into(),
            steps: evals.last().unwrap().0,
            best_acc,
            best_step,
            last_acc: evals.last().unwrap().1,
            ..RunSummary::default()
        };
        fs::write(
            dir.join("summary.json"),
            serde_json::to_vec(&summary).unwrap(),
        )
        .unwrap();
    }
}

/// A run that stays at chance, or one that leaves the plateau at `at` and reaches `best`.
fn curve(at: Option<usize>, best: f64, last_step: usize) -> Vec<(usize, f64)> {
    (1..=last_step / 1000)
        .map(|i| {
            let step = i * 1000;
            let acc = match at {
                Some(a) if step >= a => best,
                _ => 0.016,
            };
            (step, acc)
        })
        .collect()
}

#[test]
fn solved_counts_intervals_and_comparisons() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut points = Vec::new();
    // linear: 1 of 5 solves (at step 4000); mlp_softplus: 5 of 5 (at 2000, 2000, 3000, 6000,
    // 9000); mlp_softmax: 3 runs, one cut short at step 3000 unsolved.
    let runs: Vec<(&str, usize, Option<usize>, usize, bool)> = vec![
        ("linear", 0, Some(4000), 10_000, true),
        ("linear", 1, None, 10_000, true),
        ("linear", 2, None, 10_000, true),
        ("linear", 3, None, 10_000, true),
        ("linear", 4, None, 10_000, true),
        ("mlp_softplus", 0, Some(2000), 10_000, true),
        ("mlp_softplus", 1, Some(2000), 10_000, true),
        ("mlp_softplus", 2, Some(3000), 10_000, true),
        ("mlp_softplus", 3, Some(6000), 10_000, true),
        ("mlp_softplus", 4, Some(9000), 10_000, true),
        ("mlp_softmax", 0, Some(1000), 10_000, true),
        ("mlp_softmax", 1, None, 10_000, true),
        ("mlp_softmax", 2, None, 3_000, false),
    ];
    for (mode, seed, at, last, finished) in &runs {
        let name = format!("lambda={mode},seed={seed}");
        write_run(&dir.join(&name), &curve(*at, 0.99, *last), *finished);
        points.push(SweepPoint {
            dir: name,
            values: BTreeMap::from([
                ("model.lambda".to_string(), mode.to_string()),
                ("seed".to_string(), seed.to_string()),
            ]),
        });
    }
    // A point that never logged an evaluation: not included, and said so.
    points.push(SweepPoint {
        dir: "lambda=ones,seed=0".into(),
        values: BTreeMap::from([
            ("model.lambda".to_string(), "ones".to_string()),
            ("seed".to_string(), "0".to_string()),
        ]),
    });
    let index = SweepIndex {
        keys: vec!["model.lambda".into(), "seed".into()],
        points,
    };
    fs::write(dir.join("sweep.json"), serde_json::to_vec(&index).unwrap()).unwrap();

    let options = SummaryOptions {
        by_steps: vec![2000, 5000],
        ..SummaryOptions::default()
    };
    let rows = summarise_with(dir, &options).unwrap();
    assert_eq!(rows.len(), 3);
    // Twelve curves: one colour and legend entry per setting, its runs counted (the run cut
    // short included, the one without evaluations not).
    let curves = fs::read_to_string(dir.join("curves.svg")).unwrap();
    let texts: Vec<&str> = (curves.split("<text").skip(1))
        .filter_map(|t| t.split_once('>')?.1.split_once("</text>"))
        .map(|(content, _)| content.trim())
        .collect();
    for entry in [
        "lambda=linear (5 runs)",
        "lambda=mlp_softplus (5 runs)",
        "lambda=mlp_softmax (3 runs)",
    ] {
        let n = texts.iter().filter(|t| **t == entry).count();
        assert_eq!(n, 1, "{entry:?} in curves.svg: {texts:?}");
    }
    assert!(!curves.contains("seed=0"), "a run named in the legend");
    let md = fs::read_to_string(dir.join("summary.md")).unwrap();
    let row_of = |mode: &str| {
        md.lines()
            .filter(|l| l.starts_with("| all | "))
            .find(|l| l.contains(&format!("| {mode} |")))
            .unwrap_or_else(|| panic!("no comparison row for {mode} in\n{md}"))
            .to_string()
    };
    // linear: 1/5, Clopper–Pearson [0.51 %, 71.6 %]; by 2000: 0/5, by 5000: 1/5.
    let linear = row_of("linear");
    assert!(
        linear.contains("| 5 | 1/5 | 1–72 % | 0/5 | 1/5 | baseline | baseline |"),
        "{linear}"
    );
    // mlp_softplus: 5/5 [47.8 %, 100 %]; by 2000: 2/5; by 5000: 3/5; Fisher vs 1/5: p = 0.048;
    // Δ mean best = (0.99 − (0.99 + 4 · 0.016)/5) = 77.9 pp.
    let softplus = row_of("mlp_softplus");
    assert!(
        softplus.contains("| 5 | 5/5 | 48–100 % | 2/5 | 3/5 | 0.048 | +77.9 ["),
        "{softplus}"
    );
    // Paired by seed: seed 0 solved by both; seeds 1–4 only by mlp_softplus: McNemar exact
    // p = 2 · ½⁴ = 0.125.
    assert!(softplus.ends_with("| 0/4, 0.125 (5 pairs) |"), "{softplus}");
    // mlp_softmax: 3 runs of which one cut short at step 3000 unsolved: counted as not solved
    // at 5000 and marked.
    let softmax = row_of("mlp_softmax");
    assert!(softmax.contains("| 3 | 1/3 |"), "{softmax}");
    // Seeds 0–2 pair with linear's: seed 0 solved by both, 1 and 2 by neither.
    assert!(softmax.ends_with("| 0/0, 1.000 (3 pairs) |"), "{softmax}");
    assert!(softmax.contains("1/3 (1 ended before)"), "{softmax}");
    assert!(md.contains("1 cut short, at step 3000"), "{md}");
    assert!(md.contains("**1 runs have not finished"), "{md}");
    assert!(md.contains("**1 runs never finished"), "{md}");

    // Committed results keep the metrics gzip-compressed: the same summary from metrics.jsonl.gz
    // (the by-step counts and the cut-short run come from the metrics alone).
    for point in &index.points {
        let plain = dir.join(&point.dir).join("metrics.jsonl");
        let Ok(text) = fs::read(&plain) else { continue };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &text).unwrap();
        fs::write(plain.with_extension("jsonl.gz"), gz.finish().unwrap()).unwrap();
        fs::remove_file(&plain).unwrap();
    }
    summarise_with(dir, &options).unwrap();
    assert_eq!(fs::read_to_string(dir.join("summary.md")).unwrap(), md);

    // Another baseline and threshold: nothing solved at 100 %.
    let strict = SummaryOptions {
        solved_at: 1.0,
        baseline: "mlp_softplus".into(),
        ..SummaryOptions::default()
    };
    summarise_with(dir, &strict).unwrap();
    let md = fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        md.contains("| all | mlp_softplus | 5 | 0/5 | 0–52 % | baseline | baseline |"),
        "{md}"
    );
    assert!(
        md.contains("| all | linear | 5 | 0/5 | 0–52 % | 1.000 | -77.9 ["),
        "{md}"
    );
}

/// `--pool task.num_kv_pairs`: runs of every K count as one setting per λ mode (4 runs each
/// here), written to `summary_pooled_task.num_kv_pairs.md` while `summary.md` keeps its
/// per-K rows; a key that is not swept (or the compared key) is refused by name.
#[test]
fn pooling_a_swept_key_compares_over_all_its_values() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut points = Vec::new();
    // linear solves at K = 4 (both seeds); mlp_softplus at K = 4 and 8 (all four runs).
    for (mode, k, seed, at) in [
        ("linear", 4, 0, Some(1000)),
        ("linear", 4, 1, Some(2000)),
        ("linear", 8, 0, None),
        ("linear", 8, 1, None),
        ("mlp_softplus", 4, 0, Some(1000)),
        ("mlp_softplus", 4, 1, Some(1000)),
        ("mlp_softplus", 8, 0, Some(3000)),
        ("mlp_softplus", 8, 1, Some(3000)),
    ] {
        let name = format!("lambda={mode},k={k},seed={seed}");
        write_run(&dir.join(&name), &curve(at, 0.99, 5000), true);
        points.push(SweepPoint {
            dir: name,
            values: BTreeMap::from([
                ("model.lambda".to_string(), mode.to_string()),
                ("task.num_kv_pairs".to_string(), k.to_string()),
                ("seed".to_string(), seed.to_string()),
            ]),
        });
    }
    let index = SweepIndex {
        keys: vec![
            "model.lambda".into(),
            "task.num_kv_pairs".into(),
            "seed".into(),
        ],
        points,
    };
    fs::write(dir.join("sweep.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    let per_k = summarise_with(dir, &SummaryOptions::default()).unwrap();
    assert_eq!(per_k.len(), 4, "two modes × two K");
    let options = SummaryOptions {
        pool: vec!["task.num_kv_pairs".into()],
        ..SummaryOptions::default()
    };
    let pooled = summarise_with(dir, &options).unwrap();
    assert_eq!(pooled.len(), 2, "one setting per mode");
    assert!(pooled.iter().all(|r| r.n == 4));
    let md = fs::read_to_string(dir.join("summary_pooled_task.num_kv_pairs.md")).unwrap();
    assert!(md.contains("pooled (n = runs finished)"), "{md}");
    // 2/4 against 4/4: Fisher p = 0.429.
    assert!(md.contains("| all | linear | 4 | 2/4 |"), "{md}");
    assert!(md.contains("| all | mlp_softplus | 4 | 4/4 |"), "{md}");
    assert!(md.contains("| 0.429 |"), "{md}");
    // Paired by (K, seed): K = 4 solved by both, K = 8 only by mlp_softplus (2 pairs): p = 0.5.
    assert!(md.contains("| 0/2, 0.500 (4 pairs) |"), "{md}");
    // The per-K summary is left as it was.
    let main = fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        main.contains("| num_kv_pairs = 8 | mlp_softplus | 2 | 2/2 |"),
        "{main}"
    );
    for bad in ["task.seq_len", "model.lambda", "seed"] {
        let options = SummaryOptions {
            pool: vec![bad.into()],
            ..SummaryOptions::default()
        };
        let err = summarise_with(dir, &options).unwrap_err().to_string();
        assert!(
            err.contains(&format!("--pool {bad}")) && err.contains("task.num_kv_pairs"),
            "{err}"
        );
    }
}

/// `--at-step N` reads every run as of step N: runs cut short at different steps are compared
/// at one training length, a run finished before N keeps its summary, and `summary.md` is left
/// as it was.
#[test]
fn at_step_compares_runs_at_one_training_length() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // linear stopped at 3,000 (its best 0.30 at 3,000); mlp_softplus ran on to 5,000 and its
    // best (0.60) came at 5,000, but by 3,000 it was at 0.20; `ones` finished at 2,000 (0.40).
    // (λ mode, (step, accuracy) evaluations, finished)
    type Run<'a> = (&'a str, &'a [(usize, f64)], bool);
    let runs: [Run; 3] = [
        ("linear", &[(1000, 0.10), (2000, 0.25), (3000, 0.30)], false),
        (
            "mlp_softplus",
            &[
                (1000, 0.10),
                (2000, 0.15),
                (3000, 0.20),
                (4000, 0.50),
                (5000, 0.60),
            ],
            false,
        ),
        ("ones", &[(1000, 0.20), (2000, 0.40)], true),
    ];
    let mut points = Vec::new();
    for (mode, evals, finished) in runs {
        let name = format!("lambda={mode},seed=0");
        write_run(&dir.join(&name), evals, finished);
        points.push(SweepPoint {
            dir: name,
            values: BTreeMap::from([
                ("model.lambda".to_string(), mode.to_string()),
                ("seed".to_string(), "0".to_string()),
            ]),
        });
    }
    let index = SweepIndex {
        keys: vec!["model.lambda".into(), "seed".into()],
        points,
    };
    fs::write(dir.join("sweep.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    let best = |rows: &[loglinear_cli::sweep::SummaryRow], mode: &str| {
        let row = rows
            .iter()
            .find(|r| r.setting.get("model.lambda").map(String::as_str) == Some(mode))
            .unwrap();
        (row.best.0, row.last.0)
    };
    let whole = summarise_with(dir, &SummaryOptions::default()).unwrap();
    assert_eq!(best(&whole, "mlp_softplus"), (0.60, 0.60));
    let main = fs::read_to_string(dir.join("summary.md")).unwrap();

    let options = SummaryOptions {
        at_step: Some(3000),
        ..SummaryOptions::default()
    };
    let at = summarise_with(dir, &options).unwrap();
    assert_eq!(best(&at, "mlp_softplus"), (0.20, 0.20), "as of step 3,000");
    assert_eq!(best(&at, "linear"), (0.30, 0.30));
    assert_eq!(best(&at, "ones"), (0.40, 0.40), "finished before: as it is");
    let md = fs::read_to_string(dir.join("summary_at_step_3000.md")).unwrap();
    assert!(md.contains("as of step 3000"), "{md}");
    assert!(
        md.contains("over seeds (n = seeds finished)"),
        "not pooled: {md}"
    );
    assert!(
        md.contains("| mlp_softplus | 1 (1 cut short, at step 3000) |"),
        "{md}"
    );
    assert!(md.contains("| ones | 1 |"), "{md}");
    assert_eq!(
        fs::read_to_string(dir.join("summary.md")).unwrap(),
        main,
        "summary.md is left alone"
    );
    // Pooled and as of a step: both in the name.
    assert_eq!(
        loglinear_cli::sweep::summary_file_name(&SummaryOptions {
            pool: vec!["task.num_kv_pairs".into()],
            at_step: Some(5000),
            ..SummaryOptions::default()
        }),
        "summary_pooled_task.num_kv_pairs_at_step_5000.md"
    );
}
