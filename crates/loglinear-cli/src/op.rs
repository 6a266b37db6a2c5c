//! `loglinear op`: the core op on tensors from a safetensors file, for checks across frameworks.
//!
//! ```text
//! loglinear op --input IN.safetensors --output OUT.safetensors [--variant gdn] [--form chunked] [--chunk 64] [--grad]
//! loglinear op --example DIR
//! ```
//!
//! IN holds `q`, `k: [B, T, H, N]`, `v: [B, T, H, P]`, `g: [B, T, H]`, `lambda: [B, T, H, L]`
//! (and `do: [B, T, H, P]` with `--grad`), all F32 or all F64; `--variant gdn` (log-linear Gated
//! DeltaNet, `loglinear::ops::gdn`) also needs `beta: [B, T, H]`. OUT holds `o` and, with
//! `--grad`, the gradients of `Σ o ⊙ do`: `dq, dk, dv, dg, dlambda` (and `dbeta` for gdn), in
//! the input's dtype. The input is
//! validated completely before the library sees it (the library panics on shape misuse), and
//! OUT is written to a temporary file in its directory and renamed, so a failed run leaves no
//! output behind.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use clap::{Args, ValueEnum};
use loglinear::fenwick::num_levels;
use loglinear::host::{HostInput, closeness, to_f64};
use loglinear::ops::gdn::{GdnInput, gdn_attn};
use loglinear::ops::{Dims, Form, LogLinearInput, log_linear_attn};
use safetensors::{Dtype, SafeTensors};

/// The bundled example input of `--example`: B=1, T=70 (a partial last chunk for C = 64 and
/// C = 16), H=2, N=P=8, L=8, f64, with a cotangent `do`. `tests/op_cli.rs` regenerates it from
/// its seed and checks that it has not drifted.
const EXAMPLE: &[u8] = include_bytes!("../examples-data/example.safetensors");

/// Arguments of `loglinear op`.
#[derive(Args, Debug)]
#[command(
    after_help = "IN holds q, k [B,T,H,N], v [B,T,H,P], g [B,T,H], lambda [B,T,H,L] \
                  (L >= ceil(log2 T) + 1), with --variant gdn also beta [B,T,H], and with --grad \
                  also do [B,T,H,P]; all F32 or all F64. OUT holds o and, with --grad, dq, dk, \
                  dv, dg, dlambda (and dbeta for gdn): gradients of sum(o * do), in the input's \
                  dtype.\n\nStart with `loglinear op --example DIR`."
)]
pub struct OpArgs {
    /// Input safetensors file with q, k, v, g, lambda (and do with --grad).
    #[arg(long, value_name = "IN", required_unless_present = "example")]
    input: Option<PathBuf>,
    /// Output safetensors file (written atomically; nothing is left behind on error).
    #[arg(long, value_name = "OUT", required_unless_present = "example")]
    output: Option<PathBuf>,
    /// Which op: log-linear Mamba-2 (the default) or log-linear Gated DeltaNet (needs `beta`).
    #[arg(long, value_enum, default_value_t = Variant::Mamba2)]
    variant: Variant,
    /// Which form of the op computes the output.
    #[arg(long, value_enum, default_value_t = FormArg::Chunked)]
    form: FormArg,
    /// Chunk size of the chunked form (a power of two).
    #[arg(long, default_value_t = 64)]
    chunk: usize,
    /// Also write the gradients of sum(o * do) with respect to every input (needs `do`).
    #[arg(long)]
    grad: bool,
    /// Write the bundled example input to DIR/example.safetensors, run every form on it with
    /// gradients and print how far each is from the parallel form.
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with_all = ["input", "output", "variant", "form", "chunk", "grad"]
    )]
    example: Option<PathBuf>,
}

/// `--variant` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Variant {
    /// Log-linear Mamba-2: scalar decay `exp(g)`.
    Mamba2,
    /// Log-linear Gated DeltaNet: transition `exp(g) (I − β k kᵀ)`, insertion `β k vᵀ`.
    Gdn,
}

impl Variant {
    /// The tensors IN must hold (without `do`).
    fn inputs(self) -> &'static [&'static str] {
        match self {
            Variant::Mamba2 => &["q", "k", "v", "g", "lambda"],
            Variant::Gdn => &["q", "k", "v", "g", "beta", "lambda"],
        }
    }
}

/// `--form` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum FormArg {
    /// The quadratic masked form (the definition; O(T²) memory).
    Parallel,
    /// The chunkwise O(T log T) form.
    Chunked,
    /// The token-by-token Fenwick recurrence.
    Recurrent,
    /// The fused kernels (on the CPU: the chunked form with chunk 64; not for gdn).
    Fused,
}

/// Runs `loglinear op`.
pub fn run(args: OpArgs) -> Result<()> {
    if let Some(dir) = &args.example {
        return run_example(dir);
    }
    let form = match args.form {
        FormArg::Parallel => Form::Parallel,
        FormArg::Recurrent => Form::Recurrent,
        FormArg::Fused => Form::Fused,
        FormArg::Chunked => Form::Chunked { chunk: args.chunk },
    };
    // Checked for every form: a bad value is a mistake even where it would be ignored.
    ensure!(
        args.chunk.is_power_of_two(),
        "--chunk {} is not a power of two (try 64)",
        args.chunk
    );
    ensure!(
        !(args.variant == Variant::Gdn && form == Form::Fused),
        "--form fused: there are no Gated DeltaNet kernels (use --form chunked)"
    );
    let (input, output) = match (&args.input, &args.output) {
        (Some(i), Some(o)) => (i, o),
        _ => bail!("--input and --output are both required"),
    };
    let inputs = read_inputs(input, args.grad, args.variant)?;
    let result = compute(&inputs, form, args.grad);
    let precision = inputs.precision;
    let tensors: Vec<(String, OwnedTensor)> = result
        .into_iter()
        .map(|(name, shape, values)| {
            (
                name.to_string(),
                OwnedTensor::new(precision, shape, &values),
            )
        })
        .collect();
    let bytes = safetensors::serialize(tensors, &None).context("serialising the output")?;
    write_atomically(output, &bytes)?;
    let Dims { b, t, h, n, p, l } = inputs.x.dims;
    let grads = match (args.grad, args.variant) {
        (false, _) => "",
        (true, Variant::Mamba2) => " and dq, dk, dv, dg, dlambda",
        (true, Variant::Gdn) => " and dq, dk, dv, dg, dbeta, dlambda",
    };
    let variant = match args.variant {
        Variant::Mamba2 => "",
        Variant::Gdn => "Gated DeltaNet, ",
    };
    println!(
        "{}: o{grads} in {precision:?}, {variant}B={b} T={t} H={h} N={n} P={p} L={l}, form {form}",
        output.display(),
    );
    Ok(())
}

/// The float types the op reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Precision {
    F32,
    F64,
}

impl Precision {
    fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::F64 => DType::F64,
        }
    }
}

/// Validated inputs, held on the host as f64 (exact for both precisions).
struct Inputs {
    x: HostInput,
    /// `beta: [B, T, H]`, for `--variant gdn`.
    beta: Option<Vec<f64>>,
    /// Output cotangent `[B, T, H, P]`, with `--grad`.
    d_o: Option<Vec<f64>>,
    precision: Precision,
}

/// Reads and validates IN: every tensor the variant needs present, one supported dtype, ranks,
/// shapes that agree, non-empty sizes, enough λ levels, finite values.
fn read_inputs(path: &Path, grad: bool, variant: Variant) -> Result<Inputs> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let mut names = variant.inputs().to_vec();
    if grad {
        names.push("do");
    }
    let missing: Vec<String> = names
        .iter()
        .filter(|n| file.tensor(n).is_err())
        .map(|n| format!("`{n}`"))
        .collect();
    ensure!(
        missing.is_empty(),
        "{}: missing tensor {} (needs {}{})",
        path.display(),
        missing.join(", "),
        variant.inputs().join(", "),
        if grad { " and, with --grad, do" } else { "" }
    );
    let views: BTreeMap<&str, _> = names
        .iter()
        .map(|n| (*n, file.tensor(n).expect("checked above")))
        .collect();

    let precision_of = |name: &str| -> Result<Precision> {
        match views[name].dtype() {
            Dtype::F32 => Ok(Precision::F32),
            Dtype::F64 => Ok(Precision::F64),
            other => bail!("tensor `{name}` has unsupported dtype {other:?} (use F32 or F64)"),
        }
    };
    let precision = precision_of("q")?;
    for name in &names[1..] {
        let other = precision_of(name)?;
        ensure!(
            other == precision,
            "mixed dtypes: `q` is {precision:?} but `{name}` is {other:?} (all tensors must share \
             one dtype)"
        );
    }

    let shape = |name: &str| views[name].shape().to_vec();
    let rank = |name: &str, want: usize, axes: &str| -> Result<Vec<usize>> {
        let s = shape(name);
        ensure!(
            s.len() == want,
            "tensor `{name}` has shape {s:?} (rank {}), expected rank {want} {axes}",
            s.len()
        );
        Ok(s)
    };
    let q = rank("q", 4, "[B, T, H, N]")?;
    let v = rank("v", 4, "[B, T, H, P]")?;
    let lambda = rank("lambda", 4, "[B, T, H, L]")?;
    rank("k", 4, "[B, T, H, N]")?;
    rank("g", 3, "[B, T, H]")?;
    if variant == Variant::Gdn {
        rank("beta", 3, "[B, T, H]")?;
    }
    let (b, t, h, n, p, l) = (q[0], q[1], q[2], q[3], v[3], lambda[3]);
    let expect = |name: &str, axes: &str, want: Vec<usize>| -> Result<()> {
        let got = shape(name);
        ensure!(
            got == want,
            "tensor `{name}` has shape {got:?}, expected {axes} = {want:?} (B, T, H, N from q, P \
             from v, L from lambda)"
        );
        Ok(())
    };
    expect("k", "[B, T, H, N]", vec![b, t, h, n])?;
    expect("v", "[B, T, H, P]", vec![b, t, h, p])?;
    expect("g", "[B, T, H]", vec![b, t, h])?;
    expect("lambda", "[B, T, H, L]", vec![b, t, h, l])?;
    if variant == Variant::Gdn {
        expect("beta", "[B, T, H]", vec![b, t, h])?;
    }
    if grad {
        expect("do", "[B, T, H, P]", vec![b, t, h, p])?;
    }
    ensure!(
        b > 0 && t > 0 && h > 0 && n > 0 && p > 0,
        "empty input: B={b}, T={t}, H={h}, N={n}, P={p} (every size must be at least 1)"
    );
    let need = num_levels(t);
    ensure!(
        l >= need,
        "lambda has {l} levels, but T = {t} needs at least {need} (num_levels(T) = \
         ceil(log2 T) + 1)"
    );

    let values = |name: &str| -> Result<Vec<f64>> {
        let values = decode(precision, views[name].data());
        ensure!(
            values.iter().all(|x| x.is_finite()),
            "tensor `{name}` holds NaN or infinite values"
        );
        Ok(values)
    };
    Ok(Inputs {
        x: HostInput {
            dims: Dims { b, t, h, n, p, l },
            q: values("q")?,
            k: values("k")?,
            v: values("v")?,
            g: values("g")?,
            lambda: values("lambda")?,
        },
        beta: match variant {
            Variant::Mamba2 => None,
            Variant::Gdn => Some(values("beta")?),
        },
        d_o: if grad { Some(values("do")?) } else { None },
        precision,
    })
}

/// Little-endian F32/F64 bytes to f64 values (byte-wise: the data need not be aligned).
fn decode(precision: Precision, bytes: &[u8]) -> Vec<f64> {
    match precision {
        Precision::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
            .collect(),
        Precision::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
    }
}

/// A named result: `(name, shape, values)`.
type Named = (&'static str, Vec<usize>, Vec<f64>);

/// Runs `form` on the Flex CPU device in the input's precision: `o`, and with `grad` the
/// gradients of `Σ o ⊙ do` through autodiff.
fn compute(inputs: &Inputs, form: Form, grad: bool) -> Vec<Named> {
    if let Some(beta) = &inputs.beta {
        return compute_gdn(inputs, beta, form, grad);
    }
    let Dims { b, t, h, n, p, l } = inputs.x.dims;
    let dtype = inputs.precision.dtype();
    if !grad {
        let device = Device::flex();
        let x = inputs.x.to_input(dtype, &device);
        let o = log_linear_attn(&x, form, None, false).o;
        return vec![("o", vec![b, t, h, p], to_f64(&o))];
    }
    let device = Device::flex().autodiff();
    let x = inputs.x.to_input(dtype, &device);
    let x = LogLinearInput {
        q: x.q.require_grad(),
        k: x.k.require_grad(),
        v: x.v.require_grad(),
        g: x.g.require_grad(),
        lambda: x.lambda.require_grad(),
    };
    let d_o = inputs.d_o.clone().expect("--grad inputs carry do");
    let d_o: Tensor<4> =
        Tensor::from_data(TensorData::new(d_o, vec![b, t, h, p]), (&device, dtype));
    let o = log_linear_attn(&x, form, None, false).o;
    let grads = (o.clone() * d_o).sum().backward();
    vec![
        ("o", vec![b, t, h, p], to_f64(&o)),
        ("dq", vec![b, t, h, n], grad_or_zero(&x.q, x.q.grad(&grads))),
        ("dk", vec![b, t, h, n], grad_or_zero(&x.k, x.k.grad(&grads))),
        ("dv", vec![b, t, h, p], grad_or_zero(&x.v, x.v.grad(&grads))),
        ("dg", vec![b, t, h], grad_or_zero(&x.g, x.g.grad(&grads))),
        (
            "dlambda",
            vec![b, t, h, l],
            grad_or_zero(&x.lambda, x.lambda.grad(&grads)),
        ),
    ]
}

/// [`compute`] for `--variant gdn`: the Gated DeltaNet op, with `dbeta` among the gradients.
fn compute_gdn(inputs: &Inputs, beta: &[f64], form: Form, grad: bool) -> Vec<Named> {
    let Dims { b, t, h, n, p, l } = inputs.x.dims;
    let dtype = inputs.precision.dtype();
    let device = if grad {
        Device::flex().autodiff()
    } else {
        Device::flex()
    };
    let m = inputs.x.to_input(dtype, &device);
    let x = GdnInput {
        q: m.q,
        k: m.k,
        v: m.v,
        g: m.g,
        beta: Tensor::from_data(
            TensorData::new(beta.to_vec(), vec![b, t, h]),
            (&device, dtype),
        ),
        lambda: m.lambda,
    };
    if !grad {
        let o = gdn_attn(&x, form, None, false).o;
        return vec![("o", vec![b, t, h, p], to_f64(&o))];
    }
    let x = x.require_grad();
    let d_o = inputs.d_o.clone().expect("--grad inputs carry do");
    let d_o: Tensor<4> =
        Tensor::from_data(TensorData::new(d_o, vec![b, t, h, p]), (&device, dtype));
    let o = gdn_attn(&x, form, None, false).o;
    let grads = (o.clone() * d_o).sum().backward();
    vec![
        ("o", vec![b, t, h, p], to_f64(&o)),
        ("dq", vec![b, t, h, n], grad_or_zero(&x.q, x.q.grad(&grads))),
        ("dk", vec![b, t, h, n], grad_or_zero(&x.k, x.k.grad(&grads))),
        ("dv", vec![b, t, h, p], grad_or_zero(&x.v, x.v.grad(&grads))),
        ("dg", vec![b, t, h], grad_or_zero(&x.g, x.g.grad(&grads))),
        (
            "dbeta",
            vec![b, t, h],
            grad_or_zero(&x.beta, x.beta.grad(&grads)),
        ),
        (
            "dlambda",
            vec![b, t, h, l],
            grad_or_zero(&x.lambda, x.lambda.grad(&grads)),
        ),
    ]
}

/// The gradient of `x` as host values. An input that does not reach the output (g when T = 1)
/// has no gradient entry: it is zero.
fn grad_or_zero<const D: usize>(x: &Tensor<D>, g: Option<Tensor<D>>) -> Vec<f64> {
    g.map(|g| to_f64(&g))
        .unwrap_or_else(|| vec![0.0; x.shape().num_elements()])
}

/// A tensor to serialise: dtype, shape and little-endian bytes.
struct OwnedTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl OwnedTensor {
    fn new(precision: Precision, shape: Vec<usize>, values: &[f64]) -> Self {
        let (dtype, bytes) = match precision {
            Precision::F32 => (
                Dtype::F32,
                values
                    .iter()
                    .flat_map(|x| (*x as f32).to_le_bytes())
                    .collect(),
            ),
            Precision::F64 => (
                Dtype::F64,
                values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
        };
        Self {
            dtype,
            shape,
            bytes,
        }
    }
}

impl safetensors::View for OwnedTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Writes `bytes` to a temporary file next to `path` and renames it into place, so `path` is
/// either the complete new file or untouched; the temporary file is removed on failure.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("output path {} has no file name", path.display()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    };
    let result = write();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}

/// `--example DIR`: writes the bundled input, runs every form with gradients in f64 and prints
/// each one's distance from the parallel form (and the parallel form's from a plain f64 loop).
fn run_example(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("example.safetensors");
    write_atomically(&path, EXAMPLE)?;
    let inputs = read_inputs(&path, true, Variant::Mamba2)?;
    let Dims { b, t, h, n, p, l } = inputs.x.dims;
    println!(
        "wrote {} (B={b} T={t} H={h} N={n} P={p} L={l}, {:?}, with do)",
        path.display(),
        inputs.precision
    );

    let timed = |form: Form| {
        let start = Instant::now();
        let result = compute(&inputs, form, true);
        (result, start.elapsed().as_secs_f64() * 1e3)
    };
    let (reference, ms) = timed(Form::Parallel);
    println!();
    println!("max |x - x_parallel| / max |x_parallel|, forward and backward in f64:");
    let header: Vec<&str> = reference.iter().map(|(name, _, _)| *name).collect();
    print!("{:<18}", "form");
    for name in &header {
        print!("{name:>10}");
    }
    println!("{:>10}", "ms");
    let loop_o = inputs.x.reference_output();
    print!(
        "{:<18}{:>10.1e}",
        "parallel vs loop",
        closeness(&loop_o, &reference[0].2).max_rel
    );
    for _ in 1..header.len() {
        print!("{:>10}", "-");
    }
    println!("{ms:>10.1}");
    for form in [
        Form::Chunked { chunk: 64 },
        Form::Chunked { chunk: 16 },
        Form::Recurrent,
    ] {
        let (result, ms) = timed(form);
        print!("{:<18}", form.to_string());
        for ((_, _, r), (_, _, got)) in reference.iter().zip(&result) {
            print!("{:>10.1e}", closeness(r, got).max_rel);
        }
        println!("{ms:>10.1}");
    }
    println!();
    println!(
        "next: loglinear op --input {} --output {} --form recurrent --grad",
        path.display(),
        dir.join("out.safetensors").display()
    );
    Ok(())
}
