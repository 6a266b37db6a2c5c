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
use burn::tensor::{DType, Shape};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;

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

/// `[1, K, N]` of `Σ_z a_zᵀ · c_z` for `a: [batch, M, K]`, `c: [batch, M, N]`.
pub(crate) fn batch_sum_shape(a: &Shape, c: &Shape) -> Shape {
    let ([ba, m, k], [bc, m2, n]) = (a.dims::<3>(), c.dims::<3>());
    assert!(
        ba == bc && m == m2,
        "gemm_batch_sum: shapes {:?}, {:?} (expected [batch, M, K] and [batch, M, N])",
        a.as_slice(),
        c.as_slice()
    );
    Shape::new([1, k, n])
}

/// Batched matrix products. Implemented for CubeCL backends and for autodiff over them.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait GemmKernels: Backend {
    /// `c = a · b` for `a: [batch or 1, M, K]`, `b: [batch or 1, K, N]` (a batch of 1 is
    /// broadcast), in the dtype of `a` (accumulated in f32 for half-precision inputs). Operands
    /// may be transposed views (`swap_dims(1, 2)`): no copy is made for them.
    #[fusion(dtype = a, shape = gemm_shape(a, b))]
    fn gemm(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `Σ_z a_zᵀ · c_z`, `[1, K, N]`, for `a: [batch, M, K]`, `c: [batch, M, N]`: the gradient of
    /// a weight shared by a batch, as one product over all `batch · M` rows. Rows that follow
    /// each other at one pitch (contiguous, or pitched by the allocator) are read where they lie:
    /// a reshape to `[1, batch · M, ·]` would copy pitched rows. Not differentiable.
    #[fusion(dtype = a, shape = batch_sum_shape(a, c))]
    fn gemm_batch_sum(a: FloatTensor<Self>, c: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl GemmKernels for CubeBackend {
    fn gemm(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let _ = gemm_shape(a.meta.shape(), b.meta.shape());
        let (a, b) = match split_k(a, b) {
            Ok(c) => return c,
            Err(operands) => operands,
        };
        #[cfg(feature = "cublas")]
        let (a, b) = match super::cublas::gemm(a, b) {
            Ok(c) => return c,
            Err(operands) => operands,
        };
        Cb::float_matmul(a, b)
    }

    fn gemm_batch_sum(a: FloatTensor<Self>, c: FloatTensor<Self>) -> FloatTensor<Self> {
        let _ = batch_sum_shape(a.meta.shape(), c.meta.shape());
        let (a, c) = (all_rows(a), all_rows(c));
        Self::gemm(Cb::float_swap_dims(a, 1, 2), c)
    }
}

/// Output tiles of a product are about this many elements on a side (cuBLAS's smallest tiles
/// for these shapes); a card of 132 multiprocessors wants a few hundred of them.
const SPLIT_K_TILE: usize = 64;
/// A split product is cut until it has about this many output tiles (two per multiprocessor of
/// the H200), while each part keeps at least [`SPLIT_K_MIN_ROWS`] rows of its reduction.
const SPLIT_K_TILES: usize = 264;
const SPLIT_K_MIN_ROWS: usize = 512;

/// Split-K for `aᵀ · c` in f32 with a long reduction and a small output — the weight gradients
/// of the packed synthetic models (`24 × [64×16384]ᵀ · [16384×64]`) and of the λ-MLP (`[15 ×
/// 262144]ᵀ · [262144 × 64]`): cuBLAS ran them as one output tile per product, a handful of
/// multiprocessors busy, at 1–7 TFLOP/s (bench/RESULTS.md, session 9). Here the reduction's `R`
/// rows are cut into `S` parts, run as one product over a batch `S` times larger (views: no
/// copy), and the `S` partial results summed in f32. Only for f32: half-precision partial
/// results would be rounded before the sum. `Err` gives the operands back where the shape or
/// layout does not call for it.
///
/// Shapes: `a: [Z, K, R]` a transposed view (of rows `[Z, R, K]` at one pitch), `b: [Z, R, N]`
/// rows at one pitch → `[Z, K, N]`.
#[allow(clippy::result_large_err)]
fn split_k(a: CubeTensor, b: CubeTensor) -> Result<CubeTensor, (CubeTensor, CubeTensor)> {
    let ([z, k, r], [zb, rb, n]) = (a.meta.shape().dims::<3>(), b.meta.shape().dims::<3>());
    if a.dtype != DType::F32 || b.dtype != DType::F32 || z != zb || r != rb {
        return Err((a, b));
    }
    let tiles = z * k.div_ceil(SPLIT_K_TILE) * n.div_ceil(SPLIT_K_TILE);
    let mut parts = 1;
    while tiles * parts * 2 <= SPLIT_K_TILES
        && r % (parts * 2) == 0
        && r / (parts * 2) >= SPLIT_K_MIN_ROWS
    {
        parts *= 2;
    }
    if parts == 1 {
        return Err((a, b));
    }
    // a: [Z, K, R] with unit stride along K and pitch p between its R rows; b: [Z, R, N] with
    // unit stride along N and pitch q; each batch right after the previous one's rows.
    let untiled = |t: &CubeTensor| t.meta.tiling == Default::default();
    let (sa, sb) = (a.meta.strides().to_vec(), b.meta.strides().to_vec());
    let a_rows = untiled(&a) && sa[1] == 1 && sa[2] >= k && (z == 1 || sa[0] == r * sa[2]);
    let b_rows = untiled(&b) && sb[2] == 1 && sb[1] >= n && (z == 1 || sb[0] == r * sb[1]);
    if !(a_rows && b_rows) {
        return Err((a, b));
    }
    let (rows, batch) = (r / parts, z * parts);
    let view = |mut t: CubeTensor, shape: [usize; 3], strides: [usize; 3]| {
        *t.meta = cubecl::zspace::metadata::Metadata::new(
            Shape::new(shape),
            cubecl::zspace::Strides::new(&strides),
        );
        t
    };
    let a = view(a, [batch, k, rows], [rows * sa[2], 1, sa[2]]);
    let b = view(b, [batch, rows, n], [rows * sb[1], sb[1], 1]);
    let partial = <CubeBackend as GemmKernels>::gemm(a, b); // [Z·S, K, N], no further split
    let partial = Cb::float_reshape(partial, Shape::new([z, parts, k, n]));
    Ok(Cb::float_reshape(
        Cb::float_sum_dim(partial, 1),
        Shape::new([z, k, n]),
    ))
}

/// `t: [batch, M, C]` as `[1, batch · M, C]`: a view where its rows follow each other at one
/// pitch with unit column stride (`batch` strides of `M` pitches), a contiguous copy otherwise.
fn all_rows(t: CubeTensor) -> CubeTensor {
    let [batch, m, cols] = t.meta.shape().dims::<3>();
    let s = t.meta.strides();
    let (s0, s1, s2) = (s[0], s[1], s[2]);
    let untiled = t.meta.tiling == Default::default();
    let rows_at_one_pitch =
        untiled && (s2 == 1 || cols == 1) && s1 >= cols && (batch == 1 || s0 == m * s1);
    let shape = Shape::new([1, batch * m, cols]);
    if rows_at_one_pitch {
        let mut t = t;
        let strides = cubecl::zspace::Strides::new(&[batch * m * s1, s1, 1]);
        *t.meta = cubecl::zspace::metadata::Metadata::new(shape, strides);
        t
    } else {
        Cb::float_reshape(burn_cubecl::kernel::into_contiguous(t), shape)
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
                        B::gemm_batch_sum(a, grad)
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

    fn gemm_batch_sum(a: FloatTensor<Self>, c: FloatTensor<Self>) -> FloatTensor<Self> {
        // Not itself differentiable (it serves backward passes): a constant.
        <Self as burn::backend::AutodiffBackend>::from_inner(B::gemm_batch_sum(
            a.into_primitive(),
            c.into_primitive(),
        ))
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
