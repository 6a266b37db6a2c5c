//! The log-linear attention operator in its three equivalent forms (spec §3).
//!
//! ```text
//! o[t] = Σ_{s≤t} λ[t, level(t,s)] · exp(Γ[t] − Γ[s]) · (q[t]·k[s]) · v[s],   Γ = cumsum(g)
//! ```
//!
//! * [`Form::Parallel`]: the quadratic masked form, the definition and the test oracle;
//! * [`Form::Chunked`]: the chunkwise O(T log T) algorithm (intra-chunk blocks plus one
//!   vectorised pass per chunk level);
//! * [`Form::Recurrent`]: the O(log T) Fenwick state stepped token by token (also the decoder);
//! * [`Form::Fused`]: the fused CubeCL kernels ([`fused`], features `cuda`/`wgpu`) where they
//!   run (else the chunked form);
//! * [`Form::Segmented`]: the same kernels walking aligned segments in parallel, the pairs across
//!   segments from per-segment states (for long sequences with few heads; without kernels the
//!   tensor form [`segmented`]), and
//!   [`Form::Auto`]: whichever of the two is faster for the inputs at hand ([`auto_form`]).
//!
//! All forms take the same [`LogLinearInput`], an optional initial [`FenwickState`], and can
//! return the final state; all are built from Burn tensor ops and so differentiable through
//! autodiff, in whatever float dtype the inputs carry (f32, f64, bf16). The derivations are in
//! `ops/README.md`.
//!
//! Files by job: `input.rs` (the inputs and their sizes), `dispatch.rs` ([`Form`], the choice of [`Form::Auto`]
//! and [`log_linear_attn`]), one file per form, `state.rs` ([`FenwickState`] and the state math the
//! parallel and chunked forms share: reading an initial state, building the final one),
//! `tensor.rs` (small tensor helpers), `random.rs` (random inputs for tests and benchmarks),
//! `fused/` (the kernels of the fused form, their planner and launchers; `fused/README.md`).
//!
//! [`gdn`] is the Gated DeltaNet variant of the op (spec §5): the same three forms, the same
//! Fenwick state, with the delta-rule transition `a_t (I − β_t k_t k_tᵀ)` in place of the scalar
//! decay.

mod chunked;
mod dispatch;
#[cfg(feature = "kernels")]
pub mod fused;
pub mod gdn;
mod input;
mod parallel;
mod random;
mod recurrent;
mod segmented;
mod state;
mod tensor;

pub use chunked::chunked;
pub use dispatch::{
    AttnOutput, DEFAULT_CHUNK, Form, TENSOR_CORE_TILE, auto_form, log_linear_attn, on_tensor_cores,
};
pub use input::{Dims, LogLinearInput};
pub use parallel::parallel;
pub use recurrent::{recurrent, recurrent_step};
pub use segmented::{PlannedWalk, planned_segment, planned_walk, segmented};
pub use state::FenwickState;

pub(crate) use recurrent::{carry, read_out, with_level0};
pub(crate) use state::{final_state, initial_state_output};
pub(crate) use tensor::{float_tensor, heads_first, int_tensor, pad_zeros, zeros_as};
