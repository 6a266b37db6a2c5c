//! Log-linear Gated DeltaNet ("H-GDN", spec §5): the core operator in the same three forms as
//! the Mamba-2 op, with the same [`FenwickState`] and [`Form`].
//!
//! ```text
//! S^(ℓ) ← 𝒜_t S^(ℓ) for every level,  𝒜_t = a_t (I − β_t k_t k_tᵀ),  a_t = exp(g_t)
//! S^(0) = β_t k_t v_tᵀ                   (after the Fenwick carry)
//! o_t   = Σ_ℓ λ_t^(ℓ) q_tᵀ S^(ℓ)          (no 1/√N factor; q, k taken as given)
//! o_t   = Σ_{s≤t} λ_t^(level(t,s)) · q_tᵀ (𝒜_t ⋯ 𝒜_{s+1}) β_s k_s · v_s     (quadratic form)
//! ```
//!
//! `λ ≡ 1` is the plain gated delta rule `S_t = 𝒜_t S_{t−1} + β_t k_t v_tᵀ`, `o_t = S_tᵀ q_t`.
//!
//! * [`Form::Parallel`] ([`parallel`]): the quadratic form, the definition and the test oracle;
//! * [`Form::Chunked`] ([`chunked`]): UT transform inside a chunk, then one tree of chunk-block
//!   states and transitions whose levels are the chunk levels: O(T log T);
//! * [`Form::Recurrent`] ([`recurrent`], [`recurrent_step`]): the O(log T) Fenwick state stepped
//!   token by token (the decoder);
//! * [`Form::Fused`]: there are no Gated DeltaNet kernels; it is `Chunked { chunk: 64 }`.
//!
//! The derivations are in `ops/gdn/README.md`. Every form continues from and can return a
//! Fenwick state and is differentiable through Burn's autodiff (gradients for q, k, v, g, β, λ
//! and the initial state).
//!
//! ```
//! use burn::prelude::*;
//! use burn::tensor::DType;
//! use loglinear::ops::gdn::{GdnInput, gdn_attn};
//! use loglinear::ops::{Dims, Form};
//!
//! let device = Device::flex();
//! // q, k: [B, T, H, N]; v: [B, T, H, P]; g, beta: [B, T, H]; lambda: [B, T, H, L]
//! let x = GdnInput::random(Dims { b: 1, t: 70, h: 2, n: 16, p: 32, l: 8 }, 0, DType::F32, &device);
//! let out = gdn_attn(&x, Form::Chunked { chunk: 16 }, None, true);
//! assert_eq!(out.o.dims(), [1, 70, 2, 32]);
//! let state = out.state.unwrap(); // [B, H, L, N, P], position 70
//! // Decode the next tokens from the state.
//! let next = gdn_attn(&x.narrow(0, 3), Form::Recurrent, Some(&state), true);
//! assert_eq!(next.state.unwrap().position, 73);
//! ```

mod chunked;
mod dispatch;
mod input;
mod parallel;
mod recurrent;

pub use chunked::chunked;
pub use dispatch::gdn_attn;
pub use input::GdnInput;
pub use parallel::parallel;
pub use recurrent::{recurrent, recurrent_step};

#[cfg(doc)]
use super::Form;
use super::{AttnOutput, FenwickState, zeros_as};

/// The result of a form on a segment of no tokens: no outputs, the state unchanged.
fn empty_segment(x: &GdnInput, initial: Option<&FenwickState>, return_state: bool) -> AttnOutput {
    let d = x.dims();
    let state = return_state.then(|| match initial {
        Some(s) => s.clone(),
        None => FenwickState::empty(d.b, d.h, d.l, d.n, d.p, x.dtype(), &x.device()),
    });
    AttnOutput {
        o: zeros_as(&x.v, [d.b, 0, d.h, d.p]),
        state,
    }
}
