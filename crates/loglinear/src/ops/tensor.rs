//! Small tensor helpers shared by the forms.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

/// `[B, T, H, X] → [B, H, T, X]`: the head-major layout every form computes in.
pub(crate) fn heads_first(x: Tensor<4>) -> Tensor<4> {
    x.swap_dims(1, 2)
}

/// An integer tensor from host values.
pub(crate) fn int_tensor<const D: usize>(
    values: Vec<i64>,
    shape: [usize; D],
    device: &Device,
) -> Tensor<D, Int> {
    Tensor::from_data(TensorData::new(values, shape.to_vec()), device)
}

/// A float tensor from host values, in `dtype`.
pub(crate) fn float_tensor<const D: usize>(
    values: Vec<f64>,
    shape: [usize; D],
    dtype: DType,
    device: &Device,
) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape.to_vec()), (device, dtype))
}

/// Zeros of `shape` with the dtype and device of `like`.
pub(crate) fn zeros_as<const D: usize, const D2: usize>(
    like: &Tensor<D2>,
    shape: [usize; D],
) -> Tensor<D> {
    Tensor::zeros(shape, (&like.device(), like.dtype()))
}

/// Pads `x` with zeros along `dim`: `before` in front, `after` behind.
pub(crate) fn pad_zeros<const D: usize>(
    x: Tensor<D>,
    dim: usize,
    before: usize,
    after: usize,
) -> Tensor<D> {
    if before == 0 && after == 0 {
        return x;
    }
    let mut parts = Vec::with_capacity(3);
    let mut shape = x.dims();
    if before > 0 {
        shape[dim] = before;
        parts.push(zeros_as(&x, shape));
    }
    let tail = after > 0;
    parts.push(x.clone());
    if tail {
        shape[dim] = after;
        parts.push(zeros_as(&x, shape));
    }
    Tensor::cat(parts, dim)
}
