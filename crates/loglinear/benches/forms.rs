//! Tokens/s of each form of the core op on the Flex CPU backend, forward and forward+backward,
//! plus the size of the recurrent (decoding) state.
//!
//! ```text
//! cargo bench -p loglinear --bench forms                # all of it, ~10 minutes on 2 cores
//! cargo bench -p loglinear --bench forms -- chunked     # criterion filter: one form
//! LOGLINEAR_BENCH_MAX_T=1024 cargo bench -p loglinear --bench forms   # a quick smoke run
//! ```
//!
//! Shapes: B = 1, H = 4, N = P = 64, f32, L = num_levels(T), chunk 64. Throughput is counted
//! in tokens (B·T), so criterion prints tokens/s as "elem/s". Results: bench/RESULTS.md.

use std::hint::black_box;
use std::time::Duration;

use burn::prelude::*;
use burn::tensor::DType;
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use loglinear::fenwick::num_levels;
use loglinear::ops::{Dims, FenwickState, Form, LogLinearInput, log_linear_attn};

const B: usize = 1;
const H: usize = 4;
const N: usize = 64;
const P: usize = 64;
const CHUNK: usize = 64;
const LENGTHS: [usize; 4] = [256, 1024, 4096, 16384];

/// Longest T each form is run at, forward only and forward+backward.
fn max_len(form: Form, backward: bool) -> usize {
    match form {
        // T² memory: the [B, H, T, T] masks are 268 MB each at T = 4096 (f32), 4.3 GB at 16384,
        // and autodiff keeps several of them alive.
        Form::Parallel => 4096,
        // T sequential steps of small tensor ops, each recorded on the autodiff tape when
        // differentiating: dominated by per-op overhead, and it only gets slower linearly.
        Form::Recurrent if backward => 256,
        Form::Recurrent => 1024,
        // On the CPU the fused and auto forms are the chunked form (the kernels need a CubeCL
        // device).
        Form::Chunked { .. } | Form::Fused | Form::Segmented { .. } | Form::Auto { .. } => {
            usize::MAX
        }
    }
}

fn input(t: usize, device: &Device) -> LogLinearInput {
    let dims = Dims {
        b: B,
        t,
        h: H,
        n: N,
        p: P,
        l: num_levels(t),
    };
    LogLinearInput::random(dims, 42, DType::F32, device)
}

fn forward(x: &LogLinearInput, form: Form) -> Tensor<4> {
    log_linear_attn(x, form, None, false).o
}

fn forward_backward(x: &LogLinearInput, form: Form) {
    let x = x.require_grad();
    let grads = log_linear_attn(&x, form, None, false).o.sum().backward();
    black_box(grads);
}

fn forms(c: &mut Criterion) {
    let cap: usize = std::env::var("LOGLINEAR_BENCH_MAX_T")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    let all = [
        Form::Parallel,
        Form::Chunked { chunk: CHUNK },
        Form::Recurrent,
    ];
    for backward in [false, true] {
        let mode = if backward { "fwd+bwd" } else { "fwd" };
        let device = if backward {
            Device::flex().autodiff()
        } else {
            Device::flex()
        };
        let mut group = c.benchmark_group(mode);
        // Single iterations take up to seconds: few flat samples keep the run near 10 minutes.
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4));
        for t in LENGTHS.into_iter().filter(|t| *t <= cap) {
            let x = input(t, &device);
            group.throughput(Throughput::Elements((B * t) as u64));
            for form in all.into_iter().filter(|f| t <= max_len(*f, backward)) {
                let name = match form {
                    Form::Parallel => "parallel",
                    Form::Chunked { .. } => "chunked64",
                    Form::Recurrent => "recurrent",
                    Form::Fused => "fused",
                    Form::Segmented { .. } => "segmented",
                    Form::Auto { .. } => "auto",
                };
                group.bench_with_input(BenchmarkId::new(name, t), &x, |bench, x| {
                    if backward {
                        bench.iter(|| forward_backward(x, form));
                    } else {
                        bench.iter(|| black_box(forward(x, form)));
                    }
                });
            }
        }
        group.finish();
    }
}

/// Not timed: bytes of the recurrent state (all L levels) next to what a linear-attention state
/// (one level) and a softmax KV cache would hold at the same T.
fn state_bytes(_: &mut Criterion) {
    println!("recurrent state bytes (B={B}, H={H}, N={N}, P={P}, f32):");
    for t in [1_000usize, 1_000_000] {
        let l = num_levels(t);
        let state = FenwickState::empty(B, H, l, N, P, DType::F32, &Device::flex());
        let one_level = state.size_bytes() / l;
        let kv_cache = B * t * H * (N + P) * 4;
        println!(
            "  T = {t:>9}: L = {l:>2}, Fenwick state {:>9} B (one level: {one_level} B; \
             softmax KV cache: {kv_cache} B)",
            state.size_bytes()
        );
    }
}

criterion_group!(benches, state_bytes, forms);
criterion_main!(benches);
