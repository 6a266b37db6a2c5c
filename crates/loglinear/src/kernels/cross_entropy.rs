//! Softmax cross-entropy over a vocabulary, one cube per row: the forward reads each logit once
//! (an online max and sum of exponentials per unit, merged across the cube) and writes the row's
//! `nll = lse − x[target]` and `lse`; the backward reads each logit once more and writes
//! `dx = (e^{x−lse} − [v = target]) · g` in the logits' dtype. The tensor-op formula
//! (`log_softmax` then `gather`, and their autodiff) moves the `[rows, V]` logits through memory
//! about a dozen times in f32 and keeps the exponentials for the backward; at the LM's
//! 32,768 × 50,257 that was ≈ 40 ms of a 199-ms step on the H200 (bench/RESULTS.md, session 5).
//!
//! Rows: `CUBE_POS_Y · CUBE_COUNT_X + CUBE_POS_X` (a 2-D grid, since some runtimes cap one
//! grid axis at 65,535); [`CE_THREADS`] units stride over the vocabulary.
//!
//! Rows may be pitched (a row stride above their length, unit column stride): the logits come
//! straight from the head's product, whose rows CubeCL's CUDA allocator pads to an aligned
//! pitch when their bytes are not a multiple of the alignment, and the gradient is written with
//! such a pitch too. Making them contiguous would copy the `[rows, V]` logits twice a step
//! (≈ 3 ms each at the LM's size; bench/RESULTS.md session 9). Only the first `vocab` columns
//! are scored: the head's output covers the vocabulary padded to a multiple of 64, and the
//! padding's gradient is written as 0.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::DType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::rows::{cube_logsumexp, row_grid, row_pitch, rows_and_width, rows_of};

// The running maximum starts at the lowest finite f32 (see `rows::cube_logsumexp`), and the tree
// reduction there needs a power of two.
const _: () = assert!(CE_THREADS.is_power_of_two());

/// Per row: `lse = max x + ln Σ e^{x − max x}` and `nll = lse − x[target]` (f32).
///
/// Shapes: `logits: [rows, ≥ vocab]` (dtype `E`, row `r` at `r · pitch`, unit column stride; only
/// the first `vocab` columns are read), `targets: [rows]` (integers in `0..vocab`), `nll, lse:
/// [rows]` (f32).
#[cube(launch)]
pub fn ce_forward_kernel<E: Float, I: Int>(
    logits: &Tensor<E>,
    targets: &Tensor<I>,
    nll: &mut Tensor<f32>,
    lse: &mut Tensor<f32>,
    rows: usize,
    vocab: usize,
    pitch: usize,
    #[define(E, I)] _dtypes: [ElemType; 2],
) {
    let row = CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize;
    if row >= rows {
        terminate!();
    }
    let u = UNIT_POS_X as usize;
    let base = row * pitch;
    // Online softmax: the running maximum m and Σ e^{x−m} of this unit's columns.
    let mut m = f32::min_value();
    let mut s = 0.0f32;
    let mut i = u;
    while i < vocab {
        let x = f32::cast_from(logits[base + i]);
        if x > m {
            s = s * (m - x).exp() + 1.0f32;
            m = x;
        } else {
            s += (x - m).exp();
        }
        i += CE_THREADS;
    }
    let l = cube_logsumexp(m, s, CE_THREADS);
    if u == 0 {
        let t = usize::cast_from(targets[row]);
        lse[row] = l;
        nll[row] = l - f32::cast_from(logits[base + t]);
    }
}

/// Per row: `dlogits[v] = (e^{x[v] − lse} − [v = target]) · grad` in the logits' dtype.
///
/// Shapes: `logits, dlogits: [rows, stored]` (dtype `E`, rows at `r · pitch` and `r · d_pitch`,
/// unit column strides) of which the first `vocab` columns are scored (the gradient of the rest
/// is 0), `targets: [rows]`, `lse, grad: [rows]` (f32).
#[cube(launch)]
pub fn ce_backward_kernel<E: Float, I: Int>(
    logits: &Tensor<E>,
    targets: &Tensor<I>,
    lse: &Tensor<f32>,
    grad: &Tensor<f32>,
    dlogits: &mut Tensor<E>,
    rows: usize,
    vocab: usize,
    stored: usize,
    pitch: usize,
    d_pitch: usize,
    #[define(E, I)] _dtypes: [ElemType; 2],
) {
    let row = CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize;
    if row >= rows {
        terminate!();
    }
    let u = UNIT_POS_X as usize;
    let (base, d_base) = (row * pitch, row * d_pitch);
    let l = lse[row];
    let g = grad[row];
    let t = usize::cast_from(targets[row]);
    let mut i = u;
    while i < vocab {
        let mut d = (f32::cast_from(logits[base + i]) - l).exp() * g;
        if i == t {
            d -= g;
        }
        dlogits[d_base + i] = E::cast_from(d);
        i += CE_THREADS;
    }
    while i < stored {
        dlogits[d_base + i] = E::cast_from(0.0f32);
        i += CE_THREADS;
    }
}

/// Units per cube of the cross-entropy kernels (one cube per row of logits).
pub const CE_THREADS: usize = 256;

/// `vocab` checked against the logits' stored width.
fn scored_columns(vocab: usize, stored: usize) -> usize {
    assert!(
        vocab <= stored,
        "cross-entropy: {vocab} scored columns of logits {stored} wide"
    );
    vocab
}

/// Softmax cross-entropy per row: `(nll, lse)`, f32 `[...]` each, from `logits: [..., V']`
/// (rows pitched or not) of which the first `vocab` columns are scored, and integer `targets:
/// [...]` in `0..vocab` (see `cross_entropy.rs`).
pub fn cross_entropy(
    logits: CubeTensor,
    targets: CubeTensor,
    vocab: usize,
) -> (CubeTensor, CubeTensor) {
    let (rows, stored) = rows_and_width(logits.meta.shape());
    let vocab = scored_columns(vocab, stored);
    let (logits, pitch) = rows_of(logits);
    let (client, device) = (logits.client.clone(), logits.device.clone());
    let column = || {
        empty_device_contiguous_dtype(
            client.clone(),
            device.clone(),
            targets.meta.shape().clone(),
            DType::F32,
        )
    };
    let (nll, lse) = (column(), column());
    if rows > 0 {
        let dtypes = [
            dtype_to_storage_type(logits.dtype),
            dtype_to_storage_type(targets.dtype),
        ];
        ce_forward_kernel::launch(
            &client,
            row_grid(rows),
            CubeDim::new_1d(CE_THREADS as u32),
            logits.into_tensor_arg(),
            into_contiguous(targets).into_tensor_arg(),
            nll.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            rows,
            vocab,
            pitch,
            dtypes,
        );
    }
    (nll, lse)
}

/// The gradient of [`cross_entropy`]'s `nll` with respect to the logits, `[..., V']` in their
/// dtype (0 past the `vocab` scored columns), for an output gradient `grad: [...]` (f32) and
/// the forward's `lse`. Its rows have the pitch the device's allocator gives them (on CUDA
/// aligned, so the head's products read them on tensor cores).
pub fn cross_entropy_backward(
    logits: CubeTensor,
    targets: CubeTensor,
    lse: CubeTensor,
    grad: CubeTensor,
    vocab: usize,
) -> CubeTensor {
    let (rows, stored) = rows_and_width(logits.meta.shape());
    let vocab = scored_columns(vocab, stored);
    let shape = logits.meta.shape().clone();
    let (client, device, dtype) = (logits.client.clone(), logits.device.clone(), logits.dtype);
    let (logits, pitch) = rows_of(logits);
    let out = empty_device_dtype(client.clone(), device, shape, dtype);
    let d_pitch = row_pitch(&out).expect("a new tensor's rows follow at one pitch");
    if rows > 0 {
        ce_backward_kernel::launch(
            &client,
            row_grid(rows),
            CubeDim::new_1d(CE_THREADS as u32),
            logits.into_tensor_arg(),
            into_contiguous(targets.clone()).into_tensor_arg(),
            into_contiguous(lse).into_tensor_arg(),
            into_contiguous(grad).into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows,
            vocab,
            stored,
            pitch,
            d_pitch,
            [
                dtype_to_storage_type(dtype),
                dtype_to_storage_type(targets.dtype),
            ],
        );
    }
    out
}
