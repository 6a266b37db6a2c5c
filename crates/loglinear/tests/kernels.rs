//! The fused CubeCL kernels ([`Form::Fused`]) against the float64 parallel form: output and all
//! five gradients, awkward lengths (partial last chunk, T = 1), several key/value widths, fresh
//! random inputs per run, NaN-tailed input buffers. Runs on a WGPU device (any Vulkan driver,
//! including the software rasteriser lavapipe): `cargo test -p loglinear --features wgpu --test
//! kernels`. Built with `--features cuda` they run on the first CUDA device instead, including
//! the bf16 tensor-core kernels (`scripts/build-gpu.sh --tests` builds them here,
//! `scripts/gpu-test.sh` runs them on the GPU machine).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::prelude::*;
use burn::tensor::DType;
use loglinear::fenwick::num_levels;
use loglinear::host::{Closeness, closeness};
use loglinear::ops::{Dims, PlannedWalk};
use loglinear::testing::{
    assert_close, check_fused, check_fused_segments, check_fused_walk, test_seed,
};

/// The first CUDA device in CUDA builds, else the default WGPU adapter (lavapipe in CI).
fn device() -> Device {
    #[cfg(feature = "cuda")]
    {
        Device::cuda(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Device::wgpu(Default::default())
    }
}

fn check(dims: Dims, dtype: DType, tol: f64) {
    check_mixed(dims, dtype, dtype, tol);
}

fn check_mixed(dims: Dims, dtype: DType, g_dtype: DType, tol: f64) {
    let seed = test_seed(dims.t as u64);
    let results = check_fused(&device(), dims, dtype, g_dtype, seed)
        .unwrap_or_else(|why| panic!("{dims:?}: the kernels did not run: {why}"));
    for (name, c) in results.into_iter().take(6) {
        // Shown with `--nocapture` (`scripts/gpu-test.sh NAME --nocapture`): the margin of each
        // output and gradient, for comparing kernel versions' rounding.
        eprintln!(
            "{dims:?} {dtype:?} seed {seed}: {name} max_rel {:.2e} max_abs {:.2e}",
            c.max_rel, c.max_abs
        );
        if name == "dg" && dims.t == 1 {
            // Exactly 0 in the reference; the f32 cancellation leaves a tiny absolute error.
            assert!(
                c.max_abs <= 1e-3,
                "{dims:?}: dg at T = 1 is {:.1e}",
                c.max_abs
            );
            continue;
        }
        assert!(
            !c.non_finite && c.max_rel <= tol,
            "{dims:?} {dtype:?} seed {seed}: {name} max_rel {:.2e} (tolerance {tol:.0e}), \
             non-finite {}",
            c.max_rel,
            c.non_finite
        );
    }
}

/// The kernels walking aligned segments in cubes of their own (`Form::Segmented`: the levels
/// across segments written before the launch from one state per segment and level), output and
/// all gradients: a partial last segment, segments of one chunk (every level across) and of
/// several, segments shorter than a chunk (one chunk each), a long sequence in four segments.
#[test]
fn fused_over_segments_matches_reference() {
    let both = |s| PlannedWalk {
        forward: Some(s),
        backward: Some(s),
    };
    check_walks(
        &[
            (70, both(32), DType::F32, 2e-5),
            (300, both(16), DType::F32, 2e-5),
            (1100, both(32), DType::F32, 2e-5),
            (200, both(64), DType::F32, 2e-5),
            (1000, both(128), DType::F32, 2e-5),
            (2000, both(512), DType::F32, 2e-5),
            // Mixed precision as training runs it (the tensor-core kernels on CUDA).
            (200, both(64), DType::BF16, 2e-2),
            (2000, both(512), DType::BF16, 2e-2),
        ],
        0x5e6,
    );
}

/// The forward and the backward walking differently (the plan keeps one forward walk where the
/// backward walks segments, `ops::planned_walk`): each pass recomputes what it needs, so any pair
/// must give the f64 reference's output and gradients.
#[test]
fn fused_passes_walk_independently() {
    let walk = |forward, backward| PlannedWalk { forward, backward };
    check_walks(
        &[
            (300, walk(None, Some(64)), DType::F32, 2e-5),
            (1100, walk(Some(128), None), DType::F32, 2e-5),
            (1000, walk(Some(256), Some(32)), DType::F32, 2e-5),
            (2000, walk(None, Some(512)), DType::BF16, 2e-2),
        ],
        0x3a1c,
    );
}

/// `check_fused_walk` for each `(T, walk, dtype of q/k/v, tolerance)` (B = 1, H = 2, N = 16,
/// P = 32, g and λ in f32), seeds from `seed_tag` and T; bf16 cases skip on devices without bf16.
fn check_walks(cases: &[(usize, PlannedWalk, DType, f64)], seed_tag: u64) {
    let half = device().supports_dtype(DType::BF16);
    for &(t, walk, dtype, tol) in cases {
        if dtype == DType::BF16 && !half {
            eprintln!("skipped T = {t} in bf16: the device has no bf16");
            continue;
        }
        let dims = Dims {
            b: 1,
            t,
            h: 2,
            n: 16,
            p: 32,
            l: num_levels(t),
        };
        let seed = test_seed(t as u64 ^ seed_tag);
        let results = check_fused_walk(&device(), dims, dtype, DType::F32, seed, Some(walk));
        let case = format!("{dims:?} {dtype:?} {walk:?} seed {seed}");
        assert_all_within(results, tol, &case);
    }
}

/// `Form::Fused`: one sequence of 8,192 tokens and one head leaves the card idle in one cube, so
/// with tensor cores the plan walks segments of 1,024 — output and all gradients against the f64
/// reference through `Form::Fused` itself (`check_fused_segments` with `None`).
#[test]
fn fused_walks_long_sequences_with_few_heads_in_planned_segments() {
    let device = device();
    if !loglinear::ops::fused::bf16_cmma(&device) {
        eprintln!(
            "skipped: the plan segments on tensor cores only (run on CUDA: scripts/gpu-test.sh)"
        );
        return;
    }
    let dims = Dims {
        b: 1,
        t: 8192,
        h: 1,
        n: 64,
        p: 64,
        l: num_levels(8192),
    };
    let x = loglinear::ops::LogLinearInput::random(dims, 1, DType::BF16, &device);
    assert_eq!(
        loglinear::ops::fused::walk(&x),
        loglinear::ops::PlannedWalk {
            forward: Some(1024),
            backward: Some(1024)
        },
        "{dims:?}: the plan should cut segments here"
    );
    let seed = test_seed(0x91a4);
    let results = check_fused_segments(&device, dims, DType::BF16, DType::F32, seed, None);
    assert_all_within(results, 2e-2, &format!("{dims:?} seed {seed}"));
}

/// The output and the five gradients of a kernel check (the first six entries) finite and within
/// `tol` of the reference (max-relative); `case` names the check in the message.
fn assert_all_within(results: Result<Vec<(&str, Closeness)>, String>, tol: f64, case: &str) {
    let results = results.unwrap_or_else(|why| panic!("{case}: the kernels did not run: {why}"));
    for (name, c) in results.into_iter().take(6) {
        assert!(
            !c.non_finite && c.max_rel <= tol,
            "{case}: {name} max_rel {:.2e} (tolerance {tol:.0e})",
            c.max_rel
        );
    }
}

#[test]
fn fused_matches_reference_at_awkward_lengths() {
    for t in [1, 7, 33, 70, 200] {
        let dims = Dims {
            b: 2,
            t,
            h: 2,
            n: 16,
            p: 32,
            l: num_levels(t),
        };
        check(dims, DType::F32, 2e-5);
    }
}

#[test]
fn fused_matches_reference_for_widths_and_extra_levels() {
    for (n, p) in [(32, 16), (64, 48), (20, 36)] {
        // More λ slots than the sequence needs, as models allocate for their longest context.
        let dims = Dims {
            b: 1,
            t: 150,
            h: 3,
            n,
            p,
            l: num_levels(150) + 2,
        };
        check(dims, DType::F32, 2e-5);
    }
}

#[test]
fn fused_handles_long_sequences_with_many_levels() {
    let dims = Dims {
        b: 1,
        t: 1100,
        h: 1,
        n: 16,
        p: 16,
        l: num_levels(1100),
    };
    check(dims, DType::F32, 5e-5);
}

#[test]
fn fused_takes_half_precision_inputs() {
    let dims = Dims {
        b: 1,
        t: 90,
        h: 2,
        n: 32,
        p: 32,
        l: num_levels(90),
    };
    let mut checked = 0;
    for dtype in [DType::BF16, DType::F16] {
        if device().supports_dtype(dtype) {
            // Half-precision outputs and gradients carry their rounding (2^-8 relative for
            // bf16, 2^-11 for f16) on top of f32 arithmetic.
            check(dims, dtype, 1e-2);
            // Mixed precision: q, k, v in half precision, g and λ in f32.
            check_mixed(dims, dtype, DType::F32, 1e-2);
            checked += 1;
        }
    }
    // lavapipe and every CUDA device support at least one of the two.
    assert!(checked > 0, "the device supports neither bf16 nor f16");
    eprintln!("half-precision dtypes checked on this device: {checked}");
}

/// The fused Mamba-2 (one state, λ ignored) is the op with λ ≡ 1: against the parallel form (the
/// definition) on the same device, partial last chunks and T = 1 included.
/// The tensor-core kernels (the default GPU path: bf16 q, k, v with f32 g and λ, as mixed-precision
/// training passes them; key widths multiples of 16) at T = 1, 70, 200 and 4096 and one long
/// sequence (T = 32,768, against the f64 chunked form). On a device without bf16 tensor cores
/// (lavapipe) there is nothing to test and it says so; in a CUDA build their absence fails.
#[test]
fn tensor_core_kernels_match_reference_in_bf16() {
    let device = device();
    if !loglinear::ops::fused::bf16_cmma(&device) {
        if cfg!(feature = "cuda") {
            panic!(
                "this CUDA device has no bf16 tensor cores: the default GPU path cannot be tested"
            );
        }
        eprintln!(
            "skipped: no bf16 tensor cores on this device (run on CUDA: scripts/gpu-test.sh)"
        );
        return;
    }
    // Few rows of B·H make the planner narrow the value tile to 16 columns to fill the card;
    // 264 rows (two per multiprocessor of an H100 or H200) keep the anchors' tile of 64 columns,
    // whose planes own several output tiles each. N = 48: rows of twelve 4-float blocks do not
    // divide among the causal backward's eight units a row, so its level epilogues keep the
    // column mapping (`row_epilogue_fits`); N = 64 and 128 take the row mapping. 132 rows make
    // the planner take value tiles of 32 columns (as at the T = 32,768 × 4 anchor): the forward's
    // planes then hold one output tile each in registers, where 264 rows give them two.
    let cases = [
        (1, 2, 2, 64, 64),
        (70, 2, 2, 128, 64),
        (70, 2, 2, 48, 64),
        (200, 2, 3, 64, 128),
        (300, 2, 132, 128, 64),
        (300, 2, 66, 128, 64),
        (4096, 1, 2, 128, 64),
        (32768, 1, 1, 64, 64),
    ];
    for (t, b, h, n, p) in cases {
        let dims = Dims {
            b,
            t,
            h,
            n,
            p,
            l: num_levels(t),
        };
        // bf16 rounding of the inputs and of the kernels' level states and weighted operands:
        // the bound `loglinear bench kernels` holds them to (bench/RESULTS.md, session 5: worst
        // 5.0e-3 on outputs).
        check_mixed(dims, DType::BF16, DType::F32, 2e-2);
    }
}

/// The tensor-core kernels compiled to CUDA C++ for an sm_90 card without one (CubeCL's IR
/// verifier included; `loglinear::ops::fused::cuda_check`), at the planner's tiles for the anchor
/// shapes, a narrow value tile, N = 48 and P = 128. Needs no GPU: run it on the build machine
/// (`scripts/build-gpu.sh --tests`, then the `kernels` test binary with this test's name) before
/// a kernel change goes to the GPU machine.
#[cfg(feature = "cublas")]
#[test]
fn tensor_core_kernels_compile_for_sm90_without_a_device() {
    // `LOGLINEAR_CUDA_SOURCES=DIR` keeps the CUDA C++ (for `scripts/ptxas-report.sh`: registers
    // and spills per kernel from the CUDA toolkit's `ptxas`, still without a GPU).
    let dump = std::env::var_os("LOGLINEAR_CUDA_SOURCES").map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    }
    for (nk, width, t, rows) in [
        (128, 64, 2048, 64 * 48),
        (128, 64, 32768, 4 * 48),
        (64, 64, 4096, 2),
        (48, 64, 70, 4),
        (64, 128, 200, 6),
    ] {
        let sources = loglinear::ops::fused::cuda_check::compile_for_sm90(nk, width, t, rows)
            .unwrap_or_else(|why| {
                panic!("N {nk}, P {width}, T {t}, {rows} rows: a kernel does not compile: {why}")
            });
        assert_eq!(sources.len(), 4);
        for (name, source) in sources {
            if let Some(dir) = &dump {
                let file = dir.join(format!("{name}-N{nk}-P{width}-T{t}-R{rows}.cu"));
                std::fs::write(&file, &source)
                    .unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
            }
            // The products are `mma.sync` with `ldmatrix` operands, not WMMA fragments.
            assert!(
                source.contains("mma.sync") && source.contains("ldmatrix"),
                "{name} (N {nk}, P {width}, T {t}): no mma.sync/ldmatrix in its CUDA source"
            );
        }
    }
}

#[test]
fn mamba2_is_the_op_with_lambda_one() {
    use loglinear::host::HostInput;
    use loglinear::ops::{Form, LogLinearInput, log_linear_attn};
    // bf16 where tensor cores run (CUDA): the tensor-core kernel's Mamba-2 path (N a multiple
    // of 16), to the bf16 tolerance of the op's own tensor-core test.
    let tensor_cores = loglinear::ops::fused::bf16_cmma(&device());
    for (t, n, p, dtype, tol) in [
        (1, 16, 32, DType::F32, 2e-5),
        (7, 16, 32, DType::F32, 2e-5),
        (64, 16, 32, DType::F32, 2e-5),
        (70, 20, 36, DType::F32, 2e-5),
        (200, 32, 16, DType::F32, 2e-5),
        (70, 16, 32, DType::BF16, 2e-2),
        (1000, 64, 64, DType::BF16, 2e-2),
        (4096, 128, 64, DType::BF16, 2e-2),
    ] {
        if dtype == DType::BF16 && !tensor_cores {
            continue;
        }
        let dims = Dims {
            b: 2,
            t,
            h: 2,
            n,
            p,
            l: num_levels(t),
        };
        let x = LogLinearInput::random(dims, test_seed(1), dtype, &device());
        let o = loglinear::ops::fused::mamba2(&x)
            .unwrap_or_else(|why| panic!("{dims:?}: fused Mamba-2 did not run: {why}"));
        // The reference in f64 on the host, from the same (f32 or bf16) inputs: on CUDA, Burn's
        // autotuned f32 matmuls may run on TF32 tensor cores (about 5e-4 relative), which a
        // reference on the device would carry into the comparison.
        let mut reference_input = HostInput::from_input(&x).to_input(DType::F64, &Device::flex());
        reference_input.lambda = reference_input.lambda.ones_like();
        let reference = log_linear_attn(&reference_input, Form::Parallel, None, false).o;
        let scale = reference.clone().abs().max().into_scalar::<f64>();
        let o = Tensor::<4>::from_data(
            o.into_data().convert::<f64>(),
            (&Device::flex(), DType::F64),
        );
        let err = (o - reference).abs().max().into_scalar::<f64>() / scale;
        assert!(
            err < tol,
            "{dims:?} {dtype:?}: fused Mamba-2 off by {err:.2e} of the largest entry"
        );
    }
}

/// The vector-access helpers of the tensor-core kernels (16-byte loads of input rows, level
/// states read, merged and carried four floats at a time), which software Vulkan cannot run inside those
/// kernels (no `cmma`), through a one-cube probe: a chunk that runs past the sequence and past
/// the value width, fewer vectors than units and more.
#[test]
fn vector_helpers_load_merge_and_read() {
    let mut state = test_seed(2) | 1;
    let mut rand = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    // (seq, width, t0, c0, chunk, cols, len)
    for (seq, width, t0, c0, chunk, cols, len) in [
        (50, 24, 40, 12, 16, 16, 256),
        (300, 40, 256, 8, 64, 32, 2048),
    ] {
        for fresh in [false, true] {
            let x: Vec<f32> = (0..seq * width).map(|_| rand()).collect();
            let states: Vec<f32> = (0..2 * len).map(|_| rand()).collect();
            let f = 0.75;
            let probed = loglinear::ops::fused::probe_vector_helpers(
                &device(),
                &x,
                seq,
                width,
                (t0, c0),
                &states,
                f,
                fresh,
                (chunk, cols, len),
            );
            let (rows, level) = (&probed.rows, &probed.level);
            for i in 0..chunk {
                for c in 0..cols {
                    let (t, col) = (t0 + i, c0 + c);
                    let want = if t < seq && col < width {
                        x[t * width + col]
                    } else {
                        0.0
                    };
                    assert_eq!(rows[i * cols + c], want, "row {i} column {c} (seq {seq})");
                }
            }
            for e in 0..len {
                let old = if fresh { 0.0 } else { f * states[len + e] };
                let want = old + rows[e];
                assert!(
                    (level[e] - want).abs() <= 1e-6,
                    "level entry {e}: {} vs {want} (fresh {fresh})",
                    level[e]
                );
                // The carry: 1.5 · (f · merged level + 0.5 · first level) + the loaded rows.
                let carry = 1.5 * (f * want + 0.5 * states[e]) + rows[e];
                assert!(
                    (probed.carried[e] - carry).abs() <= 1e-5,
                    "carried entry {e}: {} vs {carry} (fresh {fresh})",
                    probed.carried[e]
                );
                // The level sum of the anticausal kernel: 2 · merged − 0.25 · first level.
                let sum = 2.0 * want - 0.25 * states[e];
                assert!(
                    (probed.summed[e] - sum).abs() <= 1e-5,
                    "summed entry {e}: {} vs {sum} (fresh {fresh})",
                    probed.summed[e]
                );
            }
        }
    }
}

/// The H200's shared memory per multiprocessor (228 KB, 1 KB of it reserved per cube) holds two
/// forward cubes at the anchors' shapes (N = 128, P = 64, chunk 64, up to 2^20 tokens) with the
/// padded rows — one cube per multiprocessor made the forward latency-bound (bench/RESULTS.md) —
/// and one cube of each backward kernel.
#[test]
fn tensor_core_tiles_keep_their_occupancy_on_the_h200() {
    use loglinear::ops::fused::{tc_backward_shared_bytes, tc_shared_bytes};
    let per_sm = 228 * 1024;
    let levels = num_levels(1 << 20);
    let forward = tc_shared_bytes(64, 128, 64, levels, 2);
    assert!(
        2 * (forward + 1024) <= per_sm,
        "forward cube: {forward} bytes"
    );
    for causal in [true, false] {
        for tiled in [false, true] {
            let backward = tc_backward_shared_bytes(64, 128, 64, levels, 2, causal, tiled);
            assert!(
                backward + 1024 <= 227 * 1024,
                "backward cube (causal {causal}, tiled {tiled}): {backward} bytes"
            );
        }
    }
}

/// The tiles the planner takes for the tensor-core kernels at the anchors (B·T = 131,072,
/// H = 48, N = 128, P = 64) on an H100 / H200 (227 KB of shared memory a cube, 132
/// multiprocessors), for the rows each pass launches (`ops::planned_walk`: the backward walks
/// segments of 8,192 at T = 32,768 × 4, both passes at T = 131,072). Pinned so that a change of
/// the planner's rule or of a kernel's shared memory changes the anchors' tiles only on purpose:
/// bench/RESULTS.md measures each choice (the forward's 32-column tiles at T = 32,768 × 4 are
/// session 40's `FORWARD_PT` experiment).
#[test]
fn tensor_core_plans_at_the_anchors() {
    use loglinear::ops::fused::{Kernels, Plan, plan};
    let (max_shared, sms, h, nk, width) = (232_448, 132, 48, 128, 64);
    let plan_for = |kernels, t: usize, rows: usize| {
        plan(
            kernels,
            nk,
            width,
            num_levels(t),
            t,
            max_shared,
            Some((rows, sms)),
        )
        .unwrap_or_else(|| panic!("{kernels:?} at T = {t}, {rows} rows: no tile fits"))
    };
    let tiles = |chunk, pt, threads| Plan { chunk, pt, threads };
    let (fwd, bwd) = (Kernels::TensorCoreForward, Kernels::TensorCoreBackward);
    for (kernels, t, rows, want) in [
        (fwd, 2048, 64 * h, tiles(64, 64, 256)),
        (fwd, 8192, 16 * h, tiles(64, 64, 256)),
        (fwd, 32768, 4 * h, tiles(64, 32, 256)),
        (fwd, 131072, 16 * h, tiles(64, 64, 256)),
        (bwd, 2048, 64 * h, tiles(64, 64, 512)),
        (bwd, 8192, 16 * h, tiles(64, 64, 512)),
        (bwd, 32768, 16 * h, tiles(64, 64, 512)),
        (bwd, 131072, 16 * h, tiles(64, 64, 512)),
    ] {
        assert_eq!(
            plan_for(kernels, t, rows),
            want,
            "{kernels:?} at T = {t}, {rows} rows"
        );
    }
    // Few rows: narrower value tiles, more cubes (one sequence of 2,048 tokens, 48 heads).
    assert_eq!(plan_for(fwd, 2048, h), tiles(64, 16, 256));
}

/// The fused softmax cross-entropy (forward nll and the logits' gradient) against the tensor-op
/// definition, in f32 and with f16 logits, at vocabularies that are not multiples of the cube
/// (the LM's 50,257 included), one row and many, fresh random logits and targets; a target at
/// the last column.
#[test]
fn cross_entropy_kernels_match_the_definition() {
    use burn::tensor::{Distribution, TensorData};
    use loglinear::nn::loss::{cross_entropy_rows, reference_cross_entropy_rows};
    let seed = test_seed(5);
    let device = device().autodiff();
    // Both sides compute in f32 and sum V exponentials in different orders: the sums agree to
    // about √V ulps (≈ 1e-5 relative at V = 50,257), hence the looser bound there; half-precision
    // logits (f16 here: WGSL has no bf16; bf16 runs in `bench train`'s check on CUDA) round the
    // gradient to 2⁻¹¹.
    for (rows, vocab, dtype, tol) in [
        (1, 7, DType::F32, 1e-5),
        (37, 300, DType::F32, 1e-5),
        (2, 50_257, DType::F32, 1e-4),
        (9, 1_000, DType::F16, 2e-3),
    ] {
        let mut rng = seed.wrapping_add(rows as u64 * 31 + vocab as u64);
        device.seed(rng);
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) as i64
        };
        let mut targets: Vec<i64> = (0..rows).map(|_| next() % vocab as i64).collect();
        targets[0] = vocab as i64 - 1;
        let targets = Tensor::<1, Int>::from_data(TensorData::new(targets, [rows]), &device);
        // Logits of LM scale (|x| up to ~8) so the softmax is far from uniform.
        let logits = Tensor::<2>::random([rows, vocab], Distribution::Normal(0.0, 3.0), &device)
            .cast(dtype)
            .detach();
        let weights = Tensor::<1>::random([rows], Distribution::Normal(0.0, 1.0), &device).detach();
        let run = |f: &dyn Fn(Tensor<2>, Tensor<1, Int>) -> Tensor<1>| {
            let x = logits.clone().require_grad();
            let nll = f(x.clone(), targets.clone());
            let grads = (nll.clone() * weights.clone()).sum().backward();
            let dx = x.grad(&grads).expect("a gradient for the logits");
            let host = |t: Tensor<1>| -> Vec<f64> {
                t.into_data().convert::<f64>().iter::<f64>().collect()
            };
            let host2 = |t: Tensor<2>| -> Vec<f64> {
                t.into_data().convert::<f64>().iter::<f64>().collect()
            };
            (host(nll.detach()), host2(dx))
        };
        let (nll, dx) = run(&|x, t| cross_entropy_rows(x, t));
        let (want_nll, want_dx) = run(&|x, t| reference_cross_entropy_rows(x, t));
        let worst = |got: &[f64], want: &[f64]| closeness(want, got).max_rel;
        // nll = logsumexp(x) − x_target cancels when the target's logit dominates its row (nll
        // → 0 while both terms stay ≈ max x): both sides round the terms, so the nll error is
        // measured against the largest logit too, not against the nll alone.
        let largest_logit = logits
            .clone()
            .cast(DType::F32)
            .abs()
            .max()
            .into_scalar::<f64>();
        let largest_nll = want_nll.iter().fold(0f64, |m, v| m.max(v.abs()));
        let e_nll = closeness(&want_nll, &nll).max_abs / largest_nll.max(largest_logit);
        let e_dx = worst(&dx, &want_dx);
        assert!(
            e_nll <= tol && e_dx <= tol && nll.iter().chain(&dx).all(|v| v.is_finite()),
            "rows {rows}, V {vocab}, {dtype:?}, seed {seed}: nll {e_nll:.1e}, dlogits {e_dx:.1e} \
             (tolerance {tol:.0e})"
        );
    }
    // Per token of `[B, T, V]` logits whose rows are pitched (a narrowed view of wider rows, as
    // the head's product leaves them on CUDA): read in place, same values and gradient.
    use loglinear::nn::loss::cross_entropy_tokens;
    let (b, t, vocab) = (3, 5, 301);
    device.seed(seed.wrapping_add(7));
    let wide = Tensor::<3>::random([b, t, vocab + 11], Distribution::Normal(0.0, 3.0), &device)
        .detach()
        .require_grad();
    let targets =
        Tensor::<2, Int>::random([b, t], Distribution::Uniform(0.0, vocab as f64), &device);
    let weights = Tensor::<2>::random([b, t], Distribution::Normal(0.0, 1.0), &device).detach();
    let host =
        |t: Tensor<2>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let host3 =
        |t: Tensor<3>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let nll = cross_entropy_tokens(wide.clone().narrow(2, 0, vocab), targets.clone());
    let grads = (nll.clone() * weights.clone()).sum().backward();
    let dx = wide.grad(&grads).expect("a gradient for the logits");
    let flat = wide.clone().narrow(2, 0, vocab).reshape([b * t, vocab]);
    let want = reference_cross_entropy_rows(flat, targets.clone().reshape([b * t])).reshape([b, t]);
    let want_grads = (want.clone() * weights.clone()).sum().backward();
    let want_dx = wide.grad(&want_grads).expect("a gradient for the logits");
    let (want, want_dx) = (host(want.detach()), host3(want_dx));
    assert_close(
        &format!("pitched [{b}, {t}, {vocab}] logits, seed {seed}: nll"),
        &want,
        &host(nll.detach()),
        1e-5,
    );
    assert_close(
        &format!("pitched [{b}, {t}, {vocab}] logits, seed {seed}: dlogits"),
        &want_dx,
        &host3(dx),
        1e-5,
    );
    // The same logits handed over padded (`[B, T, V + 11]`, the first V columns scored, as the
    // LM head's output): the same values, the same gradient on the scored columns and exactly
    // 0 on the padding, which the kernels never read (poisoned here with a huge value).
    use loglinear::nn::{PaddedLogits, cross_entropy_padded_tokens};
    let poison = Tensor::<3>::full([b, t, 11], 1e30, &device);
    let padded = Tensor::cat(vec![wide.clone().detach().narrow(2, 0, vocab), poison], 2)
        .detach()
        .require_grad();
    let scored = PaddedLogits {
        padded: padded.clone(),
        vocab,
    };
    let nll = cross_entropy_padded_tokens(&scored, targets);
    let grads = (nll.clone() * weights.clone()).sum().backward();
    let dpadded = host3(
        padded
            .grad(&grads)
            .expect("a gradient for the padded logits"),
    );
    let what = format!("padded [{b}, {t}, {vocab} + 11] logits, seed {seed}");
    assert_close(&format!("{what}: nll"), &want, &host(nll.detach()), 1e-5);
    // The scored columns' gradient against the reference, the padding's exactly 0.
    let (scored_dx, pad): (Vec<_>, Vec<_>) = dpadded
        .iter()
        .enumerate()
        .partition(|(i, _)| i % (vocab + 11) < vocab);
    let values = |v: Vec<(usize, &f64)>| v.into_iter().map(|(_, g)| *g).collect::<Vec<f64>>();
    let want_scored: Vec<f64> = want_dx
        .iter()
        .enumerate()
        .filter(|(i, _)| i % (vocab + 11) < vocab)
        .map(|(_, g)| *g)
        .collect();
    assert_close(
        &format!("{what}: dlogits"),
        &want_scored,
        &values(scored_dx),
        1e-5,
    );
    let pad = values(pad);
    assert!(
        pad.iter().all(|g| *g == 0.0),
        "{what}: the padding's gradient is not 0 (largest {:e})",
        pad.iter().fold(0.0f64, |m, g| m.max(g.abs()))
    );
}

/// Row-major `[batch, m, k] · [batch, k, n]` in f64, with `a` or `b` broadcast where its batch
/// is 1.
fn host_bmm(a: &[f64], b: &[f64], ba: usize, bb: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let batch = ba.max(bb);
    let mut c = vec![0.0; batch * m * n];
    for z in 0..batch {
        let (ao, bo) = (
            if ba == 1 { 0 } else { z * m * k },
            if bb == 1 { 0 } else { z * k * n },
        );
        for i in 0..m {
            for p in 0..k {
                let x = a[ao + i * k + p];
                for j in 0..n {
                    c[z * m * n + i * n + j] += x * b[bo + p * n + j];
                }
            }
        }
    }
    c
}

/// `[batch, r, c]` → `[batch, c, r]`, row-major.
fn host_transpose(x: &[f64], batch: usize, r: usize, c: usize) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for z in 0..batch {
        for i in 0..r {
            for j in 0..c {
                y[z * r * c + j * r + i] = x[z * r * c + i * c + j];
            }
        }
    }
    y
}

/// Sums `[batch, r, c]` over its batch.
fn host_batch_sum(x: &[f64], batch: usize, size: usize) -> Vec<f64> {
    (0..size)
        .map(|i| (0..batch).map(|z| x[z * size + i]).sum())
        .collect()
}

/// `linalg::matmul` (cuBLAS on CUDA builds with the `cublas` feature, the CubeCL backend's matmul
/// behind the same extension and backward elsewhere) against f64 on the host: the product and
/// both gradients of `Σ C ⊙ W`, for row-major operands and transposed views (no copy: cuBLAS reads
/// them transposed), batched and broadcast leading axes, awkward sizes; f32 and half precision
/// (bf16 on CUDA, f16 on WGPU, which has no bf16). The reference takes the device's rounded inputs.
#[test]
fn matrix_products_and_their_gradients_match_f64() {
    use burn::tensor::Distribution;
    use loglinear::linalg::{linear, matmul};
    let seed = test_seed(11);
    let device = device().autodiff();
    let half = if cfg!(feature = "cuda") {
        DType::BF16
    } else {
        DType::F16
    };
    // (leading axes of a, of b, m, k, n, a transposed view, b transposed view)
    type Case = ([usize; 2], [usize; 2], usize, usize, usize, bool, bool);
    // The last three have f32 weight gradients cut by split-K (`kernels::gemm`): a batched
    // `aᵀ · dC` over 2,048 rows in 4 parts, a shared weight's over 8 × 1,024 rows in 16, and
    // 1,536 rows in 2 parts of 768.
    let cases: [Case; 10] = [
        ([1, 1], [1, 1], 1, 7, 1, false, false),
        ([1, 1], [1, 1], 37, 64, 50, false, true),
        ([1, 1], [1, 1], 70, 33, 129, true, false),
        ([2, 3], [2, 3], 13, 8, 11, false, true),
        ([2, 3], [2, 3], 20, 17, 9, true, true),
        ([4, 2], [1, 1], 5, 16, 8, false, false),
        ([1, 1], [3, 2], 6, 24, 200, true, false),
        ([2, 3], [2, 3], 2048, 9, 16, false, false),
        ([4, 2], [1, 1], 1024, 16, 8, false, false),
        ([1, 1], [1, 1], 1536, 15, 64, false, false),
    ];
    let mut state = seed;
    for (dtype, tol) in [(DType::F32, 1e-5), (half, 2e-2)] {
        for (la, lb, m, k, n, ta, tb) in cases {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            // Every draw below comes from the device's generator, seeded from the test seed.
            device.seed(state);
            let (ba, bb) = (la[0] * la[1], lb[0] * lb[1]);
            let batch = ba.max(bb);
            let lc = if ba == 1 { lb } else { la };
            // Device tensors in `dtype`, laid out as asked; `host` reads back what they hold.
            let make = |lead: [usize; 2], r: usize, c: usize, transposed: bool| {
                let t = if transposed {
                    Tensor::<4>::random(
                        [lead[0], lead[1], c, r],
                        Distribution::Normal(0.0, 1.0),
                        &device,
                    )
                    .cast(dtype)
                    .swap_dims(2, 3)
                } else {
                    Tensor::<4>::random(
                        [lead[0], lead[1], r, c],
                        Distribution::Normal(0.0, 1.0),
                        &device,
                    )
                    .cast(dtype)
                };
                t.detach()
            };
            let host = |t: Tensor<4>| -> Vec<f64> {
                t.into_data().convert::<f64>().iter::<f64>().collect()
            };
            let a = make(la, m, k, ta);
            let b = make(lb, k, n, tb);
            let w = Tensor::<4>::random(
                [lc[0], lc[1], m, n],
                Distribution::Normal(0.0, 1.0),
                &device,
            )
            .detach();
            let (ha, hb, hw) = (host(a.clone()), host(b.clone()), host(w.clone()));
            let (a, b) = (a.require_grad(), b.require_grad());
            let c = matmul(a.clone(), b.clone());
            assert_eq!(c.dims(), [lc[0], lc[1], m, n], "matmul shape");
            let grads = (c.clone().cast(DType::F32) * w).sum().backward();
            let (da, db) = (a.grad(&grads).expect("dA"), b.grad(&grads).expect("dB"));
            let want_c = host_bmm(&ha, &hb, ba, bb, m, k, n);
            let da_full = host_bmm(&hw, &host_transpose(&hb, bb, k, n), batch, bb, m, n, k);
            let db_full = host_bmm(&host_transpose(&ha, ba, m, k), &hw, ba, batch, k, m, n);
            let want_da = if ba == 1 {
                host_batch_sum(&da_full, batch, m * k)
            } else {
                da_full
            };
            let want_db = if bb == 1 {
                host_batch_sum(&db_full, batch, k * n)
            } else {
                db_full
            };
            for (name, got, want) in [
                ("C", host(c), want_c),
                ("dA", host(da), want_da),
                ("dB", host(db), want_db),
            ] {
                assert_close(
                    &format!(
                        "{name} of {la:?}·{lb:?} ({m}×{k}·{k}×{n}, views {ta}/{tb}), {dtype:?}, \
                         seed {seed}"
                    ),
                    &want,
                    &got,
                    tol,
                );
            }
        }
    }
    // `linear` over leading axes (2 × 5 rows of 24), with the weight stored as is and as a
    // transposed view (the tied LM head reads the embedding table transposed), against f64 on
    // the host: y = x·W, and for Σ y ⊙ G, dx = G·Wᵀ and dW = xᵀ·G (a weight shared by the batch).
    // The input also as pitched rows (a narrowed view of wider rows, as the allocator pitches
    // rows of odd length on CUDA): the weight's gradient reads them in place
    // (`gemm_batch_sum`). An odd d_out gives pitched outputs and gradients on CUDA.
    let (rows, d_in, d_out) = (10, 24, 41);
    for (transposed, pitched) in [(false, false), (true, false), (false, true)] {
        device.seed(seed.wrapping_add(transposed as u64 + 2 * pitched as u64 + 1));
        let normal = Distribution::Normal(0.0, 1.0);
        let x = if pitched {
            Tensor::<3>::random([2, 5, d_in + 7], normal, &device).narrow(2, 0, d_in)
        } else {
            Tensor::<3>::random([2, 5, d_in], normal, &device)
        }
        .detach();
        let w = if transposed {
            Tensor::<2>::random([d_out, d_in], normal, &device).transpose()
        } else {
            Tensor::<2>::random([d_in, d_out], normal, &device)
        }
        .detach();
        let g = Tensor::<3>::random([2, 5, d_out], normal, &device).detach();
        let host =
            |t: Tensor<3>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
        let host2 =
            |t: Tensor<2>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
        let (hx, hw, hg) = (host(x.clone()), host2(w.clone()), host(g.clone()));
        let (x, w) = (x.require_grad(), w.require_grad());
        let y = linear(x.clone(), w.clone());
        let grads = (y.clone() * g).sum().backward();
        let (dx, dw) = (x.grad(&grads).expect("dx"), w.grad(&grads).expect("dW"));
        let want_y = host_bmm(&hx, &hw, 1, 1, rows, d_in, d_out);
        let want_dx = host_bmm(
            &hg,
            &host_transpose(&hw, 1, d_in, d_out),
            1,
            1,
            rows,
            d_out,
            d_in,
        );
        let want_dw = host_bmm(
            &host_transpose(&hx, 1, rows, d_in),
            &hg,
            1,
            1,
            d_in,
            rows,
            d_out,
        );
        for (name, got, want) in [
            ("y", host(y), want_y),
            ("dx", host(dx), want_dx),
            ("dW", host2(dw), want_dw),
        ] {
            assert_close(
                &format!(
                    "linear {name} (weight transposed: {transposed}, input pitched: {pitched}), \
                     seed {seed}"
                ),
                &want,
                &got,
                1e-5,
            );
        }
    }
}

#[test]
fn attention_softmax_kernels_match_the_definition() {
    use burn::tensor::Distribution;
    use loglinear::kernels::attention_softmax;
    let seed = test_seed(13);
    let device = device().autodiff();
    let half = if cfg!(feature = "cuda") {
        DType::BF16
    } else {
        DType::F16
    };
    // (leading axes, queries, keys, past): square causal problems at awkward lengths (rows
    // longer than the kernels' 128 units), one query after a cache (decoding), a chunk after a
    // cache, and a block that sees every key (past ≥ keys).
    let cases: [([usize; 2], usize, usize, usize); 9] = [
        ([2, 3], 1, 1, 0),
        ([2, 3], 7, 7, 0),
        ([1, 2], 63, 63, 0),
        ([2, 1], 70, 70, 0),
        ([1, 1], 200, 200, 0),
        ([2, 2], 1, 65, 64),
        ([1, 3], 5, 12, 7),
        ([2, 1], 3, 9, 9),
        ([1, 1], 4, 300, 296),
    ];
    // Probabilities in half precision are rounded to 2⁻¹¹ (f16; bf16 2⁻⁸), and so is the
    // gradient that comes back to them.
    let half_tol = if cfg!(feature = "cuda") { 3e-2 } else { 5e-3 };
    for (dtype, tol) in [(DType::F32, 1e-5), (half, half_tol)] {
        for (i, (lead, queries, keys, past)) in cases.into_iter().enumerate() {
            device.seed(seed.wrapping_add(i as u64));
            let what =
                format!("{lead:?} × [{queries}, {keys}], past {past}, {dtype:?}, seed {seed}");
            let shape = [lead[0], lead[1], queries, keys];
            let rows = lead[0] * lead[1] * queries;
            let scale = 0.125f32;
            // Scores of attention scale (scale · |x| up to ~3) so the softmax is far from uniform.
            let scores = Tensor::<4>::random(shape, Distribution::Normal(0.0, 8.0), &device)
                .cast(dtype)
                .detach()
                .require_grad();
            let w = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device).detach();
            let host = |t: Tensor<4>| -> Vec<f64> {
                t.into_data().convert::<f64>().iter::<f64>().collect()
            };
            let (hs, hw) = (host(scores.clone().detach()), host(w.clone()));
            let probs = attention_softmax(&scores, scale, past).expect("a CubeCL device");
            let grads = (probs.clone().cast(DType::F32) * w).sum().backward();
            let ds = host(scores.grad(&grads).expect("a gradient for the scores"));
            let probs = host(probs.detach());
            // f64 definition, row by row: query q sees keys 0..=past + q.
            let (mut want_p, mut want_ds) = (vec![0.0; rows * keys], vec![0.0; rows * keys]);
            for r in 0..rows {
                let visible = (past + r % queries + 1).min(keys);
                let row = r * keys..r * keys + visible;
                let x: Vec<f64> = hs[row.clone()].iter().map(|s| s * scale as f64).collect();
                let m = x.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
                let p: Vec<f64> = x.iter().map(|v| (v - m).exp() / z).collect();
                let dot: f64 = p.iter().zip(&hw[row.clone()]).map(|(p, w)| p * w).sum();
                for (j, p) in p.iter().enumerate() {
                    want_p[r * keys + j] = *p;
                    want_ds[r * keys + j] = scale as f64 * p * (hw[r * keys + j] - dot);
                }
            }
            assert_close(&format!("{what}: probabilities"), &want_p, &probs, tol);
            if want_ds.iter().all(|g| *g == 0.0) {
                // One visible key per row: the probability is 1 whatever the score, so the
                // gradient is exactly 0.
                assert!(
                    ds.iter().all(|g| g.abs() <= 1e-6),
                    "{what}: gradient {ds:?}"
                );
            } else {
                assert_close(&format!("{what}: score gradient"), &want_ds, &ds, tol);
            }
            // Masked keys: probability and gradient exactly 0.
            let masked = (0..rows * keys)
                .filter(|i| i % keys >= (past + (i / keys) % queries + 1).min(keys));
            for i in masked {
                assert!(
                    probs[i] == 0.0 && ds[i] == 0.0,
                    "{what}: masked entry {i} has probability {} and gradient {}",
                    probs[i],
                    ds[i]
                );
            }
        }
    }
}

#[test]
fn transformer_on_the_kernels_matches_burn_attention_on_the_cpu() {
    use burn::module::Module;
    use loglinear::nn::TransformerConfig;
    // The Transformer baseline on a CubeCL device runs its attention as cuBLAS/CubeCL products
    // and the softmax kernels; on the CPU as Burn's attention. Same weights, same tokens: same
    // logits, same gradient of the weights, and decoding through the key/value cache (one
    // query after a cache, a chunk after a cache) equal to the full forward.
    let seed = test_seed(17);
    let cfg = TransformerConfig {
        max_seq_len: 96,
        initializer_range: 0.2,
        ..TransformerConfig::new(41, 24, 2, 3)
    };
    let t = 70;
    let (model_gpu, tokens) = assert_transformer_matches_cpu(&cfg, seed, 2, t);

    let host =
        |t: Tensor<3>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let model_gpu = model_gpu.valid();
    let tokens = tokens.to_device(&device());
    let full = host(model_gpu.run(tokens.clone()));
    let (prefix, mut state) = model_gpu.prefill(tokens.clone().narrow(1, 0, 20));
    let chunk = model_gpu.extend(tokens.clone().narrow(1, 20, 30), &mut state);
    let mut parts = vec![prefix, chunk];
    for i in 50..t {
        let token = tokens.clone().narrow(1, i, 1).squeeze_dim::<1>(1);
        parts.push(model_gpu.step(token, &mut state).unsqueeze_dim(1));
    }
    let stepped = host(Tensor::cat(parts, 1));
    assert_close(
        &format!("seed {seed}: prefill + chunk + steps vs full"),
        &full,
        &stepped,
        1e-4,
    );
}

#[test]
fn transformer_beyond_one_attention_block_matches_the_cpu() {
    use loglinear::kernels::block_attention::ATTENTION_BLOCK;
    use loglinear::nn::TransformerConfig;
    // Beyond ATTENTION_BLOCK queries the Transformer on a CubeCL device takes the blockwise
    // attention (two blocks here, the second partial); on the CPU Burn's attention. Same
    // weights and tokens: same logits and the same gradient of the first attention weights.
    let seed = test_seed(23);
    let t = ATTENTION_BLOCK + 76;
    let cfg = TransformerConfig {
        max_seq_len: t,
        initializer_range: 0.2,
        ..TransformerConfig::new(41, 24, 2, 3)
    };
    assert_transformer_matches_cpu(&cfg, seed, 1, t);
}

#[test]
fn transformer_in_bf16_attends_with_flash_attention_like_the_cpu() {
    use burn::module::Module;
    use loglinear::nn::{Precision, TransformerConfig};
    // In bf16 on a device whose tensor cores take bf16 tiles, the Transformer's attention is the
    // fused FlashAttention kernels, reading q, k and v as views of the qkv projection: the same
    // logits (to bf16's rounding) and gradient of the first attention weights as the f32 model
    // with Burn's attention on the CPU. A wrong head layout or mask is off by order 1.
    let probe = Tensor::<4>::zeros([1, 1, 1, 32], &device()).cast(DType::BF16);
    if !loglinear::kernels::flash_attention_on_tensor_cores(&probe) {
        eprintln!("skipped: this device's tensor cores do not take bf16 tiles (CUDA runs it)");
        return;
    }
    let seed = test_seed(29);
    let cfg = TransformerConfig {
        max_seq_len: 200,
        initializer_range: 0.2,
        ..TransformerConfig::new(41, 64, 2, 2)
    };
    let (b, t) = (2, 150);
    let cpu = Device::flex().autodiff();
    let gpu = device().autodiff();
    let model = cfg.init(seed, &cpu);
    let mut model_gpu = model.clone().fork(&gpu);
    model_gpu.config.precision = Precision::Bf16;
    let tokens = loglinear::testing::random_tokens(b, t, cfg.vocab_size, seed, &Device::flex());
    let host =
        |t: Tensor<3>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let host2 =
        |t: Tensor<2>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let run = |m: &loglinear::nn::TransformerLm, device: &Device| {
        let logits = m.run(tokens.clone().to_device(device)).cast(DType::F32);
        let w = Tensor::<3>::ones(logits.dims(), device).mul_scalar(0.01)
            + logits.clone().detach().sin();
        let grads = (logits.clone() * w).sum().backward();
        let dqkv = m.blocks[0]
            .attn
            .qkv
            .linear
            .weight
            .grad(&grads)
            .expect("a gradient for the first qkv weight");
        (host(logits.detach()), host2(dqkv))
    };
    let (want_logits, want_dqkv) = run(&model, &cpu);
    let (logits, dqkv) = run(&model_gpu, &gpu);
    let what = format!("T {t}, seed {seed}, bf16");
    assert_close(&format!("{what}: logits"), &want_logits, &logits, 3e-2);
    assert_close(&format!("{what}: dW_qkv"), &want_dqkv, &dqkv, 8e-2);
}

/// The Transformer of `cfg` with the same weights on the CPU (Burn's attention) and on the
/// test's CubeCL device (the attention on the kernels): the same logits and the same gradient
/// of the first attention weights for `b × t` random tokens. Returns the device's model and
/// the tokens.
fn assert_transformer_matches_cpu(
    cfg: &loglinear::nn::TransformerConfig,
    seed: u64,
    b: usize,
    t: usize,
) -> (loglinear::nn::TransformerLm, Tensor<2, Int>) {
    let cpu = Device::flex().autodiff();
    let gpu = device().autodiff();
    let model = cfg.init(seed, &cpu);
    let model_gpu = model.clone().fork(&gpu);
    let tokens = loglinear::testing::random_tokens(b, t, cfg.vocab_size, seed, &Device::flex());
    let host =
        |t: Tensor<3>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let host2 =
        |t: Tensor<2>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let run = |m: &loglinear::nn::TransformerLm, device: &Device| {
        let logits = m.run(tokens.clone().to_device(device));
        let w = Tensor::<3>::ones(logits.dims(), device).mul_scalar(0.01)
            + logits.clone().detach().sin();
        let grads = (logits.clone() * w).sum().backward();
        let qkv = &m.blocks[0].attn.qkv.linear.weight;
        let dqkv = qkv
            .grad(&grads)
            .expect("a gradient for the first qkv weight");
        (host(logits.detach()), host2(dqkv))
    };
    let (want_logits, want_dqkv) = run(&model, &cpu);
    let (logits, dqkv) = run(&model_gpu, &gpu);
    let what = format!("T {t}, seed {seed}");
    assert_close(&format!("{what}: logits"), &want_logits, &logits, 1e-4);
    assert_close(&format!("{what}: dW_qkv"), &want_dqkv, &dqkv, 1e-3);
    (model_gpu, tokens)
}

/// The λ-MLP kernels' results against f64: within `5e-5` of the largest reference entry (f32
/// sums of up to 64 products per entry and of up to 1,200 rows per weight gradient; erf
/// approximated to 1.5e-7 on the device), `2e-4` with the softmax head, whose `g − Σ p g`
/// cancels (5.8e-5 measured on the H200) — or within `1e-5` absolutely, where that cancellation
/// leaves a gradient far smaller than the terms it is made of (one row on lavapipe: 2.5e-4 of a
/// largest entry of 3.6e-3, i.e. 8.8e-7 absolute, with intermediate sums of order 1). A wrong
/// term is off by orders of magnitude more either way.
fn assert_close_mlp(what: &str, want: &[f64], got: &[f64], softmax: bool) {
    let c = closeness(want, got);
    let rel = if softmax { 2e-4 } else { 5e-5 };
    assert!(
        want.iter().any(|x| *x != 0.0),
        "{what}: the reference is all zeros, so the comparison proves nothing"
    );
    assert!(
        !c.non_finite && (c.max_rel <= rel || c.max_abs <= 1e-5),
        "{what}: max |Δ| = {:.3e} = {:.3e} of max |ref| (tolerance {rel:.0e} relative or 1e-5 \
         absolute)",
        c.max_abs,
        c.max_rel
    );
}

/// The λ-MLP in f64 on the host, row by row (`dl: [rows, L]`, `w1: [L, H]`, `w2: [H, L]`), and
/// the gradients of `Σ λ ⊙ g`: `[λ, ddl, dW1, db1, dW2, db2]`. `gelu` is exact (erf).
#[allow(clippy::too_many_arguments)]
fn host_lambda_mlp(
    dl: &[f64],
    w1: &[f64],
    b1: &[f64],
    w2: &[f64],
    b2: &[f64],
    g: &[f64],
    levels: usize,
    softmax: bool,
) -> [Vec<f64>; 6] {
    let hidden = b1.len();
    let rows = dl.len() / levels;
    let phi = |z: f64| 0.5 * (1.0 + libm::erf(z * std::f64::consts::FRAC_1_SQRT_2));
    let density = |z: f64| (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let mut out = [
        vec![0.0; rows * levels],
        vec![0.0; rows * levels],
        vec![0.0; levels * hidden],
        vec![0.0; hidden],
        vec![0.0; hidden * levels],
        vec![0.0; levels],
    ];
    for r in 0..rows {
        let x = &dl[r * levels..(r + 1) * levels];
        let gr = &g[r * levels..(r + 1) * levels];
        let pre: Vec<f64> = (0..hidden)
            .map(|j| b1[j] + (0..levels).map(|i| x[i] * w1[i * hidden + j]).sum::<f64>())
            .collect();
        let h: Vec<f64> = pre.iter().map(|&z| z * phi(z)).collect();
        let y: Vec<f64> = (0..levels)
            .map(|k| b2[k] + (0..hidden).map(|j| h[j] * w2[j * levels + k]).sum::<f64>())
            .collect();
        let dy: Vec<f64> = if softmax {
            let m = y.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = y.iter().map(|v| (v - m).exp()).sum();
            let p: Vec<f64> = y.iter().map(|v| (v - m).exp() / z).collect();
            let dot: f64 = p.iter().zip(gr).map(|(p, g)| p * g).sum();
            out[0][r * levels..(r + 1) * levels].copy_from_slice(&p);
            p.iter().zip(gr).map(|(p, g)| p * (g - dot)).collect()
        } else {
            for k in 0..levels {
                out[0][r * levels + k] = y[k].max(0.0) + (-y[k].abs()).exp().ln_1p();
            }
            y.iter()
                .zip(gr)
                .map(|(y, g)| g / (1.0 + (-y).exp()))
                .collect()
        };
        let dpre: Vec<f64> = (0..hidden)
            .map(|j| {
                let dh: f64 = (0..levels).map(|k| w2[j * levels + k] * dy[k]).sum();
                dh * (phi(pre[j]) + pre[j] * density(pre[j]))
            })
            .collect();
        for i in 0..levels {
            out[1][r * levels + i] = (0..hidden).map(|j| w1[i * hidden + j] * dpre[j]).sum();
            for j in 0..hidden {
                out[2][i * hidden + j] += x[i] * dpre[j];
            }
        }
        for j in 0..hidden {
            out[3][j] += dpre[j];
            for k in 0..levels {
                out[4][j * levels + k] += h[j] * dy[k];
            }
        }
        for k in 0..levels {
            out[5][k] += dy[k];
        }
    }
    out
}

/// A λ-MLP whose backward does not fit a cube's shared memory is left to the tensor version.
#[test]
fn lambda_mlp_kernels_decline_widths_beyond_shared_memory() {
    use burn::module::Param;
    use loglinear::kernels::{fused_lambda_mlp, lambda_mlp::shared_bytes, max_shared_memory};
    use loglinear::nn::{LambdaMlp, LambdaMode};
    let device = device();
    let max = max_shared_memory(&device).expect("a CubeCL device");
    // The smallest power-of-two hidden width past what this device's cubes hold.
    let levels = 15;
    let mut hidden = 64;
    while shared_bytes(levels, hidden) <= max {
        hidden *= 2;
    }
    let zeros2 = |d: [usize; 2]| Param::from_tensor(Tensor::<2>::zeros(d, &device));
    let zeros1 = |d: usize| Param::from_tensor(Tensor::<1>::zeros([d], &device));
    let mlp = LambdaMlp {
        w1: zeros2([levels, hidden]),
        b1: zeros1(hidden),
        w2: zeros2([hidden, levels]),
        b2: zeros1(levels),
    };
    let dl = Tensor::<4>::zeros([1, 3, 2, levels], &device);
    assert!(fused_lambda_mlp(&dl, &mlp, LambdaMode::MlpSoftplus).is_none());
    assert!(
        shared_bytes(15, 64) <= max,
        "the published widths must fit ({max} bytes)"
    );
    assert!(
        fused_lambda_mlp(
            &dl.narrow(3, 0, levels),
            &LambdaMlp {
                w1: zeros2([levels, 64]),
                b1: zeros1(64),
                w2: zeros2([64, levels]),
                b2: zeros1(levels),
            },
            LambdaMode::MlpSoftplus
        )
        .is_some()
    );
}

#[test]
fn lambda_mlp_kernels_match_f64() {
    use burn::module::Param;
    use burn::tensor::Distribution;
    use loglinear::nn::{LambdaMlp, LambdaMode};
    // The λ-MLP as kernels ([`loglinear::kernels::fused_lambda_mlp`]) against f64 on the host:
    // λ and the gradients of dl and of all four weights; rows that are not a multiple of the
    // kernels' 32, a single row, the published level count and hidden width (15, 64) and small
    // ones; both heads; random weights (the identity init's W2 = 0 would hide dW1). The tensor
    // version (`LambdaMlp::logits`, `head`) is held to the same reference.
    let seed = test_seed(19);
    let device = device().autodiff();
    let cases: [([usize; 3], usize, usize); 5] = [
        ([1, 1, 1], 15, 64),
        ([2, 7, 3], 15, 64),
        ([1, 70, 8], 15, 64),
        ([3, 200, 2], 5, 8),
        ([2, 63, 1], 9, 24),
    ];
    for (c, (lead, levels, hidden)) in cases.into_iter().enumerate() {
        for mode in [LambdaMode::MlpSoftplus, LambdaMode::MlpSoftmax] {
            let softmax = mode == LambdaMode::MlpSoftmax;
            device.seed(seed.wrapping_add(c as u64 * 2 + softmax as u64));
            let what = format!("{lead:?} × {levels} levels, hidden {hidden}, {mode}, seed {seed}");
            let normal = |s: f64| Distribution::Normal(0.0, s);
            let param2 = |d: [usize; 2], s: f64| {
                Param::from_tensor(Tensor::<2>::random(d, normal(s), &device).detach())
            };
            let param1 = |d: usize, s: f64| {
                Param::from_tensor(Tensor::<1>::random([d], normal(s), &device).detach())
            };
            let mlp = LambdaMlp {
                w1: param2([levels, hidden], 0.5),
                b1: param1(hidden, 0.3),
                w2: param2([hidden, levels], 0.3),
                b2: param1(levels, 0.3),
            };
            let shape = [lead[0], lead[1], lead[2], levels];
            let dl = Tensor::<4>::random(shape, normal(1.5), &device).detach();
            let g = Tensor::<4>::random(shape, normal(1.0), &device).detach();
            fn host<const D: usize>(t: Tensor<D>) -> Vec<f64> {
                t.into_data().convert::<f64>().iter::<f64>().collect()
            }
            let want = host_lambda_mlp(
                &host(dl.clone()),
                &host(mlp.w1.val()),
                &host(mlp.b1.val()),
                &host(mlp.w2.val()),
                &host(mlp.b2.val()),
                &host(g.clone()),
                levels,
                softmax,
            );
            let run = |fused: bool| {
                let x = dl.clone().require_grad();
                let lambda = if fused {
                    loglinear::kernels::fused_lambda_mlp(&x, &mlp, mode).expect("a CubeCL device")
                } else {
                    LambdaMlp::head(mlp.logits(x.clone()), mode)
                };
                let grads = (lambda.clone() * g.clone()).sum().backward();
                [
                    host(lambda.detach()),
                    host(x.grad(&grads).expect("a gradient for dl")),
                    host(mlp.w1.grad(&grads).expect("dW1")),
                    host(mlp.b1.grad(&grads).expect("db1")),
                    host(mlp.w2.grad(&grads).expect("dW2")),
                    host(mlp.b2.grad(&grads).expect("db2")),
                ]
            };
            for (path, got) in [("kernels", run(true)), ("tensor ops", run(false))] {
                // (Every case here fits the 32 KB of shared memory lavapipe offers.)
                for (name, (g, w)) in ["λ", "ddl", "dW1", "db1", "dW2", "db2"]
                    .iter()
                    .zip(got.iter().zip(&want))
                {
                    let what = format!("{what}, {path}: {name}");
                    assert_close_mlp(&what, w, g, softmax);
                }
            }
        }
    }
}

#[test]
fn packed_lambda_mlp_kernels_match_f64_per_replica() {
    use burn::module::Param;
    use burn::tensor::Distribution;
    use loglinear::nn::{LambdaMode, PackedLambdaMlp};
    // The packed models' λ-MLP (one MLP per replica, each replica with its own head) through the
    // kernels, against each replica's f64 λ-MLP: 3 replicas mixing the two heads, 70 rows each
    // (not a multiple of the kernels' 32), the published T = 256 level count (9).
    let seed = test_seed(23);
    let device = device().autodiff();
    device.seed(seed);
    let modes = [
        LambdaMode::MlpSoftplus,
        LambdaMode::MlpSoftmax,
        LambdaMode::MlpSoftplus,
    ];
    let (r, m, h, levels, hidden) = (3, 35, 2, 9, 64);
    let normal = |s: f64| Distribution::Normal(0.0, s);
    let mlp = PackedLambdaMlp {
        w1: Param::from_tensor(Tensor::<3>::random(
            [r, levels, hidden],
            normal(0.5),
            &device,
        )),
        b1: Param::from_tensor(Tensor::<2>::random([r, hidden], normal(0.3), &device)),
        w2: Param::from_tensor(Tensor::<3>::random(
            [r, hidden, levels],
            normal(0.3),
            &device,
        )),
        b2: Param::from_tensor(Tensor::<2>::random([r, levels], normal(0.3), &device)),
    };
    let shape = [r, m, h, levels];
    let dl = Tensor::<4>::random(shape, normal(1.5), &device)
        .detach()
        .require_grad();
    let g = Tensor::<4>::random(shape, normal(1.0), &device).detach();
    fn host<const D: usize>(t: Tensor<D>) -> Vec<f64> {
        t.into_data().convert::<f64>().iter::<f64>().collect()
    }
    let lambda =
        loglinear::kernels::fused_packed_lambda_mlp(&dl, &mlp, &modes).expect("a CubeCL device");
    let grads = (lambda.clone() * g.clone()).sum().backward();
    let got = [
        host(lambda.detach()),
        host(dl.grad(&grads).expect("ddl")),
        host(mlp.w1.grad(&grads).expect("dW1")),
        host(mlp.b1.grad(&grads).expect("db1")),
        host(mlp.w2.grad(&grads).expect("dW2")),
        host(mlp.b2.grad(&grads).expect("db2")),
    ];
    let (hdl, hg) = (host(dl.clone().detach()), host(g));
    let (w1, b1, w2, b2) = (
        host(mlp.w1.val()),
        host(mlp.b1.val()),
        host(mlp.w2.val()),
        host(mlp.b2.val()),
    );
    let rows = m * h * levels;
    for (i, mode) in modes.iter().enumerate() {
        let slice = |v: &[f64], n: usize| v[i * n..(i + 1) * n].to_vec();
        let want = host_lambda_mlp(
            &slice(&hdl, rows),
            &slice(&w1, levels * hidden),
            &slice(&b1, hidden),
            &slice(&w2, levels * hidden),
            &slice(&b2, levels),
            &slice(&hg, rows),
            levels,
            *mode == LambdaMode::MlpSoftmax,
        );
        let sizes = [rows, rows, levels * hidden, hidden, levels * hidden, levels];
        for (k, name) in ["λ", "ddl", "dW1", "db1", "dW2", "db2"].iter().enumerate() {
            assert_close_mlp(
                &format!("replica {i} ({mode}), seed {seed}: {name}"),
                &want[k],
                &slice(&got[k], sizes[k]),
                *mode == LambdaMode::MlpSoftmax,
            );
        }
    }
}

/// Blockwise causal attention (probabilities recomputed in the backward) against f64: output
/// and the gradients of q, k and v, with blocks smaller than the sequence (several blocks, a
/// partial last one, a block of one query) and one block for all; after a key/value cache (a
/// chunk, one query); in f32 and in half precision.
#[test]
fn block_attention_matches_f64() {
    use burn::tensor::Distribution;
    use loglinear::kernels::causal_block_attention;
    let seed = test_seed(19);
    let device = device().autodiff();
    let half = if cfg!(feature = "cuda") {
        DType::BF16
    } else {
        DType::F16
    };
    // (N = batch · heads, queries, past, block); d = 16, dv = 24.
    let cases: [(usize, usize, usize, usize); 9] = [
        (3, 1, 0, 4),
        (3, 7, 0, 4),
        (2, 63, 0, 16),
        (2, 70, 0, 32),
        (1, 200, 0, 64),
        (2, 70, 0, 1024),
        (2, 9, 0, 1),
        (2, 30, 20, 8),
        (4, 1, 64, 16),
    ];
    let (d, dv) = (16, 24);
    // Half precision: inputs, probabilities and products rounded to 2⁻¹¹ (f16; bf16 2⁻⁸).
    let half_tol = if cfg!(feature = "cuda") { 5e-2 } else { 1e-2 };
    for (dtype, tol) in [(DType::F32, 1e-4), (half, half_tol)] {
        for (i, (n, t, past, block)) in cases.into_iter().enumerate() {
            device.seed(seed.wrapping_add(i as u64));
            let keys = past + t;
            let what = format!("N {n}, T {t}, past {past}, block {block}, {dtype:?}, seed {seed}");
            let input = |rows: usize, cols: usize| {
                Tensor::<3>::random([n, rows, cols], Distribution::Normal(0.0, 1.0), &device)
                    .cast(dtype)
                    .detach()
                    .require_grad()
            };
            let (q, k, v) = (input(t, d), input(keys, d), input(keys, dv));
            let w =
                Tensor::<3>::random([n, t, dv], Distribution::Normal(0.0, 1.0), &device).detach();
            let host = |t: Tensor<3>| -> Vec<f64> {
                t.into_data().convert::<f64>().iter::<f64>().collect()
            };
            let (hq, hk, hv, hw) = (
                host(q.clone().detach()),
                host(k.clone().detach()),
                host(v.clone().detach()),
                host(w.clone()),
            );
            let scale = 0.5f32;
            let o =
                causal_block_attention(&q, &k, &v, scale, past, block).expect("a CubeCL device");
            assert_eq!(o.dims(), [n, t, dv], "{what}");
            let grads = (o.clone().cast(DType::F32) * w).sum().backward();
            let grad = |x: &Tensor<3>, name: &str| {
                host(
                    x.grad(&grads)
                        .unwrap_or_else(|| panic!("{what}: no gradient for {name}")),
                )
            };
            let (dq, dk, dvv) = (grad(&q, "q"), grad(&k, "k"), grad(&v, "v"));
            let o = host(o.detach());
            // f64 definition: query r at position past + r sees keys 0..=past + r.
            let s = scale as f64;
            let (mut want_o, mut want_dq) = (vec![0.0; n * t * dv], vec![0.0; n * t * d]);
            let (mut want_dk, mut want_dv) = (vec![0.0; n * keys * d], vec![0.0; n * keys * dv]);
            for b in 0..n {
                let (qb, kb, vb) = (b * t * d, b * keys * d, b * keys * dv);
                for r in 0..t {
                    let seen = past + r + 1;
                    let x: Vec<f64> = (0..seen)
                        .map(|j| {
                            s * (0..d)
                                .map(|c| hq[qb + r * d + c] * hk[kb + j * d + c])
                                .sum::<f64>()
                        })
                        .collect();
                    let m = x.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
                    let p: Vec<f64> = x.iter().map(|v| (v - m).exp() / z).collect();
                    let g = &hw[(b * t + r) * dv..(b * t + r + 1) * dv];
                    // dP_j = g · v_j; dS_j = scale · p_j (dP_j − Σ p dP).
                    let dp: Vec<f64> = (0..seen)
                        .map(|j| (0..dv).map(|c| g[c] * hv[vb + j * dv + c]).sum())
                        .collect();
                    let dot: f64 = p.iter().zip(&dp).map(|(p, g)| p * g).sum();
                    for j in 0..seen {
                        let ds = s * p[j] * (dp[j] - dot);
                        for c in 0..dv {
                            want_o[(b * t + r) * dv + c] += p[j] * hv[vb + j * dv + c];
                            want_dv[vb + j * dv + c] += p[j] * g[c];
                        }
                        for c in 0..d {
                            want_dq[(b * t + r) * d + c] += ds * hk[kb + j * d + c];
                            want_dk[kb + j * d + c] += ds * hq[qb + r * d + c];
                        }
                    }
                }
            }
            let check = |name: &str, want: &[f64], got: &[f64]| {
                if want.iter().all(|x| *x == 0.0) {
                    // One visible key per query (T = 1 without a cache): the probability is 1
                    // whatever the scores, so q and k get exactly no gradient.
                    assert!(
                        got.iter().all(|g| g.abs() <= 1e-6),
                        "{what}: {name} {got:?}"
                    );
                } else {
                    assert_close(&format!("{what}: {name}"), want, got, tol);
                }
            };
            check("output", &want_o, &o);
            check("dq", &want_dq, &dq);
            check("dk", &want_dk, &dk);
            check("dv", &want_dv, &dvv);
        }
    }
}

/// The fused (FlashAttention) kernels' output and `dq`, `dk`, `dv` against the f64 definition, for
/// inputs that are strided views (`[B, T, H, d]` with heads and time swapped, as the Transformer
/// passes them), at awkward lengths (T = 1, 7, 63, 70, 200; partial last blocks), after a cache
/// (`past` > 0), for each block edge and head width that fits the device. On CUDA the half
/// precision case is bf16 on tensor cores (the Transformer's path); elsewhere f16 on the scalar
/// products.
#[test]
fn flash_attention_matches_f64() {
    use burn::tensor::Distribution;
    use loglinear::kernels::causal_flash_attention;
    let seed = test_seed(23);
    let device = device().autodiff();
    let cuda = cfg!(feature = "cuda");
    let half = if cuda { DType::BF16 } else { DType::F16 };
    // (B, H, T, past, d, block; 0 = the planner's choice). A block of 64 or a head of 128 in f32
    // takes more shared memory than lavapipe's 32 KB: those cases run on CUDA only.
    let mut cases: Vec<(usize, usize, usize, usize, usize, usize)> = vec![
        (1, 3, 1, 0, 16, 16),
        (2, 2, 7, 0, 16, 0),
        (1, 2, 63, 0, 32, 16),
        (2, 1, 70, 0, 64, 16),
        (1, 1, 200, 0, 16, 32),
        (1, 2, 30, 20, 16, 16),
        (1, 2, 1, 64, 64, 16),
        (1, 1, 90, 40, 32, 16),
    ];
    if cuda {
        cases.extend([
            (2, 2, 200, 0, 64, 64),
            (1, 2, 70, 0, 128, 0),
            (1, 1, 130, 70, 64, 64),
            (1, 2, 64, 0, 64, 32),
        ]);
    }
    let half_tol = if cuda { 5e-2 } else { 1e-2 };
    for (dtype, tol) in [(DType::F32, 1e-4), (half, half_tol)] {
        for (i, &(b, h, t, past, d, block)) in cases.iter().enumerate() {
            device.seed(seed.wrapping_add(i as u64));
            let keys = past + t;
            let what = format!(
                "B {b}, H {h}, T {t}, past {past}, d {d}, block {block}, {dtype:?}, seed {seed}"
            );
            // [B, T, H, d] drawn, seen as [B, H, T, d]: a view with strides (T·H·d, d, H·d, 1).
            let input = |rows: usize| {
                Tensor::<4>::random([b, rows, h, d], Distribution::Normal(0.0, 1.0), &device)
                    .cast(dtype)
                    .detach()
                    .swap_dims(1, 2)
                    .require_grad()
            };
            let (q, k, v) = (input(t), input(keys), input(keys));
            let w =
                Tensor::<4>::random([b, h, t, d], Distribution::Normal(0.0, 1.0), &device).detach();
            let host = |t: Tensor<4>| -> Vec<f64> {
                t.into_data().convert::<f64>().iter::<f64>().collect()
            };
            let (hq, hk, hv, hw) = (
                host(q.clone().detach()),
                host(k.clone().detach()),
                host(v.clone().detach()),
                host(w.clone()),
            );
            let scale = 0.4f32;
            let o =
                causal_flash_attention(&q, &k, &v, scale, past, block).expect("a CubeCL device");
            assert_eq!(o.dims(), [b, h, t, d], "{what}");
            let grads = (o.clone().cast(DType::F32) * w).sum().backward();
            let grad = |x: &Tensor<4>, name: &str| {
                host(
                    x.grad(&grads)
                        .unwrap_or_else(|| panic!("{what}: no gradient for {name}")),
                )
            };
            let (dq, dk, dv) = (grad(&q, "q"), grad(&k, "k"), grad(&v, "v"));
            let o = host(o.detach());
            // f64 definition: query r at position past + r sees keys 0..=past + r.
            let s = scale as f64;
            let n = b * h;
            let (mut want_o, mut want_dq) = (vec![0.0; n * t * d], vec![0.0; n * t * d]);
            let (mut want_dk, mut want_dv) = (vec![0.0; n * keys * d], vec![0.0; n * keys * d]);
            for seq in 0..n {
                let (qb, kb) = (seq * t * d, seq * keys * d);
                for r in 0..t {
                    let seen = past + r + 1;
                    let x: Vec<f64> = (0..seen)
                        .map(|j| {
                            s * (0..d)
                                .map(|c| hq[qb + r * d + c] * hk[kb + j * d + c])
                                .sum::<f64>()
                        })
                        .collect();
                    let m = x.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
                    let p: Vec<f64> = x.iter().map(|v| (v - m).exp() / z).collect();
                    let g = &hw[qb + r * d..qb + (r + 1) * d];
                    let dp: Vec<f64> = (0..seen)
                        .map(|j| (0..d).map(|c| g[c] * hv[kb + j * d + c]).sum())
                        .collect();
                    let dot: f64 = p.iter().zip(&dp).map(|(p, g)| p * g).sum();
                    for j in 0..seen {
                        let ds = s * p[j] * (dp[j] - dot);
                        for c in 0..d {
                            want_o[qb + r * d + c] += p[j] * hv[kb + j * d + c];
                            want_dv[kb + j * d + c] += p[j] * g[c];
                            want_dq[qb + r * d + c] += ds * hk[kb + j * d + c];
                            want_dk[kb + j * d + c] += ds * hq[qb + r * d + c];
                        }
                    }
                }
            }
            let check = |name: &str, want: &[f64], got: &[f64]| {
                if want.iter().all(|x| *x == 0.0) {
                    // One visible key per query (T = 1 without a cache): q and k get no gradient.
                    assert!(
                        got.iter().all(|g| g.abs() <= 1e-6),
                        "{what}: {name} {got:?}"
                    );
                } else {
                    assert_close(&format!("{what}: {name}"), want, got, tol);
                }
            };
            check("output", &want_o, &o);
            check("dq", &want_dq, &dq);
            check("dk", &want_dk, &dk);
            check("dv", &want_dv, &dv);
        }
    }
}

/// The broadcast-parameter ops (`x + b`, `x ⊙ w` with the parameter over `x`'s last axes, its
/// gradient summed over the leading axes by the column kernels) against f64: outputs, `dx` and
/// the parameter's gradient for the loss `Σ y ⊙ g`, with rows from 1 to past one chunk per
/// column, one or two parameter axes, an f32 parameter under half-precision `x`.
#[test]
fn column_kernels_match_f64() {
    use burn::tensor::Distribution;
    use loglinear::kernels::{add_columns, scale_columns};
    let seed = test_seed(31);
    let device = device().autodiff();
    let half = if cfg!(feature = "cuda") {
        DType::BF16
    } else {
        DType::F16
    };
    // (leading rows, parameter shape): rows 1, 7, 300 (> one row per chunk), 1,000.
    let cases: [(usize, &[usize]); 5] = [
        (1, &[5]),
        (7, &[3, 4]),
        (300, &[130]),
        (1000, &[8]),
        (70, &[2, 15]),
    ];
    for (dtype, tol) in [(DType::F32, 1e-5), (half, 1e-2)] {
        for (i, &(rows, pshape)) in cases.iter().enumerate() {
            device.seed(seed.wrapping_add(i as u64));
            let width: usize = pshape.iter().product();
            let what = format!("rows {rows}, parameter {pshape:?}, {dtype:?}, seed {seed}");
            let host = |t: Tensor<1>| -> Vec<f64> {
                t.into_data().convert::<f64>().iter::<f64>().collect()
            };
            let x2 = Tensor::<2>::random([rows, width], Distribution::Normal(0.0, 1.0), &device)
                .cast(dtype)
                .detach();
            let p1 = Tensor::<1>::random([width], Distribution::Normal(0.5, 1.0), &device).detach();
            let g2 = Tensor::<2>::random([rows, width], Distribution::Normal(0.0, 1.0), &device)
                .detach();
            let (hx, hp, hg) = (
                host(x2.clone().reshape([rows * width])),
                host(p1.clone()),
                host(g2.clone().reshape([rows * width])),
            );
            for scale in [false, true] {
                let x = x2.clone().require_grad();
                let p = p1.clone().require_grad();
                // x as [2, rows/2 or rows, ...] when the parameter has two axes, to test rank.
                let y = if pshape.len() == 2 {
                    let x3 = x.clone().reshape([rows, pshape[0], pshape[1]]);
                    let p2 = p.clone().reshape([pshape[0], pshape[1]]);
                    let y = if scale {
                        scale_columns(&x3, &p2)
                    } else {
                        add_columns(&x3, &p2)
                    };
                    y.expect("a CubeCL device").reshape([rows, width])
                } else {
                    let y = if scale {
                        scale_columns(&x, &p)
                    } else {
                        add_columns(&x, &p)
                    };
                    y.expect("a CubeCL device")
                };
                let grads = (y.clone().cast(DType::F32) * g2.clone()).sum().backward();
                let got_y = host(y.detach().cast(DType::F32).reshape([rows * width]));
                let got_dx = host(
                    x.grad(&grads)
                        .expect("dx")
                        .cast(DType::F32)
                        .reshape([rows * width]),
                );
                let got_dp = host(p.grad(&grads).expect("dp"));
                let mut want_y = vec![0.0; rows * width];
                let mut want_dx = vec![0.0; rows * width];
                let mut want_dp = vec![0.0; width];
                for r in 0..rows {
                    for c in 0..width {
                        let e = r * width + c;
                        if scale {
                            want_y[e] = hx[e] * hp[c];
                            want_dx[e] = hg[e] * hp[c];
                            want_dp[c] += hg[e] * hx[e];
                        } else {
                            want_y[e] = hx[e] + hp[c];
                            want_dx[e] = hg[e];
                            want_dp[c] += hg[e];
                        }
                    }
                }
                let op = if scale { "scale" } else { "bias" };
                assert_close(&format!("{what}, {op}: y"), &want_y, &got_y, tol);
                assert_close(&format!("{what}, {op}: dx"), &want_dx, &got_dx, tol);
                // The parameter's gradient is summed in f32 from half-precision products.
                assert_close(&format!("{what}, {op}: dparameter"), &want_dp, &got_dp, tol);
            }
        }
    }
}

/// The norm kernels' `(y, dx, dw, db)` against f64 for the loss `Σ y ⊙ g`: RMSNorm (`centered`
/// false) or LayerNorm, `x: [R, M, D]` with weights `[R, D]` (`R` replicas; `R = 1` passes them
/// as `[D]`), `x` optionally a narrowed (pitched) view of wider rows.
#[allow(clippy::too_many_arguments)]
fn check_norm(
    (replicas, per, width): (usize, usize, usize),
    centered: bool,
    dtype: DType,
    pitched: bool,
    tol: f64,
    seed: u64,
) {
    use burn::tensor::Distribution;
    use loglinear::kernels::fused_norm;
    let device = device().autodiff();
    device.seed(seed);
    let eps = 1e-5;
    let stored = width + if pitched { 5 } else { 0 };
    // Rows with an offset and a scale of their own, so that centring and scaling matter.
    let wide =
        (Tensor::<3>::random(
            [replicas, per, stored],
            Distribution::Normal(0.0, 1.0),
            &device,
        ) * Tensor::<3>::random([replicas, per, 1], Distribution::Uniform(0.2, 3.0), &device)
            + Tensor::<3>::random([replicas, per, 1], Distribution::Normal(0.0, 2.0), &device))
        .cast(dtype)
        .detach()
        .require_grad();
    let x = wide.clone().narrow(2, 0, width);
    let weight = (Tensor::<2>::random([replicas, width], Distribution::Normal(1.0, 0.5), &device))
        .detach()
        .require_grad();
    let bias = Tensor::<2>::random([replicas, width], Distribution::Normal(0.0, 0.5), &device)
        .detach()
        .require_grad();
    let g = Tensor::<3>::random(
        [replicas, per, width],
        Distribution::Normal(0.0, 1.0),
        &device,
    )
    .cast(dtype)
    .detach();
    let y = if replicas == 1 {
        let (w1, b1) = (
            weight.clone().reshape([width]),
            bias.clone().reshape([width]),
        );
        fused_norm(&x, &w1, centered.then_some(&b1), eps)
    } else {
        fused_norm(&x, &weight, centered.then_some(&bias), eps)
    }
    .expect("the norm kernels run on this device");
    let grads = (y.clone().cast(DType::F32) * g.clone().cast(DType::F32))
        .sum()
        .backward();
    let host =
        |t: Tensor<3>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let host2 =
        |t: Tensor<2>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let dwide = host(wide.grad(&grads).expect("a gradient for x"));
    let dw = host2(weight.grad(&grads).expect("a gradient for the weight"));
    let (xs, ws, bs, gs) = (
        host(x.clone().detach()),
        host2(weight.clone().detach()),
        host2(bias.clone().detach()),
        host(g),
    );
    // f64 reference.
    let rows = replicas * per;
    let (mut want_y, mut want_dx) = (vec![0.0; rows * width], vec![0.0; rows * width]);
    let (mut want_dw, mut want_db) = (vec![0.0; replicas * width], vec![0.0; replicas * width]);
    // dx = rstd·(g·w − mean(g·w) − x̂·mean(g·w·x̂)) cancels: on a short row it can be far smaller
    // than its terms (three values normalise to almost fixed x̂ whatever they are), and f32
    // rounds the terms, not the result. Its error is therefore measured against the largest term.
    let mut dx_term_scale = 0f64;
    for r in 0..rows {
        let (row, wr) = (&xs[r * width..(r + 1) * width], (r / per) * width);
        let n = width as f64;
        let mean = if centered {
            row.iter().sum::<f64>() / n
        } else {
            0.0
        };
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let rstd = 1.0 / (var + eps).sqrt();
        let xh: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        let gw: Vec<f64> = (0..width).map(|i| gs[r * width + i] * ws[wr + i]).collect();
        let mean_g = if centered {
            gw.iter().sum::<f64>() / n
        } else {
            0.0
        };
        let mean_gx = gw.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / n;
        for i in 0..width {
            dx_term_scale =
                dx_term_scale.max(rstd * (gw[i].abs() + mean_g.abs() + (xh[i] * mean_gx).abs()));
            want_y[r * width + i] = xh[i] * ws[wr + i] + if centered { bs[wr + i] } else { 0.0 };
            want_dx[r * width + i] = rstd * (gw[i] - mean_g - xh[i] * mean_gx);
            want_dw[wr + i] += gs[r * width + i] * xh[i];
            want_db[wr + i] += gs[r * width + i];
        }
    }
    // The gradient of the wide buffer: dx on the first `width` columns, 0 on the rest.
    let (dx, pad): (Vec<f64>, Vec<f64>) = {
        let (mut dx, mut pad) = (Vec::new(), Vec::new());
        for (i, v) in dwide.iter().enumerate() {
            if i % stored < width {
                dx.push(*v)
            } else {
                pad.push(*v)
            }
        }
        (dx, pad)
    };
    let what = format!(
        "norm R {replicas} × {per} rows × {width}, centered {centered}, {dtype:?}, pitched \
         {pitched}, seed {seed}"
    );
    assert_close(&format!("{what}: y"), &want_y, &host(y.detach()), tol);
    let dx_error = want_dx
        .iter()
        .zip(&dx)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        dx.iter().all(|v| v.is_finite()) && dx_error <= tol * dx_term_scale,
        "{what}: dx: max |Δ| = {dx_error:.3e} = {:.3e} of its largest term (tolerance {tol:.1e})",
        dx_error / dx_term_scale
    );
    assert!(
        want_dx.iter().any(|v| *v != 0.0),
        "{what}: dx: the reference is all zeros, so the comparison proves nothing"
    );
    assert!(
        pad.iter().all(|v| *v == 0.0),
        "{what}: gradient on columns past the view"
    );
    assert_close(&format!("{what}: dweight"), &want_dw, &dw, tol);
    if centered {
        let db = host2(bias.grad(&grads).expect("a gradient for the bias"));
        assert_close(&format!("{what}: dbias"), &want_db, &db, tol);
    } else {
        assert!(
            bias.grad(&grads).is_none(),
            "{what}: RMSNorm gave its stand-in bias a gradient"
        );
    }
}

#[test]
fn norm_kernels_match_f64() {
    let seed = test_seed(41);
    // Widths below, at and past the 128 units of a row's cube; row counts past the 256 chunks of
    // the column sums (chunks of 2 rows, the last ones empty); replicas; one row of three (its dx
    // cancels, see `check_norm`).
    for (shape, centered, dtype, pitched, tol) in [
        ((1, 1, 3), true, DType::F32, false, 1e-5),
        ((1, 1, 7), false, DType::F32, false, 1e-5),
        ((1, 3, 7), true, DType::F32, true, 1e-5),
        ((1, 300, 130), true, DType::F32, false, 1e-5),
        ((1, 200, 513), false, DType::F32, true, 1e-5),
        ((4, 33, 96), true, DType::F32, false, 1e-5),
        ((3, 70, 64), false, DType::F32, true, 1e-5),
        // Half precision: x, y, dy and dx round to 2⁻¹¹.
        ((1, 63, 200), true, DType::F16, false, 3e-3),
        ((2, 40, 128), false, DType::F16, true, 3e-3),
    ] {
        check_norm(shape, centered, dtype, pitched, tol, seed);
    }
}

/// The causal-convolution kernels' `(y, dx, dweight, dbias)` against f64 for the loss `Σ y ⊙ g`.
fn check_conv(
    (b, t, c, k): (usize, usize, usize, usize),
    bias: bool,
    dtype: DType,
    tol: f64,
    seed: u64,
) {
    use burn::tensor::Distribution;
    use loglinear::kernels::fused_causal_conv;
    let device = device().autodiff();
    device.seed(seed);
    let s = t + k - 1;
    let x = Tensor::<3>::random([b, s, c], Distribution::Normal(0.0, 1.0), &device)
        .cast(dtype)
        .detach()
        .require_grad();
    let weight = Tensor::<2>::random([c, k], Distribution::Normal(0.0, 0.5), &device)
        .detach()
        .require_grad();
    let bias_t = Tensor::<1>::random([c], Distribution::Normal(0.0, 0.5), &device)
        .detach()
        .require_grad();
    let g = Tensor::<3>::random([b, t, c], Distribution::Normal(0.0, 1.0), &device)
        .cast(dtype)
        .detach();
    let y = fused_causal_conv(&x, &weight, bias.then_some(&bias_t))
        .expect("the convolution kernels run on this device");
    assert_eq!(y.dims(), [b, t, c], "conv output shape");
    let grads = (y.clone().cast(DType::F32) * g.clone().cast(DType::F32))
        .sum()
        .backward();
    let host =
        |t: Tensor<3>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let host2 =
        |t: Tensor<2>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let host1 =
        |t: Tensor<1>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let (xs, ws, bs, gs) = (
        host(x.clone().detach()),
        host2(weight.clone().detach()),
        host1(bias_t.clone().detach()),
        host(g),
    );
    let (mut want_y, mut want_dx) = (vec![0.0; b * t * c], vec![0.0; b * s * c]);
    let (mut want_dw, mut want_db) = (vec![0.0; c * k], vec![0.0; c]);
    for bi in 0..b {
        for ti in 0..t {
            for ci in 0..c {
                let o = (bi * t + ti) * c + ci;
                let mut v = if bias { bs[ci] } else { 0.0 };
                for j in 0..k {
                    let xi = (bi * s + ti + j) * c + ci;
                    v += ws[ci * k + j] * xs[xi];
                    want_dx[xi] += ws[ci * k + j] * gs[o];
                    want_dw[ci * k + j] += gs[o] * xs[xi];
                }
                want_y[o] = v;
                want_db[ci] += gs[o];
            }
        }
    }
    let what = format!("conv B {b}, T {t}, C {c}, K {k}, bias {bias}, {dtype:?}, seed {seed}");
    assert_close(&format!("{what}: y"), &want_y, &host(y.detach()), tol);
    let dx = host(x.grad(&grads).expect("a gradient for x"));
    assert_close(&format!("{what}: dx"), &want_dx, &dx, tol);
    let dw = host2(weight.grad(&grads).expect("a gradient for the weight"));
    assert_close(&format!("{what}: dweight"), &want_dw, &dw, tol);
    if bias {
        let db = host1(bias_t.grad(&grads).expect("a gradient for the bias"));
        assert_close(&format!("{what}: dbias"), &want_db, &db, tol);
    } else {
        assert!(
            bias_t.grad(&grads).is_none(),
            "{what}: a gradient for a bias that was not used"
        );
    }
}

#[test]
fn causal_conv_kernels_match_f64() {
    let seed = test_seed(43);
    // T = 1; one tap; channels past one cube of 256 and of the 128-wide column sums; more output
    // rows than the 256 chunks of the weight sums; no bias (the Gated DeltaNet's convolution).
    for (shape, bias, dtype, tol) in [
        ((1, 1, 5, 4), true, DType::F32, 1e-5),
        ((2, 7, 3, 1), true, DType::F32, 1e-5),
        ((2, 70, 300, 4), true, DType::F32, 1e-5),
        ((3, 200, 64, 4), false, DType::F32, 1e-5),
        ((2, 63, 130, 3), true, DType::F16, 3e-3),
    ] {
        check_conv(shape, bias, dtype, tol, seed);
    }
}

#[test]
fn language_models_on_the_kernels_match_the_cpu() {
    use loglinear::nn::{GdnConfig, LmConfig, LogLinearLm, MixerConfig};
    use loglinear::ops::Form;
    // The log-linear LMs (Mamba-2 and Gated DeltaNet mixers) with the same weights on the CPU
    // (tensor ops) and on the test's CubeCL device (norms, the causal convolution and the loss
    // on the kernels; the core op in the same chunked form on both): same logits, same
    // gradients of the block's norms and of the mixer's convolution.
    let seed = test_seed(47);
    let (b, t) = (2, 70);
    let mamba = LmConfig {
        initializer_range: 0.2,
        ..LmConfig::new(50, 2, MixerConfig::new(32))
    };
    let gdn = LmConfig {
        gdn: Some(GdnConfig {
            heads: 2,
            d_state: 8,
            head_dim: 8,
            ..GdnConfig::new(32)
        }),
        ..mamba.clone()
    };
    let host1 =
        |t: Tensor<1>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let host2 =
        |t: Tensor<2>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    let host3 =
        |t: Tensor<3>| -> Vec<f64> { t.into_data().convert::<f64>().iter::<f64>().collect() };
    for (name, cfg) in [("mamba2", mamba), ("gdn", gdn)] {
        let cpu = Device::flex().autodiff();
        let gpu = device().autodiff();
        let model = cfg.init(seed, &cpu);
        let model_gpu = model.clone().fork(&gpu);
        let tokens = loglinear::testing::random_tokens(b, t, cfg.vocab_size, seed, &Device::flex());
        let run = |m: &LogLinearLm, device: &Device| {
            let logits = m.forward(
                tokens.clone().to_device(device),
                Form::Chunked { chunk: 16 },
            );
            let w = Tensor::<3>::ones(logits.dims(), device).mul_scalar(0.01)
                + logits.clone().detach().sin();
            let grads = (logits.clone() * w).sum().backward();
            let block = &m.blocks[0];
            let grad1 = |p: &burn::module::Param<Tensor<1>>| host1(p.grad(&grads).expect("grad"));
            let grad2 = |p: &burn::module::Param<Tensor<2>>| host2(p.grad(&grads).expect("grad"));
            let (conv, norm) = match (&block.mixer, &block.gdn) {
                (Some(mx), _) => (grad2(&mx.conv_weight), grad1(&mx.norm_weight)),
                (None, Some(g)) => (grad2(&g.conv_weight), grad1(&g.norm_weight)),
                _ => unreachable!("a block has a mixer"),
            };
            let mut bias = Vec::new();
            if let Some(mx) = &block.mixer {
                bias = grad1(&mx.conv_bias);
            }
            (
                host3(logits.detach()),
                grad1(&block.mixer_norm.weight),
                conv,
                norm,
                bias,
            )
        };
        let want = run(&model, &cpu);
        let got = run(&model_gpu, &gpu);
        let what = format!("{name} LM, T {t}, seed {seed}");
        assert_close(&format!("{what}: logits"), &want.0, &got.0, 1e-4);
        assert_close(&format!("{what}: d mixer_norm"), &want.1, &got.1, 1e-3);
        assert_close(&format!("{what}: d conv_weight"), &want.2, &got.2, 1e-3);
        assert_close(&format!("{what}: d mixer's norm"), &want.3, &got.3, 1e-3);
        if !want.4.is_empty() {
            assert_close(&format!("{what}: d conv_bias"), &want.4, &got.4, 1e-3);
        }
    }
}
