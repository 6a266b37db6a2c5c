//! The mixer against a plain-loop float64 reference of spec §2.3, the λ modes and their init,
//! parameter counts, and decoding against the parallel forward.

use burn::module::Module;
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use loglinear::fenwick::num_levels;
use loglinear::nn::init::Init;
use loglinear::nn::{LambdaConfig, LambdaMlp, LambdaMode, LmConfig, LogLinearMamba2, MixerConfig};
use loglinear::ops::{Dims, Form};
use loglinear::host::{HostInput, to_f64};
use loglinear::testing::{assert_close, perturbed, uniform_values};

fn dev() -> Device {
    Device::flex()
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}
fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn small_mixer(mode: LambdaMode, groups: usize, levels: usize) -> MixerConfig {
    MixerConfig {
        expand: 2,
        head_dim: 4,
        d_state: 3,
        n_groups: groups,
        lambda: LambdaConfig {
            mode,
            levels,
            mlp_hidden: 5,
        },
        ..MixerConfig::new(8)
    }
}

/// Spec §2.3 steps 1–11 as plain loops over host copies of the mixer's parameters.
fn reference_mixer(m: &LogLinearMamba2, x: &[f64], b: usize, t: usize) -> Vec<f64> {
    let c = &m.config;
    let (d, di, h, p, n, g, k) = (
        c.d_model,
        c.d_inner(),
        c.heads(),
        c.head_dim,
        c.d_state,
        c.n_groups,
        c.conv_kernel,
    );
    let l = c.lambda.levels;
    let conv_dim = c.conv_dim();
    let w_in = to_f64(&m.in_proj.weight.val());
    let width = w_in.len() / d;
    let conv_w = to_f64(&m.conv_weight.val());
    let conv_b = to_f64(&m.conv_bias.val());
    let dt_bias = to_f64(&m.dt_bias.val());
    let a: Vec<f64> = to_f64(&m.a_log.val()).iter().map(|v| -v.exp()).collect();
    let d_skip = to_f64(&m.d_skip.val());
    let norm_w = to_f64(&m.norm_weight.val());
    let w_out = to_f64(&m.out_proj.weight.val());
    let mut host = HostInput {
        dims: Dims { b, t, h, n, p, l },
        q: vec![0.0; b * t * h * n],
        k: vec![0.0; b * t * h * n],
        v: vec![0.0; b * t * h * p],
        g: vec![0.0; b * t * h],
        lambda: vec![0.0; b * t * h * l],
    };
    let mut zs = vec![0.0; b * t * di];
    let mut xs = vec![0.0; b * t * di];
    for bi in 0..b {
        let proj: Vec<Vec<f64>> = (0..t)
            .map(|ti| {
                (0..width)
                    .map(|o| {
                        (0..d)
                            .map(|i| x[(bi * t + ti) * d + i] * w_in[i * width + o])
                            .sum()
                    })
                    .collect()
            })
            .collect();
        for ti in 0..t {
            let row = &proj[ti];
            let conv: Vec<f64> = (0..conv_dim)
                .map(|ch| {
                    let mut u = conv_b[ch];
                    for j in 0..k {
                        let src = ti as isize - (k as isize - 1) + j as isize;
                        if src >= 0 {
                            u += conv_w[ch * k + j] * proj[src as usize][di + ch];
                        }
                    }
                    silu(u)
                })
                .collect();
            let at = |hi: usize| (bi * t + ti) * h + hi;
            for hi in 0..h {
                let grp = hi / (h / g);
                let delta = softplus(row[di + conv_dim + hi] + dt_bias[hi]);
                host.g[at(hi)] = a[hi] * delta;
                for j in 0..p {
                    let xv = conv[hi * p + j];
                    xs[(bi * t + ti) * di + hi * p + j] = xv;
                    host.v[at(hi) * p + j] = delta * xv;
                }
                for j in 0..n {
                    host.k[at(hi) * n + j] = conv[di + grp * n + j];
                    host.q[at(hi) * n + j] = conv[di + g * n + grp * n + j];
                }
                let dl = |lv: usize| row[di + conv_dim + h + hi * l + lv];
                let lam: Vec<f64> = match c.lambda.mode {
                    LambdaMode::Ones => vec![1.0; l],
                    LambdaMode::Linear => {
                        let scale = to_f64(&m.lambda.scale.as_ref().unwrap().val());
                        (0..l)
                            .map(|lv| softplus(scale[hi * l + lv] * dl(lv)))
                            .collect()
                    }
                    mode => {
                        let mlp = m.lambda.mlp.as_ref().unwrap();
                        let (w1, b1, w2, b2) = (
                            to_f64(&mlp.w1.val()),
                            to_f64(&mlp.b1.val()),
                            to_f64(&mlp.w2.val()),
                            to_f64(&mlp.b2.val()),
                        );
                        let hid = b1.len();
                        let hidden: Vec<f64> = (0..hid)
                            .map(|j| {
                                gelu(b1[j] + (0..l).map(|i| dl(i) * w1[i * hid + j]).sum::<f64>())
                            })
                            .collect();
                        let logits: Vec<f64> = (0..l)
                            .map(|o| {
                                b2[o] + (0..hid).map(|j| hidden[j] * w2[j * l + o]).sum::<f64>()
                            })
                            .collect();
                        if mode == LambdaMode::MlpSoftplus {
                            logits.iter().map(|&z| softplus(z)).collect()
                        } else {
                            let mx = logits.iter().cloned().fold(f64::MIN, f64::max);
                            let e: Vec<f64> = logits.iter().map(|z| (z - mx).exp()).collect();
                            let s: f64 = e.iter().sum();
                            e.iter().map(|v| v / s).collect()
                        }
                    }
                };
                host.lambda[at(hi) * l..at(hi) * l + l].copy_from_slice(&lam);
            }
            zs[(bi * t + ti) * di..(bi * t + ti + 1) * di].copy_from_slice(&row[..di]);
        }
    }
    let o = host.reference_output();
    let mut out = vec![0.0; b * t * d];
    for row in 0..b * t {
        let w: Vec<f64> = (0..di)
            .map(|i| {
                let hi = i / p;
                (o[row * di + i] + d_skip[hi] * xs[row * di + i]) * silu(zs[row * di + i])
            })
            .collect();
        let rms = (w.iter().map(|v| v * v).sum::<f64>() / di as f64 + c.norm_eps).sqrt();
        for oi in 0..d {
            out[row * d + oi] = (0..di)
                .map(|i| w[i] / rms * norm_w[i] * w_out[i * d + oi])
                .sum();
        }
    }
    out
}

#[test]
fn mixer_matches_plain_loop_reference_for_every_mode_and_groups() {
    let (b, t) = (2, 37);
    for (i, mode) in LambdaMode::ALL.into_iter().enumerate() {
        for groups in [1, 2] {
            let cfg = small_mixer(mode, groups, num_levels(t));
            let mut init = Init::new(10 + i as u64, &dev());
            let mixer = perturbed(cfg.init(&mut init, 0.3, 0.5), 100 + i as u64, 0.3);
            let x = uniform_values(b * t * cfg.d_model, 7 + i as u64);
            let xt =
                Tensor::<3>::from_data(TensorData::new(x.clone(), vec![b, t, cfg.d_model]), &dev());
            let expected = reference_mixer(&mixer, &x, b, t);
            for form in [Form::Parallel, Form::Chunked { chunk: 8 }] {
                let y = mixer.forward(xt.clone(), form, None, false).y;
                assert_close(
                    &format!("mixer {mode} G={groups} {form}"),
                    &expected,
                    &to_f64(&y),
                    2e-5,
                );
            }
        }
    }
}

fn tiny_lm(mode: LambdaMode, levels: usize) -> LmConfig {
    LmConfig {
        mixer: MixerConfig {
            expand: 2,
            head_dim: 8,
            d_state: 8,
            n_groups: 2,
            lambda: LambdaConfig {
                mode,
                levels,
                mlp_hidden: 16,
            },
            ..MixerConfig::new(32)
        },
        initializer_range: 0.2,
        ..LmConfig::new(50, 32, 2)
    }
}

fn random_tokens(b: usize, t: usize, vocab: usize, seed: u64) -> Tensor<2, Int> {
    loglinear::testing::random_tokens(b, t, vocab, seed, &dev())
}

/// Token-by-token decoding (conv window + Fenwick cache) reproduces the parallel forward's
/// logits; prefill with the chunked form returns the state that stepping builds.
#[test]
fn decoding_equals_parallel_forward() {
    let (b, t) = (2, 70);
    for mode in [LambdaMode::MlpSoftplus, LambdaMode::Linear] {
        let model = perturbed(tiny_lm(mode, num_levels(t)).init(3, &dev()), 9, 0.3);
        let tokens = random_tokens(b, t, 50, 4);
        let full = to_f64(&model.forward(tokens.clone(), Form::Parallel));
        let mut state = model.init_state(b, &dev());
        let mut stepped = Vec::new();
        for i in 0..t {
            let tok = tokens.clone().narrow(1, i, 1).squeeze_dim::<1>(1);
            stepped.push(model.step(tok, &mut state));
        }
        let stepped = Tensor::stack::<3>(stepped, 1);
        assert_close(
            &format!("{mode} step vs parallel"),
            &full,
            &to_f64(&stepped),
            1e-4,
        );

        // Prefill 45 tokens with the chunked form, then step the rest.
        let split = 45;
        let (prefix_logits, mut pre) = model.prefill(tokens.clone().narrow(1, 0, split), 16);
        assert_eq!(pre.position(), split);
        let mut rest = vec![prefix_logits];
        for i in split..t {
            let tok = tokens.clone().narrow(1, i, 1).squeeze_dim::<1>(1);
            rest.push(model.step(tok, &mut pre).unsqueeze_dim(1));
        }
        let resumed = Tensor::cat(rest, 1);
        assert_close(
            &format!("{mode} prefill+step vs parallel"),
            &full,
            &to_f64(&resumed),
            1e-4,
        );
        for (a, c) in state.layers.iter().zip(&pre.layers) {
            assert_close("conv window", &to_f64(&a.conv), &to_f64(&c.conv), 1e-5);
            assert_close(
                "fenwick levels",
                &to_f64(&a.fenwick.levels),
                &to_f64(&c.fenwick.levels),
                1e-4,
            );
        }
    }
}

#[test]
fn mlp_softplus_lambda_is_identity_at_init_and_survives_model_construction() {
    let t = 20;
    let model = tiny_lm(LambdaMode::MlpSoftplus, 8).init(5, &dev());
    for block in &model.blocks {
        let mlp = block.mixer.lambda.mlp.as_ref().unwrap();
        assert!(
            to_f64(&mlp.w2.val()).iter().all(|v| *v == 0.0),
            "W2 was re-initialised"
        );
        assert!(
            to_f64(&mlp.b2.val())
                .iter()
                .all(|v| (*v - 0.54).abs() < 1e-7),
            "b2 was re-initialised"
        );
        let bound = (6.0f64 / (8 + 16) as f64).sqrt();
        let w1 = to_f64(&mlp.w1.val());
        assert!(
            w1.iter().all(|v| v.abs() <= bound) && w1.iter().any(|v| v.abs() > bound / 2.0),
            "W1 not Xavier-uniform"
        );
    }
    let out = model.run(
        random_tokens(2, t, 50, 1),
        Form::Chunked { chunk: 8 },
        None,
        false,
        true,
    );
    assert_eq!(out.lambda.len(), 2);
    for lam in out.lambda {
        for v in to_f64(&lam) {
            assert!((v - 0.9991627363).abs() < 1e-6, "λ = {v} at init");
        }
    }
    let soft = tiny_lm(LambdaMode::MlpSoftmax, 8).init(5, &dev());
    let out = soft.run(
        random_tokens(1, t, 50, 1),
        Form::Chunked { chunk: 8 },
        None,
        false,
        true,
    );
    for v in to_f64(&out.lambda[0]) {
        assert!((v - 1.0 / 8.0).abs() < 1e-7, "softmax λ = {v} at init");
    }
}

/// Oracle O9 of the spec: the λ-MLP on given weights.
#[test]
fn oracle_o9_lambda_mlp() {
    fn p64<const D: usize>(v: Vec<f64>, shape: [usize; D]) -> burn::module::Param<Tensor<D>> {
        burn::module::Param::from_tensor(Tensor::from_data(
            TensorData::new(v, shape.to_vec()),
            (&dev(), DType::F64),
        ))
    }
    // The spec writes W1 as [hidden, L] and W2 as [L, hidden]; ours are transposed.
    let mlp = LambdaMlp {
        w1: p64(vec![0.1, -0.2, 0.2, 0.1, 0.3, 0.0], [3, 2]),
        b1: p64(vec![0.05, -0.05], [2]),
        w2: p64(vec![0.5, 1.0, 0.0, -0.5, 0.0, 2.0], [2, 3]),
        b2: p64(vec![0.54; 3], [3]),
    };
    let dl = Tensor::<4>::from_data(
        TensorData::new(vec![1.0f64, -1.0, 2.0], vec![1, 1, 1, 3]),
        (&dev(), DType::F64),
    );
    let logits = mlp.logits(dl);
    assert_close(
        "O9 logits",
        &[0.7984857222, 0.9298621723, 0.2857814558],
        &to_f64(&logits),
        1e-9,
    );
    let sp = burn::tensor::activation::softplus(logits.clone(), 1.0);
    assert_close(
        "O9 softplus",
        &[1.1700560982, 1.2624756123, 0.8462122361],
        &to_f64(&sp),
        1e-9,
    );
    let sm = burn::tensor::activation::softmax(logits, 3);
    assert_close(
        "O9 softmax",
        &[0.3650606477, 0.4163140685, 0.2186252838],
        &to_f64(&sm),
        1e-9,
    );
}

/// Spec §2.2 / §6.1 / O12: 30,962,352 and 71,550,816 parameters for the published fixed-λ LMs;
/// the λ-MLP adds 2·L·d_h + d_h + L = 1,999 per layer and (unlike the published code, which kept
/// an untrained copy) drops the per-head scale `L` (H·L = 60 or 120 per layer).
#[test]
fn parameter_counts_match_the_spec() {
    for (d, heads, expected) in [(256, 4, 30_962_352usize), (512, 8, 71_550_816)] {
        let mut cfg = LmConfig::new(50257, d, 6);
        cfg.mixer.expand = 1;
        assert_eq!(cfg.mixer.heads(), heads);
        assert_eq!(cfg.mlp_width(), if d == 256 { 768 } else { 1536 });
        let fixed = cfg.init(0, &dev()).num_params();
        assert_eq!(fixed, expected, "D = {d} linear λ");
        cfg.mixer.lambda.mode = LambdaMode::MlpSoftplus;
        let mlp = cfg.init(0, &dev()).num_params();
        assert_eq!(mlp, expected + 6 * 1_999 - 6 * heads * 15, "D = {d} MLP λ");
        cfg.mixer.lambda.mode = LambdaMode::Ones;
        let ones = cfg.init(0, &dev()).num_params();
        assert_eq!(ones, expected - 6 * heads * 15 * (d + 1), "D = {d} λ ≡ 1");
    }
}

#[test]
fn a_sequence_longer_than_the_levels_allow_names_the_need() {
    let model = tiny_lm(LambdaMode::Linear, 4).init(0, &dev());
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        model.forward(random_tokens(1, 9, 50, 0), Form::Chunked { chunk: 4 })
    }))
    .unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("need 5"), "{msg}");
}

/// Spec §7.2.2: 50,708 / 50,838 / 50,968 / 51,098 parameters (linear λ, T = 128…1024); the
/// λ-MLP adds 2·L·64 + 64 + L per layer and drops the per-head scale (L per layer).
#[test]
fn synthetic_model_parameter_counts_match_the_spec() {
    use loglinear::nn::SyntheticConfig;
    for (t, expected) in [
        (128, 50_708usize),
        (256, 50_838),
        (512, 50_968),
        (1024, 51_098),
    ] {
        let l = num_levels(t);
        let mut lambda = LambdaConfig {
            mode: LambdaMode::Linear,
            levels: l,
            mlp_hidden: 64,
        };
        let fixed = SyntheticConfig::new(128, lambda.clone())
            .init(0, &dev())
            .num_params();
        assert_eq!(fixed, expected, "T = {t}");
        lambda.mode = LambdaMode::MlpSoftplus;
        let mlp = SyntheticConfig::new(128, lambda)
            .init(0, &dev())
            .num_params();
        assert_eq!(
            mlp,
            expected + 2 * (2 * l * 64 + 64 + l) - 2 * l,
            "T = {t} MLP"
        );
    }
}

/// Mixed precision (bf16 activations, f32 master weights): the logits come back in f32 and track
/// the full-precision logits, and the parameter gradients are f32 and close to the full ones.
#[test]
fn bf16_mixed_precision_tracks_full_precision() {
    use loglinear::nn::{Precision, SyntheticConfig, TransformerConfig};
    let ad = dev().autodiff();
    let (b, t) = (2, 40);
    let tokens = random_tokens(b, t, 50, 6);
    let weights = Tensor::<3>::from_data(
        TensorData::new(uniform_values(b * t * 50, 7), vec![b, t, 50]),
        &ad,
    );
    // (logits, gradient of one projection) for a model built by `make`.
    let run = |precision: Precision, which: usize| -> (Vec<f64>, Vec<f64>, burn::tensor::DType) {
        let (logits, grad_of): (
            Tensor<3>,
            Box<dyn Fn(&burn::tensor::Gradients) -> Tensor<2>>,
        ) = match which {
            0 => {
                let mut cfg = tiny_lm(LambdaMode::MlpSoftplus, 8);
                cfg.precision = precision;
                let m = perturbed(cfg.init(3, &ad), 9, 0.3);
                let logits = m.forward(tokens.clone().to_device(&ad), Form::Chunked { chunk: 8 });
                let w = m.blocks[0].mixer.in_proj.weight.clone();
                (logits, Box::new(move |g| w.val().grad(g).unwrap()))
            }
            1 => {
                let mut cfg = SyntheticConfig::new(
                    50,
                    LambdaConfig {
                        mode: LambdaMode::MlpSoftplus,
                        levels: 8,
                        mlp_hidden: 16,
                    },
                );
                cfg.d_model = 32;
                cfg.d_state = 16;
                cfg.head_dim = 16;
                cfg.precision = precision;
                let m = perturbed(cfg.init(3, &ad), 9, 0.3);
                let logits = m
                    .run(
                        tokens.clone().to_device(&ad),
                        Form::Chunked { chunk: 8 },
                        false,
                    )
                    .0;
                let w = m.layers[0].wq.weight.clone();
                (logits, Box::new(move |g| w.val().grad(g).unwrap()))
            }
            _ => {
                let cfg = TransformerConfig {
                    precision,
                    max_seq_len: 64,
                    ..TransformerConfig::new(50, 32, 2, 2)
                };
                let m = perturbed(cfg.init(3, &ad), 9, 0.3);
                let logits = m.forward(tokens.clone().to_device(&ad));
                let w = m.blocks[0].attn.qkv.linear.weight.clone();
                (logits, Box::new(move |g| w.val().grad(g).unwrap()))
            }
        };
        let dtype = logits.dtype();
        let grads = (logits.clone() * weights.clone()).sum().backward();
        let grad = grad_of(&grads);
        assert_eq!(
            grad.dtype(),
            burn::tensor::DType::F32,
            "master-weight gradients are f32"
        );
        (to_f64(&logits), to_f64(&grad), dtype)
    };
    for (which, name) in ["log-linear Mamba-2", "paper_synthetic", "transformer"]
        .iter()
        .enumerate()
    {
        let (full, full_grad, _) = run(Precision::Full, which);
        let (half, half_grad, dtype) = run(Precision::Bf16, which);
        assert_eq!(
            dtype,
            burn::tensor::DType::F32,
            "{name}: logits for the loss are f32"
        );
        assert_ne!(
            full, half,
            "{name}: bf16 changed nothing, so it did not run in bf16"
        );
        assert_close(&format!("{name} bf16 logits"), &full, &half, 5e-2);
        assert_close(
            &format!("{name} bf16 gradient"),
            &full_grad,
            &half_grad,
            1e-1,
        );
    }
}
