//! The choice of form, and the entry point that dispatches to it.

use burn::prelude::*;
use burn::tensor::DType;

use super::{FenwickState, LogLinearInput, chunked, parallel, recurrent};

/// Which algorithm computes the op. All forms give the same result up to rounding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// Quadratic masked form: O(T²) time and memory; the definition.
    Parallel,
    /// Chunkwise form with a power-of-two chunk size: O(T·C + T·log(T/C)) time.
    Chunked {
        /// Chunk size, a power of two (64 is the usual choice).
        chunk: usize,
    },
    /// Token-by-token Fenwick recurrence: O(log T) state, O(T) sequential steps.
    Recurrent,
    /// The fused CubeCL kernels (forward and backward) on CUDA and WGPU devices: the chunkwise
    /// algorithm in one pass over the sequence per (batch, head, value tile), with every chunk
    /// level's state kept by the kernel. Elsewhere, and for what the kernels do not cover (an
    /// initial or returned state, f64, shared memory too small for the widths), it is
    /// `Chunked { chunk: 64 }`; on a CubeCL device such a fallback prints a one-time warning.
    Fused,
}

impl Default for Form {
    fn default() -> Self {
        Form::Chunked { chunk: 64 }
    }
}

impl std::fmt::Display for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Form::Parallel => write!(f, "parallel"),
            Form::Chunked { chunk } => write!(f, "chunked(C={chunk})"),
            Form::Recurrent => write!(f, "recurrent"),
            Form::Fused => write!(f, "fused"),
        }
    }
}

/// Output of [`log_linear_attn`].
#[derive(Clone, Debug)]
pub struct AttnOutput {
    /// `o: [B, T, H, P]`.
    pub o: Tensor<4>,
    /// The Fenwick state after the last token, when it was asked for (always for the recurrent
    /// form, which builds it anyway).
    pub state: Option<FenwickState>,
}

/// Log-linear attention with the chosen [`Form`], continuing from `initial` (or from an empty
/// state at position 0), optionally returning the final state.
///
/// # Shapes
/// See [`LogLinearInput`]; `o: [B, T, H, P]`; states `[B, H, L, N, P]`.
///
/// # Panics
/// On inconsistent shapes, too few λ levels for `position + T`, or a chunk size that is not a
/// power of two.
pub fn log_linear_attn(
    x: &LogLinearInput,
    form: Form,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    if form == Form::Fused {
        return fused_or_chunked(x, initial, return_state);
    }
    // Half-precision inputs: the decays are differences of cumulative sums, which bf16/f16 cannot
    // hold to useful accuracy, and the level states accumulate many terms; the tensor forms
    // therefore compute in f32 and return `o` in the input dtype (the state stays f32).
    let dtype = x.dtype();
    if matches!(dtype, DType::BF16 | DType::F16) {
        let up = |t: Tensor<4>| t.cast(DType::F32);
        let wide = LogLinearInput {
            q: up(x.q.clone()),
            k: up(x.k.clone()),
            v: up(x.v.clone()),
            g: x.g.clone().cast(DType::F32),
            lambda: up(x.lambda.clone()),
        };
        let initial = initial.map(|s| FenwickState {
            levels: s.levels.clone().cast(DType::F32),
            position: s.position,
        });
        let out = log_linear_attn(&wide, form, initial.as_ref(), return_state);
        return AttnOutput {
            o: out.o.cast(dtype),
            state: out.state,
        };
    }
    match form {
        Form::Parallel => parallel(x, initial, return_state),
        Form::Chunked { chunk } => chunked(x, chunk, initial, return_state),
        Form::Recurrent => {
            let (o, state) = recurrent(x, initial);
            AttnOutput {
                o,
                state: Some(state),
            }
        }
        Form::Fused => unreachable!("handled above"),
    }
}

/// [`Form::Fused`]: the kernels where they apply, else the chunked form (with a one-time warning
/// on devices that have kernels, where the fallback costs speed).
fn fused_or_chunked(
    x: &LogLinearInput,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    const FALLBACK: Form = Form::Chunked { chunk: 64 };
    #[cfg(feature = "kernels")]
    {
        let why = if initial.is_some() || return_state {
            Err("an initial or returned Fenwick state".to_string())
        } else {
            crate::kernels::fused(x)
        };
        match why {
            Ok(o) => return AttnOutput { o, state: None },
            Err(reason) => {
                if crate::kernels::is_cube_device(&x.device()) {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| {
                        eprintln!(
                            "warning: log_linear_attn(fused): falling back to the chunked tensor \
                             form for {reason} (warned once per process)"
                        );
                    });
                }
            }
        }
    }
    log_linear_attn(x, FALLBACK, initial, return_state)
}
