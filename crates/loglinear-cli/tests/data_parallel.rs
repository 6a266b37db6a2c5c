//! Data-parallel training (`train --device cpu,cpu`): two replicas, each taking its share of
//! every batch, with gradients summed on the host, train the run that one device trains — the
//! same loss and gradient norm at every step, the same evaluations — and a run stopped on two
//! devices resumes on one (and the other way round) as if never interrupted.
//!
//! The batch of 7 rows splits 4 + 3 and gradient clipping is on, so a replica loss that is the
//! mean over its own rows (instead of its share of the global mean), gradients averaged instead
//! of summed, or a clipping factor computed per replica all change the logged figures. CUDA's
//! NCCL path (`cuda:0,cuda:1`) runs the same loop with Burn's collectives; it needs two GPUs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use loglinear_cli::train::read_metrics;

const CONFIG: &str = r#"
name = "dp"
seed = 5

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
steps = 12
batch_size = 7
train_examples = 64
lr = 3e-3
grad_clip = 0.5
log_every = 1
checkpoint_every = 6

[eval]
every = 6
examples = 32
"#;

fn config(dir: &Path) -> PathBuf {
    let path = dir.join("dp.toml");
    fs::write(&path, CONFIG).unwrap();
    path
}

fn train(config: &Path, out: &Path, device: &str, extra: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_loglinear"))
        .arg("train")
        .arg(config)
        .arg("--out")
        .arg(out)
        .args(["--device", device])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if extra.contains(&"--stop-after") {
        assert!(
            !output.status.success(),
            "--stop-after should stop the run: {stderr}"
        );
    } else {
        assert!(
            output.status.success(),
            "train --device {device} failed: {stderr}"
        );
    }
    stderr
}

/// A step and two of its figures.
type Row = (u64, f64, f64);

/// `(step, loss, grad_norm)` of every logged training step, and `(step, eval_loss, eval_acc)` of
/// every evaluation.
fn figures(run: &Path) -> (Vec<Row>, Vec<Row>) {
    let lines = read_metrics(&run.join("metrics.jsonl")).unwrap();
    let step = |m: &serde_json::Value| m["step"].as_u64().unwrap();
    let train = lines
        .iter()
        .filter(|m| m.get("loss").is_some())
        .map(|m| {
            (
                step(m),
                m["loss"].as_f64().unwrap(),
                m["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect();
    let evals = lines
        .iter()
        .filter(|m| m.get("eval_loss").is_some())
        .map(|m| {
            (
                step(m),
                m["eval_loss"].as_f64().unwrap(),
                m["eval_acc"].as_f64().unwrap(),
            )
        })
        .collect();
    (train, evals)
}

fn assert_same_run(want: &Path, got: &Path, what: &str) {
    let close = |a: f64, b: f64| (a - b).abs() <= 2e-5 * a.abs().max(b.abs()).max(1e-3);
    let (want_train, want_eval) = figures(want);
    let (got_train, got_eval) = figures(got);
    assert_eq!(want_train.len(), 12, "{what}: one line per step");
    assert_eq!(got_train.len(), want_train.len(), "{what}: logged steps");
    for (w, g) in want_train.iter().zip(&got_train) {
        assert_eq!(w.0, g.0, "{what}: steps");
        assert!(
            close(w.1, g.1) && close(w.2, g.2),
            "{what}: step {} loss {} / gradient norm {} on one device, {} / {} here",
            w.0,
            w.1,
            w.2,
            g.1,
            g.2
        );
    }
    // Clipping was active: the test would not see a wrong clipping factor otherwise.
    assert!(
        want_train.iter().any(|t| t.2 > 0.5),
        "no step was clipped: {want_train:?}"
    );
    assert_eq!(got_eval.len(), want_eval.len(), "{what}: evaluations");
    for (w, g) in want_eval.iter().zip(&got_eval) {
        assert!(
            w.0 == g.0 && close(w.1, g.1) && w.2 == g.2,
            "{what}: evaluation {w:?} on one device, {g:?} here"
        );
    }
}

#[test]
fn two_replicas_train_the_run_of_one_device() {
    let dir = tempfile_dir("dp-two");
    let cfg = config(&dir);
    train(&cfg, &dir.join("one"), "cpu", &[]);
    train(&cfg, &dir.join("two"), "cpu,cpu", &[]);
    assert_same_run(&dir.join("one"), &dir.join("two"), "cpu,cpu");
    // Three replicas: rows 3 + 2 + 2.
    train(&cfg, &dir.join("three"), "cpu,cpu,cpu", &[]);
    assert_same_run(&dir.join("one"), &dir.join("three"), "cpu,cpu,cpu");
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_run_resumes_on_another_number_of_devices() {
    let dir = tempfile_dir("dp-resume");
    let cfg = config(&dir);
    train(&cfg, &dir.join("one"), "cpu", &[]);
    // Stopped after 7 steps on two devices (the checkpoint of step 6 stays), resumed on one.
    let run = dir.join("two-then-one");
    train(&cfg, &run, "cpu,cpu", &["--stop-after", "7"]);
    train(&cfg, &run, "cpu", &["--resume"]);
    assert_same_run(&dir.join("one"), &run, "two devices, then one");
    // And the other way round.
    let run = dir.join("one-then-two");
    train(&cfg, &run, "cpu", &["--stop-after", "7"]);
    train(&cfg, &run, "cpu,cpu", &["--resume"]);
    assert_same_run(&dir.join("one"), &run, "one device, then two");
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_device_lists_are_refused_before_anything_is_written() {
    let dir = tempfile_dir("dp-bad");
    let cfg = config(&dir);
    let refuse = |device: &str, extra: &[&str]| {
        let out = dir.join("refused");
        let output = Command::new(env!("CARGO_BIN_EXE_loglinear"))
            .arg("train")
            .arg(&cfg)
            .arg("--out")
            .arg(&out)
            .args(["--device", device])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            !output.status.success(),
            "--device {device} should be refused"
        );
        assert!(
            !out.exists(),
            "--device {device}: the refused run left {}",
            out.display()
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let err = refuse("cpu,cuda:0", &[]);
    assert!(err.contains("CUDA") || err.contains("one kind"), "{err}");
    // More replicas than rows.
    let err = refuse("cpu,cpu,cpu", &["--set", "train.batch_size=2"]);
    assert!(err.contains("at least one row per device"), "{err}");
    fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loglinear-{name}-{}", std::process::id()));
    fs::remove_dir_all(&dir).ok();
    fs::create_dir_all(&dir).unwrap();
    dir
}
