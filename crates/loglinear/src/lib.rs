//! # loglinear
//!
//! Log-linear attention (Guo et al., arXiv 2506.04761) with adaptive memory decay, on Burn.
//!
//! * [`fenwick`]: the level structure (integer functions);
//! * [`ops`]: the core op in its parallel, chunked and recurrent forms;
//! * [`nn`]: the log-linear Mamba-2 mixer, the λ modes and the language model, with decoding.

pub mod fenwick;
pub mod nn;
pub mod ops;
pub mod testing;

pub use ops::{AttnOutput, FenwickState, Form, LogLinearInput, log_linear_attn};
