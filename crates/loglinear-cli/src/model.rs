//! The networks a run can train, behind one type, and the masked next-token loss.

use anyhow::{Result, bail};
use burn::prelude::*;
use loglinear::nn::{
    cross_entropy_rows,
    LambdaConfig, LmConfig, LogLinearLm, MixerConfig, SyntheticConfig, SyntheticLm,
    TransformerConfig, TransformerLm,
};

use crate::config::{Arch, ExperimentConfig};
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

fn lambda_config(config: &ExperimentConfig) -> LambdaConfig {
    LambdaConfig {
        mode: config.model.lambda,
        levels: config.levels(),
        mlp_hidden: config.model.mlp_hidden,
    }
}

fn mamba2_config(config: &ExperimentConfig) -> LmConfig {
    let m = &config.model;
    LmConfig {
        vocab_size: config.task.vocab_size(),
        n_layers: m.n_layers,
        mixer: MixerConfig {
            expand: m.expand,
            head_dim: m.head_dim,
            d_state: m.d_state,
            n_groups: m.n_groups,
            conv_kernel: m.conv_kernel,
            lambda: lambda_config(config),
            ..MixerConfig::new(m.d_model)
        },
        mlp_width: m.mlp_width,
        tie_embeddings: m.tie_embeddings,
        norm_eps: 1e-5,
        initializer_range: m.initializer_range,
        precision: m.precision,
    }
}

fn synthetic_config(config: &ExperimentConfig) -> SyntheticConfig {
    let m = &config.model;
    SyntheticConfig {
        vocab_size: config.task.vocab_size(),
        d_model: m.d_model,
        n_layers: m.n_layers,
        heads: m.heads,
        d_state: m.d_state,
        head_dim: m.head_dim,
        lambda: lambda_config(config),
        initializer_range: m.initializer_range,
        precision: m.precision,
    }
}

fn transformer_config(config: &ExperimentConfig) -> TransformerConfig {
    let m = &config.model;
    TransformerConfig {
        max_seq_len: config.max_seq_len(),
        tie_embeddings: m.tie_embeddings,
        mlp_width: m.mlp_width,
        initializer_range: m.initializer_range,
        precision: m.precision,
        ..TransformerConfig::new(config.task.vocab_size(), m.d_model, m.n_layers, m.heads)
    }
}

/// Checks the architecture-specific sizes of a run config.
pub fn check_model_config(config: &ExperimentConfig) -> Result<()> {
    let result = match config.model.arch {
        Arch::Mamba2 => mamba2_config(config).validate(),
        Arch::PaperSynthetic => synthetic_config(config).validate(),
        Arch::Transformer => transformer_config(config).validate(),
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) => bail!("model: {e}"),
    }
}

impl Model {
    /// Builds the network of `config` with its init, drawn from `config.seed`.
    pub fn new(config: &ExperimentConfig, device: &Device) -> Self {
        match config.model.arch {
            Arch::Mamba2 => Model::Mamba2(mamba2_config(config).init(config.seed, device)),
            Arch::PaperSynthetic => {
                Model::PaperSynthetic(synthetic_config(config).init(config.seed, device))
            }
            Arch::Transformer => {
                Model::Transformer(transformer_config(config).init(config.seed, device))
            }
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
