//! Every form of the core op against the definition: outputs, all five gradients, final states,
//! continuation from a state, on awkward shapes; plus the hand-checkable oracles of spec §10.

use burn::prelude::*;
use burn::tensor::DType;
use loglinear::fenwick::num_levels;
use loglinear::host::{HostInput, closeness, to_f64};
use loglinear::ops::{Dims, Form, LogLinearInput, log_linear_attn};
use loglinear::testing::{assert_close, run_with_grads, test_seed};

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

fn random_cotangent(x: &LogLinearInput, seed: u64) -> Tensor<4> {
    let d = x.dims();
    let other = LogLinearInput::random(Dims { n: d.p, ..d }, seed, x.dtype(), &x.device());
    other.q.detach()
}

const ALL_CHUNKS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// `(B, T, H, N, P)`: T = 1, a partial first chunk, one short of and exactly a whole 64-chunk, a
/// partial second one.
const AWKWARD_SHAPES: [(usize, usize, usize, usize, usize); 5] = [
    (1, 1, 1, 4, 3),
    (2, 7, 2, 3, 5),
    (1, 63, 3, 4, 4),
    (2, 64, 2, 5, 3),
    (1, 70, 2, 4, 6),
];

/// Checks `form` against the parallel form on outputs, gradients and final state.
fn check_form(x: &LogLinearInput, form: Form, tol_o: f64, tol_grad: f64, seed: u64) {
    let d_o = random_cotangent(x, seed ^ 1);
    let reference = run_with_grads(x, &d_o, Form::Parallel, None);
    let got = run_with_grads(x, &d_o, form, None);
    let ctx = format!("{form} {:?} {:?}", x.dims(), x.dtype());
    assert_close(&format!("{ctx} o"), &reference.o, &got.o, tol_o);
    for ((name, r), (_, g)) in reference.grads.iter().zip(&got.grads) {
        if r.iter().all(|v| *v == 0.0) {
            // Only dg at T = 1 is exactly zero (the first token's decay never matters).
            assert!(
                *name == "dg" && x.dims().t == 1,
                "{ctx} {name}: zero reference"
            );
            assert!(
                g.iter().all(|v| v.abs() < tol_grad),
                "{ctx} {name}: {g:?} ≠ 0"
            );
            continue;
        }
        assert_close(&format!("{ctx} {name}"), r, g, tol_grad);
    }
    if !matches!(form, Form::Fused | Form::Segmented { .. }) {
        assert_close(
            &format!("{ctx} final state"),
            reference.state.as_ref().unwrap(),
            got.state.as_ref().unwrap(),
            tol_o,
        );
    }
}

#[test]
fn parallel_matches_the_plain_f64_definition() {
    for (i, (b, t, h, n, p)) in [
        (1, 1, 1, 3, 2),
        (2, 7, 3, 4, 5),
        (1, 70, 2, 8, 3),
        (2, 33, 1, 2, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let x =
            LogLinearInput::random(dims(b, t, h, n, p), test_seed(i as u64), DType::F64, &dev());
        let host = HostInput::from_input(&x);
        let o = log_linear_attn(&x, Form::Parallel, None, false).o;
        assert_close(
            "parallel vs loops",
            &host.reference_output(),
            &to_f64(&o),
            1e-12,
        );
    }
}

#[test]
fn chunked_matches_parallel_f64_all_chunks() {
    for (i, (b, t, h, n, p)) in AWKWARD_SHAPES.into_iter().enumerate() {
        let seed = test_seed(100 + i as u64);
        let x = LogLinearInput::random(dims(b, t, h, n, p), seed, DType::F64, &dev());
        for chunk in ALL_CHUNKS {
            check_form(&x, Form::Chunked { chunk }, 1e-11, 1e-10, seed);
        }
    }
}

#[test]
fn chunked_matches_parallel_f64_t200() {
    let seed = test_seed(200);
    let x = LogLinearInput::random(dims(2, 200, 2, 8, 4), seed, DType::F64, &dev());
    for chunk in [1, 8, 64] {
        check_form(&x, Form::Chunked { chunk }, 1e-11, 1e-10, seed);
    }
}

#[test]
fn fused_entry_point_matches_parallel_f64_on_the_cpu() {
    // On a device without kernels `Form::Fused` is the chunked fallback (the kernels themselves
    // are tested in tests/kernels.rs on WGPU and by `loglinear bench kernels` on CUDA); the
    // entry point must still give the op and all its gradients.
    let seed = test_seed(201);
    let x = LogLinearInput::random(dims(2, 70, 2, 8, 4), seed, DType::F64, &dev());
    check_form(&x, Form::Fused, 1e-11, 1e-10, seed);
}

/// The sequence-parallel form (segments as batch rows, per-segment states across them) against
/// the definition, output and all five gradients: segments of 1 to 64 tokens, sequences shorter
/// than one segment, exactly whole segments (T = 64), a partial last segment (7, 63, 70, 200),
/// f64 and f32.
#[test]
fn segmented_matches_parallel_f64() {
    let shapes = AWKWARD_SHAPES.into_iter().chain([(2, 200, 2, 8, 4)]);
    for (i, (b, t, h, n, p)) in shapes.enumerate() {
        let seed = test_seed(210 + i as u64);
        let x = LogLinearInput::random(dims(b, t, h, n, p), seed, DType::F64, &dev());
        for segment in [1, 2, 8, 32, 64, 256] {
            check_form(&x, Form::Segmented { segment }, 1e-11, 1e-10, seed);
        }
    }
    let seed = test_seed(220);
    let x = LogLinearInput::random(dims(2, 70, 3, 8, 8), seed, DType::F32, &dev());
    check_form(&x, Form::Segmented { segment: 16 }, 2e-5, 2e-4, seed);
}

/// More λ slots than the sequence needs (a model built for longer sequences) and half-precision
/// inputs: the segmented form still equals the chunked one.
#[test]
fn segmented_takes_spare_levels_and_bf16() {
    let seed = test_seed(221);
    let d = Dims {
        l: num_levels(70) + 3,
        ..dims(2, 70, 2, 16, 8)
    };
    let x = LogLinearInput::random(d, seed, DType::F64, &dev());
    check_form(&x, Form::Segmented { segment: 16 }, 1e-11, 1e-10, seed);
    let x16 = HostInput::from_input(&x).to_input(DType::BF16, &dev());
    let seg = log_linear_attn(&x16, Form::Segmented { segment: 16 }, None, false).o;
    let chunked = log_linear_attn(&x16, Form::Chunked { chunk: 16 }, None, false).o;
    assert_eq!(seg.dtype(), DType::BF16);
    assert_close(
        "bf16 segmented vs chunked",
        &to_f64(&chunked),
        &to_f64(&seg),
        2e-2,
    );
}

/// `Form::Auto` on the CPU is the chunked form with its chunk, bit for bit, in f32 and in bf16 (the
/// inputs under which it would pick the fused kernels on tensor cores), with and without a state.
#[test]
fn auto_is_the_chunked_form_on_the_cpu_bit_for_bit() {
    let seed = test_seed(202);
    let x32 = LogLinearInput::random(dims(2, 70, 2, 16, 8), seed, DType::F32, &dev());
    let x16 = HostInput::from_input(&x32).to_input(DType::BF16, &dev());
    for x in [x32, x16] {
        let d_o = random_cotangent(&x, seed ^ 5);
        let chunked = run_with_grads(&x, &d_o, Form::Chunked { chunk: 16 }, None);
        let auto = run_with_grads(&x, &d_o, Form::Auto { chunk: 16 }, None);
        let ctx = format!("{:?}", x.dtype());
        assert_eq!(auto.o, chunked.o, "{ctx} o");
        for ((name, a), (_, c)) in auto.grads.iter().zip(&chunked.grads) {
            assert_eq!(a, c, "{ctx} {name}");
        }
        // Continuing from a state and returning one: the state is the chunked form's too.
        let first = log_linear_attn(&x.narrow(0, 33), Form::Chunked { chunk: 16 }, None, true);
        let state = first.state.unwrap();
        let rest = x.narrow(33, 37);
        let by_auto = log_linear_attn(&rest, Form::Auto { chunk: 16 }, Some(&state), true);
        let by_chunked = log_linear_attn(&rest, Form::Chunked { chunk: 16 }, Some(&state), true);
        assert_eq!(
            to_f64(&by_auto.o),
            to_f64(&by_chunked.o),
            "{ctx} o after a state"
        );
        assert_eq!(
            to_f64(&by_auto.state.unwrap().levels),
            to_f64(&by_chunked.state.unwrap().levels),
            "{ctx} final state"
        );
    }
}

/// The choice `Form::Auto` makes: the fused kernels only when every condition of the tensor-core
/// path holds (bf16 `q`, key width a multiple of 16, bf16 `cmma` on the device, no state), the
/// chunked form with the configured chunk when any one fails.
#[test]
fn auto_chooses_fused_only_on_tensor_cores() {
    use loglinear::ops::auto_form;
    let chunked = Form::Chunked { chunk: 32 };
    // (dtype, key width, device has bf16 cmma, state in or out) → form
    let cases = [
        ((DType::BF16, 64, true, false), Form::Fused),
        ((DType::BF16, 16, true, false), Form::Fused),
        ((DType::F32, 64, true, false), chunked),
        ((DType::F16, 64, true, false), chunked),
        ((DType::F64, 64, true, false), chunked),
        ((DType::BF16, 24, true, false), chunked),
        ((DType::BF16, 8, true, false), chunked),
        ((DType::BF16, 64, false, false), chunked),
        ((DType::BF16, 64, true, true), chunked),
    ];
    for ((dtype, n, cmma, state), want) in cases {
        assert_eq!(
            auto_form(32, dtype, n, cmma, state),
            want,
            "{dtype:?}, n = {n}, bf16 cmma {cmma}, state {state}"
        );
    }
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
        let x = LogLinearInput::random(dims(b, t, h, n, p), seed, DType::F64, &dev());
        check_form(&x, Form::Recurrent, 1e-11, 1e-10, seed);
    }
}

#[test]
fn forms_match_parallel_f32() {
    // f32 against the f64 parallel form: inputs are rounded to f32 once, then both run.
    for (i, (b, t, h, n, p, chunk)) in [
        (2, 200, 3, 16, 16, 64),
        (1, 70, 2, 16, 8, 16),
        (2, 64, 2, 8, 8, 8),
        (1, 7, 1, 4, 4, 4),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = test_seed(400 + i as u64);
        let x32 = LogLinearInput::random(dims(b, t, h, n, p), seed, DType::F32, &dev());
        let x64 = HostInput::from_input(&x32).to_input(DType::F64, &dev());
        let d_o = random_cotangent(&x64, seed ^ 7);
        let d_o32 = d_o.clone().cast(DType::F32);
        let reference = run_with_grads(&x64, &d_o, Form::Parallel, None);
        for form in [Form::Parallel, Form::Chunked { chunk }, Form::Recurrent] {
            if form == Form::Recurrent && t > 70 {
                continue;
            }
            let got = run_with_grads(&x32, &d_o32, form, None);
            let ctx = format!("f32 {form} T={t}");
            assert_close(&format!("{ctx} o"), &reference.o, &got.o, 2e-5);
            for ((name, r), (_, g)) in reference.grads.iter().zip(&got.grads) {
                assert_close(&format!("{ctx} {name}"), r, g, 2e-4);
            }
        }
    }
}

/// Running a sequence in two segments, the second continuing from the first one's state, equals
/// one run over the whole: outputs, all gradients (through the carried state) and final state.
#[test]
fn continuation_from_a_state_equals_one_pass() {
    let seed = test_seed(500);
    let (b, t, h, n, p) = (2, 150, 2, 4, 3);
    let x = LogLinearInput::random(dims(b, t, h, n, p), seed, DType::F64, &dev());
    let d_o = random_cotangent(&x, seed ^ 3);
    let whole = run_with_grads(&x, &d_o, Form::Parallel, None);
    for (split, form) in [
        (1, Form::Chunked { chunk: 16 }),
        (37, Form::Chunked { chunk: 8 }),
        (64, Form::Chunked { chunk: 64 }),
        (100, Form::Chunked { chunk: 4 }),
        (129, Form::Chunked { chunk: 32 }),
        (37, Form::Parallel),
        (100, Form::Parallel),
        (141, Form::Recurrent),
    ] {
        let xs = x.require_grad();
        let first = log_linear_attn(&xs.narrow(0, split), form, None, true);
        let state = first.state.unwrap();
        assert_eq!(state.position, split);
        let second = log_linear_attn(&xs.narrow(split, t - split), form, Some(&state), true);
        let o = Tensor::cat(vec![first.o, second.o], 1);
        let grads = (o.clone() * d_o.clone()).sum().backward();
        let ctx = format!("split at {split}, {form}");
        assert_close(&format!("{ctx} o"), &whole.o, &to_f64(&o), 1e-11);
        let got = [
            to_f64(&xs.q.grad(&grads).unwrap()),
            to_f64(&xs.k.grad(&grads).unwrap()),
            to_f64(&xs.v.grad(&grads).unwrap()),
            to_f64(&xs.g.grad(&grads).unwrap()),
            to_f64(&xs.lambda.grad(&grads).unwrap()),
        ];
        for ((name, r), g) in whole.grads.iter().zip(&got) {
            assert_close(&format!("{ctx} {name}"), r, g, 1e-10);
        }
        let final_state = second.state.unwrap();
        assert_eq!(final_state.position, t);
        assert_close(
            &format!("{ctx} final state"),
            whole.state.as_ref().unwrap(),
            &to_f64(&final_state.levels),
            1e-11,
        );
    }
}

#[test]
fn chunked_final_state_equals_recurrent_state() {
    let seed = test_seed(600);
    for t in [1, 2, 7, 63, 64, 65, 70, 128] {
        let x = LogLinearInput::random(dims(2, t, 2, 3, 4), seed + t as u64, DType::F64, &dev());
        let (_, rec) = loglinear::ops::recurrent(&x, None);
        for chunk in [1, 4, 64] {
            let ch = log_linear_attn(&x, Form::Chunked { chunk }, None, true)
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
        assert_eq!(
            rec.occupancy(),
            loglinear::fenwick::occupancy(t, num_levels(t))
        );
    }
}

#[test]
fn causality_future_inputs_do_not_change_the_past() {
    let seed = test_seed(700);
    let (t, cut) = (70, 41);
    let x = LogLinearInput::random(dims(1, t, 2, 4, 4), seed, DType::F64, &dev());
    let y = LogLinearInput::random(dims(1, t, 2, 4, 4), seed ^ 99, DType::F64, &dev());
    // Replace every input after `cut` (λ included) by other random values.
    let mix = |a: &Tensor<4>, b: &Tensor<4>| {
        Tensor::cat(
            vec![
                a.clone().narrow(1, 0, cut + 1),
                b.clone().narrow(1, cut + 1, t - cut - 1),
            ],
            1,
        )
    };
    let z = LogLinearInput {
        q: mix(&x.q, &y.q),
        k: mix(&x.k, &y.k),
        v: mix(&x.v, &y.v),
        g: Tensor::cat(
            vec![
                x.g.clone().narrow(1, 0, cut + 1),
                y.g.clone().narrow(1, cut + 1, t - cut - 1),
            ],
            1,
        ),
        lambda: mix(&x.lambda, &y.lambda),
    };
    for form in [
        Form::Parallel,
        Form::Chunked { chunk: 16 },
        Form::Chunked { chunk: 1 },
        Form::Recurrent,
    ] {
        let a = log_linear_attn(&x, form, None, false).o;
        let b = log_linear_attn(&z, form, None, false).o;
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

/// λ ≡ 1 is plain Mamba-2: `S_t = a_t S_{t−1} + k_t v_tᵀ`, `o_t = q_tᵀ S_t`.
#[test]
fn lambda_one_is_plain_mamba2() {
    let seed = test_seed(800);
    let (b, t, h, n, p) = (2, 70, 2, 3, 2);
    let mut x = LogLinearInput::random(dims(b, t, h, n, p), seed, DType::F64, &dev());
    x.lambda = x.lambda.ones_like();
    let host = HostInput::from_input(&x);
    let mut expected = vec![0.0; b * t * h * p];
    for bi in 0..b {
        for hi in 0..h {
            let mut s = vec![0.0; n * p];
            for ti in 0..t {
                let at = (bi * t + ti) * h + hi;
                let a = host.g[at].exp();
                for i in 0..n {
                    for j in 0..p {
                        s[i * p + j] = a * s[i * p + j] + host.k[at * n + i] * host.v[at * p + j];
                    }
                }
                for j in 0..p {
                    expected[at * p + j] = (0..n).map(|i| host.q[at * n + i] * s[i * p + j]).sum();
                }
            }
        }
    }
    for form in [Form::Parallel, Form::Chunked { chunk: 16 }, Form::Recurrent] {
        let o = log_linear_attn(&x, form, None, false).o;
        assert_close(&format!("{form} λ≡1"), &expected, &to_f64(&o), 1e-12);
    }
}

fn scalar_input(values: &[(f64, f64, f64, f64)], lambda: Vec<f64>, l: usize) -> LogLinearInput {
    // (q, k, v, g) per token, N = P = 1, B = H = 1.
    let t = values.len();
    let d = dev();
    let col = |f: fn(&(f64, f64, f64, f64)) -> f64| values.iter().map(f).collect::<Vec<_>>();
    let mk = |v: Vec<f64>| {
        Tensor::<4>::from_data(
            burn::tensor::TensorData::new(v, vec![1, t, 1, 1]),
            (&d, DType::F64),
        )
    };
    LogLinearInput {
        q: mk(col(|x| x.0)),
        k: mk(col(|x| x.1)),
        v: mk(col(|x| x.2)),
        g: Tensor::from_data(
            burn::tensor::TensorData::new(col(|x| x.3), vec![1, t, 1]),
            (&d, DType::F64),
        ),
        lambda: Tensor::from_data(
            burn::tensor::TensorData::new(lambda, vec![1, t, 1, l]),
            (&d, DType::F64),
        ),
    }
}

fn every_form(x: &LogLinearInput, expected: &[f64], name: &str) {
    for form in [
        Form::Parallel,
        Form::Recurrent,
        Form::Chunked { chunk: 1 },
        Form::Chunked { chunk: 2 },
        Form::Chunked { chunk: 4 },
        Form::Chunked { chunk: 64 },
        Form::Fused,
    ] {
        let o = to_f64(&log_linear_attn(x, form, None, false).o);
        assert_close(&format!("{name} {form}"), expected, &o, 1e-14);
    }
}

#[test]
fn oracle_o2_bucket_sizes_as_decimal_digits() {
    let l = 5;
    let lambda: Vec<f64> = (0..16)
        .flat_map(|_| (0..l).map(|j| 10f64.powi(j as i32)))
        .collect();
    let x = scalar_input(&[(1.0, 1.0, 1.0, 0.0); 16], lambda, l);
    let expected = [
        1., 11., 201., 211., 4001., 4011., 4201., 4211., 80001., 80011., 80201., 80211., 84001.,
        84011., 84201., 84211.,
    ];
    every_form(&x, &expected, "O2");
}

#[test]
fn oracle_o3_o4_decayed_case() {
    let half = 0.5f64.ln();
    let tokens: Vec<_> = [1.0, 2.0, 3.0, 4.0]
        .iter()
        .map(|&v| (1.0, 1.0, v, half))
        .collect();
    let x = scalar_input(&tokens, [1.0, 10.0, 100.0].repeat(4), 3);
    every_form(&x, &[1.0, 7.0, 128.0, 81.5], "O3");
    let x = scalar_input(&tokens, vec![1.0; 12], 3);
    every_form(&x, &[1.0, 2.5, 4.25, 6.125], "O4");
}

/// O10: gradients of the parallel form (autodiff, f64) against central finite differences of
/// the plain-loop definition, at two shapes (B, H > 1, N ≠ P, one λ slot more than needed); and
/// the identities of an op linear in λ[t], in q[t] and in v: per query row
/// `Σ_ℓ λ·dλ = Σ_p o·do = Σ_n q·dq`, and over everything `Σ v·dv = Σ o·do`; and `dg₀ = 0`.
#[test]
fn oracle_o10_finite_differences_and_identities() {
    for (i, (b, t, h, n, p, extra)) in [(1, 9, 2, 3, 2, 0), (2, 6, 1, 2, 3, 1)]
        .into_iter()
        .enumerate()
    {
        let seed = test_seed(1000 + i as u64);
        let d = Dims {
            l: num_levels(t) + extra,
            ..dims(b, t, h, n, p)
        };
        let x = LogLinearInput::random(d, seed, DType::F64, &dev());
        let host = HostInput::from_input(&x);
        let d_o = random_cotangent(&x, seed ^ 5);
        let dov = to_f64(&d_o);
        let analytic = run_with_grads(&x, &d_o, Form::Parallel, None);
        let ctx = format!("O10 {d:?}");

        // Σ over a row of a ⊙ da, for rows of `width` values
        let rows = |a: &[f64], da: &[f64], width: usize| -> Vec<f64> {
            (a.chunks(width).zip(da.chunks(width)))
                .map(|(a, da)| a.iter().zip(da).map(|(x, y)| x * y).sum())
                .collect()
        };
        let o_do = rows(&analytic.o, &dov, p);
        let grad = |name: &str| &analytic.grads.iter().find(|g| g.0 == name).unwrap().1;
        let scale = o_do.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (name, input, width) in [("dlambda", &host.lambda, d.l), ("dq", &host.q, n)] {
            let got = rows(input, grad(name), width);
            for (r, (a, e)) in got.iter().zip(&o_do).enumerate() {
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

        let objective = |h: &HostInput| -> f64 {
            h.reference_output()
                .iter()
                .zip(&dov)
                .map(|(a, b)| a * b)
                .sum()
        };
        let eps = 1e-6;
        type Field = fn(&mut HostInput) -> &mut Vec<f64>;
        let fields: [(&str, Field); 5] = [
            ("dq", |h| &mut h.q),
            ("dk", |h| &mut h.k),
            ("dv", |h| &mut h.v),
            ("dg", |h| &mut h.g),
            ("dlambda", |h| &mut h.lambda),
        ];
        for ((name, field), (gname, grad)) in fields.iter().zip(&analytic.grads) {
            assert_eq!(name, gname);
            let len = field(&mut host.clone()).len();
            let mut numeric = vec![0.0; len];
            for (i, out) in numeric.iter_mut().enumerate() {
                let mut plus = host.clone();
                field(&mut plus)[i] += eps;
                let mut minus = host.clone();
                field(&mut minus)[i] -= eps;
                *out = (objective(&plus) - objective(&minus)) / (2.0 * eps);
            }
            assert_close(&format!("{ctx} {name}"), &numeric, grad, 1e-7);
        }
        // dg at t = 0 is exactly zero for every batch row and head: the first decay never matters.
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
fn too_few_levels_is_refused_with_the_need() {
    let x = LogLinearInput::random(
        Dims {
            b: 1,
            t: 9,
            h: 1,
            n: 2,
            p: 2,
            l: 4,
        },
        1,
        DType::F32,
        &dev(),
    );
    for form in [Form::Parallel, Form::Chunked { chunk: 4 }, Form::Recurrent] {
        let err = std::panic::catch_unwind(|| log_linear_attn(&x, form, None, false)).unwrap_err();
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("need 5"), "{form}: {msg}");
    }
}

/// bf16 inputs: the op computes in f32 internally and returns bf16; the result is as close to the
/// f64 reference as bf16 rounding of the inputs and output allows.
#[test]
fn half_precision_inputs_compute_in_f32() {
    let seed = test_seed(1100);
    let x64 = LogLinearInput::random(dims(2, 150, 2, 16, 8), seed, DType::F64, &dev());
    let x16 = HostInput::from_input(&x64).to_input(DType::BF16, &dev());
    // the reference sees the same bf16-rounded inputs
    let reference = HostInput::from_input(&x16).reference_output();
    for form in [Form::Chunked { chunk: 16 }, Form::Parallel, Form::Recurrent] {
        let o = log_linear_attn(&x16, form, None, false).o;
        assert_eq!(o.dtype(), DType::BF16);
        assert_close(&format!("bf16 {form}"), &reference, &to_f64(&o), 1e-2);
    }
}
