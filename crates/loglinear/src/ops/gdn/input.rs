//! The inputs of the Gated DeltaNet op, their sizes, and random inputs at layer scales.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use crate::ops::Dims;

/// Inputs of the Gated DeltaNet op, per head. Positions are counted from the start of this
/// segment; an initial [`FenwickState`](crate::ops::FenwickState) shifts them by its `position`.
/// The op takes `q` and `k` as given (the layer L2-normalises them first).
///
/// # Shapes
/// `q, k: [B, T, H, N]`, `v: [B, T, H, P]`, `g: [B, T, H]` (log-decay, ≤ 0),
/// `beta: [B, T, H]`, `lambda: [B, T, H, L]` with `L ≥ num_levels(position + T)`.
#[derive(Clone, Debug)]
pub struct GdnInput {
    /// Queries `[B, T, H, N]`.
    pub q: Tensor<4>,
    /// Keys `[B, T, H, N]`.
    pub k: Tensor<4>,
    /// Values `[B, T, H, P]`.
    pub v: Tensor<4>,
    /// Log-decay `[B, T, H]`: `a_t = exp(g_t)`.
    pub g: Tensor<3>,
    /// Delta-rule step size `[B, T, H]` (the layer's `σ(W_b x)`, in (0, 1)).
    pub beta: Tensor<3>,
    /// Level weights `[B, T, H, L]`.
    pub lambda: Tensor<4>,
}

impl GdnInput {
    /// Checks that the six tensors agree and returns their sizes.
    ///
    /// # Panics
    /// With a message naming the tensor and both shapes when they do not fit together.
    pub fn dims(&self) -> Dims {
        let [b, t, h, n] = self.q.dims();
        let d = Dims {
            b,
            t,
            h,
            n,
            p: self.v.dims()[3],
            l: self.lambda.dims()[3],
        };
        let expect = |name: &str, got: &[usize], want: &[usize]| {
            assert!(
                got == want,
                "gdn_attn: {name} has shape {got:?}, expected {want:?} \
                 (from q [B, T, H, N] = {:?})",
                self.q.dims()
            );
        };
        expect("k", &self.k.dims(), &[b, t, h, n]);
        expect("v", &self.v.dims(), &[b, t, h, d.p]);
        expect("g", &self.g.dims(), &[b, t, h]);
        expect("beta", &self.beta.dims(), &[b, t, h]);
        expect("lambda", &self.lambda.dims(), &[b, t, h, d.l]);
        assert!(d.l > 0, "gdn_attn: lambda needs at least one level");
        d
    }

    /// The float dtype of the inputs.
    pub fn dtype(&self) -> DType {
        self.q.dtype()
    }

    /// The device of the inputs.
    pub fn device(&self) -> Device {
        self.q.device()
    }

    /// Fresh leaves that require gradients (detached from any earlier graph); the tensors must
    /// live on an autodiff device.
    pub fn require_grad(&self) -> Self {
        Self {
            q: self.q.clone().detach().require_grad(),
            k: self.k.clone().detach().require_grad(),
            v: self.v.clone().detach().require_grad(),
            g: self.g.clone().detach().require_grad(),
            beta: self.beta.clone().detach().require_grad(),
            lambda: self.lambda.clone().detach().require_grad(),
        }
    }

    /// The tokens `start..start + len` of this segment.
    pub fn narrow(&self, start: usize, len: usize) -> Self {
        Self {
            q: self.q.clone().narrow(1, start, len),
            k: self.k.clone().narrow(1, start, len),
            v: self.v.clone().narrow(1, start, len),
            g: self.g.clone().narrow(1, start, len),
            beta: self.beta.clone().narrow(1, start, len),
            lambda: self.lambda.clone().narrow(1, start, len),
        }
    }

    /// Every tensor cast to `dtype`.
    pub fn cast(&self, dtype: DType) -> Self {
        Self {
            q: self.q.clone().cast(dtype),
            k: self.k.clone().cast(dtype),
            v: self.v.clone().cast(dtype),
            g: self.g.clone().cast(dtype),
            beta: self.beta.clone().cast(dtype),
            lambda: self.lambda.clone().cast(dtype),
        }
    }

    /// Random inputs at the scales the layer produces (spec §5.1): `q, k` L2-normalised per head
    /// from `N(0, 1)`, `v ~ N(0, 1)`, `β = σ(randn)`, `g = −A·softplus(randn − 4)` with
    /// `A = exp(U(0, 1))` per head (decay lengths of tens of tokens, so that long-range levels
    /// matter), `λ = softplus(randn)`. Drawn with `seed` on the host, so equal seeds give equal
    /// inputs on every backend and dtype.
    pub fn random(dims: Dims, seed: u64, dtype: DType, device: &Device) -> Self {
        use rand::{Rng, SeedableRng};
        use rand_distr::StandardNormal;
        let Dims { b, t, h, n, p, l } = dims;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut normal = |len: usize| -> Vec<f64> {
            (0..len)
                .map(|_| rng.sample::<f64, _>(StandardNormal))
                .collect()
        };
        let unit_rows = |mut x: Vec<f64>| {
            for row in x.chunks_mut(n) {
                let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
                row.iter_mut().for_each(|v| *v /= norm);
            }
            x
        };
        let q = unit_rows(normal(b * t * h * n));
        let k = unit_rows(normal(b * t * h * n));
        let v = normal(b * t * h * p);
        let beta: Vec<f64> = normal(b * t * h)
            .into_iter()
            .map(|x| 1.0 / (1.0 + (-x).exp()))
            .collect();
        let dt: Vec<f64> = normal(b * t * h)
            .into_iter()
            .map(|x| softplus(x - 4.0))
            .collect();
        let lambda: Vec<f64> = normal(b * t * h * l).into_iter().map(softplus).collect();
        let a: Vec<f64> = (0..h).map(|_| rng.random::<f64>().exp()).collect();
        let g: Vec<f64> = dt.iter().enumerate().map(|(i, d)| -a[i % h] * d).collect();
        let make = |data: Vec<f64>, shape: Vec<usize>| TensorData::new(data, shape);
        Self {
            q: Tensor::from_data(make(q, vec![b, t, h, n]), (device, dtype)),
            k: Tensor::from_data(make(k, vec![b, t, h, n]), (device, dtype)),
            v: Tensor::from_data(make(v, vec![b, t, h, p]), (device, dtype)),
            g: Tensor::from_data(make(g, vec![b, t, h]), (device, dtype)),
            beta: Tensor::from_data(make(beta, vec![b, t, h]), (device, dtype)),
            lambda: Tensor::from_data(make(lambda, vec![b, t, h, l]), (device, dtype)),
        }
    }
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}
