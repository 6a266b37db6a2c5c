//! The LM's first and last ops in their fast forms: the embedding lookup as a gather (whose
//! backward is a scatter-add) against Burn's `embedding`, and the per-row cross-entropy against
//! `log_softmax` + `gather` — values and gradients, on the CPU. (The fused cross-entropy kernels
//! are checked against the same definition on a CubeCL device in `tests/kernels.rs`.)

use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use loglinear::nn::init::embed;
use loglinear::nn::loss::{cross_entropy_rows, reference_cross_entropy_rows};
use loglinear::testing::test_seed;

fn tokens(b: usize, t: usize, vocab: usize, seed: u64, device: &Device) -> Tensor<2, Int> {
    let mut x = seed | 1;
    let ids: Vec<i64> = (0..b * t)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as i64
        })
        .collect();
    Tensor::from_data(TensorData::new(ids, [b, t]), device)
}

fn host<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.into_data().convert::<f64>().iter::<f64>().collect()
}

#[test]
fn embed_is_the_embedding_lookup_and_its_gradient() {
    let device = Device::flex().autodiff();
    let seed = test_seed(11);
    // Repeated tokens (vocabulary 5 for 3 × 13 positions) so rows of the gradient sum several.
    let (v, d) = (5, 6);
    let table = Tensor::<2>::random([v, d], Distribution::Normal(0.0, 1.0), &device);
    let ids = tokens(3, 13, v, seed, &device);
    let w = Tensor::<3>::random([3, 13, d], Distribution::Normal(0.0, 1.0), &device);
    let run = |f: &dyn Fn(Tensor<2>) -> Tensor<3>| {
        let x = table.clone().detach().require_grad();
        let out = f(x.clone());
        let grads = (out.clone() * w.clone()).sum().backward();
        (
            host(out.detach()),
            host(x.grad(&grads).expect("a gradient")),
        )
    };
    let (ours, d_ours) = run(&|x| embed(x, ids.clone()));
    let (burn, d_burn) = run(&|x| burn::tensor::module::embedding(x, ids.clone()));
    assert_eq!(ours, burn, "the same rows");
    let worst = d_ours
        .iter()
        .zip(&d_burn)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        worst <= 1e-6,
        "seed {seed}: table gradients differ by {worst:e}"
    );
    assert!(d_ours.iter().any(|g| *g != 0.0));
}

#[test]
fn cross_entropy_rows_is_minus_log_softmax_at_the_target() {
    let device = Device::flex().autodiff();
    let seed = test_seed(12);
    let (rows, v) = (9, 17);
    let logits = Tensor::<2>::random([rows, v], Distribution::Normal(0.0, 3.0), &device);
    let targets = tokens(1, rows, v, seed, &device).reshape([rows]);
    let nll = host(cross_entropy_rows(logits.clone(), targets.clone()));
    // By hand: logsumexp(x) − x[target], in f64 from the same logits.
    let x = host(logits.clone());
    let t: Vec<i64> = targets
        .clone()
        .into_data()
        .convert::<i64>()
        .iter::<i64>()
        .collect();
    for r in 0..rows {
        let row = &x[r * v..(r + 1) * v];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|y| (y - m).exp()).sum::<f64>().ln();
        let want = lse - row[t[r] as usize];
        assert!(
            (nll[r] - want).abs() <= 1e-5 * want.abs().max(1.0),
            "row {r}: {} vs {want}",
            nll[r]
        );
    }
    // On the CPU the public function is the reference, bit for bit.
    assert_eq!(nll, host(reference_cross_entropy_rows(logits, targets)));
}
