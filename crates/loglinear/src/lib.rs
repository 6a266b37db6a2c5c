//! # loglinear
//!
//! Log-linear attention (Guo et al., arXiv 2506.04761) with adaptive memory decay, on Burn.
//!
//! * [`fenwick`]: the level structure (integer functions);
//! * [`ops`]: the core op in its parallel, chunked and recurrent forms, and the fused form;
//!   [`ops::gdn`]: the same forms for log-linear Gated DeltaNet;
//! * `ops::fused` and `kernels` (features `cuda`, `wgpu`): the CubeCL kernels of `Form::Fused`
//!   and of the language model's softmax cross-entropy;
//! * [`nn`]: the log-linear Mamba-2 and Gated DeltaNet mixers, the λ modes and the language
//!   models, with decoding;
//! * [`host`]: host (f64) copies of tensors and inputs, the op as plain f64 loops, and how far
//!   two results are apart;
//! * [`testing`]: checking one implementation against another (gradients of any form, assertions
//!   that report what differs, replayable test seeds, the fused-kernel check).
//!
//! ```
//! use burn::prelude::*;
//! use burn::tensor::DType;
//! use loglinear::ops::{Dims, Form, LogLinearInput, log_linear_attn};
//!
//! let device = Device::flex();
//! // q, k: [B, T, H, N]; v: [B, T, H, P]; g: [B, T, H] (log-decay ≤ 0); lambda: [B, T, H, L]
//! let x = LogLinearInput::random(Dims { b: 1, t: 200, h: 4, n: 16, p: 16, l: 9 }, 0, DType::F32, &device);
//! let out = log_linear_attn(&x, Form::Chunked { chunk: 64 }, None, true);
//! assert_eq!(out.o.dims(), [1, 200, 4, 16]);
//! let state = out.state.unwrap(); // after token 199: [B, H, L, N, P], position 200
//! assert_eq!(state.position, 200);
//! // Continue from the state, e.g. token by token with the recurrent form.
//! let next = log_linear_attn(&x.narrow(0, 10), Form::Recurrent, Some(&state), true);
//! assert_eq!(next.state.unwrap().position, 210);
//! ```
//!
//! A model, prefilled with the chunked form and decoded token by token:
//!
//! ```
//! use burn::prelude::*;
//! use burn::tensor::TensorData;
//! use loglinear::nn::{LambdaMode, LmConfig, MixerConfig};
//! use loglinear::ops::Form;
//!
//! let device = Device::flex();
//! let mut config = LmConfig::new(100, 2, MixerConfig::new(32)); // vocab, layers, mixer of width 32
//! config.mixer.head_dim = 16;
//! config.mixer.d_state = 8;
//! config.mixer.lambda.mode = LambdaMode::MlpSoftplus;
//! let model = config.init(0, &device); // seed 0: the same weights on every backend
//! let tokens = Tensor::<2, Int>::from_data(TensorData::new((0..24i64).collect::<Vec<_>>(), [2, 12]), &device);
//! let logits = model.forward(tokens.clone(), Form::Chunked { chunk: 64 }); // [B, T, V]
//! let (prompt_logits, mut state) = model.prefill(tokens, 64);
//! let next = model.step(Tensor::from_data(TensorData::new(vec![5i64, 7], [2]), &device), &mut state);
//! assert_eq!(next.dims(), [2, 100]);
//! assert_eq!(state.position(), 13);
//! ```

pub mod fenwick;
pub mod host;
#[cfg(feature = "kernels")]
pub mod kernels;
pub mod linalg;
pub mod nn;
pub mod ops;
pub mod testing;

pub use ops::{AttnOutput, FenwickState, Form, LogLinearInput, log_linear_attn};
