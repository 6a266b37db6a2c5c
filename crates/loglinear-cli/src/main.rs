//! `loglinear`: log-linear attention with adaptive memory decay, from the command line.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use loglinear_cli::config::ConfigFile;
use loglinear_cli::device::parse_device;
use loglinear_cli::train::{self, RunOptions};
use loglinear_cli::{demo, sweep, viz};

mod op;

/// Log-linear attention (Fenwick-tree states) with adaptive memory decay.
#[derive(Parser, Debug)]
#[command(name = "loglinear", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the core op on tensors from a safetensors file (cross-framework checks).
    Op(op::OpArgs),
    /// Train one run from a TOML config.
    Train(TrainArgs),
    /// Evaluate a run's best checkpoint, optionally on a changed task (e.g. longer sequences).
    Eval(EvalArgs),
    /// Run every point of a config's [sweep] table (restartable) and summarise over seeds.
    Sweep(SweepArgs),
    /// Rebuild a sweep directory's summary.md, summary.csv and plots from its finished runs.
    Summarize(SummarizeArgs),
    /// Plot what λ learned in one or more runs, and their training curves.
    Viz(VizArgs),
    /// The main job: a small MQAR comparison of linear vs MLP-softplus λ on the CPU.
    Demo(DemoArgs),
}

#[derive(Args, Debug)]
struct SweepArgs {
    #[command(flatten)]
    common: ConfigArgs,
    /// Sweep directory (default runs/<name>).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct SummarizeArgs {
    /// Sweep directory written by `loglinear sweep`.
    dir: PathBuf,
}

#[derive(Args, Debug)]
struct VizArgs {
    /// Run directories; with several, also a side-by-side comparison.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Output directory (default RUN/viz for one run, viz-compare for several).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Held-out sequences in the fixed batch.
    #[arg(long, default_value_t = 8)]
    samples: usize,
    /// Device: cpu or cuda[:N].
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Output directory.
    #[arg(long, default_value = "demo-out")]
    out: PathBuf,
    /// Override keys of the embedded demo config.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Device: cpu or cuda[:N].
    #[arg(long, default_value = "cpu")]
    device: String,
}

/// Options shared by the commands that build a config.
#[derive(Args, Debug)]
struct ConfigArgs {
    /// Experiment config (TOML), e.g. experiments/mqar_tiny.toml.
    config: PathBuf,
    /// Override any key: --set train.lr=3e-4 --set model.lambda=mlp_softplus.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Device: cpu or cuda[:N].
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(Args, Debug)]
struct TrainArgs {
    #[command(flatten)]
    common: ConfigArgs,
    /// Run directory (default runs/<name>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from the run directory's latest checkpoint.
    #[arg(long)]
    resume: bool,
    /// Stop after this many steps of this invocation (to test resuming).
    #[arg(long, hide = true)]
    stop_after: Option<usize>,
}

#[derive(Args, Debug)]
struct EvalArgs {
    /// Run directory written by `loglinear train`.
    run: PathBuf,
    /// Override keys of the run's config for this evaluation: --set task.seq_len=512.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Device: cpu or cuda[:N].
    #[arg(long, default_value = "cpu")]
    device: String,
}

fn run_train(args: TrainArgs) -> Result<()> {
    let file = ConfigFile::load(&args.common.config, &args.common.set)?;
    if !file.sweep.is_empty() {
        anyhow::bail!(
            "{} has a [sweep] over {}: run it with `loglinear sweep`, or pin every swept key with --set",
            args.common.config.display(),
            file.sweep
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let config = file.config()?;
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from("runs").join(&config.name));
    let opts = RunOptions {
        out: out.clone(),
        device: parse_device(&args.common.device)?,
        resume: args.resume,
        progress: true,
        stop_after: args.stop_after,
    };
    let s = train::train(&config, &opts)?;
    println!(
        "{}: best accuracy {:.2}% at step {} (last {:.2}%), {} steps{}, {} parameters, {:.0} s; run in {}",
        s.name,
        100.0 * s.best_acc,
        s.best_step,
        100.0 * s.last_acc,
        s.steps,
        if s.stopped_early { " (early stop)" } else { "" },
        s.params,
        s.seconds,
        out.display()
    );
    if let Some(test) = s.best_test_acc {
        println!(
            "test-length accuracy at the best step: {:.2}%",
            100.0 * test
        );
    }
    Ok(())
}

fn run_eval(args: EvalArgs) -> Result<()> {
    let config_path = args.run.join("config.toml");
    let file = ConfigFile::load(&config_path, &args.set)
        .with_context(|| format!("{} is not a run directory", args.run.display()))?;
    let config = file.config()?;
    let device = parse_device(&args.device)?;
    let m = train::evaluate_run(&args.run, &config, &device)?;
    println!(
        "{} on {}: accuracy {:.2}% over {} scored positions, loss {:.4}",
        args.run.display(),
        config.task.name(),
        100.0 * m.acc,
        m.scored,
        m.loss
    );
    Ok(())
}

fn run_sweep(args: SweepArgs) -> Result<()> {
    let file = ConfigFile::load(&args.common.config, &args.common.set)?;
    let name = file
        .config()
        .map(|c| c.name)
        .unwrap_or_else(|_| "sweep".into());
    let out = args.out.unwrap_or_else(|| PathBuf::from("runs").join(name));
    let rows = sweep::run_sweep(&file, &out, &parse_device(&args.common.device)?, true)?;
    print!("{}", std::fs::read_to_string(out.join("summary.md"))?);
    println!("\n{} settings summarised in {}", rows.len(), out.display());
    Ok(())
}

fn run_summarize(args: SummarizeArgs) -> Result<()> {
    let rows = sweep::summarise(&args.dir)?;
    print!("{}", std::fs::read_to_string(args.dir.join("summary.md"))?);
    println!(
        "\n{} settings summarised in {}",
        rows.len(),
        args.dir.display()
    );
    Ok(())
}

fn run_viz(args: VizArgs) -> Result<()> {
    let device = parse_device(&args.device)?;
    for run in &args.runs {
        let out = match (&args.out, args.runs.len()) {
            (Some(o), 1) => o.clone(),
            (Some(o), _) => o.join(run.file_name().unwrap_or_default()),
            (None, _) => run.join("viz"),
        };
        let files = viz::visualise_run(run, &out, args.samples, &device)?;
        println!(
            "{}: {} files in {}",
            run.display(),
            files.len(),
            out.display()
        );
    }
    if args.runs.len() > 1 {
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("viz-compare"));
        let files = viz::compare_runs(&args.runs, &out, args.samples, &device)?;
        println!("comparison: {} files in {}", files.len(), out.display());
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Op(args) => op::run(args),
        Command::Train(args) => run_train(args),
        Command::Eval(args) => run_eval(args),
        Command::Sweep(args) => run_sweep(args),
        Command::Summarize(args) => run_summarize(args),
        Command::Viz(args) => run_viz(args),
        Command::Demo(args) => {
            parse_device(&args.device).and_then(|d| demo::run(&args.out, &args.set, &d))
        }
    };
    if let Err(err) = result {
        // One line: the error and its context chain.
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
