//! The networks a run can train, behind one type, and the masked next-token loss.

use burn::prelude::*;
use loglinear::nn::{
    LogLinearLm, PaddedLogits, SyntheticLm, TransformerLm, cross_entropy_padded_tokens,
};

use crate::config::{ExperimentConfig, Network};
use crate::tasks::IGNORE;

/// A trainable network.
#[derive(Module, Debug)]
pub enum Model {
    /// Log-linear Mamba-2 LM.
    Mamba2(LogLinearLm),
    /// The adaptive-decay paper's synthetic-task model.
    PaperSynthetic(SyntheticLm),
    /// A GPT-2-style causal softmax Transformer (the LM baseline).
    Transformer(TransformerLm),
}

/// What a forward pass returns.
pub struct Forward {
    /// The logits, over the vocabulary padded for the head's product in the language models
    /// (`logits.logits()` is the `[B, T, V]` view; the loss reads the padded tensor).
    pub logits: PaddedLogits,
    /// λ per layer `[B, T, H, L]`, when traced.
    pub lambda: Vec<Tensor<4>>,
}

impl Model {
    /// Builds the network of `config` with its init, drawn from `config.seed`.
    ///
    /// # Panics
    /// If `config` was not validated ([`ExperimentConfig::validate`]: every config read from a
    /// file is) and lacks a key its architecture requires.
    pub fn new(config: &ExperimentConfig, device: &Device) -> Self {
        let network = config
            .network()
            .unwrap_or_else(|e| panic!("Model::new on a config that was not validated: {e:#}"));
        let seed = config.seed;
        match network {
            Network::Mamba2(c) => Model::Mamba2(c.init(seed, device)),
            Network::PaperSynthetic(c) => Model::PaperSynthetic(c.init(seed, device)),
            Network::Transformer(c) => Model::Transformer(c.init(seed, device)),
        }
    }

    /// Logits (and λ when `trace`).
    ///
    /// # Shapes
    /// `tokens: [B, T]` → logits `[B, T, V]`.
    pub fn forward(&self, tokens: Tensor<2, Int>, form: loglinear::Form, trace: bool) -> Forward {
        match self {
            Model::Mamba2(m) => {
                let out = m.run(tokens, form, None, false, trace);
                Forward {
                    logits: out.head,
                    lambda: out.lambda,
                }
            }
            Model::PaperSynthetic(m) => {
                let (logits, lambda) = m.run(tokens, form, trace);
                Forward {
                    logits: logits.into(),
                    lambda,
                }
            }
            Model::Transformer(m) => Forward {
                logits: m.run_padded(tokens),
                lambda: Vec::new(),
            },
        }
    }
}

/// Mean cross-entropy over the positions whose target is not [`IGNORE`], and their count (read
/// back from the device: evaluation wants it; training calls [`masked_mean_cross_entropy`],
/// which waits for nothing).
/// Targets are already aligned with the logits (position `p` predicts `targets[p]`): no shift
/// happens here.
///
/// # Shapes
/// `logits: [B, T, V]` (or padded, [`PaddedLogits`]), `targets: [B, T]` → scalar `[1]`.
pub fn masked_cross_entropy(
    logits: impl Into<PaddedLogits>,
    targets: Tensor<2, Int>,
) -> (Tensor<1>, usize) {
    let count = targets.clone().not_equal_elem(IGNORE).int().sum();
    let count = count.into_scalar::<i64>().max(0) as usize;
    (masked_mean_cross_entropy(logits, targets), count)
}

/// [`masked_cross_entropy`]'s loss alone, with no read back to the host: a read in the middle of
/// a training step would leave the GPU idle while the host queues the backward.
///
/// # Shapes
/// `logits: [B, T, V]` (or padded, [`PaddedLogits`]), `targets: [B, T]` → scalar `[1]`.
pub fn masked_mean_cross_entropy(
    logits: impl Into<PaddedLogits>,
    targets: Tensor<2, Int>,
) -> Tensor<1> {
    let (nll, weight) = scored_nll(logits, targets);
    nll.sum() / weight.sum().clamp_min(1.0)
}

/// The sum of the cross-entropy over the positions whose target is not [`IGNORE`] (a
/// data-parallel replica's share of the global loss is this over the global batch's scored
/// positions: [`crate::data_parallel`]).
///
/// # Shapes
/// `logits: [B, T, V]` (or padded, [`PaddedLogits`]), `targets: [B, T]` → scalar `[1]`.
pub fn masked_sum_cross_entropy(
    logits: impl Into<PaddedLogits>,
    targets: Tensor<2, Int>,
) -> Tensor<1> {
    scored_nll(logits, targets).0.sum()
}

/// `(−log p(target) · scored, scored)` per position, `scored` 1 where the target is not
/// [`IGNORE`], 0 elsewhere.
///
/// # Shapes
/// `logits: [B, T, V]` (or padded), `targets: [B, T]` → `([B, T], [B, T])`.
fn scored_nll(logits: impl Into<PaddedLogits>, targets: Tensor<2, Int>) -> (Tensor<2>, Tensor<2>) {
    let scored = targets.clone().not_equal_elem(IGNORE); // [B, T]
    let safe = targets.mask_fill(scored.clone().bool_not(), 0);
    // −log p(target) per position (f32): fused kernels on GPUs, which read the (padded) logits
    // where they lie (a reshape of pitched rows, or a view of the first V columns, would copy
    // them), tensor ops on the CPU.
    let nll = cross_entropy_padded_tokens(&logits.into(), safe); // [B, T]
    let weight = scored.float().cast(nll.dtype());
    (nll * weight.clone(), weight)
}
