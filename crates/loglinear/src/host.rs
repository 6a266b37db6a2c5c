//! Host (CPU, f64) copies of tensors and of the op's inputs, the definition of the op as plain
//! loops over them, and how far two results are apart: what the CLI reads, writes, prints and
//! compares, and what the tests check against.

use burn::prelude::*;
use burn::tensor::DType;

use crate::fenwick;
use crate::ops::{Dims, LogLinearInput};

/// Host copy of a tensor as `f64` values (any float dtype).
pub fn to_f64<const D: usize>(x: &Tensor<D>) -> Vec<f64> {
    x.to_data()
        .try_into_vec_as::<f64>()
        .expect("tensor data as f64")
}

/// How far `got` is from `reference`: the largest absolute difference divided by the largest
/// absolute reference value (so 1e-6 means "agrees to six digits of the largest entry"), and
/// the ratio of RMS values.
#[derive(Clone, Copy, Debug)]
pub struct Closeness {
    /// max |got − ref| / max |ref|.
    pub max_rel: f64,
    /// max |got − ref|.
    pub max_abs: f64,
    /// rms(got) / rms(ref).
    pub rms_ratio: f64,
    /// Whether `got` holds a NaN or infinity.
    pub non_finite: bool,
}

/// Compares two equally long value lists (see [`Closeness`]).
pub fn closeness(reference: &[f64], got: &[f64]) -> Closeness {
    assert_eq!(reference.len(), got.len(), "closeness: lengths differ");
    let non_finite = got.iter().any(|x| !x.is_finite());
    let scale = reference.iter().fold(0f64, |m, x| m.max(x.abs()));
    let max_abs = reference
        .iter()
        .zip(got)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    let rms = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / v.len().max(1) as f64).sqrt();
    let (rr, rg) = (rms(reference), rms(got));
    Closeness {
        max_rel: if scale > 0.0 {
            max_abs / scale
        } else {
            max_abs
        },
        max_abs,
        rms_ratio: if rr > 0.0 {
            rg / rr
        } else if rg == 0.0 {
            1.0
        } else {
            f64::INFINITY
        },
        non_finite,
    }
}

/// Host-side inputs in `[B, T, H, ·]` row-major order (the layout of [`LogLinearInput`]).
#[derive(Clone, Debug)]
pub struct HostInput {
    /// Sizes.
    pub dims: Dims,
    /// `[B, T, H, N]`.
    pub q: Vec<f64>,
    /// `[B, T, H, N]`.
    pub k: Vec<f64>,
    /// `[B, T, H, P]`.
    pub v: Vec<f64>,
    /// `[B, T, H]`.
    pub g: Vec<f64>,
    /// `[B, T, H, L]`.
    pub lambda: Vec<f64>,
}

impl HostInput {
    /// Copies an input to the host.
    pub fn from_input(x: &LogLinearInput) -> Self {
        Self {
            dims: x.dims(),
            q: to_f64(&x.q),
            k: to_f64(&x.k),
            v: to_f64(&x.v),
            g: to_f64(&x.g),
            lambda: to_f64(&x.lambda),
        }
    }

    /// Uploads to `device` in `dtype`.
    pub fn to_input(&self, dtype: DType, device: &Device) -> LogLinearInput {
        let Dims { b, t, h, n, p, l } = self.dims;
        let up = |v: &Vec<f64>, s: Vec<usize>| burn::tensor::TensorData::new(v.clone(), s);
        LogLinearInput {
            q: Tensor::from_data(up(&self.q, vec![b, t, h, n]), (device, dtype)),
            k: Tensor::from_data(up(&self.k, vec![b, t, h, n]), (device, dtype)),
            v: Tensor::from_data(up(&self.v, vec![b, t, h, p]), (device, dtype)),
            g: Tensor::from_data(up(&self.g, vec![b, t, h]), (device, dtype)),
            lambda: Tensor::from_data(up(&self.lambda, vec![b, t, h, l]), (device, dtype)),
        }
    }

    /// The definition, written as plain loops in float64 (no Burn): `o: [B, T, H, P]`.
    /// Independent of every [`Form`], so the parallel form is itself checked against it.
    pub fn reference_output(&self) -> Vec<f64> {
        let Dims { b, t, h, n, p, l } = self.dims;
        let mut o = vec![0.0; b * t * h * p];
        for bi in 0..b {
            for hi in 0..h {
                let at = |ti: usize| (bi * t + ti) * h + hi;
                let mut gamma = vec![0.0; t];
                let mut acc = 0.0;
                for (ti, gm) in gamma.iter_mut().enumerate() {
                    acc += self.g[at(ti)];
                    *gm = acc;
                }
                for ti in 0..t {
                    for si in 0..=ti {
                        let lev = fenwick::level(ti, si);
                        assert!(lev < l, "reference_output: {l} levels are too few");
                        let dot: f64 = (0..n)
                            .map(|i| self.q[at(ti) * n + i] * self.k[at(si) * n + i])
                            .sum();
                        let w = self.lambda[at(ti) * l + lev] * (gamma[ti] - gamma[si]).exp() * dot;
                        for j in 0..p {
                            o[at(ti) * p + j] += w * self.v[at(si) * p + j];
                        }
                    }
                }
            }
        }
        o
    }
}
