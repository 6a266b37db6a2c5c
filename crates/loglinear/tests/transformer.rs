//! The GPT-2 softmax baseline: parameter count against HF's formula, its init, attention and the
//! whole model against plain-loop float64 references, causality, and decoding with the
//! key/value cache against the full forward.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use loglinear::host::to_f64;
use loglinear::nn::transformer::{Affine, CausalSelfAttention};
use loglinear::nn::{TransformerConfig, TransformerLm};
use loglinear::testing::{assert_close, perturbed, uniform_values};

fn dev() -> Device {
    Device::flex()
}

fn random_tokens(b: usize, t: usize, vocab: usize, seed: u64) -> Tensor<2, Int> {
    loglinear::testing::random_tokens(b, t, vocab, seed, &dev())
}

fn token_ids(tokens: &Tensor<2, Int>) -> Vec<i64> {
    tokens.to_data().try_into_vec_as::<i64>().unwrap()
}

/// HF `GPT2LMHeadModel` parameters: wte V·D + wpe P·D + per layer (ln_1, ln_2: 4D; c_attn
/// D·3D + 3D; attn c_proj D·D + D; c_fc D·4D + 4D; mlp c_proj 4D·D + D) + ln_f 2D; the head
/// is tied.
fn hf_gpt2_params(v: usize, p: usize, d: usize, layers: usize) -> usize {
    let per_layer =
        4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
    v * d + p * d + layers * per_layer + 2 * d
}

#[test]
fn parameter_count_matches_hf_gpt2() {
    // The formula gives the published size of GPT-2 small.
    assert_eq!(hf_gpt2_params(50257, 1024, 768, 12), 124_439_808);

    let cfg = TransformerConfig::new(50257, 256, 6, 4);
    assert_eq!(cfg.max_seq_len, 1024);
    let expected = hf_gpt2_params(50257, 1024, 256, 6);
    assert_eq!(expected, 17_867_008);
    assert_eq!(cfg.init(0, &dev()).num_params(), expected);

    let untied = TransformerConfig {
        tie_embeddings: false,
        ..cfg
    };
    assert_eq!(untied.init(0, &dev()).num_params(), expected + 50257 * 256);
}

fn tiny(vocab: usize, d: usize, layers: usize, heads: usize) -> TransformerConfig {
    TransformerConfig {
        max_seq_len: 96,
        initializer_range: 0.2,
        ..TransformerConfig::new(vocab, d, layers, heads)
    }
}

fn std_of(v: &[f64]) -> f64 {
    (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt()
}

#[test]
fn init_follows_hf_gpt2() {
    let cfg = TransformerConfig {
        max_seq_len: 128,
        ..TransformerConfig::new(300, 64, 6, 4)
    };
    let model = cfg.init(1, &dev());
    let residual_std = 0.02 / 12f64.sqrt();
    let near = |name: &str, v: &[f64], std: f64| {
        let s = std_of(v);
        assert!((s / std - 1.0).abs() < 0.05, "{name}: std {s}, want {std}");
    };
    near("wte", &to_f64(&model.token_embedding.val()), 0.02);
    near("wpe", &to_f64(&model.position_embedding.val()), 0.02);
    let zero = |name: &str, p: &Affine| {
        assert!(to_f64(&p.bias.val()).iter().all(|x| *x == 0.0), "{name}");
    };
    for blk in &model.blocks {
        near("c_attn", &to_f64(&blk.attn.qkv.linear.weight.val()), 0.02);
        near("c_fc", &to_f64(&blk.mlp.up.linear.weight.val()), 0.02);
        near(
            "attn c_proj",
            &to_f64(&blk.attn.out.linear.weight.val()),
            residual_std,
        );
        near(
            "mlp c_proj",
            &to_f64(&blk.mlp.down.linear.weight.val()),
            residual_std,
        );
        for (name, p) in [
            ("c_attn", &blk.attn.qkv),
            ("attn c_proj", &blk.attn.out),
            ("c_fc", &blk.mlp.up),
            ("mlp c_proj", &blk.mlp.down),
        ] {
            zero(name, p);
        }
        for ln in [&blk.attn_norm, &blk.mlp_norm] {
            assert!(to_f64(&ln.weight.val()).iter().all(|x| *x == 1.0));
            assert!(to_f64(&ln.bias.val()).iter().all(|x| *x == 0.0));
            assert_eq!(ln.eps, 1e-5);
        }
    }
    assert!(model.head.is_none(), "GPT-2 ties the head");
    // Same seed, same weights.
    let again = cfg.init(1, &dev());
    assert_eq!(
        to_f64(&model.blocks[3].mlp.down.linear.weight.val()),
        to_f64(&again.blocks[3].mlp.down.linear.weight.val())
    );
}

// Plain-loop float64 reference of GPT-2, on host copies of the parameters. Activations are
// row-major `[rows, width]`.

fn affine(x: &[f64], p: &Affine) -> Vec<f64> {
    let (w, b) = (to_f64(&p.linear.weight.val()), to_f64(&p.bias.val()));
    let (d_out, d_in) = (b.len(), w.len() / b.len());
    let rows = x.len() / d_in;
    let mut y = vec![0.0; rows * d_out];
    for r in 0..rows {
        for o in 0..d_out {
            y[r * d_out + o] = b[o]
                + (0..d_in)
                    .map(|i| x[r * d_in + i] * w[i * d_out + o])
                    .sum::<f64>();
        }
    }
    y
}

fn layer_norm(x: &[f64], ln: &loglinear::nn::init::LayerNorm) -> Vec<f64> {
    let (w, b) = (to_f64(&ln.weight.val()), to_f64(&ln.bias.val()));
    let d = w.len();
    x.chunks(d)
        .flat_map(|row| {
            let mean = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + ln.eps).sqrt();
            (0..d)
                .map(|i| (row[i] - mean) * inv * w[i] + b[i])
                .collect::<Vec<_>>()
        })
        .collect()
}

/// GPT-2's `gelu_new`.
fn gelu_new(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh())
}

/// `softmax(q kᵀ/√hd, keys s ≤ t) v` per head, heads concatenated, then the output projection.
fn reference_attention(m: &CausalSelfAttention, x: &[f64], b: usize, t: usize) -> Vec<f64> {
    let d = x.len() / (b * t);
    let (h, hd) = (m.n_heads, d / m.n_heads);
    let qkv = affine(x, &m.qkv);
    let at = |bi: usize, ti: usize, part: usize, hi: usize, j: usize| {
        qkv[(bi * t + ti) * 3 * d + part * d + hi * hd + j]
    };
    let mut heads = vec![0.0; b * t * d];
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let scores: Vec<f64> = (0..=ti)
                    .map(|s| {
                        (0..hd)
                            .map(|j| at(bi, ti, 0, hi, j) * at(bi, s, 1, hi, j))
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|z| (z - mx).exp()).collect();
                let total: f64 = e.iter().sum();
                for j in 0..hd {
                    heads[(bi * t + ti) * d + hi * hd + j] =
                        (0..=ti).map(|s| e[s] / total * at(bi, s, 2, hi, j)).sum();
                }
            }
        }
    }
    affine(&heads, &m.out)
}

fn reference_model(model: &TransformerLm, tokens: &[i64], b: usize, t: usize) -> Vec<f64> {
    let wte = to_f64(&model.token_embedding.val());
    let wpe = to_f64(&model.position_embedding.val());
    let d = model.config.d_model;
    let v = model.config.vocab_size;
    let mut x = vec![0.0; b * t * d];
    for r in 0..b * t {
        let (tok, pos) = (tokens[r] as usize, r % t);
        for i in 0..d {
            x[r * d + i] = wte[tok * d + i] + wpe[pos * d + i];
        }
    }
    let add = |a: &[f64], c: &[f64]| a.iter().zip(c).map(|(p, q)| p + q).collect::<Vec<_>>();
    for blk in &model.blocks {
        let a = reference_attention(&blk.attn, &layer_norm(&x, &blk.attn_norm), b, t);
        x = add(&x, &a);
        let hidden: Vec<f64> = affine(&layer_norm(&x, &blk.mlp_norm), &blk.mlp.up)
            .into_iter()
            .map(gelu_new)
            .collect();
        x = add(&x, &affine(&hidden, &blk.mlp.down));
    }
    let x = layer_norm(&x, &model.norm);
    let (w, tied) = match &model.head {
        Some(head) => (to_f64(&head.weight.val()), false),
        None => (wte, true),
    };
    let mut logits = vec![0.0; b * t * v];
    for r in 0..b * t {
        for o in 0..v {
            logits[r * v + o] = (0..d)
                .map(|i| x[r * d + i] * if tied { w[o * d + i] } else { w[i * v + o] })
                .sum();
        }
    }
    logits
}

#[test]
fn attention_matches_plain_loop_reference() {
    let (b, t, d) = (2, 13, 8);
    let model = perturbed(tiny(11, d, 1, 2).init(4, &dev()), 21, 0.3);
    let attn = &model.blocks[0].attn;
    assert!(to_f64(&attn.qkv.bias.val()).iter().all(|x| *x != 0.0));
    let x = uniform_values(b * t * d, 5);
    let xt = Tensor::<3>::from_data(TensorData::new(x.clone(), vec![b, t, d]), &dev());
    assert_close(
        "attention",
        &reference_attention(attn, &x, b, t),
        &to_f64(&attn.forward(xt)),
        1e-5,
    );
}

#[test]
fn model_matches_plain_loop_reference() {
    let (b, t) = (2, 11);
    for tie in [true, false] {
        let cfg = TransformerConfig {
            tie_embeddings: tie,
            ..tiny(17, 12, 2, 3)
        };
        let model = perturbed(cfg.init(8, &dev()), 31, 0.3);
        let tokens = random_tokens(b, t, 17, 6);
        assert_close(
            &format!("logits (tied: {tie})"),
            &reference_model(&model, &token_ids(&tokens), b, t),
            &to_f64(&model.run(tokens)),
            1e-5,
        );
    }
}

/// Masked softmax attention from plain tensor ops (the form the fused op replaces).
fn plain_attention(m: &CausalSelfAttention, x: Tensor<3>) -> Tensor<3> {
    let [b, t, d] = x.dims();
    let (h, hd) = (m.n_heads, d / m.n_heads);
    let qkv = m.qkv.forward(x.clone());
    let split = |i: usize| {
        qkv.clone()
            .narrow(2, i * d, d)
            .reshape([b, t, h, hd])
            .swap_dims(1, 2)
    };
    let scores = split(0).matmul(split(1).swap_dims(2, 3)) / (hd as f64).sqrt(); // [B, H, T, T]
    let future = Tensor::<2, Bool>::tril_mask([t, t], 0, &x.device())
        .unsqueeze::<4>()
        .expand([b, h, t, t]);
    let p = softmax(scores.mask_fill(future, f64::NEG_INFINITY), 3);
    m.out
        .forward(p.matmul(split(2)).swap_dims(1, 2).reshape([b, t, d]))
}

/// Under autodiff the fused attention op gives the output and input gradient of the plain
/// masked-softmax form, and every parameter of the model receives a gradient.
#[test]
fn gradients_match_plain_attention_and_reach_every_parameter() {
    let ad = dev().autodiff();
    let (b, t, d) = (2, 19, 12);
    let model = perturbed(tiny(23, d, 2, 3).init(2, &ad), 5, 0.3);
    let attn = &model.blocks[1].attn;
    let upload = |v: Vec<f64>| Tensor::<3>::from_data(TensorData::new(v, vec![b, t, d]), &ad);
    let (x0, d_o) = (
        upload(uniform_values(b * t * d, 3)),
        upload(uniform_values(b * t * d, 4)),
    );
    let run = |f: &dyn Fn(Tensor<3>) -> Tensor<3>| {
        let x = x0.clone().detach().require_grad();
        let y = f(x.clone());
        let grads = (y.clone() * d_o.clone()).sum().backward();
        (to_f64(&y), to_f64(&x.grad(&grads).unwrap()))
    };
    let (y_fused, dx_fused) = run(&|x| attn.forward(x));
    let (y_plain, dx_plain) = run(&|x| plain_attention(attn, x));
    assert_close("attention output", &y_plain, &y_fused, 1e-5);
    assert_close("attention dx", &dx_plain, &dx_fused, 1e-5);

    struct Check<'a>(&'a GradientsParams, Vec<String>, usize);
    impl ModuleVisitor for Check<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.2 += 1;
            let ok = self
                .0
                .get::<D>(param.id)
                .is_some_and(|g| to_f64(&g).iter().any(|v| *v != 0.0));
            if !ok {
                self.1.push(format!("{:?}", param.id));
            }
        }
    }
    let tokens = random_tokens(b, t, 23, 7);
    let logits = model.run(tokens);
    let weights = Tensor::<3>::from_data(
        TensorData::new(uniform_values(b * t * 23, 8), vec![b, t, 23]),
        &ad,
    );
    let grads = GradientsParams::from_grads((logits * weights).sum().backward(), &model);
    let mut check = Check(&grads, Vec::new(), 0);
    model.visit(&mut check);
    assert_eq!(check.2, 2 + 2 * 12 + 2);
    assert!(check.1.is_empty(), "no gradient for {:?}", check.1);
}

fn decoding_model() -> TransformerLm {
    perturbed(tiny(50, 32, 2, 4).init(3, &dev()), 9, 0.3)
}

#[test]
fn changing_a_later_token_leaves_earlier_logits_unchanged() {
    let (b, t, k, v) = (2, 50, 30, 50);
    let model = decoding_model();
    let tokens = random_tokens(b, t, v, 4);
    let mut ids = token_ids(&tokens);
    for bi in 0..b {
        ids[bi * t + k] = (ids[bi * t + k] + 1) % v as i64;
    }
    let changed = Tensor::from_data(TensorData::new(ids, vec![b, t]), &dev());
    let (x, y) = (model.run(tokens), model.run(changed));
    let before = |z: &Tensor<3>| to_f64(&z.clone().narrow(1, 0, k));
    assert_close("logits before the change", &before(&x), &before(&y), 1e-6);
    let after = |z: &Tensor<3>| to_f64(&z.clone().narrow(1, k, t - k));
    let diff = after(&x)
        .iter()
        .zip(after(&y))
        .fold(0f64, |m, (p, q)| m.max((p - q).abs()));
    assert!(diff > 1e-3, "the change did not reach later logits");
}

/// Token-by-token decoding with the key/value cache reproduces the full forward; so do prefill
/// followed by steps, and prefill followed by a chunk and steps. The cache holds 2·layers·B·t·D
/// floats.
#[test]
fn decoding_equals_full_forward() {
    let (b, t) = (2, 70);
    let model = decoding_model();
    let tokens = random_tokens(b, t, 50, 4);
    let full = to_f64(&model.run(tokens.clone()));
    let tok = |i: usize| tokens.clone().narrow(1, i, 1).squeeze_dim::<1>(1);

    let mut state = model.init_state(b, &dev());
    assert_eq!(state.size_bytes(), 0);
    let stepped: Vec<_> = (0..t).map(|i| model.step(tok(i), &mut state)).collect();
    let stepped = Tensor::stack::<3>(stepped, 1);
    assert_close("step vs full", &full, &to_f64(&stepped), 1e-4);
    assert_eq!(state.position(), t);
    assert_eq!(state.size_bytes(), 2 * 2 * b * t * 32 * 4);

    let split = 45;
    let (prefix, mut pre) = model.prefill(tokens.clone().narrow(1, 0, split));
    assert_eq!(pre.position(), split);
    let mut parts = vec![prefix];
    parts.extend((split..t).map(|i| model.step(tok(i), &mut pre).unsqueeze_dim(1)));
    assert_close(
        "prefill+step vs full",
        &full,
        &to_f64(&Tensor::cat(parts, 1)),
        1e-4,
    );
    for (a, c) in state.layers.iter().zip(&pre.layers) {
        let (a, c) = (a.as_ref().unwrap(), c.as_ref().unwrap());
        assert_eq!(a.len(), t);
        assert_close("keys", &to_f64(&a.keys), &to_f64(&c.keys), 1e-5);
        assert_close("values", &to_f64(&a.values), &to_f64(&c.values), 1e-5);
    }

    // A chunk after a cache takes the explicitly masked path.
    let (prefix, mut pre) = model.prefill(tokens.clone().narrow(1, 0, 20));
    let chunk = model.extend(tokens.clone().narrow(1, 20, 30), &mut pre);
    let mut parts = vec![prefix, chunk];
    parts.extend((50..t).map(|i| model.step(tok(i), &mut pre).unsqueeze_dim(1)));
    assert_close(
        "prefill+chunk+step vs full",
        &full,
        &to_f64(&Tensor::cat(parts, 1)),
        1e-4,
    );
}

#[test]
fn greedy_decoding_with_cache_equals_recomputation() {
    let (b, prompt, new) = (2, 9, 6);
    let model = decoding_model();
    let tokens = random_tokens(b, prompt, 50, 12);
    let argmax = |logits: Tensor<2>| logits.argmax(1).squeeze_dim::<1>(1);

    let (logits, mut state) = model.prefill(tokens.clone());
    let mut next = argmax(logits.narrow(1, prompt - 1, 1).squeeze_dim(1));
    let mut cached = vec![next.clone()];
    for _ in 1..new {
        next = argmax(model.step(next, &mut state));
        cached.push(next.clone());
    }

    let mut seq = tokens;
    let mut recomputed = Vec::new();
    for _ in 0..new {
        let t = seq.dims()[1];
        let next = argmax(model.run(seq.clone()).narrow(1, t - 1, 1).squeeze_dim(1));
        seq = Tensor::cat(vec![seq, next.clone().unsqueeze_dim(1)], 1);
        recomputed.push(next);
    }
    let ids = |v: Vec<Tensor<1, Int>>| token_ids(&Tensor::stack::<2>(v, 1));
    assert_eq!(ids(cached), ids(recomputed));
}

#[test]
#[should_panic(
    expected = "TransformerLm: a sequence of 97 tokens (positions 0..97) is longer than max_seq_len = 96"
)]
fn too_long_sequence_panics() {
    let model = tiny(10, 8, 1, 2).init(0, &dev());
    model.run(random_tokens(1, 97, 10, 0));
}

#[test]
#[should_panic(
    expected = "TransformerLm: a sequence of 97 tokens (positions 96..97) is longer than max_seq_len = 96"
)]
fn stepping_past_max_seq_len_panics() {
    let model = tiny(10, 8, 1, 2).init(0, &dev());
    let (_, mut state) = model.prefill(random_tokens(1, 96, 10, 0));
    model.step(
        Tensor::from_data(TensorData::new(vec![1i64], vec![1]), &dev()),
        &mut state,
    );
}
