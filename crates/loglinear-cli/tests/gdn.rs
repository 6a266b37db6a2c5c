//! `model.mixer = "gated_deltanet"`: the config key (binding, resolved round trip, errors with
//! key paths), and `train`, `eval`, `generate`, `viz`, `sweep` on tiny Gated DeltaNet runs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use loglinear::nn::{LambdaMode, MixerKind};
use loglinear_cli::config::{ConfigFile, ExperimentConfig, Network};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_loglinear"))
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

fn config(text: &str, overrides: &[&str]) -> anyhow::Result<ExperimentConfig> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    ConfigFile::parse(text, &overrides)?.config()
}

const MQAR: &str = r#"
name = "gdn"
seed = 1

[task.mqar]
vocab_size = 64
seq_len = 16
num_kv_pairs = 2
layout = "zoology"

[model]
arch = "paper_synthetic"
mixer = "gated_deltanet"
lambda = "linear"
d_model = 16
d_state = 8
head_dim = 8
n_layers = 2
form = "chunked"
chunk = 4

[train]
steps = 12
batch_size = 8
train_examples = 64
lr = 3e-3
log_every = 4
checkpoint_every = 6

[eval]
every = 6
examples = 32
early_stop_acc = 1.0
"#;

/// The key selects the mixer of both log-linear architectures and binds the Gated DeltaNet
/// sizes; the resolved config states it and reads back as the same config; absent means mamba2.
#[test]
fn the_mixer_key_binds_and_round_trips() {
    let syn = config(MQAR, &[]).unwrap();
    match syn.network().unwrap() {
        Network::PaperSynthetic(c) => assert_eq!(c.mixer, MixerKind::GatedDeltaNet),
        other => panic!("{other:?}"),
    }
    let lm = config(
        MQAR,
        &[
            "model.arch=mamba2",
            "model.heads=2",
            "model.conv_kernel=3",
            "model.expand=3",
            "model.lambda=ones",
        ],
    )
    .unwrap();
    let Network::Mamba2(c) = lm.network().unwrap() else {
        panic!()
    };
    let g = c.gdn.as_ref().expect("the gated_deltanet mixer");
    assert_eq!(
        (g.d_model, g.heads, g.d_state, g.head_dim, g.conv_kernel),
        (16, 2, 8, 8, 3)
    );
    assert_eq!(g.lambda.mode, LambdaMode::Ones);
    for cfg in [syn, lm] {
        let resolved = cfg.resolved().unwrap();
        assert_eq!(resolved.model.mixer, Some(MixerKind::GatedDeltaNet));
        let text = toml::to_string_pretty(&resolved).unwrap();
        assert!(text.contains("mixer = \"gated_deltanet\""), "{text}");
        // expand is not read by the Gated DeltaNet LM: dropped.
        assert_eq!(resolved.model.expand, None);
        let back: ExperimentConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.resolved().unwrap(), resolved);
        // (The resolved config states the MLP width the LM took by its rule.)
        let network = |c: &ExperimentConfig| c.resolved().unwrap().network().unwrap();
        assert_eq!(network(&back), network(&cfg));
    }
    let plain = config(
        &MQAR.replace("mixer = \"gated_deltanet\"\n", ""),
        &["model.arch=mamba2"],
    )
    .unwrap();
    let Network::Mamba2(c) = plain.network().unwrap() else {
        panic!()
    };
    assert!(c.gdn.is_none());
    assert_eq!(
        plain.resolved().unwrap().model.mixer,
        Some(MixerKind::Mamba2)
    );
}

/// Errors name the key: a key width the delta rule cannot use, an unknown mixer, the mixer on
/// the transformer, too few levels.
#[test]
fn gated_deltanet_config_errors_name_the_key() {
    let err = |overrides: &[&str]| format!("{:#}", config(MQAR, overrides).unwrap_err());
    for arch in ["mamba2", "paper_synthetic"] {
        let e = err(&[&format!("model.arch={arch}"), "model.d_state=1"]);
        assert!(
            e.contains("model.d_state") && e.contains("at least 2"),
            "{arch}: {e}"
        );
    }
    let e = err(&["model.arch=mamba2", "model.heads=0"]);
    assert!(e.contains("model.heads"), "{e}");
    let e = err(&["model.mixer=gated_delta_net"]);
    assert!(e.contains("model.mixer"), "{e}");
    let e = err(&["model.arch=transformer", "model.heads=2"]);
    assert!(e.contains("model.mixer"), "{e}");
    let e = err(&["model.levels=3"]);
    assert!(e.contains("model.levels"), "{e}");
}

/// `train`, `eval`, `viz` and a `sweep` over the mixer on the synthetic task (the Gated DeltaNet
/// runs train alone, not packed).
#[test]
fn synthetic_gated_deltanet_runs_train_eval_viz_and_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), MQAR);
    let run = tmp.path().join("run");
    run_ok(bin().arg("train").arg(&cfg).arg("--out").arg(&run));
    let summary = fs::read_to_string(run.join("summary.json")).unwrap();
    assert!(summary.contains("best_acc"), "{summary}");
    let written = fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(written.contains("mixer = \"gated_deltanet\""), "{written}");
    let out = run_ok(bin().arg("eval").arg(&run));
    assert!(out.contains("accuracy"), "{out}");
    let viz = tmp.path().join("viz");
    run_ok(
        bin()
            .arg("viz")
            .arg(&run)
            .arg("--out")
            .arg(&viz)
            .args(["--samples", "2"]),
    );
    let csv = fs::read_to_string(viz.join("lambda.csv")).unwrap();
    // 2 samples × 2 layers × 16 positions × 1 head × 5 levels, plus the header
    assert_eq!(csv.lines().count(), 1 + 2 * 2 * 16 * 5);
    assert!(viz.join("lambda_layer1_head0.png").exists());

    let sweep_cfg = tmp.path().join("sweep.toml");
    fs::write(
        &sweep_cfg,
        format!(
            "{}\n[sweep]\n\"model.mixer\" = [\"mamba2\", \"gated_deltanet\"]\nseed = [0, 1]\n",
            MQAR.replace("steps = 12", "steps = 4")
        ),
    )
    .unwrap();
    let out_dir = tmp.path().join("sweep");
    run_ok(
        bin()
            .arg("sweep")
            .arg(&sweep_cfg)
            .arg("--out")
            .arg(&out_dir)
            .args(["--jobs", "2"]),
    );
    for name in ["mixer=mamba2,seed=0", "mixer=gated_deltanet,seed=1"] {
        assert!(out_dir.join(name).join("summary.json").exists(), "{name}");
    }
    let text = fs::read_to_string(out_dir.join("mixer=gated_deltanet,seed=0/config.toml")).unwrap();
    assert!(text.contains("gated_deltanet"), "{text}");
    let summary = fs::read_to_string(out_dir.join("summary.csv")).unwrap();
    assert!(summary.contains("gated_deltanet"), "{summary}");
}

/// A language model with the gated_deltanet mixer: `train` on the sotu fixture, `eval`,
/// `generate` (prefill + cached decoding) and `viz`.
#[test]
fn lm_with_gated_deltanet_trains_generates_and_visualises() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("prepared");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/sotu-pre1820");
    run_ok(
        bin()
            .args(["data", "prepare", "--format", "sotu", "--input"])
            .arg(fixture)
            .arg("--out")
            .arg(&data),
    );
    let text = format!(
        r#"
name = "lm_gdn"
seed = 0

[task.lm]
data = "{}"
seq_len = 16
max_eval_windows = 4

[model]
arch = "mamba2"
mixer = "gated_deltanet"
lambda = "mlp_softplus"
d_model = 16
n_layers = 1
heads = 2
d_state = 8
head_dim = 8
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
"#,
        data.display()
    );
    let cfg = write_config(tmp.path(), &text);
    let run = tmp.path().join("run");
    run_ok(bin().arg("train").arg(&cfg).arg("--out").arg(&run));
    let out = run_ok(bin().arg("eval").arg(&run));
    assert!(out.contains("perplexity") || out.contains("ppl"), "{out}");
    let out = run_ok(bin().args(["generate", "--run"]).arg(&run).args([
        "--prompt",
        "Fellow citizens",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ]));
    assert!(
        out.starts_with("Fellow citizens") && out.len() > "Fellow citizens".len(),
        "{out}"
    );
    let viz = tmp.path().join("viz");
    run_ok(
        bin()
            .arg("viz")
            .arg(&run)
            .arg("--out")
            .arg(&viz)
            .args(["--samples", "2"]),
    );
    let csv = fs::read_to_string(viz.join("lambda.csv")).unwrap();
    // 2 windows × 1 layer × 16 positions × 2 heads × 5 levels, plus the header
    assert_eq!(csv.lines().count(), 1 + 2 * 16 * 2 * 5);
    assert!(viz.join("lambda_layer0_head1.png").exists());
}
