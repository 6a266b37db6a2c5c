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

/// The log-sum-exp of a row whose columns are spread over the cube's `units` units (a power of
/// two), from each unit's running maximum `m` and `s = Σ e^{x − m}` over its columns: merged
/// pairwise in shared memory; every unit gets the result. A unit without columns passes the
/// lowest finite f32 as `m` and 0 as `s` — a stand-in for −∞ that keeps an empty merge at 0
/// where `e^{−∞ + ∞}` would give NaN.
#[cube]
pub(crate) fn cube_logsumexp(m: f32, s: f32, #[comptime] units: usize) -> f32 {
    let u = UNIT_POS_X as usize;
    let mut sm = Shared::<[f32]>::new_slice(units);
    let mut ss = Shared::<[f32]>::new_slice(units);
    sm[u] = m;
    ss[u] = s;
    sync_cube();
    // The cube's width (= `units`) read at run time: the stride changes in the loop.
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if u < stride {
            let (m1, m2) = (sm[u], sm[u + stride]);
            let mx = f32::max(m1, m2);
            ss[u] = ss[u] * (m1 - mx).exp() + ss[u + stride] * (m2 - mx).exp();
            sm[u] = mx;
        }
        sync_cube();
        stride /= 2;
    }
    sm[0] + ss[0].ln()
}

/// The sum of one value per unit over the cube's `units` units (a power of two), merged
/// pairwise in shared memory; every unit gets the result.
#[cube]
pub(crate) fn cube_sum(v: f32, #[comptime] units: usize) -> f32 {
    let u = UNIT_POS_X as usize;
    let mut s = Shared::<[f32]>::new_slice(units);
    s[u] = v;
    sync_cube();
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if u < stride {
            s[u] += s[u + stride];
        }
        sync_cube();
        stride /= 2;
    }
    s[0]
}
