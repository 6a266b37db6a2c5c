//! The Gated DeltaNet op (spec §5): every form against the definition on outputs, all six
//! gradients and the final state, on awkward shapes and fresh random inputs; the definition
//! against plain f64 loops written here (the log-linear recurrence with the spec's
//! binary-counter cascade, and the plain gated delta rule for λ ≡ 1) and against central finite
//! differences; continuation from a state, gradients through an initial state.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use loglinear::fenwick::num_levels;
use loglinear::host::{closeness, to_f64};
use loglinear::ops::gdn::{GdnInput, gdn_attn};
use loglinear::ops::{Dims, FenwickState, Form, LogLinearInput, log_linear_attn};
use loglinear::testing::{FormResult, assert_close, run_gdn_with_grads, test_seed};

fn dev() -> Device {
    Device::flex().autodiff()
}

fn dims(b: usize, t: usize, h: usize, n: usize, p: usize) -> Dims {
    Dims {
        b,
        t,
        h,
        n,
        p,
        l: num_levels(t),
    }
}

const GRAD_NAMES: [&str; 6] = ["dq", "dk", "dv", "dg", "dbeta", "dlambda"];

/// Host copy of a [`GdnInput`] in `[B, T, H, ·]` row-major order.
#[derive(Clone, Debug)]
struct Host {
    d: Dims,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
    beta: Vec<f64>,
    lambda: Vec<f64>,
}

impl Host {
    fn of(x: &GdnInput) -> Self {
        Self {
            d: x.dims(),
            q: to_f64(&x.q),
            k: to_f64(&x.k),
            v: to_f64(&x.v),
            g: to_f64(&x.g),
            beta: to_f64(&x.beta),
            lambda: to_f64(&x.lambda),
        }
    }

    fn input(&self, dtype: DType, device: &Device) -> GdnInput {
        let Dims { b, t, h, n, p, l } = self.d;
        fn up<const D: usize>(v: &[f64], s: [usize; D], dtype: DType, dev: &Device) -> Tensor<D> {
            Tensor::from_data(TensorData::new(v.to_vec(), s.to_vec()), (dev, dtype))
        }
        GdnInput {
            q: up(&self.q, [b, t, h, n], dtype, device),
            k: up(&self.k, [b, t, h, n], dtype, device),
            v: up(&self.v, [b, t, h, p], dtype, device),
            g: up(&self.g, [b, t, h], dtype, device),
            beta: up(&self.beta, [b, t, h], dtype, device),
            lambda: up(&self.lambda, [b, t, h, l], dtype, device),
        }
    }

    /// The input field whose gradient is `name`.
    fn field(&mut self, name: &str) -> &mut Vec<f64> {
        match name {
            "dq" => &mut self.q,
            "dk" => &mut self.k,
            "dv" => &mut self.v,
            "dg" => &mut self.g,
            "dbeta" => &mut self.beta,
            "dlambda" => &mut self.lambda,
            other => panic!("no input for {other}"),
        }
    }

    /// The log-linear recurrence as plain f64 loops (spec §3.2 with the transition of §5.2):
    /// per token, the binary-counter cascade with explicit counts, `S ← a (I − β k kᵀ) S` on
    /// every level, `S⁽⁰⁾ = β k vᵀ`, `o = Σ_ℓ λ_ℓ qᵀ S⁽ℓ⁾`. Returns `o: [B, T, H, P]` and the
    /// final levels `[B, H, L, N, P]`.
    fn recurrence(&self) -> (Vec<f64>, Vec<f64>) {
        let Dims { b, t, h, n, p, l } = self.d;
        let mut o = vec![0.0; b * t * h * p];
        let mut last = vec![0.0; b * h * l * n * p];
        for bi in 0..b {
            for hi in 0..h {
                let mut s = vec![vec![0.0; n * p]; l];
                let mut count = vec![0usize; l];
                for ti in 0..t {
                    let at = (bi * t + ti) * h + hi;
                    let mut lv = 0;
                    while count[lv] == 1 << lv {
                        assert!(lv + 1 < l, "recurrence: {l} levels are too few");
                        let full = std::mem::replace(&mut s[lv], vec![0.0; n * p]);
                        for (into, from) in s[lv + 1].iter_mut().zip(full) {
                            *into += from;
                        }
                        count[lv + 1] += count[lv];
                        count[lv] = 0;
                        lv += 1;
                    }
                    let (a, beta) = (self.g[at].exp(), self.beta[at]);
                    let k = &self.k[at * n..(at + 1) * n];
                    for level in s.iter_mut() {
                        for j in 0..p {
                            let dot: f64 = (0..n).map(|i| k[i] * level[i * p + j]).sum();
                            for i in 0..n {
                                level[i * p + j] = a * (level[i * p + j] - beta * k[i] * dot);
                            }
                        }
                    }
                    for i in 0..n {
                        for j in 0..p {
                            s[0][i * p + j] = beta * k[i] * self.v[at * p + j];
                        }
                    }
                    count[0] += 1;
                    for j in 0..p {
                        o[at * p + j] = (0..l)
                            .map(|lv| {
                                let read: f64 =
                                    (0..n).map(|i| self.q[at * n + i] * s[lv][i * p + j]).sum();
                                self.lambda[at * l + lv] * read
                            })
                            .sum();
                    }
                }
                for (lv, level) in s.iter().enumerate() {
                    let at = ((bi * h + hi) * l + lv) * n * p;
                    last[at..at + n * p].copy_from_slice(level);
                }
            }
        }
        (o, last)
    }

    /// The plain gated delta rule (no levels, λ ignored): `S_t = a_t (I − β_t k_t k_tᵀ) S_{t−1}
    /// + β_t k_t v_tᵀ`, `o_t = S_tᵀ q_t`.
    fn gated_delta_rule(&self) -> Vec<f64> {
        let Dims { b, t, h, n, p, .. } = self.d;
        let mut o = vec![0.0; b * t * h * p];
        for bi in 0..b {
            for hi in 0..h {
                let mut s = vec![0.0; n * p];
                for ti in 0..t {
                    let at = (bi * t + ti) * h + hi;
                    let (a, beta) = (self.g[at].exp(), self.beta[at]);
                    let k = &self.k[at * n..(at + 1) * n];
                    for j in 0..p {
                        let dot: f64 = (0..n).map(|i| k[i] * s[i * p + j]).sum();
                        for i in 0..n {
                            s[i * p + j] = a * (s[i * p + j] - beta * k[i] * dot)
                                + beta * k[i] * self.v[at * p + j];
                        }
                        o[at * p + j] = (0..n).map(|i| self.q[at * n + i] * s[i * p + j]).sum();
                    }
                }
            }
        }
        o
    }
}

fn random_cotangent(x: &GdnInput, seed: u64) -> Tensor<4> {
    let d = x.dims();
    GdnInput::random(Dims { n: d.p, ..d }, seed, x.dtype(), &x.device())
        .v
        .detach()
}

/// Checks `got` against `reference`: output, every gradient (a gradient that is exactly zero in
/// the reference must be tiny in `got`: only dg at T = 1 is, since the first token's decay
/// never matters) and, when both have one, the final state.
fn compare(ctx: &str, reference: &FormResult, got: &FormResult, tol_o: f64, tol_grad: f64) {
    assert_close(&format!("{ctx} o"), &reference.o, &got.o, tol_o);
    for ((name, r), (gname, g)) in reference.grads.iter().zip(&got.grads) {
        assert_eq!(name, gname);
        if r.iter().all(|v| *v == 0.0) {
            assert!(*name == "dg", "{ctx} {name}: zero reference");
            assert!(
                g.iter().all(|v| v.abs() < tol_grad),
                "{ctx} {name}: {g:?} ≠ 0"
            );
            continue;
        }
        assert_close(&format!("{ctx} {name}"), r, g, tol_grad);
    }
    if let (Some(r), Some(g)) = (&reference.state, &got.state) {
        assert_close(&format!("{ctx} final state"), r, g, tol_o);
    }
}

/// Every form in `forms` against the parallel form on `x`, in f64.
fn check_forms(x: &GdnInput, forms: &[Form], seed: u64) {
    let d_o = random_cotangent(x, seed ^ 1);
    let reference = run_gdn_with_grads(x, &d_o, Form::Parallel, None);
    for &form in forms {
        let got = run_gdn_with_grads(x, &d_o, form, None);
        let ctx = format!("{form} {:?}", x.dims());
        compare(&ctx, &reference, &got, 1e-12, 1e-11);
    }
}

#[test]
fn parallel_matches_the_plain_f64_recurrence() {
    for (i, (b, t, h, n, p, extra)) in [
        (1, 1, 1, 3, 2, 0),
        (2, 7, 3, 4, 5, 1),
        (1, 70, 2, 8, 3, 0),
        (2, 33, 1, 2, 2, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let d = Dims {
            l: num_levels(t) + extra,
            ..dims(b, t, h, n, p)
        };
        let x = GdnInput::random(d, test_seed(i as u64), DType::F64, &dev());
        let (o_loop, state_loop) = Host::of(&x).recurrence();
        let out = gdn_attn(&x, Form::Parallel, None, true);
        let ctx = format!("parallel vs loop {d:?}");
        assert_close(&format!("{ctx} o"), &o_loop, &to_f64(&out.o), 1e-12);
        assert_close(
            &format!("{ctx} state"),
            &state_loop,
            &to_f64(&out.state.unwrap().levels),
            1e-12,
        );
    }
}

#[test]
fn chunked_matches_parallel_f64_all_chunks() {
    let shapes = [
        (1, 1, 1, 4, 3),
        (2, 7, 2, 3, 5),
        (1, 63, 3, 4, 4),
        (2, 64, 2, 5, 3),
        (1, 70, 2, 4, 6),
    ];
    for (i, (b, t, h, n, p)) in shapes.into_iter().enumerate() {
        let seed = test_seed(100 + i as u64);
        let x = GdnInput::random(dims(b, t, h, n, p), seed, DType::F64, &dev());
        let forms: Vec<Form> = [1, 2, 4, 8, 16, 32, 64]
            .map(|chunk| Form::Chunked { chunk })
            .to_vec();
        check_forms(&x, &forms, seed);
    }
}

#[test]
fn chunked_and_recurrent_match_parallel_f64_t200() {
    let seed = test_seed(200);
    let x = GdnInput::random(dims(2, 200, 2, 6, 4), seed, DType::F64, &dev());
    check_forms(
        &x,
        &[
            Form::Chunked { chunk: 1 },
            Form::Chunked { chunk: 8 },
            Form::Chunked { chunk: 64 },
            Form::Fused,
            Form::Recurrent,
        ],
        seed,
    );
}

#[test]
fn recurrent_matches_parallel_f64() {
    for (i, (b, t, h, n, p)) in [
        (1, 1, 1, 4, 3),
        (2, 7, 2, 3, 5),
        (1, 63, 2, 4, 4),
        (1, 70, 2, 3, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = test_seed(300 + i as u64);
        let x = GdnInput::random(dims(b, t, h, n, p), seed, DType::F64, &dev());
        check_forms(&x, &[Form::Recurrent], seed);
    }
}

#[test]
fn forms_match_parallel_f32() {
    // f32 against the f64 parallel form: inputs are rounded to f32 once, then both run.
    for (i, (b, t, h, n, p, chunk)) in [
        (2, 200, 2, 16, 16, 64),
        (1, 70, 2, 16, 8, 16),
        (2, 64, 2, 8, 8, 8),
        (1, 7, 1, 4, 4, 4),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = test_seed(400 + i as u64);
        let x32 = GdnInput::random(dims(b, t, h, n, p), seed, DType::F32, &dev());
        let x64 = Host::of(&x32).input(DType::F64, &dev());
        let d_o = random_cotangent(&x64, seed ^ 7);
        let d_o32 = d_o.clone().cast(DType::F32);
        let reference = run_gdn_with_grads(&x64, &d_o, Form::Parallel, None);
        for form in [Form::Parallel, Form::Chunked { chunk }, Form::Recurrent] {
            if form == Form::Recurrent && t > 70 {
                continue;
            }
            let got = run_gdn_with_grads(&x32, &d_o32, form, None);
            compare(&format!("f32 {form} T={t}"), &reference, &got, 1e-5, 2e-5);
        }
    }
}

/// The loss `Σ o ⊙ do + Σ S ⊙ dS` over `x` cut into consecutive segments of the given lengths
/// and forms, each continuing from the state of the one before (the first from `initial`),
/// with `S` the final state: its output, the gradients of the six inputs, the final state, and
/// the gradient of the initial state (whose levels must be an autodiff leaf).
fn run_segments(
    x: &GdnInput,
    d_o: &Tensor<4>,
    d_s: &Tensor<5>,
    initial: Option<&FenwickState>,
    segments: &[(usize, Form)],
) -> (FormResult, Option<Vec<f64>>) {
    let xs = x.require_grad();
    let (mut at, mut state, mut outputs) = (0, initial.cloned(), Vec::new());
    for &(len, form) in segments {
        let out = gdn_attn(&xs.narrow(at, len), form, state.as_ref(), true);
        outputs.push(out.o);
        state = out.state;
        at += len;
    }
    assert_eq!(at, x.dims().t, "segments must cover the input");
    let o = Tensor::cat(outputs, 1);
    let state = state.unwrap();
    let loss = (o.clone() * d_o.clone()).sum() + (state.levels.clone() * d_s.clone()).sum();
    let grads = loss.backward();
    let result = FormResult {
        o: to_f64(&o),
        grads: vec![
            ("dq", to_f64(&xs.q.grad(&grads).unwrap())),
            ("dk", to_f64(&xs.k.grad(&grads).unwrap())),
            ("dv", to_f64(&xs.v.grad(&grads).unwrap())),
            ("dg", to_f64(&xs.g.grad(&grads).unwrap())),
            ("dbeta", to_f64(&xs.beta.grad(&grads).unwrap())),
            ("dlambda", to_f64(&xs.lambda.grad(&grads).unwrap())),
        ],
        state: Some(to_f64(&state.levels)),
    };
    let d_init = initial.map(|s| to_f64(&s.levels.grad(&grads).unwrap()));
    (result, d_init)
}

/// A random cotangent for a state of `x`'s sizes with `levels` levels.
fn random_state_cotangent(x: &GdnInput, levels: usize, seed: u64) -> Tensor<5> {
    let Dims { b, h, n, p, .. } = x.dims();
    let values = loglinear::testing::uniform_values(b * h * levels * n * p, seed);
    Tensor::from_data(
        TensorData::new(values, vec![b, h, levels, n, p]),
        (&x.device(), x.dtype()),
    )
}

/// Running a sequence in segments, each continuing from the state of the one before, equals one
/// run over the whole: outputs, final state, and all gradients of a loss on the outputs and the
/// final state (so through every carried state, in both directions).
#[test]
fn continuation_from_a_state_equals_one_pass() {
    let seed = test_seed(500);
    let (b, t, h, n, p) = (2, 150, 2, 4, 3);
    let x = GdnInput::random(dims(b, t, h, n, p), seed, DType::F64, &dev());
    let d_o = random_cotangent(&x, seed ^ 3);
    let d_s = random_state_cotangent(&x, x.dims().l, seed ^ 4);
    let (whole, _) = run_segments(&x, &d_o, &d_s, None, &[(t, Form::Parallel)]);
    let chunked = |chunk| Form::Chunked { chunk };
    let cases: [&[(usize, Form)]; 11] = [
        &[(1, chunked(16)), (149, chunked(16))],
        &[(37, chunked(8)), (113, chunked(8))],
        &[(64, chunked(64)), (86, chunked(64))],
        &[(100, chunked(4)), (50, chunked(4))],
        &[(129, chunked(32)), (21, chunked(32))],
        &[(37, Form::Parallel), (113, Form::Parallel)],
        &[(100, Form::Parallel), (50, chunked(2))],
        &[(141, chunked(16)), (9, Form::Recurrent)],
        &[(143, Form::Recurrent), (7, Form::Recurrent)],
        &[(37, chunked(8)), (64, Form::Parallel), (49, chunked(16))],
        &[(5, Form::Recurrent), (90, chunked(1)), (55, chunked(64))],
    ];
    for segments in cases {
        let (got, _) = run_segments(&x, &d_o, &d_s, None, segments);
        let ctx = format!("segments {segments:?}");
        compare(&ctx, &whole, &got, 1e-12, 1e-11);
    }
}

/// An initial state as a leaf: every form's output, input gradients, final state and gradient
/// of the initial state (through the outputs and through the final state) against the parallel
/// form's, at several alignments of the segment.
#[test]
fn gradients_through_an_initial_state() {
    let seed = test_seed(550);
    for (i, (position, t)) in [(45, 30), (64, 7), (5, 70), (1, 1), (100, 28)]
        .into_iter()
        .enumerate()
    {
        let (b, h, n, p) = (2, 2, 3, 4);
        let l = num_levels(position + t);
        let device = dev();
        let prefix = Dims {
            b,
            t: position,
            h,
            n,
            p,
            l,
        };
        let prefix = GdnInput::random(prefix, seed ^ (10 + i as u64), DType::F64, &device);
        let init = gdn_attn(&prefix, Form::Parallel, None, true).state.unwrap();
        let d = Dims { b, t, h, n, p, l };
        let x = GdnInput::random(d, seed ^ (20 + i as u64), DType::F64, &device);
        let d_o = random_cotangent(&x, seed ^ (30 + i as u64));
        let d_s = random_state_cotangent(&x, l, seed ^ (40 + i as u64));
        // Only the occupied levels of a state hold tokens; the others are zero by construction,
        // and the forms differ in whether they read them at all (the recurrent form folds them
        // in, the others skip them), so their gradient is not compared.
        let occupied = loglinear::fenwick::occupancy(position, l);
        let run = |form: Form| -> (FormResult, Vec<f64>) {
            let leaf = FenwickState {
                levels: init.levels.clone().detach().require_grad(),
                position,
            };
            let (result, d_init) = run_segments(&x, &d_o, &d_s, Some(&leaf), &[(t, form)]);
            let d_init = d_init
                .unwrap()
                .chunks(n * p)
                .enumerate()
                .flat_map(|(i, level)| {
                    let keep = occupied[i % l] > 0;
                    level.iter().map(move |v| if keep { *v } else { 0.0 })
                })
                .collect();
            (result, d_init)
        };
        let (reference, d_init) = run(Form::Parallel);
        for form in [
            Form::Chunked { chunk: 1 },
            Form::Chunked { chunk: 4 },
            Form::Chunked { chunk: 16 },
            Form::Chunked { chunk: 64 },
            Form::Recurrent,
        ] {
            let ctx = format!("state at {position} + {t} tokens, {form}");
            let (got, got_init) = run(form);
            compare(&ctx, &reference, &got, 1e-12, 1e-11);
            assert_close(
                &format!("{ctx} d(initial state)"),
                &d_init,
                &got_init,
                1e-11,
            );
        }
    }
}

#[test]
fn chunked_final_state_equals_recurrent_state() {
    let seed = test_seed(600);
    for t in [1, 2, 7, 63, 64, 65, 70, 128] {
        let x = GdnInput::random(dims(2, t, 2, 3, 4), seed ^ t as u64, DType::F64, &dev());
        let (_, rec) = loglinear::ops::gdn::recurrent(&x, None);
        for chunk in [1, 4, 64] {
            let ch = gdn_attn(&x, Form::Chunked { chunk }, None, true)
                .state
                .unwrap();
            assert_eq!(ch.position, rec.position);
            assert_close(
                &format!("T={t} C={chunk} state"),
                &to_f64(&rec.levels),
                &to_f64(&ch.levels),
                1e-12,
            );
        }
    }
}

#[test]
fn causality_future_inputs_do_not_change_the_past() {
    let seed = test_seed(700);
    let (t, cut) = (70, 41);
    let x = GdnInput::random(dims(1, t, 2, 4, 4), seed, DType::F64, &dev());
    let y = GdnInput::random(dims(1, t, 2, 4, 4), seed ^ 99, DType::F64, &dev());
    // Every input after `cut` (β and λ included) replaced by other random values.
    fn mix<const D: usize>(a: &Tensor<D>, b: &Tensor<D>, cut: usize) -> Tensor<D> {
        let t = a.dims()[1];
        Tensor::cat(
            vec![
                a.clone().narrow(1, 0, cut + 1),
                b.clone().narrow(1, cut + 1, t - cut - 1),
            ],
            1,
        )
    }
    let z = GdnInput {
        q: mix(&x.q, &y.q, cut),
        k: mix(&x.k, &y.k, cut),
        v: mix(&x.v, &y.v, cut),
        g: mix(&x.g, &y.g, cut),
        beta: mix(&x.beta, &y.beta, cut),
        lambda: mix(&x.lambda, &y.lambda, cut),
    };
    for form in [
        Form::Parallel,
        Form::Chunked { chunk: 16 },
        Form::Chunked { chunk: 1 },
        Form::Recurrent,
    ] {
        let a = gdn_attn(&x, form, None, false).o;
        let b = gdn_attn(&z, form, None, false).o;
        let past = |o: &Tensor<4>| to_f64(&o.clone().narrow(1, 0, cut + 1));
        assert_eq!(past(&a), past(&b), "{form}: o[..=t] changed");
        let future = closeness(
            &to_f64(&a.narrow(1, cut + 1, t - cut - 1)),
            &to_f64(&b.narrow(1, cut + 1, t - cut - 1)),
        );
        assert!(
            future.max_rel > 1e-3,
            "{form}: the perturbation did not reach the future"
        );
    }
}

/// λ ≡ 1 is the plain gated delta rule.
#[test]
fn lambda_one_is_the_plain_gated_delta_rule() {
    let seed = test_seed(800);
    let mut x = GdnInput::random(dims(2, 70, 2, 5, 3), seed, DType::F64, &dev());
    x.lambda = x.lambda.ones_like();
    let expected = Host::of(&x).gated_delta_rule();
    for form in [
        Form::Parallel,
        Form::Chunked { chunk: 16 },
        Form::Chunked { chunk: 1 },
        Form::Recurrent,
    ] {
        let o = gdn_attn(&x, form, None, false).o;
        assert_close(&format!("{form} λ≡1"), &expected, &to_f64(&o), 1e-12);
    }
}

/// With one key dimension the transition is the scalar `a_t (1 − β_t k_t²)`: the op is the
/// Mamba-2 op with `g' = g + ln(1 − β k²)` and `v' = β v` (here `k = ±1`, `β < 1`).
#[test]
fn one_key_dimension_is_the_mamba2_op() {
    let seed = test_seed(850);
    let (b, t, h, p) = (2, 40, 2, 3);
    let x = GdnInput::random(dims(b, t, h, 1, p), seed, DType::F64, &dev());
    let host = Host::of(&x);
    let g: Vec<f64> = (host.g.iter().zip(&host.beta))
        .map(|(g, beta)| g + (1.0 - beta).ln())
        .collect();
    let v: Vec<f64> = (host.v.chunks(p).zip(&host.beta))
        .flat_map(|(v, beta)| v.iter().map(move |v| beta * v))
        .collect();
    let d = x.dims();
    let mamba = LogLinearInput {
        q: x.q.clone(),
        k: x.k.clone(),
        v: Tensor::from_data(TensorData::new(v, vec![b, t, h, p]), (&dev(), DType::F64)),
        g: Tensor::from_data(TensorData::new(g, vec![b, t, h]), (&dev(), DType::F64)),
        lambda: x.lambda.clone(),
    };
    assert_eq!(mamba.dims(), d);
    let expected = to_f64(&log_linear_attn(&mamba, Form::Parallel, None, false).o);
    for form in [Form::Parallel, Form::Chunked { chunk: 8 }, Form::Recurrent] {
        let o = gdn_attn(&x, form, None, false).o;
        assert_close(&format!("{form} N=1"), &expected, &to_f64(&o), 1e-12);
    }
}

/// Gradients of the parallel form (autodiff, f64) against central finite differences of the
/// plain-loop recurrence, for all six inputs at two shapes (B, H > 1, N ≠ P, one λ slot more
/// than needed); the identities of an op linear in λ[t], in q[t] and in v (per query row
/// `Σ_ℓ λ·dλ = Σ_p o·do = Σ_n q·dq`, and over everything `Σ v·dv = Σ o·do`); and `dg₀ = 0`
/// (the first token's transition acts on the empty state).
#[test]
fn parallel_gradients_match_finite_differences() {
    for (i, (b, t, h, n, p, extra)) in [(1, 9, 2, 3, 2, 0), (2, 6, 1, 2, 3, 1)]
        .into_iter()
        .enumerate()
    {
        let seed = test_seed(1000 + i as u64);
        let d = Dims {
            l: num_levels(t) + extra,
            ..dims(b, t, h, n, p)
        };
        let x = GdnInput::random(d, seed, DType::F64, &dev());
        let host = Host::of(&x);
        let d_o = random_cotangent(&x, seed ^ 5);
        let dov = to_f64(&d_o);
        let analytic = run_gdn_with_grads(&x, &d_o, Form::Parallel, None);
        let grad = |name: &str| &analytic.grads.iter().find(|g| g.0 == name).unwrap().1;
        let ctx = format!("FD {d:?}");

        let rows = |a: &[f64], da: &[f64], width: usize| -> Vec<f64> {
            (a.chunks(width).zip(da.chunks(width)))
                .map(|(a, da)| a.iter().zip(da).map(|(x, y)| x * y).sum())
                .collect()
        };
        let o_do = rows(&analytic.o, &dov, p);
        let scale = o_do.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (name, input, width) in [("dlambda", &host.lambda, d.l), ("dq", &host.q, n)] {
            for (r, (a, e)) in rows(input, grad(name), width).iter().zip(&o_do).enumerate() {
                assert!(
                    (a - e).abs() <= 1e-12 * scale,
                    "{ctx}: row {r}: Σ {name}·input = {a} but Σ o·do = {e}"
                );
            }
        }
        let total: f64 = o_do.iter().sum();
        let v_dv: f64 = rows(&host.v, grad("dv"), 1).iter().sum();
        assert!(
            (v_dv - total).abs() <= 1e-12 * scale * o_do.len() as f64,
            "{ctx}: Σ v·dv = {v_dv}, Σ o·do = {total}"
        );

        let objective =
            |x: &Host| -> f64 { x.recurrence().0.iter().zip(&dov).map(|(a, b)| a * b).sum() };
        let eps = 1e-6;
        for name in GRAD_NAMES {
            let len = host.clone().field(name).len();
            let numeric: Vec<f64> = (0..len)
                .map(|i| {
                    let (mut plus, mut minus) = (host.clone(), host.clone());
                    plus.field(name)[i] += eps;
                    minus.field(name)[i] -= eps;
                    (objective(&plus) - objective(&minus)) / (2.0 * eps)
                })
                .collect();
            assert_close(&format!("{ctx} {name}"), &numeric, grad(name), 1e-7);
        }
        let dg = grad("dg");
        for bi in 0..b {
            for hi in 0..h {
                let v = dg[bi * t * h + hi];
                assert!(v.abs() < 1e-12, "{ctx}: dg_0 = {v} (batch {bi}, head {hi})");
            }
        }
    }
}

#[test]
fn misuse_panics_naming_the_op_and_the_shapes() {
    let d = Dims {
        b: 1,
        t: 9,
        h: 1,
        n: 2,
        p: 2,
        l: 4,
    };
    let x = GdnInput::random(d, 1, DType::F32, &dev());
    let message = |x: &GdnInput, form: Form| -> String {
        let err = std::panic::catch_unwind(|| gdn_attn(x, form, None, false)).unwrap_err();
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    for form in [Form::Parallel, Form::Chunked { chunk: 4 }, Form::Recurrent] {
        let msg = message(&x, form);
        assert!(
            msg.contains("gdn_attn") && msg.contains("need 5"),
            "{form}: {msg}"
        );
    }
    let mut y = GdnInput::random(Dims { l: 5, ..d }, 1, DType::F32, &dev());
    y.beta = y.beta.narrow(1, 0, 8);
    let msg = message(&y, Form::Parallel);
    assert!(
        msg.contains("gdn_attn: beta has shape [1, 8, 1]") && msg.contains("[1, 9, 1]"),
        "{msg}"
    );
    let y = GdnInput::random(Dims { l: 5, ..d }, 1, DType::F32, &dev());
    let msg = message(&y, Form::Chunked { chunk: 3 });
    assert!(msg.contains("gdn_attn(chunked): chunk size 3"), "{msg}");
}

/// bf16 inputs are computed in f32 and returned in bf16, as close to the f64 definition on the
/// same rounded inputs as bf16 output rounding allows.
#[test]
fn half_precision_inputs_compute_in_f32() {
    let seed = test_seed(1100);
    let x64 = GdnInput::random(dims(2, 100, 2, 16, 8), seed, DType::F64, &dev());
    let x16 = x64.cast(DType::BF16);
    let reference = Host::of(&x16).recurrence().0;
    for form in [Form::Chunked { chunk: 16 }, Form::Parallel, Form::Recurrent] {
        let o = gdn_attn(&x16, form, None, false).o;
        assert_eq!(o.dtype(), DType::BF16);
        assert_close(&format!("bf16 {form}"), &reference, &to_f64(&o), 1e-2);
    }
}

/// A segment of no tokens leaves the state as it was and has no outputs, in every form.
#[test]
fn an_empty_segment_keeps_the_state() {
    let seed = test_seed(1200);
    let (b, h, n, p, l) = (2, 2, 3, 4, 5);
    let prefix = GdnInput::random(
        Dims {
            l,
            ..dims(b, 11, h, n, p)
        },
        seed,
        DType::F64,
        &dev(),
    );
    let state = gdn_attn(&prefix, Form::Parallel, None, true).state.unwrap();
    let device = dev();
    let zeros4 = |w: usize| Tensor::<4>::zeros([b, 0, h, w], (&device, DType::F64));
    let zeros3 = || Tensor::<3>::zeros([b, 0, h], (&device, DType::F64));
    let x = GdnInput {
        q: zeros4(n),
        k: zeros4(n),
        v: zeros4(p),
        g: zeros3(),
        beta: zeros3(),
        lambda: zeros4(l),
    };
    for form in [Form::Parallel, Form::Chunked { chunk: 4 }, Form::Recurrent] {
        let out = gdn_attn(&x, form, Some(&state), true);
        assert_eq!(out.o.dims(), [b, 0, h, p], "{form}");
        let after = out.state.unwrap();
        assert_eq!(after.position, 11, "{form}");
        assert_eq!(to_f64(&after.levels), to_f64(&state.levels), "{form}");
    }
}
