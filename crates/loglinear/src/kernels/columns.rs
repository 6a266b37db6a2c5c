//! Parameters broadcast over the tokens — a bias added to the last axes (`x + b`), a scale
//! multiplying them (`x ⊙ w`) — with their gradients summed over the tokens by CubeCL kernels.
//!
//! Why: under autodiff Burn sums such a gradient with one of its reductions over the leading
//! axes, whose speed depends on the strategy autotune picked for the shape: the Transformer's
//! four bias gradients a layer (column sums over 32,768 rows at T = 512 × 64) took 7.9 ms a step
//! in 25 `ReduceKernel` launches, 0.32 ms each for ≈ 100 MB read (bench/RESULTS.md, session 13).
//! Here: per column and chunk of rows a partial sum, one unit per column so that a warp reads
//! consecutive addresses ([`column_partials_kernel`]), then the chunks' total
//! ([`super::norm::sum_chunks`]), in f32.
//!
//! The forward stays an ordinary (fusible) broadcast of Burn's; only the backward is ours. The
//! parameter may have another dtype than `x` (f32 parameters under bf16 activations): it is
//! cast for the forward, and its gradient comes back in its own dtype from the f32 sums.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{AutodiffBackend, Backend, TensorMetadata, backend_extension};
use burn::tensor::{DType, Shape};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::norm::{COLUMN_CHUNKS, COLUMN_THREADS, sum_chunks};

/// Per column and chunk of rows of `a: [rows, width]` (contiguous): `Σ a` over the chunk's rows,
/// or `Σ a ⊙ b` with `product`. Cube `(X, chunk)`: column `X · COLUMN_THREADS + unit`.
/// `partial: [chunks, width]` (f32).
#[cube(launch)]
pub fn column_partials_kernel<E: Float>(
    a: &Tensor<E>,
    b: &Tensor<E>,
    partial: &mut Tensor<f32>,
    width: usize,
    rows: usize,
    chunk_rows: usize,
    #[comptime] product: bool,
    #[define(E)] _dtype: ElemType,
) {
    let col = CUBE_POS_X as usize * COLUMN_THREADS + UNIT_POS_X as usize;
    if col >= width {
        terminate!();
    }
    let chunk = CUBE_POS_Y as usize;
    let first = chunk * chunk_rows;
    let last = usize::min(first + chunk_rows, rows);
    let mut s = 0.0f32;
    let mut r = first;
    while r < last {
        let mut x = f32::cast_from(a[r * width + col]);
        if product {
            x *= f32::cast_from(b[r * width + col]);
        }
        s += x;
        r += 1;
    }
    partial[chunk * width + col] = s;
}

/// `[width]` (f32): the column sums of `a` (with `b`: of `a ⊙ b`) read as `[rows, width]`.
fn column_sums(a: CubeTensor, b: Option<CubeTensor>, width: usize) -> CubeTensor {
    let a = into_contiguous(a);
    let rows = a.meta.shape().num_elements() / width.max(1);
    let chunks = rows.clamp(1, COLUMN_CHUNKS);
    let chunk_rows = rows.div_ceil(chunks).max(1);
    let chunks = rows.div_ceil(chunk_rows).max(1);
    let partial = empty_device_contiguous_dtype(
        a.client.clone(),
        a.device.clone(),
        Shape::new([chunks, width]),
        DType::F32,
    );
    if rows == 0 || width == 0 {
        let zeros = burn_cubecl::ops::numeric::zeros_client(
            a.client.clone(),
            a.device.clone(),
            Shape::new([width]),
            DType::F32,
        );
        return zeros;
    }
    let product = b.is_some();
    let b = match b {
        Some(b) => into_contiguous(super::cast(b, a.dtype)),
        None => a.clone(),
    };
    column_partials_kernel::launch(
        &a.client.clone(),
        CubeCount::Static(width.div_ceil(COLUMN_THREADS) as u32, chunks as u32, 1),
        CubeDim::new_1d(COLUMN_THREADS as u32),
        a.clone().into_tensor_arg(),
        b.into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        width,
        rows,
        chunk_rows,
        product,
        dtype_to_storage_type(a.dtype),
    );
    let total = sum_chunks(partial, 1, chunks, width);
    super::Cb::float_reshape(total, Shape::new([width]))
}

/// `p` reshaped to broadcast against `x` over its leading axes (`p`'s shape is `x`'s last
/// axes), cast to `x`'s dtype, and expanded to `x`'s shape.
fn broadcast<B: Backend>(p: FloatTensor<B>, x: &FloatTensor<B>) -> FloatTensor<B> {
    let (xs, ps) = (x.shape(), p.shape());
    let lead = xs.num_dims() - ps.num_dims();
    let mut dims = vec![1; lead];
    dims.extend_from_slice(ps.as_slice());
    let p = B::float_reshape(p, Shape::from(dims));
    let p = if p.dtype() == x.dtype() {
        p
    } else {
        B::float_cast(p, x.dtype().into())
    };
    B::float_expand(p, xs)
}

/// The shape checks: `p`'s shape must be `x`'s last axes. Returns the columns (`p`'s elements).
pub(crate) fn columns_of(x: &Shape, p: &Shape, op: &str) -> usize {
    let (xd, pd) = (x.as_slice(), p.as_slice());
    assert!(
        pd.len() <= xd.len() && xd[xd.len() - pd.len()..] == *pd,
        "{op}: a parameter {pd:?} for x {xd:?} (expected x's last axes)"
    );
    pd.iter().product()
}

/// A parameter over `x`'s last axes, broadcast over the leading ones, with a fused backward.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait ColumnKernels: Backend {
    /// `x + b`, `b`'s shape `x`'s last axes (cast to `x`'s dtype); in `x`'s dtype.
    #[fusion(dtype = x, shape = x)]
    fn add_columns(x: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `x ⊙ w`, `w`'s shape `x`'s last axes (cast to `x`'s dtype); in `x`'s dtype.
    #[fusion(dtype = x, shape = x)]
    fn scale_columns(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `Σ_rows a` (with `product`: `Σ_rows a ⊙ b`) of `a` read as `[rows, width]` (`b` alike),
    /// in f32: `[width]`.
    #[fusion(meta = |_a, _b, width, _product| burn::backend::fusion::custom::TensorSpec::new(
        Shape::new([*width]),
        DType::F32,
    ))]
    fn sum_rows(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        width: usize,
        product: bool,
    ) -> FloatTensor<Self>;
}

impl ColumnKernels for CubeBackend {
    fn add_columns(x: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        columns_of(x.meta.shape(), b.meta.shape(), "add_columns");
        let b = broadcast::<Self>(b, &x);
        Self::float_add(x, b)
    }

    fn scale_columns(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        columns_of(x.meta.shape(), w.meta.shape(), "scale_columns");
        let w = broadcast::<Self>(w, &x);
        Self::float_mul(x, w)
    }

    fn sum_rows(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        width: usize,
        product: bool,
    ) -> FloatTensor<Self> {
        column_sums(a, product.then_some(b), width)
    }
}

/// The gradient of a parameter of shape `shape` and dtype `dtype` from its f32 column sums.
fn parameter_grad<B: Backend>(sums: FloatTensor<B>, shape: Shape, dtype: DType) -> FloatTensor<B> {
    let g = B::float_reshape(sums, shape);
    if dtype == DType::F32 {
        g
    } else {
        B::float_cast(g, dtype.into())
    }
}

impl<B: Backend + ColumnKernels, C: CheckpointStrategy> ColumnKernels for Autodiff<B, C> {
    fn add_columns(x: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct AddColumnsBackward;

        impl<B: Backend + ColumnKernels> Backward<B, 2> for AddColumnsBackward {
            // The bias's shape and dtype.
            type State = (Shape, DType);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let (shape, dtype) = ops.state;
                let [px, pb] = ops.parents;
                if let Some(node) = pb {
                    let width = shape.num_elements();
                    let sums = B::sum_rows(grad.clone(), grad.clone(), width, false);
                    grads.register::<B>(node.id, parameter_grad::<B>(sums, shape, dtype));
                }
                if let Some(node) = px {
                    grads.register::<B>(node.id, grad);
                }
            }
        }

        let (x_shape, b_shape) = (x.shape(), b.shape());
        columns_of(&x_shape, &b_shape, "add_columns");
        let b_dtype = b.dtype();
        let nodes = [x.node(), b.node()];
        let (xi, bi) = (x.into_primitive(), b.into_primitive());
        let out = B::float_add(xi.clone(), broadcast::<B>(bi, &xi));
        match AddColumnsBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((b_shape, b_dtype), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn scale_columns(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ScaleColumnsBackward;

        impl<B: Backend + ColumnKernels> Backward<B, 2> for ScaleColumnsBackward {
            // x (for the scale's gradient) and the scale.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let (x, w) = ops.state;
                let [px, pw] = ops.parents;
                if let Some(node) = pw {
                    let (shape, dtype) = (w.shape(), w.dtype());
                    let width = shape.num_elements();
                    let sums = B::sum_rows(grad.clone(), x, width, true);
                    grads.register::<B>(node.id, parameter_grad::<B>(sums, shape, dtype));
                }
                if let Some(node) = px {
                    let dx = B::float_mul(grad.clone(), broadcast::<B>(w, &grad));
                    grads.register::<B>(node.id, dx);
                }
            }
        }

        columns_of(&x.shape(), &w.shape(), "scale_columns");
        let nodes = [x.node(), w.node()];
        let (xi, wi) = (x.into_primitive(), w.into_primitive());
        let out = B::float_mul(xi.clone(), broadcast::<B>(wi.clone(), &xi));
        match ScaleColumnsBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((xi, wi), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn sum_rows(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        width: usize,
        product: bool,
    ) -> FloatTensor<Self> {
        // Not itself differentiable: a constant.
        let s = B::sum_rows(a.into_primitive(), b.into_primitive(), width, product);
        <Self as AutodiffBackend>::from_inner(s)
    }
}
