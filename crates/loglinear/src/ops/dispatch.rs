//! The choice of form, and the entry point that dispatches to it.

use burn::prelude::*;
use burn::tensor::DType;

use super::{FenwickState, LogLinearInput, chunked, parallel, recurrent, segmented};

/// Which algorithm computes the op. All forms give the same result up to rounding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// Quadratic masked form: O(T²) time and memory; the definition.
    Parallel,
    /// Chunkwise form with a power-of-two chunk size: O(T·C + T·log(T/C)) time.
    Chunked {
        /// Chunk size, a power of two ([`DEFAULT_CHUNK`] is the usual choice).
        chunk: usize,
    },
    /// Token-by-token Fenwick recurrence: O(log T) state, O(T) sequential steps.
    Recurrent,
    /// The fused CubeCL kernels (forward and backward) on CUDA and WGPU devices: the chunkwise
    /// algorithm in one pass over the sequence per (batch, head, value tile), with every chunk
    /// level's state kept by the kernel — or, on tensor cores with sequences too few and too
    /// long to fill the device, one pass per aligned segment of [`crate::ops::planned_walk`]
    /// (each of the forward and the backward by its own rule; [`Form::Segmented`]). Elsewhere, and for what the kernels do not cover (an
    /// initial or returned state, f64, shared memory too small for the widths), it is
    /// `Chunked { chunk: 64 }`; on a CubeCL device such a fallback prints a one-time warning.
    Fused,
    /// The sequence-parallel form: aligned segments of `segment` tokens (a power of two), each
    /// walked by the fused kernels in a cube of its own (every pair inside it), the levels across
    /// segments written before the launch from one state per segment and level. For long
    /// sequences with few heads, which leave most of a GPU idle in one pass per sequence.
    /// Without kernels the segments are batch rows of the chunked form plus the pairs across them
    /// ([`crate::ops::segmented`]); a Fenwick state in or out takes the chunked form.
    Segmented {
        /// Segment length, a power of two.
        segment: usize,
    },
    /// The faster of `Fused` and `Chunked { chunk }` for the inputs at hand, chosen at every call
    /// by [`auto_form`]: the fused kernels where they run on tensor cores, the chunked form
    /// elsewhere (on the CPU always).
    Auto {
        /// Chunk size of the chunked form, a power of two.
        chunk: usize,
    },
}

/// The usual chunk size: the default form's, and the chunked fallback of [`Form::Fused`].
pub const DEFAULT_CHUNK: usize = 64;

/// The tile of the tensor-core products (16×16 outputs, 16-deep steps).
pub const TENSOR_CORE_TILE: usize = 16;

/// Whether the fused kernels compute on tensor cores: bf16 inputs, key width `n` a multiple of
/// the tile, on a device with bf16 `mma.sync` (f32 accumulation) and `ldmatrix` (`bf16_cmma`;
/// `ops::fused::bf16_cmma` asks the device). Only bf16: the kernels round the level states and
/// weighted operands to the input dtype, and f16's range (65,504) does not hold a state summed
/// over a long sequence, so f16 and f32 take the scalar kernels, which compute in f32. The one
/// statement of this condition: the kernels' launch planning asks it too.
pub fn on_tensor_cores(dtype: DType, n: usize, bf16_cmma: bool) -> bool {
    bf16_cmma && dtype == DType::BF16 && n.is_multiple_of(TENSOR_CORE_TILE)
}

/// The form [`Form::Auto`] runs for inputs whose `q` has `dtype` and key width `n`, on a device
/// with or without bf16 tensor cores (`bf16_cmma`), with or without a Fenwick state in or out
/// (`with_state`): [`Form::Fused`] where its kernels run on tensor cores ([`on_tensor_cores`])
/// and no state is asked for (the kernels keep none), else `Chunked { chunk }`. Measured on the
/// H200 (bench/RESULTS.md): on tensor cores the fused forward + backward took 0.29–0.36× the
/// chunked form's time (session 4); in f32 the fused op runs scalar kernels, which were slower
/// than the chunked form (session 2).
pub fn auto_form(chunk: usize, dtype: DType, n: usize, bf16_cmma: bool, with_state: bool) -> Form {
    if !with_state && on_tensor_cores(dtype, n, bf16_cmma) {
        Form::Fused
    } else {
        Form::Chunked { chunk }
    }
}

/// Whether `device` runs the fused kernels with bf16 tensor cores (false without kernels).
fn bf16_cmma(device: &Device) -> bool {
    #[cfg(feature = "kernels")]
    {
        crate::ops::fused::bf16_cmma(device)
    }
    #[cfg(not(feature = "kernels"))]
    {
        let _ = device;
        false
    }
}

impl Default for Form {
    fn default() -> Self {
        Form::Chunked {
            chunk: DEFAULT_CHUNK,
        }
    }
}

impl std::fmt::Display for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Form::Parallel => write!(f, "parallel"),
            Form::Chunked { chunk } => write!(f, "chunked(C={chunk})"),
            Form::Recurrent => write!(f, "recurrent"),
            Form::Fused => write!(f, "fused"),
            Form::Segmented { segment } => write!(f, "segmented(S={segment})"),
            Form::Auto { chunk } => write!(f, "auto(C={chunk})"),
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
    match form {
        Form::Auto { chunk } => {
            let with_state = initial.is_some() || return_state;
            let form = auto_form(
                chunk,
                x.dtype(),
                x.dims().n,
                bf16_cmma(&x.device()),
                with_state,
            );
            return match form {
                // Should the kernels not fit after all, the fallback keeps the configured chunk.
                Form::Fused => fused_or_chunked(x, chunk, initial, return_state),
                other => log_linear_attn(x, other, initial, return_state),
            };
        }
        Form::Fused => return fused_or_chunked(x, DEFAULT_CHUNK, initial, return_state),
        Form::Segmented { segment } if initial.is_none() && !return_state => {
            #[cfg(feature = "kernels")]
            if let Ok(o) = crate::ops::fused::fused_in_segments(x, segment) {
                return AttnOutput { o, state: None };
            }
            // Without kernels the segments take the chunked form: the same composition.
            return AttnOutput {
                o: segmented(x, segment, |rows| {
                    log_linear_attn(
                        rows,
                        Form::Chunked {
                            chunk: DEFAULT_CHUNK,
                        },
                        None,
                        false,
                    )
                    .o
                }),
                state: None,
            };
        }
        // The kernels keep no state: as `Fused`, the chunked form.
        Form::Segmented { .. } => {
            return fused_or_chunked(x, DEFAULT_CHUNK, initial, return_state);
        }
        _ => {}
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
        Form::Fused | Form::Segmented { .. } | Form::Auto { .. } => {
            unreachable!("handled above")
        }
    }
}

/// [`Form::Fused`]: the kernels where they apply, else the chunked form with `chunk` (with a
/// one-time warning on devices that have kernels, where the fallback costs speed).
fn fused_or_chunked(
    x: &LogLinearInput,
    chunk: usize,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    #[cfg(feature = "kernels")]
    {
        let why = if initial.is_some() || return_state {
            Err("an initial or returned Fenwick state".to_string())
        } else {
            crate::ops::fused::fused(x)
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
    log_linear_attn(x, Form::Chunked { chunk }, initial, return_state)
}
