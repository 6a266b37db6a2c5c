//! The λ-MLP of the adaptive-decay modes as one kernel each way:
//! `λ = head(W2 · gelu(W1 · dl + b1) + b2)` per (token, head) row of `L` levels, `head` softplus
//! or a softmax over the levels ([`crate::nn::LambdaMlp`] is the tensor version they are tested
//! against).
//!
//! Why: as tensor ops the MLP ran two f32 products with a dimension of 15 (the levels; cuBLAS at
//! 6–11 TFLOP/s), wrote and re-read `[rows, hidden]` activations of 67 MB a layer at the LM
//! setting, and added ≈ 190 launches a step: the λ-MLP step took 1.12× the λ-linear one
//! (bench/RESULTS.md, session 10). Here the forward keeps each row's hidden layer in registers
//! and shared memory, and the backward recomputes it: nothing of width `hidden` is stored.
//!
//! Forward: one unit per row, [`MLP_ROWS`] rows per cube, the row's values in shared memory.
//! Backward: the same rows per block; each unit first computes its row's `dy` (through the
//! head), `dpre = (W2 dy) ⊙ gelu'(pre)` and `ddl = W1 dpre`, then the cube sums the weight
//! gradients of the block (`dW1 = Σ dl ⊗ dpre`, `dW2 = Σ h ⊗ dy`, `db1 = Σ dpre`, `db2 = Σ dy`)
//! into per-cube accumulators in shared memory, each unit owning a fixed set of entries (no
//! atomics); a cube walks several blocks, and the per-cube partial sums are added afterwards.
//! Everything is computed in f32.
//!
//! Rows sit in shared memory at an odd stride ([`padded`]): unit `u` reads entry `j` of its row
//! at `u · stride + j`, and with the hidden width's 64 as stride all 32 units of a warp hit the
//! same bank (a 32-way conflict on every access; the backward took 8× the forward's time, 1.4 ms
//! a layer at the LM setting). An odd stride spreads them over all banks, and the weight-gradient
//! sums, where consecutive units read consecutive entries of one row, stay conflict-free too.
//!
//! Replicas: the weights may carry a leading replica axis (`w1: [R, L, hidden]`, ...), the rows
//! of `dl` then come replica by replica (`[R, rows/R, L]`), and each replica has its own head
//! (`softmax_head[r]`: 1 for a softmax over the levels, 0 for softplus) — the packed models of a
//! sweep, which may mix the two MLP modes. A block of rows never spans two replicas, and the
//! backward's cubes each work for one replica.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::Cb;
use super::rows::{new_rows, row_grid, rows_and_width, rows_of};

/// Rows per block and units per cube (one row per unit).
pub const MLP_ROWS: usize = 32;
/// Cubes of the backward at most: each walks `blocks / cubes` blocks and writes one partial sum
/// of the weight gradients, which are then added (fewer cubes, fewer partials to add).
const BACKWARD_CUBES: usize = 1024;

/// The row stride in shared memory for rows of `width` entries: odd, so that 32 units reading
/// entry `j` of their own rows touch 32 different banks.
pub const fn padded(width: usize) -> usize {
    width | 1
}

/// `gelu(x) = x · Φ(x)` (exact, through erf, as Burn's `gelu`).
#[cube]
fn gelu(x: f32) -> f32 {
    0.5f32 * x * (1.0f32 + Erf::erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `gelu'(x) = Φ(x) + x · φ(x)`.
#[cube]
fn gelu_grad(x: f32) -> f32 {
    let phi = (-0.5f32 * x * x).exp() * 0.398_942_3f32; // 1/√(2π)
    0.5f32 * (1.0f32 + Erf::erf(x * std::f32::consts::FRAC_1_SQRT_2)) + x * phi
}

/// `ln(1 + e^y)` without overflow.
#[cube]
fn softplus(y: f32) -> f32 {
    f32::max(y, 0.0f32) + (1.0f32 + (-f32::abs(y)).exp()).ln()
}

/// `σ(y) = softplus'(y)`.
#[cube]
fn sigmoid(y: f32) -> f32 {
    1.0f32 / (1.0f32 + (-y).exp())
}

/// `y[o .. o + L]` replaced by `softmax(y)` (shifted by its maximum), one row of one unit.
#[cube]
fn softmax_in_place(y: &mut Shared<[f32]>, o: usize, #[comptime] levels: usize) {
    let mut m = y[o];
    for k in 1..levels {
        m = f32::max(m, y[o + k]);
    }
    let mut s = 0.0f32;
    for k in 0..levels {
        let e = (y[o + k] - m).exp();
        y[o + k] = e;
        s += e;
    }
    for k in 0..levels {
        y[o + k] /= s;
    }
}

/// The logits `y = W2 · gelu(W1 · x + b1) + b2` of the row whose `x` is at `sx[o .. o + L]`,
/// written to `sy[o .. o + L]`; with `keep`, each `pre_j = (W1 · x + b1)_j` and `gelu(pre_j)` go
/// to `spre[oh + j]` and `sh[oh + j]`; the weights are replica `rep`'s. The weights are read from global memory: all units of a
/// cube read the same entry at once (one broadcast load, cached), and shared memory stays free
/// for the rows (the backward's needs come to 28 KB at L = 15, hidden 64; lavapipe offers 32).
#[cube]
#[allow(clippy::too_many_arguments)]
fn row_logits<E: Float>(
    sx: &Shared<[f32]>,
    sy: &mut Shared<[f32]>,
    w1: &Tensor<E>,
    b1: &Tensor<E>,
    w2: &Tensor<E>,
    b2: &Tensor<E>,
    spre: &mut Shared<[f32]>,
    sh: &mut Shared<[f32]>,
    o: usize,
    oh: usize,
    rep: usize,
    #[comptime] levels: usize,
    #[comptime] hidden: usize,
    #[comptime] keep: bool,
) {
    // This replica's weights.
    let (wo, b1o, b2o) = (rep * levels * hidden, rep * hidden, rep * levels);
    for k in 0..levels {
        sy[o + k] = f32::cast_from(b2[b2o + k]);
    }
    for j in 0..hidden {
        let mut pre = f32::cast_from(b1[b1o + j]);
        for i in 0..levels {
            pre += sx[o + i] * f32::cast_from(w1[wo + i * hidden + j]);
        }
        let h = gelu(pre);
        if comptime!(keep) {
            spre[oh + j] = pre;
            sh[oh + j] = h;
        }
        for k in 0..levels {
            sy[o + k] += h * f32::cast_from(w2[wo + j * levels + k]);
        }
    }
}

/// λ of each row. Shapes: `dl, lambda: [R · per, L]` (dtype `E`, rows at `r · pitch` and
/// `r · out_pitch`), `w1: [R, L, hidden]`, `b1: [R, hidden]`, `w2: [R, hidden, L]`, `b2: [R, L]`
/// (contiguous), `softmax_head: [R]`; `blocks` = ⌈per / MLP_ROWS⌉ blocks per replica.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn lambda_mlp_kernel<E: Float, I: Int>(
    dl: &Tensor<E>,
    w1: &Tensor<E>,
    b1: &Tensor<E>,
    w2: &Tensor<E>,
    b2: &Tensor<E>,
    softmax_head: &Tensor<I>,
    lambda: &mut Tensor<E>,
    replicas: usize,
    per: usize,
    blocks: usize,
    pitch: usize,
    out_pitch: usize,
    #[comptime] levels: usize,
    #[comptime] hidden: usize,
    #[define(E, I)] _dtypes: [ElemType; 2],
) {
    let u = UNIT_POS_X as usize;
    let block = CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize;
    let (rep, local) = (block / blocks, block % blocks);
    let mut sx = Shared::<[f32]>::new_slice(comptime!(MLP_ROWS * padded(levels)));
    let mut sy = Shared::<[f32]>::new_slice(comptime!(MLP_ROWS * padded(levels)));
    // Unused by the forward (`keep` is false): the smallest placeholders.
    let mut spre = Shared::<[f32]>::new_slice(1usize);
    let mut sh = Shared::<[f32]>::new_slice(1usize);
    let in_replica = local * MLP_ROWS + u;
    if rep < replicas && in_replica < per {
        let row = rep * per + in_replica;
        let o = u * comptime!(padded(levels));
        for i in 0..levels {
            sx[o + i] = f32::cast_from(dl[row * pitch + i]);
        }
        row_logits::<E>(
            &sx, &mut sy, w1, b1, w2, b2, &mut spre, &mut sh, o, 0, rep, levels, hidden, false,
        );
        if u32::cast_from(softmax_head[rep]) == 1 {
            softmax_in_place(&mut sy, o, levels);
            for k in 0..levels {
                lambda[row * out_pitch + k] = E::cast_from(sy[o + k]);
            }
        } else {
            for k in 0..levels {
                lambda[row * out_pitch + k] = E::cast_from(softplus(sy[o + k]));
            }
        }
    }
}

/// The gradients of [`lambda_mlp_kernel`] for `dlambda`: `ddl: [R · per, L]` (rows at
/// `d_pitch`) and per-cube partial sums `p_w1: [R, cubes, L·hidden]`, `p_w2: [R, cubes,
/// hidden·L]`, `p_b1: [R, cubes, hidden]`, `p_b2: [R, cubes, L]` (f32) of the weights' gradients.
/// Grid: `cubes × R`, cube `(c, r)` walking replica `r`'s blocks `c, c + cubes, ...`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn lambda_mlp_backward_kernel<E: Float, I: Int>(
    dl: &Tensor<E>,
    w1: &Tensor<E>,
    b1: &Tensor<E>,
    w2: &Tensor<E>,
    b2: &Tensor<E>,
    softmax_head: &Tensor<I>,
    dlambda: &Tensor<E>,
    ddl: &mut Tensor<E>,
    p_w1: &mut Tensor<f32>,
    p_w2: &mut Tensor<f32>,
    p_b1: &mut Tensor<f32>,
    p_b2: &mut Tensor<f32>,
    per: usize,
    pitch: usize,
    g_pitch: usize,
    d_pitch: usize,
    #[comptime] levels: usize,
    #[comptime] hidden: usize,
    #[define(E, I)] _dtypes: [ElemType; 2],
) {
    let u = UNIT_POS_X as usize;
    let cube = CUBE_POS_X as usize;
    let cubes = CUBE_COUNT_X as usize;
    let rep = CUBE_POS_Y as usize;
    let blocks = per.div_ceil(MLP_ROWS);
    let softmax = u32::cast_from(softmax_head[rep]) == 1;
    // Where this cube's partial sums go among all cubes of all replicas.
    let slot = rep * cubes + cube;
    let wo = rep * levels * hidden;
    let lh = comptime!(levels * hidden);
    let (ls, hs) = comptime!((padded(levels), padded(hidden)));
    let mut sx = Shared::<[f32]>::new_slice(comptime!(MLP_ROWS * padded(levels)));
    let mut sy = Shared::<[f32]>::new_slice(comptime!(MLP_ROWS * padded(levels)));
    let mut spre = Shared::<[f32]>::new_slice(comptime!(MLP_ROWS * padded(hidden)));
    let mut sh = Shared::<[f32]>::new_slice(comptime!(MLP_ROWS * padded(hidden)));
    // This cube's sums: dW1 (L·hidden), dW2 (hidden·L), db1 (hidden), db2 (L).
    let n_acc = comptime!(2 * levels * hidden + hidden + levels);
    let mut acc = Shared::<[f32]>::new_slice(comptime!(2 * levels * hidden + hidden + levels));
    let mut e = u;
    while e < n_acc {
        acc[e] = 0.0f32;
        e += MLP_ROWS;
    }
    sync_cube();
    let (o, oh) = (u * ls, u * hs);
    let mut block = cube;
    while block < blocks {
        let in_replica = block * MLP_ROWS + u;
        if in_replica < per {
            let row = rep * per + in_replica;
            for i in 0..levels {
                sx[o + i] = f32::cast_from(dl[row * pitch + i]);
            }
            row_logits::<E>(
                &sx, &mut sy, w1, b1, w2, b2, &mut spre, &mut sh, o, oh, rep, levels, hidden, true,
            );
            // dy through the head, into sy.
            if softmax {
                // dy = p ⊙ (g − Σ p g), p the head's probabilities.
                softmax_in_place(&mut sy, o, levels);
                let mut dot = 0.0f32;
                for k in 0..levels {
                    dot += sy[o + k] * f32::cast_from(dlambda[row * g_pitch + k]);
                }
                for k in 0..levels {
                    sy[o + k] *= f32::cast_from(dlambda[row * g_pitch + k]) - dot;
                }
            } else {
                for k in 0..levels {
                    sy[o + k] = f32::cast_from(dlambda[row * g_pitch + k]) * sigmoid(sy[o + k]);
                }
            }
            // dpre = (W2 dy) ⊙ gelu'(pre), into spre.
            for j in 0..hidden {
                let mut dh = 0.0f32;
                for k in 0..levels {
                    dh += f32::cast_from(w2[wo + j * levels + k]) * sy[o + k];
                }
                spre[oh + j] = dh * gelu_grad(spre[oh + j]);
            }
            for i in 0..levels {
                let mut d = 0.0f32;
                for j in 0..hidden {
                    d += f32::cast_from(w1[wo + i * hidden + j]) * spre[oh + j];
                }
                ddl[row * d_pitch + i] = E::cast_from(d);
            }
        } else {
            // A row past the end adds nothing to the sums.
            for i in 0..levels {
                sx[o + i] = 0.0f32;
                sy[o + i] = 0.0f32;
            }
            for j in 0..hidden {
                spre[oh + j] = 0.0f32;
                sh[oh + j] = 0.0f32;
            }
        }
        sync_cube();
        // The block's weight gradients: unit u owns entries u, u + MLP_ROWS, ...
        let mut e = u;
        while e < n_acc {
            let mut s = 0.0f32;
            if e < lh {
                let (i, j) = (e / hidden, e % hidden);
                for r in 0..MLP_ROWS {
                    s += sx[r * ls + i] * spre[r * hs + j];
                }
            } else if e < 2 * lh {
                let (j, k) = ((e - lh) / levels, (e - lh) % levels);
                for r in 0..MLP_ROWS {
                    s += sh[r * hs + j] * sy[r * ls + k];
                }
            } else if e < 2 * lh + hidden {
                let j = e - 2 * lh;
                for r in 0..MLP_ROWS {
                    s += spre[r * hs + j];
                }
            } else {
                let k = e - 2 * lh - hidden;
                for r in 0..MLP_ROWS {
                    s += sy[r * ls + k];
                }
            }
            acc[e] += s;
            e += MLP_ROWS;
        }
        sync_cube();
        block += cubes;
    }
    let mut e = u;
    while e < n_acc {
        if e < lh {
            p_w1[slot * lh + e] = acc[e];
        } else if e < 2 * lh {
            p_w2[slot * lh + e - lh] = acc[e];
        } else if e < 2 * lh + hidden {
            p_b1[slot * hidden + e - 2 * lh] = acc[e];
        } else {
            p_b2[slot * levels + e - 2 * lh - hidden] = acc[e];
        }
        e += MLP_ROWS;
    }
}

/// Bytes of shared memory a cube of the backward kernel takes (the forward takes less): the
/// block's `dl` and `dy` rows (`MLP_ROWS` rows of [`padded`]`(L)` each), its `pre` and `h` rows
/// (of `padded(hidden)`) and the weight-gradient sums (`2 · L · hidden + hidden + L`), in f32.
pub fn shared_bytes(levels: usize, hidden: usize) -> usize {
    let rows = 2 * MLP_ROWS * (padded(levels) + padded(hidden));
    4 * (rows + 2 * levels * hidden + hidden + levels)
}

/// `(replicas, levels, hidden, rows per replica)` of the weights and `dl`, checked: weights
/// `w1: [L, H]` or `[R, L, H]` (and `w2` alike, transposed), `dl: [..., L]` with a row count
/// that the replicas divide.
fn mlp_dims(dl: &CubeTensor, w1: &CubeTensor, w2: &CubeTensor) -> (usize, usize, usize, usize) {
    let (rows, levels) = rows_and_width(dl.meta.shape());
    let (d1, d2) = (w1.meta.shape().as_slice(), w2.meta.shape().as_slice());
    let (replicas, l1, hidden, h2, l2) = match (d1, d2) {
        (&[l1, h], &[h2, l2]) => (1, l1, h, h2, l2),
        (&[r, l1, h], &[r2, h2, l2]) if r == r2 => (r, l1, h, h2, l2),
        _ => (0, 0, 0, 0, 0),
    };
    assert!(
        replicas > 0 && l1 == levels && l2 == levels && h2 == hidden && rows % replicas == 0,
        "lambda_mlp: dl {:?} with W1 {d1:?} and W2 {d2:?} (expected [..., L], [(R,) L, H], \
         [(R,) H, L], the rows of dl a multiple of R)",
        dl.meta.shape().as_slice(),
    );
    (replicas, levels, hidden, rows / replicas)
}

/// λ of `dl: [..., L]` (see [`lambda_mlp_kernel`]; for `R` replicas, `dl`'s rows replica by
/// replica); the weights are made contiguous and cast to `dl`'s dtype; `softmax_head: [R]`
/// (integers, 1 = softmax, 0 = softplus).
pub fn lambda_mlp(
    dl: CubeTensor,
    w1: CubeTensor,
    b1: CubeTensor,
    w2: CubeTensor,
    b2: CubeTensor,
    softmax_head: CubeTensor,
) -> CubeTensor {
    let (replicas, levels, hidden, per) = mlp_dims(&dl, &w1, &w2);
    let dtype = dl.dtype;
    let weight = |t: CubeTensor| into_contiguous(super::cast(t, dtype));
    let (dl, pitch) = rows_of(dl);
    let (lambda, out_pitch) = new_rows(&dl);
    let blocks = per.div_ceil(MLP_ROWS);
    if per > 0 {
        let dtypes = [
            dtype_to_storage_type(dtype),
            dtype_to_storage_type(softmax_head.dtype),
        ];
        lambda_mlp_kernel::launch(
            &dl.client.clone(),
            row_grid(replicas * blocks),
            CubeDim::new_1d(MLP_ROWS as u32),
            dl.clone().into_tensor_arg(),
            weight(w1).into_tensor_arg(),
            weight(b1).into_tensor_arg(),
            weight(w2).into_tensor_arg(),
            weight(b2).into_tensor_arg(),
            into_contiguous(softmax_head).into_tensor_arg(),
            lambda.clone().into_tensor_arg(),
            replicas,
            per,
            blocks,
            pitch,
            out_pitch,
            levels,
            hidden,
            dtypes,
        );
    }
    lambda
}

/// The gradients `(ddl, dW1, db1, dW2, db2)` of [`lambda_mlp`] for the output gradient
/// `dlambda`; each in the dtype (and shape) of the tensor it belongs to.
#[allow(clippy::too_many_arguments)]
pub fn lambda_mlp_backward(
    dl: CubeTensor,
    w1: CubeTensor,
    b1: CubeTensor,
    w2: CubeTensor,
    b2: CubeTensor,
    softmax_head: CubeTensor,
    dlambda: CubeTensor,
) -> [CubeTensor; 5] {
    let (replicas, levels, hidden, per) = mlp_dims(&dl, &w1, &w2);
    let dtype = dl.dtype;
    let shapes = [&w1, &b1, &w2, &b2].map(|t| (t.meta.shape().clone(), t.dtype));
    let weight = |t: CubeTensor| into_contiguous(super::cast(t, dtype));
    let (dl, pitch) = rows_of(dl);
    let (dlambda, g_pitch) = rows_of(super::cast(dlambda, dtype));
    let (ddl, d_pitch) = new_rows(&dl);
    // Cubes per replica: about BACKWARD_CUBES in all.
    let cubes = per
        .div_ceil(MLP_ROWS)
        .clamp(1, (BACKWARD_CUBES / replicas).max(1));
    let (client, device) = (dl.client.clone(), dl.device.clone());
    let partial = |width: usize| {
        empty_device_contiguous_dtype(
            client.clone(),
            device.clone(),
            Shape::new([replicas, cubes, width]),
            DType::F32,
        )
    };
    let (p_w1, p_w2, p_b1, p_b2) = (
        partial(levels * hidden),
        partial(levels * hidden),
        partial(hidden),
        partial(levels),
    );
    let dtypes = [
        dtype_to_storage_type(dtype),
        dtype_to_storage_type(softmax_head.dtype),
    ];
    lambda_mlp_backward_kernel::launch(
        &client,
        CubeCount::Static(cubes as u32, replicas as u32, 1),
        CubeDim::new_1d(MLP_ROWS as u32),
        dl.into_tensor_arg(),
        weight(w1).into_tensor_arg(),
        weight(b1).into_tensor_arg(),
        weight(w2).into_tensor_arg(),
        weight(b2).into_tensor_arg(),
        into_contiguous(softmax_head).into_tensor_arg(),
        dlambda.into_tensor_arg(),
        ddl.clone().into_tensor_arg(),
        p_w1.clone().into_tensor_arg(),
        p_w2.clone().into_tensor_arg(),
        p_b1.clone().into_tensor_arg(),
        p_b2.clone().into_tensor_arg(),
        per,
        pitch,
        g_pitch,
        d_pitch,
        levels,
        hidden,
        dtypes,
    );
    // The cubes' partial sums added, in the weights' own shapes and dtypes.
    let total = |p: CubeTensor, (shape, dtype): (Shape, DType)| {
        super::cast(Cb::float_reshape(Cb::float_sum_dim(p, 1), shape), dtype)
    };
    let [s_w1, s_b1, s_w2, s_b2] = shapes;
    [
        ddl,
        total(p_w1, s_w1),
        total(p_b1, s_b1),
        total(p_w2, s_w2),
        total(p_b2, s_b2),
    ]
}
