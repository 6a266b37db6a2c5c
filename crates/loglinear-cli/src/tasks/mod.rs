//! Synthetic recall tasks: data generators, batching and masked accuracy.
//!
//! A task is a typed config ([`TaskConfig`]) that validates its preconditions and generates a pool
//! of [`Example`]s from one seed. Every example is a token sequence `inputs` of length
//! [`TaskConfig::seq_len`] plus a `targets` sequence of the same length, where `targets[p]` is what
//! the model must output **at** position `p`. The generators apply the usual one-token label shift
//! themselves, exactly once, so the training loop compares `logits[p]` with `targets[p]` and never
//! shifts again (the adaptive-decay code shifted twice for its language model, spec §6.4.3).
//! Positions that are not scored carry [`IGNORE`] (−100, PyTorch's `ignore_index`).
//!
//! Tasks:
//! * [`MqarConfig`]: multi-query associative recall, in the zoology layout (spec §7.4, power-law
//!   query gaps) or the adaptive-decay fork's layout (spec §7.2.1, all queries at the end).
//! * [`SelectiveCopyConfig`]: selective copying (spec §7.2.4).
//!
//! # Randomness
//! Generation is deterministic given the seed: one [`rand::rngs::StdRng`] is seeded with
//! `StdRng::seed_from_u64(seed)` and draws the examples one after the other. The distributions
//! follow the Python generators, but the streams do not: bit-exact reproduction of numpy's legacy
//! MT19937 draws is not attempted, so the same seed gives different (equally distributed) data
//! than zoology or the fork. The fork used seed = run seed for the training pool and run seed + 1
//! for the validation pool (spec §7.2.1); callers choose seeds the same way. The worked examples
//! in the generators' docs pin the exact tokens of rand 0.9's `StdRng` for one seed, so a rand
//! upgrade that changes the stream shows up there first.
//!
//! In TOML a task is written as an externally tagged table, e.g.
//! `task = { mqar = { vocab_size = 8192, seq_len = 256, num_kv_pairs = 16 } }` or
//! `task = { selective_copy = { seq_len = 256 } }`; unknown keys are errors.

use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};

pub mod lm;
pub mod mqar;
pub mod selective_copy;

pub use lm::LmTaskConfig;
pub use mqar::{MqarConfig, MqarLayout};
pub use selective_copy::SelectiveCopyConfig;

/// Target value of a position that is not scored (PyTorch's `ignore_index`).
pub const IGNORE: i64 = -100;

/// One sequence. `targets[p]` is what the model must output AT position p (labels already shifted
/// exactly once, by the generator); [`IGNORE`] = not scored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// Input tokens, length T.
    pub inputs: Vec<u32>,
    /// Target token at each position, or [`IGNORE`]; length T.
    pub targets: Vec<i64>,
}

impl Example {
    /// Number of scored positions (targets other than [`IGNORE`]).
    pub fn num_scored(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE).count()
    }
}

/// Three aligned rows: position, input token, target (`·` = [`IGNORE`]).
impl fmt::Display for Example {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = |t: i64| {
            if t == IGNORE {
                "·".to_string()
            } else {
                t.to_string()
            }
        };
        let width = (0..self.inputs.len())
            .map(|p| {
                let t = self
                    .targets
                    .get(p)
                    .map_or(1, |&t| target(t).chars().count());
                p.to_string()
                    .len()
                    .max(self.inputs[p].to_string().len())
                    .max(t)
            })
            .max()
            .unwrap_or(1);
        let row = |f: &mut fmt::Formatter<'_>, name: &str, cells: Vec<String>| {
            write!(f, "{name:<8}")?;
            for c in cells {
                write!(f, " {c:>width$}")?;
            }
            writeln!(f)
        };
        row(
            f,
            "pos",
            (0..self.inputs.len()).map(|p| p.to_string()).collect(),
        )?;
        row(
            f,
            "inputs",
            self.inputs.iter().map(|x| x.to_string()).collect(),
        )?;
        row(
            f,
            "targets",
            self.targets.iter().map(|&t| target(t)).collect(),
        )
    }
}

/// A flat batch, row-major `[B, T]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Input tokens, `batch · seq_len` values, row-major `[B, T]`.
    pub inputs: Vec<u32>,
    /// Targets (or [`IGNORE`]), row-major `[B, T]`.
    pub targets: Vec<i64>,
    /// B, the number of rows.
    pub batch: usize,
    /// T, the length of every row.
    pub seq_len: usize,
}

/// A named range of positions, for plots (e.g. the key-value region of an MQAR sequence).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// Human-readable name, e.g. `"context"`.
    pub name: String,
    /// Positions `start..end` of the region.
    pub range: Range<usize>,
}

impl Region {
    pub(crate) fn new(name: &str, range: Range<usize>) -> Self {
        Region {
            name: name.to_string(),
            range,
        }
    }
}

/// A task config that breaks a precondition of its generator.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// `task.field` breaks `constraint`; the message names both and the offending values.
    #[error("invalid {task} config: {field}: {constraint}")]
    Invalid {
        /// The task, e.g. `"mqar"`.
        task: &'static str,
        /// The config field at fault, e.g. `"num_kv_pairs"`.
        field: &'static str,
        /// What is required and what was given.
        constraint: String,
    },
}

impl TaskError {
    pub(crate) fn invalid(task: &'static str, field: &'static str, constraint: String) -> Self {
        TaskError::Invalid {
            task,
            field,
            constraint,
        }
    }

    /// The config field the error is about.
    pub fn field(&self) -> &'static str {
        match self {
            TaskError::Invalid { field, .. } => field,
        }
    }
}

/// Which synthetic task to train and evaluate on; one variant per task.
///
/// New tasks (the language-model task, for one) are added as further variants, each with its own
/// config struct and module; every method below then gains one match arm.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TaskConfig {
    /// Multi-query associative recall.
    Mqar(MqarConfig),
    /// Selective copying.
    SelectiveCopy(SelectiveCopyConfig),
    /// Language modelling on prepared token files (no generator: the data come from disk).
    Lm(LmTaskConfig),
}

impl TaskConfig {
    /// Checks every precondition of the generator; the error names the field and the constraint.
    pub fn validate(&self) -> Result<(), TaskError> {
        match self {
            TaskConfig::Mqar(c) => c.validate(),
            TaskConfig::SelectiveCopy(c) => c.validate(),
            TaskConfig::Lm(c) => c.validate(),
        }
    }

    /// Size of the token vocabulary (every input and target is `< vocab_size`).
    pub fn vocab_size(&self) -> usize {
        match self {
            TaskConfig::Mqar(c) => c.vocab_size,
            TaskConfig::SelectiveCopy(c) => c.vocab_size,
            TaskConfig::Lm(c) => c.vocab_size,
        }
    }

    /// Sequence length T of every example.
    pub fn seq_len(&self) -> usize {
        match self {
            TaskConfig::Mqar(c) => c.seq_len,
            TaskConfig::SelectiveCopy(c) => c.seq_len,
            TaskConfig::Lm(c) => c.seq_len,
        }
    }

    /// Whether this is the language-model task (data from disk, perplexity metrics).
    pub fn is_lm(&self) -> bool {
        matches!(self, TaskConfig::Lm(_))
    }

    /// `n` examples drawn from one `StdRng::seed_from_u64(seed)`; validates the config first.
    pub fn generate(&self, n: usize, seed: u64) -> Result<Vec<Example>, TaskError> {
        match self {
            TaskConfig::Mqar(c) => c.generate(n, seed),
            TaskConfig::SelectiveCopy(c) => c.generate(n, seed),
            TaskConfig::Lm(_) => Err(TaskError::invalid(
                "lm",
                "data",
                "language-model data come from a prepared directory, not a generator".into(),
            )),
        }
    }

    /// Named position ranges for plots; they tile `0..seq_len` in order.
    pub fn regions(&self) -> Vec<Region> {
        match self {
            TaskConfig::Mqar(c) => c.regions(),
            TaskConfig::SelectiveCopy(c) => c.regions(),
            TaskConfig::Lm(c) => vec![Region::new("text", 0..c.seq_len)],
        }
    }

    /// Short description, e.g. `"mqar(zoology, V=8192, T=256, K=16)"`.
    pub fn name(&self) -> String {
        match self {
            TaskConfig::Mqar(c) => c.name(),
            TaskConfig::SelectiveCopy(c) => c.name(),
            TaskConfig::Lm(c) => c.name(),
        }
    }

    /// A copy with the sequence length replaced (for test-length evaluation: train at T, evaluate
    /// at T' > T). Everything else (K, M, vocabulary, layout) is kept; the copy is not validated.
    pub fn with_seq_len(&self, t: usize) -> TaskConfig {
        let mut c = self.clone();
        match &mut c {
            TaskConfig::Mqar(c) => c.seq_len = t,
            TaskConfig::SelectiveCopy(c) => c.seq_len = t,
            TaskConfig::Lm(c) => c.seq_len = t,
        }
        c
    }
}

/// Gathers `examples[i]` for each `i` in `indices` into one row-major `[B, T]` batch.
///
/// Panics if an index is out of range or the rows differ in length (a programmer error).
pub fn batch(examples: &[Example], indices: &[usize]) -> Batch {
    let seq_len = indices.first().map_or(0, |&i| examples[i].inputs.len());
    let mut inputs = Vec::with_capacity(indices.len() * seq_len);
    let mut targets = Vec::with_capacity(indices.len() * seq_len);
    for &i in indices {
        let ex = &examples[i];
        assert!(
            ex.inputs.len() == seq_len && ex.targets.len() == seq_len,
            "batch: example {i} has {} inputs and {} targets, expected {seq_len}",
            ex.inputs.len(),
            ex.targets.len()
        );
        inputs.extend_from_slice(&ex.inputs);
        targets.extend_from_slice(&ex.targets);
    }
    Batch {
        inputs,
        targets,
        batch: indices.len(),
        seq_len,
    }
}

/// `(correct, scored)`: among the positions whose target is not [`IGNORE`], how many predictions
/// equal the target. Accuracy is `correct / scored` (spec §7.2.3: query positions only).
///
/// ```
/// use loglinear_cli::tasks::{masked_accuracy, IGNORE};
/// assert_eq!(masked_accuracy(&[5, 7, 9, 1], &[IGNORE, 7, 8, IGNORE]), (1, 2));
/// ```
///
/// Panics if the two slices differ in length.
pub fn masked_accuracy(predictions: &[u32], targets: &[i64]) -> (usize, usize) {
    assert_eq!(
        predictions.len(),
        targets.len(),
        "masked_accuracy: {} predictions for {} targets",
        predictions.len(),
        targets.len()
    );
    predictions
        .iter()
        .zip(targets)
        .filter(|&(_, &t)| t != IGNORE)
        .fold((0, 0), |(correct, scored), (&p, &t)| {
            (correct + usize::from(i64::from(p) == t), scored + 1)
        })
}
