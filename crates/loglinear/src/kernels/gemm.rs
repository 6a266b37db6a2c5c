//! Batched matrix products as a backend extension with its own backward: on CUDA devices
//! (feature `cublas`) they run on cuBLAS ([`super::cublas`]), elsewhere on Burn's matmul of the
//! CubeCL backend. The entry points are [`crate::linalg::matmul`] and [`crate::linalg::linear`],
//! which reach this module only on CubeCL devices.
//!
//! Why not Burn's matmul on CUDA: every new product shape costs seconds of CubeCL autotuning
//! (minutes for a new model; bench/RESULTS.md, sessions 5 and 7: the Gated DeltaNet op's chunked
//! form could not even be timed), and under fusion a batched product fused with its element-wise
//! neighbours ran at ≈ 1 TFLOP/s in the packed synthetic models (session 8; packs went from 4.1×
//! to 1.7× one run). On one large square bf16 GEMM cuBLAS reaches ≈ 680 TFLOP/s on the H200 and
//! CubeCL ≈ 200; on the LM step's thin products cuBLAS measured no faster (52 against 54 ms,
//! session 8), and as opaque operations the products cut fusion streams that CubeCL's fused
//! matmuls had extended (casts and copies around them grew): the LM step is the open cost.
//! Under Burn's fusion the product is one opaque operation; the element-wise chains around it
//! still fuse with each other.

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, TensorMetadata, backend_extension};
use burn::tensor::Shape;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::CubeBackend;

use super::Cb;

/// `[batch, M, N]` of `a: [batch or 1, M, K] · b: [batch or 1, K, N]`.
pub(crate) fn gemm_shape(a: &Shape, b: &Shape) -> Shape {
    let ([ba, m, k], [bb, k2, n]) = (a.dims::<3>(), b.dims::<3>());
    assert!(
        k == k2 && (ba == bb || ba == 1 || bb == 1),
        "gemm: shapes {:?} · {:?} (expected [batch or 1, M, K] · [batch or 1, K, N])",
        a.as_slice(),
        b.as_slice()
    );
    Shape::new([ba.max(bb), m, n])
}

/// Batched matrix products. Implemented for CubeCL backends and for autodiff over them.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait GemmKernels: Backend {
    /// `c = a · b` for `a: [batch or 1, M, K]`, `b: [batch or 1, K, N]` (a batch of 1 is
    /// broadcast), in the dtype of `a` (accumulated in f32 for half-precision inputs). Operands
    /// may be transposed views (`swap_dims(1, 2)`): no copy is made for them.
    #[fusion(dtype = a, shape = gemm_shape(a, b))]
    fn gemm(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl GemmKernels for CubeBackend {
    fn gemm(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let _ = gemm_shape(a.meta.shape(), b.meta.shape());
        #[cfg(feature = "cublas")]
        let (a, b) = match super::cublas::gemm(a, b) {
            Ok(c) => return c,
            Err(operands) => operands,
        };
        Cb::float_matmul(a, b)
    }
}

/// Sums a `[batch, R, C]` gradient over its batch where the operand it belongs to had a batch
/// of 1 (broadcast in the forward).
fn unbroadcast<B: Backend>(grad: FloatTensor<B>, batch: usize) -> FloatTensor<B> {
    if batch == 1 && grad.shape()[0] != 1 {
        B::float_sum_dim(grad, 0)
    } else {
        grad
    }
}

impl<B: Backend + GemmKernels, C: CheckpointStrategy> GemmKernels for Autodiff<B, C> {
    fn gemm(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct GemmBackward;

        impl<B: Backend + GemmKernels> Backward<B, 2> for GemmBackward {
            // The operands that the other one's gradient needs (None where it is not tracked).
            type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>, usize, usize);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let (a, b, batch_a, batch_b) = ops.state;
                let [node_a, node_b] = ops.parents;
                // dA = dC · Bᵀ, dB = Aᵀ · dC: transposes are views, the products read them as such.
                if let (Some(node), Some(b)) = (node_a, b) {
                    let da = B::gemm(grad.clone(), B::float_swap_dims(b, 1, 2));
                    grads.register::<B>(node.id, unbroadcast::<B>(da, batch_a));
                }
                if let (Some(node), Some(a)) = (node_b, a) {
                    let db = if batch_b == 1 && batch_a > 1 {
                        // A weight shared by the batch: Σ_z A_zᵀ dC_z is one product over all
                        // rows of the batch (no per-batch products to sum afterwards).
                        let [_, m, k] = a.shape().dims::<3>();
                        let n = grad.shape()[2];
                        let rows = |t: FloatTensor<B>, cols| {
                            B::float_reshape(t, Shape::new([1, batch_a * m, cols]))
                        };
                        B::gemm(B::float_swap_dims(rows(a, k), 1, 2), rows(grad, n))
                    } else {
                        // Here b's batch is the result's (or both are 1): nothing to sum.
                        B::gemm(B::float_swap_dims(a, 1, 2), grad)
                    };
                    grads.register::<B>(node.id, db);
                }
            }
        }

        let (tracked_a, tracked_b) = (a.is_tracked(), b.is_tracked());
        let nodes = [a.node(), b.node()];
        let (a, b) = (a.into_primitive(), b.into_primitive());
        let (batch_a, batch_b) = (a.shape()[0], b.shape()[0]);
        let c = B::gemm(a.clone(), b.clone());
        match GemmBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                // dA needs B and dB needs A: keep only what a tracked operand's gradient needs.
                let keep_b = tracked_a.then_some(b);
                let keep_a = tracked_b.then_some(a);
                prep.finish((keep_a, keep_b, batch_a, batch_b), c)
            }
            OpsKind::UnTracked(prep) => prep.finish(c),
        }
    }
}

/// Starts timing the products that run outside CubeCL (cuBLAS), which CubeCL's launch observer
/// does not see: a profiler calls this with its own start and [`profile_finish`] after the
/// device finished the region. Nothing happens in builds without the `cublas` feature.
pub fn profile_start() {
    #[cfg(feature = "cublas")]
    super::cublas::profile_start();
}

/// Every cuBLAS product since [`profile_start`] (its shape in row-major terms, `ᵀ` on an operand
/// read from a transposed view, and dtype) with its floating-point operations and device
/// milliseconds, and the operands that
/// had to be copied to a layout cuBLAS reads (shape, strides, dtype); empty without the `cublas`
/// feature.
pub fn profile_finish() -> (Vec<(String, f64, f64)>, Vec<String>) {
    #[cfg(feature = "cublas")]
    return super::cublas::profile_finish();
    #[cfg(not(feature = "cublas"))]
    (Vec::new(), Vec::new())
}
