//! A pack of synthetic-task models computes, replica by replica, what each model computes alone:
//! the logits, and the gradient of every parameter (so training a pack trains each model as it
//! would train alone). Awkward lengths (a partial last chunk), mixed λ modes of one layout, and
//! weights perturbed away from the init (the λ-MLP's zero W2 would hide its other gradients).

use burn::module::{ModuleMapper, Param};
use burn::prelude::*;
use burn::tensor::TensorData;
use loglinear::nn::{
    LambdaConfig, LambdaMode, PackedSyntheticLm, SyntheticConfig, SyntheticLm, packable,
};
use loglinear::ops::Form;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// A fresh seed per run, printed; `LOGLINEAR_TEST_SEED` replays one.
fn seed() -> u64 {
    let seed = std::env::var("LOGLINEAR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    eprintln!("seed {seed} (LOGLINEAR_TEST_SEED={seed} replays it)");
    seed
}

fn config(mode: LambdaMode) -> SyntheticConfig {
    SyntheticConfig {
        vocab_size: 19,
        d_model: 12,
        n_layers: 2,
        heads: 2,
        d_state: 8,
        head_dim: 4,
        lambda: LambdaConfig {
            mode,
            levels: 6,
            mlp_hidden: 5,
            init: loglinear::nn::LambdaInit::Identity,
        },
        initializer_range: 0.3,
        precision: Default::default(),
        mixer: Default::default(),
    }
}

/// Adds N(0, 0.2²) noise to every parameter (a fresh leaf on the parameter's own device).
struct Perturb(StdRng, Device);

impl ModuleMapper for Perturb {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let noise: Vec<f32> = (0..shape.num_elements())
            .map(|_| 0.2 * self.0.sample::<f32, _>(StandardNormal))
            .collect();
        let noise = Tensor::<D>::from_data(TensorData::new(noise, shape), &self.1);
        let value = (tensor + noise).detach();
        let value = if value.is_autodiff() {
            value.require_grad()
        } else {
            value
        };
        Param::from_mapped_value(id, value, mapper)
    }
}

fn models(modes: &[LambdaMode], seed: u64, device: &Device) -> Vec<SyntheticLm> {
    modes
        .iter()
        .enumerate()
        .map(|(r, &mode)| {
            let model = config(mode).init(seed + r as u64, device);
            model.map(&mut Perturb(
                StdRng::seed_from_u64(seed ^ (r as u64 + 7)),
                device.clone(),
            ))
        })
        .collect()
}

fn tokens(r: usize, b: usize, t: usize, seed: u64, device: &Device) -> Tensor<3, Int> {
    let mut rng = StdRng::seed_from_u64(seed);
    let ids: Vec<i64> = (0..r * b * t).map(|_| rng.random_range(0..19)).collect();
    Tensor::from_data(TensorData::new(ids, [r, b, t]), device)
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 values")
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= tol * scale && got.iter().all(|x| x.is_finite()),
        "{what}: worst difference {worst:e} of largest {scale:e} (tolerance {tol:e} relative)"
    );
}

#[test]
fn pack_logits_are_each_models_logits() {
    let device = Device::flex();
    let seed = seed();
    for (modes, t) in [
        (
            vec![
                LambdaMode::MlpSoftplus,
                LambdaMode::MlpSoftmax,
                LambdaMode::MlpSoftplus,
            ],
            7,
        ),
        (vec![LambdaMode::Linear, LambdaMode::Linear], 13),
        (
            vec![LambdaMode::Ones, LambdaMode::Ones, LambdaMode::Ones],
            1,
        ),
        (vec![LambdaMode::MlpSoftmax], 9),
    ] {
        let ms = models(&modes, seed, &device);
        let pack = PackedSyntheticLm::stack(&ms);
        let x = tokens(modes.len(), 3, t, seed, &device);
        let form = Form::Chunked { chunk: 4 };
        let logits = pack.run(x.clone(), form);
        assert_eq!(logits.dims(), [modes.len(), 3, t, 19]);
        for (r, m) in ms.iter().enumerate() {
            let own = m
                .run(x.clone().narrow(0, r, 1).squeeze_dim(0), form, false)
                .0;
            let packed = logits.clone().narrow(0, r, 1).squeeze_dim::<3>(0);
            assert_close(
                &format!("{modes:?} T={t} replica {r} logits"),
                &values(packed),
                &values(own),
                1e-5,
            );
            // Unpacking gives the model back.
            let back = pack
                .replica(r)
                .run(x.clone().narrow(0, r, 1).squeeze_dim(0), form, false)
                .0;
            assert_close(
                &format!("replica {r} unpacked"),
                &values(back),
                &values(
                    m.run(x.clone().narrow(0, r, 1).squeeze_dim(0), form, false)
                        .0,
                ),
                0.0,
            );
        }
    }
}

/// Gradients of a weighted sum of the logits, packed vs alone, for every parameter.
#[test]
fn pack_gradients_are_each_models_gradients() {
    let device = Device::flex().autodiff();
    let seed = seed();
    let modes = [
        LambdaMode::MlpSoftplus,
        LambdaMode::MlpSoftmax,
        LambdaMode::MlpSoftplus,
    ];
    let (r, b, t) = (modes.len(), 2, 11);
    let ms = models(&modes, seed, &device);
    let pack = PackedSyntheticLm::stack(&ms);
    let x = tokens(r, b, t, seed, &device);
    let mut rng = StdRng::seed_from_u64(seed ^ 99);
    let w: Vec<f32> = (0..r * b * t * 19)
        .map(|_| rng.sample(StandardNormal))
        .collect();
    let w = Tensor::<4>::from_data(TensorData::new(w, [r, b, t, 19]), &device);
    let form = Form::Chunked { chunk: 4 };
    let grads = (pack.run(x.clone(), form) * w.clone()).sum().backward();

    // Every parameter of the pack, in visiting order, against the same parameter of each model.
    struct Collect<'a>(
        &'a burn::tensor::Gradients,
        Vec<(String, Vec<usize>, Vec<f32>)>,
        Vec<String>,
    );
    impl burn::module::ModuleVisitor for Collect<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.2.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.2.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let g = param.val().grad(self.0).unwrap_or_else(|| {
                panic!(
                    "{}: no gradient (require_grad {})",
                    self.2.join("."),
                    param.val().is_require_grad()
                )
            });
            self.1
                .push((self.2.join("."), g.dims().to_vec(), values(g)));
        }
    }
    let mut packed = Collect(&grads, Vec::new(), Vec::new());
    pack.visit(&mut packed);
    assert!(packed.1.len() >= 20, "the pack has every parameter");
    for (i, m) in ms.iter().enumerate() {
        let own_grads = (m
            .run(x.clone().narrow(0, i, 1).squeeze_dim(0), form, false)
            .0
            * w.clone().narrow(0, i, 1).squeeze_dim::<3>(0))
        .sum()
        .backward();
        let mut own = Collect(&own_grads, Vec::new(), Vec::new());
        m.visit(&mut own);
        assert_eq!(own.1.len(), packed.1.len(), "same parameters");
        for ((path, dims, g), (own_path, _, want)) in packed.1.iter().zip(&own.1) {
            assert_eq!(
                path, own_path,
                "parameters in the same order under the same names"
            );
            let per = g.len() / dims[0];
            let slice = &g[i * per..(i + 1) * per];
            assert!(
                want.iter().any(|v| *v != 0.0),
                "{path}: a non-zero gradient to compare"
            );
            assert_close(&format!("replica {i} d{path}"), slice, want, 2e-5);
        }
    }
}

#[test]
fn packable_names_what_differs() {
    let a = config(LambdaMode::Linear);
    let mut b = a.clone();
    b.d_model = 16;
    assert!(packable(&[a.clone(), b]).unwrap_err().contains("d_model"));
    let c = config(LambdaMode::MlpSoftplus);
    assert!(
        packable(&[a.clone(), c])
            .unwrap_err()
            .contains("lambda.mode")
    );
    assert!(
        packable(&[
            config(LambdaMode::MlpSoftmax),
            config(LambdaMode::MlpSoftplus)
        ])
        .is_ok()
    );
    // The packed model runs the Mamba-2 op only: a Gated DeltaNet model does not pack, even alone.
    let gdn = SyntheticConfig {
        mixer: loglinear::nn::MixerKind::GatedDeltaNet,
        ..config(LambdaMode::Linear)
    };
    let why = packable(std::slice::from_ref(&gdn)).unwrap_err();
    assert!(
        why.contains("gated_deltanet") && why.contains("Mamba-2"),
        "{why}"
    );
}
