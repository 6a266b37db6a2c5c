//! The log-linear attention operator in its three equivalent forms (spec §3).
//!
//! ```text
//! o[t] = Σ_{s≤t} λ[t, level(t,s)] · exp(Γ[t] − Γ[s]) · (q[t]·k[s]) · v[s],   Γ = cumsum(g)
//! ```
//!
//! * [`Form::Parallel`]: the quadratic masked form, the definition and the test oracle;
//! * [`Form::Chunked`]: the chunkwise O(T log T) algorithm (intra-chunk blocks plus one
//!   vectorised pass per chunk level);
//! * [`Form::Recurrent`]: the O(log T) Fenwick state stepped token by token (also the decoder).
//!
//! All forms take the same [`LogLinearInput`], an optional initial [`FenwickState`], and can
//! return the final state; all are built from Burn tensor ops and so differentiable through
//! autodiff, in whatever float dtype the inputs carry (f32, f64, bf16). The derivations are in
//! `ops/README.md`.

mod chunked;
mod parallel;
mod recurrent;
mod state;

pub use chunked::chunked;
pub use parallel::parallel;
pub use recurrent::{recurrent, recurrent_step};
pub use state::FenwickState;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use crate::fenwick;

/// Inputs of the core op, per head. Positions are counted from the start of this segment; an
/// initial [`FenwickState`] shifts them by its `position`.
///
/// # Shapes
/// `q, k: [B, T, H, N]`, `v: [B, T, H, P]`, `g: [B, T, H]` (log-decay, ≤ 0),
/// `lambda: [B, T, H, L]` with `L ≥ num_levels(position + T)`.
#[derive(Clone, Debug)]
pub struct LogLinearInput {
    /// Queries `[B, T, H, N]` (Mamba-2: `C`).
    pub q: Tensor<4>,
    /// Keys `[B, T, H, N]` (Mamba-2: `B`).
    pub k: Tensor<4>,
    /// Values `[B, T, H, P]` (Mamba-2: `Δ·x`).
    pub v: Tensor<4>,
    /// Log-decay `[B, T, H]` (Mamba-2: `A·Δ`).
    pub g: Tensor<3>,
    /// Level weights `[B, T, H, L]`.
    pub lambda: Tensor<4>,
}

/// Sizes of a [`LogLinearInput`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub t: usize,
    /// Heads.
    pub h: usize,
    /// Key/query width.
    pub n: usize,
    /// Value width.
    pub p: usize,
    /// λ slots.
    pub l: usize,
}

impl LogLinearInput {
    /// Checks that the five tensors agree and returns their sizes.
    ///
    /// # Panics
    /// With a message naming the tensor and both shapes when they do not fit together.
    pub fn dims(&self) -> Dims {
        let [b, t, h, n] = self.q.dims();
        let d = Dims {
            b,
            t,
            h,
            n,
            p: self.v.dims()[3],
            l: self.lambda.dims()[3],
        };
        let expect = |name: &str, got: &[usize], want: &[usize]| {
            assert!(
                got == want,
                "log_linear_attn: {name} has shape {got:?}, expected {want:?} \
                 (from q [B, T, H, N] = {:?})",
                self.q.dims()
            );
        };
        expect("k", &self.k.dims(), &[b, t, h, n]);
        expect("v", &self.v.dims(), &[b, t, h, d.p]);
        expect("g", &self.g.dims(), &[b, t, h]);
        expect("lambda", &self.lambda.dims(), &[b, t, h, d.l]);
        assert!(d.l > 0, "log_linear_attn: lambda needs at least one level");
        d
    }

    /// The float dtype of the inputs.
    pub fn dtype(&self) -> DType {
        self.q.dtype()
    }

    /// The device of the inputs.
    pub fn device(&self) -> Device {
        self.q.device()
    }

    /// Fresh leaves that require gradients (detached from any earlier graph); the tensors must
    /// live on an autodiff device.
    pub fn require_grad(&self) -> Self {
        Self {
            q: self.q.clone().detach().require_grad(),
            k: self.k.clone().detach().require_grad(),
            v: self.v.clone().detach().require_grad(),
            g: self.g.clone().detach().require_grad(),
            lambda: self.lambda.clone().detach().require_grad(),
        }
    }

    /// The tokens `start..start + len` of this segment.
    pub fn narrow(&self, start: usize, len: usize) -> Self {
        Self {
            q: self.q.clone().narrow(1, start, len),
            k: self.k.clone().narrow(1, start, len),
            v: self.v.clone().narrow(1, start, len),
            g: self.g.clone().narrow(1, start, len),
            lambda: self.lambda.clone().narrow(1, start, len),
        }
    }

    /// Random inputs at realistic Mamba-2 scales: `q, k, v ~ N(0, 1)`,
    /// `g = A·dt` with `dt = softplus(randn − 4)` and `A = −exp(U(0, 1))`,
    /// `λ = softplus(randn)`. Drawn with `seed` on the host, so equal seeds give equal inputs on
    /// every backend and dtype.
    pub fn random(dims: Dims, seed: u64, dtype: DType, device: &Device) -> Self {
        use rand::{Rng, SeedableRng};
        use rand_distr::StandardNormal;
        let Dims { b, t, h, n, p, l } = dims;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut normal = |len: usize| -> Vec<f64> {
            (0..len)
                .map(|_| rng.sample::<f64, _>(StandardNormal))
                .collect()
        };
        let q = normal(b * t * h * n);
        let k = normal(b * t * h * n);
        let v = normal(b * t * h * p);
        let dt: Vec<f64> = normal(b * t * h)
            .into_iter()
            .map(|x| softplus(x - 4.0))
            .collect();
        let lambda: Vec<f64> = normal(b * t * h * l).into_iter().map(softplus).collect();
        let a: Vec<f64> = (0..h).map(|_| -rng.random::<f64>().exp()).collect();
        let g: Vec<f64> = dt.iter().enumerate().map(|(i, d)| a[i % h] * d).collect();
        let make = |data: Vec<f64>, shape: Vec<usize>| TensorData::new(data, shape);
        Self {
            q: Tensor::from_data(make(q, vec![b, t, h, n]), (device, dtype)),
            k: Tensor::from_data(make(k, vec![b, t, h, n]), (device, dtype)),
            v: Tensor::from_data(make(v, vec![b, t, h, p]), (device, dtype)),
            g: Tensor::from_data(make(g, vec![b, t, h]), (device, dtype)),
            lambda: Tensor::from_data(make(lambda, vec![b, t, h, l]), (device, dtype)),
        }
    }
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// Which algorithm computes the op. All forms give the same result up to rounding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// Quadratic masked form: O(T²) time and memory; the definition.
    Parallel,
    /// Chunkwise form with a power-of-two chunk size: O(T·C + T·log(T/C)) time.
    Chunked {
        /// Chunk size, a power of two (64 is the usual choice).
        chunk: usize,
    },
    /// Token-by-token Fenwick recurrence: O(log T) state, O(T) sequential steps.
    Recurrent,
    /// The fused CubeCL kernels (forward and backward) on CUDA and WGPU devices: the chunkwise
    /// algorithm in one pass over the sequence per (batch, head, value tile), with every chunk
    /// level's state kept by the kernel. Elsewhere, and for what the kernels do not cover (an
    /// initial or returned state, f64, shared memory too small for the widths), it is
    /// `Chunked { chunk: 64 }`; on a CubeCL device such a fallback prints a one-time warning.
    Fused,
}

impl Default for Form {
    fn default() -> Self {
        Form::Chunked { chunk: 64 }
    }
}

impl std::fmt::Display for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Form::Parallel => write!(f, "parallel"),
            Form::Chunked { chunk } => write!(f, "chunked(C={chunk})"),
            Form::Recurrent => write!(f, "recurrent"),
            Form::Fused => write!(f, "fused"),
        }
    }
}

/// Output of [`log_linear_attn`].
#[derive(Clone, Debug)]
pub struct AttnOutput {
    /// `o: [B, T, H, P]`.
    pub o: Tensor<4>,
    /// The Fenwick state after the last token, when it was asked for (always for the recurrent
    /// form, which builds it anyway).
    pub state: Option<FenwickState>,
}

/// Log-linear attention with the chosen [`Form`], continuing from `initial` (or from an empty
/// state at position 0), optionally returning the final state.
///
/// # Shapes
/// See [`LogLinearInput`]; `o: [B, T, H, P]`; states `[B, H, L, N, P]`.
///
/// # Panics
/// On inconsistent shapes, too few λ levels for `position + T`, or a chunk size that is not a
/// power of two.
pub fn log_linear_attn(
    x: &LogLinearInput,
    form: Form,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    if form == Form::Fused {
        return fused_or_chunked(x, initial, return_state);
    }
    // Half-precision inputs: the decays are differences of cumulative sums, which bf16/f16 cannot
    // hold to useful accuracy, and the level states accumulate many terms; the tensor forms
    // therefore compute in f32 and return `o` in the input dtype (the state stays f32).
    let dtype = x.dtype();
    if matches!(dtype, DType::BF16 | DType::F16) {
        let up = |t: Tensor<4>| t.cast(DType::F32);
        let wide = LogLinearInput {
            q: up(x.q.clone()),
            k: up(x.k.clone()),
            v: up(x.v.clone()),
            g: x.g.clone().cast(DType::F32),
            lambda: up(x.lambda.clone()),
        };
        let initial = initial.map(|s| FenwickState {
            levels: s.levels.clone().cast(DType::F32),
            position: s.position,
        });
        let out = log_linear_attn(&wide, form, initial.as_ref(), return_state);
        return AttnOutput {
            o: out.o.cast(dtype),
            state: out.state,
        };
    }
    match form {
        Form::Parallel => parallel(x, initial, return_state),
        Form::Chunked { chunk } => chunked(x, chunk, initial, return_state),
        Form::Recurrent => {
            let (o, state) = recurrent(x, initial);
            AttnOutput {
                o,
                state: Some(state),
            }
        }
        Form::Fused => unreachable!("handled above"),
    }
}

/// [`Form::Fused`]: the kernels where they apply, else the chunked form (with a one-time warning
/// on devices that have kernels, where the fallback costs speed).
fn fused_or_chunked(
    x: &LogLinearInput,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    const FALLBACK: Form = Form::Chunked { chunk: 64 };
    #[cfg(feature = "kernels")]
    {
        let why = if initial.is_some() || return_state {
            Err("an initial or returned Fenwick state".to_string())
        } else {
            crate::kernels::fused(x)
        };
        match why {
            Ok(o) => return AttnOutput { o, state: None },
            Err(reason) => {
                if crate::kernels::is_cube_device(&x.device()) {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| {
                        eprintln!(
                            "warning: log_linear_attn(fused): falling back to the chunked tensor \
                             form for {reason} (warned once per process)"
                        );
                    });
                }
            }
        }
    }
    log_linear_attn(x, FALLBACK, initial, return_state)
}

/// `[B, T, H, X] → [B, H, T, X]`: the head-major layout every form computes in.
pub(crate) fn heads_first(x: Tensor<4>) -> Tensor<4> {
    x.swap_dims(1, 2)
}

/// An integer tensor from host values.
pub(crate) fn int_tensor<const D: usize>(
    values: Vec<i64>,
    shape: [usize; D],
    device: &Device,
) -> Tensor<D, Int> {
    Tensor::from_data(TensorData::new(values, shape.to_vec()), device)
}

/// A float tensor from host values, in `dtype`.
pub(crate) fn float_tensor<const D: usize>(
    values: Vec<f64>,
    shape: [usize; D],
    dtype: DType,
    device: &Device,
) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape.to_vec()), (device, dtype))
}

/// Zeros of `shape` with the dtype and device of `like`.
pub(crate) fn zeros_as<const D: usize, const D2: usize>(
    like: &Tensor<D2>,
    shape: [usize; D],
) -> Tensor<D> {
    Tensor::zeros(shape, (&like.device(), like.dtype()))
}

/// Pads `x` with zeros along `dim`: `before` in front, `after` behind.
pub(crate) fn pad_zeros<const D: usize>(
    x: Tensor<D>,
    dim: usize,
    before: usize,
    after: usize,
) -> Tensor<D> {
    if before == 0 && after == 0 {
        return x;
    }
    let mut parts = Vec::with_capacity(3);
    let mut shape = x.dims();
    if before > 0 {
        shape[dim] = before;
        parts.push(zeros_as(&x, shape));
    }
    let tail = after > 0;
    parts.push(x.clone());
    if tail {
        shape[dim] = after;
        parts.push(zeros_as(&x, shape));
    }
    Tensor::cat(parts, dim)
}

/// The contribution of an initial state to the outputs of a segment, shared by the parallel and
/// chunked forms.
///
/// Old level `ℓ₀` of a state at `position = T₀` holds a bucket of positions before `T₀`; every
/// position of that bucket has the same level `level(t, r)` seen from a later query `t`
/// (buckets are aligned dyadic blocks), where `r` is any member. So
/// `o[t] += Σ_ℓ₀ λ[t, level(t, r_ℓ₀)] · exp(Γ[t]) · q[t]ᵀ S₀^(ℓ₀)` with `Γ` the inclusive
/// cumulative log-decay of the segment.
///
/// # Shapes
/// `q: [B, H, T, N]`, `lambda: [B, H, T, L]`, `gamma: [B, H, T]` → `[B, H, T, P]`.
pub(crate) fn initial_state_output(
    q: &Tensor<4>,
    lambda: &Tensor<4>,
    gamma: &Tensor<3>,
    initial: &FenwickState,
) -> Tensor<4> {
    let [b, h, t, n] = q.dims();
    let l = lambda.dims()[3];
    let [_, _, l0, _, p] = initial.levels.dims();
    let start = initial.position;
    let device = q.device();
    // Level read by query i for old level j, and whether old level j is occupied.
    let mut index = vec![0i64; t * l0];
    let mut occupied = vec![0f64; l0];
    for (j, occ) in occupied.iter_mut().enumerate() {
        if let Some(r) = initial.representative(j) {
            *occ = 1.0;
            for i in 0..t {
                index[i * l0 + j] = fenwick::level(start + i, r).min(l - 1) as i64;
            }
        }
    }
    let index = int_tensor(index, [1, 1, t, l0], &device).expand([b, h, t, l0]);
    let occupied = float_tensor(occupied, [1, 1, 1, l0], q.dtype(), &device);
    // [B, H, T, L0]: λ of the level each old level lands on, times the decay since T₀.
    let weight = lambda.clone().gather(3, index) * occupied * gamma.clone().exp().unsqueeze_dim(3);
    // q · S₀ for every old level at once: [B, H, N, L0·P].
    let s0 = initial
        .levels
        .clone()
        .permute([0, 1, 3, 2, 4])
        .reshape([b, h, n, l0 * p]);
    let read = q.clone().matmul(s0).reshape([b, h, t, l0, p]);
    (read * weight.unsqueeze_dim(4)).sum_dim(3).squeeze_dim(3)
}

/// The state after the last token of a segment, from its tokens and the initial state; shared by
/// the parallel and chunked forms. Every token lands in exactly one bucket of the final query
/// position (contiguous ranges), so each level is one `kᵀ·(w ⊙ v)` product.
///
/// # Shapes
/// `k: [B, H, T, N]`, `v: [B, H, T, P]`, `gamma: [B, H, T]` → levels `[B, H, L, N, P]`.
pub(crate) fn final_state(
    k: &Tensor<4>,
    v: &Tensor<4>,
    gamma: &Tensor<3>,
    levels: usize,
    initial: Option<&FenwickState>,
) -> FenwickState {
    let [b, h, t, n] = k.dims();
    let p = v.dims()[3];
    let start = initial.map_or(0, |s| s.position);
    let end = start + t;
    if t == 0 {
        return match initial {
            Some(s) => s.clone(),
            None => FenwickState::empty(b, h, levels, n, p, k.dtype(), &k.device()),
        };
    }
    let last = end - 1;
    let gamma_end = gamma.clone().narrow(2, t - 1, 1); // [B, H, 1]
    let mut slots: Vec<Option<Tensor<4>>> = vec![None; levels];
    for (l, range) in fenwick::buckets(last) {
        let lo = range.start.max(start);
        let hi = range.end;
        if lo >= hi {
            continue;
        }
        let (i0, len) = (lo - start, hi - lo);
        let w = (gamma_end.clone() - gamma.clone().narrow(2, i0, len)).exp(); // [B, H, len]
        let kk = k.clone().narrow(2, i0, len).swap_dims(2, 3); // [B, H, N, len]
        let vv = v.clone().narrow(2, i0, len) * w.unsqueeze_dim(3); // [B, H, len, P]
        slots[l] = Some(kk.matmul(vv));
    }
    if let Some(init) = initial {
        let decay = gamma_end.exp().unsqueeze_dim(3); // [B, H, 1, 1]
        for j in 0..init.levels.dims()[2] {
            if let Some(r) = init.representative(j) {
                let l = fenwick::level(last, r);
                let old = init.level(j) * decay.clone();
                slots[l] = Some(match slots[l].take() {
                    Some(s) => s + old,
                    None => old,
                });
            }
        }
    }
    let zeros: Tensor<4> = zeros_as(k, [b, h, n, p]);
    let levels = slots
        .into_iter()
        .map(|s| s.unwrap_or_else(|| zeros.clone()))
        .collect();
    FenwickState {
        levels: Tensor::stack(levels, 2),
        position: end,
    }
}
