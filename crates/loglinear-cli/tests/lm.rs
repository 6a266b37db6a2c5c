//! Language modelling: the loss compares logits[p] with targets[p] (no second shift), perplexity
//! on hand-computable cases, and decoding with the caches against full recomputation.

use burn::prelude::*;
use burn::tensor::TensorData;
use loglinear::nn::{LambdaMode, LmConfig, MixerConfig, TransformerConfig};
use loglinear::ops::Form;
use loglinear_cli::generate::{self, Sampling};
use loglinear_cli::model::{Model, masked_cross_entropy};
use loglinear_cli::train::combine_batches;

fn dev() -> Device {
    Device::flex()
}

fn logits(values: Vec<f64>, b: usize, t: usize, v: usize) -> Tensor<3> {
    Tensor::from_data(
        TensorData::new(values, vec![b, t, v]),
        (&dev(), burn::tensor::DType::F64),
    )
}

fn targets(values: Vec<i64>, b: usize, t: usize) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(values, vec![b, t]), &dev())
}

/// Uniform logits over V give NLL ln V, i.e. perplexity V; ignored positions do not count.
#[test]
fn perplexity_of_uniform_logits_is_the_vocabulary_size() {
    let (b, t, v) = (2, 3, 7);
    let (loss, n) = masked_cross_entropy(
        logits(vec![0.25; b * t * v], b, t, v),
        targets(vec![1, 2, -100, 6, -100, 0], b, t),
    );
    assert_eq!(n, 4);
    let loss = loss.into_scalar::<f64>();
    assert!((loss - (v as f64).ln()).abs() < 1e-12, "{loss}");
    assert!((loss.exp() - v as f64).abs() < 1e-9);
}

/// The loss at position p scores targets[p]: logits that put (almost) all mass on targets[p]
/// give a loss near 0, the same logits against the next position's target a large one.
#[test]
fn the_loss_aligns_logits_with_targets_without_a_second_shift() {
    let (t, v) = (5, 11);
    let tgt: Vec<i64> = vec![3, 7, 1, 9, 4];
    let mut l = vec![0.0; t * v];
    for (p, &y) in tgt.iter().enumerate() {
        l[p * v + y as usize] = 30.0;
    }
    let (aligned, _) = masked_cross_entropy(logits(l.clone(), 1, t, v), targets(tgt.clone(), 1, t));
    assert!(aligned.into_scalar::<f64>() < 1e-9);
    let shifted: Vec<i64> = tgt[1..].iter().copied().chain([-100]).collect();
    let (wrong, _) = masked_cross_entropy(logits(l, 1, t, v), targets(shifted, 1, t));
    assert!(wrong.into_scalar::<f64>() > 25.0);
}

/// Token-weighted perplexity vs the published batch-mean definition on a hand case.
#[test]
fn token_weighted_and_batch_mean_perplexity() {
    // batch 1: 1 token with NLL 1.0; batch 2: 3 tokens with mean NLL 2.0
    let (weighted, batch_mean) = combine_batches(&[(1.0, 1), (2.0, 3)]);
    assert!((weighted - 7.0 / 4.0).abs() < 1e-12);
    assert!((batch_mean - 1.5).abs() < 1e-12);
    // an empty batch (all positions ignored) counts in neither
    let (w, m) = combine_batches(&[(1.0, 1), (0.0, 0), (2.0, 3)]);
    assert_eq!((w, m), (weighted, batch_mean));
}

fn tiny_models() -> Vec<(&'static str, Model)> {
    let mut config = LmConfig::new(97, 2, MixerConfig::new(32));
    config.mixer.head_dim = 16;
    config.mixer.d_state = 8;
    config.mixer.lambda.mode = LambdaMode::MlpSoftplus;
    config.mixer.lambda.levels = 8;
    config.initializer_range = 0.3;
    let transformer = TransformerConfig {
        max_seq_len: 128,
        initializer_range: 0.3,
        ..TransformerConfig::new(97, 32, 2, 2)
    };
    vec![
        ("log-linear", Model::Mamba2(config.init(1, &dev()))),
        (
            "transformer",
            Model::Transformer(transformer.init(1, &dev())),
        ),
    ]
}

/// Greedy decoding with the cache produces exactly the tokens of full recomputation, and the
/// logits of every step agree to 1e-4.
#[test]
fn greedy_decoding_with_the_cache_equals_full_recomputation() {
    let prompt: Vec<u32> = vec![5, 17, 42, 3, 96, 0, 11, 8, 8, 23, 61];
    for (name, model) in tiny_models() {
        let (cached, _) =
            generate::generate(&model, &prompt, 30, Sampling::GREEDY, 0, 4, &dev(), |_| {})
                .unwrap();
        let mut seq = prompt.clone();
        // greedy picks ignore the RNG
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
        let (mut logits, mut cache) = generate::prefill(&model, &prompt, 4, &dev()).unwrap();
        for (i, &tok) in cached.iter().enumerate() {
            let full = generate::recompute(&model, &seq, Form::Parallel, &dev());
            let scale = full.iter().fold(0f64, |m, x| m.max(x.abs()));
            let diff = full
                .iter()
                .zip(&logits)
                .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 1e-4 * scale,
                "{name} step {i}: logits differ by {diff:.2e} (scale {scale:.2e})"
            );
            assert_eq!(
                Sampling::GREEDY.pick(&full, &mut rng),
                tok,
                "{name}: token {i} differs"
            );
            seq.push(tok);
            logits = generate::step(&model, tok, &mut cache, &dev());
        }
        assert!(
            cached
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                > 1,
            "{name}: degenerate output"
        );
    }
}

#[test]
fn sampling_respects_top_k_and_is_seeded() {
    use rand::SeedableRng;
    let logits: Vec<f64> = vec![0.0, 5.0, 4.9, -3.0, 4.8];
    let s = Sampling {
        temperature: 1.0,
        top_k: 2,
        top_p: 1.0,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let picks: Vec<u32> = (0..200).map(|_| s.pick(&logits, &mut rng)).collect();
    assert!(picks.iter().all(|&p| p == 1 || p == 2));
    assert!(picks.contains(&1) && picks.contains(&2));
    let mut a = rand::rngs::StdRng::seed_from_u64(9);
    let mut b = rand::rngs::StdRng::seed_from_u64(9);
    let t = Sampling {
        temperature: 0.7,
        top_k: 0,
        top_p: 0.9,
    };
    let x: Vec<u32> = (0..50).map(|_| t.pick(&logits, &mut a)).collect();
    let y: Vec<u32> = (0..50).map(|_| t.pick(&logits, &mut b)).collect();
    assert_eq!(x, y);
    // top_p = 0.5 keeps only the most likely token here
    let n = Sampling {
        temperature: 1.0,
        top_k: 0,
        top_p: 0.3,
    };
    assert!((0..50).all(|_| n.pick(&logits, &mut a) == 1));
}
