//! The mixers' causal depthwise convolution `y[b, t, c] = bias[c] + Σ_j w[c, j] · x[b, t + j, c]`
//! over an input already left-padded with the `K − 1` previous positions, as one kernel forward
//! and three backward, computed in f32.
//!
//! Why: as tensor ops the convolution is `K` products and sums of shifted views; under autodiff
//! each tap's weight (broadcast over batch and time) and the bias get their gradient from two Burn
//! reductions each — ≈ 10 of the LM step's 108 remaining reduction launches per layer, each
//! taking whatever strategy CubeCL's autotune served (bench/RESULTS.md, session 12).
//!
//! Forward ([`conv_forward_kernel`]) and the input's gradient ([`conv_input_grad_kernel`],
//! `dx[b, s, c] = Σ_j w[c, j] · dy[b, s − j, c]`): one unit per element. The weight's and bias's
//! gradients (`Σ_{b,t} dy[b, t, c] · x[b, t + j, c]` and `Σ_{b,t} dy[b, t, c]`): one unit per
//! channel over a chunk of output rows, its `K + 1` sums in registers, into per-chunk partial
//! sums ([`conv_columns_kernel`]) that `norm::sum_chunks` adds.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::Cb;
use super::norm::sum_chunks;

/// Units per cube of the element-wise kernels and of the column sums.
const CONV_THREADS: usize = 256;
/// Row chunks of the weight-gradient sums at most.
const CONV_CHUNKS: usize = 256;

/// `y[b, t, c] = bias[c] + Σ_j w[c, j] · x[b, t + j, c]` (no bias unless `has_bias`).
///
/// Shapes: `x: [B, T + K − 1, C]` (dtype `E`, contiguous), `weight: [C, K]`, `bias: [C]` (f32,
/// contiguous), `y: [B, T, C]` (dtype `E`, contiguous).
#[cube(launch)]
pub fn conv_forward_kernel<E: Float>(
    x: &Tensor<E>,
    weight: &Tensor<f32>,
    bias: &Tensor<f32>,
    y: &mut Tensor<E>,
    t_len: usize,
    channels: usize,
    #[comptime] taps: usize,
    #[comptime] has_bias: bool,
    #[define(E)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    let c = i % channels;
    let row = i / channels;
    let (b, t) = (row / t_len, row % t_len);
    let s_len = t_len + taps - 1;
    let mut acc = 0.0f32;
    if has_bias {
        acc = bias[c];
    }
    #[unroll]
    for j in 0..taps {
        acc += weight[c * taps + j] * f32::cast_from(x[(b * s_len + t + j) * channels + c]);
    }
    y[i] = E::cast_from(acc);
}

/// `dx[b, s, c] = Σ_j w[c, j] · dy[b, s − j, c]` over the `j` with `0 ≤ s − j < T`.
///
/// Shapes: `dy: [B, T, C]`, `dx: [B, T + K − 1, C]` (dtype `E`, contiguous), `weight` as
/// [`conv_forward_kernel`].
#[cube(launch)]
pub fn conv_input_grad_kernel<E: Float>(
    dy: &Tensor<E>,
    weight: &Tensor<f32>,
    dx: &mut Tensor<E>,
    t_len: usize,
    channels: usize,
    #[comptime] taps: usize,
    #[define(E)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS;
    if i >= dx.len() {
        terminate!();
    }
    let c = i % channels;
    let row = i / channels;
    let s_len = t_len + taps - 1;
    let (b, s) = (row / s_len, row % s_len);
    let mut acc = 0.0f32;
    #[unroll]
    for j in 0..taps {
        // t = s − j, taken where 0 ≤ t < T (s ≥ j first: unsigned).
        if s >= j && s - j < t_len {
            acc += weight[c * taps + j] * f32::cast_from(dy[(b * t_len + s - j) * channels + c]);
        }
    }
    dx[i] = E::cast_from(acc);
}

/// Per channel and chunk of output rows `(b, t)`: `p[chunk, j, c] = Σ dy[b, t, c] · x[b, t + j,
/// c]` for `j < K`, and `p[chunk, K, c] = Σ dy[b, t, c]`. Cube `(X, chunk)`: channels `X ·
/// CONV_THREADS + unit`.
///
/// Shapes: `x, dy` as above, `partial: [chunks, K + 1, C]` (f32).
#[cube(launch)]
pub fn conv_columns_kernel<E: Float>(
    x: &Tensor<E>,
    dy: &Tensor<E>,
    partial: &mut Tensor<f32>,
    rows: usize,
    t_len: usize,
    channels: usize,
    chunk_rows: usize,
    #[comptime] taps: usize,
    #[define(E)] _dtype: ElemType,
) {
    let c = CUBE_POS_X as usize * CONV_THREADS + UNIT_POS_X as usize;
    if c >= channels {
        terminate!();
    }
    let chunk = CUBE_POS_Y as usize;
    let s_len = t_len + taps - 1;
    let mut sums = Array::<f32>::new(comptime!(taps + 1));
    #[unroll]
    for j in 0..taps + 1 {
        sums[j] = 0.0f32;
    }
    let first = chunk * chunk_rows;
    let last = usize::min(first + chunk_rows, rows);
    let mut row = first;
    while row < last {
        let (b, t) = (row / t_len, row % t_len);
        let g = f32::cast_from(dy[row * channels + c]);
        #[unroll]
        for j in 0..taps {
            sums[j] += g * f32::cast_from(x[(b * s_len + t + j) * channels + c]);
        }
        sums[taps] += g;
        row += 1;
    }
    #[unroll]
    for j in 0..taps + 1 {
        partial[(chunk * (taps + 1) + j) * channels + c] = sums[j];
    }
}

/// `(B, T, C, K)` of `x: [B, T + K − 1, C]` with `weight: [C, K]`, checked.
fn conv_dims(x: &CubeTensor, weight: &CubeTensor) -> (usize, usize, usize, usize) {
    let (xs, ws) = (x.meta.shape().as_slice(), weight.meta.shape().as_slice());
    match (xs, ws) {
        (&[b, s, c], &[wc, k]) if wc == c && k >= 1 && s + 1 >= k => (b, s + 1 - k, c, k),
        _ => panic!(
            "causal_conv: input {xs:?} with a weight {ws:?} (expected [B, T + K − 1, C] and [C, K])"
        ),
    }
}

/// The output shape `[B, T, C]` of an input `[B, T + K − 1, C]` and `taps = K`.
pub fn conv_out_shape(x: &Shape, taps: usize) -> Shape {
    let d = x.as_slice();
    Shape::new([d[0], d[1] + 1 - taps, d[2]])
}

fn f32_contiguous(t: CubeTensor) -> CubeTensor {
    into_contiguous(super::cast(t, DType::F32))
}

fn elements_grid(n: usize) -> CubeCount {
    let cubes = n.div_ceil(CONV_THREADS).max(1);
    let x = cubes.min(65_535);
    CubeCount::Static(x as u32, cubes.div_ceil(x) as u32, 1)
}

/// The convolution (see [`conv_forward_kernel`]) in `x`'s dtype; `bias` is read only where
/// `has_bias`.
pub fn causal_conv(
    x: CubeTensor,
    weight: CubeTensor,
    bias: CubeTensor,
    has_bias: bool,
) -> CubeTensor {
    let (b, t, c, k) = conv_dims(&x, &weight);
    let dtype = x.dtype;
    let x = into_contiguous(x);
    let y = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([b, t, c]),
        dtype,
    );
    if b * t * c > 0 {
        conv_forward_kernel::launch(
            &x.client.clone(),
            elements_grid(b * t * c),
            CubeDim::new_1d(CONV_THREADS as u32),
            x.into_tensor_arg(),
            f32_contiguous(weight).into_tensor_arg(),
            f32_contiguous(bias).into_tensor_arg(),
            y.clone().into_tensor_arg(),
            t,
            c,
            k,
            has_bias,
            dtype_to_storage_type(dtype),
        );
    }
    y
}

/// `(dx, dweight, dbias)` of [`causal_conv`] for the output gradient `dy`, each in the shape and
/// dtype of its tensor (`dbias` 0 unless `has_bias`).
pub fn causal_conv_backward(
    x: CubeTensor,
    weight: CubeTensor,
    bias: CubeTensor,
    dy: CubeTensor,
    has_bias: bool,
) -> [CubeTensor; 3] {
    let (b, t, c, k) = conv_dims(&x, &weight);
    let dtype = x.dtype;
    let (w_shape, w_dtype) = (weight.meta.shape().clone(), weight.dtype);
    let (b_shape, b_dtype) = (bias.meta.shape().clone(), bias.dtype);
    let x = into_contiguous(x);
    let dy = into_contiguous(super::cast(dy, dtype));
    let (client, device) = (x.client.clone(), x.device.clone());
    let zeros = |shape: Shape, dtype: DType| {
        burn_cubecl::ops::numeric::zeros_client(client.clone(), device.clone(), shape, dtype)
    };
    let rows = b * t;
    if rows == 0 || c == 0 {
        let dx = zeros(x.meta.shape().clone(), dtype);
        return [dx, zeros(w_shape, w_dtype), zeros(b_shape, b_dtype)];
    }
    let dx = empty_device_contiguous_dtype(
        client.clone(),
        device.clone(),
        x.meta.shape().clone(),
        dtype,
    );
    let storage = dtype_to_storage_type(dtype);
    let weight = f32_contiguous(weight);
    conv_input_grad_kernel::launch(
        &client,
        elements_grid(b * (t + k - 1) * c),
        CubeDim::new_1d(CONV_THREADS as u32),
        dy.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        t,
        c,
        k,
        storage,
    );
    let chunks = rows.clamp(1, CONV_CHUNKS);
    let chunk_rows = rows.div_ceil(chunks);
    let column_cubes = c.div_ceil(CONV_THREADS) as u32;
    let partial = empty_device_contiguous_dtype(
        client.clone(),
        device.clone(),
        Shape::new([chunks, k + 1, c]),
        DType::F32,
    );
    conv_columns_kernel::launch(
        &client,
        CubeCount::Static(column_cubes, chunks as u32, 1),
        CubeDim::new_1d(CONV_THREADS as u32),
        x.into_tensor_arg(),
        dy.into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        rows,
        t,
        c,
        chunk_rows,
        k,
        storage,
    );
    // The chunks' sums added: `[K + 1, C]` as one row of width (K + 1)·C.
    let total = Cb::float_reshape(
        sum_chunks(partial, 1, chunks, (k + 1) * c),
        Shape::new([k + 1, c]),
    );
    // dweight: rows 0..K of the total, `[K, C]` → `[C, K]`.
    let dw = Cb::float_slice(
        total.clone(),
        &[
            burn::tensor::Slice::new(0, Some(k as isize), 1),
            burn::tensor::Slice::full(),
        ],
    );
    let dw = into_contiguous(Cb::float_swap_dims(dw, 0, 1));
    let dw = super::cast(Cb::float_reshape(dw, w_shape), w_dtype);
    let db = if has_bias {
        let db = Cb::float_slice(
            total,
            &[
                burn::tensor::Slice::new(k as isize, Some(k as isize + 1), 1),
                burn::tensor::Slice::full(),
            ],
        );
        super::cast(Cb::float_reshape(into_contiguous(db), b_shape), b_dtype)
    } else {
        zeros(b_shape, b_dtype)
    };
    [dx, dw, db]
}
