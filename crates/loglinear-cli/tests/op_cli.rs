//! `loglinear op` end to end: the built binary on safetensors files. Every form's output is
//! checked against the plain f64 loop of the definition, every form's gradients against the
//! parallel form's, and the parallel form's gradients against central finite differences of
//! that loop; every bad input must fail with one line naming the problem and leave no output.
//! `--variant gdn` (Gated DeltaNet) is checked against the library's f64 parallel form (itself
//! tested against plain loops and finite differences in `crates/loglinear/tests/gdn.rs`).
//!
//! The bundled example (`examples-data/example.safetensors`) is regenerated from its seed here;
//! after an intended change, rewrite it with
//! `LOGLINEAR_REGENERATE_EXAMPLE=1 cargo test -p loglinear-cli --test op_cli bundled_example`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use burn::prelude::*;
use burn::tensor::DType;
use loglinear::fenwick::num_levels;
use loglinear::host::{HostInput, closeness};
use loglinear::ops::gdn::GdnInput;
use loglinear::ops::{Dims, Form, LogLinearInput};
use loglinear::testing::{assert_close, run_gdn_with_grads};
use safetensors::{Dtype, SafeTensors};

const BIN: &str = env!("CARGO_BIN_EXE_loglinear");

/// A tensor to write: dtype, shape, little-endian bytes.
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl safetensors::View for Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn raw(dtype: Dtype, shape: &[usize], values: &[f64]) -> Raw {
    let bytes = match dtype {
        Dtype::F32 => values
            .iter()
            .flat_map(|x| (*x as f32).to_le_bytes())
            .collect(),
        Dtype::F64 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        other => panic!("raw: no encoder for {other:?}"),
    };
    Raw {
        dtype,
        shape: shape.to_vec(),
        bytes,
    }
}

fn write_file(path: &Path, tensors: Vec<(&str, Raw)>) {
    safetensors::serialize_to_file(tensors, &None, path).expect("write safetensors");
}

/// Every tensor of a file as `(dtype, shape, values as f64)`.
fn read_file(path: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<f64>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let file = SafeTensors::deserialize(&bytes).expect("a safetensors file");
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let values: Vec<f64> = match view.dtype() {
                Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                Dtype::F64 => view
                    .data()
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                other => panic!("{name}: unexpected dtype {other:?}"),
            };
            (name, (view.dtype(), view.shape().to_vec(), values))
        })
        .collect()
}

/// A seeded input at Mamba-2 scales and a cotangent, with every value rounded to f32 so that the
/// f32 and f64 files hold the same numbers.
fn case(dims: Dims, seed: u64) -> (HostInput, Vec<f64>) {
    let device = Device::flex();
    let x = HostInput::from_input(&LogLinearInput::random(dims, seed, DType::F64, &device));
    let d_o = LogLinearInput::random(Dims { n: dims.p, ..dims }, seed ^ 0xD0, DType::F64, &device);
    let round = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|x| x as f32 as f64).collect() };
    let d_o = round(HostInput::from_input(&d_o).q);
    let x = HostInput {
        dims,
        q: round(x.q),
        k: round(x.k),
        v: round(x.v),
        g: round(x.g),
        lambda: round(x.lambda),
    };
    (x, d_o)
}

/// The named tensors of an input file (with `do`).
fn input_tensors(x: &HostInput, d_o: &[f64], dtype: Dtype) -> Vec<(&'static str, Raw)> {
    let Dims { b, t, h, n, p, l } = x.dims;
    vec![
        ("q", raw(dtype, &[b, t, h, n], &x.q)),
        ("k", raw(dtype, &[b, t, h, n], &x.k)),
        ("v", raw(dtype, &[b, t, h, p], &x.v)),
        ("g", raw(dtype, &[b, t, h], &x.g)),
        ("lambda", raw(dtype, &[b, t, h, l], &x.lambda)),
        ("do", raw(dtype, &[b, t, h, p], d_o)),
    ]
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run the loglinear binary")
}

fn path_arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Runs `op` and returns the output file's tensors, failing with the binary's stderr.
fn run_op(
    input: &Path,
    output: &Path,
    extra: &[&str],
) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<f64>)> {
    let mut args = vec![
        "op",
        "--input",
        path_arg(input),
        "--output",
        path_arg(output),
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert!(
        out.status.success(),
        "loglinear {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    read_file(output)
}

const GRAD_NAMES: [&str; 5] = ["dq", "dk", "dv", "dg", "dlambda"];

#[test]
fn every_form_round_trips_in_f64_and_f32() {
    let dir = tempfile::tempdir().unwrap();
    // T = 70: a partial last chunk for C = 16 and C = 64; one λ slot more than needed.
    let dims = Dims {
        b: 2,
        t: 70,
        h: 2,
        n: 8,
        p: 4,
        l: num_levels(70) + 1,
    };
    let (x, d_o) = case(dims, 11);
    let o_loop = x.reference_output();
    let shapes: BTreeMap<&str, Vec<usize>> = BTreeMap::from([
        ("o", vec![2, 70, 2, 4]),
        ("dq", vec![2, 70, 2, 8]),
        ("dk", vec![2, 70, 2, 8]),
        ("dv", vec![2, 70, 2, 4]),
        ("dg", vec![2, 70, 2]),
        ("dlambda", vec![2, 70, 2, dims.l]),
    ]);

    // The f64 parallel form: the reference for every form's gradients in both precisions.
    let input64 = dir.path().join("in64.safetensors");
    write_file(&input64, input_tensors(&x, &d_o, Dtype::F64));
    let reference = run_op(
        &input64,
        &dir.path().join("ref.safetensors"),
        &["--form", "parallel", "--grad"],
    );
    assert_close(
        "f64 parallel o vs f64 loop",
        &o_loop,
        &reference["o"].2,
        1e-12,
    );

    let forms: [&[&str]; 5] = [
        &["--form", "parallel"],
        &["--form", "chunked", "--chunk", "16"],
        &["--form", "chunked"],
        &[],
        &["--form", "recurrent"],
    ];
    for (dtype, tol_o, tol_grad) in [(Dtype::F64, 1e-12, 1e-10), (Dtype::F32, 2e-5, 2e-4)] {
        let input = dir.path().join(format!("in_{dtype:?}.safetensors"));
        write_file(&input, input_tensors(&x, &d_o, dtype));
        for (i, form) in forms.iter().enumerate() {
            let ctx = format!("{dtype:?} {form:?}");
            let output = dir.path().join(format!("out_{dtype:?}_{i}.safetensors"));
            let mut args = form.to_vec();
            args.push("--grad");
            let got = run_op(&input, &output, &args);
            assert_eq!(
                got.keys().map(String::as_str).collect::<Vec<_>>(),
                ["dg", "dk", "dlambda", "dq", "dv", "o"],
                "{ctx}: tensors of OUT"
            );
            for (name, (dt, shape, _)) in &got {
                assert_eq!(*dt, dtype, "{ctx} {name}: dtype");
                assert_eq!(shape, &shapes[name.as_str()], "{ctx} {name}: shape");
            }
            assert_close(&format!("{ctx} o vs f64 loop"), &o_loop, &got["o"].2, tol_o);
            for name in GRAD_NAMES {
                assert_close(
                    &format!("{ctx} {name} vs f64 parallel"),
                    &reference[name].2,
                    &got[name].2,
                    tol_grad,
                );
            }

            // Without --grad: only o, equal to the o of the --grad run.
            let plain = run_op(&input, &output, form);
            assert_eq!(
                plain.keys().collect::<Vec<_>>(),
                ["o"],
                "{ctx}: forward only"
            );
            assert_close(
                &format!("{ctx} o without --grad"),
                &got["o"].2,
                &plain["o"].2,
                1e-15,
            );
        }
    }
}

#[test]
fn parallel_gradients_match_central_finite_differences_of_the_loop() {
    let dir = tempfile::tempdir().unwrap();
    let dims = Dims {
        b: 1,
        t: 6,
        h: 2,
        n: 3,
        p: 2,
        l: num_levels(6),
    };
    let (x, d_o) = case(dims, 23);
    let input = dir.path().join("in.safetensors");
    write_file(&input, input_tensors(&x, &d_o, Dtype::F64));
    let got = run_op(
        &input,
        &dir.path().join("out.safetensors"),
        &["--form", "parallel", "--grad"],
    );

    let loss = |x: &HostInput| -> f64 {
        x.reference_output()
            .iter()
            .zip(&d_o)
            .map(|(o, d)| o * d)
            .sum()
    };
    let eps = 1e-6;
    for name in GRAD_NAMES {
        let len = field(&mut x.clone(), name).len();
        let numeric: Vec<f64> = (0..len)
            .map(|i| {
                let mut plus = x.clone();
                let mut minus = x.clone();
                field(&mut plus, name)[i] += eps;
                field(&mut minus, name)[i] -= eps;
                (loss(&plus) - loss(&minus)) / (2.0 * eps)
            })
            .collect();
        assert_close(
            &format!("{name} vs finite differences"),
            &numeric,
            &got[name].2,
            1e-6,
        );
    }
}

/// The input tensor whose gradient is `name`.
fn field<'a>(x: &'a mut HostInput, name: &str) -> &'a mut Vec<f64> {
    match name {
        "dq" => &mut x.q,
        "dk" => &mut x.k,
        "dv" => &mut x.v,
        "dg" => &mut x.g,
        "dlambda" => &mut x.lambda,
        other => panic!("no input for {other}"),
    }
}

/// Runs `op` on `input` with `extra` arguments, expecting a failure: exit code ≠ 0, exactly one
/// line on stderr that contains every needle, and no output (nor temporary) file.
fn expect_failure(input: &Path, extra: &[&str], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.safetensors");
    let mut args = vec![
        "op",
        "--input",
        path_arg(input),
        "--output",
        path_arg(&output),
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{args:?} succeeded; stderr: {stderr}"
    );
    assert_ne!(out.status.code(), Some(0));
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line on stderr: {stderr}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {}", lines[0]);
    for needle in needles {
        assert!(
            lines[0].contains(needle),
            "{args:?}: {:?} does not mention {needle:?}",
            lines[0]
        );
    }
    assert!(!output.exists(), "{args:?}: an output file was left behind");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "{args:?}: files left behind: {left:?}");
}

/// A valid small input (T = 10, so L = 5) in f64, minus `drop`, with `replace` swapped in.
fn bad_input(dir: &Path, drop: &[&str], replace: Vec<(&'static str, Raw)>) -> PathBuf {
    let dims = Dims {
        b: 1,
        t: 10,
        h: 2,
        n: 4,
        p: 3,
        l: num_levels(10),
    };
    let (x, d_o) = case(dims, 5);
    let mut tensors: Vec<(&str, Raw)> = input_tensors(&x, &d_o, Dtype::F64)
        .into_iter()
        .filter(|(name, _)| !drop.contains(name) && !replace.iter().any(|(r, _)| r == name))
        .collect();
    tensors.extend(replace);
    let path = dir.join("in.safetensors");
    write_file(&path, tensors);
    path
}

#[test]
fn a_missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = bad_input(dir.path(), &["lambda"], vec![]);
    expect_failure(&input, &[], &["missing tensor", "`lambda`"]);
    let input = bad_input(dir.path(), &["do"], vec![]);
    expect_failure(&input, &["--grad"], &["missing tensor", "`do`", "--grad"]);
}

#[test]
fn a_shape_mismatch_names_the_tensor_and_the_expected_shape() {
    let dir = tempfile::tempdir().unwrap();
    let k = raw(Dtype::F64, &[1, 9, 2, 4], &[0.5; 72]);
    let input = bad_input(dir.path(), &[], vec![("k", k)]);
    expect_failure(
        &input,
        &[],
        &[
            "`k`",
            "[1, 9, 2, 4]",
            "expected [B, T, H, N] = [1, 10, 2, 4]",
        ],
    );
    let d_o = raw(Dtype::F64, &[1, 10, 2, 4], &[0.5; 80]);
    let input = bad_input(dir.path(), &[], vec![("do", d_o)]);
    expect_failure(&input, &["--grad"], &["`do`", "[1, 10, 2, 3]"]);
    let g = raw(Dtype::F64, &[1, 20], &[-0.1; 20]);
    let input = bad_input(dir.path(), &[], vec![("g", g)]);
    expect_failure(&input, &[], &["`g`", "rank 2", "expected rank 3"]);
}

#[test]
fn too_few_levels_says_how_many_are_needed() {
    let dir = tempfile::tempdir().unwrap();
    let lambda = raw(Dtype::F64, &[1, 10, 2, 4], &[1.0; 80]);
    let input = bad_input(dir.path(), &[], vec![("lambda", lambda)]);
    expect_failure(
        &input,
        &[],
        &["lambda has 4 levels", "T = 10", "at least 5"],
    );
}

#[test]
fn mixed_and_unsupported_dtypes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let g = raw(Dtype::F32, &[1, 10, 2], &[-0.1; 20]);
    let input = bad_input(dir.path(), &[], vec![("g", g)]);
    expect_failure(&input, &[], &["mixed dtypes", "`g` is F32", "F64"]);
    let lambda = Raw {
        dtype: Dtype::BF16,
        shape: vec![1, 10, 2, 5],
        bytes: vec![0; 200],
    };
    let input = bad_input(dir.path(), &[], vec![("lambda", lambda)]);
    expect_failure(&input, &[], &["`lambda`", "unsupported dtype BF16"]);
}

#[test]
fn non_finite_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut values = vec![0.5; 60];
    values[7] = f64::NAN;
    let v = raw(Dtype::F64, &[1, 10, 2, 3], &values);
    let input = bad_input(dir.path(), &[], vec![("v", v)]);
    expect_failure(&input, &[], &["`v`", "NaN"]);
}

#[test]
fn unreadable_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.safetensors");
    expect_failure(&absent, &[], &["cannot read", "absent.safetensors"]);
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"this is not a safetensors file at all").unwrap();
    expect_failure(
        &garbage,
        &[],
        &["garbage.safetensors", "not a safetensors file"],
    );
}

#[test]
fn a_chunk_that_is_not_a_power_of_two_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = bad_input(dir.path(), &[], vec![]);
    expect_failure(&input, &["--chunk", "48"], &["--chunk 48", "power of two"]);
    expect_failure(
        &input,
        &["--form", "chunked", "--chunk", "0"],
        &["--chunk 0", "power of two"],
    );
}

#[test]
fn an_unwritable_output_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = bad_input(dir.path(), &[], vec![]);
    let output = dir.path().join("no-such-dir").join("out.safetensors");
    let out = run(&[
        "op",
        "--input",
        path_arg(&input),
        "--output",
        path_arg(&output),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot write"), "{stderr}");
    assert!(!output.exists());
}

/// The example's seed and sizes; see the module doc for regenerating the file.
fn example_tensors() -> Vec<(&'static str, Raw)> {
    let dims = Dims {
        b: 1,
        t: 70,
        h: 2,
        n: 8,
        p: 8,
        l: num_levels(70),
    };
    let (x, d_o) = case(dims, 70);
    input_tensors(&x, &d_o, Dtype::F64)
}

#[test]
fn bundled_example_runs_every_form_and_matches_its_seed() {
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples-data/example.safetensors");
    if std::env::var_os("LOGLINEAR_REGENERATE_EXAMPLE").is_some() {
        write_file(&bundled, example_tensors());
        eprintln!(
            "rewrote {}; rebuild the binary to bundle it",
            bundled.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let example_dir = dir.path().join("example");
    let out = run(&["op", "--example", path_arg(&example_dir)]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "op --example failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The file written is the bundled one, and the bundled one is what its seed gives.
    let written = read_file(&example_dir.join("example.safetensors"));
    assert_eq!(
        written,
        read_file(&bundled),
        "--example wrote other tensors than the bundled file"
    );
    let dir2 = tempfile::tempdir().unwrap();
    let regenerated = dir2.path().join("regenerated.safetensors");
    write_file(&regenerated, example_tensors());
    assert_eq!(
        written,
        read_file(&regenerated),
        "examples-data/example.safetensors differs from its seed; see the module doc"
    );

    // Every distance in the table (all but the last column, milliseconds) is f64 rounding.
    let rows = [
        "parallel vs loop",
        "chunked(C=64)",
        "chunked(C=16)",
        "recurrent",
    ];
    for row in rows {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no row {row:?} in:\n{stdout}"));
        let mut numbers: Vec<f64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        numbers.pop();
        assert!(!numbers.is_empty(), "{line}");
        assert!(numbers.iter().all(|d| *d < 1e-10), "{row}: {line}");
    }
}

// ---------------------------------------------------------------------------------------------
// `--variant gdn`: log-linear Gated DeltaNet (`loglinear::ops::gdn`).

const GDN_GRAD_NAMES: [&str; 6] = ["dq", "dk", "dv", "dg", "dbeta", "dlambda"];

/// A seeded Gated DeltaNet input at layer scales (values rounded to f32, so that the f32 and
/// f64 files hold the same numbers), as named tensors with `do`, and the same input uploaded
/// in f64 to an autodiff device with the cotangent.
fn gdn_case(
    dims: Dims,
    seed: u64,
    dtype: Dtype,
) -> (Vec<(&'static str, Raw)>, GdnInput, Tensor<4>) {
    let device = Device::flex().autodiff();
    let x = GdnInput::random(dims, seed, DType::F32, &device).cast(DType::F64);
    let d_o = GdnInput::random(Dims { n: dims.p, ..dims }, seed ^ 0xD0, DType::F32, &device)
        .v
        .cast(DType::F64);
    let Dims { b, t, h, n, p, l } = dims;
    let host = |x: &Tensor<4>| loglinear::host::to_f64(x);
    let host3 = |x: &Tensor<3>| loglinear::host::to_f64(x);
    let tensors = vec![
        ("q", raw(dtype, &[b, t, h, n], &host(&x.q))),
        ("k", raw(dtype, &[b, t, h, n], &host(&x.k))),
        ("v", raw(dtype, &[b, t, h, p], &host(&x.v))),
        ("g", raw(dtype, &[b, t, h], &host3(&x.g))),
        ("beta", raw(dtype, &[b, t, h], &host3(&x.beta))),
        ("lambda", raw(dtype, &[b, t, h, l], &host(&x.lambda))),
        ("do", raw(dtype, &[b, t, h, p], &host(&d_o))),
    ];
    (tensors, x, d_o)
}

#[test]
fn gdn_every_form_round_trips_in_f64_and_f32() {
    let dir = tempfile::tempdir().unwrap();
    // T = 70: a partial last chunk for C = 16 and C = 64; N ≠ P; one λ slot more than needed.
    let dims = Dims {
        b: 2,
        t: 70,
        h: 2,
        n: 8,
        p: 4,
        l: num_levels(70) + 1,
    };
    // The library's f64 parallel form in this process: the reference for every form.
    let (_, x, d_o) = gdn_case(dims, 12, Dtype::F64);
    let reference = run_gdn_with_grads(&x, &d_o, Form::Parallel, None);
    let shapes: BTreeMap<&str, Vec<usize>> = BTreeMap::from([
        ("o", vec![2, 70, 2, 4]),
        ("dq", vec![2, 70, 2, 8]),
        ("dk", vec![2, 70, 2, 8]),
        ("dv", vec![2, 70, 2, 4]),
        ("dg", vec![2, 70, 2]),
        ("dbeta", vec![2, 70, 2]),
        ("dlambda", vec![2, 70, 2, dims.l]),
    ]);
    let forms: [&[&str]; 4] = [
        &["--form", "parallel"],
        &["--form", "chunked", "--chunk", "16"],
        &[],
        &["--form", "recurrent"],
    ];
    for (dtype, tol_o, tol_grad) in [(Dtype::F64, 1e-12, 1e-11), (Dtype::F32, 1e-5, 2e-5)] {
        let input = dir.path().join(format!("gdn_{dtype:?}.safetensors"));
        write_file(&input, gdn_case(dims, 12, dtype).0);
        for (i, form) in forms.iter().enumerate() {
            let ctx = format!("gdn {dtype:?} {form:?}");
            let output = dir
                .path()
                .join(format!("gdn_out_{dtype:?}_{i}.safetensors"));
            let mut args = vec!["--variant", "gdn", "--grad"];
            args.extend_from_slice(form);
            let got = run_op(&input, &output, &args);
            assert_eq!(
                got.keys().map(String::as_str).collect::<Vec<_>>(),
                ["dbeta", "dg", "dk", "dlambda", "dq", "dv", "o"],
                "{ctx}: tensors of OUT"
            );
            for (name, (dt, shape, _)) in &got {
                assert_eq!(*dt, dtype, "{ctx} {name}: dtype");
                assert_eq!(shape, &shapes[name.as_str()], "{ctx} {name}: shape");
            }
            assert_close(&format!("{ctx} o"), &reference.o, &got["o"].2, tol_o);
            for (name, r) in &reference.grads {
                assert_close(&format!("{ctx} {name}"), r, &got[*name].2, tol_grad);
            }

            // Without --grad: only o, equal to the o of the --grad run.
            let mut args = vec!["--variant", "gdn"];
            args.extend_from_slice(form);
            let plain = run_op(&input, &output, &args);
            assert_eq!(
                plain.keys().collect::<Vec<_>>(),
                ["o"],
                "{ctx}: forward only"
            );
            assert_close(
                &format!("{ctx} o without --grad"),
                &got["o"].2,
                &plain["o"].2,
                1e-15,
            );
        }
    }
    assert_eq!(
        reference.grads.iter().map(|g| g.0).collect::<Vec<_>>(),
        GDN_GRAD_NAMES
    );
}

/// Without `--variant` the same file runs the Mamba-2 op (the default), ignoring `beta`.
#[test]
fn the_default_variant_is_mamba2() {
    let dir = tempfile::tempdir().unwrap();
    let dims = Dims {
        b: 1,
        t: 20,
        h: 2,
        n: 3,
        p: 2,
        l: num_levels(20),
    };
    let (tensors, x, _) = gdn_case(dims, 13, Dtype::F64);
    let input = dir.path().join("in.safetensors");
    write_file(&input, tensors);
    let got = run_op(&input, &dir.path().join("out.safetensors"), &[]);
    let mamba = HostInput {
        dims,
        q: loglinear::host::to_f64(&x.q),
        k: loglinear::host::to_f64(&x.k),
        v: loglinear::host::to_f64(&x.v),
        g: loglinear::host::to_f64(&x.g),
        lambda: loglinear::host::to_f64(&x.lambda),
    };
    assert_close(
        "default variant",
        &mamba.reference_output(),
        &got["o"].2,
        1e-12,
    );
    let gdn = run_op(
        &input,
        &dir.path().join("out_gdn.safetensors"),
        &["--variant", "gdn"],
    );
    let differ = closeness(&got["o"].2, &gdn["o"].2);
    assert!(differ.max_rel > 1e-3, "gdn and mamba2 gave the same o");
}

/// A valid small Gated DeltaNet input (T = 10, L = 5) in f64, minus `drop`, with `replace`
/// swapped in.
fn bad_gdn_input(dir: &Path, drop: &[&str], replace: Vec<(&'static str, Raw)>) -> PathBuf {
    let dims = Dims {
        b: 1,
        t: 10,
        h: 2,
        n: 4,
        p: 3,
        l: num_levels(10),
    };
    let mut tensors: Vec<(&str, Raw)> = gdn_case(dims, 5, Dtype::F64)
        .0
        .into_iter()
        .filter(|(name, _)| !drop.contains(name) && !replace.iter().any(|(r, _)| r == name))
        .collect();
    tensors.extend(replace);
    let path = dir.join("gdn_in.safetensors");
    write_file(&path, tensors);
    path
}

#[test]
fn gdn_bad_inputs_fail_with_one_line_and_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let gdn = ["--variant", "gdn"];
    let input = bad_gdn_input(dir.path(), &["beta"], vec![]);
    expect_failure(
        &input,
        &gdn,
        &["missing tensor", "`beta`", "q, k, v, g, beta, lambda"],
    );
    let input = bad_gdn_input(dir.path(), &["do"], vec![]);
    expect_failure(
        &input,
        &["--variant", "gdn", "--grad"],
        &["missing tensor", "`do`", "--grad"],
    );
    let beta = raw(Dtype::F64, &[1, 9, 2], &[0.5; 18]);
    let input = bad_gdn_input(dir.path(), &[], vec![("beta", beta)]);
    expect_failure(
        &input,
        &gdn,
        &["`beta`", "[1, 9, 2]", "expected [B, T, H] = [1, 10, 2]"],
    );
    let beta = raw(Dtype::F64, &[1, 10, 2, 1], &[0.5; 20]);
    let input = bad_gdn_input(dir.path(), &[], vec![("beta", beta)]);
    expect_failure(&input, &gdn, &["`beta`", "rank 4", "expected rank 3"]);
    let beta = raw(Dtype::F32, &[1, 10, 2], &[0.5; 20]);
    let input = bad_gdn_input(dir.path(), &[], vec![("beta", beta)]);
    expect_failure(&input, &gdn, &["mixed dtypes", "`beta` is F32", "F64"]);
    let mut values = vec![0.5; 20];
    values[3] = f64::INFINITY;
    let beta = raw(Dtype::F64, &[1, 10, 2], &values);
    let input = bad_gdn_input(dir.path(), &[], vec![("beta", beta)]);
    expect_failure(&input, &gdn, &["`beta`", "NaN or infinite"]);
    let lambda = raw(Dtype::F64, &[1, 10, 2, 4], &[1.0; 80]);
    let input = bad_gdn_input(dir.path(), &[], vec![("lambda", lambda)]);
    expect_failure(&input, &gdn, &["lambda has 4 levels", "at least 5"]);
    let input = bad_gdn_input(dir.path(), &[], vec![]);
    expect_failure(
        &input,
        &["--variant", "gdn", "--form", "fused"],
        &["--form fused", "no Gated DeltaNet kernels"],
    );
    expect_failure(
        &input,
        &["--variant", "gdn", "--chunk", "12"],
        &["--chunk 12", "power of two"],
    );
}
