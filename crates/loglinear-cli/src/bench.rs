//! `loglinear bench`: timings that print their figures (op, decode, train), each checking
//! correctness before it times anything.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use loglinear::fenwick::num_levels;
use loglinear::host::{HostInput, closeness};
use loglinear::nn::{LambdaMode, LmConfig, MixerConfig, TransformerConfig};
use loglinear::ops::{Dims, FenwickState, Form, LogLinearInput, log_linear_attn};

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
    /// Which op: log-linear Mamba-2 (with fused kernels) or log-linear Gated DeltaNet (the
    /// chunked tensor form only: there are no Gated DeltaNet kernels).
    pub variant: OpVariant,
}

/// The op `bench op` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpVariant {
    /// Log-linear Mamba-2 (`log_linear_attn`).
    Mamba2,
    /// Log-linear Gated DeltaNet (`gdn_attn`).
    Gdn,
}

/// Parses `chunked` / `fused` / `segmented:S` / `parallel` into a [`Form`] (chunked with
/// `chunk`; `segmented:S` the fused kernels over aligned segments of S tokens).
pub fn parse_form(name: &str, chunk: usize) -> Result<Form> {
    if let Some(segment) = name.strip_prefix("segmented:") {
        let segment: usize = segment
            .parse()
            .ok()
            .filter(|s: &usize| s.is_power_of_two())
            .with_context(|| {
                format!(
                    "form {name:?}: the segment length must be a power of two (e.g. segmented:2048)"
                )
            })?;
        return Ok(Form::Segmented { segment });
    }
    Ok(match name {
        "chunked" => Form::Chunked { chunk },
        "fused" => Form::Fused,
        "parallel" => Form::Parallel,
        other => bail!(
            "unknown form {other:?}: expected chunked, fused, segmented:S (S a power of two) or \
             parallel"
        ),
    })
}

/// Worst max-relative error over `o` and the five gradients of `form` on `device` against the
/// f64 parallel form on the CPU (B = 2, T = 512, H = 3; the fused kernels also at B = 2, T = 300,
/// H = 132, see `check_fused_op`).
pub fn check_form(device: &Device, form: Form, dtype: DType, n: usize, p: usize) -> Result<f64> {
    match form {
        Form::Fused if has_kernels(device) => check_fused_op(device, dtype, n, p, None),
        // The check's T = 512 in segments of at most 128 tokens, so that segments are checked.
        Form::Segmented { segment } if has_kernels(device) => {
            check_fused_op(device, dtype, n, p, Some(segment.min(128)))
        }
        // Elsewhere the fused forms are the chunked fallback: checked as any tensor form.
        Form::Chunked { .. } | Form::Fused | Form::Segmented { .. } => {
            check_op(device, form, dtype, n, p)
        }
        other => bail!("no correctness check for the {other} form"),
    }
}

/// Whether `form` runs the fused kernels where they exist.
fn kernel_form(form: Form) -> bool {
    matches!(form, Form::Fused | Form::Segmented { .. })
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

/// The kernels' check: whole sequences (`segment = None`) or aligned segments, at two shapes:
/// B·H = 6 rows, where the planner narrows the value tile to fill the card, and B·H = 264 rows
/// (two per multiprocessor of an H100 or H200), which keep the widest tile — the one the anchors'
/// shapes are timed with (`CHECK_SHAPES`).
#[cfg(feature = "kernels")]
fn check_fused_op(
    device: &Device,
    dtype: DType,
    n: usize,
    p: usize,
    segment: Option<usize>,
) -> Result<f64> {
    let mut worst = 0f64;
    for (b, t, h) in CHECK_SHAPES {
        let dims = Dims {
            b,
            t,
            h,
            n,
            p,
            l: num_levels(t),
        };
        let results = loglinear::testing::check_fused_segments(
            device,
            dims,
            dtype,
            dtype,
            fresh_seed(),
            segment,
        )
        .map_err(|why| anyhow::anyhow!("the fused kernels do not run on {device:?}: {why}"))?;
        for (name, c) in results.into_iter().take(6) {
            if c.non_finite {
                bail!("fused form on {device:?} at {dims:?}: {name} is non-finite");
            }
            worst = worst.max(c.max_rel);
        }
    }
    Ok(worst)
}

/// (B, T, H) of the fused kernels' check in `bench op`.
#[cfg(feature = "kernels")]
const CHECK_SHAPES: [(usize, usize, usize); 2] = [(2, 512, 3), (2, 300, 132)];

#[cfg(not(feature = "kernels"))]
fn check_fused_op(
    device: &Device,
    dtype: DType,
    n: usize,
    p: usize,
    _segment: Option<usize>,
) -> Result<f64> {
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
    worst_error(&reference, &got, &format!("{form} form on {device:?}"))
}

/// Worst max-relative error of `got` against `reference` over the output and every gradient;
/// an error naming `what` if a gradient is non-finite or all zero (a path that never ran).
fn worst_error(
    reference: &loglinear::testing::FormResult,
    got: &loglinear::testing::FormResult,
    what: &str,
) -> Result<f64> {
    let mut worst = closeness(&reference.o, &got.o).max_rel;
    for ((name, r), (_, g)) in reference.grads.iter().zip(&got.grads) {
        let c = closeness(r, g);
        if c.non_finite || g.iter().all(|v| *v == 0.0) {
            bail!("{what}: {name} is non-finite or zero");
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

/// Rough floating-point work of the chunked form's forward and backward together, counted as
/// [`chunked_flops`]: the backward recomputes the scores and forms `dO Vᵀ` and the three
/// in-chunk gradient products (`T·C·(3N+2P)`), and per level above the chunk rebuilds the
/// forward's states and reads them for `dq`, builds the anticausal states and reads them for
/// `dk` and `dv` (`5·T·N·P`). Per head, ×2 for multiply-add.
pub fn chunked_train_flops(b: usize, t: usize, h: usize, n: usize, p: usize, chunk: usize) -> f64 {
    let levels = num_levels(t).saturating_sub(chunk.trailing_zeros() as usize + 1);
    let backward = t as f64 * chunk as f64 * (3 * n + 2 * p) as f64
        + 5.0 * levels as f64 * t as f64 * (n * p) as f64;
    chunked_flops(b, t, h, n, p, chunk) + 2.0 * b as f64 * h as f64 * backward
}

/// Runs `bench op`: correctness first, then forward and forward+backward medians per T.
pub fn bench_op(cfg: &OpBench, device: &Device) -> Result<String> {
    if cfg.variant == OpVariant::Gdn {
        return bench_gdn_op(cfg, device);
    }
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
             H=3{}): worst max-relative error over o and all gradients {err:.2e} (tolerance \
             {tol:.0e})\n",
                cfg.dtype,
                if kernel_form(form) && has_kernels(device) {
                    "; and B=2, T=300, H=132 at the widest value tile"
                } else {
                    ""
                }
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
         TFLOP/s counts the chunkwise algorithm's products (forward, and forward with backward), \
         GB/s the bytes of q, k, v, g, λ and o\n\n",
            cfg.heads, cfg.n, cfg.p, cfg.chunk, cfg.dtype, cfg.tokens, cfg.runs
        ),
    );
    emit(
        &mut out,
        "| form | T | B | λ | fwd ms | fwd+bwd ms | fwd tokens/s | fwd TFLOP/s | fwd+bwd TFLOP/s | fwd GB/s |\n|---|---|---|---|---|---|---|---|---|---|\n",
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
            let fallback =
                matches!(form, Form::Fused | Form::Segmented { .. }) && !has_kernels(device);
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
            let train_flops = chunked_train_flops(b, t, cfg.heads, cfg.n, cfg.p, chunk);
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
                    "| {label} | {t} | {b} | {} | {fwd:.2} | {bwd:.2} | {:.0} | {:.1} | {:.1} | {:.0} |\n",
                    if ones { "≡1" } else { "learned" },
                    (b * t) as f64 / (fwd / 1e3),
                    flops / (fwd / 1e3) / 1e12,
                    train_flops / (bwd / 1e3) / 1e12,
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
    let o = match loglinear::ops::fused::mamba2(x) {
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
        let _ = loglinear::ops::fused::mamba2(x);
    });
    emit(
        out,
        &format!(
            "| fused Mamba-2 (one state; vs λ ≡ 1 op: {err:.1e}) | {t} | {b} | – | {fwd:.2} | – | {:.0} | | | |\n",
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
        let mut config = LmConfig::new(vocab, layers, MixerConfig::new(d_model));
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

/// Settings of `bench train`.
#[derive(Clone, Debug)]
pub struct TrainBench {
    /// Model width (heads of 64).
    pub d_model: usize,
    /// Layers.
    pub layers: usize,
    /// Sequence length.
    pub seq_len: usize,
    /// Batch size.
    pub batch: usize,
    /// λ modes and/or `transformer`.
    pub modes: Vec<String>,
    /// Timed steps (median).
    pub runs: usize,
    /// `bf16` or `full`.
    pub precision: String,
    /// `auto`, `chunked` or `fused`.
    pub form: String,
    /// Steps to profile kernel by kernel after the timed ones (0: none; GPU builds only).
    pub profile_steps: usize,
    /// Before timing, train a small model of each mode for a few steps here and on the CPU in
    /// f32 and compare the loss curves.
    pub check: bool,
}

/// `bench train --device cuda:0,cuda:1`: for each mode, the data-parallel training step
/// ([`crate::data_parallel::Replicas::step`]) on the first device alone with `batch` rows, then on
/// all `devices` with `batch` rows each (the global batch grows with the devices, as in weak
/// scaling); tokens/s and the scaling efficiency `tokens/s(N) / (N · tokens/s(1))`, and whether
/// the replicas are still identical after the timed steps.
pub fn bench_train_data_parallel(
    cfg: &TrainBench,
    devices: &[Device],
    sync: crate::data_parallel::GradSync,
) -> Result<String> {
    use crate::data_parallel::{GradSync, Replicas};
    use crate::model::Model;
    use crate::tasks::Batch;
    use rand::{Rng, SeedableRng};
    let vocab = 50257;
    let (seq_len, batch, n) = (cfg.seq_len, cfg.batch, devices.len());
    let mut out = String::new();
    emit(
        &mut out,
        &format!(
            "\ndata-parallel training step (forward, loss, backward, gradients summed ({sync:?}), \
             AdamW on every replica), D = {}, {} layers, T = {seq_len}, {batch} rows per device, \
             precision {}, on {n} devices {devices:?}; median of {} steps after 2 warm-up \
             steps\n\n| model | devices | global batch | ms/step | tokens/s | scaling efficiency |\n\
             |---|---|---|---|---|---|\n",
            cfg.d_model, cfg.layers, cfg.precision, cfg.runs
        ),
    );
    for mode in &cfg.modes {
        let run_cfg = lm_bench_config(
            mode,
            cfg.d_model,
            cfg.layers,
            seq_len,
            batch,
            &cfg.precision,
            &cfg.form,
        )?;
        let form = run_cfg.model.form();
        let mut single = f64::NAN;
        let counts = if n == 1 { vec![1] } else { vec![1, n] };
        for used in counts {
            let ad: Vec<Device> = devices[..used]
                .iter()
                .map(|d| d.clone().autodiff())
                .collect();
            let model = Model::new(&run_cfg, &ad[0]);
            let optim = crate::train::optimizer(&run_cfg.train);
            let grad_sync = if used == 1 { GradSync::None } else { sync };
            let mut replicas = Replicas::new(model, optim, ad, grad_sync);
            let mut rng = rand::rngs::StdRng::seed_from_u64(0);
            let rows = used * batch;
            let tokens: Vec<u32> = (0..rows * (seq_len + 1))
                .map(|_| rng.random_range(0..vocab as u32))
                .collect();
            let row = |r: usize| &tokens[r * (seq_len + 1)..(r + 1) * (seq_len + 1)];
            let rows_batch = Batch {
                inputs: (0..rows).flat_map(|r| row(r)[..seq_len].to_vec()).collect(),
                targets: (0..rows)
                    .flat_map(|r| {
                        row(r)[1..]
                            .iter()
                            .map(|&t| i64::from(t))
                            .collect::<Vec<_>>()
                    })
                    .collect(),
                batch: rows,
                seq_len,
            };
            let mut failed = None;
            let ms = time_ms(2, cfg.runs, &devices[0], || {
                if let Err(e) = replicas.step(&rows_batch, 1e-4, None, form) {
                    failed.get_or_insert(e);
                }
                for d in &devices[1..used] {
                    d.sync().ok();
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            replicas.check_identical()?;
            let tokens_per_s = (rows * seq_len) as f64 / (ms / 1e3);
            if used == 1 {
                single = tokens_per_s;
            }
            emit(
                &mut out,
                &format!(
                    "| {mode} | {used} | {rows} | {ms:.1} | {tokens_per_s:.0} | {:.3} |\n",
                    tokens_per_s / (used as f64 * single)
                ),
            );
        }
    }
    emit(
        &mut out,
        &format!("replicas identical after the timed steps: yes ({n} devices)\n"),
    );
    Ok(out)
}

/// The LM config text of `bench train` for `mode` (a λ mode or `transformer`).
#[allow(clippy::too_many_arguments)]
fn lm_bench_config(
    mode: &str,
    d_model: usize,
    layers: usize,
    seq_len: usize,
    batch: usize,
    precision: &str,
    form: &str,
) -> Result<crate::config::ExperimentConfig> {
    let transformer = mode == "transformer";
    // `segmented:S` on the command line is the config's form and segment keys.
    let form_keys = match form.strip_prefix("segmented:") {
        Some(_) => match parse_form(form, loglinear::ops::DEFAULT_CHUNK)? {
            Form::Segmented { segment } => format!("form = \"segmented\"\nsegment = {segment}"),
            other => unreachable!("parse_form({form:?}) gave {other}"),
        },
        None => format!("form = \"{form}\""),
    };
    let text = format!(
        "name = \"bench\"\n[task.lm]\ndata = \".\"\nseq_len = {seq_len}\n[model]\narch = \"{}\"\nlambda = \"{}\"\n\
         d_model = {d_model}\nn_layers = {layers}\nheads = {}\nexpand = 1\nd_state = 128\nhead_dim = 64\n\
         levels = {levels}\nprecision = \"{precision}\"\n{form_keys}\n[train]\nbatch_size = {batch}\n\
         train_examples = {batch}\noptimizer = \"adamw\"\nweight_decay = 0.1\n",
        if transformer { "transformer" } else { "mamba2" },
        if transformer { "linear" } else { mode },
        (d_model / 64).max(1),
        levels = num_levels(seq_len).max(15),
    );
    crate::config::typed(toml::from_str(&text)?)
}

/// `[batch, seq_len]` token ids drawn from `seed` (the same on every device).
fn random_tokens(
    batch: usize,
    seq_len: usize,
    vocab: usize,
    seed: u64,
    device: &Device,
) -> Tensor<2, Int> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ids: Vec<i64> = (0..batch * seq_len)
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    Tensor::from_data(TensorData::new(ids, vec![batch, seq_len]), device)
}

/// Losses of `steps` AdamW steps of the model of `cfg` on fixed random batches.
fn loss_curve(cfg: &crate::config::ExperimentConfig, steps: usize, device: &Device) -> Vec<f64> {
    use crate::model::{Model, masked_mean_cross_entropy};
    use burn::optim::GradientsParams;
    let ad = device.clone().autodiff();
    let mut model = Model::new(cfg, &ad);
    let mut optim = crate::train::optimizer(&cfg.train);
    let form = cfg.model.form();
    let (b, t, v) = (
        cfg.train.batch_size,
        cfg.task.seq_len(),
        cfg.task.vocab_size(),
    );
    (0..steps)
        .map(|step| {
            let tokens = random_tokens(b, t + 1, v, step as u64, &ad);
            let inputs = tokens.clone().narrow(1, 0, t);
            let targets = tokens.narrow(1, 1, t);
            let logits = model.forward(inputs, form, false).logits;
            let loss = masked_mean_cross_entropy(logits, targets);
            let grads = GradientsParams::from_grads(loss.clone().backward(), &model);
            let value = loss.into_scalar::<f64>();
            model = optim.step(1e-3, model.clone(), grads);
            value
        })
        .collect()
}

/// Trains a small LM of `mode` for a few steps on `device` as configured (bf16, the fused op
/// where it runs) and on the CPU in f32 with the chunked form, and compares the losses: speed
/// paths (fusion, autotuned kernels, the fused op) must not change what is computed.
fn check_train_step(mode: &str, cfg: &TrainBench, device: &Device) -> Result<String> {
    const STEPS: usize = 8;
    let small =
        |precision: &str, form: &str| lm_bench_config(mode, 128, 2, 128, 4, precision, form);
    // The check's T = 128 in segments of 32, so that a segmented form is checked with segments.
    let form = if cfg.form.starts_with("segmented:") {
        "segmented:32"
    } else {
        cfg.form.as_str()
    };
    let here = loss_curve(&small(&cfg.precision, form)?, STEPS, device);
    let reference = loss_curve(&small("full", "chunked")?, STEPS, &Device::flex());
    let worst = here
        .iter()
        .zip(&reference)
        .map(|(a, b)| ((a - b) / b).abs())
        .fold(
            0.0f64,
            |m, x| if x.is_nan() { f64::INFINITY } else { m.max(x) },
        );
    // bf16 activations round to 2^-8 relative; the loss of a mean over 512 tokens keeps about
    // that, and 8 AdamW steps at lr 1e-3 barely amplify it. A wrong path (a missing gradient, a
    // fallback that computes something else) moves the loss by far more after a few steps.
    let tolerance = if cfg.precision == "bf16" { 2e-2 } else { 1e-3 };
    let line = format!(
        "check {mode}: D = 128, 2 layers, T = 128 × 4, {STEPS} AdamW steps, losses here {:.4} → {:.4}, \
         CPU f32 {:.4} → {:.4}, worst relative difference {worst:.1e} (tolerance {tolerance:.0e})\n",
        here[0],
        here[STEPS - 1],
        reference[0],
        reference[STEPS - 1]
    );
    if worst > tolerance || !worst.is_finite() {
        bail!("{line}training on this device does not match the CPU reference");
    }
    Ok(line)
}

/// Which core-op path a training step of `model` takes, from the kernels it launches.
#[cfg(feature = "persistence")]
fn op_path(step: &mut impl FnMut(), device: &Device) -> String {
    let profile = crate::profile::KernelProfile::start();
    step();
    device.sync().ok();
    let report = profile.finish();
    match report.families.get("log-linear op (fused kernels)") {
        Some(f) => format!("fused kernels ({} launches/step)", f.launches),
        None => "tensor ops (no fused-op kernel launched)".to_string(),
    }
}

/// Median training-step time and throughput of the LM for λ modes (and the Transformer), with
/// the first step of a fresh model timed on its own (compilation and autotuning of new shapes),
/// and optionally a kernel-by-kernel profile.
pub fn bench_train(cfg: &TrainBench, device: &Device) -> Result<String> {
    use crate::config::Arch;
    use crate::model::{Model, masked_mean_cross_entropy};
    use burn::optim::GradientsParams;
    let vocab = 50257;
    let (d_model, layers, seq_len, batch) = (cfg.d_model, cfg.layers, cfg.seq_len, cfg.batch);
    let mut out = String::new();
    if cfg.check && device.clone() != Device::flex() {
        for mode in &cfg.modes {
            emit(&mut out, &check_train_step(mode, cfg, device)?);
        }
    }
    emit(
        &mut out,
        &format!(
            "\ntraining step (forward, loss, backward, AdamW), D = {d_model}, {layers} layers, T = {seq_len}, batch {batch}, \
         vocab {vocab}, precision {}, core op {}, on {device:?}; median of {} steps \
         after 2 warm-up steps; TFLOP/s = 6 · parameters · tokens / step time\n\n\
         | model | ms/step | tokens/s | TFLOP/s | first step s | params | memory reserved |\n|---|---|---|---|---|---|---|\n",
            cfg.precision, cfg.form, cfg.runs
        ),
    );
    let ad = device.clone().autodiff();
    for mode in &cfg.modes {
        let started = Instant::now();
        let run_cfg = lm_bench_config(
            mode,
            d_model,
            layers,
            seq_len,
            batch,
            &cfg.precision,
            &cfg.form,
        )?;
        let form = run_cfg.model.form();
        let mut model = Model::new(&run_cfg, &ad);
        let params = burn::module::Module::num_params(&model);
        let mut optim = crate::train::optimizer(&run_cfg.train);
        let tokens = random_tokens(batch, seq_len + 1, vocab, 0, &ad);
        let inputs = tokens.clone().narrow(1, 0, seq_len);
        let targets = tokens.narrow(1, 1, seq_len);
        let mut step = || {
            let logits = model.forward(inputs.clone(), form, false).logits;
            let loss = masked_mean_cross_entropy(logits, targets.clone());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-4, model.clone(), grads);
        };
        step();
        device.sync().ok();
        let first = started.elapsed().as_secs_f64();
        let ms = time_ms(2, cfg.runs, device, &mut step);
        let reserved = device.memory_pool_usage().map_or("n/a".to_string(), |u| {
            format!("{:.2} GiB", u.bytes_reserved as f64 / (1u64 << 30) as f64)
        });
        let arch_name = if run_cfg.model.arch == Arch::Transformer {
            "transformer (softmax)".to_string()
        } else {
            #[cfg(feature = "persistence")]
            let path = op_path(&mut step, device);
            #[cfg(not(feature = "persistence"))]
            let path = format!("{form}");
            format!("log-linear Mamba-2, λ {mode}, {form}: {path}")
        };
        let tokens_per_s = (batch * seq_len) as f64 / (ms / 1e3);
        emit(
            &mut out,
            &format!(
                "| {arch_name} | {ms:.1} | {tokens_per_s:.0} | {:.1} | {first:.1} | {params} | {reserved} |\n",
                6.0 * params as f64 * tokens_per_s / 1e12
            ),
        );
        if cfg.profile_steps > 0 {
            emit(
                &mut out,
                &profile_steps(&mut step, cfg.profile_steps, ms, device)?,
            );
        }
    }
    Ok(out)
}

/// Profiles `steps` calls of `step` kernel by kernel (GPU builds).
#[cfg(feature = "persistence")]
fn profile_steps(
    step: &mut impl FnMut(),
    steps: usize,
    wall_ms: f64,
    device: &Device,
) -> Result<String> {
    device.sync().ok();
    let profile = crate::profile::KernelProfile::start();
    for _ in 0..steps {
        step();
    }
    device.sync().ok();
    Ok(profile.finish().table(steps, wall_ms, 25) + "\n")
}

#[cfg(not(feature = "persistence"))]
fn profile_steps(_: &mut impl FnMut(), _: usize, _: f64, _: &Device) -> Result<String> {
    bail!("--profile needs a GPU build (`--features cuda`)")
}

/// Checks the Gated DeltaNet op in `form` on `device` in `dtype` against its f64 parallel form on
/// the CPU (B = 2, T = 200 with a partial last chunk, H = 2), output and all six gradients;
/// returns the worst max-relative error.
pub fn check_gdn_op(device: &Device, form: Form, dtype: DType, n: usize, p: usize) -> Result<f64> {
    use loglinear::ops::gdn::GdnInput;
    use loglinear::testing::run_gdn_with_grads;
    let dims = Dims {
        b: 2,
        t: 200,
        h: 2,
        n,
        p,
        l: num_levels(200),
    };
    let seed = fresh_seed();
    let cpu = Device::flex().autodiff();
    let x = GdnInput::random(dims, seed, DType::F64, &cpu);
    let d_o = LogLinearInput::random(Dims { n: p, ..dims }, seed + 1, DType::F64, &cpu).q;
    let reference = run_gdn_with_grads(&x, &d_o, Form::Parallel, None);
    let ad = device.clone().autodiff();
    let xd = GdnInput::random(dims, seed, dtype, &ad);
    let dod = Tensor::<4>::from_data(d_o.to_data(), (&ad, dtype));
    let got = run_gdn_with_grads(&xd, &dod, form, None);
    worst_error(
        &reference,
        &got,
        &format!("gdn {form} form on {device:?} (seed {seed})"),
    )
}

/// `bench op --variant gdn`: the Gated DeltaNet op's chunked form, checked first against the f64
/// parallel form, then forward and forward+backward medians per T. Half-precision inputs are
/// computed in f32 (the op's dispatch casts them), so the figures are the f32 tensor form's.
fn bench_gdn_op(cfg: &OpBench, device: &Device) -> Result<String> {
    use loglinear::ops::gdn::{GdnInput, gdn_attn};
    let forms: Vec<Form> = cfg
        .forms
        .iter()
        .map(|&f| match f {
            Form::Chunked { .. } | Form::Parallel => Ok(f),
            other => bail!(
                "bench op --variant gdn: no {other} form for Gated DeltaNet (there are no fused \
                 kernels): use --forms chunked"
            ),
        })
        .collect::<Result<_>>()?;
    let tol = if matches!(cfg.dtype, DType::F32 | DType::F64) {
        1e-3
    } else {
        3e-2
    };
    let mut out = String::new();
    for &form in &forms {
        let err = check_gdn_op(device, form, cfg.dtype, cfg.n.min(64), cfg.p.min(96))?;
        emit(
            &mut out,
            &format!(
                "correctness: gdn {form} on {device:?} in {:?} vs f64 parallel on the CPU (B=2, \
                 T=200, H=2): worst max-relative error over o and all gradients {err:.2e} \
                 (tolerance {tol:.0e})\n",
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
            "\nlog-linear Gated DeltaNet: H={}, N={}, P={}, {:?} inputs (computed in f32 below \
             f32), B×T = {}; median of {} runs after warm-up\n\n\
             | form | T | B | fwd ms | fwd+bwd ms | fwd tokens/s | fwd+bwd tokens/s |\n\
             |---|---|---|---|---|---|---|\n",
            cfg.heads, cfg.n, cfg.p, cfg.dtype, cfg.tokens, cfg.runs
        ),
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
        for &form in &forms {
            let x = GdnInput::random(dims, t as u64, cfg.dtype, device);
            let fwd = time_ms(2, cfg.runs, device, || {
                let _ = gdn_attn(&x, form, None, false).o;
            });
            let ad = device.clone().autodiff();
            let xa = GdnInput::random(dims, t as u64, cfg.dtype, &ad).require_grad();
            let bwd = time_ms(2, cfg.runs, device, || {
                let o = gdn_attn(&xa, form, None, false).o;
                let _ = o.sum().backward();
            });
            let tokens = (b * t) as f64;
            emit(
                &mut out,
                &format!(
                    "| {form} | {t} | {b} | {fwd:.2} | {bwd:.2} | {:.0} | {:.0} |\n",
                    tokens / (fwd / 1e3),
                    tokens / (bwd / 1e3)
                ),
            );
        }
    }
    Ok(out)
}

/// One product of `bench gemm`: `[m×k]·[k×n]`, the right operand read from a transposed view
/// where `transposed`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmShape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub transposed: bool,
}

/// Parses `MxKxN` or `MxKxNt`.
pub fn parse_gemm_shape(text: &str) -> Result<GemmShape> {
    let (dims, transposed) = match text.strip_suffix('t') {
        Some(d) => (d, true),
        None => (text, false),
    };
    let parts: Vec<usize> = dims
        .split('x')
        .map(|x| x.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("bench gemm: {text:?} is not MxKxN or MxKxNt"))?;
    match parts[..] {
        [m, k, n] if m > 0 && k > 0 && n > 0 => Ok(GemmShape {
            m,
            k,
            n,
            transposed,
        }),
        _ => bail!("bench gemm: {text:?} is not MxKxN or MxKxNt with positive sizes"),
    }
}

/// `bench gemm`: every product through `linalg::matmul` (on cuBLAS in GPU builds with the
/// `cublas` feature) and through Burn's `matmul` (CubeCL's autotuned kernels on GPUs; the first
/// call of a shape autotunes), the two results compared, then each timed (median of `runs`).
pub fn bench_gemm(
    shapes: &[GemmShape],
    dtype: DType,
    runs: usize,
    device: &Device,
) -> Result<String> {
    use burn::tensor::Distribution;
    let mut out = String::new();
    emit(
        &mut out,
        &format!(
            "matrix products on {device:?}, {dtype:?} operands; median of {runs} runs\n\n\
             | product | linalg::matmul ms | TFLOP/s | Burn matmul ms | TFLOP/s | max difference / max entry |\n\
             |---|---|---|---|---|---|\n"
        ),
    );
    for &GemmShape {
        m,
        k,
        n,
        transposed,
    } in shapes
    {
        let a = Tensor::<2>::random([m, k], Distribution::Normal(0.0, 1.0), device).cast(dtype);
        let b = if transposed {
            Tensor::<2>::random([n, k], Distribution::Normal(0.0, 1.0), device)
                .cast(dtype)
                .transpose()
        } else {
            Tensor::<2>::random([k, n], Distribution::Normal(0.0, 1.0), device).cast(dtype)
        };
        // Burn's matmul autotunes each new shape on its first call: minutes on a GPU for the
        // large ones, so say what is happening rather than sit silent.
        eprintln!(
            "bench gemm: [{m}×{k}]·[{k}×{n}]{}: first calls (Burn's matmul autotunes a new shape)",
            if transposed { "ᵀ" } else { "" }
        );
        let ours = loglinear::linalg::matmul(a.clone(), b.clone());
        let burns = a.clone().matmul(b.clone());
        let scale = burns
            .clone()
            .abs()
            .max()
            .cast(DType::F32)
            .into_scalar::<f32>() as f64;
        let diff = (ours.cast(DType::F32) - burns.cast(DType::F32))
            .abs()
            .max()
            .into_scalar::<f32>() as f64;
        let t_ours = time_ms(2, runs, device, || {
            let _ = loglinear::linalg::matmul(a.clone(), b.clone());
        });
        let t_burn = time_ms(2, runs, device, || {
            let _ = a.clone().matmul(b.clone());
        });
        let tflops = |ms: f64| 2.0 * (m * k * n) as f64 / (ms * 1e9);
        emit(
            &mut out,
            &format!(
                "| [{m}×{k}]·[{k}×{n}]{} | {t_ours:.3} | {:.0} | {t_burn:.3} | {:.0} | {:.1e} |\n",
                if transposed { "ᵀ" } else { "" },
                tflops(t_ours),
                tflops(t_burn),
                diff / scale.max(f64::MIN_POSITIVE)
            ),
        );
    }
    Ok(out)
}
