//! Packed sweeps: every run of a pack is the run it would be alone (metrics equal to the
//! standalone runs' within f32 tolerance), a run that stops early stops changing while the pack
//! runs on (and once half the pack has stopped, the rest continue as a smaller pack), a killed pack resumes to the metrics of one that was not, and a packed run's folder
//! is an ordinary run folder (`--resume`, `eval` read it).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use loglinear_cli::stop::EXIT_STOPPED;
use loglinear_cli::train::read_metrics;

/// Tiny MQAR runs; the sweep crosses two λ modes of one parameter layout, two seeds and two
/// early-stop thresholds (the low one stops at the first evaluation, the others run on), and
/// lets the learning rate differ by seed through the cosine schedule's warm-up.
const SWEEP: &str = r#"
name = "packs"
seed = 3

[task.mqar]
vocab_size = 64
seq_len = 16
num_kv_pairs = 2
layout = "zoology"

[model]
arch = "paper_synthetic"
lambda = "mlp_softplus"
d_model = 16
d_state = 8
head_dim = 8
n_layers = 2
form = "chunked"
chunk = 4

[train]
steps = 40
batch_size = 8
train_examples = 64
lr = 3e-3
schedule = "cosine"
warmup_steps = 5
grad_clip = 0.5
log_every = 5
checkpoint_every = 15

[eval]
every = 10
examples = 32

[sweep]
"model.lambda" = ["mlp_softplus", "mlp_softmax"]
seed = [3, 4]
"eval.early_stop_acc" = [0.0001, 1.0]
"train.lr" = [3e-3, 1e-3]
"#;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_loglinear"))
}

/// Waits until the checkpoint named in `latest` (a run's `checkpoints/latest`) is at least
/// `at_least` (a `ckpt-NNNNNNNN` name), or until `limit` has passed: the point at which
/// the interruption tests stop a run mid-way.
fn wait_for_checkpoint(latest: &Path, at_least: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        let name = fs::read_to_string(latest).unwrap_or_default();
        if name.trim() >= at_least || started.elapsed() > limit {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "command failed: {stderr}");
    stderr
}

fn sweep(config: &Path, out: &Path, pack: usize) -> String {
    run_ok(
        bin()
            .arg("sweep")
            .arg(config)
            .arg("--out")
            .arg(out)
            .args(["--pack", &pack.to_string()]),
    )
}

fn runs(dir: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("config.toml").exists())
        .collect();
    runs.sort();
    runs
}

/// Every number of two metrics files, field by field, within `tol` relative (timing excluded).
fn assert_same_metrics(a: &Path, b: &Path, tol: f64) {
    let read = |p: &Path| read_metrics(&p.join("metrics.jsonl")).unwrap();
    let (ma, mb) = (read(a), read(b));
    assert_eq!(
        ma.len(),
        mb.len(),
        "{} and {}: metric lines",
        a.display(),
        b.display()
    );
    for (la, lb) in ma.iter().zip(&mb) {
        let (oa, ob) = (la.as_object().unwrap(), lb.as_object().unwrap());
        let keys = |o: &serde_json::Map<String, serde_json::Value>| {
            let mut k: Vec<String> = o.keys().filter(|k| *k != "tokens_per_s").cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(oa),
            keys(ob),
            "{}: fields of {la} and {lb}",
            a.display()
        );
        for k in keys(oa) {
            let (x, y) = (oa[&k].as_f64().unwrap(), ob[&k].as_f64().unwrap());
            assert!(
                (x - y).abs() <= tol * x.abs().max(y.abs()).max(1e-3),
                "{}: {k} {x} vs {y} (line {la})",
                a.display()
            );
        }
    }
}

#[test]
fn a_pack_trains_each_run_as_it_would_train_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("sweep.toml");
    fs::write(&config, SWEEP).unwrap();
    let alone = tmp.path().join("alone");
    let packed = tmp.path().join("packed");
    sweep(&config, &alone, 1);
    let log = sweep(&config, &packed, 16);
    assert!(log.contains("pack 1/1: 16 runs share one process"), "{log}");
    // Half the runs stop early at step 10: the other 8, with 30 of 40 steps to go, continue as
    // a pack of their own from checkpoints of step 10, written for the repack (the runs
    // checkpoint every 15 steps; the metrics below compare them too).
    assert!(
        log.contains("repacking: 8 of 16 runs still training continue as a pack of 8")
            && log.contains("pack of 8: 8 runs resume from their checkpoints (steps 10–10)"),
        "{log}"
    );
    let (alone_runs, packed_runs) = (runs(&alone), runs(&packed));
    assert_eq!(alone_runs.len(), 16);
    let mut early = 0;
    for (a, p) in alone_runs.iter().zip(&packed_runs) {
        assert_eq!(a.file_name(), p.file_name());
        // f32 on the CPU: a batched matmul may sum in another order than the same product
        // alone (≈1e-7 relative per step); 40 Adam steps on 16-wide models keep that far below
        // 1e-4, while a replica that saw another's data, learning rate or gradient would differ
        // by more than 1e-2 from the first logged step on.
        assert_same_metrics(a, p, 1e-4);
        let summary = |d: &Path| -> serde_json::Value {
            serde_json::from_slice(&fs::read(d.join("summary.json")).unwrap()).unwrap()
        };
        let (sa, sp) = (summary(a), summary(p));
        for key in ["steps", "best_step", "stopped_early", "params"] {
            assert_eq!(sa[key], sp[key], "{}: {key}", p.display());
        }
        if sp["stopped_early"] == true {
            early += 1;
            assert!(sp["steps"].as_u64().unwrap() < 40, "{}", p.display());
        }
        // The packed run's folder is an ordinary run: its best weights evaluate to its best
        // accuracy.
        assert!(p.join("best/model.safetensors").exists() && p.join("checkpoints/latest").exists());
    }
    assert!(
        early >= 1,
        "at least one run stopped early while the others ran on"
    );
    // `eval` reads a packed run's best weights as it reads any run's: the accuracy it finds is
    // the run's best held-out accuracy.
    // Packs as child processes (`--jobs`): the same runs again.
    let children = tmp.path().join("children");
    let log = run_ok(
        bin()
            .arg("sweep")
            .arg(&config)
            .arg("--out")
            .arg(&children)
            .args(["--pack", "8", "--jobs", "2"]),
    );
    assert!(log.contains("pack 2/2: 8 runs share one process"), "{log}");
    for (a, c) in alone_runs.iter().zip(&runs(&children)) {
        assert_same_metrics(a, c, 1e-4);
    }
    // Packs spread over two devices (`--device cpu,cpu`: the CPU stands in for two GPUs), one
    // process per device: both packs start before either finishes, and every run is again the
    // run alone.
    let spread = tmp.path().join("spread");
    let log = run_ok(
        bin()
            .arg("sweep")
            .arg(&config)
            .arg("--out")
            .arg(&spread)
            .args(["--pack", "8", "--device", "cpu,cpu"]),
    );
    let events: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(": started on ") || l.ends_with(": finished"))
        .collect();
    assert!(
        events.len() == 4
            && events[..2].iter().all(|l| l.ends_with(": started on cpu"))
            && events[2..].iter().all(|l| l.ends_with(": finished")),
        "{log}"
    );
    for (a, c) in alone_runs.iter().zip(&runs(&spread)) {
        assert_same_metrics(a, c, 1e-4);
    }
    let first = &packed_runs[0];
    let out = bin().arg("eval").arg(first).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let best: serde_json::Value =
        serde_json::from_slice(&fs::read(first.join("summary.json")).unwrap()).unwrap();
    let shown = format!(
        "accuracy {:.2}%",
        100.0 * best["best_acc"].as_f64().unwrap()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&shown),
        "eval printed {text}; the run's best: {shown}"
    );
}

#[test]
fn a_killed_pack_resumes_to_the_metrics_of_one_that_was_not() {
    let tmp = tempfile::tempdir().unwrap();
    let text = SWEEP
        .replace("steps = 40", "steps = 200")
        .replace("\"eval.early_stop_acc\" = [0.0001, 1.0]\n", "")
        .replace("\"train.lr\" = [3e-3, 1e-3]\n", "");
    let config = tmp.path().join("sweep.toml");
    fs::write(&config, text).unwrap();
    let whole = tmp.path().join("whole");
    sweep(&config, &whole, 4);

    let killed = tmp.path().join("killed");
    let mut child = bin()
        .arg("sweep")
        .arg(&config)
        .arg("--out")
        .arg(&killed)
        .args(["--pack", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_checkpoint(
        &killed.join("lambda=mlp_softmax,seed=4/checkpoints/latest"),
        "ckpt-00000030",
        Duration::from_secs(300),
    );
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    let resumed_from: Vec<usize> = runs(&killed)
        .iter()
        .map(|r| {
            let name = fs::read_to_string(r.join("checkpoints/latest")).unwrap();
            name.trim().trim_start_matches("ckpt-").parse().unwrap()
        })
        .collect();
    assert!(
        resumed_from.iter().all(|&s| (30..200).contains(&s)),
        "killed mid-way: checkpoints at {resumed_from:?}"
    );
    assert!(
        runs(&killed)
            .iter()
            .all(|r| !r.join("summary.json").exists())
    );
    let log = sweep(&config, &killed, 4);
    assert!(log.contains("pack 1/1: 4 runs share one process"), "{log}");
    for (a, b) in runs(&whole).iter().zip(&runs(&killed)) {
        // Same process layout, same batches, same arithmetic: the resumed pack is exact.
        assert_same_metrics(a, b, 0.0);
    }

    // SIGTERM to the sweep's process group (as `timeout` or a scheduler sends it): the pack
    // finishes its step, checkpoints every run at that step, and the sweep exits saying so;
    // the same sweep again ends with the uninterrupted metrics.
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let stopped = tmp.path().join("stopped");
        let child = bin()
            .arg("sweep")
            .arg(&config)
            .arg("--out")
            .arg(&stopped)
            .args(["--pack", "4"])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_checkpoint(
            &stopped.join("lambda=mlp_softmax,seed=4/checkpoints/latest"),
            "ckpt-00000030",
            Duration::from_secs(300),
        );
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: kill(2) of the process group the sweep leads.
        assert_eq!(
            unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) },
            0
        );
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "the sweep finished before the signal: {err}"
        );
        assert!(err.contains("stopped by a signal"), "{err}");
        assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{err}");
        let steps: Vec<String> = runs(&stopped)
            .iter()
            .map(|r| fs::read_to_string(r.join("checkpoints/latest")).unwrap())
            .collect();
        assert!(
            steps.windows(2).all(|w| w[0] == w[1]) && steps[0].trim() >= "ckpt-00000030",
            "every run checkpointed at the pack's step: {steps:?}"
        );
        sweep(&config, &stopped, 4);
        for (a, b) in runs(&whole).iter().zip(&runs(&stopped)) {
            assert_same_metrics(a, b, 0.0);
        }

        // With --jobs 2 the packs are child processes (the GPU sweeps' layout): each one's stop
        // is reported as a stop with its checkpoint, not as a failure, and the sweep exits with
        // the stop's status; the same sweep again finishes every run.
        let parallel = tmp.path().join("parallel");
        let sweep_args = ["--pack", "2", "--jobs", "2"];
        let child = bin()
            .arg("sweep")
            .arg(&config)
            .arg("--out")
            .arg(&parallel)
            .args(sweep_args)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        for run in ["lambda=mlp_softplus,seed=3", "lambda=mlp_softmax,seed=3"] {
            wait_for_checkpoint(
                &parallel.join(run).join("checkpoints/latest"),
                "ckpt-00000030",
                Duration::from_secs(300),
            );
        }
        // SAFETY: kill(2) of the process group the sweep leads.
        assert_eq!(
            unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) },
            0
        );
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{err}");
        assert_eq!(
            err.matches("stopped by the signal, with a checkpoint")
                .count(),
            2,
            "both packs report their stop: {err}"
        );
        assert!(!err.contains("FAILED"), "a stop is no failure: {err}");
        assert!(
            runs(&parallel)
                .iter()
                .all(|r| r.join("checkpoints/latest").exists() && !r.join("summary.json").exists()),
            "every run stopped with a checkpoint"
        );
        run_ok(
            bin()
                .arg("sweep")
                .arg(&config)
                .arg("--out")
                .arg(&parallel)
                .args(sweep_args),
        );
        assert!(
            runs(&parallel)
                .iter()
                .all(|r| r.join("summary.json").exists())
        );
    }
}

/// `--set key=[a, b]` on a swept key narrows the sweep to those values (a scalar pins it).
#[test]
fn an_array_override_narrows_a_swept_key() {
    use loglinear_cli::config::ConfigFile;
    let narrowed = ConfigFile::parse(
        SWEEP,
        &[
            "model.lambda=[\"mlp_softmax\"]".into(),
            "seed=[4, 3, 5]".into(),
        ],
    )
    .unwrap();
    let points = narrowed.expand().unwrap();
    assert_eq!(points.len(), 3 * 2 * 2);
    assert!(
        points
            .iter()
            .all(|(_, c)| c.model.lambda().name() == "mlp_softmax")
    );
    let seeds: std::collections::BTreeSet<u64> = points.iter().map(|(_, c)| c.seed).collect();
    assert_eq!(seeds.into_iter().collect::<Vec<_>>(), vec![3, 4, 5]);
    let pinned = ConfigFile::parse(SWEEP, &["seed=7".into()]).unwrap();
    assert_eq!(pinned.expand().unwrap().len(), 2 * 2 * 2);
}
