//! The softmax of causal attention scores as one kernel each way, for the Transformer baseline
//! on CubeCL devices: `probs = softmax(scale · scores + causal mask)` row by row, and its
//! backward `dscores = scale · probs ⊙ (dprobs − Σ_j probs_j dprobs_j)`. With the two products
//! around it on cuBLAS ([`crate::linalg::matmul`]), attention costs two products and one pass
//! over the scores each way.
//!
//! Why not Burn's `attention`: under autodiff Burn 0.22 runs its fallback (a dozen separate
//! tensor ops over the `[B, H, T, T]` scores, f32 casts included; its flash kernels have no
//! backward), which made our Transformer's step 666 ms at the published LM setting
//! (bench/RESULTS.md, session 6). This is **not** FlashAttention: the scores and probabilities
//! are materialised (`B·H·T²` elements, and autodiff keeps the probabilities of every layer
//! for the backward), so memory grows as T² — 4.3 GB a layer in bf16 at T = 8192 × 4 — where a
//! flash kernel keeps O(T). It is what makes the softmax baseline's step time a comparison of
//! methods at the LM settings rather than of implementations.
//!
//! Query `i` of a row block (`i = row mod queries`) sees keys `0 ..= past + i`: `past` keys
//! precede the queries (a KV cache); `past ≥ keys` sees every key (no mask). Masked
//! probabilities are written as 0, and their gradient as 0.

use burn::backend::cubecl::dtype_to_storage_type;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::rows::{cube_logsumexp, new_rows, row_grid, rows_and_width, rows_of};

/// Units per cube of the softmax kernels (one cube per row of scores).
pub const SOFTMAX_THREADS: usize = 128;
// The tree reductions below need a power of two.
const _: () = assert!(SOFTMAX_THREADS.is_power_of_two());

/// Keys that query row `row` sees: `min(past + (row mod queries) + 1, keys)`.
#[cube]
fn visible_keys(row: usize, queries: usize, past: usize, keys: usize) -> usize {
    let seen = past + row % queries + 1;
    if seen < keys { seen } else { keys }
}

/// Per row: `probs[j] = e^{scale·x_j − lse}` for the visible keys (`lse` over them, in f32), 0
/// for the others.
///
/// Shapes: `scores, probs: [rows, keys]` (dtype `E`, rows at `r · pitch` and `r · p_pitch`, unit
/// column stride).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn causal_softmax_kernel<E: Float>(
    scores: &Tensor<E>,
    probs: &mut Tensor<E>,
    rows: usize,
    keys: usize,
    queries: usize,
    past: usize,
    pitch: usize,
    p_pitch: usize,
    scale: f32,
    #[define(E)] _dtype: ElemType,
) {
    let row = CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize;
    if row >= rows {
        terminate!();
    }
    let u = UNIT_POS_X as usize;
    let (base, p_base) = (row * pitch, row * p_pitch);
    let visible = visible_keys(row, queries, past, keys);
    // Online softmax per unit: the running maximum m and Σ e^{x−m} of its columns (see
    // `cube_logsumexp` for the start at the lowest finite f32).
    let mut m = f32::min_value();
    let mut s = 0.0f32;
    let mut j = u;
    while j < visible {
        let x = f32::cast_from(scores[base + j]) * scale;
        if x > m {
            s = s * (m - x).exp() + 1.0f32;
            m = x;
        } else {
            s += (x - m).exp();
        }
        j += SOFTMAX_THREADS;
    }
    let lse = cube_logsumexp(m, s, SOFTMAX_THREADS);
    let mut j = u;
    while j < keys {
        let mut p = 0.0f32;
        if j < visible {
            p = (f32::cast_from(scores[base + j]) * scale - lse).exp();
        }
        probs[p_base + j] = E::cast_from(p);
        j += SOFTMAX_THREADS;
    }
}

/// Per row: `dscores[j] = scale · probs[j] · (dprobs[j] − Σ_i probs[i] dprobs[i])` (f32 inside),
/// 0 for the masked keys.
///
/// Shapes: `probs, dprobs, dscores: [rows, keys]` (dtype `E`, rows at their own pitch, unit
/// column stride).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn causal_softmax_backward_kernel<E: Float>(
    probs: &Tensor<E>,
    dprobs: &Tensor<E>,
    dscores: &mut Tensor<E>,
    rows: usize,
    keys: usize,
    queries: usize,
    past: usize,
    p_pitch: usize,
    g_pitch: usize,
    d_pitch: usize,
    scale: f32,
    #[define(E)] _dtype: ElemType,
) {
    let row = CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize;
    if row >= rows {
        terminate!();
    }
    let u = UNIT_POS_X as usize;
    let (p_base, g_base, d_base) = (row * p_pitch, row * g_pitch, row * d_pitch);
    let visible = visible_keys(row, queries, past, keys);
    let mut dot = 0.0f32;
    let mut j = u;
    while j < visible {
        dot += f32::cast_from(probs[p_base + j]) * f32::cast_from(dprobs[g_base + j]);
        j += SOFTMAX_THREADS;
    }
    let mut sd = Shared::<[f32]>::new_slice(SOFTMAX_THREADS);
    sd[u] = dot;
    sync_cube();
    let mut stride = 64usize;
    while stride > 0 {
        if u < stride {
            sd[u] += sd[u + stride];
        }
        sync_cube();
        stride /= 2;
    }
    let dot = sd[0];
    let mut j = u;
    while j < keys {
        let mut d = 0.0f32;
        if j < visible {
            let p = f32::cast_from(probs[p_base + j]);
            d = scale * p * (f32::cast_from(dprobs[g_base + j]) - dot);
        }
        dscores[d_base + j] = E::cast_from(d);
        j += SOFTMAX_THREADS;
    }
}

/// `(rows, keys, queries)` of scores `[..., queries, keys]`.
fn softmax_dims(t: &CubeTensor) -> (usize, usize, usize) {
    let dims = t.meta.shape().as_slice();
    assert!(
        dims.len() >= 2,
        "causal_softmax: scores {dims:?} (expected [..., queries, keys])"
    );
    let (rows, keys) = rows_and_width(t.meta.shape());
    (rows, keys, dims[dims.len() - 2])
}

/// [`causal_softmax_kernel`] over scores `[..., queries, keys]` (rows pitched or not).
pub fn causal_softmax(scores: CubeTensor, scale: f32, past: usize) -> CubeTensor {
    let (rows, keys, queries) = softmax_dims(&scores);
    let (scores, pitch) = rows_of(scores);
    let (probs, p_pitch) = new_rows(&scores);
    if rows > 0 && keys > 0 {
        causal_softmax_kernel::launch(
            &scores.client.clone(),
            row_grid(rows),
            CubeDim::new_1d(SOFTMAX_THREADS as u32),
            scores.clone().into_tensor_arg(),
            probs.clone().into_tensor_arg(),
            rows,
            keys,
            queries,
            past,
            pitch,
            p_pitch,
            scale,
            dtype_to_storage_type(scores.dtype),
        );
    }
    probs
}

/// [`causal_softmax_backward_kernel`]: the scores' gradient from the probabilities and their
/// gradient `dprobs` (cast to the probabilities' dtype).
pub fn causal_softmax_backward(
    probs: CubeTensor,
    dprobs: CubeTensor,
    scale: f32,
    past: usize,
) -> CubeTensor {
    let (rows, keys, queries) = softmax_dims(&probs);
    let dprobs = super::cast(dprobs, probs.dtype);
    let (probs, p_pitch) = rows_of(probs);
    let (dprobs, g_pitch) = rows_of(dprobs);
    let (dscores, d_pitch) = new_rows(&probs);
    if rows > 0 && keys > 0 {
        causal_softmax_backward_kernel::launch(
            &probs.client.clone(),
            row_grid(rows),
            CubeDim::new_1d(SOFTMAX_THREADS as u32),
            probs.clone().into_tensor_arg(),
            dprobs.into_tensor_arg(),
            dscores.clone().into_tensor_arg(),
            rows,
            keys,
            queries,
            past,
            p_pitch,
            g_pitch,
            d_pitch,
            scale,
            dtype_to_storage_type(probs.dtype),
        );
    }
    dscores
}
