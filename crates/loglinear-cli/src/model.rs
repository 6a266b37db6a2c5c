//! The networks a run can train, behind one type, and the masked next-token loss.

use burn::prelude::*;
use loglinear::nn::{LogLinearLm, SyntheticLm, TransformerLm, cross_entropy_rows};

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
    /// `[B, T, V]`.
    pub logits: Tensor<3>,
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
                    logits: out.logits,
                    lambda: out.lambda,
                }
            }
            Model::PaperSynthetic(m) => {
                let (logits, lambda) = m.run(tokens, form, trace);
                Forward { logits, lambda }
            }
            Model::Transformer(m) => Forward {
                logits: m.run(tokens),
                lambda: Vec::new(),
            },
        }
    }
}

/// Mean cross-entropy over the positions whose target is not [`IGNORE`], and their count.
/// Targets are already aligned with the logits (position `p` predicts `targets[p]`): no shift
/// happens here.
///
/// # Shapes
/// `logits: [B, T, V]`, `targets: [B, T]` → scalar `[1]`.
pub fn masked_cross_entropy(logits: Tensor<3>, targets: Tensor<2, Int>) -> (Tensor<1>, usize) {
    let [b, t, v] = logits.dims();
    let targets = targets.reshape([b * t]);
    let scored = targets.clone().not_equal_elem(IGNORE); // [B·T]
    let count = scored.clone().int().sum().into_scalar::<i64>().max(0) as usize;
    let safe = targets.mask_fill(scored.clone().bool_not(), 0);
    // −log p(target) per position: fused kernels on GPUs, tensor ops on the CPU.
    let nll = cross_entropy_rows(logits.reshape([b * t, v]), safe); // [B·T], the logits' float dtype
    let weight = scored.float().cast(nll.dtype());
    let loss = (nll * weight).sum() / (count.max(1) as f64);
    (loss, count)
}
