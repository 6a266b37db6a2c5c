//! `loglinear bench op` on the CPU: correctness first, then one row per form and length; the
//! fused form is the chunked fallback here and says so. `bench train` over two CPU devices: the
//! data-parallel step's rows.

use burn::prelude::*;
use burn::tensor::DType;
use loglinear::ops::Form;
use loglinear_cli::bench::{
    OpBench, OpVariant, bench_op, chunked_flops, chunked_train_flops, parse_form,
};

#[test]
fn bench_op_checks_then_times_each_form_on_the_cpu() {
    let cfg = OpBench {
        lengths: vec![64, 96],
        tokens: 128,
        heads: 2,
        n: 8,
        p: 8,
        chunk: 16,
        dtype: DType::F32,
        runs: 1,
        lambda_one: true,
        forms: vec![
            parse_form("fused", 16).unwrap(),
            parse_form("chunked", 16).unwrap(),
        ],
        variant: OpVariant::Mamba2,
    };
    let report = bench_op(&cfg, &Device::flex()).unwrap();
    assert!(report.contains("correctness: fused"), "{report}");
    assert!(report.contains("correctness: chunked(C=16)"), "{report}");
    for row in [
        "| fused (chunked fallback) | 64 | 2 | learned |",
        "| fused (chunked fallback) | 96 | 1 | ≡1 |",
        "| chunked(C=16) | 96 | 1 | learned |",
    ] {
        assert!(report.contains(row), "missing {row:?} in\n{report}");
    }
    // Every row has the header's columns (fwd+bwd TFLOP/s among them).
    let table: Vec<&str> = report.lines().filter(|l| l.starts_with("| ")).collect();
    assert!(table[0].contains("| fwd+bwd TFLOP/s |"), "{report}");
    let columns = |l: &str| l.matches('|').count();
    assert!(
        table.iter().all(|l| columns(l) == columns(table[0])),
        "{report}"
    );
    assert!(parse_form("fast", 16).is_err());
    assert_eq!(parse_form("parallel", 16).unwrap(), Form::Parallel);
}

/// The FLOP counts behind bench op's TFLOP/s, by hand at T = 64, chunk 32, N = P = 16: one
/// level above the chunk (`num_levels(64) = 7`, of which a chunk of 32 holds 6). Forward per head:
/// `64·32·32 + 2·64·256 = 98,304`; backward: `64·32·(3·16 + 2·16) + 5·64·256 = 245,760`;
/// ×2 for multiply-add, ×B·H = 3.
#[test]
fn op_flop_counts_match_the_hand_count() {
    assert_eq!(chunked_flops(1, 64, 3, 16, 16, 32), 2.0 * 3.0 * 98_304.0);
    assert_eq!(
        chunked_train_flops(1, 64, 3, 16, 16, 32),
        2.0 * 3.0 * (98_304.0 + 245_760.0)
    );
}

/// The Gated DeltaNet op: its chunked form checked against its f64 parallel form (T = 200, a
/// partial last chunk), then one row per length; the fused form is refused by name.
#[test]
fn bench_op_gdn_checks_then_times_the_chunked_form() {
    let mut cfg = OpBench {
        lengths: vec![32, 70],
        tokens: 140,
        heads: 2,
        n: 8,
        p: 12,
        chunk: 16,
        dtype: DType::F32,
        runs: 1,
        lambda_one: false,
        forms: vec![parse_form("chunked", 16).unwrap()],
        variant: OpVariant::Gdn,
    };
    let report = bench_op(&cfg, &Device::flex()).unwrap();
    assert!(
        report.contains("correctness: gdn chunked(C=16)"),
        "{report}"
    );
    for row in ["| chunked(C=16) | 32 | 4 |", "| chunked(C=16) | 70 | 2 |"] {
        assert!(report.contains(row), "missing {row:?} in\n{report}");
    }
    cfg.forms = vec![parse_form("fused", 16).unwrap()];
    let err = bench_op(&cfg, &Device::flex()).unwrap_err().to_string();
    assert!(err.contains("no fused form for Gated DeltaNet"), "{err}");
}

/// `bench gemm`: one row per product (the right operand as stored or as a transposed view), the
/// two paths agreeing (on the CPU both are Burn's matmul: exactly); malformed shapes refused.
#[test]
fn bench_gemm_compares_and_times_each_product() {
    use loglinear_cli::bench::{GemmShape, bench_gemm, parse_gemm_shape};
    assert_eq!(
        parse_gemm_shape("33x17x9t").unwrap(),
        GemmShape {
            m: 33,
            k: 17,
            n: 9,
            transposed: true
        }
    );
    for bad in ["3x4", "0x4x5", "3x4x5x6", "ax4x5", "3x4x5T"] {
        assert!(parse_gemm_shape(bad).is_err(), "{bad} accepted");
    }
    let shapes = [
        parse_gemm_shape("20x7x13").unwrap(),
        parse_gemm_shape("33x17x9t").unwrap(),
    ];
    let report = bench_gemm(&shapes, DType::F32, 1, &Device::flex()).unwrap();
    for row in ["| [20×7]·[7×13] |", "| [33×17]·[17×9]ᵀ |"] {
        let line = report
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("missing {row:?} in\n{report}"));
        assert!(line.ends_with("| 0.0e0 |"), "the two paths differ: {line}");
    }
}

/// `bench train` over two CPU devices: the data-parallel step on one device, then on both with
/// twice the global batch, one row each, and the replicas checked identical after timing.
#[test]
fn bench_train_times_the_data_parallel_step_on_one_and_on_all_devices() {
    use loglinear_cli::bench::{TrainBench, bench_train_data_parallel};
    use loglinear_cli::data_parallel::GradSync;
    let cfg = TrainBench {
        d_model: 64,
        layers: 1,
        seq_len: 8,
        batch: 1,
        modes: vec!["linear".into()],
        runs: 1,
        precision: "full".into(),
        form: "chunked".into(),
        profile_steps: 0,
        check: false,
    };
    let devices = [Device::flex(), Device::flex()];
    let report = bench_train_data_parallel(&cfg, &devices, GradSync::Host).unwrap();
    for row in ["| linear | 1 | 1 |", "| linear | 2 | 2 |"] {
        assert!(report.contains(row), "missing {row:?} in\n{report}");
    }
    assert!(report.contains("| 1.000 |"), "{report}");
    assert!(
        report.contains("replicas identical after the timed steps: yes (2 devices)"),
        "{report}"
    );
}
