//! Experiment configs: TOML files under `experiments/`, `--set key=value` overrides, a typed
//! config with every key checked, and the `[sweep]` table that turns one file into many runs.

use std::path::Path;

use anyhow::{Context, Result, bail};
use loglinear::fenwick::num_levels;
use loglinear::nn::{
    ConfigError, GdnConfig, LambdaConfig, LambdaInit, LambdaMode, LmConfig, MixerConfig, MixerKind,
    Precision, SyntheticConfig, TransformerConfig,
};
use loglinear::ops::{DEFAULT_CHUNK, Form};
use serde::{Deserialize, Serialize};

use crate::tasks::TaskConfig;

/// One training run, fully specified.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Name used for the run directory and in reports.
    #[serde(default = "default_name")]
    pub name: String,
    /// Seed of the model init, the training data and the batch order.
    #[serde(default)]
    pub seed: u64,
    /// The task and its data.
    pub task: TaskConfig,
    /// The model.
    pub model: ModelConfig,
    /// Optimiser and schedule.
    #[serde(default)]
    pub train: TrainConfig,
    /// Evaluation.
    #[serde(default)]
    pub eval: EvalConfig,
}

fn default_name() -> String {
    "run".into()
}

/// Which network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// The log-linear LM of the official code (GatedMLP blocks) with its log-linear Mamba-2 mixer
    /// (conv, gate, gated RMSNorm), or with `mixer = "gated_deltanet"` the log-linear Gated
    /// DeltaNet mixer of spec §5.1.
    Mamba2,
    /// The simplified model of the adaptive-decay paper's synthetic runs (spec §7.2.2).
    #[default]
    PaperSynthetic,
    /// A GPT-2-style causal softmax Transformer (the LM baseline); `heads` heads.
    Transformer,
}

/// Which form of the core op to train with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FormName {
    /// [`Form::Auto`]: the library picks the fused kernels where they run on tensor cores (bf16
    /// mixed precision on a device with `cmma`, `d_state` a multiple of 16) and `chunked`
    /// elsewhere — the faster of the two in each case as measured on the H200 (bench/RESULTS.md).
    #[default]
    Auto,
    /// Quadratic.
    Parallel,
    /// Chunkwise tensor form with `chunk`.
    Chunked,
    /// Token by token.
    Recurrent,
    /// The fused kernels on CUDA/WGPU; elsewhere the chunked form with chunk 64.
    Fused,
    /// [`Form::Segmented`]: the fused kernels over aligned segments of `segment` tokens, the
    /// pairs across segments from one state per segment (long sequences with few heads).
    Segmented,
}

/// The segment length of `form = "segmented"` where `model.segment` is absent.
pub const DEFAULT_SEGMENT: usize = 2048;

/// The `[model]` table: the architecture, and values for the fields of its library config
/// ([`SyntheticConfig`], [`LmConfig`] with [`MixerConfig`] and [`LambdaConfig`], or
/// [`TransformerConfig`]). An absent key takes the library's default for that architecture (the
/// LMs' `d_model` and `n_layers` and the transformer's `heads` have none and are required); a
/// key the architecture does not read is ignored. [`ExperimentConfig::resolved`] writes out every
/// value the architecture reads and drops the keys it ignores (TOML leaves absent values out);
/// [`ExperimentConfig::network`] is the library config.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Architecture (default `paper_synthetic`).
    pub arch: Arch,
    /// Sequence mixer (paper_synthetic, mamba2): `mamba2` (default) or `gated_deltanet`.
    pub mixer: Option<MixerKind>,
    /// λ mode (paper_synthetic, mamba2).
    pub lambda: Option<LambdaMode>,
    /// λ slots; default `num_levels` of the longest sequence the run sees (train or test
    /// length), so test-length evaluation has its levels.
    pub levels: Option<usize>,
    /// Hidden width of the λ-MLP.
    pub mlp_hidden: Option<usize>,
    /// How the λ-MLP starts: `identity` (default; the init the paper describes, λ ≈ 1) or
    /// `published` (what the published scripts ran: both weights `N(0, initializer_range²)`,
    /// biases 0; spec §6.4.1). Read by the MLP λ modes only; the resolved config states it only
    /// when it is `published`, so runs from before the key existed keep their identity.
    pub lambda_init: Option<LambdaInit>,
    /// Model width.
    pub d_model: Option<usize>,
    /// Number of layers.
    pub n_layers: Option<usize>,
    /// Heads (paper_synthetic, transformer, mamba2 with the gated_deltanet mixer; for the
    /// mamba2 mixer heads = expand·d_model/head_dim).
    pub heads: Option<usize>,
    /// Value width per head `P` (paper_synthetic, mamba2).
    pub head_dim: Option<usize>,
    /// Key width `N` (paper_synthetic, mamba2; fla's `head_dim` for the gated_deltanet mixer).
    pub d_state: Option<usize>,
    /// Inner width factor (mamba2 with the mamba2 mixer).
    pub expand: Option<usize>,
    /// B/C groups (mamba2 with the mamba2 mixer).
    pub n_groups: Option<usize>,
    /// Conv width (mamba2; the q/k/v short convolutions of the gated_deltanet mixer).
    pub conv_kernel: Option<usize>,
    /// MLP width (mamba2, transformer); default by the architecture's rule.
    pub mlp_width: Option<usize>,
    /// Tie the LM head to the embedding (mamba2, transformer).
    pub tie_embeddings: Option<bool>,
    /// Std of the normal init.
    pub initializer_range: Option<f64>,
    /// Core-op form for training and evaluation (paper_synthetic, mamba2; default `auto`).
    pub form: Option<FormName>,
    /// Chunk size of the chunked form, a power of two (paper_synthetic, mamba2; default
    /// [`DEFAULT_CHUNK`]); `fused` chooses its own.
    pub chunk: Option<usize>,
    /// Segment length of `form = "segmented"`, a power of two (default [`DEFAULT_SEGMENT`]).
    pub segment: Option<usize>,
    /// Compute dtype: `full` (the parameters' f32) or `bf16` (mixed precision: bf16 activations
    /// and matrix products; f32 master weights, optimiser state, norms, decays, λ and the core
    /// op's cumulative sums and states; f32 logits for the loss).
    pub precision: Precision,
}

impl ModelConfig {
    /// The λ mode (the library's default where the key is absent).
    pub fn lambda(&self) -> LambdaMode {
        self.lambda.unwrap_or_default()
    }

    /// The sequence mixer (`mamba2` where the key is absent).
    pub fn mixer(&self) -> MixerKind {
        self.mixer.unwrap_or_default()
    }

    /// Chunk size of the chunked form (the library's usual one where the key is absent).
    pub fn chunk(&self) -> usize {
        self.chunk.unwrap_or(DEFAULT_CHUNK)
    }

    /// The core-op form. `auto` is [`Form::Auto`]: the library chooses, call by call, between
    /// the fused kernels and the chunked form with `chunk` from the actual inputs and device.
    pub fn form(&self) -> Form {
        let chunk = self.chunk();
        match self.form.unwrap_or_default() {
            FormName::Auto => Form::Auto { chunk },
            FormName::Parallel => Form::Parallel,
            FormName::Chunked => Form::Chunked { chunk },
            FormName::Recurrent => Form::Recurrent,
            FormName::Fused => Form::Fused,
            FormName::Segmented => Form::Segmented {
                segment: self.segment.unwrap_or(DEFAULT_SEGMENT),
            },
        }
    }
}

/// The library config of a run's network.
#[derive(Clone, Debug, PartialEq)]
pub enum Network {
    /// `arch = "mamba2"`.
    Mamba2(LmConfig),
    /// `arch = "paper_synthetic"`.
    PaperSynthetic(SyntheticConfig),
    /// `arch = "transformer"`.
    Transformer(TransformerConfig),
}

impl Network {
    /// The library's check of the sizes, naming the field that is out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Network::Mamba2(c) => c.validate(),
            Network::PaperSynthetic(c) => c.validate(),
            Network::Transformer(c) => c.validate(),
        }
    }
}

/// Sets a library config's `field` to the key's `value` where the config file gives one, and
/// returns the value in effect: one call per key both applies it and reads back what the
/// resolved config states.
fn bind<T: Copy>(value: Option<T>, field: &mut T) -> Option<T> {
    if let Some(v) = value {
        *field = v;
    }
    Some(*field)
}

/// The config key of a library config's field: the field's own name (the library names its
/// fields as the `[model]` table does), but for the few that have another name here or that the
/// task sets.
fn key_of(field: &str) -> String {
    match field.rsplit('.').next().unwrap_or(field) {
        "mode" => "model.lambda".into(),
        "n_heads" => "model.heads".into(),
        "vocab_size" => "task.vocab_size".into(),
        "max_seq_len" => "task.seq_len".into(),
        leaf => format!("model.{leaf}"),
    }
}

/// Optimiser.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerName {
    /// Adam (L2 weight decay folded into the gradient, as torch.optim.Adam).
    Adam,
    /// AdamW (decoupled weight decay).
    Adamw,
}

/// Learning-rate schedule after the warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Constant at `lr`.
    Constant,
    /// Cosine from `lr` to `min_lr` at `steps`.
    Cosine,
}

/// Training settings (missing keys take the defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch_size: usize,
    /// Size of the fixed training pool (each step draws `batch_size` distinct sequences).
    pub train_examples: usize,
    /// Optimiser.
    pub optimizer: OptimizerName,
    /// Peak learning rate.
    pub lr: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// Adam β₁.
    pub beta1: f64,
    /// Adam β₂.
    pub beta2: f64,
    /// Adam ε.
    pub eps: f64,
    /// Schedule after warm-up.
    pub schedule: Schedule,
    /// Linear warm-up steps from 0.
    pub warmup_steps: usize,
    /// Final learning rate of the cosine schedule.
    pub min_lr: f64,
    /// Clip the global gradient norm to this value (none if absent).
    pub grad_clip: Option<f64>,
    /// Log loss and throughput every this many steps.
    pub log_every: usize,
    /// Write a resumable checkpoint every this many steps.
    pub checkpoint_every: usize,
}

impl Default for TrainConfig {
    /// The adaptive-decay MQAR sweep: Adam, lr 1e-3 constant, batch 64, 5,000 steps, clip 1.0.
    fn default() -> Self {
        Self {
            steps: 5000,
            batch_size: 64,
            train_examples: 10_000,
            optimizer: OptimizerName::Adam,
            lr: 1e-3,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            schedule: Schedule::Constant,
            warmup_steps: 0,
            min_lr: 0.0,
            grad_clip: Some(1.0),
            log_every: 10,
            checkpoint_every: 250,
        }
    }
}

/// Evaluation settings (missing keys take the defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Evaluate every this many steps (and at the end).
    pub every: usize,
    /// Size of the held-out pool.
    pub examples: usize,
    /// The held-out pool is generated from `seed + seed_offset`.
    pub seed_offset: u64,
    /// Stop once held-out accuracy reaches this fraction; `false` in a config (`None`): never.
    /// Leaving the key out keeps the default, 0.99 (TOML has no null).
    #[serde(with = "early_stop")]
    pub early_stop_acc: Option<f64>,
    /// Stop after this many evaluations without a better held-out loss (none: never); the
    /// published LM runs used 10.
    pub patience: Option<usize>,
    /// Also evaluate at this sequence length (length generalisation: train at T, test at T').
    pub test_seq_len: Option<usize>,
    /// Sequences per evaluation batch.
    pub batch_size: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            every: 100,
            examples: 1000,
            seed_offset: 1,
            early_stop_acc: Some(0.99),
            patience: None,
            test_seq_len: None,
            batch_size: 250,
        }
    }
}

impl ExperimentConfig {
    /// The longest sequence the run sees.
    pub fn max_seq_len(&self) -> usize {
        self.task.seq_len().max(self.eval.test_seq_len.unwrap_or(0))
    }

    /// The config as stored in the run directory: `[model]` with every value the architecture
    /// reads written out (the library's defaults included, so a run folder states its model in
    /// full and evaluating at another length keeps the trained model's shape) and the keys it
    /// ignores dropped. Errors when a key the architecture requires is absent.
    pub fn resolved(&self) -> Result<Self> {
        let (_, model) = self.bind()?;
        Ok(Self {
            model,
            ..self.clone()
        })
    }

    /// The library config of the run's network: the library's defaults for the architecture,
    /// overridden by the keys of `[model]`. Errors when a key it requires is absent.
    pub fn network(&self) -> Result<Network> {
        Ok(self.bind()?.0)
    }

    /// λ slots of the model.
    pub fn levels(&self) -> usize {
        self.model
            .levels
            .unwrap_or_else(|| num_levels(self.max_seq_len()))
    }

    /// [`ExperimentConfig::network`] and the resolved `[model]` table, from one pass over the keys
    /// of the architecture (the one place where the table meets the library configs).
    fn bind(&self) -> Result<(Network, ModelConfig)> {
        let m = &self.model;
        let vocab = self.task.vocab_size();
        let required = |key: &str, value: Option<usize>| {
            value.with_context(|| {
                format!(
                    "model.{key} is required for arch = \"{}\": the architecture has no default for it",
                    arch_name(m.arch)
                )
            })
        };
        // Every architecture reads these; the rest stay absent unless the arch binds them.
        let mut r = ModelConfig {
            arch: m.arch,
            precision: m.precision,
            ..ModelConfig::default()
        };
        // The keys of the core op and its λ, which the two log-linear architectures share.
        let bind_op = |c: &mut LambdaConfig, r: &mut ModelConfig| {
            r.lambda = bind(m.lambda, &mut c.mode);
            r.levels = bind(Some(self.levels()), &mut c.levels);
            r.mlp_hidden = bind(m.mlp_hidden, &mut c.mlp_hidden);
            let reads_init = matches!(c.mode, LambdaMode::MlpSoftplus | LambdaMode::MlpSoftmax);
            if reads_init {
                bind(m.lambda_init, &mut c.init);
            }
            r.lambda_init = (c.init != LambdaInit::Identity).then_some(c.init);
            r.form = Some(m.form.unwrap_or_default());
            r.chunk = Some(m.chunk.unwrap_or(DEFAULT_CHUNK));
            if r.form == Some(FormName::Segmented) {
                r.segment = Some(m.segment.unwrap_or(DEFAULT_SEGMENT));
            }
        };
        let network = match m.arch {
            Arch::PaperSynthetic => {
                let mut c = SyntheticConfig::new(vocab, LambdaConfig::new());
                r.mixer = bind(m.mixer, &mut c.mixer);
                bind_op(&mut c.lambda, &mut r);
                r.d_model = bind(m.d_model, &mut c.d_model);
                r.n_layers = bind(m.n_layers, &mut c.n_layers);
                r.heads = bind(m.heads, &mut c.heads);
                r.head_dim = bind(m.head_dim, &mut c.head_dim);
                r.d_state = bind(m.d_state, &mut c.d_state);
                r.initializer_range = bind(m.initializer_range, &mut c.initializer_range);
                c.precision = m.precision;
                Network::PaperSynthetic(c)
            }
            Arch::Mamba2 if m.mixer() == MixerKind::GatedDeltaNet => {
                let d = required("d_model", m.d_model)?;
                let mut c = LmConfig::new(
                    vocab,
                    required("n_layers", m.n_layers)?,
                    MixerConfig::new(d),
                );
                let mut g = GdnConfig::new(d);
                r.mixer = Some(MixerKind::GatedDeltaNet);
                bind_op(&mut g.lambda, &mut r);
                r.d_model = Some(d);
                r.heads = bind(m.heads, &mut g.heads);
                r.d_state = bind(m.d_state, &mut g.d_state);
                r.head_dim = bind(m.head_dim, &mut g.head_dim);
                r.conv_kernel = bind(m.conv_kernel, &mut g.conv_kernel);
                c.gdn = Some(g);
                r.n_layers = Some(c.n_layers);
                r.tie_embeddings = bind(m.tie_embeddings, &mut c.tie_embeddings);
                r.initializer_range = bind(m.initializer_range, &mut c.initializer_range);
                c.mlp_width = m.mlp_width;
                r.mlp_width = Some(c.mlp_width());
                c.precision = m.precision;
                Network::Mamba2(c)
            }
            Arch::Mamba2 => {
                let mixer = MixerConfig::new(required("d_model", m.d_model)?);
                let mut c = LmConfig::new(vocab, required("n_layers", m.n_layers)?, mixer);
                bind_op(&mut c.mixer.lambda, &mut r);
                r.mixer = Some(MixerKind::Mamba2);
                let x = &mut c.mixer;
                r.d_model = Some(x.d_model);
                r.expand = bind(m.expand, &mut x.expand);
                r.head_dim = bind(m.head_dim, &mut x.head_dim);
                r.d_state = bind(m.d_state, &mut x.d_state);
                r.n_groups = bind(m.n_groups, &mut x.n_groups);
                r.conv_kernel = bind(m.conv_kernel, &mut x.conv_kernel);
                r.n_layers = Some(c.n_layers);
                r.tie_embeddings = bind(m.tie_embeddings, &mut c.tie_embeddings);
                r.initializer_range = bind(m.initializer_range, &mut c.initializer_range);
                c.mlp_width = m.mlp_width;
                r.mlp_width = Some(c.mlp_width());
                c.precision = m.precision;
                Network::Mamba2(c)
            }
            Arch::Transformer => {
                let (d, layers) = (
                    required("d_model", m.d_model)?,
                    required("n_layers", m.n_layers)?,
                );
                let mut c = TransformerConfig::new(vocab, d, layers, required("heads", m.heads)?);
                // Position rows for the longest sequence the run reads (train or test length).
                c.max_seq_len = self.max_seq_len();
                (r.d_model, r.n_layers, r.heads) = (Some(d), Some(layers), Some(c.n_heads));
                r.tie_embeddings = bind(m.tie_embeddings, &mut c.tie_embeddings);
                r.initializer_range = bind(m.initializer_range, &mut c.initializer_range);
                c.mlp_width = m.mlp_width;
                r.mlp_width = Some(c.mlp_width());
                c.precision = m.precision;
                Network::Transformer(c)
            }
        };
        Ok((network, r))
    }

    /// Checks every value against its meaningful range and every cross-field rule; the error
    /// names the key path, the value and what is expected. Runs before a run writes anything.
    pub fn validate(&self) -> Result<()> {
        self.task.validate().map_err(|e| task_error(&e))?;
        let t = &self.train;
        let e = &self.eval;
        let lm = self.task.is_lm();
        // (holds, message): the first that fails is the error.
        let checks: Vec<(bool, String)> = vec![
            positive("train.steps", t.steps),
            positive("train.batch_size", t.batch_size),
            (
                lm || t.train_examples >= t.batch_size,
                format!(
                    "train.train_examples ({}) must be at least train.batch_size ({}): a batch holds distinct sequences",
                    t.train_examples, t.batch_size
                ),
            ),
            (
                t.lr > 0.0 && t.lr.is_finite(),
                format!("train.lr must be a positive learning rate, got {}", t.lr),
            ),
            (
                t.weight_decay >= 0.0 && t.weight_decay.is_finite(),
                format!(
                    "train.weight_decay must be ≥ 0 (0 = none), got {}",
                    t.weight_decay
                ),
            ),
            (
                (0.0..1.0).contains(&t.beta1),
                format!("train.beta1 must lie in [0, 1), got {}", t.beta1),
            ),
            (
                (0.0..1.0).contains(&t.beta2),
                format!("train.beta2 must lie in [0, 1), got {}", t.beta2),
            ),
            (
                t.eps > 0.0 && t.eps.is_finite(),
                format!(
                    "train.eps must be positive (Adam's denominator), got {}",
                    t.eps
                ),
            ),
            (
                t.grad_clip.is_none_or(|c| c > 0.0 && c.is_finite()),
                format!(
                    "train.grad_clip must be a positive norm (leave the key out for no clipping), got {}",
                    t.grad_clip.unwrap_or(f64::NAN)
                ),
            ),
            (
                t.min_lr >= 0.0 && t.min_lr.is_finite(),
                format!("train.min_lr must be ≥ 0, got {}", t.min_lr),
            ),
            (
                t.schedule != Schedule::Cosine || t.min_lr <= t.lr,
                format!(
                    "train.min_lr ({}) must not exceed train.lr ({}): the cosine schedule decays from lr to min_lr",
                    t.min_lr, t.lr
                ),
            ),
            (
                t.warmup_steps <= t.steps,
                format!(
                    "train.warmup_steps ({}) must not exceed train.steps ({})",
                    t.warmup_steps, t.steps
                ),
            ),
            positive("train.log_every", t.log_every),
            positive("train.checkpoint_every", t.checkpoint_every),
            positive("eval.every", e.every),
            positive("eval.examples", e.examples),
            positive("eval.batch_size", e.batch_size),
            (
                e.early_stop_acc.is_none_or(|a| a > 0.0 && a <= 1.0),
                format!(
                    "eval.early_stop_acc is an accuracy in (0, 1] (or false to never stop early), got {}",
                    e.early_stop_acc.unwrap_or(f64::NAN)
                ),
            ),
            (
                e.patience != Some(0),
                "eval.patience must be at least 1 evaluation when set, got 0".into(),
            ),
            (
                !(lm && e.test_seq_len.is_some()),
                "eval.test_seq_len applies to the synthetic tasks; evaluate a language model at \
                 another length with `loglinear eval RUN --set task.seq_len=T`"
                    .into(),
            ),
        ];
        if let Some((_, msg)) = checks.iter().find(|(ok, _)| !ok) {
            bail!("{msg}");
        }
        if let Some(test) = self.eval.test_seq_len {
            self.task
                .with_seq_len(test)
                .validate()
                .map_err(|e| anyhow::anyhow!("eval.test_seq_len = {test}: {}", task_error(&e)))?;
        }
        if self.model.arch == Arch::Transformer && self.model.mixer.is_some() {
            bail!(
                "model.mixer applies to arch = \"mamba2\" and \"paper_synthetic\" (the log-linear \
                 models); the transformer mixes with softmax attention: leave the key out"
            );
        }
        // The model: the library checks its config; what the run adds (the levels its longest
        // sequence needs, the chunk of the form) is checked here, for the arch that reads it.
        let (network, model) = self.bind()?;
        network
            .validate()
            .map_err(|e| anyhow::anyhow!("{} {}", key_of(&e.field), e.problem))?;
        let (levels, need) = (self.levels(), num_levels(self.max_seq_len()));
        if model.levels.is_some() && levels < need {
            bail!(
                "model.levels = {levels} is too few for sequences of length {}: need {need}",
                self.max_seq_len()
            );
        }
        if let Some(chunk) = model.chunk.filter(|c| !c.is_power_of_two()) {
            bail!("model.chunk must be a power of two, got {chunk}");
        }
        if let Some(segment) = self.model.segment {
            if self.model.form != Some(FormName::Segmented) {
                bail!(
                    "model.segment applies to form = \"segmented\" only (form is \"{}\"): \
                     leave the key out or set the form",
                    // The config names: every form's is its variant's name in lower case.
                    format!("{:?}", self.model.form.unwrap_or_default()).to_lowercase()
                );
            }
            if !segment.is_power_of_two() {
                bail!("model.segment must be a power of two (e.g. 2048), got {segment}");
            }
        }
        Ok(())
    }
}

/// The config name of an architecture (`mamba2`, ...).
fn arch_name(arch: Arch) -> &'static str {
    match arch {
        Arch::Mamba2 => "mamba2",
        Arch::PaperSynthetic => "paper_synthetic",
        Arch::Transformer => "transformer",
    }
}

/// `(value ≥ 1, "KEY must be at least 1, got 0")`.
fn positive(key: &str, value: usize) -> (bool, String) {
    (value > 0, format!("{key} must be at least 1, got {value}"))
}

/// A task's error with its key path, e.g. `task.mqar.num_kv_pairs must be at least 1`.
fn task_error(e: &crate::tasks::TaskError) -> anyhow::Error {
    match e {
        crate::tasks::TaskError::Invalid {
            task,
            field,
            constraint,
        } => anyhow::anyhow!("task.{task}.{field} {constraint}"),
    }
}

/// A config file split into the run config and its sweep axes.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    /// The base config with the overrides applied (as TOML, before typing).
    pub base: toml::Table,
    /// `[sweep]`: dotted key → values, in the file's order.
    pub sweep: Vec<(String, Vec<toml::Value>)>,
}

impl ConfigFile {
    /// Reads a TOML file and applies `key=value` overrides (values parsed as TOML; a bare word is
    /// taken as a string).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse(&text, overrides).with_context(|| format!("in config {}", path.display()))
    }

    /// [`ConfigFile::load`] from a string.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Self> {
        let mut base: toml::Table = toml::from_str(text).context("invalid TOML")?;
        let sweep: Vec<(String, Vec<toml::Value>)> = match base.remove("sweep") {
            None => Vec::new(),
            Some(toml::Value::Table(t)) => t
                .into_iter()
                .map(|(k, v)| match v {
                    toml::Value::Array(values) if !values.is_empty() => Ok((k, values)),
                    _ => bail!("sweep.\"{k}\" must be a non-empty array of values"),
                })
                .collect::<Result<_>>()?,
            Some(_) => bail!("[sweep] must be a table of key = [values]"),
        };
        let mut sweep = sweep;
        for item in overrides {
            let (key, value) = item
                .split_once('=')
                .with_context(|| format!("--set {item:?}: expected key=value"))?;
            let key = task_alias(&base, key.trim());
            let value = parse_value(value.trim());
            // An array on a swept key narrows the sweep to those values.
            if let toml::Value::Array(values) = &value
                && !values.is_empty()
                && sweep.iter().any(|(k, _)| task_alias(&base, k) == key)
            {
                for (k, swept) in sweep.iter_mut() {
                    if task_alias(&base, k) == key {
                        *swept = values.clone();
                    }
                }
                continue;
            }
            set_key(&mut base, &key, value).with_context(|| format!("--set {item:?}"))?;
            // An override pins a swept key to one value.
            sweep.retain(|(k, _)| task_alias(&base, k) != key);
        }
        Ok(Self { base, sweep })
    }

    /// The base config, typed and validated.
    pub fn config(&self) -> Result<ExperimentConfig> {
        typed(self.base.clone())
    }

    /// Every combination of the sweep axes (the cartesian product, last key fastest), each with a
    /// name built from the swept values.
    pub fn expand(&self) -> Result<Vec<(String, ExperimentConfig)>> {
        let keys: Vec<&String> = self.sweep.iter().map(|(k, _)| k).collect();
        let mut combos: Vec<Vec<&toml::Value>> = vec![vec![]];
        for (_, values) in &self.sweep {
            combos = combos
                .into_iter()
                .flat_map(|prefix| {
                    values.iter().map(move |v| {
                        let mut c = prefix.clone();
                        c.push(v);
                        c
                    })
                })
                .collect();
        }
        combos
            .into_iter()
            .map(|values| {
                let mut table = self.base.clone();
                let mut parts = Vec::new();
                for (key, value) in keys.iter().zip(values) {
                    set_key(&mut table, &task_alias(&self.base, key), value.clone())
                        .with_context(|| format!("sweep key {key:?}"))?;
                    parts.push(format!("{}={}", short_key(key), value_label(value)));
                }
                let name = if parts.is_empty() {
                    "run".to_string()
                } else {
                    parts.join(",")
                };
                let config = typed(table).with_context(|| format!("sweep point {name}"))?;
                Ok((name, config))
            })
            .collect()
    }
}

/// Types and validates a TOML table; unknown keys and wrong types name the key path.
pub fn typed(table: toml::Table) -> Result<ExperimentConfig> {
    let value = toml::Value::Table(table);
    let config: ExperimentConfig = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        anyhow::anyhow!("at key `{path}`: {}", e.into_inner())
    })?;
    config.validate()?;
    Ok(config)
}

fn parse_value(text: &str) -> toml::Value {
    // A TOML literal if it parses as one (numbers, booleans, arrays, quoted strings), else a string.
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// `task.X` names key X of whichever task the config has (`task.seq_len` →
/// `task.mqar.seq_len`), so overrides need not repeat the task's name.
fn task_alias(table: &toml::Table, key: &str) -> String {
    if let Some(rest) = key.strip_prefix("task.")
        && let Some(toml::Value::Table(task)) = table.get("task")
        && task.len() == 1
        && let Some(variant) = task.keys().next()
        && !rest.starts_with(&format!("{variant}."))
        && rest != variant
    {
        return format!("task.{variant}.{rest}");
    }
    key.to_string()
}

fn set_key(table: &mut toml::Table, dotted: &str, value: toml::Value) -> Result<()> {
    let parts: Vec<&str> = dotted.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        bail!("empty segment in key {dotted:?}");
    }
    let mut cur = table;
    for part in &parts[..parts.len() - 1] {
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match entry {
            toml::Value::Table(t) => t,
            _ => bail!("key {dotted:?}: {part:?} is a value, not a table"),
        };
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

fn short_key(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

fn value_label(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `eval.early_stop_acc` in a config: an accuracy, or `false` for none (TOML has no null, and a
/// key left out means the default). Written back the same way, so a run's `config.toml` reads
/// back as the config it ran.
mod early_stop {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(acc) => s.serialize_f64(*acc),
            None => s.serialize_bool(false),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        struct AccuracyOrFalse;
        impl<'v> Visitor<'v> for AccuracyOrFalse {
            type Value = Option<f64>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an accuracy in (0, 1], e.g. 0.99, or false to never stop early")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                if v {
                    Err(E::invalid_value(de::Unexpected::Bool(true), &self))
                } else {
                    Ok(None)
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Some(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Some(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Some(v as f64))
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<S: Deserializer<'v>>(self, d: S) -> Result<Self::Value, S::Error> {
                d.deserialize_any(AccuracyOrFalse)
            }
        }
        d.deserialize_any(AccuracyOrFalse)
    }
}
