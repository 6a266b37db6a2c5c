//! The entry point of the Gated DeltaNet op: dispatch on [`Form`].

use burn::tensor::DType;

use super::{GdnInput, chunked, parallel, recurrent};
use crate::ops::{AttnOutput, FenwickState, Form};

/// Log-linear Gated DeltaNet with the chosen [`Form`], continuing from `initial` (or from an
/// empty state at position 0), optionally returning the final state. There are no fused
/// Gated DeltaNet kernels: [`Form::Fused`] is `Chunked { chunk: 64 }` (its documented fallback)
/// and [`Form::Auto`] is `Chunked { chunk }`.
///
/// Half-precision inputs (bf16, f16) are computed in f32 and `o` is returned in the input
/// dtype (the state stays f32), as for the Mamba-2 op: the decays are differences of
/// cumulative sums and the states accumulate many terms.
///
/// # Shapes
/// See [`GdnInput`]; `o: [B, T, H, P]`; states `[B, H, L, N, P]`.
///
/// # Panics
/// On inconsistent shapes, too few λ levels for `position + T`, or a chunk size that is not a
/// power of two.
pub fn gdn_attn(
    x: &GdnInput,
    form: Form,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    let dtype = x.dtype();
    if matches!(dtype, DType::BF16 | DType::F16) {
        let initial = initial.map(|s| FenwickState {
            levels: s.levels.clone().cast(DType::F32),
            position: s.position,
        });
        let out = gdn_attn(&x.cast(DType::F32), form, initial.as_ref(), return_state);
        return AttnOutput {
            o: out.o.cast(dtype),
            state: out.state,
        };
    }
    match form {
        Form::Parallel => parallel(x, initial, return_state),
        Form::Chunked { chunk } => chunked(x, chunk, initial, return_state),
        // No Gated DeltaNet kernels: the fused forms are its chunked form.
        Form::Fused | Form::Segmented { .. } => chunked(x, 64, initial, return_state),
        Form::Auto { chunk } => chunked(x, chunk, initial, return_state),
        Form::Recurrent => {
            let (o, state) = recurrent(x, initial);
            AttnOutput {
                o,
                state: Some(state),
            }
        }
    }
}
