//! `loglinear bench`: timings that print their figures (op, decode, train), each checking
//! correctness before it times anything.

use std::time::Instant;

use anyhow::{Result, bail};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use loglinear::fenwick::num_levels;
use loglinear::nn::{LambdaMode, LmConfig, TransformerConfig};
use loglinear::ops::{Dims, FenwickState, Form, LogLinearInput, log_linear_attn};
use loglinear::host::{HostInput, closeness};

/// Appends `text` to the report and prints it at once, so a run cut short by a time limit still
/// shows every figure it measured.
fn emit(out: &mut String, text: &str) {
    use std::io::Write;
    print!("{text}");
    std::io::stdout().flush().ok();
    out.push_str(text);
}

/// Median of `runs` timings of `f` in milliseconds, after `warmup` untimed calls; `sync` waits
/// for the device.
pub fn time_ms(warmup: usize, runs: usize, device: &Device, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    device.sync().ok();
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            device.sync().ok();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Parses `bf16`, `f16`, `f32`, `f64`.
pub fn parse_dtype(name: &str) -> Result<DType> {
    Ok(match name {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        "f32" => DType::F32,
        "f64" => DType::F64,
        other => bail!("unknown dtype {other:?}: expected bf16, f16, f32 or f64"),
    })
}

/// Settings of `bench op`.
#[derive(Clone, Debug)]
pub struct OpBench {
    /// Sequence lengths; the batch is `tokens / T` (at least 1).
    pub lengths: Vec<usize>,
    /// Tokens per call (B × T).
    pub tokens: usize,
    /// Heads.
    pub heads: usize,
    /// Key width.
    pub n: usize,
    /// Value width.
    pub p: usize,
    /// Chunk size.
    pub chunk: usize,
    /// Input dtype.
    pub dtype: DType,
    /// Timed runs per figure.
    pub runs: usize,
    /// Also time λ ≡ 1 (the Mamba-2 case of the same op).
    pub lambda_one: bool,
    /// Forms to time (`Chunked` with `chunk`, `Fused`).
    pub forms: Vec<Form>,
}

/// Parses `chunked` / `fused` / `parallel` into a [`Form`] (chunked with `chunk`).
pub fn parse_form(name: &str, chunk: usize) -> Result<Form> {
    Ok(match name {
        "chunked" => Form::Chunked { chunk },
        "fused" => Form::Fused,
        "parallel" => Form::Parallel,
        other => bail!("unknown form {other:?}: expected chunked, fused or parallel"),
    })
}

/// Worst max-relative error over `o` and the five gradients of `form` on `device` against the
/// f64 parallel form on the CPU (B = 2, T = 512, H = 3).
pub fn check_form(device: &Device, form: Form, dtype: DType, n: usize, p: usize) -> Result<f64> {
    match form {
        Form::Fused if has_kernels(device) => check_fused_op(device, dtype, n, p),
        // Elsewhere the fused form is the chunked fallback: checked as any tensor form.
        Form::Chunked { .. } | Form::Fused => check_op(device, form, dtype, n, p),
        other => bail!("no correctness check for the {other} form"),
    }
}

/// Whether the fused kernels run on `device` (a build with kernels and a CubeCL device).
fn has_kernels(device: &Device) -> bool {
    #[cfg(feature = "kernels")]
    {
        loglinear::kernels::is_cube_device(device)
    }
    #[cfg(not(feature = "kernels"))]
    {
        let _ = device;
        false
    }
}

#[cfg(feature = "kernels")]
fn check_fused_op(device: &Device, dtype: DType, n: usize, p: usize) -> Result<f64> {
    let dims = Dims {
        b: 2,
        t: 512,
        h: 3,
        n,
        p,
        l: num_levels(512),
    };
    let results = loglinear::testing::check_fused(device, dims, dtype, dtype, fresh_seed())
        .map_err(|why| anyhow::anyhow!("the fused kernels do not run on {device:?}: {why}"))?;
    let mut worst = 0f64;
    for (name, c) in results.into_iter().take(6) {
        if c.non_finite {
            bail!("fused form on {device:?}: {name} is non-finite");
        }
        worst = worst.max(c.max_rel);
    }
    Ok(worst)
}

#[cfg(not(feature = "kernels"))]
fn check_fused_op(device: &Device, dtype: DType, n: usize, p: usize) -> Result<f64> {
    check_op(device, Form::Fused, dtype, n, p)
}

/// A seed that differs between runs, so checks draw fresh inputs each time (printed with the
/// results so a failure can be replayed; `LOGLINEAR_TEST_SEED` fixes it, as in the tests).
pub fn fresh_seed() -> u64 {
    loglinear::testing::test_seed(0)
}

/// `loglinear bench kernels`: the fused kernels against the f64 parallel form on the CPU at
/// awkward shapes (T = 1, 70, 200, 4096; N, P ∈ {16, 64, 128}), f32 and bf16, output and all
/// gradients, NaN-tailed input buffers, fresh inputs. Fails if any case is off or the kernels
/// would not run.
#[cfg(feature = "kernels")]
pub fn bench_kernels(device: &Device) -> Result<String> {
    let seed = fresh_seed();
    let mut out = String::new();
    emit(
        &mut out,
        &format!(
            "fused kernels on {device:?} vs f64 parallel on the CPU, seed {seed}\n\n\
         | q, k, v / g, λ | T | B | H | N | P | max-rel (o, dq, dk, dv, dg, dλ) | tolerance | |\n\
         |---|---|---|---|---|---|---|---|---|\n"
        ),
    );
    let mut failed = 0;
    // N = 20 is no multiple of the tensor-core tile: bf16 inputs take the scalar kernels there,
    // so both kernel families are checked in both dtypes.
    let widths = [
        (16, 16),
        (64, 64),
        (128, 64),
        (64, 128),
        (128, 128),
        (20, 36),
    ];
    let mut case = 0u64;
    // bf16 q, k, v with f32 g and λ: what mixed-precision training passes.
    for (dtype, g_dtype) in [(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
        let tol = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
        for t in [1usize, 70, 200, 4096] {
            for &(n, p) in &widths {
                if t == 4096 && (n, p) != (128, 64) && (n, p) != (16, 16) {
                    continue;
                }
                let (b, h) = if t == 4096 { (1, 2) } else { (2, 2) };
                let dims = Dims {
                    b,
                    t,
                    h,
                    n,
                    p,
                    l: num_levels(t),
                };
                case += 1;
                let results =
                    loglinear::testing::check_fused(device, dims, dtype, g_dtype, seed + case)
                        .map_err(|why| {
                            anyhow::anyhow!("{dims:?}: the kernels do not run: {why}")
                        })?;
                // At T = 1, dg is exactly 0 (the first decay never matters) and the kernels' f32
                // cancellation leaves ~1e-4 absolute: checked absolutely.
                let (main, by_level) = results.split_at(6);
                let judged = |(name, c): &(&str, loglinear::host::Closeness)| {
                    if *name == "dg" && t == 1 {
                        c.max_abs <= 1e-3
                    } else {
                        !c.non_finite && c.max_rel <= tol
                    }
                };
                let bad = !main.iter().all(judged);
                failed += usize::from(bad);
                let worst: Vec<String> = main
                    .iter()
                    .map(|(_, c)| format!("{:.1e}", c.max_rel))
                    .collect();
                let mut note = String::new();
                if bad {
                    let levels: Vec<String> = by_level
                        .iter()
                        .map(|(name, c)| format!("{name} {:.1e}", c.max_rel))
                        .collect();
                    note = format!(" (dλ per level: {})", levels.join(", "));
                }
                emit(
                    &mut out,
                    &format!(
                        "| {dtype:?} / {g_dtype:?} | {t} | {b} | {h} | {n} | {p} | {} | {tol:.0e} | {}{note} |\n",
                        worst.join(", "),
                        if bad { "FAIL" } else { "ok" }
                    ),
                );
            }
        }
    }
    if failed > 0 {
        bail!("{failed} case(s) failed (table above)");
    }
    Ok(out)
}

/// Checks the chunked form on `device` against the f64 parallel form on the CPU (T = 512,
/// a few heads), outputs and all gradients; returns the worst relative error.
pub fn check_op(device: &Device, form: Form, dtype: DType, n: usize, p: usize) -> Result<f64> {
    let dims = Dims {
        b: 2,
        t: 512,
        h: 3,
        n,
        p,
        l: num_levels(512),
    };
    let cpu = Device::flex().autodiff();
    let x = LogLinearInput::random(dims, 7, DType::F64, &cpu);
    let d_o = LogLinearInput::random(Dims { n: p, ..dims }, 8, DType::F64, &cpu).q;
    let reference = loglinear::testing::run_with_grads(&x, &d_o, Form::Parallel, None);
    let host = HostInput::from_input(&x);
    let ad = device.clone().autodiff();
    let xd = host.to_input(dtype, &ad);
    let dod = Tensor::<4>::from_data(d_o.to_data(), (&ad, dtype));
    let got = loglinear::testing::run_with_grads(&xd, &dod, form, None);
    let mut worst = closeness(&reference.o, &got.o).max_rel;
    for ((name, r), (_, g)) in reference.grads.iter().zip(&got.grads) {
        let c = closeness(r, g);
        if c.non_finite || g.iter().all(|v| *v == 0.0) {
            bail!("{form} form on {device:?}: {name} is non-finite or zero");
        }
        worst = worst.max(c.max_rel);
    }
    Ok(worst)
}

/// Rough floating-point work of the chunked form (forward): intra-chunk `T·C·(N+P)` and one
/// `T·N·P` product per level above the chunk, ×2 for multiply-add, per head.
pub fn chunked_flops(b: usize, t: usize, h: usize, n: usize, p: usize, chunk: usize) -> f64 {
    let levels = num_levels(t).saturating_sub(chunk.trailing_zeros() as usize + 1);
    let per_head =
        t as f64 * chunk as f64 * (n + p) as f64 + levels as f64 * t as f64 * (n * p) as f64 * 2.0;
    2.0 * b as f64 * h as f64 * per_head
}

/// Runs `bench op`: correctness first, then forward and forward+backward medians per T.
pub fn bench_op(cfg: &OpBench, device: &Device) -> Result<String> {
    let tol = if matches!(cfg.dtype, DType::F32 | DType::F64) {
        1e-3
    } else {
        3e-2
    };
    let mut out = String::new();
    for &form in &cfg.forms {
        let err = check_form(device, form, cfg.dtype, cfg.n.min(128), cfg.p.min(128))?;
        emit(
            &mut out,
            &format!(
                "correctness: {form} on {device:?} in {:?} vs f64 parallel on the CPU (B=2, T=512, \
             H=3): worst max-relative error over o and all gradients {err:.2e} (tolerance \
             {tol:.0e})\n",
                cfg.dtype
            ),
        );
        if err > tol {
            bail!("correctness check failed; no timings taken");
        }
    }
    emit(
        &mut out,
        &format!(
            "\nshape: H={}, N={}, P={}, chunk {}, {:?}, B×T = {}; median of {} runs after warm-up; \
         TFLOP/s counts the chunkwise algorithm's products, GB/s the bytes of q, k, v, g, λ and o\n\n",
            cfg.heads, cfg.n, cfg.p, cfg.chunk, cfg.dtype, cfg.tokens, cfg.runs
        ),
    );
    emit(
        &mut out,
        "| form | T | B | λ | fwd ms | fwd+bwd ms | fwd tokens/s | fwd TFLOP/s | fwd GB/s |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for &t in &cfg.lengths {
        let b = (cfg.tokens / t).max(1);
        let dims = Dims {
            b,
            t,
            h: cfg.heads,
            n: cfg.n,
            p: cfg.p,
            l: num_levels(t),
        };
        let modes: &[bool] = if cfg.lambda_one {
            &[false, true]
        } else {
            &[false]
        };
        for (&form, &ones) in cfg
            .forms
            .iter()
            .flat_map(|f| modes.iter().map(move |o| (f, o)))
        {
            let mut x = LogLinearInput::random(dims, t as u64, cfg.dtype, device);
            if ones {
                x.lambda = x.lambda.ones_like();
            }
            let fwd = time_ms(2, cfg.runs, device, || {
                let _ = log_linear_attn(&x, form, None, false).o;
            });
            let xa = LogLinearInput {
                q: Tensor::from_inner(x.q.clone()).require_grad(),
                k: Tensor::from_inner(x.k.clone()).require_grad(),
                v: Tensor::from_inner(x.v.clone()).require_grad(),
                g: Tensor::from_inner(x.g.clone()).require_grad(),
                lambda: Tensor::from_inner(x.lambda.clone()).require_grad(),
            };
            let bwd = time_ms(2, cfg.runs, device, || {
                let o = log_linear_attn(&xa, form, None, false).o;
                let _ = o.sum().backward();
            });
            let fallback = form == Form::Fused && !has_kernels(device);
            let chunk = match form {
                Form::Chunked { chunk } => chunk,
                _ if fallback => 64,
                _ => 32,
            };
            let label = if fallback {
                "fused (chunked fallback)".to_string()
            } else {
                form.to_string()
            };
            let flops = chunked_flops(b, t, cfg.heads, cfg.n, cfg.p, chunk);
            let elem = match cfg.dtype {
                DType::F64 => 8.0,
                DType::F32 => 4.0,
                _ => 2.0,
            };
            let bytes = elem
                * (b * t * cfg.heads) as f64
                * (2 * cfg.n + 2 * cfg.p + 1 + num_levels(t)) as f64;
            emit(
                &mut out,
                &format!(
                    "| {label} | {t} | {b} | {} | {fwd:.2} | {bwd:.2} | {:.0} | {:.1} | {:.0} |\n",
                    if ones { "≡1" } else { "learned" },
                    (b * t) as f64 / (fwd / 1e3),
                    flops / (fwd / 1e3) / 1e12,
                    bytes / (fwd / 1e3) / 1e9
                ),
            );
            if ones && form == Form::Fused && !fallback {
                mamba2_row(&mut out, &x, b, t, cfg.runs, device)?;
            }
        }
    }
    Ok(out)
}

/// The λ ≡ 1 baseline without the Fenwick levels: our fused Mamba-2 (one state; on tensor cores
/// where they run), forward only, checked first against the log-linear op with λ ≡ 1 on the same
/// inputs.
#[cfg(feature = "kernels")]
fn mamba2_row(
    out: &mut String,
    x: &LogLinearInput,
    b: usize,
    t: usize,
    runs: usize,
    device: &Device,
) -> Result<()> {
    let o = match loglinear::kernels::mamba2(x) {
        Ok(o) => o,
        Err(why) => {
            emit(
                out,
                &format!("| fused Mamba-2 | {t} | {b} | – | cannot run: {why} | | | | |\n"),
            );
            return Ok(());
        }
    };
    let reference = log_linear_attn(x, Form::Fused, None, false).o;
    let scale = reference.clone().abs().max().into_scalar::<f64>();
    let err = (o - reference).abs().max().into_scalar::<f64>() / scale.max(1e-30);
    if err > 3e-2 {
        bail!("fused Mamba-2 differs from the op with λ ≡ 1 by {err:.2e} of the largest entry");
    }
    let fwd = time_ms(2, runs, device, || {
        let _ = loglinear::kernels::mamba2(x);
    });
    emit(
        out,
        &format!(
            "| fused Mamba-2 (one state; vs λ ≡ 1 op: {err:.1e}) | {t} | {b} | – | {fwd:.2} | – | {:.0} | | |\n",
            (b * t) as f64 / (fwd / 1e3)
        ),
    );
    Ok(())
}

#[cfg(not(feature = "kernels"))]
fn mamba2_row(
    _out: &mut String,
    _x: &LogLinearInput,
    _b: usize,
    _t: usize,
    _runs: usize,
    _device: &Device,
) -> Result<()> {
    Ok(())
}

/// Per-token decoding latency and cache size of the log-linear model against a softmax
/// Transformer's KV cache, at several context lengths.
///
/// The states are built at the target position directly (random contents, the right shapes):
/// a decoding step costs the same whatever the numbers in the cache, so the latency is that of a
/// real cache at that context, without prefilling it first.
pub fn bench_decode(
    contexts: &[usize],
    d_model: usize,
    layers: usize,
    steps: usize,
    device: &Device,
) -> Result<String> {
    let vocab = 50257;
    let heads = d_model / 64;
    // Each context gets a model with just the levels it needs, num_levels(context + steps + 1),
    // as a deployment would size its cache: that is where the O(log T) growth shows.
    let model_for = |context: usize| {
        let mut config = LmConfig::new(vocab, d_model, layers);
        config.mixer.expand = 1;
        config.mixer.lambda.mode = LambdaMode::MlpSoftplus;
        config.mixer.lambda.levels = num_levels(context + steps + 1);
        config.init(0, device)
    };
    let tconfig = TransformerConfig {
        max_seq_len: contexts.iter().max().unwrap_or(&1) + steps + 1,
        ..TransformerConfig::new(vocab, d_model, layers, heads)
    };
    let transformer = tconfig.init(0, device);
    let token = Tensor::<1, Int>::from_data(TensorData::new(vec![42i64], vec![1]), device);
    let mut out = String::new();
    emit(
        &mut out,
        &format!(
            "decoding, batch 1, D = {d_model}, {layers} layers, {heads} heads × 64, vocab {vocab}, \
         on {device:?}; median per-token latency over {steps} steps\n\n\
         | context | λ levels | log-linear ms/token | log-linear cache bytes | Transformer ms/token | KV cache bytes |\n|---|---|---|---|---|---|\n"
        ),
    );
    for &c in contexts {
        let model = model_for(c);
        let levels = model.config.mixer.lambda.levels;
        let mut state = model.init_state(1, device);
        for layer in &mut state.layers {
            let dims = layer.fenwick.levels.dims();
            layer.fenwick = FenwickState {
                levels: Tensor::random(dims, burn::tensor::Distribution::Normal(0.0, 0.01), device),
                position: c,
            };
        }
        let bytes = state.size_bytes();
        let ll = time_ms(2, steps, device, || {
            let mut s = state.clone();
            let _ = model.step(token.clone(), &mut s);
        });
        // Transformer: a KV cache of c positions (prefilled in pieces to bound memory).
        let mut tstate = transformer.init_state(1, device);
        let mut done = 0;
        while done < c {
            let len = (c - done).min(4096);
            let ids: Vec<i64> = (0..len).map(|i| ((done + i) % vocab) as i64).collect();
            let piece = Tensor::<2, Int>::from_data(TensorData::new(ids, vec![1, len]), device);
            let _ = transformer.extend(piece, &mut tstate);
            done += len;
        }
        let tbytes = tstate.size_bytes();
        let tt = time_ms(2, steps, device, || {
            let mut s = tstate.clone();
            let _ = transformer.step(token.clone(), &mut s);
        });
        emit(
            &mut out,
            &format!("| {c} | {levels} | {ll:.3} | {bytes} | {tt:.3} | {tbytes} |\n"),
        );
    }
    Ok(out)
}

/// Median training-step time and throughput of the LM for λ modes (and the Transformer).
#[allow(clippy::too_many_arguments)]
pub fn bench_train(
    d_model: usize,
    layers: usize,
    seq_len: usize,
    batch: usize,
    modes: &[String],
    runs: usize,
    precision: &str,
    form: &str,
    device: &Device,
) -> Result<String> {
    use crate::config::{Arch, ExperimentConfig};
    use crate::model::{Model, masked_cross_entropy};
    use burn::optim::GradientsParams;
    let vocab = 50257;
    let mut out = String::new();
    emit(
        &mut out,
        &format!(
            "training step (forward, loss, backward, AdamW), D = {d_model}, {layers} layers, T = {seq_len}, batch {batch}, \
         vocab {vocab}, precision {precision}, core op {form}, on {device:?}; median of {runs} steps \
         after 2 warm-up steps\n\n\
         | model | ms/step | tokens/s | params | memory reserved |\n|---|---|---|---|---|\n"
        ),
    );
    let ad = device.clone().autodiff();
    for mode in modes {
        let text = format!(
            "name = \"bench\"\n[task.lm]\ndata = \".\"\nseq_len = {seq_len}\n[model]\narch = \"{}\"\nlambda = \"{}\"\nd_model = {d_model}\nn_layers = {layers}\nheads = {}\nexpand = 1\nd_state = 128\nhead_dim = 64\nlevels = {levels}\nprecision = \"{precision}\"\nform = \"{form}\"\n[train]\nbatch_size = {batch}\ntrain_examples = {batch}\n",
            if mode == "transformer" {
                "transformer"
            } else {
                "mamba2"
            },
            if mode == "transformer" {
                "linear"
            } else {
                mode.as_str()
            },
            d_model / 64,
            levels = num_levels(seq_len).max(15),
        );
        let cfg: ExperimentConfig = crate::config::typed(toml::from_str(&text)?)?;
        let arch_name = if cfg.model.arch == Arch::Transformer {
            "transformer (softmax)".to_string()
        } else {
            format!("log-linear Mamba-2, λ {mode}, {}", cfg.model.form_on(&ad))
        };
        let mut model = Model::new(&cfg, &ad);
        let params = burn::module::Module::num_params(&model);
        let mut optim = crate::train::optimizer(&cfg.train);
        let ids: Vec<i64> = (0..batch * seq_len)
            .map(|i| (i * 7919 % vocab) as i64)
            .collect();
        let inputs =
            Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), vec![batch, seq_len]), &ad);
        let targets = Tensor::<2, Int>::from_data(TensorData::new(ids, vec![batch, seq_len]), &ad);
        let form = cfg.model.form_on(&ad);
        let mut step = || {
            let logits = model.forward(inputs.clone(), form, false).logits;
            let (loss, _) = masked_cross_entropy(logits, targets.clone());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-4, model.clone(), grads);
        };
        let ms = time_ms(2, runs, device, &mut step);
        let reserved = device.memory_pool_usage().map_or("n/a".to_string(), |u| {
            format!("{:.2} GiB", u.bytes_reserved as f64 / (1u64 << 30) as f64)
        });
        emit(
            &mut out,
            &format!(
                "| {arch_name} | {ms:.1} | {:.0} | {params} | {reserved} |\n",
                (batch * seq_len) as f64 / (ms / 1e3)
            ),
        );
    }
    Ok(out)
}
