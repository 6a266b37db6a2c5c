//! CubeCL kernels outside the core op (whose fused form lives in [`crate::ops::fused`]): the
//! softmax cross-entropy of the language model's loss ([`cross_entropy`]), batched matrix
//! products with their backward ([`gemm`]; on cuBLAS on CUDA devices with the `cublas`
//! feature), and what the crate asks of CubeCL devices.

pub mod cross_entropy;
#[cfg(feature = "cublas")]
mod cublas;
pub mod gemm;

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

/// Whether `device` runs CubeCL kernels (directly or under autodiff).
pub fn is_cube_device(device: &Device) -> bool {
    matches!(
        device.clone().inner().as_dispatch(),
        DispatchDevice::Cube(_)
    )
}

/// The memory the device can hold at once, where its runtime says (CUDA does).
pub fn memory_capacity(device: &Device) -> Option<u64> {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Cube(cube) => cube.client().properties().memory.max_memory(),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}
