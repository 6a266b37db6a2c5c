//! Configs, training, resume after SIGKILL, NaN stop, sweeps and their reports, eval and viz.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use loglinear_cli::config::ConfigFile;
use loglinear_cli::train::read_metrics;

const TINY: &str = r#"
name = "tiny"
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
log_every = 5
checkpoint_every = 10

[eval]
every = 10
examples = 32
early_stop_acc = 1.0
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

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("config.toml");
    fs::write(&path, text).unwrap();
    path
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "command failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run_err(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "command should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The deterministic part of a metrics file: everything but wall-clock throughput (and the
/// marks [`resume_from_checkpoint`] puts on the lines written before a resume).
fn metrics_without_timing(run: &Path) -> Vec<serde_json::Value> {
    read_metrics(&run.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .map(|mut m| {
            m.as_object_mut().unwrap().remove("tokens_per_s");
            m.as_object_mut().unwrap().remove("before_resume");
            m
        })
        .collect()
}

/// Resumes the interrupted run in `dir` (of `steps` steps) and checks that it continued from the
/// checkpoint that was there, not from scratch: the metric lines up to the checkpoint's step
/// are the ones written before the resume (marked here first), every later one was written
/// again, and the resumed invocation ran at most `steps − checkpoint` steps (`--stop-after`
/// fails a run that would take more). A resume that restarted from step 0 would pass a
/// comparison of the metrics alone, since batches depend only on the seed and the step.
fn resume_from_checkpoint(config: &Path, dir: &Path, steps: usize) {
    let latest = fs::read_to_string(dir.join("checkpoints/latest")).unwrap();
    let ckpt: usize = latest.trim().trim_start_matches("ckpt-").parse().unwrap();
    assert!(0 < ckpt && ckpt < steps, "checkpoint at step {ckpt}");
    let path = dir.join("metrics.jsonl");
    let marked: String = read_metrics(&path)
        .unwrap()
        .into_iter()
        .map(|mut m| {
            m["before_resume"] = serde_json::json!(true);
            format!("{m}\n")
        })
        .collect();
    fs::write(&path, marked).unwrap();
    run_ok(
        bin()
            .args(["train"])
            .arg(config)
            .arg("--out")
            .arg(dir)
            .arg("--resume")
            .args(["--stop-after", &(steps - ckpt).to_string()]),
    );
    let metrics = read_metrics(&path).unwrap();
    assert!(
        metrics
            .iter()
            .any(|m| m["step"].as_u64() > Some(ckpt as u64)),
        "nothing was logged after the checkpoint at step {ckpt}"
    );
    for m in metrics {
        let step = m["step"].as_u64().unwrap() as usize;
        let old = m.get("before_resume").is_some();
        assert_eq!(
            old,
            step <= ckpt,
            "metrics of step {step} {} (the resume started at the checkpoint of step {ckpt})",
            if old {
                "survived the resume"
            } else {
                "were written again"
            }
        );
    }
}

#[test]
fn unknown_keys_and_wrong_types_are_named() {
    let err = ConfigFile::parse(TINY, &["train.learning_rate=1".into()])
        .unwrap()
        .config()
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("learning_rate") && msg.contains("`lr`") && msg.contains("`steps`"),
        "{msg}"
    );
    let err = ConfigFile::parse(TINY, &["train.steps=\"many\"".into()])
        .unwrap()
        .config()
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("train.steps") && msg.contains("invalid type"),
        "{msg}"
    );
    let err = ConfigFile::parse(TINY, &["model.lambda=cubic".into()])
        .unwrap()
        .config()
        .unwrap_err();
    assert!(format!("{err:#}").contains("mlp_softplus"), "{err:#}");
    let err = ConfigFile::parse(TINY, &["task.mqar.num_kv_pairs=5".into()])
        .unwrap()
        .config()
        .unwrap_err();
    assert!(format!("{err:#}").contains("num_kv_pairs"), "{err:#}");
    let err = ConfigFile::parse(TINY, &["model.levels=3".into()])
        .unwrap()
        .config()
        .unwrap_err();
    assert!(format!("{err:#}").contains("need 5"), "{err:#}");
    let err = ConfigFile::parse(TINY, &["train.lr".into()]).unwrap_err();
    assert!(format!("{err:#}").contains("key=value"), "{err:#}");
}

#[test]
fn overrides_and_sweeps_expand_to_typed_configs() {
    let file = ConfigFile::parse(
        TINY,
        &["train.lr=0.01".into(), "model.lambda=linear".into()],
    )
    .unwrap();
    let c = file.config().unwrap();
    assert_eq!(c.train.lr, 0.01);
    assert_eq!(c.model.lambda().name(), "linear");
    let text = format!(
        "{TINY}\n[sweep]\n\"model.lambda\" = [\"linear\", \"mlp_softplus\", \"mlp_softmax\"]\nseed = [0, 1]\n"
    );
    let points = ConfigFile::parse(&text, &[]).unwrap().expand().unwrap();
    assert_eq!(points.len(), 6);
    assert_eq!(points[0].0, "lambda=linear,seed=0");
    assert_eq!(points[5].0, "lambda=mlp_softmax,seed=1");
    assert_eq!(points[3].1.seed, 1);
    // Pinning an axis with --set removes it from the sweep.
    let pinned = ConfigFile::parse(&text, &["seed=7".into()]).unwrap();
    assert_eq!(pinned.sweep.len(), 1);
    assert_eq!(pinned.expand().unwrap().len(), 3);
}

/// `model.form` defaults to `auto`, which is the library's `Form::Auto` with `model.chunk` (the
/// library then picks the chunked form wherever the fused kernels would not run on tensor cores,
/// tested in the library's tests/forms.rs), and the named forms map to themselves.
#[test]
fn the_default_form_is_auto_with_the_chunk() {
    use loglinear::ops::Form;
    let no_form = TINY.replace("form = \"chunked\"\n", "");
    let c = ConfigFile::parse(&no_form, &[]).unwrap().config().unwrap();
    assert_eq!(c.model.form(), Form::Auto { chunk: 4 });
    for (name, form) in [
        ("fused", Form::Fused),
        ("chunked", Form::Chunked { chunk: 4 }),
        ("parallel", Form::Parallel),
        ("recurrent", Form::Recurrent),
        ("auto", Form::Auto { chunk: 4 }),
    ] {
        let c = ConfigFile::parse(&no_form, &[format!("model.form={name}")])
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(c.model.form(), form, "{name}");
    }
    // The segmented form takes `model.segment` (default 2048), a power of two, and only it does.
    let segmented = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        ConfigFile::parse(&no_form, &sets).unwrap().config()
    };
    let c = segmented(&["model.form=segmented", "model.segment=512"]).unwrap();
    assert_eq!(c.model.form(), Form::Segmented { segment: 512 });
    let c = segmented(&["model.form=segmented"]).unwrap();
    assert_eq!(c.model.form(), Form::Segmented { segment: 2048 });
    let err = segmented(&["model.form=segmented", "model.segment=500"]).unwrap_err();
    assert!(
        format!("{err:#}").contains("model.segment must be a power of two"),
        "{err:#}"
    );
    let err = segmented(&["model.form=fused", "model.segment=512"]).unwrap_err();
    assert!(
        format!("{err:#}")
            .contains("model.segment applies to form = \"segmented\" only (form is \"fused\")"),
        "{err:#}"
    );
    // Without a chunk: the library's usual one.
    let c = ConfigFile::parse(&no_form.replace("chunk = 4\n", ""), &[])
        .unwrap()
        .config()
        .unwrap();
    assert_eq!(
        c.model.form(),
        Form::Auto {
            chunk: loglinear::ops::DEFAULT_CHUNK
        }
    );
}

/// The keys a `[model]` table leaves out take the defaults of the architecture's library config
/// (one source of them), and the resolved config writes them out.
#[test]
fn absent_model_keys_take_the_library_defaults() {
    use loglinear::nn::{LambdaConfig, LmConfig, MixerConfig, SyntheticConfig, TransformerConfig};
    use loglinear_cli::config::Network;
    let with_model = |model: &str| {
        let (head, rest) = TINY.split_once("[model]").unwrap();
        let (_, tail) = rest.split_once("[train]").unwrap();
        let text = format!("{head}[model]\n{model}\n[train]{tail}");
        ConfigFile::parse(&text, &[]).unwrap().config().unwrap()
    };
    // T = 16 needs 5 levels, the run's own default; every other value is the library's.
    let lambda = LambdaConfig::new().with_levels(5);
    let c = with_model("");
    assert_eq!(
        c.network().unwrap(),
        Network::PaperSynthetic(SyntheticConfig::new(64, lambda.clone()))
    );
    let m = c.resolved().unwrap().model;
    let paper = SyntheticConfig::new(64, lambda.clone());
    assert_eq!(
        (m.d_model, m.heads, m.d_state, m.head_dim, m.mlp_hidden),
        (
            Some(paper.d_model),
            Some(paper.heads),
            Some(paper.d_state),
            Some(paper.head_dim),
            Some(paper.lambda.mlp_hidden)
        )
    );

    let c = with_model("arch = \"mamba2\"\nd_model = 32\nn_layers = 2");
    let mixer = MixerConfig::new(32).with_lambda(lambda.clone());
    assert_eq!(
        c.network().unwrap(),
        Network::Mamba2(LmConfig::new(64, 2, mixer.clone()))
    );
    let m = c.resolved().unwrap().model;
    assert_eq!(
        (m.expand, m.d_state, m.head_dim, m.n_groups, m.conv_kernel),
        (
            Some(mixer.expand),
            Some(mixer.d_state),
            Some(mixer.head_dim),
            Some(mixer.n_groups),
            Some(mixer.conv_kernel)
        )
    );
    assert_eq!(m.mlp_width, Some(LmConfig::new(64, 2, mixer).mlp_width()));

    let c = with_model("arch = \"transformer\"\nd_model = 32\nn_layers = 2\nheads = 4");
    let gpt2 = TransformerConfig::new(64, 32, 2, 4).with_max_seq_len(16);
    assert_eq!(c.network().unwrap(), Network::Transformer(gpt2.clone()));
    let m = c.resolved().unwrap().model;
    assert_eq!(m.tie_embeddings, Some(gpt2.tie_embeddings));
    assert_eq!(m.mlp_width, Some(gpt2.mlp_width()));
    assert_eq!(
        (m.lambda, m.levels, m.form, m.chunk),
        (None, None, None, None)
    );
}

/// `model.lambda_init`: `published` reaches the λ config of the MLP modes and is stated in the
/// resolved config; `identity` (the default) is not written out, so older run folders keep their
/// identity; the linear mode does not read the key.
#[test]
fn lambda_init_reaches_the_mlp_modes_only() {
    use loglinear::nn::{LambdaInit, LambdaMode};
    use loglinear_cli::config::Network;
    let lambda_of = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let c = ConfigFile::parse(TINY, &sets).unwrap().config().unwrap();
        let Network::PaperSynthetic(m) = c.network().unwrap() else {
            panic!("TINY is a synthetic-task config")
        };
        (m.lambda, c.resolved().unwrap().model.lambda_init)
    };
    let (l, stated) = lambda_of(&["model.lambda=mlp_softplus", "model.lambda_init=published"]);
    assert_eq!(
        (l.mode, l.init, stated),
        (
            LambdaMode::MlpSoftplus,
            LambdaInit::Published,
            Some(LambdaInit::Published)
        )
    );
    let (l, stated) = lambda_of(&["model.lambda=mlp_softmax", "model.lambda_init=identity"]);
    assert_eq!((l.init, stated), (LambdaInit::Identity, None));
    let (l, stated) = lambda_of(&["model.lambda=linear", "model.lambda_init=published"]);
    assert_eq!((l.init, stated), (LambdaInit::Identity, None));
    let err = ConfigFile::parse(TINY, &["model.lambda_init=xavier".to_string()])
        .and_then(|f| f.config())
        .unwrap_err();
    assert!(format!("{err:#}").contains("lambda_init"), "{err:#}");
}

/// A run killed with SIGKILL and resumed continues from its last checkpoint and ends with
/// exactly the metrics (losses, gradient norms, accuracies at every step) of a run that never
/// stopped.
#[test]
fn resume_after_sigkill_matches_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    // Long enough that the kill lands mid-run.
    let config = write_config(tmp.path(), &TINY.replace("steps = 40", "steps = 300"));
    let whole = tmp.path().join("whole");
    run_ok(bin().args(["train"]).arg(&config).arg("--out").arg(&whole));

    let killed = tmp.path().join("killed");
    let mut child = bin()
        .args(["train"])
        .arg(&config)
        .arg("--out")
        .arg(&killed)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once a checkpoint past the first one exists (or whenever it finishes).
    wait_for_checkpoint(
        &killed.join("checkpoints/latest"),
        "ckpt-00000020",
        Duration::from_secs(120),
    );
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    assert!(
        !killed.join("summary.json").exists(),
        "the run finished before the kill"
    );
    resume_from_checkpoint(&config, &killed, 300);
    assert_eq!(
        metrics_without_timing(&whole),
        metrics_without_timing(&killed)
    );

    // A resume of an interrupted run (--stop-after) also matches, and refuses another config.
    let stopped = tmp.path().join("stopped");
    run_err(
        bin()
            .args(["train"])
            .arg(&config)
            .arg("--out")
            .arg(&stopped)
            .args(["--stop-after", "17"]),
    );
    resume_from_checkpoint(&config, &stopped, 300);
    assert_eq!(
        metrics_without_timing(&whole),
        metrics_without_timing(&stopped)
    );
    let err = run_err(
        bin()
            .args(["train"])
            .arg(&config)
            .arg("--out")
            .arg(&stopped)
            .args(["--resume", "--set", "train.lr=0.5"]),
    );
    assert!(err.contains("different config"), "{err}");
}

/// SIGTERM (a scheduler's or `timeout`'s stop) mid-run: the run finishes its step, writes a
/// checkpoint of exactly that step — between the periodic ones — and exits with an error that
/// says so; resumed, it ends with the metrics of a run that never stopped.
#[cfg(unix)]
#[test]
fn sigterm_checkpoints_the_step_and_resume_matches_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), &TINY.replace("steps = 40", "steps = 300"));
    let whole = tmp.path().join("whole");
    run_ok(bin().args(["train"]).arg(&config).arg("--out").arg(&whole));

    let stopped = tmp.path().join("stopped");
    let child = bin()
        .args(["train"])
        .arg(&config)
        .arg("--out")
        .arg(&stopped)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Signal once a checkpoint past the first one exists, between two periodic checkpoints.
    wait_for_checkpoint(
        &stopped.join("checkpoints/latest"),
        "ckpt-00000020",
        Duration::from_secs(120),
    );
    std::thread::sleep(Duration::from_millis(20));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the run finished before the signal: {err}"
    );
    assert!(err.contains("stopped by a signal at step"), "{err}");
    assert_eq!(
        out.status.code(),
        Some(loglinear_cli::stop::EXIT_STOPPED),
        "a stop by a signal has its own exit status: {err}"
    );
    let step: usize = err
        .split("stopped by a signal at step ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no step in {err}"));
    let latest = fs::read_to_string(stopped.join("checkpoints/latest")).unwrap();
    assert_eq!(
        latest.trim(),
        format!("ckpt-{step:08}"),
        "a checkpoint of the step it stopped at"
    );
    let logged = read_metrics(&stopped.join("metrics.jsonl")).unwrap();
    assert!(
        logged.iter().filter_map(|m| m["step"].as_u64()).max() <= Some(step as u64),
        "nothing logged past the checkpointed step"
    );
    resume_from_checkpoint(&config, &stopped, 300);
    assert_eq!(
        metrics_without_timing(&whole),
        metrics_without_timing(&stopped)
    );
}

/// Commands that do not train keep the default action of SIGTERM: a benchmark under `timeout`
/// still ends at the limit (a caught signal that no loop checks would let it run on).
#[cfg(unix)]
#[test]
fn sigterm_still_ends_a_command_that_does_not_train() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = bin()
        .args([
            "bench", "op", "--t", "65536", "--tokens", "65536", "--runs", "1000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("bench op ran on for 30 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

#[test]
fn a_diverging_loss_stops_the_run_and_keeps_the_last_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), TINY);
    let out = tmp.path().join("nan");
    let err = run_err(
        bin()
            .args(["train"])
            .arg(&config)
            .arg("--out")
            .arg(&out)
            .args(["--set", "train.lr=1e30", "--set", "train.grad_clip=1e30"]),
    );
    assert!(
        err.contains("loss became") && err.contains("last good checkpoint"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn sweep_skips_finished_runs_and_summarises_over_seeds() {
    let tmp = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n[sweep]\n\"model.lambda\" = [\"linear\", \"mlp_softplus\"]\n\"task.mqar.num_kv_pairs\" = [1, 2]\nseed = [0, 1]\n",
        TINY.replace("steps = 40", "steps = 10")
            .replace("checkpoint_every = 10", "checkpoint_every = 5")
    );
    let config = write_config(tmp.path(), &text);
    let out = tmp.path().join("sweep");
    run_ok(bin().arg("sweep").arg(&config).arg("--out").arg(&out));
    let md = fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.contains("| linear | 1 | 2 |") && md.contains("| mlp_softplus | 2 | 2 |"),
        "{md}"
    );
    let csv = fs::read_to_string(out.join("summary.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "{csv}");
    assert!(
        lines[0].starts_with("model.lambda,task.mqar.num_kv_pairs,n,best_acc_mean,best_acc_std")
    );
    // mean and std agree with the per-seed values of each row
    for row in &lines[1..] {
        let cells: Vec<&str> = row.split(',').collect();
        let seeds: Vec<f64> = cells[9].split(' ').map(|v| v.parse().unwrap()).collect();
        let mean = seeds.iter().sum::<f64>() / 2.0;
        assert!(
            (mean - cells[3].parse::<f64>().unwrap()).abs() < 1e-5,
            "{row}"
        );
        let std = ((seeds[0] - mean).powi(2) + (seeds[1] - mean).powi(2)).sqrt();
        assert!(
            (std - cells[4].parse::<f64>().unwrap()).abs() < 1e-5,
            "{row}"
        );
    }
    assert!(out.join("accuracy.png").exists() && out.join("accuracy.svg").exists());

    // Restart: nothing runs again; then only a run whose summary is gone.
    let rerun = || {
        let output = bin()
            .arg("sweep")
            .arg(&config)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "restarted sweep failed: {err}");
        err
    };
    let err = rerun();
    assert_eq!(err.matches("finished, skipped").count(), 8, "{err}");
    fs::remove_file(out.join("lambda=linear,num_kv_pairs=2,seed=1/summary.json")).unwrap();
    let err = rerun();
    assert_eq!(err.matches("finished, skipped").count(), 7, "{err}");
    assert!(
        err.contains("[4/8] lambda=linear,num_kv_pairs=2,seed=1\n"),
        "{err}"
    );
}

#[test]
fn eval_and_viz_read_a_finished_run() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), &TINY.replace("steps = 40", "steps = 10"));
    let run = tmp.path().join("run");
    // Trained at T = 16 with a test length of 32: the model gets num_levels(32) = 6 levels.
    run_ok(
        bin()
            .args(["train"])
            .arg(&config)
            .arg("--out")
            .arg(&run)
            .args(["--set", "eval.test_seq_len=32"]),
    );
    let summary = fs::read_to_string(run.join("summary.json")).unwrap();
    assert!(summary.contains("best_test_acc"), "{summary}");
    let out = run_ok(bin().arg("eval").arg(&run));
    assert!(out.contains("accuracy") && out.contains("T=16"), "{out}");
    let out = run_ok(
        bin()
            .arg("eval")
            .arg(&run)
            .args(["--set", "task.seq_len=32"]),
    );
    assert!(out.contains("T=32"), "{out}");
    let err = run_err(
        bin()
            .arg("eval")
            .arg(&run)
            .args(["--set", "task.seq_len=40"]),
    );
    assert!(err.contains("need"), "{err}");

    let viz = tmp.path().join("viz");
    run_ok(
        bin()
            .arg("viz")
            .arg(&run)
            .arg("--out")
            .arg(&viz)
            .args(["--samples", "3"]),
    );
    for f in [
        "lambda_layer0_head0.png",
        "lambda_layer1_head0.svg",
        "lambda_histogram.png",
        "lambda_per_level.png",
        "curve_loss.png",
        "curve_accuracy.svg",
    ] {
        assert!(viz.join(f).exists(), "{f} missing");
    }
    let csv = fs::read_to_string(viz.join("lambda.csv")).unwrap();
    // 3 samples × 2 layers × 16 positions × 1 head × 6 levels, plus the header
    assert_eq!(csv.lines().count(), 1 + 3 * 2 * 16 * 6);
    assert!(csv.starts_with("sample,layer,head,position,level,occupied,lambda\n"));

    // lambda_per_level.csv: per layer and level, the mean of the values the queries read, as
    // recomputed from lambda.csv (6 decimals there), and the count of such values.
    let mut sums = std::collections::BTreeMap::<(usize, usize), (f64, usize)>::new();
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[5] == "1" {
            let e = sums
                .entry((f[1].parse().unwrap(), f[4].parse().unwrap()))
                .or_default();
            e.0 += f[6].parse::<f64>().unwrap();
            e.1 += 1;
        }
    }
    let check_stats = |dir: &std::path::Path| {
        let stats = fs::read_to_string(dir.join("lambda_per_level.csv")).unwrap();
        let rows: Vec<&str> = stats.lines().collect();
        assert_eq!(rows[0], "layer,level,n,mean,q10,q25,median,q75,q90");
        assert_eq!(
            rows.len() - 1,
            sums.len(),
            "one row per read (layer, level):\n{stats}"
        );
        for row in &rows[1..] {
            let f: Vec<f64> = row.split(',').map(|x| x.parse().unwrap()).collect();
            let (sum, n) = sums[&(f[0] as usize, f[1] as usize)];
            assert_eq!(f[2] as usize, n, "{row}");
            assert!(
                (f[3] - sum / n as f64).abs() <= 1e-5,
                "{row}: mean {}",
                sum / n as f64
            );
            assert!(
                f[4] <= f[5] && f[5] <= f[6] && f[6] <= f[7] && f[7] <= f[8],
                "{row}"
            );
        }
    };
    check_stats(&viz);
    // --stats-only writes that file alone.
    let stats_only = tmp.path().join("stats");
    run_ok(
        bin()
            .arg("viz")
            .arg(&run)
            .arg("--out")
            .arg(&stats_only)
            .args(["--samples", "3", "--stats-only"]),
    );
    let files: Vec<_> = fs::read_dir(&stats_only).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "{files:?}");
    check_stats(&stats_only);
}

/// Every config shipped under experiments/ parses, types and expands.
#[test]
fn every_shipped_config_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
    let mut seen = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let file = ConfigFile::load(&path, &[])
                .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            let points = file
                .expand()
                .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            assert!(!points.is_empty());
            seen += 1;
        }
    }
    assert!(seen >= 6, "only {seen} configs found");
}

/// Run folders written before the library configs owned the model defaults (their `config.toml`
/// as commit 7e2a445 wrote it, in tests/fixtures/resolved-7e2a445/, one per shipped config) are
/// the same runs as today's configs: they build the same library configs, `sweep` counts them as
/// finished and `train --resume` continues them; a config that really differs is still refused.
#[test]
fn run_folders_from_before_one_config_tree_are_the_same_runs() {
    use loglinear::nn::LambdaMode;
    use loglinear_cli::config::{Arch, ExperimentConfig};
    use loglinear_cli::run_dir::{self, RunIdentity, fingerprint};
    use loglinear_cli::sweep::is_finished;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = root.join("tests/fixtures/resolved-7e2a445");
    let tmp = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for entry in fs::read_dir(&fixtures).unwrap() {
        let fixture = entry.unwrap().path();
        if fixture.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let name = fixture.file_name().unwrap().to_str().unwrap().to_string();
        // `cpu_x.toml` stands for experiments/cpu/x.toml.
        let shipped = match name.strip_prefix("cpu_") {
            Some(rest) => root.join("../../experiments/cpu").join(rest),
            None => root.join("../../experiments").join(&name),
        };
        let written = fs::read_to_string(&fixture).unwrap();
        let now = ConfigFile::load(&shipped, &[]).unwrap().config().unwrap();
        let old: ExperimentConfig = toml::from_str(&written).unwrap();
        assert_eq!(
            old.network().unwrap(),
            now.network().unwrap(),
            "{name}: the model"
        );
        assert_eq!(
            old.resolved().unwrap(),
            now.resolved().unwrap(),
            "{name}: resolved"
        );
        // Today's resolved config states the same values, less the keys the architecture
        // ignores, plus the MLP width the language models took by their rule and the mixer the
        // log-linear models had before the key existed (mamba2).
        let ignored: &[&str] = match now.model.arch {
            Arch::PaperSynthetic => &["expand", "n_groups", "conv_kernel", "tie_embeddings"],
            Arch::Mamba2 => &["heads"],
            Arch::Transformer => &[
                "lambda",
                "levels",
                "mlp_hidden",
                "head_dim",
                "d_state",
                "expand",
                "n_groups",
                "conv_kernel",
                "form",
                "chunk",
            ],
        };
        let text = toml::to_string_pretty(&now.resolved().unwrap()).unwrap();
        for (key, (before, after)) in run_dir::config_diff(&written, &text).unwrap() {
            let dropped = after == "-" && ignored.iter().any(|k| key == format!("model.{k}"));
            let added =
                before == "-" && key == "model.mlp_width" && now.model.arch != Arch::PaperSynthetic;
            let mixer = before == "-"
                && key == "model.mixer"
                && after == "\"mamba2\""
                && now.model.arch != Arch::Transformer;
            assert!(
                dropped || added || mixer,
                "{name}: {key} was {before}, is {after}"
            );
        }

        // A finished run folder of that config, with the identity the old version gave it.
        let dir = tmp.path().join(&name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("config.toml"), &written).unwrap();
        fs::write(dir.join("summary.json"), "{}").unwrap();
        let id = RunIdentity {
            run_id: "00000000c0ffee00".into(),
            config_fingerprint: fingerprint(&written),
            adopted: false,
        };
        fs::write(dir.join("run.json"), serde_json::to_vec(&id).unwrap()).unwrap();
        assert!(
            is_finished(&dir, &now).unwrap(),
            "{name}: not finished for sweep"
        );
        let resolved = now.resolved().unwrap();
        let resumed = run_dir::open(&dir, &resolved, true, false)
            .unwrap_or_else(|e| panic!("{name}: --resume refused: {e:#}"));
        assert_eq!(resumed, id, "{name}: resumed as another run");
        assert_eq!(
            fs::read_to_string(dir.join("config.toml")).unwrap(),
            written
        );

        // Another config is not that run: sweep redoes it, --resume names the key.
        let mut other = resolved.clone();
        other.model.lambda = Some(match other.model.lambda() {
            LambdaMode::Ones => LambdaMode::Linear,
            _ => LambdaMode::Ones,
        });
        if other.model.arch == Arch::Transformer {
            other.model.tie_embeddings = other.model.tie_embeddings.map(|t| !t);
        }
        assert!(
            !is_finished(&dir, &other).unwrap(),
            "{name}: finished for another config"
        );
        let err = run_dir::open(&dir, &other.resolved().unwrap(), true, false).unwrap_err();
        assert!(
            format!("{err:#}").contains("different config"),
            "{name}: {err:#}"
        );
        seen.push(name);
    }
    for kind in [
        "mqar_tiny.toml",
        "lm_tiny.toml",
        "lm_cpu_transformer.toml",
        "lm_wikitext103_d256.toml",
    ] {
        assert!(
            seen.iter().any(|n| n == kind),
            "no fixture {kind}: {seen:?}"
        );
    }
}

/// `model.precision = "bf16"` trains (bf16 activations, f32 master weights) and its losses stay
/// close to the full-precision run's.
#[test]
fn mixed_precision_training_runs_and_tracks_full_precision() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), &TINY.replace("steps = 40", "steps = 20"));
    let full = tmp.path().join("full");
    let half = tmp.path().join("half");
    run_ok(bin().args(["train"]).arg(&config).arg("--out").arg(&full));
    run_ok(
        bin()
            .args(["train"])
            .arg(&config)
            .arg("--out")
            .arg(&half)
            .args(["--set", "model.precision=bf16"]),
    );
    let losses = |run: &Path| -> Vec<f64> {
        read_metrics(&run.join("metrics.jsonl"))
            .unwrap()
            .iter()
            .filter_map(|m| m["loss"].as_f64())
            .collect()
    };
    let (a, b) = (losses(&full), losses(&half));
    assert_eq!(a.len(), b.len());
    assert_ne!(a, b, "bf16 changed nothing");
    for (x, y) in a.iter().zip(&b) {
        assert!(
            y.is_finite() && (x - y).abs() < 0.05 * x.abs(),
            "full {x} vs bf16 {y}"
        );
    }
}
