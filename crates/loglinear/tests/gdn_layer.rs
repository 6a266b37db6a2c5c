//! The log-linear Gated DeltaNet mixer (spec §5.1) against a plain-loop float64 reference of the
//! whole layer, its op inputs, gradients to every parameter, decoding against the full forward,
//! λ ≡ 1 against the plain gated delta rule, and parameter counts.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use loglinear::fenwick::{level, num_levels};
use loglinear::host::to_f64;
use loglinear::nn::init::Init;
use loglinear::nn::{
    GdnConfig, LambdaConfig, LambdaMode, LmConfig, LogLinearGatedDeltaNet, MixerConfig,
    SyntheticConfig,
};
use loglinear::ops::Form;
use loglinear::testing::{assert_close, cast_params, perturbed, uniform_values};

fn dev() -> Device {
    Device::flex()
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}
fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn small_gdn(mode: LambdaMode, levels: usize) -> GdnConfig {
    GdnConfig {
        heads: 2,
        d_state: 4,
        head_dim: 3,
        lambda: LambdaConfig {
            mode,
            levels,
            mlp_hidden: 5,
            init: loglinear::nn::LambdaInit::Identity,
        },
        ..GdnConfig::new(6)
    }
}

/// A perturbed f64 mixer (so that zero/one-initialised parameters take part).
fn f64_mixer(cfg: &GdnConfig, seed: u64) -> LogLinearGatedDeltaNet {
    let mut init = Init::new(seed, &dev());
    cast_params(
        perturbed(cfg.init(&mut init, 0.4, 0.5), 100 + seed, 0.3),
        DType::F64,
    )
}

fn input(b: usize, t: usize, d: usize, seed: u64) -> (Vec<f64>, Tensor<3>) {
    let x = uniform_values(b * t * d, seed);
    let xt = Tensor::<3>::from_data(
        TensorData::new(x.clone(), vec![b, t, d]),
        (&dev(), DType::F64),
    );
    (x, xt)
}

/// `x [rows, d_in] · W [d_in, d_out]` on host vectors.
fn matmul(x: &[f64], w: &[f64], d_in: usize) -> Vec<f64> {
    let d_out = w.len() / d_in;
    x.chunks(d_in)
        .flat_map(|row| {
            (0..d_out).map(move |o| (0..d_in).map(|i| row[i] * w[i * d_out + o]).sum::<f64>())
        })
        .collect()
}

/// What the layer feeds the op, per (b, t, h), from plain loops: q̂, k̂, v, g, β, λ.
struct HostOpInput {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
    beta: Vec<f64>,
    lambda: Vec<f64>,
}

/// Spec §5.1 up to the core op, as plain loops over host copies of the parameters.
fn reference_op_input(m: &LogLinearGatedDeltaNet, x: &[f64], b: usize, t: usize) -> HostOpInput {
    let c = &m.config;
    let (d, h, n, p, kw, l) = (
        c.d_model,
        c.heads,
        c.d_state,
        c.head_dim,
        c.conv_kernel,
        c.lambda.levels,
    );
    let w = |dense: &loglinear::nn::init::Dense| to_f64(&dense.weight.val());
    let q_raw = matmul(x, &w(&m.q_proj), d);
    let k_raw = matmul(x, &w(&m.k_proj), d);
    let v_raw = matmul(x, &w(&m.v_proj), d);
    let a_raw = matmul(x, &w(&m.a_proj), d);
    let b_raw = matmul(x, &w(&m.b_proj), d);
    let conv_w = to_f64(&m.conv_weight.val()); // [conv_dim, K]
    let a_log = to_f64(&m.a_log.val());
    let dt_bias = to_f64(&m.dt_bias.val());
    // Causal depthwise conv (no bias) per channel, then SiLU; channels q | k | v.
    let conv = |raw: &[f64], width: usize, offset: usize| -> Vec<f64> {
        let mut out = vec![0.0; b * t * width];
        for bi in 0..b {
            for ti in 0..t {
                for ch in 0..width {
                    let mut acc = 0.0;
                    for j in 0..kw {
                        // tap j reads time ti − (K−1) + j
                        let src = ti as isize - (kw as isize - 1) + j as isize;
                        if src >= 0 {
                            acc += conv_w[(offset + ch) * kw + j]
                                * raw[(bi * t + src as usize) * width + ch];
                        }
                    }
                    out[(bi * t + ti) * width + ch] = silu(acc);
                }
            }
        }
        out
    };
    let unit = |mut x: Vec<f64>| {
        for row in x.chunks_mut(n) {
            let norm = (row.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
            row.iter_mut().for_each(|v| *v /= norm);
        }
        x
    };
    let q = unit(conv(&q_raw, h * n, 0));
    let k = unit(conv(&k_raw, h * n, h * n));
    let v = conv(&v_raw, h * p, 2 * h * n);
    let beta: Vec<f64> = b_raw.iter().map(|&z| sigmoid(z)).collect();
    let g: Vec<f64> = a_raw
        .iter()
        .enumerate()
        .map(|(i, &z)| -a_log[i % h].exp() * softplus(z + dt_bias[i % h]))
        .collect();
    let lambda = match c.lambda.mode {
        LambdaMode::Ones => vec![1.0; b * t * h * l],
        mode => {
            let dl = matmul(x, &w(m.dl_proj.as_ref().unwrap()), d); // [B·T, H·L], head-major
            match mode {
                LambdaMode::Linear => {
                    let scale = to_f64(&m.lambda.scale.as_ref().unwrap().val());
                    dl.iter()
                        .enumerate()
                        .map(|(i, &z)| softplus(scale[i % (h * l)] * z))
                        .collect()
                }
                _ => {
                    let mlp = m.lambda.mlp.as_ref().unwrap();
                    let hid = c.lambda.mlp_hidden;
                    let (w1, b1) = (to_f64(&mlp.w1.val()), to_f64(&mlp.b1.val()));
                    let (w2, b2) = (to_f64(&mlp.w2.val()), to_f64(&mlp.b2.val()));
                    let mut out = Vec::new();
                    for row in dl.chunks(l) {
                        let hidden: Vec<f64> = (0..hid)
                            .map(|j| {
                                gelu(b1[j] + (0..l).map(|i| row[i] * w1[i * hid + j]).sum::<f64>())
                            })
                            .collect();
                        let logits: Vec<f64> = (0..l)
                            .map(|o| {
                                b2[o] + (0..hid).map(|j| hidden[j] * w2[j * l + o]).sum::<f64>()
                            })
                            .collect();
                        if mode == LambdaMode::MlpSoftplus {
                            out.extend(logits.iter().map(|&z| softplus(z)));
                        } else {
                            let mx = logits.iter().cloned().fold(f64::MIN, f64::max);
                            let e: Vec<f64> = logits.iter().map(|z| (z - mx).exp()).collect();
                            let s: f64 = e.iter().sum();
                            out.extend(e.iter().map(|z| z / s));
                        }
                    }
                    out
                }
            }
        }
    };
    HostOpInput {
        q,
        k,
        v,
        g,
        beta,
        lambda,
    }
}

/// The quadratic form of spec §5.2 as plain loops: for each query the vector
/// `w = (𝒜_t ⋯ 𝒜_{s+1})ᵀ q̂_t` is carried back one key at a time.
fn reference_core(
    x: &HostOpInput,
    b: usize,
    t: usize,
    h: usize,
    n: usize,
    p: usize,
    l: usize,
) -> Vec<f64> {
    let mut o = vec![0.0; b * t * h * p];
    for bi in 0..b {
        for hi in 0..h {
            let at = |ti: usize| (bi * t + ti) * h + hi;
            for ti in 0..t {
                let mut w: Vec<f64> = x.q[at(ti) * n..at(ti) * n + n].to_vec();
                for s in (0..=ti).rev() {
                    let ks = &x.k[at(s) * n..at(s) * n + n];
                    let wk: f64 = w.iter().zip(ks).map(|(a, c)| a * c).sum();
                    let lam = x.lambda[at(ti) * l + level(ti, s)];
                    for j in 0..p {
                        o[at(ti) * p + j] += lam * x.beta[at(s)] * wk * x.v[at(s) * p + j];
                    }
                    // w ← 𝒜_sᵀ w = a_s (w − β_s k_s (k_s·w))
                    let a = x.g[at(s)].exp();
                    for (wi, ki) in w.iter_mut().zip(ks) {
                        *wi = a * (*wi - x.beta[at(s)] * ki * wk);
                    }
                }
            }
        }
    }
    o
}

/// The plain gated delta rule `S_t = a_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`,
/// `o_t = S_tᵀ q_t` (standard Gated DeltaNet, no levels).
fn plain_gated_delta_rule(
    x: &HostOpInput,
    b: usize,
    t: usize,
    h: usize,
    n: usize,
    p: usize,
) -> Vec<f64> {
    let mut o = vec![0.0; b * t * h * p];
    for bi in 0..b {
        for hi in 0..h {
            let mut s = vec![0.0; n * p];
            for ti in 0..t {
                let i = (bi * t + ti) * h + hi;
                let (k, q, v) = (
                    &x.k[i * n..i * n + n],
                    &x.q[i * n..i * n + n],
                    &x.v[i * p..i * p + p],
                );
                let (a, beta) = (x.g[i].exp(), x.beta[i]);
                let kts: Vec<f64> = (0..p)
                    .map(|j| (0..n).map(|r| k[r] * s[r * p + j]).sum())
                    .collect();
                for r in 0..n {
                    for j in 0..p {
                        s[r * p + j] =
                            a * (s[r * p + j] - beta * k[r] * kts[j]) + beta * k[r] * v[j];
                    }
                }
                for j in 0..p {
                    o[i * p + j] = (0..n).map(|r| q[r] * s[r * p + j]).sum();
                }
            }
        }
    }
    o
}

/// Per-head RMSNorm, the SiLU gate and o_proj on the core's output.
fn reference_output(
    m: &LogLinearGatedDeltaNet,
    x: &[f64],
    core: &[f64],
    b: usize,
    t: usize,
) -> Vec<f64> {
    let c = &m.config;
    let (d, h, p) = (c.d_model, c.heads, c.head_dim);
    let gate = matmul(x, &to_f64(&m.g_proj.weight.val()), d);
    let w = to_f64(&m.norm_weight.val());
    let mut gated = vec![0.0; b * t * h * p];
    for (i, row) in core.chunks(p).enumerate() {
        let rms = (row.iter().map(|v| v * v).sum::<f64>() / p as f64 + c.norm_eps).sqrt();
        for j in 0..p {
            gated[i * p + j] = row[j] / rms * w[j] * silu(gate[i * p + j]);
        }
    }
    matmul(&gated, &to_f64(&m.o_proj.weight.val()), h * p)
}

fn reference_layer(m: &LogLinearGatedDeltaNet, x: &[f64], b: usize, t: usize) -> Vec<f64> {
    let c = &m.config;
    let inp = reference_op_input(m, x, b, t);
    let core = reference_core(&inp, b, t, c.heads, c.d_state, c.head_dim, c.lambda.levels);
    reference_output(m, x, &core, b, t)
}

/// The whole layer in f64 equals the plain-loop reference, for every λ mode, every form and
/// awkward lengths (T = 1, 7, 63, 70: partial last chunks).
#[test]
fn gdn_mixer_matches_plain_loop_reference_for_every_mode_and_form() {
    for (i, mode) in LambdaMode::ALL.into_iter().enumerate() {
        for t in [1, 7, 63, 70] {
            let b = 2;
            let cfg = small_gdn(mode, num_levels(t));
            let m = f64_mixer(&cfg, i as u64 + t as u64);
            let (x, xt) = input(b, t, cfg.d_model, 7 + i as u64);
            let expected = reference_layer(&m, &x, b, t);
            for form in [
                Form::Parallel,
                Form::Chunked { chunk: 16 },
                Form::Recurrent,
                Form::Auto { chunk: 8 },
                Form::Fused,
            ] {
                let y = m.forward(xt.clone(), form, None, false).y;
                assert_close(
                    &format!("gdn mixer {mode} T={t} {form}"),
                    &expected,
                    &to_f64(&y),
                    1e-9,
                );
            }
        }
    }
}

/// What the layer hands the op: q̂ and k̂ of unit norm per head (up to the 1e-6 of the norm),
/// β in (0, 1), g ≤ 0, and the values of the plain-loop reference.
#[test]
fn gdn_op_inputs_are_normalised_keys_gates_and_decays() {
    let (b, t) = (2, 63);
    let cfg = small_gdn(LambdaMode::Linear, num_levels(t));
    let m = f64_mixer(&cfg, 5);
    let (x, xt) = input(b, t, cfg.d_model, 3);
    let (got, _) = m.op_input(xt, None);
    let expected = reference_op_input(&m, &x, b, t);
    let n = cfg.d_state;
    for (name, tensor) in [("q", &got.q), ("k", &got.k)] {
        for row in to_f64(tensor).chunks(n) {
            let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
            // ‖q̂‖² = ‖q‖²/(‖q‖² + 1e-6): at most 1, and within 1 % of it at these scales.
            assert!(norm <= 1.0 + 1e-12 && norm > 0.99, "{name}: norm {norm}");
        }
    }
    assert!(to_f64(&got.beta).iter().all(|&v| v > 0.0 && v < 1.0));
    assert!(to_f64(&got.g).iter().all(|&v| v <= 0.0));
    assert_close("q", &expected.q, &to_f64(&got.q), 1e-12);
    assert_close("k", &expected.k, &to_f64(&got.k), 1e-12);
    assert_close("v", &expected.v, &to_f64(&got.v), 1e-12);
    assert_close("g", &expected.g, &to_f64(&got.g), 1e-12);
    assert_close("beta", &expected.beta, &to_f64(&got.beta), 1e-12);
    assert_close("lambda", &expected.lambda, &to_f64(&got.lambda), 1e-12);
}

/// λ ≡ 1 (the `ones` mode) is plain Gated DeltaNet: the layer equals the plain gated delta rule
/// (one state, no levels) followed by the norm, gate and o_proj; and it has no λ parameters.
#[test]
fn lambda_ones_is_plain_gated_deltanet() {
    let b = 2;
    for t in [1, 7, 70, 200] {
        let cfg = small_gdn(LambdaMode::Ones, num_levels(t));
        let m = f64_mixer(&cfg, 11);
        assert!(m.dl_proj.is_none() && m.lambda.scale.is_none() && m.lambda.mlp.is_none());
        let (x, xt) = input(b, t, cfg.d_model, 13);
        let inp = reference_op_input(&m, &x, b, t);
        let core = plain_gated_delta_rule(&inp, b, t, cfg.heads, cfg.d_state, cfg.head_dim);
        let expected = reference_output(&m, &x, &core, b, t);
        for form in [Form::Chunked { chunk: 64 }, Form::Recurrent] {
            let y = m.forward(xt.clone(), form, None, false).y;
            assert_close(
                &format!("λ ≡ 1, T={t} {form}"),
                &expected,
                &to_f64(&y),
                1e-9,
            );
        }
    }
}

/// Decoding one token at a time from the conv window and the Fenwick state equals the full
/// forward, for the mixer (T = 1, 7, 63, 200) and after a chunked prefill of part of the sequence;
/// the states that stepping builds equal the prefill's.
#[test]
fn gdn_mixer_decoding_equals_full_forward() {
    let b = 2;
    for (i, t) in [1usize, 7, 63, 200].into_iter().enumerate() {
        let mode = LambdaMode::ALL[i % 4];
        let cfg = small_gdn(mode, num_levels(t));
        let m = f64_mixer(&cfg, 21 + i as u64);
        let (_, xt) = input(b, t, cfg.d_model, 17 + i as u64);
        let full = m.forward(xt.clone(), Form::Chunked { chunk: 16 }, None, true);
        let mut state = m.init_state(b, &dev());
        state.conv = state.conv.cast(DType::F64);
        state.fenwick.levels = state.fenwick.levels.cast(DType::F64);
        let mut ys = Vec::new();
        for s in 0..t {
            let tok = xt.clone().narrow(1, s, 1).squeeze_dim::<2>(1);
            ys.push(m.step(tok, &mut state));
        }
        let stepped = Tensor::stack::<3>(ys, 1);
        assert_close(
            &format!("{mode} T={t} step vs chunked"),
            &to_f64(&full.y),
            &to_f64(&stepped),
            1e-9,
        );
        let fs = full.state.unwrap();
        assert_close(
            "conv window",
            &to_f64(&fs.conv),
            &to_f64(&state.conv),
            1e-12,
        );
        assert_close(
            "fenwick levels",
            &to_f64(&fs.fenwick.levels),
            &to_f64(&state.fenwick.levels),
            1e-9,
        );
        assert_eq!(state.fenwick.position, t);

        // Prefill a prefix with the chunked form, then continue with the parallel form.
        if t > 5 {
            let split = t / 2 + 1;
            let pre = m.forward(
                xt.clone().narrow(1, 0, split),
                Form::Chunked { chunk: 8 },
                None,
                true,
            );
            let rest = m.forward(
                xt.clone().narrow(1, split, t - split),
                Form::Parallel,
                pre.state.as_ref(),
                false,
            );
            let joined = Tensor::cat(vec![pre.y, rest.y], 1);
            assert_close(
                &format!("{mode} T={t} prefill + continue"),
                &to_f64(&full.y),
                &to_f64(&joined),
                1e-9,
            );
        }
    }
}

fn tiny_gdn_lm(mode: LambdaMode, levels: usize) -> LmConfig {
    LmConfig {
        gdn: Some(GdnConfig {
            heads: 2,
            d_state: 8,
            head_dim: 8,
            lambda: LambdaConfig {
                mode,
                levels,
                mlp_hidden: 16,
                init: loglinear::nn::LambdaInit::Identity,
            },
            ..GdnConfig::new(32)
        }),
        initializer_range: 0.2,
        ..LmConfig::new(50, 2, MixerConfig::new(32))
    }
}

/// The LM with Gated DeltaNet mixers: token-by-token decoding reproduces the parallel forward's
/// logits, and prefill (chunked) + steps does too.
#[test]
fn gdn_lm_decoding_equals_parallel_forward() {
    let (b, t) = (2, 70);
    for mode in [LambdaMode::MlpSoftplus, LambdaMode::Ones] {
        let model = perturbed(tiny_gdn_lm(mode, num_levels(t)).init(3, &dev()), 9, 0.3);
        assert!(
            model
                .blocks
                .iter()
                .all(|blk| blk.mixer.is_none() && blk.gdn.is_some())
        );
        let tokens = loglinear::testing::random_tokens(b, t, 50, 4, &dev());
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
        let split = 45;
        let (prefix, mut pre) = model.prefill(tokens.clone().narrow(1, 0, split), 16);
        let mut rest = vec![prefix];
        for i in split..t {
            let tok = tokens.clone().narrow(1, i, 1).squeeze_dim::<1>(1);
            rest.push(model.step(tok, &mut pre).unsqueeze_dim(1));
        }
        assert_close(
            &format!("{mode} prefill+step vs parallel"),
            &full,
            &to_f64(&Tensor::cat(rest, 1)),
            1e-4,
        );
    }
}

/// Every float parameter's gradient, named by its path.
fn param_grads<M: Module>(module: &M, grads: &burn::tensor::Gradients) -> Vec<(String, Vec<f64>)> {
    struct Collect<'a> {
        grads: &'a burn::tensor::Gradients,
        path: Vec<String>,
        out: Vec<(String, Vec<f64>)>,
    }
    impl ModuleVisitor for Collect<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let g = param
                .val()
                .grad(self.grads)
                .map(|g| to_f64(&g))
                .unwrap_or_default();
            self.out.push((self.path.join("."), g));
        }
    }
    let mut c = Collect {
        grads,
        path: Vec::new(),
        out: Vec::new(),
    };
    module.visit(&mut c);
    c.out
}

/// Gradients reach every parameter of the mixer (non-zero, finite) in every λ mode, through the
/// chunked form; and those of an LM with Gated DeltaNet mixers and of the synthetic-task model
/// with the gated_deltanet mixer too.
#[test]
fn gradients_reach_every_parameter() {
    let ad = dev().autodiff();
    let check = |what: &str, grads: Vec<(String, Vec<f64>)>, expect: usize| {
        assert_eq!(
            grads.len(),
            expect,
            "{what}: parameters {:?}",
            grads.iter().map(|g| &g.0).collect::<Vec<_>>()
        );
        for (name, g) in grads {
            assert!(!g.is_empty(), "{what}: {name} has no gradient");
            assert!(g.iter().all(|v| v.is_finite()), "{what}: {name} not finite");
            assert!(g.iter().any(|&v| v != 0.0), "{what}: {name} is all zero");
        }
    };
    let (b, t) = (2, 20);
    for mode in LambdaMode::ALL {
        let cfg = small_gdn(mode, num_levels(t));
        let mut init = Init::new(1, &ad);
        let m = perturbed(cfg.init(&mut init, 0.4, 0.5), 2, 0.3);
        let x = Tensor::<3>::from_data(
            TensorData::new(
                uniform_values(b * t * cfg.d_model, 3),
                vec![b, t, cfg.d_model],
            ),
            &ad,
        );
        let w = Tensor::<3>::from_data(
            TensorData::new(
                uniform_values(b * t * cfg.d_model, 4),
                vec![b, t, cfg.d_model],
            ),
            &ad,
        );
        let y = m.forward(x, Form::Chunked { chunk: 8 }, None, false).y;
        let grads = (y * w).sum().backward();
        // 11 tensors (q, k, v, a, b, g, o projections; conv; A_log; dt_bias; norm) + λ's.
        let lambda = match mode {
            LambdaMode::Linear => 2,
            LambdaMode::MlpSoftplus | LambdaMode::MlpSoftmax => 5,
            LambdaMode::Ones => 0,
        };
        check(
            &format!("mixer {mode}"),
            param_grads(&m, &grads),
            11 + lambda,
        );
    }
    let lm = perturbed(
        tiny_gdn_lm(LambdaMode::Linear, num_levels(t)).init(0, &ad),
        5,
        0.3,
    );
    let tokens = loglinear::testing::random_tokens(b, t, 50, 1, &ad);
    let grads = lm
        .forward(tokens.clone(), Form::Chunked { chunk: 8 })
        .sin()
        .sum()
        .backward();
    // embedding, head, final norm; per block two norms, 3 MLP matrices, 13 mixer tensors.
    check("LM", param_grads(&lm, &grads), 3 + 2 * (2 + 3 + 13));

    let mut cfg = SyntheticConfig::new(
        50,
        LambdaConfig {
            levels: num_levels(t),
            ..LambdaConfig::new()
        },
    );
    cfg.mixer = loglinear::nn::MixerKind::GatedDeltaNet;
    cfg.d_model = 16;
    cfg.d_state = 8;
    cfg.head_dim = 8;
    cfg.heads = 2;
    let syn = perturbed(cfg.init(0, &ad), 6, 0.3);
    let (logits, _) = syn.run(tokens, Form::Chunked { chunk: 8 }, false);
    let grads = logits.sin().sum().backward();
    // embedding, head, final LayerNorm (2); per layer wq wk wv wdl wdt wb dt_bias a_log, λ scale,
    // wo, LayerNorm (2).
    check("synthetic", param_grads(&syn, &grads), 1 + 1 + 2 + 2 * 12);
}

/// The synthetic-task model with the gated_deltanet mixer: q and k are L2-normalised and β =
/// σ(W_b x) (checked through a model whose layers' outputs are compared against the Mamba-2
/// version's: the same parameters with W_b absent give another result), and λ ≡ 1 equals the
/// plain gated delta rule through the model's first layer.
#[test]
fn synthetic_model_with_gated_deltanet_runs_the_delta_rule() {
    let t = 33;
    let mut cfg = SyntheticConfig::new(
        40,
        LambdaConfig {
            levels: num_levels(t),
            mode: LambdaMode::Ones,
            ..LambdaConfig::new()
        },
    );
    cfg.mixer = loglinear::nn::MixerKind::GatedDeltaNet;
    cfg.d_model = 8;
    cfg.d_state = 4;
    cfg.head_dim = 4;
    cfg.heads = 2;
    cfg.n_layers = 1;
    cfg.initializer_range = 0.5;
    let model = cast_params(cfg.init(4, &dev()), DType::F64);
    let tokens = loglinear::testing::random_tokens(1, t, 40, 2, &dev());
    let (logits, _) = model.run(tokens.clone(), Form::Chunked { chunk: 8 }, false);

    // The same model by hand: embed, project, normalise, delta rule, Wo, LayerNorms, head.
    let (d, h, n, p) = (8, 2, 4, 4);
    let table = to_f64(&model.embedding.val());
    let ids: Vec<usize> = to_f64(&tokens.float())
        .iter()
        .map(|&v| v as usize)
        .collect();
    let x: Vec<f64> = ids
        .iter()
        .flat_map(|&i| table[i * d..(i + 1) * d].to_vec())
        .collect();
    let layer = &model.layers[0];
    let w = |dense: &loglinear::nn::init::Dense| to_f64(&dense.weight.val());
    let unit = |mut v: Vec<f64>| {
        for row in v.chunks_mut(n) {
            let norm = (row.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
            row.iter_mut().for_each(|a| *a /= norm);
        }
        v
    };
    let a_log = to_f64(&layer.a_log.val());
    let dt_bias = to_f64(&layer.dt_bias.val());
    let inp = HostOpInput {
        q: unit(matmul(&x, &w(&layer.wq), d)),
        k: unit(matmul(&x, &w(&layer.wk), d)),
        v: matmul(&x, &w(&layer.wv), d),
        g: matmul(&x, &w(&layer.wdt), d)
            .iter()
            .enumerate()
            .map(|(i, &z)| -a_log[i % h].exp() * softplus(z + dt_bias[i % h]))
            .collect(),
        beta: matmul(&x, &w(layer.wb.as_ref().unwrap()), d)
            .iter()
            .map(|&z| sigmoid(z))
            .collect(),
        lambda: vec![],
    };
    let y = plain_gated_delta_rule(&inp, 1, t, h, n, p);
    let r: Vec<f64> = matmul(&y, &w(&layer.wo), h * p)
        .iter()
        .zip(&x)
        .map(|(a, c)| a + c)
        .collect();
    let layer_norm = |v: &[f64], norm: &loglinear::nn::init::LayerNorm| -> Vec<f64> {
        let (wt, bs) = (to_f64(&norm.weight.val()), to_f64(&norm.bias.val()));
        v.chunks(d)
            .flat_map(|row| {
                let mean = row.iter().sum::<f64>() / d as f64;
                let var = row.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / d as f64;
                (0..d)
                    .map(move |j| 0.0 + (row[j] - mean) / (var + 1e-5).sqrt())
                    .collect::<Vec<_>>()
            })
            .enumerate()
            .map(|(i, z)| z * wt[i % d] + bs[i % d])
            .collect()
    };
    let x1 = layer_norm(&r, &layer.norm);
    let xf = layer_norm(&x1, &model.norm);
    let expected = matmul(&xf, &w(&model.head), d);
    assert_close("synthetic gdn logits", &expected, &to_f64(&logits), 1e-9);
}

/// Parameter counts without allocating equal those of the built modules (every λ mode, both
/// mixers); the Mamba-2 count reproduces the spec's 825,465,312 for the mid log-linear Mamba-2
/// (§2.2) without building it; and the published `h_gated_deltanet_mid` (spec §5.1) counts
/// 795,690,462 (linear λ) and 792,785,532 (λ ≡ 1, plain Gated DeltaNet), by hand:
/// per mixer 4·1536·1152 (q, k) … see README.
#[test]
fn parameter_counts_without_allocating() {
    for mode in LambdaMode::ALL {
        let cfg = small_gdn(mode, 6);
        let mut init = Init::new(0, &dev());
        assert_eq!(
            cfg.num_params(),
            cfg.init(&mut init, 0.1, 1.0).num_params(),
            "gdn {mode}"
        );
        let lm = tiny_gdn_lm(mode, 6);
        assert_eq!(
            lm.num_params(),
            lm.init(0, &dev()).num_params(),
            "gdn LM {mode}"
        );
        let mut m2 = LmConfig::new(50, 2, MixerConfig::new(32));
        m2.mixer.head_dim = 16;
        m2.mixer.n_groups = 2;
        m2.mixer.lambda.mode = mode;
        m2.tie_embeddings = true;
        assert_eq!(
            m2.num_params(),
            m2.init(0, &dev()).num_params(),
            "mamba2 LM {mode}"
        );
    }
    // Spec §2.2: the mid log-linear Mamba-2 (D = 1536, 21 layers, 48 heads, vocab 32000).
    let mid = LmConfig::new(32000, 21, MixerConfig::new(1536));
    assert_eq!(mid.num_params(), 825_465_312);
    // Spec §5.1: h_gated_deltanet_mid. Per mixer: q, k, v, g, o projections 5·1536·1152…: see
    // the README's table; the sum by hand is 14,331,366 per mixer (linear λ).
    let gdn = GdnConfig::new(1536);
    assert_eq!(gdn.num_params(), 14_331_366);
    let h_gdn = LmConfig {
        gdn: Some(gdn.clone()),
        ..LmConfig::new(32000, 21, MixerConfig::new(1536))
    };
    assert_eq!(h_gdn.mlp_width(), 4096);
    assert_eq!(h_gdn.num_params(), 795_690_462);
    let plain = LmConfig {
        gdn: Some(GdnConfig {
            lambda: LambdaConfig {
                mode: LambdaMode::Ones,
                ..LambdaConfig::new()
            },
            ..gdn
        }),
        ..h_gdn
    };
    assert_eq!(plain.num_params(), 792_785_532);
}

/// Config errors name the field.
#[test]
fn gdn_config_validation_names_the_field() {
    let mut c = GdnConfig::new(8);
    c.d_state = 1;
    assert_eq!(c.validate().unwrap_err().field, "d_state");
    let mut c = GdnConfig::new(8);
    c.heads = 0;
    assert_eq!(c.validate().unwrap_err().field, "heads");
    let mut lm = LmConfig::new(10, 1, MixerConfig::new(8));
    lm.gdn = Some(GdnConfig::new(16));
    assert_eq!(lm.validate().unwrap_err().field, "gdn.d_model");
    lm.gdn = Some(GdnConfig {
        lambda: LambdaConfig {
            levels: 0,
            ..LambdaConfig::new()
        },
        ..GdnConfig::new(8)
    });
    assert_eq!(lm.validate().unwrap_err().field, "gdn.lambda.levels");
    // A Mamba-2 field the GDN LM does not read is not checked.
    lm.gdn = Some(GdnConfig::new(8));
    lm.mixer.head_dim = 3;
    assert!(lm.validate().is_ok());
}
