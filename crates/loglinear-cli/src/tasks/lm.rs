//! Language modelling on a prepared token directory (`loglinear data prepare`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::TaskError;

/// Next-token prediction on GPT-2 token files.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LmTaskConfig {
    /// Directory written by `loglinear data prepare` (train.bin, valid.bin, meta.json).
    pub data: PathBuf,
    /// Window length T.
    pub seq_len: usize,
    /// Vocabulary size of the model (GPT-2: 50257); checked against the data's meta.json.
    #[serde(default = "gpt2_vocab")]
    pub vocab_size: usize,
    /// Split evaluated during training (`valid` or `validation`, or `test`).
    #[serde(default = "valid")]
    pub eval_split: String,
    /// Evaluate on the first this-many windows only (default: the whole split).
    #[serde(default)]
    pub max_eval_windows: Option<usize>,
}

fn gpt2_vocab() -> usize {
    50257
}
fn valid() -> String {
    "valid".into()
}

impl LmTaskConfig {
    /// Checks sizes (the data directory itself is checked when it is opened).
    pub fn validate(&self) -> Result<(), TaskError> {
        if self.seq_len == 0 {
            return Err(TaskError::invalid(
                "lm",
                "seq_len",
                "must be positive".into(),
            ));
        }
        if self.vocab_size == 0 {
            return Err(TaskError::invalid(
                "lm",
                "vocab_size",
                "must be positive".into(),
            ));
        }
        if self.max_eval_windows == Some(0) {
            return Err(TaskError::invalid(
                "lm",
                "max_eval_windows",
                "must be positive when set".into(),
            ));
        }
        Ok(())
    }

    /// E.g. `lm(data/sotu, T=512)`.
    pub fn name(&self) -> String {
        format!("lm({}, T={})", self.data.display(), self.seq_len)
    }
}
