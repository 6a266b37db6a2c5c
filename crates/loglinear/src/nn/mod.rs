//! Modules: the λ modes, the log-linear Mamba-2 and Gated DeltaNet mixers and the models.

pub mod check;
pub mod gdn_mixer;
pub mod init;
pub mod lambda;
pub mod loss;
pub mod mixer;
pub mod model;
pub mod packed;
pub mod synthetic;
pub mod transformer;

pub use check::ConfigError;
pub use gdn_mixer::{GdnConfig, LogLinearGatedDeltaNet};
pub use init::{PaddedLogits, Precision, VOCAB_PAD};
pub use lambda::{LambdaConfig, LambdaInit, LambdaMlp, LambdaMode, LevelWeights};
pub use loss::{cross_entropy_padded_tokens, cross_entropy_rows, cross_entropy_tokens};
pub use mixer::{LogLinearMamba2, MixerConfig, MixerKind, MixerOutput, MixerState};
pub use model::{LmConfig, LmOutput, LogLinearLm, ModelState};
pub use packed::{PackedLambdaMlp, PackedSyntheticLm, packable};
pub use synthetic::{SyntheticConfig, SyntheticLm};
pub use transformer::{TransformerConfig, TransformerLm, TransformerState};
