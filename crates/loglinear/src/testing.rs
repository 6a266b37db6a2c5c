//! Helpers to check one implementation against another: a forward-and-backward runner for any
//! [`Form`], an assertion that reports what differs, seeds that can be replayed, seeded random
//! values and perturbed modules, and the check of the fused kernels (also run by
//! `loglinear bench kernels` on GPUs). The plain-loop f64 reference and the comparison figures
//! are in [`crate::host`].

use burn::prelude::*;
use burn::tensor::DType;

#[cfg(feature = "kernels")]
use crate::host::{Closeness, HostInput};
use crate::host::{closeness, to_f64};
use crate::ops::gdn::{GdnInput, gdn_attn};
use crate::ops::{FenwickState, Form, LogLinearInput, log_linear_attn};

/// Panics with the name, the error figures and the tolerance unless `got` matches `reference`
/// to `tol` (relative to the largest reference entry). A reference that is all zeros is
/// refused: comparing two zero tensors proves nothing.
pub fn assert_close(name: &str, reference: &[f64], got: &[f64], tol: f64) {
    let c = closeness(reference, got);
    assert!(!c.non_finite, "{name}: result holds NaN/Inf");
    assert!(
        reference.iter().any(|x| *x != 0.0),
        "{name}: the reference is all zeros, so the comparison proves nothing"
    );
    assert!(
        c.max_rel <= tol,
        "{name}: max |Δ| = {:.3e} = {:.3e} of max |ref| (tolerance {tol:.1e}), rms ratio {:.6}",
        c.max_abs,
        c.max_rel,
        c.rms_ratio
    );
}

/// Environment variable that fixes the seeds of the randomised tests (see [`test_seed`]).
pub const SEED_VAR: &str = "LOGLINEAR_TEST_SEED";

/// The seed of a randomised test: `LOGLINEAR_TEST_SEED` when it is set (to replay a failure),
/// else one drawn from the clock, so that repeated runs cover new inputs. `tag` tells the draws
/// of one run apart (each test, or each case of a test, passes its own). The base seed is
/// printed, and libtest shows it with the output of a failing test:
/// `LOGLINEAR_TEST_SEED=<base> cargo test …` replays the run.
///
/// # Panics
/// If the variable is set but is not an unsigned integer.
pub fn test_seed(tag: u64) -> u64 {
    let base = match std::env::var(SEED_VAR) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_VAR}={v:?} is not an unsigned integer")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    };
    eprintln!("random inputs from {SEED_VAR}={base} (tag {tag})");
    base ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Output and the gradients of `Σ o ⊙ do` of one form, on the host.
#[derive(Clone, Debug)]
pub struct FormResult {
    /// `o: [B, T, H, P]`.
    pub o: Vec<f64>,
    /// `(name, gradient)` for `q, k, v, g, lambda` (and `beta` for Gated DeltaNet).
    pub grads: Vec<(&'static str, Vec<f64>)>,
    /// Final state, when asked for.
    pub state: Option<Vec<f64>>,
}

/// Runs `form` forward and backward on `x` (which must live on an autodiff device) with the
/// output cotangent `d_o`, returning the output and all five input gradients.
pub fn run_with_grads(
    x: &LogLinearInput,
    d_o: &Tensor<4>,
    form: Form,
    initial: Option<&FenwickState>,
) -> FormResult {
    let x = x.require_grad();
    // The fused kernels return no state (asking for one selects the chunked fallback, and makes
    // the auto form choose the chunked form).
    let keeps_state = !matches!(
        form,
        Form::Fused | Form::Segmented { .. } | Form::Auto { .. }
    );
    let out = log_linear_attn(&x, form, initial, keeps_state);
    let mut result = backward_of(&x, &out.o, d_o);
    result.state = out.state.map(|s| to_f64(&s.levels));
    result
}

/// The output `o` of the op on `x` (inputs tracked) and the five input gradients of the loss
/// `Σ o ⊙ d_o`; no state.
fn backward_of(x: &LogLinearInput, o: &Tensor<4>, d_o: &Tensor<4>) -> FormResult {
    let grads = (o.clone() * d_o.clone()).sum().backward();
    FormResult {
        o: to_f64(o),
        grads: vec![
            ("dq", grad_or_zero(&x.q, x.q.grad(&grads))),
            ("dk", grad_or_zero(&x.k, x.k.grad(&grads))),
            ("dv", grad_or_zero(&x.v, x.v.grad(&grads))),
            ("dg", grad_or_zero(&x.g, x.g.grad(&grads))),
            ("dlambda", grad_or_zero(&x.lambda, x.lambda.grad(&grads))),
        ],
        state: None,
    }
}

/// Runs the Gated DeltaNet op in `form` forward and backward on `x` (which must live on an
/// autodiff device) with the output cotangent `d_o`, returning the output, the six input
/// gradients (`dq, dk, dv, dg, dbeta, dlambda`) and the final state.
pub fn run_gdn_with_grads(
    x: &GdnInput,
    d_o: &Tensor<4>,
    form: Form,
    initial: Option<&FenwickState>,
) -> FormResult {
    let x = x.require_grad();
    let out = gdn_attn(&x, form, initial, true);
    let grads = (out.o.clone() * d_o.clone()).sum().backward();
    FormResult {
        o: to_f64(&out.o),
        grads: vec![
            ("dq", grad_or_zero(&x.q, x.q.grad(&grads))),
            ("dk", grad_or_zero(&x.k, x.k.grad(&grads))),
            ("dv", grad_or_zero(&x.v, x.v.grad(&grads))),
            ("dg", grad_or_zero(&x.g, x.g.grad(&grads))),
            ("dbeta", grad_or_zero(&x.beta, x.beta.grad(&grads))),
            ("dlambda", grad_or_zero(&x.lambda, x.lambda.grad(&grads))),
        ],
        state: out.state.map(|s| to_f64(&s.levels)),
    }
}

/// The gradient of `x` as host values; an input that does not reach the output (g when T = 1
/// and L = 1) has no gradient entry: its gradient is zero.
fn grad_or_zero<const D: usize>(x: &Tensor<D>, g: Option<Tensor<D>>) -> Vec<f64> {
    g.map(|t| to_f64(&t))
        .unwrap_or_else(|| vec![0.0; x.shape().num_elements()])
}

/// `len` values drawn uniformly from `[-1, 1)` with `seed`.
pub fn uniform_values(len: usize, seed: u64) -> Vec<f64> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// Adds `U(−scale, scale)` noise to every float parameter of `module` (a different seed per
/// parameter), so that parameters initialised to zero or one (biases, `W2` of the λ-MLP, norm
/// weights) take part in a comparison. Parameters stay leaves (requiring gradients on an
/// autodiff device).
pub fn perturbed<M: burn::module::Module>(module: M, seed: u64, scale: f64) -> M {
    struct Jitter(u64, f64);
    impl burn::module::ModuleMapper for Jitter {
        fn map_float<const D: usize>(
            &mut self,
            param: burn::module::Param<Tensor<D>>,
        ) -> burn::module::Param<Tensor<D>> {
            self.0 += 1;
            let (seed, scale) = (self.0, self.1);
            param.map(|t| {
                let n = t.shape().num_elements();
                let noise = Tensor::<1>::from_data(
                    burn::tensor::TensorData::new(uniform_values(n, seed), vec![n]),
                    (&t.device(), t.dtype()),
                )
                .reshape(t.shape());
                let autodiff = t.is_autodiff();
                let t = (t + noise * scale).detach();
                if autodiff { t.require_grad() } else { t }
            })
        }
    }
    module.map(&mut Jitter(seed, scale))
}

/// Every float parameter of `module` cast to `dtype` (e.g. f64 for finite differences).
/// Parameters stay leaves (requiring gradients on an autodiff device).
pub fn cast_params<M: burn::module::Module>(module: M, dtype: DType) -> M {
    struct Cast(DType);
    impl burn::module::ModuleMapper for Cast {
        fn map_float<const D: usize>(
            &mut self,
            param: burn::module::Param<Tensor<D>>,
        ) -> burn::module::Param<Tensor<D>> {
            let dtype = self.0;
            param.map(|t| {
                let autodiff = t.is_autodiff();
                let t = t.cast(dtype).detach();
                if autodiff { t.require_grad() } else { t }
            })
        }
    }
    module.map(&mut Cast(dtype))
}

/// `[b, t]` token ids drawn uniformly from `0..vocab` with `seed`.
pub fn random_tokens(
    b: usize,
    t: usize,
    vocab: usize,
    seed: u64,
    device: &Device,
) -> Tensor<2, Int> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v: Vec<i64> = (0..b * t)
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    Tensor::from_data(burn::tensor::TensorData::new(v, vec![b, t]), device)
}

/// A host tensor uploaded as a view at the start of a larger buffer whose tail is NaN, so that a
/// kernel reading past the end of its input produces NaN (out-of-bounds reads show up as
/// non-finite results instead of passing silently).
pub fn nan_tailed<const D: usize>(
    values: &[f64],
    shape: [usize; D],
    dtype: DType,
    device: &Device,
) -> Tensor<D> {
    const TAIL: usize = 4096;
    let len = values.len();
    let mut padded = values.to_vec();
    padded.resize(len + TAIL, f64::NAN);
    let buffer: Tensor<1> = Tensor::from_data(
        burn::tensor::TensorData::new(padded, vec![len + TAIL]),
        (device, dtype),
    );
    buffer.narrow(0, 0, len).reshape(shape)
}

/// `values` rounded to `dtype` (and back to f64).
#[cfg(feature = "kernels")]
fn rounded(values: &[f64], dtype: DType) -> Vec<f64> {
    let t: Tensor<1> = Tensor::from_data(
        burn::tensor::TensorData::new(values.to_vec(), vec![values.len()]),
        (&Device::flex(), dtype),
    );
    to_f64(&t)
}

/// One check of [`Form::Fused`] on `device`: output and all five gradients against the float64
/// parallel form on the CPU, computed from the same rounded inputs (`q, k, v` and the output
/// gradient in `dtype`, `g, λ` in `g_dtype`, as mixed precision runs them), with NaN-tailed
/// device buffers and fresh random inputs from `seed`. Errors if the kernels would not run
/// (a silent fallback must not pass as a kernel check). After `o` and the five gradients come
/// the `dλ` errors per level (`dλ0`, `dλ1`, …), which localise a failure. The kernels walk the
/// whole sequence in one launch: [`check_fused_segments`] tests them over segments.
#[cfg(feature = "kernels")]
pub fn check_fused(
    device: &Device,
    dims: crate::ops::Dims,
    dtype: DType,
    g_dtype: DType,
    seed: u64,
) -> Result<Vec<(&'static str, Closeness)>, String> {
    let whole = dims.t.max(1).next_power_of_two();
    check_fused_segments(device, dims, dtype, g_dtype, seed, Some(whole))
}

/// [`check_fused`] over aligned segments of `segment` tokens (`Form::Segmented`), or with
/// `None` as `Form::Fused` runs it (gradients tracked: the segments of
/// [`crate::ops::fused::walk`] where it plans any, else one launch).
#[cfg(feature = "kernels")]
pub fn check_fused_segments(
    device: &Device,
    dims: crate::ops::Dims,
    dtype: DType,
    g_dtype: DType,
    seed: u64,
    segment: Option<usize>,
) -> Result<Vec<(&'static str, Closeness)>, String> {
    let both = |s| crate::ops::PlannedWalk {
        forward: Some(s),
        backward: Some(s),
    };
    check_fused_walk(device, dims, dtype, g_dtype, seed, segment.map(both))
}

/// [`check_fused_segments`] with each pass's walk given (`walk`), or with `None` as
/// `Form::Fused` runs it.
#[cfg(feature = "kernels")]
pub fn check_fused_walk(
    device: &Device,
    dims: crate::ops::Dims,
    dtype: DType,
    g_dtype: DType,
    seed: u64,
    walk: Option<crate::ops::PlannedWalk>,
) -> Result<Vec<(&'static str, Closeness)>, String> {
    let cpu = Device::flex().autodiff();
    let x = LogLinearInput::random(dims, seed, DType::F64, &Device::flex());
    let mut host = HostInput::from_input(&x);
    host.q = rounded(&host.q, dtype);
    host.k = rounded(&host.k, dtype);
    host.v = rounded(&host.v, dtype);
    host.g = rounded(&host.g, g_dtype);
    host.lambda = rounded(&host.lambda, g_dtype);
    let crate::ops::Dims { b, t, h, n, p, l } = dims;
    let d_o = LogLinearInput::random(
        crate::ops::Dims { n: p, ..dims },
        seed ^ 0x5eed,
        DType::F64,
        &Device::flex(),
    )
    .q;
    let d_o_host = rounded(&to_f64(&d_o), dtype);
    let x64 = host.to_input(DType::F64, &cpu);
    let d_o64 = Tensor::<4>::from_data(
        burn::tensor::TensorData::new(d_o_host.clone(), vec![b, t, h, p]),
        (&cpu, DType::F64),
    );
    // The quadratic definition up to T = 4096; beyond, its O(T²) cost on the CPU is minutes, and
    // the chunked form in f64 (equal to it to 1e-10 in tests/forms.rs) is the reference.
    let reference_form = if t <= 4096 {
        Form::Parallel
    } else {
        Form::Chunked { chunk: 64 }
    };
    let reference = run_with_grads(&x64, &d_o64, reference_form, None);

    let ad = device.clone().autodiff();
    let xd = LogLinearInput {
        q: nan_tailed(&host.q, [b, t, h, n], dtype, &ad),
        k: nan_tailed(&host.k, [b, t, h, n], dtype, &ad),
        v: nan_tailed(&host.v, [b, t, h, p], dtype, &ad),
        g: nan_tailed(&host.g, [b, t, h], g_dtype, &ad),
        lambda: nan_tailed(&host.lambda, [b, t, h, l], g_dtype, &ad),
    };
    let d_od = nan_tailed(&d_o_host, [b, t, h, p], dtype, &ad);
    let got = match walk {
        Some(walk) => {
            // As `run_with_grads`, through the op itself: no form names a mixed walk.
            let x = xd.require_grad();
            let o = crate::ops::fused::fused_walking(&x, walk)?;
            backward_of(&x, &o, &d_od)
        }
        None => {
            crate::ops::fused::fused(&xd)?;
            run_with_grads(&xd, &d_od, Form::Fused, None)
        }
    };
    let mut out = vec![("o", closeness(&reference.o, &got.o))];
    for ((name, r), (_, g)) in reference.grads.iter().zip(&got.grads) {
        out.push((*name, closeness(r, g)));
    }
    // Per-level dλ errors (relative to the largest dλ of all levels), to localise a failure.
    let (r, g) = (&reference.grads[4].1, &got.grads[4].1);
    let scale = r
        .iter()
        .fold(0f64, |m, x| m.max(x.abs()))
        .max(f64::MIN_POSITIVE);
    for (level, name) in LEVEL_NAMES.iter().enumerate().take(l) {
        let err = r
            .iter()
            .zip(g)
            .skip(level)
            .step_by(l)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        out.push((
            name,
            Closeness {
                max_rel: err / scale,
                max_abs: err,
                rms_ratio: f64::NAN,
                non_finite: false,
            },
        ));
    }
    Ok(out)
}

#[cfg(feature = "kernels")]
const LEVEL_NAMES: [&str; 24] = [
    "dλ0", "dλ1", "dλ2", "dλ3", "dλ4", "dλ5", "dλ6", "dλ7", "dλ8", "dλ9", "dλ10", "dλ11", "dλ12",
    "dλ13", "dλ14", "dλ15", "dλ16", "dλ17", "dλ18", "dλ19", "dλ20", "dλ21", "dλ22", "dλ23",
];
