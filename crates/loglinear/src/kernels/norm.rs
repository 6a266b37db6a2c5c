//! Row normalisation — RMSNorm `x / rms(x) ⊙ w` and LayerNorm `(x − mean) / std(x) ⊙ w + b` over
//! the last axis — as one kernel forward and three small ones backward, computed in f32.
//!
//! Why: as tensor ops a norm is ≈ 5 Burn reductions (the row statistics forward, two row sums
//! and the weight's and bias's column sums over all rows backward) plus a dozen element-wise
//! launches; the LM step (6 layers, three norms each) ran 165 reduction launches taking 24 ms of
//! its 84 ms, and how long each takes depends on the strategy CubeCL's autotune picked for it —
//! or served from decisions another workload stored (the Transformer's 103 took 17.7 ms in one
//! process and 109 ms in another: bench/RESULTS.md, session 12). With these kernels: 75.7 ms.
//!
//! Forward ([`norm_forward_kernel`]): one cube per row, [`NORM_THREADS`] units striding over the
//! row; the row sums are merged in shared memory; writes `y` (the input's dtype) and the row's
//! `(mean, rstd)` (f32; mean 0 for RMSNorm). Backward: the same layout for
//! `dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂))` with `g = dy ⊙ w`, `x̂ = (x − mean) · rstd`
//! (RMSNorm drops `mean(g)`) ([`norm_backward_kernel`]); the weight's and bias's gradients
//! `Σ_rows dy ⊙ x̂`, `Σ_rows dy` as column sums, one unit per column over a chunk of rows
//! (consecutive units read consecutive columns) into per-chunk partial sums
//! ([`norm_columns_kernel`]), which [`column_sum_kernel`] adds.
//!
//! Replicas: the weights may be `[R, D]` (the packed models of a sweep), the rows then come
//! replica by replica and row `r` uses the weights of replica `r / (rows / R)`; a chunk of rows
//! never spans two replicas.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::rows::{cube_sum, new_rows, row_grid, rows_and_width, rows_of};

/// Units per cube of the row kernels (one cube per row).
pub const NORM_THREADS: usize = 128;
/// Units per cube (one per column) of the column-sum kernels.
pub(crate) const COLUMN_THREADS: usize = 128;
/// Row chunks per replica of the column sums at most (each chunk one partial sum per column).
pub(crate) const COLUMN_CHUNKS: usize = 256;

// The tree reduction of `cube_sum` needs a power of two.
const _: () = assert!(NORM_THREADS.is_power_of_two());

/// Per row: `y = (x − mean) · rstd ⊙ w (+ b)` with `rstd = 1 / sqrt(mean((x − mean)²) + eps)`,
/// `mean` the row mean where `centered` (LayerNorm) and 0 otherwise (RMSNorm); `stats[row] =
/// (mean, rstd)`.
///
/// Shapes: `x: [rows, width]` (dtype `E`, row `r` at `r · pitch`), `y` alike at `y_pitch`;
/// `weight, bias: [R, width]` (f32, contiguous; `bias` unread unless `centered`), `stats: [rows,
/// 2]` (f32); rows replica by replica, `per` rows each.
#[cube(launch)]
pub fn norm_forward_kernel<E: Float>(
    x: &Tensor<E>,
    weight: &Tensor<f32>,
    bias: &Tensor<f32>,
    y: &mut Tensor<E>,
    stats: &mut Tensor<f32>,
    rows: usize,
    width: usize,
    per: usize,
    pitch: usize,
    y_pitch: usize,
    eps: f32,
    #[comptime] centered: bool,
    #[define(E)] _dtype: ElemType,
) {
    let row = CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize;
    if row >= rows {
        terminate!();
    }
    let u = UNIT_POS_X as usize;
    let (base, y_base) = (row * pitch, row * y_pitch);
    let w_base = (row / per) * width;
    let n = f32::cast_from(width);
    let mut mean = 0.0f32;
    if centered {
        let mut s = 0.0f32;
        let mut i = u;
        while i < width {
            s += f32::cast_from(x[base + i]);
            i += NORM_THREADS;
        }
        mean = cube_sum(s, NORM_THREADS) / n;
    }
    // Two passes for LayerNorm (the squares of centred values, not E[x²] − mean²).
    let mut s2 = 0.0f32;
    let mut i = u;
    while i < width {
        let d = f32::cast_from(x[base + i]) - mean;
        s2 += d * d;
        i += NORM_THREADS;
    }
    let rstd = 1.0f32 / f32::sqrt(cube_sum(s2, NORM_THREADS) / n + eps);
    let mut i = u;
    while i < width {
        let mut v = (f32::cast_from(x[base + i]) - mean) * rstd * weight[w_base + i];
        if centered {
            v += bias[w_base + i];
        }
        y[y_base + i] = E::cast_from(v);
        i += NORM_THREADS;
    }
    if u == 0 {
        stats[row * 2] = mean;
        stats[row * 2 + 1] = rstd;
    }
}

/// Per row: `dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂))`, `g = dy ⊙ w`, `x̂ = (x − mean) ·
/// rstd` (without `mean(g)` unless `centered`).
///
/// Shapes: `x, dy, dx: [rows, width]` (dtype `E`, rows at `pitch`, `g_pitch`, `d_pitch`), the
/// rest as [`norm_forward_kernel`].
#[cube(launch)]
pub fn norm_backward_kernel<E: Float>(
    x: &Tensor<E>,
    weight: &Tensor<f32>,
    stats: &Tensor<f32>,
    dy: &Tensor<E>,
    dx: &mut Tensor<E>,
    rows: usize,
    width: usize,
    per: usize,
    pitch: usize,
    g_pitch: usize,
    d_pitch: usize,
    #[comptime] centered: bool,
    #[define(E)] _dtype: ElemType,
) {
    let row = CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize;
    if row >= rows {
        terminate!();
    }
    let u = UNIT_POS_X as usize;
    let (base, g_base, d_base) = (row * pitch, row * g_pitch, row * d_pitch);
    let w_base = (row / per) * width;
    let (mean, rstd) = (stats[row * 2], stats[row * 2 + 1]);
    let n = f32::cast_from(width);
    let mut sg = 0.0f32;
    let mut sgx = 0.0f32;
    let mut i = u;
    while i < width {
        let g = f32::cast_from(dy[g_base + i]) * weight[w_base + i];
        let xh = (f32::cast_from(x[base + i]) - mean) * rstd;
        sg += g;
        sgx += g * xh;
        i += NORM_THREADS;
    }
    let mut mean_g = 0.0f32;
    if centered {
        mean_g = cube_sum(sg, NORM_THREADS) / n;
    }
    let mean_gx = cube_sum(sgx, NORM_THREADS) / n;
    let mut i = u;
    while i < width {
        let g = f32::cast_from(dy[g_base + i]) * weight[w_base + i];
        let xh = (f32::cast_from(x[base + i]) - mean) * rstd;
        dx[d_base + i] = E::cast_from(rstd * (g - mean_g - xh * mean_gx));
        i += NORM_THREADS;
    }
}

/// Per column and chunk of rows: `p_w = Σ dy ⊙ x̂`, `p_b = Σ dy` over the chunk's rows (`p_b`
/// only where `centered`). Cube `(X, chunk, replica)`: columns `X · COLUMN_THREADS + unit`, rows
/// `chunk · chunk_rows ..` of the replica.
///
/// Shapes: `x, dy` as [`norm_backward_kernel`], `p_w, p_b: [R, chunks, width]` (f32).
#[cube(launch)]
pub fn norm_columns_kernel<E: Float>(
    x: &Tensor<E>,
    stats: &Tensor<f32>,
    dy: &Tensor<E>,
    p_w: &mut Tensor<f32>,
    p_b: &mut Tensor<f32>,
    width: usize,
    per: usize,
    chunk_rows: usize,
    pitch: usize,
    g_pitch: usize,
    #[comptime] centered: bool,
    #[define(E)] _dtype: ElemType,
) {
    let col = CUBE_POS_X as usize * COLUMN_THREADS + UNIT_POS_X as usize;
    if col >= width {
        terminate!();
    }
    let (chunk, rep) = (CUBE_POS_Y as usize, CUBE_POS_Z as usize);
    let first = chunk * chunk_rows;
    let last = usize::min(first + chunk_rows, per);
    let mut sw = 0.0f32;
    let mut sb = 0.0f32;
    let mut r = first;
    while r < last {
        let row = rep * per + r;
        let g = f32::cast_from(dy[row * g_pitch + col]);
        let xh = (f32::cast_from(x[row * pitch + col]) - stats[row * 2]) * stats[row * 2 + 1];
        sw += g * xh;
        sb += g;
        r += 1;
    }
    let slot = (rep * CUBE_COUNT_Y as usize + chunk) * width + col;
    p_w[slot] = sw;
    if centered {
        p_b[slot] = sb;
    }
}

/// `out[r, c] = Σ_k partial[r, k, c]`: cube `(X, replica)`, one unit per column.
///
/// Shapes: `partial: [R, chunks, width]`, `out: [R, width]` (f32).
#[cube(launch)]
pub fn column_sum_kernel(
    partial: &Tensor<f32>,
    out: &mut Tensor<f32>,
    width: usize,
    chunks: usize,
) {
    let col = CUBE_POS_X as usize * COLUMN_THREADS + UNIT_POS_X as usize;
    if col >= width {
        terminate!();
    }
    let rep = CUBE_POS_Y as usize;
    let mut s = 0.0f32;
    for k in 0..chunks {
        s += partial[(rep * chunks + k) * width + col];
    }
    out[rep * width + col] = s;
}

/// `[groups, width]` (f32): the sums over the chunks of `partial: [groups, chunks, width]`
/// ([`column_sum_kernel`]), the second stage of the column sums here and in [`super::conv`].
pub(crate) fn sum_chunks(
    partial: CubeTensor,
    groups: usize,
    chunks: usize,
    width: usize,
) -> CubeTensor {
    let out = empty_device_contiguous_dtype(
        partial.client.clone(),
        partial.device.clone(),
        Shape::new([groups, width]),
        DType::F32,
    );
    if groups > 0 && width > 0 {
        column_sum_kernel::launch(
            &partial.client.clone(),
            CubeCount::Static(width.div_ceil(COLUMN_THREADS) as u32, groups as u32, 1),
            CubeDim::new_1d(COLUMN_THREADS as u32),
            partial.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            width,
            chunks,
        );
    }
    out
}

/// `(replicas, rows per replica)` of `x: [..., D]` normalised with weights `[D]` or `[R, D]`,
/// checked.
fn norm_dims(x: &CubeTensor, weight: &CubeTensor) -> (usize, usize, usize, usize) {
    let (rows, width) = rows_and_width(x.meta.shape());
    let w = weight.meta.shape().as_slice();
    let (replicas, w_width) = match *w {
        [d] => (1, d),
        [r, d] => (r, d),
        _ => (0, 0),
    };
    assert!(
        replicas > 0 && w_width == width && rows % replicas == 0,
        "norm: x {:?} with a weight {w:?} (expected [..., D] and [D] or [R, D], the rows a \
         multiple of R)",
        x.meta.shape().as_slice()
    );
    (rows, width, replicas, rows / replicas)
}

/// A weight or bias as the kernels read it: f32, contiguous.
fn f32_weight(t: CubeTensor) -> CubeTensor {
    into_contiguous(super::cast(t, DType::F32))
}

/// The shape of the row statistics of `x: [..., D]`: `[..., 2]`.
pub fn stats_shape(x: &Shape) -> Shape {
    let mut dims = x.as_slice().to_vec();
    *dims.last_mut().expect("norm: a tensor of rank ≥ 1") = 2;
    Shape::from(dims)
}

/// `(y, stats)`: `x: [..., D]` normalised over its last axis (see [`norm_forward_kernel`]),
/// `y` in `x`'s dtype, `stats: [..., 2]` (f32) the rows' `(mean, rstd)`; `weight, bias: [D]` or
/// `[R, D]` (`bias` unread unless `centered`).
pub fn norm(
    x: CubeTensor,
    weight: CubeTensor,
    bias: CubeTensor,
    eps: f32,
    centered: bool,
) -> (CubeTensor, CubeTensor) {
    let (rows, width, _replicas, per) = norm_dims(&x, &weight);
    let dtype = x.dtype;
    let (x, pitch) = rows_of(x);
    let (y, y_pitch) = new_rows(&x);
    let stats = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        stats_shape(x.meta.shape()),
        DType::F32,
    );
    if rows > 0 && width > 0 {
        norm_forward_kernel::launch(
            &x.client.clone(),
            row_grid(rows),
            CubeDim::new_1d(NORM_THREADS as u32),
            x.into_tensor_arg(),
            f32_weight(weight).into_tensor_arg(),
            f32_weight(bias).into_tensor_arg(),
            y.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            rows,
            width,
            per,
            pitch,
            y_pitch,
            eps,
            centered,
            dtype_to_storage_type(dtype),
        );
    }
    (y, stats)
}

/// `(dx, dweight, dbias)` of [`norm`] for the output gradient `dy`, each in the shape and dtype
/// of its tensor (`dbias` 0 unless `centered`).
pub fn norm_backward(
    x: CubeTensor,
    weight: CubeTensor,
    bias: CubeTensor,
    stats: CubeTensor,
    dy: CubeTensor,
    centered: bool,
) -> [CubeTensor; 3] {
    let (rows, width, replicas, per) = norm_dims(&x, &weight);
    let dtype = x.dtype;
    let (w_shape, w_dtype) = (weight.meta.shape().clone(), weight.dtype);
    let (b_shape, b_dtype) = (bias.meta.shape().clone(), bias.dtype);
    let (x, pitch) = rows_of(x);
    let (dy, g_pitch) = rows_of(super::cast(dy, dtype));
    let stats = into_contiguous(stats);
    let (dx, d_pitch) = new_rows(&x);
    let (client, device) = (x.client.clone(), x.device.clone());
    let zeros = |shape: Shape| {
        burn_cubecl::ops::numeric::zeros_client(client.clone(), device.clone(), shape, DType::F32)
    };
    let storage = dtype_to_storage_type(dtype);
    let chunks = per.clamp(1, COLUMN_CHUNKS);
    let chunk_rows = per.div_ceil(chunks).max(1);
    let column_cubes = width.div_ceil(COLUMN_THREADS) as u32;
    let empty = |shape: Shape| {
        empty_device_contiguous_dtype(client.clone(), device.clone(), shape, DType::F32)
    };
    if rows == 0 || width == 0 {
        return [
            dx,
            super::cast(zeros(w_shape), w_dtype),
            super::cast(zeros(b_shape), b_dtype),
        ];
    }
    // Every slot is written (a chunk past the rows writes 0); RMSNorm's bias sums are not
    // computed, so their buffer is a stand-in the kernel never writes.
    let p_w = empty(Shape::new([replicas, chunks, width]));
    let p_b = if centered {
        empty(Shape::new([replicas, chunks, width]))
    } else {
        empty(Shape::new([1]))
    };
    norm_backward_kernel::launch(
        &client,
        row_grid(rows),
        CubeDim::new_1d(NORM_THREADS as u32),
        x.clone().into_tensor_arg(),
        f32_weight(weight).into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        rows,
        width,
        per,
        pitch,
        g_pitch,
        d_pitch,
        centered,
        storage,
    );
    norm_columns_kernel::launch(
        &client,
        CubeCount::Static(column_cubes, chunks as u32, replicas as u32),
        CubeDim::new_1d(COLUMN_THREADS as u32),
        x.into_tensor_arg(),
        stats.into_tensor_arg(),
        dy.into_tensor_arg(),
        p_w.clone().into_tensor_arg(),
        p_b.clone().into_tensor_arg(),
        width,
        per,
        chunk_rows,
        pitch,
        g_pitch,
        centered,
        storage,
    );
    let total = |partial: CubeTensor, shape: Shape, dtype: DType| {
        let out = sum_chunks(partial, replicas, chunks, width);
        super::cast(super::Cb::float_reshape(out, shape), dtype)
    };
    let dw = total(p_w, w_shape, w_dtype);
    // RMSNorm has no bias: its stand-in's gradient is 0 (the autodiff wrapper drops it).
    let db = if centered {
        total(p_b, b_shape, b_dtype)
    } else {
        super::cast(zeros(b_shape), b_dtype)
    };
    [dx, dw, db]
}
