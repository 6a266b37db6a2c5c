//! Row-wise kernels (the cross-entropy's, the attention softmax's) read a tensor `[..., W]` as
//! `rows × W` where its rows follow each other at one pitch: contiguous, or pitched by CubeCL's
//! CUDA allocator, which pads rows whose bytes are not a multiple of its alignment. Making such a
//! tensor contiguous would copy it (Burn 0.22's reshape copies any pitched tensor).

use burn::tensor::Shape;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// One cube per row, on a 2-D grid: some runtimes cap a grid axis at 65,535 cubes. A kernel
/// finds its row at `CUBE_POS_Y · CUBE_COUNT_X + CUBE_POS_X`.
pub(crate) fn row_grid(rows: usize) -> CubeCount {
    let x = rows.clamp(1, 65_535);
    CubeCount::Static(x as u32, rows.div_ceil(x) as u32, 1)
}

/// `(rows, W)` of `shape = [..., W]`: the leading axes are the rows.
pub(crate) fn rows_and_width(shape: &Shape) -> (usize, usize) {
    let dims = shape.as_slice();
    let width = *dims.last().expect("row-wise kernel: a tensor of rank ≥ 1");
    (dims[..dims.len() - 1].iter().product(), width)
}

/// The row pitch of a tensor `[..., W]` whose rows (all leading axes together) follow each other
/// at one stride with unit column stride — contiguous, or pitched by the allocator — or `None`.
pub(crate) fn row_pitch(t: &CubeTensor) -> Option<usize> {
    let shape = t.meta.shape().as_slice();
    let s = t.meta.strides();
    let rank = shape.len();
    let (rows, width) = rows_and_width(t.meta.shape());
    if t.meta.tiling != Default::default() || rank < 2 || (s[rank - 1] != 1 && width > 1) {
        return None;
    }
    if rows <= 1 {
        return Some(width);
    }
    let pitch = s[rank - 2];
    // Each leading axis steps over the whole of the axes after it (unit axes step anywhere).
    let uniform = (0..rank - 2).all(|i| shape[i] == 1 || s[i] == shape[i + 1] * s[i + 1]);
    (uniform && pitch >= width).then_some(pitch)
}

/// `t` as rows at one pitch (see [`row_pitch`]) and that pitch; a contiguous copy for any other
/// layout.
pub(crate) fn rows_of(t: CubeTensor) -> (CubeTensor, usize) {
    match row_pitch(&t) {
        Some(pitch) => (t, pitch),
        None => {
            let width = rows_and_width(t.meta.shape()).1;
            (into_contiguous(t), width)
        }
    }
}

/// A new tensor of `like`'s shape and dtype on its device, and the pitch of its rows (on CUDA the
/// allocator pads rows whose bytes are not a multiple of its alignment).
pub(crate) fn new_rows(like: &CubeTensor) -> (CubeTensor, usize) {
    let out = empty_device_dtype(
        like.client.clone(),
        like.device.clone(),
        like.meta.shape().clone(),
        like.dtype,
    );
    let pitch = row_pitch(&out).expect("a new tensor's rows follow at one pitch");
    (out, pitch)
}
