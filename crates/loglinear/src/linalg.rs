//! The matrix products of the models and of the op's tensor forms. On CubeCL devices they go
//! through one batched product with its own backward ([`crate::kernels::gemm`]: cuBLAS on CUDA
//! devices in builds with the `cublas` feature, Burn's matmul elsewhere); on other devices they
//! are Burn's `matmul`. Same values either way, to the rounding of the accumulation order.

use burn::prelude::*;

/// `a · b` over the last two axes, leading axes batched: equal in `a` and `b`, or all 1 in one
/// of them (broadcast). Other broadcasts are Burn's `matmul`.
///
/// # Shapes
/// `a: [..., M, K]`, `b: [..., K, N]` → `[..., M, N]`.
pub fn matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "kernels")]
    if crate::kernels::is_cube_device(&a.device()) && a.dtype() == b.dtype() {
        let (da, db) = (a.dims(), b.dims());
        let (lead_a, lead_b) = (&da[..D - 2], &db[..D - 2]);
        let ones = |l: &[usize]| l.iter().all(|&x| x == 1);
        if lead_a == lead_b || ones(lead_a) || ones(lead_b) {
            let (m, k, n) = (da[D - 2], da[D - 1], db[D - 1]);
            let mut out = if ones(lead_a) { db } else { da };
            out[D - 2] = m;
            out[D - 1] = n;
            let batch = |l: &[usize]| l.iter().product::<usize>();
            let a3 = a.reshape([batch(lead_a), m, k]);
            let b3 = b.reshape([batch(lead_b), k, n]);
            return gemm3(a3, b3).reshape(out);
        }
    }
    a.matmul(b)
}

/// `x · w`: a bias-free linear map of the last axis, one product for all leading axes.
///
/// # Shapes
/// `x: [..., d_in]`, `w: [d_in, d_out]` → `[..., d_out]`.
pub fn linear<const D: usize>(x: Tensor<D>, w: Tensor<2>) -> Tensor<D> {
    #[cfg(feature = "kernels")]
    if crate::kernels::is_cube_device(&x.device()) && x.dtype() == w.dtype() {
        let mut out = x.dims();
        let [d_in, d_out] = w.dims();
        assert_eq!(
            out[D - 1],
            d_in,
            "linear: input {:?} for a weight [{d_in}, {d_out}]",
            out
        );
        out[D - 1] = d_out;
        // `[batch, rows, d_in]` with the weight broadcast over the batch: for 3-D inputs (the
        // models' activations) no reshape at all, so neither the input nor the gradient that
        // comes back is ever copied to fit a shape (pitched rows cannot always be merged); the
        // cuBLAS launcher runs such a product as one GEMM over all rows where they follow each
        // other in memory.
        let (batch, rows) = match D {
            1 => (1, 1),
            2 => (1, out[0]),
            _ => (out[..D - 2].iter().product(), out[D - 2]),
        };
        let y = gemm3(x.reshape([batch, rows, d_in]), w.unsqueeze_dim::<3>(0));
        return y.reshape(out);
    }
    burn::tensor::module::linear(x, w, None)
}

/// [`crate::kernels::gemm::GemmKernels::gemm`] on tensors of a CubeCL device.
#[cfg(feature = "kernels")]
fn gemm3(a: Tensor<3>, b: Tensor<3>) -> Tensor<3> {
    use crate::kernels::gemm::GemmKernels;
    let c = <burn::backend::Dispatch as GemmKernels>::gemm(a.into_dispatch(), b.into_dispatch());
    Tensor::from_dispatch(c)
}

/// [`matmul`] as a method, for chains of products (`a.gemm(b).gemm(c)`).
pub trait Gemm {
    /// [`matmul`]`(self, other)`.
    fn gemm(self, other: Self) -> Self;
}

impl<const D: usize> Gemm for Tensor<D> {
    fn gemm(self, other: Self) -> Self {
        matmul(self, other)
    }
}
