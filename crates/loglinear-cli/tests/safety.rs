//! Never lose a run: `train` refuses folders that hold anything, `--overwrite` replaces only
//! runs, `--resume` loads only the run's own checkpoints and names the config keys that differ,
//! every value that breaks training is rejected with its key path before anything is written,
//! checkpoints that do not fit or are corrupt give one line, and the LM runs have `viz` and
//! `summarize`. Each refused command leaves the folder byte for byte as it was.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use loglinear_cli::config::ConfigFile;
use loglinear_cli::generate::Sampling;
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
steps = 20
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

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("tiny.toml");
    fs::write(&path, text).unwrap();
    path
}

fn run_ok(cmd: &mut Command) -> (String, String) {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "command failed: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// Runs a command that must fail with a one-line error; returns that line.
fn run_err(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "command should fail: {stderr}");
    let line = stderr.trim();
    assert_eq!(line.lines().count(), 1, "not one line: {stderr}");
    assert!(line.starts_with("error: "), "{stderr}");
    line.to_string()
}

fn train(config: &Path, out: &Path) -> Command {
    let mut c = bin();
    c.arg("train").arg(config).arg("--out").arg(out);
    c
}

/// Every file under `dir` (relative path → bytes), to check a refused command changed nothing.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if path.is_dir() {
                out.insert(rel.join(""), Vec::new());
                walk(root, &path, out);
            } else {
                out.insert(rel, fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// A run interrupted after step 15 (checkpoint at step 10), as a kill would leave it.
fn interrupted_run(tmp: &Path) -> (PathBuf, PathBuf) {
    let config = write_config(tmp, TINY);
    let run = tmp.join("run");
    let err = run_err(train(&config, &run).args(["--stop-after", "15"]));
    assert!(err.contains("stopped after 15 steps"), "{err}");
    assert!(run.join("checkpoints/ckpt-00000010").exists());
    (config, run)
}

fn steps_logged(run: &Path) -> Vec<u64> {
    read_metrics(&run.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|m| m.get("loss").is_some())
        .map(|m| m["step"].as_u64().unwrap())
        .collect()
}

// ------------------------------------------------------------------ the run folder

#[test]
fn train_refuses_a_folder_that_holds_a_run_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, run) = interrupted_run(tmp.path());
    let before = snapshot(&run);
    let err = run_err(&mut train(&config, &run));
    assert!(
        err.contains("already holds an unfinished run (last checkpoint at step 10 of 20)")
            && err.contains("--resume")
            && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(snapshot(&run), before);

    // A finished run is refused too, and says so.
    run_ok(train(&config, &run).arg("--resume"));
    let before = snapshot(&run);
    let err = run_err(&mut train(&config, &run));
    assert!(
        err.contains("already holds a finished run (20 steps)"),
        "{err}"
    );
    assert_eq!(snapshot(&run), before);
}

#[test]
fn a_folder_that_is_not_a_run_is_never_written() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), TINY);
    let mine = tmp.path().join("mine");
    fs::create_dir_all(mine.join("notes")).unwrap();
    fs::write(
        mine.join("metrics.jsonl"),
        "{\"step\": 1, \"mine\": true}\n",
    )
    .unwrap();
    fs::write(mine.join("notes/todo.txt"), "keep me").unwrap();
    let before = snapshot(&mine);
    for flags in [&[][..], &["--resume"], &["--overwrite"]] {
        let err = run_err(train(&config, &mine).args(flags));
        assert!(
            err.contains("is not a run folder and holds 2 (metrics.jsonl, notes)"),
            "{flags:?}: {err}"
        );
        assert_eq!(snapshot(&mine), before, "{flags:?}");
    }
    // A user's own config.toml alone is not a run either.
    let own = tmp.path().join("own");
    fs::create_dir_all(&own).unwrap();
    fs::write(own.join("config.toml"), TINY).unwrap();
    let err = run_err(train(&own.join("config.toml"), &own).arg("--resume"));
    assert!(err.contains("not a run folder"), "{err}");
    assert_eq!(fs::read_to_string(own.join("config.toml")).unwrap(), TINY);
}

#[test]
fn overwrite_replaces_the_whole_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, run) = interrupted_run(tmp.path());
    let old_id = fs::read_to_string(run.join("run.json")).unwrap();
    fs::create_dir_all(run.join("viz")).unwrap();
    // What a killed --overwrite leaves aside is deleted by the next one.
    let leftover = tmp.path().join(".run.replaced-0123456789abcdef");
    fs::create_dir_all(leftover.join("checkpoints")).unwrap();
    run_ok(train(&config, &run).arg("--overwrite").args([
        "--set",
        "train.steps=5",
        "--set",
        "train.checkpoint_every=5",
    ]));
    assert_ne!(fs::read_to_string(run.join("run.json")).unwrap(), old_id);
    assert_eq!(steps_logged(&run), vec![5]);
    let mut left: Vec<String> = fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "best",
            "checkpoints",
            "config.toml",
            "metrics.jsonl",
            "run.json",
            "summary.json"
        ]
    );
    let ckpts: Vec<String> = fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        ckpts.iter().all(|c| c == "latest" || c == "ckpt-00000005"),
        "{ckpts:?}"
    );
    let siblings: Vec<String> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("replaced"))
        .collect();
    assert!(siblings.is_empty(), "{siblings:?}");
}

#[test]
fn resume_with_another_config_names_the_keys_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, run) = interrupted_run(tmp.path());
    let before = snapshot(&run);
    let err = run_err(train(&config, &run).args([
        "--resume",
        "--set",
        "train.lr=0.5",
        "--set",
        "model.lambda=linear",
    ]));
    assert!(
        err.contains("different config")
            && err.contains("model.lambda (\"mlp_softplus\" in the run, \"linear\" now)")
            && err.contains("train.lr (0.003 in the run, 0.5 now)"),
        "{err}"
    );
    assert_eq!(snapshot(&run), before);
}

#[test]
fn resume_loads_only_checkpoints_of_its_own_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, run) = interrupted_run(tmp.path());
    // Another run of the same config: its checkpoint planted in ours is refused.
    let other = tmp.path().join("other");
    run_ok(train(&config, &other).args(["--set", "train.steps=10"]));
    let ckpt = run.join("checkpoints/ckpt-00000010");
    fs::copy(
        other.join("checkpoints/ckpt-00000010/run.json"),
        ckpt.join("run.json"),
    )
    .unwrap();
    let before = snapshot(&run);
    let err = run_err(train(&config, &run).arg("--resume"));
    assert!(
        err.contains("ckpt-00000010 was written by run") && err.contains("not loaded"),
        "{err}"
    );
    assert_eq!(snapshot(&run), before);
    // A checkpoint without a stamp (another tool, or an old binary) is refused as well.
    fs::remove_file(ckpt.join("run.json")).unwrap();
    let before = snapshot(&run);
    let err = run_err(train(&config, &run).arg("--resume"));
    assert!(err.contains("carries no run identity"), "{err}");
    assert_eq!(snapshot(&run), before);
}

#[test]
fn resume_without_a_checkpoint_says_it_starts_from_step_0() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), TINY);
    let fresh = tmp.path().join("fresh");
    let (_, err) = run_ok(
        train(&config, &fresh)
            .arg("--resume")
            .args(["--set", "train.steps=5"]),
    );
    assert!(
        err.contains("holds no run yet: starting from step 0"),
        "{err}"
    );
    // Killed before its first checkpoint: resumed from 0, its old metrics dropped.
    let early = tmp.path().join("early");
    run_err(train(&config, &early).args(["--stop-after", "7"]));
    assert!(!early.join("checkpoints").exists());
    let (_, err) = run_ok(train(&config, &early).arg("--resume"));
    assert!(
        err.contains("has no checkpoint yet: starting from step 0"),
        "{err}"
    );
    assert_eq!(steps_logged(&early), vec![5, 10, 15, 20]);
    // A creation killed between config.toml and run.json leaves only the resolved config:
    // starting there again rewrites the same bytes and loses nothing.
    let cut = tmp.path().join("cut");
    run_ok(train(&config, &cut).args(["--set", "train.steps=5"]));
    for e in fs::read_dir(&cut).unwrap() {
        let path = e.unwrap().path();
        if path.file_name().unwrap() != "config.toml" {
            if path.is_dir() {
                fs::remove_dir_all(&path).unwrap();
            } else {
                fs::remove_file(&path).unwrap();
            }
        }
    }
    run_ok(train(&config, &cut).args(["--set", "train.steps=5"]));
    assert_eq!(steps_logged(&cut), vec![5]);
}

/// A run folder written before run identities (no run.json, unstamped checkpoints) is refused
/// without a flag and adopted by `--resume`, which then continues it.
#[test]
fn a_run_from_before_identities_is_adopted_by_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, run) = interrupted_run(tmp.path());
    fs::remove_file(run.join("run.json")).unwrap();
    fs::remove_file(run.join("checkpoints/ckpt-00000010/run.json")).unwrap();
    fs::remove_file(run.join("best/run.json")).unwrap();
    let before = snapshot(&run);
    let err = run_err(&mut train(&config, &run));
    assert!(err.contains("written before run identities"), "{err}");
    assert_eq!(snapshot(&run), before);
    let (_, err) = run_ok(train(&config, &run).arg("--resume"));
    assert!(err.contains("resuming it as run"), "{err}");
    assert_eq!(steps_logged(&run), vec![5, 10, 15, 20]);
}

/// `sweep --jobs 2` starts each point as `train --resume` in a folder that already holds the
/// sweep's point.toml and train.log; a second sweep resumes nothing and skips both.
#[test]
fn sweep_children_run_and_rerun_in_their_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n[sweep]\nseed = [0, 1]\n",
        TINY.replace("steps = 20", "steps = 5")
    );
    let config = write_config(tmp.path(), &text);
    let out = tmp.path().join("sweep");
    run_ok(
        bin()
            .arg("sweep")
            .arg(&config)
            .arg("--out")
            .arg(&out)
            .args(["--jobs", "2"]),
    );
    for seed in [0, 1] {
        assert!(out.join(format!("seed={seed}/summary.json")).exists());
    }
    let (_, err) = run_ok(
        bin()
            .arg("sweep")
            .arg(&config)
            .arg("--out")
            .arg(&out)
            .args(["--jobs", "2"]),
    );
    assert_eq!(err.matches("finished, skipped").count(), 2, "{err}");
}

// ------------------------------------------------------------------ values that break training

/// Each class of harmful value is rejected with its key path, before anything is written.
#[test]
fn every_harmful_value_is_rejected_with_its_key() {
    let cases: &[(&str, &str)] = &[
        ("train.grad_clip=-1", "train.grad_clip"),
        ("train.grad_clip=0", "train.grad_clip"),
        ("train.min_lr=-1e-4", "train.min_lr"),
        ("train.eps=-1e-8", "train.eps"),
        ("train.eps=0", "train.eps"),
        ("train.weight_decay=-0.1", "train.weight_decay"),
        ("train.beta1=1.0", "train.beta1"),
        ("train.beta2=-0.5", "train.beta2"),
        ("train.lr=0", "train.lr"),
        ("train.lr=-1e-3", "train.lr"),
        ("train.lr=nan", "train.lr"),
        ("train.steps=0", "train.steps"),
        ("train.batch_size=0", "train.batch_size"),
        ("train.warmup_steps=21", "train.warmup_steps"),
        ("train.log_every=0", "train.log_every"),
        ("train.checkpoint_every=0", "train.checkpoint_every"),
        ("train.train_examples=4", "train.train_examples"),
        ("eval.every=0", "eval.every"),
        ("eval.examples=0", "eval.examples"),
        ("eval.batch_size=0", "eval.batch_size"),
        ("eval.early_stop_acc=0", "eval.early_stop_acc"),
        ("eval.early_stop_acc=1.5", "eval.early_stop_acc"),
        ("eval.patience=0", "eval.patience"),
        ("model.d_model=0", "model.d_model"),
        ("model.n_layers=0", "model.n_layers"),
        ("model.heads=0", "model.heads"),
        ("model.head_dim=0", "model.head_dim"),
        ("model.d_state=0", "model.d_state"),
        ("model.mlp_hidden=0", "model.mlp_hidden"),
        ("model.levels=0", "model.levels"),
        ("model.initializer_range=0", "model.initializer_range"),
        ("model.chunk=6", "model.chunk"),
        ("task.mqar.num_kv_pairs=0", "task.mqar.num_kv_pairs"),
        ("eval.test_seq_len=15", "eval.test_seq_len"),
    ];
    for (set, key) in cases {
        let err = ConfigFile::parse(TINY, &[set.to_string()])
            .unwrap()
            .config()
            .expect_err(set);
        let msg = format!("{err:#}");
        assert!(msg.starts_with(key), "{set}: {msg}");
    }
    let set = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // The MLP width of the language models: refused where the architecture reads it; the
    // synthetic-task model has no such MLP and ignores the key.
    for arch in ["mamba2", "transformer"] {
        let err = ConfigFile::parse(
            TINY,
            &set(&[
                &format!("model.arch={arch}"),
                "model.heads=2",
                "model.mlp_width=0",
            ]),
        )
        .unwrap()
        .config()
        .expect_err(arch);
        assert!(
            format!("{err:#}").starts_with("model.mlp_width"),
            "{arch}: {err:#}"
        );
    }
    ConfigFile::parse(TINY, &set(&["model.mlp_width=0"]))
        .unwrap()
        .config()
        .unwrap();
    // A language model has no default width: the key is required, and named.
    let err = ConfigFile::parse(
        &TINY.replace("d_model = 16\n", ""),
        &set(&["model.arch=mamba2"]),
    )
    .unwrap()
    .config()
    .unwrap_err();
    assert!(
        format!("{err:#}").starts_with("model.d_model is required for arch = \"mamba2\""),
        "{err:#}"
    );
    // Sizes that do not fit together: the library's check, under the key it names.
    for (sets, expected) in [
        (
            &["model.arch=mamba2", "model.head_dim=12"][..],
            "model.head_dim (12) must divide d_inner = expand·d_model = 32",
        ),
        (
            &["model.arch=mamba2", "model.n_groups=3"][..],
            "model.n_groups (3) must divide the heads",
        ),
        (
            &["model.arch=transformer", "model.heads=3"][..],
            "model.heads (3) must divide d_model = 16",
        ),
    ] {
        let err = ConfigFile::parse(TINY, &set(sets))
            .unwrap()
            .config()
            .unwrap_err();
        assert!(
            format!("{err:#}").starts_with(expected),
            "{sets:?}: {err:#}"
        );
    }
    // min_lr above lr breaks only the cosine schedule.
    let err = ConfigFile::parse(TINY, &set(&["train.schedule=cosine", "train.min_lr=0.01"]))
        .unwrap()
        .config()
        .unwrap_err();
    assert!(
        format!("{err:#}").starts_with("train.min_lr (0.01) must not exceed train.lr"),
        "{err:#}"
    );
    ConfigFile::parse(TINY, &set(&["train.min_lr=0.01"]))
        .unwrap()
        .config()
        .unwrap();

    // On the command line: refused before the run folder exists.
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), TINY);
    let out = tmp.path().join("never");
    let err = run_err(train(&config, &out).args(["--set", "train.grad_clip=-1"]));
    assert!(
        err.contains("train.grad_clip must be a positive norm"),
        "{err}"
    );
    assert!(!out.exists());
}

/// Early stop can be turned off in a config (`eval.early_stop_acc = false`; leaving the key out
/// keeps the default 0.99), and a run's saved config says so and reads back the same; `true`
/// names no accuracy and is refused with the key.
#[test]
fn early_stop_can_be_turned_off_and_reads_back() {
    let off = ConfigFile::parse(TINY, &["eval.early_stop_acc=false".to_string()])
        .unwrap()
        .config()
        .unwrap();
    assert_eq!(off.eval.early_stop_acc, None);
    let saved = toml::to_string_pretty(&off).unwrap();
    assert!(saved.contains("early_stop_acc = false"), "{saved}");
    let again = ConfigFile::parse(&saved, &[]).unwrap().config().unwrap();
    assert_eq!(
        again, off,
        "a saved config reads back as the config that ran"
    );
    let default = ConfigFile::parse(&TINY.replace("early_stop_acc = 1.0\n", ""), &[])
        .unwrap()
        .config()
        .unwrap();
    assert_eq!(
        default.eval.early_stop_acc,
        Some(0.99),
        "the key left out: the default"
    );
    let err = ConfigFile::parse(TINY, &["eval.early_stop_acc=true".to_string()])
        .and_then(|c| c.config())
        .expect_err("true is no accuracy");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("eval.early_stop_acc") && msg.contains("false to never stop early"),
        "{msg}"
    );
}

#[test]
fn generate_flags_are_checked() {
    for (t, k, p, flag) in [
        (-1.0, None, 1.0, "--temperature"),
        (f64::NAN, None, 1.0, "--temperature"),
        (0.8, Some(0), 1.0, "--top-k"),
        (0.8, None, 0.0, "--top-p"),
        (0.8, None, 2.0, "--top-p"),
        (0.8, None, -0.5, "--top-p"),
    ] {
        let err = Sampling::from_flags(t, k, p).unwrap_err();
        assert!(format!("{err}").starts_with(flag), "{t} {k:?} {p}: {err}");
    }
    let s = Sampling::from_flags(0.0, Some(40), 0.9).unwrap();
    assert_eq!((s.top_k, s.top_p), (40, 0.9));
    assert_eq!(Sampling::from_flags(0.8, None, 1.0).unwrap().top_k, 0);
    // The flags are checked before the run is even opened.
    let err = run_err(bin().args([
        "generate", "--run", "nowhere", "--prompt", "a", "--top-p", "2",
    ]));
    assert!(err.contains("--top-p"), "{err}");
}

// ------------------------------------------------------------------ checkpoints that do not load

#[test]
fn weights_that_do_not_fit_name_the_tensor_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), &TINY.replace("steps = 20", "steps = 10"));
    let run = tmp.path().join("run");
    run_ok(&mut train(&config, &run));
    for (set, key) in [
        ("model.lambda=linear", "model.lambda"),
        ("model.lambda=ones", "model.lambda"),
        ("model.levels=7", "model.levels"),
        ("model.mlp_hidden=32", "model.mlp_hidden"),
        ("model.d_model=32", "model.d_model"),
        ("model.n_layers=3", "model.n_layers"),
        ("task.mqar.vocab_size=80", "task.vocab_size"),
        ("model.arch=mamba2", "model.arch"),
    ] {
        let err = run_err(bin().arg("eval").arg(&run).args(["--set", set]));
        assert!(
            err.contains("do not fit the model") && err.contains("tensor `") && err.contains(key),
            "{set}: {err}"
        );
    }
}

/// Overwrites every tensor's data in a safetensors file with `byte`.
fn poison(path: &Path, byte: u8) {
    let mut bytes = fs::read(path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for b in &mut bytes[8 + header..] {
        *b = byte;
    }
    fs::write(path, bytes).unwrap();
}

#[test]
fn nan_or_garbage_weights_are_a_corrupt_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, run) = interrupted_run(tmp.path());
    let ckpt = run.join("checkpoints/ckpt-00000010/model.safetensors");
    poison(&ckpt, 0xFF); // every f32 NaN
    let before = snapshot(&run);
    let err = run_err(train(&config, &run).arg("--resume"));
    assert!(
        err.contains("ckpt-00000010/model.safetensors is a corrupt checkpoint")
            && err.contains("NaN")
            && !err.contains("train.lr"),
        "{err}"
    );
    assert_eq!(snapshot(&run), before);
    // Finite garbage (1.7e38 everywhere) and a truncated file, through eval's best weights.
    let best = run.join("best/model.safetensors");
    let intact = fs::read(&best).unwrap();
    poison(&best, 0x7E);
    let err = run_err(bin().arg("eval").arg(&run));
    assert!(err.contains("is a corrupt checkpoint"), "{err}");
    fs::write(&best, &intact[..intact.len() / 2]).unwrap();
    let err = run_err(bin().arg("eval").arg(&run));
    assert!(err.contains("is a corrupt checkpoint"), "{err}");
}

// ------------------------------------------------------------------ viz, summarize, leftovers

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/sotu-pre1820")
}

const LM: &str = r#"
name = "lm"
seed = 0

[task.lm]
data = "DATA"
seq_len = 16
max_eval_windows = 4

[model]
arch = "mamba2"
lambda = "mlp_softplus"
d_model = 16
n_layers = 1
expand = 1
head_dim = 8
d_state = 8
tie_embeddings = true
chunk = 8

[train]
steps = 4
batch_size = 2
log_every = 2
checkpoint_every = 2

[eval]
every = 2
batch_size = 4
"#;

/// `viz` traces λ on held-out text of the prepared corpus; a failing `viz` or `train` leaves no
/// output folder; `summarize` takes a single run folder.
#[test]
fn lm_runs_have_viz_and_summarize_and_failures_leave_no_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("prepared");
    run_ok(
        bin()
            .args(["data", "prepare", "--format", "sotu", "--input"])
            .arg(fixture())
            .arg("--out")
            .arg(&data),
    );
    let config = write_config(tmp.path(), &LM.replace("DATA", data.to_str().unwrap()));

    // Missing data: refused before the run folder exists.
    let missing = write_config(
        &tmp.path().join("x").tap_mkdir(),
        &LM.replace("DATA", tmp.path().join("nowhere").to_str().unwrap()),
    );
    let never = tmp.path().join("never");
    run_err(&mut train(&missing, &never));
    assert!(!never.exists());

    let run = tmp.path().join("run");
    run_ok(&mut train(&config, &run));
    let viz = tmp.path().join("viz");
    run_ok(
        bin()
            .arg("viz")
            .arg(&run)
            .arg("--out")
            .arg(&viz)
            .args(["--samples", "2"]),
    );
    for f in [
        "lambda_layer0_head0.png",
        "lambda_layer0_head1.svg",
        "lambda_histogram.png",
        "lambda_per_level.png",
        "curve_loss.png",
        "curve_perplexity.png",
    ] {
        assert!(viz.join(f).exists(), "{f} missing");
    }
    let csv = fs::read_to_string(viz.join("lambda.csv")).unwrap();
    // 2 windows × 1 layer × 16 positions × 2 heads × 5 levels, plus the header
    assert_eq!(csv.lines().count(), 1 + 2 * 16 * 2 * 5);

    // A failing viz (not a run) leaves no output folder.
    let nothing = tmp.path().join("viz-nothing");
    let err = run_err(
        bin()
            .arg("viz")
            .arg(tmp.path().join("x"))
            .arg("--out")
            .arg(&nothing),
    );
    assert!(err.contains("not a run directory"), "{err}");
    assert!(!nothing.exists());

    // summarize on the run folder itself.
    let (out, _) = run_ok(bin().arg("summarize").arg(&run));
    assert!(out.contains("| all | 1 |"), "{out}");
    let err = run_err(bin().arg("summarize").arg(tmp.path().join("x")));
    assert!(err.contains("neither a sweep folder"), "{err}");
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}

impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        fs::create_dir_all(&self).unwrap();
        self
    }
}
