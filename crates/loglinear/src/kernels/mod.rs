//! CubeCL kernels outside the core op (whose fused form lives in [`crate::ops::fused`]): the
//! softmax cross-entropy of the language model's loss ([`cross_entropy`]), the softmax of the
//! Transformer baseline's attention ([`attention`]), the λ-MLP ([`lambda_mlp`]), batched matrix
//! products with their backward ([`gemm`]; on cuBLAS on CUDA devices with the `cublas`
//! feature), RMSNorm and LayerNorm ([`norm`]), the mixers' causal depthwise convolution
//! ([`conv`]), and what the crate asks of CubeCL devices.

pub mod attention;
pub mod block_attention;
pub mod columns;
pub mod conv;
pub mod cross_entropy;
#[cfg(feature = "cublas")]
mod cublas;
pub mod flash_attention;
pub mod gemm;
pub mod lambda_mlp;
pub mod norm;
mod rows;

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{AutodiffBackend, Backend, DispatchDevice, backend_extension};
use burn::prelude::*;
use burn::tensor::DType;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::CubeBackend;

/// The CubeCL backend the kernels are written for.
pub(crate) type Cb = CubeBackend;

/// `t` in `dtype` (no launch when it already is).
pub(crate) fn cast(t: FloatTensor<Cb>, dtype: DType) -> FloatTensor<Cb> {
    if t.dtype == dtype {
        t
    } else {
        Cb::float_cast(t, dtype.into())
    }
}

/// Softmax cross-entropy per row as two CubeCL kernels with their own backward
/// ([`cross_entropy`]): the entry point is [`softmax_cross_entropy`].
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait CrossEntropyKernels: Backend {
    /// `(nll, lse)`, f32 `[...]` each, from `logits: [..., V']` (any float dtype; rows may be
    /// pitched) of which the first `vocab` columns are scored (the rest are padding), and
    /// `targets: [...]` (integers in `0..vocab`). Only `nll` is differentiable.
    #[allow(clippy::type_complexity)]
    #[fusion(meta = |_logits, targets, _vocab| (
        burn::backend::fusion::custom::TensorSpec::new(targets.shape.clone(), DType::F32),
        burn::backend::fusion::custom::TensorSpec::new(targets.shape.clone(), DType::F32),
    ))]
    fn cross_entropy_rows(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        vocab: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `dlogits: [..., V']` in the dtype of `logits` (0 past `vocab`) for the gradient
    /// `grad: [...]` of `nll`.
    #[fusion(dtype = logits, shape = logits)]
    fn cross_entropy_rows_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        vocab: usize,
    ) -> FloatTensor<Self>;
}

impl CrossEntropyKernels for CubeBackend {
    fn cross_entropy_rows(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        vocab: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        cross_entropy::cross_entropy(logits, targets, vocab)
    }

    fn cross_entropy_rows_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        vocab: usize,
    ) -> FloatTensor<Self> {
        cross_entropy::cross_entropy_backward(logits, targets, lse, cast(grad, DType::F32), vocab)
    }
}

impl<B: Backend + CrossEntropyKernels, C: CheckpointStrategy> CrossEntropyKernels
    for Autodiff<B, C>
{
    fn cross_entropy_rows(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        vocab: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        #[derive(Debug)]
        struct RowsBackward;

        impl<B: Backend + CrossEntropyKernels> Backward<B, 1> for RowsBackward {
            type State = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>, usize);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let (logits, targets, lse, vocab) = ops.state;
                let [parent] = ops.parents;
                if let Some(node) = parent {
                    let d = B::cross_entropy_rows_backward(logits, targets, lse, grad, vocab);
                    grads.register::<B>(node.id, d);
                }
            }
        }

        let node = logits.node();
        let logits = logits.into_primitive();
        let (nll, lse) = B::cross_entropy_rows(logits.clone(), targets.clone(), vocab);
        let nll = match RowsBackward.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((logits, targets, lse.clone(), vocab), nll),
            OpsKind::UnTracked(prep) => prep.finish(nll),
        };
        (nll, <Self as AutodiffBackend>::from_inner(lse))
    }

    fn cross_entropy_rows_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        vocab: usize,
    ) -> FloatTensor<Self> {
        // Not itself differentiable: a constant.
        <Self as AutodiffBackend>::from_inner(B::cross_entropy_rows_backward(
            logits.into_primitive(),
            targets,
            lse.into_primitive(),
            grad.into_primitive(),
            vocab,
        ))
    }
}

/// Per-row softmax cross-entropy `logsumexp(x) − x[target]` over the first `vocab` columns, in
/// f32, by the fused kernels on a CubeCL device (`None` elsewhere: the caller uses tensor ops).
/// The logits are read as they lie in memory: rows that the allocator pitched are not copied,
/// and columns past `vocab` (padding) are neither read nor given a gradient other than 0.
///
/// # Shapes
/// `logits: [..., V']` (rank `D`, `V' ≥ vocab`), `targets: [...]` (rank `DT = D − 1`, in
/// `0..vocab`) → `[...]`.
pub fn softmax_cross_entropy<const D: usize, const DT: usize>(
    logits: &Tensor<D>,
    targets: &Tensor<DT, Int>,
    vocab: usize,
) -> Option<Tensor<DT>> {
    assert!(
        D == DT + 1 && logits.dims()[..DT] == targets.dims()[..],
        "softmax_cross_entropy: logits {:?} for targets {:?} (expected [..., V] and [...])",
        logits.dims(),
        targets.dims()
    );
    if !is_cube_device(&logits.device()) {
        return None;
    }
    let (nll, _lse) = <burn::backend::Dispatch as CrossEntropyKernels>::cross_entropy_rows(
        logits.clone().into_dispatch(),
        targets.clone().into_dispatch(),
        vocab,
    );
    Some(Tensor::from_dispatch(nll))
}

/// The softmax of causal attention scores as two CubeCL kernels with their own backward
/// ([`attention`]): the entry point is [`attention_softmax`].
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait AttentionKernels: Backend {
    /// `softmax(scale · scores)` over the last axis, query `i` (second-to-last axis) seeing keys
    /// `0 ..= past + i` (0 for the others), in the dtype of `scores` (computed in f32).
    #[fusion(dtype = scores, shape = scores)]
    fn causal_softmax(scores: FloatTensor<Self>, scale: f32, past: usize) -> FloatTensor<Self>;

    /// The gradient of [`Self::causal_softmax`]'s input from its output `probs` and the output's
    /// gradient `grad`.
    #[fusion(dtype = probs, shape = probs)]
    fn causal_softmax_backward(
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        scale: f32,
        past: usize,
    ) -> FloatTensor<Self>;
}

impl AttentionKernels for CubeBackend {
    fn causal_softmax(scores: FloatTensor<Self>, scale: f32, past: usize) -> FloatTensor<Self> {
        attention::causal_softmax(scores, scale, past)
    }

    fn causal_softmax_backward(
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        scale: f32,
        past: usize,
    ) -> FloatTensor<Self> {
        attention::causal_softmax_backward(probs, grad, scale, past)
    }
}

impl<B: Backend + AttentionKernels, C: CheckpointStrategy> AttentionKernels for Autodiff<B, C> {
    fn causal_softmax(scores: FloatTensor<Self>, scale: f32, past: usize) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct SoftmaxBackward;

        impl<B: Backend + AttentionKernels> Backward<B, 1> for SoftmaxBackward {
            type State = (FloatTensor<B>, f32, usize);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let (probs, scale, past) = ops.state;
                if let [Some(node)] = ops.parents {
                    let d = B::causal_softmax_backward(probs, grad, scale, past);
                    grads.register::<B>(node.id, d);
                }
            }
        }

        let node = scores.node();
        let probs = B::causal_softmax(scores.into_primitive(), scale, past);
        match SoftmaxBackward
            .prepare::<C>([node])
            .compute_bound()
            .stateful()
        {
            // The backward needs only the output (which the next product keeps anyway).
            OpsKind::Tracked(prep) => prep.finish((probs.clone(), scale, past), probs),
            OpsKind::UnTracked(prep) => prep.finish(probs),
        }
    }

    fn causal_softmax_backward(
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        scale: f32,
        past: usize,
    ) -> FloatTensor<Self> {
        // Not itself differentiable: a constant.
        <Self as AutodiffBackend>::from_inner(B::causal_softmax_backward(
            probs.into_primitive(),
            grad.into_primitive(),
            scale,
            past,
        ))
    }
}

/// `softmax(scale · scores)` over the last axis with query `i` seeing keys `0 ..= past + i`
/// (probabilities of the others 0), by the kernels above on a CubeCL device (`None` elsewhere:
/// the caller uses tensor ops). `past ≥ keys` masks nothing.
///
/// # Shapes
/// `scores: [..., queries, keys]` → the same.
pub fn attention_softmax<const D: usize>(
    scores: &Tensor<D>,
    scale: f32,
    past: usize,
) -> Option<Tensor<D>> {
    if !is_cube_device(&scores.device()) {
        return None;
    }
    let probs = <burn::backend::Dispatch as AttentionKernels>::causal_softmax(
        scores.clone().into_dispatch(),
        scale,
        past,
    );
    Some(Tensor::from_dispatch(probs))
}

/// Causal attention `block` queries at a time, the backward recomputing each block's
/// probabilities ([`block_attention`]: memory `O(block · T)` instead of `O(T²)`, the key
/// columns a block cannot see never computed), on a CubeCL device (`None` elsewhere). Query `i`
/// sits at position `past + i` and sees keys `0 ..= past + i`.
///
/// # Shapes
/// `q: [N, T, d]`, `k: [N, past + T, d]`, `v: [N, past + T, dv]` → `[N, T, dv]`.
pub fn causal_block_attention(
    q: &Tensor<3>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    scale: f32,
    past: usize,
    block: usize,
) -> Option<Tensor<3>> {
    use block_attention::BlockAttentionKernels;
    if !is_cube_device(&q.device()) {
        return None;
    }
    let o = <burn::backend::Dispatch as BlockAttentionKernels>::block_attention(
        q.clone().into_dispatch(),
        k.clone().into_dispatch(),
        v.clone().into_dispatch(),
        scale,
        past,
        block,
    );
    Some(Tensor::from_dispatch(o))
}

/// Causal attention by the fused kernels of [`flash_attention`] on a CubeCL device (`None`
/// elsewhere): `softmax(scale · q kᵀ + causal mask) · v` with query `i` at position `past + i`
/// seeing keys `0 ..= past + i`, differentiable in `q`, `k` and `v`; `block`: the query and key
/// block edge (0: the largest that fits the device, what callers other than tests pass).
///
/// # Shapes
/// `q: [B, H, T, d]`, `k, v: [B, H, past + T, d]` (any strides), `d` ∈
/// [`flash_attention::HEAD_DIMS`] → `[B, H, T, d]`.
pub fn causal_flash_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    scale: f32,
    past: usize,
    block: usize,
) -> Option<Tensor<4>> {
    use flash_attention::FlashAttentionKernels;
    if !is_cube_device(&q.device()) {
        return None;
    }
    let (o, _lse) = <burn::backend::Dispatch as FlashAttentionKernels>::flash_attention(
        q.clone().into_dispatch(),
        k.clone().into_dispatch(),
        v.clone().into_dispatch(),
        scale,
        past,
        block,
    );
    Some(Tensor::from_dispatch(o))
}

/// Whether [`causal_flash_attention`] runs on tensor cores for `q: [B, H, T, d]` (bf16, a head
/// width it takes, a device whose `cmma` takes bf16 tiles): where it does, the Transformer
/// attends with it.
pub fn flash_attention_on_tensor_cores(q: &Tensor<4>) -> bool {
    is_cube_device(&q.device())
        && q.dtype() == DType::BF16
        && flash_attention::HEAD_DIMS.contains(&q.dims()[3])
        && crate::ops::fused::bf16_cmma(&q.device())
}

/// `x + b` with `b` over `x`'s last axes, its gradient summed over the leading axes by
/// [`columns`]' kernels, on a CubeCL device (`None` elsewhere); `b` is cast to `x`'s dtype.
///
/// # Shapes
/// `x: [..., W...]`, `b: [W...]` (`x`'s last `R` axes) → `x`'s shape.
pub fn add_columns<const D: usize, const R: usize>(
    x: &Tensor<D>,
    b: &Tensor<R>,
) -> Option<Tensor<D>> {
    use columns::ColumnKernels;
    if !is_cube_device(&x.device()) {
        return None;
    }
    let y = <burn::backend::Dispatch as ColumnKernels>::add_columns(
        x.clone().into_dispatch(),
        b.clone().into_dispatch(),
    );
    Some(Tensor::from_dispatch(y))
}

/// `x ⊙ w` with `w` over `x`'s last axes, its gradient summed over the leading axes by
/// [`columns`]' kernels, on a CubeCL device (`None` elsewhere); `w` is cast to `x`'s dtype.
///
/// # Shapes
/// `x: [..., W...]`, `w: [W...]` (`x`'s last `R` axes) → `x`'s shape.
pub fn scale_columns<const D: usize, const R: usize>(
    x: &Tensor<D>,
    w: &Tensor<R>,
) -> Option<Tensor<D>> {
    use columns::ColumnKernels;
    if !is_cube_device(&x.device()) {
        return None;
    }
    let y = <burn::backend::Dispatch as ColumnKernels>::scale_columns(
        x.clone().into_dispatch(),
        w.clone().into_dispatch(),
    );
    Some(Tensor::from_dispatch(y))
}

/// RMSNorm and LayerNorm over the last axis as CubeCL kernels with their own backward
/// ([`norm`]): the entry point is [`fused_norm`].
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait NormKernels: Backend {
    /// `(y, stats)`: `x: [..., D]` normalised over its last axis, `(x − mean) · rstd ⊙ w + b`
    /// where `centered` (LayerNorm) and `x · rstd ⊙ w` otherwise (RMSNorm: `bias` is not read),
    /// `rstd = 1 / sqrt(mean((x − mean)²) + eps)`, computed in f32; `y` in `x`'s dtype, `stats:
    /// [..., 2]` the rows' `(mean, rstd)` in f32. `weight, bias: [D]`, or `[R, D]` for `R`
    /// replicas whose rows of `x` come replica by replica. Only `y` is differentiable.
    #[allow(clippy::type_complexity)]
    #[fusion(meta = |x, _weight, _bias, _eps, _centered| (
        burn::backend::fusion::custom::TensorSpec::new(x.shape.clone(), x.dtype),
        burn::backend::fusion::custom::TensorSpec::new(norm::stats_shape(&x.shape), DType::F32),
    ))]
    fn norm_rows(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f32,
        centered: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients `(dx, dweight, dbias)` of [`Self::norm_rows`]'s `y` for the output
    /// gradient `dy`, each in the shape and dtype of its tensor (`dbias` 0 unless `centered`).
    #[allow(clippy::type_complexity)]
    #[fusion(meta = |x, weight, bias, _stats, _dy, _centered| (
        burn::backend::fusion::custom::TensorSpec::new(x.shape.clone(), x.dtype),
        burn::backend::fusion::custom::TensorSpec::new(weight.shape.clone(), weight.dtype),
        burn::backend::fusion::custom::TensorSpec::new(bias.shape.clone(), bias.dtype),
    ))]
    fn norm_rows_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        centered: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl NormKernels for CubeBackend {
    fn norm_rows(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f32,
        centered: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        norm::norm(x, weight, bias, eps, centered)
    }

    fn norm_rows_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        centered: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [dx, dw, db] = norm::norm_backward(x, weight, bias, stats, dy, centered);
        (dx, dw, db)
    }
}

impl<B: Backend + NormKernels, C: CheckpointStrategy> NormKernels for Autodiff<B, C> {
    fn norm_rows(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f32,
        centered: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        #[derive(Debug)]
        struct NormBackward;

        impl<B: Backend + NormKernels> Backward<B, 3> for NormBackward {
            // The inputs and the rows' statistics; the backward recomputes x̂.
            type State = ([FloatTensor<B>; 4], bool);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let ([x, weight, bias, stats], centered) = ops.state;
                let (dx, dw, db) = B::norm_rows_backward(x, weight, bias, stats, grad, centered);
                let [px, pw, pb] = ops.parents;
                // RMSNorm's bias is a stand-in (the weight itself): no gradient goes to it.
                let pb = if centered { pb } else { None };
                for (parent, g) in [px, pw, pb].into_iter().zip([dx, dw, db]) {
                    if let Some(node) = parent {
                        grads.register::<B>(node.id, g);
                    }
                }
            }
        }

        let nodes = [x.node(), weight.node(), bias.node()];
        let inputs = [
            x.into_primitive(),
            weight.into_primitive(),
            bias.into_primitive(),
        ];
        let [a, b, c] = inputs.clone();
        let (y, stats) = B::norm_rows(a, b, c, eps, centered);
        let [x, weight, bias] = inputs;
        let y = match NormBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(([x, weight, bias, stats.clone()], centered), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        };
        (y, <Self as AutodiffBackend>::from_inner(stats))
    }

    fn norm_rows_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        centered: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Not itself differentiable: constants.
        let (a, b, c) = B::norm_rows_backward(
            x.into_primitive(),
            weight.into_primitive(),
            bias.into_primitive(),
            stats.into_primitive(),
            dy.into_primitive(),
            centered,
        );
        let inner = <Self as AutodiffBackend>::from_inner;
        (inner(a), inner(b), inner(c))
    }
}

/// `x` normalised over its last axis by the kernels above on a CubeCL device (`None`
/// elsewhere: the caller uses tensor ops): LayerNorm `(x − mean) / sqrt(var + eps) ⊙ w + b`
/// with a `bias`, RMSNorm `x / sqrt(mean(x²) + eps) ⊙ w` without; computed in f32, returned in
/// `x`'s dtype.
///
/// # Shapes
/// `x: [..., D]`, `weight` and `bias`: `[D]` (rank `W = 1`), or `[R, D]` (`W = 2`) for `R`
/// replicas with `x: [R, ..., D]` → `[..., D]`.
pub fn fused_norm<const D: usize, const W: usize>(
    x: &Tensor<D>,
    weight: &Tensor<W>,
    bias: Option<&Tensor<W>>,
    eps: f64,
) -> Option<Tensor<D>> {
    if !is_cube_device(&x.device()) {
        return None;
    }
    let (y, _stats) = <burn::backend::Dispatch as NormKernels>::norm_rows(
        x.clone().into_dispatch(),
        weight.clone().into_dispatch(),
        bias.unwrap_or(weight).clone().into_dispatch(),
        eps as f32,
        bias.is_some(),
    );
    Some(Tensor::from_dispatch(y))
}

/// The mixers' causal depthwise convolution as CubeCL kernels with their own backward
/// ([`conv`]): the entry point is [`fused_causal_conv`].
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait ConvKernels: Backend {
    /// `y[b, t, c] = bias[c] + Σ_j w[c, j] · x[b, t + j, c]` for `x: [B, T + K − 1, C]` (left-
    /// padded), `weight: [C, K]`, `bias: [C]` (read only where `has_bias`), computed in f32;
    /// `y: [B, T, C]` in `x`'s dtype.
    #[fusion(meta = |x, weight, _bias, _has_bias| burn::backend::fusion::custom::TensorSpec::new(
        conv::conv_out_shape(&x.shape, weight.shape[1]),
        x.dtype,
    ))]
    fn causal_conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
    ) -> FloatTensor<Self>;

    /// The gradients `(dx, dweight, dbias)` of [`Self::causal_conv`] for the output gradient
    /// `dy`, each in the shape and dtype of its tensor (`dbias` 0 unless `has_bias`).
    #[allow(clippy::type_complexity)]
    #[fusion(meta = |x, weight, bias, _dy, _has_bias| (
        burn::backend::fusion::custom::TensorSpec::new(x.shape.clone(), x.dtype),
        burn::backend::fusion::custom::TensorSpec::new(weight.shape.clone(), weight.dtype),
        burn::backend::fusion::custom::TensorSpec::new(bias.shape.clone(), bias.dtype),
    ))]
    fn causal_conv_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        has_bias: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl ConvKernels for CubeBackend {
    fn causal_conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
    ) -> FloatTensor<Self> {
        conv::causal_conv(x, weight, bias, has_bias)
    }

    fn causal_conv_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        has_bias: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [dx, dw, db] = conv::causal_conv_backward(x, weight, bias, dy, has_bias);
        (dx, dw, db)
    }
}

impl<B: Backend + ConvKernels, C: CheckpointStrategy> ConvKernels for Autodiff<B, C> {
    fn causal_conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ConvBackward;

        impl<B: Backend + ConvKernels> Backward<B, 3> for ConvBackward {
            // The inputs: the backward needs `x` and the weight only.
            type State = ([FloatTensor<B>; 3], bool);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let ([x, weight, bias], has_bias) = ops.state;
                let (dx, dw, db) = B::causal_conv_backward(x, weight, bias, grad, has_bias);
                let [px, pw, pb] = ops.parents;
                // Without a bias, the bias slot holds a stand-in (the weight): no gradient.
                let pb = if has_bias { pb } else { None };
                for (parent, g) in [px, pw, pb].into_iter().zip([dx, dw, db]) {
                    if let Some(node) = parent {
                        grads.register::<B>(node.id, g);
                    }
                }
            }
        }

        let nodes = [x.node(), weight.node(), bias.node()];
        let inputs = [
            x.into_primitive(),
            weight.into_primitive(),
            bias.into_primitive(),
        ];
        let [a, b, c] = inputs.clone();
        let y = B::causal_conv(a, b, c, has_bias);
        match ConvBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((inputs, has_bias), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn causal_conv_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        has_bias: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Not itself differentiable: constants.
        let (a, b, c) = B::causal_conv_backward(
            x.into_primitive(),
            weight.into_primitive(),
            bias.into_primitive(),
            dy.into_primitive(),
            has_bias,
        );
        let inner = <Self as AutodiffBackend>::from_inner;
        (inner(a), inner(b), inner(c))
    }
}

/// The causal depthwise convolution `y[b, t, c] = bias[c] + Σ_j w[c, j] · x[b, t + j, c]` by the
/// kernels above on a CubeCL device (`None` elsewhere: the caller uses tensor ops), computed in
/// f32 and returned in `x`'s dtype.
///
/// # Shapes
/// `x: [B, T + K − 1, C]` (the input left-padded with the `K − 1` previous positions),
/// `weight: [C, K]`, `bias: [C]` → `[B, T, C]`.
pub fn fused_causal_conv(
    x: &Tensor<3>,
    weight: &Tensor<2>,
    bias: Option<&Tensor<1>>,
) -> Option<Tensor<3>> {
    if !is_cube_device(&x.device()) {
        return None;
    }
    let y = <burn::backend::Dispatch as ConvKernels>::causal_conv(
        x.clone().into_dispatch(),
        weight.clone().into_dispatch(),
        match bias {
            Some(b) => b.clone().into_dispatch(),
            None => weight.clone().into_dispatch(),
        },
        bias.is_some(),
    );
    Some(Tensor::from_dispatch(y))
}

/// The λ-MLP as two CubeCL kernels with their own backward ([`lambda_mlp`]): the entry point
/// is [`fused_lambda_mlp`].
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait LambdaMlpKernels: Backend {
    /// `λ = head(W2 · gelu(W1 · dl + b1) + b2)` per row of `dl: [..., L]` (`head` a softmax
    /// over the `L` levels where `softmax_head` is 1, else softplus), in the dtype of `dl`
    /// (computed in f32); `w1: [L, hidden]`, `b1: [hidden]`, `w2: [hidden, L]`, `b2: [L]`,
    /// `softmax_head: [1]` — or, for `R` replicas, a leading axis `R` on every weight and on
    /// `softmax_head`, and `dl`'s rows replica by replica.
    #[fusion(dtype = dl, shape = dl)]
    fn lambda_mlp(
        dl: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        softmax_head: IntTensor<Self>,
    ) -> FloatTensor<Self>;

    /// The gradients `(ddl, dW1, db1, dW2, db2)` of [`Self::lambda_mlp`] for the output
    /// gradient `dlambda`, each in the shape and dtype of its tensor.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    #[fusion(meta = |dl, w1, b1, w2, b2, _softmax_head, _dlambda| (
        burn::backend::fusion::custom::TensorSpec::new(dl.shape.clone(), dl.dtype),
        burn::backend::fusion::custom::TensorSpec::new(w1.shape.clone(), w1.dtype),
        burn::backend::fusion::custom::TensorSpec::new(b1.shape.clone(), b1.dtype),
        burn::backend::fusion::custom::TensorSpec::new(w2.shape.clone(), w2.dtype),
        burn::backend::fusion::custom::TensorSpec::new(b2.shape.clone(), b2.dtype),
    ))]
    fn lambda_mlp_backward(
        dl: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        softmax_head: IntTensor<Self>,
        dlambda: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

impl LambdaMlpKernels for CubeBackend {
    fn lambda_mlp(
        dl: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        softmax_head: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        lambda_mlp::lambda_mlp(dl, w1, b1, w2, b2, softmax_head)
    }

    fn lambda_mlp_backward(
        dl: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        softmax_head: IntTensor<Self>,
        dlambda: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let [ddl, dw1, db1, dw2, db2] =
            lambda_mlp::lambda_mlp_backward(dl, w1, b1, w2, b2, softmax_head, dlambda);
        (ddl, dw1, db1, dw2, db2)
    }
}

impl<B: Backend + LambdaMlpKernels, C: CheckpointStrategy> LambdaMlpKernels for Autodiff<B, C> {
    fn lambda_mlp(
        dl: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        softmax_head: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct MlpBackward;

        impl<B: Backend + LambdaMlpKernels> Backward<B, 5> for MlpBackward {
            // The inputs (the backward recomputes the hidden layer) and the heads.
            type State = ([FloatTensor<B>; 5], IntTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 5>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let ([dl, w1, b1, w2, b2], softmax_head) = ops.state;
                let (ddl, dw1, db1, dw2, db2) =
                    B::lambda_mlp_backward(dl, w1, b1, w2, b2, softmax_head, grad);
                for (parent, g) in ops.parents.into_iter().zip([ddl, dw1, db1, dw2, db2]) {
                    if let Some(node) = parent {
                        grads.register::<B>(node.id, g);
                    }
                }
            }
        }

        let nodes = [dl.node(), w1.node(), b1.node(), w2.node(), b2.node()];
        let inputs = [
            dl.into_primitive(),
            w1.into_primitive(),
            b1.into_primitive(),
            w2.into_primitive(),
            b2.into_primitive(),
        ];
        let [a, b, c, d, e] = inputs.clone();
        let lambda = B::lambda_mlp(a, b, c, d, e, softmax_head.clone());
        match MlpBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((inputs, softmax_head), lambda),
            OpsKind::UnTracked(prep) => prep.finish(lambda),
        }
    }

    fn lambda_mlp_backward(
        dl: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        softmax_head: IntTensor<Self>,
        dlambda: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        // Not itself differentiable: constants.
        let (a, b, c, d, e) = B::lambda_mlp_backward(
            dl.into_primitive(),
            w1.into_primitive(),
            b1.into_primitive(),
            w2.into_primitive(),
            b2.into_primitive(),
            softmax_head,
            dlambda.into_primitive(),
        );
        let inner = <Self as AutodiffBackend>::from_inner;
        (inner(a), inner(b), inner(c), inner(d), inner(e))
    }
}

/// The λ-MLP kernels' λ for weights `[w1, b1, w2, b2]` (each with or without a leading replica
/// axis) and one head per replica (`true`: softmax), or `None` where they do not run: not a
/// CubeCL device, or widths whose backward does not fit a cube's shared memory (a hidden width
/// of 128 at 15 levels needs 53 KB) — the caller then uses the tensor version.
fn lambda_mlp_kernels<const DW: usize, const DB: usize>(
    dl: &Tensor<4>,
    (w1, b1, w2, b2): (Tensor<DW>, Tensor<DB>, Tensor<DW>, Tensor<DB>),
    softmax_heads: &[bool],
) -> Option<Tensor<4>> {
    let device = dl.device();
    let [levels, hidden] = [w1.dims()[DW - 2], w1.dims()[DW - 1]];
    let fits = |max: usize| lambda_mlp::shared_bytes(levels, hidden) <= max;
    if !max_shared_memory(&device).is_some_and(fits) {
        return None;
    }
    let heads: Vec<i32> = softmax_heads.iter().map(|&s| s as i32).collect();
    let heads = Tensor::<1, Int>::from_data(
        burn::tensor::TensorData::new(heads, [softmax_heads.len()]),
        &device,
    );
    let lambda = <burn::backend::Dispatch as LambdaMlpKernels>::lambda_mlp(
        dl.clone().into_dispatch(),
        w1.into_dispatch(),
        b1.into_dispatch(),
        w2.into_dispatch(),
        b2.into_dispatch(),
        heads.into_dispatch(),
    );
    Some(Tensor::from_dispatch(lambda))
}

/// λ of an MLP mode by the kernels above on a CubeCL device (`None` elsewhere, for a mode
/// without an MLP, or for widths whose backward does not fit a cube's shared memory: the caller
/// uses [`crate::nn::LambdaMlp::logits`] and [`crate::nn::LambdaMlp::head`], the definition the
/// kernels are tested against).
///
/// # Shapes
/// `dl: [B, T, H, L]` → `λ: [B, T, H, L]`.
pub fn fused_lambda_mlp(
    dl: &Tensor<4>,
    mlp: &crate::nn::LambdaMlp,
    mode: crate::nn::LambdaMode,
) -> Option<Tensor<4>> {
    use crate::nn::LambdaMode;
    let softmax = match mode {
        LambdaMode::MlpSoftplus => false,
        LambdaMode::MlpSoftmax => true,
        LambdaMode::Linear | LambdaMode::Ones => return None,
    };
    if !is_cube_device(&dl.device()) {
        return None;
    }
    let weights = (mlp.w1.val(), mlp.b1.val(), mlp.w2.val(), mlp.b2.val());
    lambda_mlp_kernels(dl, weights, &[softmax])
}

/// λ of every replica of a pack (each with its own MLP and its own MLP mode) by the same
/// kernels, or `None` as [`fused_lambda_mlp`] (or when a replica's mode has no MLP).
///
/// # Shapes
/// `dl: [R, M, H, L]` → `λ: [R, M, H, L]`.
pub fn fused_packed_lambda_mlp(
    dl: &Tensor<4>,
    mlp: &crate::nn::PackedLambdaMlp,
    modes: &[crate::nn::LambdaMode],
) -> Option<Tensor<4>> {
    use crate::nn::LambdaMode;
    let softmax: Option<Vec<bool>> = modes
        .iter()
        .map(|m| match m {
            LambdaMode::MlpSoftplus => Some(false),
            LambdaMode::MlpSoftmax => Some(true),
            LambdaMode::Linear | LambdaMode::Ones => None,
        })
        .collect();
    if !is_cube_device(&dl.device()) || modes.len() != dl.dims()[0] {
        return None;
    }
    let weights = (mlp.w1.val(), mlp.b1.val(), mlp.w2.val(), mlp.b2.val());
    lambda_mlp_kernels(dl, weights, &softmax?)
}

/// Whether `device` runs CubeCL kernels (directly or under autodiff).
pub fn is_cube_device(device: &Device) -> bool {
    matches!(
        device.clone().inner().as_dispatch(),
        DispatchDevice::Cube(_)
    )
}

/// The shared memory one cube may use on `device`, for CubeCL devices (`None` elsewhere).
pub fn max_shared_memory(device: &Device) -> Option<usize> {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Cube(cube) => {
            Some(cube.client().properties().hardware.max_shared_memory_size)
        }
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// The memory the device can hold at once, where its runtime says (CUDA does).
pub fn memory_capacity(device: &Device) -> Option<u64> {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Cube(cube) => cube.client().properties().memory.max_memory(),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}
