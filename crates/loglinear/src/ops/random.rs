//! Random inputs at realistic scales, for tests, benchmarks and examples.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use super::{Dims, LogLinearInput};

impl LogLinearInput {
    /// Random inputs at realistic Mamba-2 scales: `q, k, v ~ N(0, 1)`,
    /// `g = A·dt` with `dt = softplus(randn − 4)` and `A = −exp(U(0, 1))`,
    /// `λ = softplus(randn)`. Drawn with `seed` on the host, so equal seeds give equal inputs on
    /// every backend and dtype.
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
        let q = normal(b * t * h * n);
        let k = normal(b * t * h * n);
        let v = normal(b * t * h * p);
        let dt: Vec<f64> = normal(b * t * h)
            .into_iter()
            .map(|x| softplus(x - 4.0))
            .collect();
        let lambda: Vec<f64> = normal(b * t * h * l).into_iter().map(softplus).collect();
        let a: Vec<f64> = (0..h).map(|_| -rng.random::<f64>().exp()).collect();
        let g: Vec<f64> = dt.iter().enumerate().map(|(i, d)| a[i % h] * d).collect();
        let make = |data: Vec<f64>, shape: Vec<usize>| TensorData::new(data, shape);
        Self {
            q: Tensor::from_data(make(q, vec![b, t, h, n]), (device, dtype)),
            k: Tensor::from_data(make(k, vec![b, t, h, n]), (device, dtype)),
            v: Tensor::from_data(make(v, vec![b, t, h, p]), (device, dtype)),
            g: Tensor::from_data(make(g, vec![b, t, h]), (device, dtype)),
            lambda: Tensor::from_data(make(lambda, vec![b, t, h, l]), (device, dtype)),
        }
    }
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}
