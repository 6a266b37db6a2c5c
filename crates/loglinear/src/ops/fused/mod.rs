//! The fused form of the core op ([`Form::Fused`](crate::ops::Form::Fused)): CubeCL kernels,
//! forward and backward, as a Burn backend extension with its own autodiff backward. Public:
//! the entry points [`fused`] (what `log_linear_attn` runs on CubeCL devices), [`mamba2`] (the
//! single-state baseline that `bench op` times against) and [`bf16_cmma`]; the kernels, their
//! planner and launchers are private (the kernel tests reach two budgets and one probe through
//! hidden items).
//!
//! * [`cube`]: the scalar forward kernel (and the anticausal kernel of the v1 backward);
//! * [`backward`]: the scalar backward, two kernels (`dq` and `dλ`; `dk` and `dv`);
//! * [`tensor_core`], [`tensor_core_backward`]: the same three kernels with every product on
//!   tensor cores (`mma.sync` with `ldmatrix`), for bf16 inputs on devices that have them;
//! * [`segments`]: the states across segments, for sequences walked in aligned segments (a
//!   few long sequences: each segment a cube of its own, in the same kernels);
//! * [`launch`]: tile planning (shared-memory budget, tensor-core support), the walk (whole
//!   sequences or segments) and launchers;
//! * this module: the extension trait [`LogLinearKernels`], its CubeCL and autodiff
//!   implementations, [`fused`] (the entry point of `log_linear_attn` on CubeCL devices) and
//!   [`mamba2`] (the single-state baseline).
//!
//! The backward keeps only the inputs (derivation in `README.md` beside this file): with
//! `W[t,s] = λ[t,ℓ(t,s)] e^{Γt−Γs}`, one causal launch gives `dq` and `dλ` from the forward's
//! level states, one anticausal launch `dk` and `dv` from one set of states
//! `Σ_t λ e q_t dO_tᵀ`. The two kernels also sum `dΓ_t = Σ_ℓ λ[t,ℓ] dλ[t,ℓ] − v_t·dv_t` (the
//! first term is `dO_t·o_t`), and `dg` is its reverse cumsum over time (in two levels,
//! `reverse_cumsum_over_time`).

mod backward;
mod cube;
#[cfg(feature = "cublas")]
pub mod cuda_check;
mod launch;
mod segments;
pub(crate) mod tensor_core;
mod tensor_core_backward;

#[doc(hidden)]
pub use launch::ProbedHelpers;
#[doc(hidden)]
pub use launch::{Kernels, Plan, plan};
#[doc(hidden)]
pub use tensor_core::tc_shared_bytes;
#[doc(hidden)]
pub use tensor_core_backward::tc_backward_shared_bytes;

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{AutodiffBackend, Backend, DispatchDevice, backend_extension};
use burn::prelude::*;
use burn::tensor::{DType, Slice};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::CubeBackend;

use crate::kernels::{Cb, cast, is_cube_device};
use crate::ops::{LogLinearInput, PlannedWalk};

/// The fused op as backend operations. Implemented for CubeCL backends (the kernels) and for
/// autodiff over them (the backward below); other backends never reach it ([`fused`] checks).
///
/// With Burn's `fusion` feature (GPU builds) CubeCL tensors live under `Fusion<CubeBackend>`: the
/// macro then lowers each method to an opaque fusion operation whose output shapes and dtypes are
/// given below, and the CubeCL implementation runs when the fusion stream reaches it. Neighbouring
/// element-wise operations still fuse with each other around it.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait LogLinearKernels: Backend {
    /// `o: [B, T, H, P]` in the dtype of `q, k: [B, T, H, N]`, `v: [B, T, H, P]`, from those and
    /// `g: [B, T, H]`, `lambda: [B, T, H, L]` (same dtype as `q`, or f32 under mixed precision).
    /// `segment`: 0 walks each sequence in one cube, else aligned segments of that many tokens
    /// (a power of two) walk in cubes of their own (see `launch::causal`); the backward, where
    /// one is tracked, walks in `backward_segment`s.
    #[fusion(dtype = q, shape = v)]
    fn log_linear_fused(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        segment: usize,
        backward_segment: usize,
    ) -> FloatTensor<Self>;

    /// Mamba-2 (SSD), `o[t] = Σ_{s≤t} e^{Γt−Γs} (q_t·k_s) v_s` in the dtype of `q`, by the
    /// forward kernel with one state (on tensor cores where they run). Forward only (no gradient
    /// is tracked): the single-state baseline that `bench op --lambda-one` times the op against.
    #[fusion(dtype = q, shape = v)]
    fn mamba2_fused(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `(dq, dk, dv, dg, dλ)` in the dtypes of the inputs, from the inputs and the output
    /// gradient `grad: [B, T, H, P]` (dtype of `q`), walking aligned segments of `segment` tokens
    /// (0: each sequence in one cube).
    #[allow(clippy::type_complexity)]
    #[fusion(meta = |q, k, v, g, lambda, _grad, _segment| (q.clone(), k.clone(), v.clone(), g.clone(), lambda.clone()))]
    fn log_linear_fused_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        segment: usize,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

impl LogLinearKernels for CubeBackend {
    fn log_linear_fused(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        segment: usize,
        _backward_segment: usize,
    ) -> FloatTensor<Self> {
        launch::causal(q, k, v, g, lambda, segment)
    }

    fn mamba2_fused(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        launch::mamba2(q, k, v, g)
    }

    fn log_linear_fused_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        segment: usize,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let dtype = q.dtype;
        let g_dtype = g.dtype;
        let shape = g.meta.shape().clone();
        // The kernels read q, k, v and dO in one dtype: the gradient must match q, k, v.
        let grad = cast(grad, dtype);
        let dl_shape = lambda.meta.shape().clone();
        let key_shape = q.meta.shape().clone();
        let grads = launch::backward(q, k, v, g, lambda, grad, segment);
        // Per value tile: with one tile (P ≤ the tile width, the common case) a reshape, as a
        // reduction over a dimension of one still reads and writes the tensor in full (6.5 ms
        // of dq, dk and dλ at T = 8192, B = 16, H = 48 on an H100; bench/RESULTS.md session 29).
        let sum_tiles = |t: FloatTensor<Self>, shape| {
            if t.meta.shape()[0] == 1 {
                Cb::float_reshape(t, shape)
            } else {
                Cb::float_reshape(Cb::float_sum_dim(t, 0), shape)
            }
        };
        // dg is the reverse cumulative sum over time of dΓ_t = dO_t·o_t − v_t·dv_t, which the
        // kernels sum per token (`launch::BackwardGrads::dgamma`).
        let dgamma = sum_tiles(grads.dgamma, shape);
        let dg = reverse_cumsum_over_time(dgamma);
        (
            cast(sum_tiles(grads.dq, key_shape.clone()), dtype),
            cast(sum_tiles(grads.dk, key_shape), dtype),
            grads.dv,
            cast(dg, g_dtype),
            cast(sum_tiles(grads.dl, dl_shape), g_dtype),
        )
    }
}

/// `out[:, t, :] = Σ_{s ≥ t} x[:, s, :]` for `x: [B, T, H]` (f32), in two levels over chunks of
/// `C ≈ √T` steps: a reverse cumsum inside each chunk, plus the sum of the chunks after it.
/// Burn's cumsum kernel sums every element's whole prefix (O(T) work per element): over the
/// sequence it took 7.4 ms of an 85 ms forward + backward at T = 8192, B = 16, H = 48 (H100,
/// bench/RESULTS.md session 29); in two levels each element sums O(√T) terms.
fn reverse_cumsum_over_time(x: FloatTensor<Cb>) -> FloatTensor<Cb> {
    let [b, t, h] = x.meta.shape().dims::<3>();
    let chunk = (t as f64).sqrt().ceil().max(1.0) as usize;
    let chunks = t.div_ceil(chunk);
    let padded_len = chunks * chunk;
    // Zeros after the end leave every reverse sum of the real steps as it was.
    let padded = if padded_len > t {
        let zeros = Cb::float_zeros(
            Shape::new([b, padded_len - t, h]),
            &x.device,
            DType::F32.into(),
        );
        Cb::float_cat(vec![x, zeros], 1)
    } else {
        x
    };
    let blocks = Cb::float_reshape(padded, Shape::new([b, chunks, chunk, h]));
    let reverse = |y: FloatTensor<Cb>, dim: usize| {
        Cb::float_flip(Cb::float_cumsum(Cb::float_flip(y, &[dim]), dim), &[dim])
    };
    // Within each chunk; its first step holds the chunk's total.
    let within = reverse(blocks, 2);
    let totals = Cb::float_slice(
        within.clone(),
        &[
            Slice::from(0..b),
            Slice::from(0..chunks),
            Slice::from(0..1),
            Slice::from(0..h),
        ],
    );
    // The chunks after each one: the reverse cumsum of the totals less the chunk's own.
    let after = Cb::float_sub(reverse(totals.clone(), 1), totals);
    let after = Cb::float_expand(after, Shape::new([b, chunks, chunk, h]));
    let out = Cb::float_reshape(Cb::float_add(within, after), Shape::new([b, padded_len, h]));
    if padded_len > t {
        Cb::float_slice(
            out,
            &[Slice::from(0..b), Slice::from(0..t), Slice::from(0..h)],
        )
    } else {
        out
    }
}

impl<B: Backend + LogLinearKernels, C: CheckpointStrategy> LogLinearKernels for Autodiff<B, C> {
    fn log_linear_fused(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        segment: usize,
        backward_segment: usize,
    ) -> FloatTensor<Self> {
        /// The backward's walk (its kernels recompute the states they need: it may differ from
        /// the forward's).
        #[derive(Debug)]
        struct FusedBackward {
            segment: usize,
        }

        impl<B: Backend + LogLinearKernels> Backward<B, 5> for FusedBackward {
            type State = [FloatTensor<B>; 5];

            fn backward(
                self,
                ops: Ops<Self::State, 5>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let [q, k, v, g, lambda] = ops.state;
                let (dq, dk, dv, dg, dl) =
                    B::log_linear_fused_backward(q, k, v, g, lambda, grad, self.segment);
                for (parent, d) in ops.parents.into_iter().zip([dq, dk, dv, dg, dl]) {
                    if let Some(node) = parent {
                        grads.register::<B>(node.id, d);
                    }
                }
            }
        }

        let nodes = [q.node(), k.node(), v.node(), g.node(), lambda.node()];
        let inputs = [
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            g.into_primitive(),
            lambda.into_primitive(),
        ];
        let o = B::log_linear_fused(
            inputs[0].clone(),
            inputs[1].clone(),
            inputs[2].clone(),
            inputs[3].clone(),
            inputs[4].clone(),
            segment,
            backward_segment,
        );
        let backward = FusedBackward {
            segment: backward_segment,
        };
        match backward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(inputs, o),
            OpsKind::UnTracked(prep) => prep.finish(o),
        }
    }

    fn mamba2_fused(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let o = B::mamba2_fused(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            g.into_primitive(),
        );
        <Self as AutodiffBackend>::from_inner(o)
    }

    fn log_linear_fused_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        segment: usize,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        // Not itself differentiable (no second derivatives): the results are constants.
        let (dq, dk, dv, dg, dl) = B::log_linear_fused_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            g.into_primitive(),
            lambda.into_primitive(),
            grad.into_primitive(),
            segment,
        );
        let constant = <Self as AutodiffBackend>::from_inner;
        (
            constant(dq),
            constant(dk),
            constant(dv),
            constant(dg),
            constant(dl),
        )
    }
}

/// Whether `device` runs the fused kernels with bf16 tensor cores ([`launch::bf16_cmma`]);
/// false on devices without CubeCL kernels. [`crate::ops::on_tensor_cores`] adds the inputs'
/// half of the condition.
pub fn bf16_cmma(device: &Device) -> bool {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Cube(cube) => launch::bf16_cmma(cube),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// [`bf16_cmma`] for a CubeCL device (the other kernels' launches have one at hand).
pub(crate) fn cube_bf16_cmma(device: &burn_cubecl::CubeDevice) -> bool {
    launch::bf16_cmma(device)
}

/// The fused op on a CubeCL device, or why it cannot run there (the caller falls back to the
/// chunked form): each sequence walked in one cube, or — where few long sequences would leave
/// the card idle — in the aligned segments of [`walk`], each a cube of its own.
pub fn fused(x: &LogLinearInput) -> Result<Tensor<4>, String> {
    fused_walking(x, walk(x))
}

/// How [`fused`] walks `x`: [`crate::ops::planned_walk`] for its batch·heads, length and device,
/// on tensor cores only (where the plan was measured); else one cube per sequence in both
/// passes.
pub fn walk(x: &LogLinearInput) -> PlannedWalk {
    let d = x.dims();
    if crate::ops::on_tensor_cores(x.dtype(), d.n, bf16_cmma(&x.device())) {
        crate::ops::planned_walk(d.b * d.h, d.t, multiprocessors(&x.q))
    } else {
        PlannedWalk {
            forward: None,
            backward: None,
        }
    }
}

/// [`fused`] over aligned segments of `segment` tokens in both passes (a power of two;
/// `segment ≥ T`: one cube per sequence), each walked by a cube of its own:
/// [`crate::ops::Form::Segmented`].
pub fn fused_in_segments(x: &LogLinearInput, segment: usize) -> Result<Tensor<4>, String> {
    fused_walking(
        x,
        PlannedWalk {
            forward: Some(segment),
            backward: Some(segment),
        },
    )
}

/// The fused op walking as `walk` says in each pass (`None`: one cube per sequence), after the
/// checks every launch needs. [`fused`] plans the walk, [`fused_in_segments`] cuts both passes
/// alike; this takes any pair (the tests check mixed walks).
pub fn fused_walking(x: &LogLinearInput, walk: PlannedWalk) -> Result<Tensor<4>, String> {
    let d = x.dims();
    if !is_cube_device(&x.device()) {
        return Err("the device has no CubeCL kernels".into());
    }
    let (dtype, g_dtype) = (x.dtype(), x.g.dtype());
    if x.k.dtype() != dtype || x.v.dtype() != dtype || x.lambda.dtype() != g_dtype {
        return Err(format!(
            "mixed dtypes (q, k, v must share one, g and λ another): q {:?}, k {:?}, v {:?}, \
             g {:?}, λ {:?}",
            dtype,
            x.k.dtype(),
            x.v.dtype(),
            g_dtype,
            x.lambda.dtype()
        ));
    }
    for dt in [dtype, g_dtype] {
        if !matches!(dt, DType::F32 | DType::BF16 | DType::F16) {
            return Err(format!(
                "{dt:?} inputs (the kernels take f32, bf16 and f16)"
            ));
        }
        if !x.device().supports_dtype(dt) {
            return Err(format!("{dt:?} inputs, which the device does not support"));
        }
    }
    if d.t == 0 {
        return Err("an empty sequence".into());
    }
    let max_shared = max_shared_memory(&x.q);
    launch::supported(d.n, d.p, d.l, d.t, max_shared)?;
    let tokens = |segment: Option<usize>| match segment {
        Some(s) if s.is_power_of_two() => Ok(s),
        Some(s) => Err(format!("segment length {s} is not a power of two")),
        None => Ok(0),
    };
    let (segment, backward_segment) = (tokens(walk.forward)?, tokens(walk.backward)?);
    crate::fenwick::check_levels("log_linear_attn(fused)", d.l, d.t);
    let o = <burn::backend::Dispatch as LogLinearKernels>::log_linear_fused(
        x.q.clone().into_dispatch(),
        x.k.clone().into_dispatch(),
        x.v.clone().into_dispatch(),
        x.g.clone().into_dispatch(),
        x.lambda.clone().into_dispatch(),
        segment,
        backward_segment,
    );
    Ok(Tensor::from_dispatch(o))
}

/// Mamba-2 (SSD) on a CubeCL device, `o[t] = Σ_{s≤t} e^{Γt−Γs} (q_t·k_s) v_s` from `x` without
/// its λ (forward only, no gradient), or why it cannot run: the single-state baseline of the op
/// (λ ≡ 1 without the Fenwick levels), on tensor cores where they run.
pub fn mamba2(x: &LogLinearInput) -> Result<Tensor<4>, String> {
    if !is_cube_device(&x.device()) {
        return Err("the device has no CubeCL kernels".into());
    }
    let d = x.dims();
    if d.t == 0 {
        return Err("an empty sequence".into());
    }
    let dtype = x.dtype();
    if x.k.dtype() != dtype
        || x.v.dtype() != dtype
        || !matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
    {
        return Err(format!(
            "q, k, v must share one of f32, bf16, f16 (got {dtype:?}, {:?}, {:?})",
            x.k.dtype(),
            x.v.dtype()
        ));
    }
    launch::supported(d.n, d.p, 1, d.t, max_shared_memory(&x.q))?;
    let o = <burn::backend::Dispatch as LogLinearKernels>::mamba2_fused(
        x.q.clone().into_dispatch(),
        x.k.clone().into_dispatch(),
        x.v.clone().into_dispatch(),
        x.g.clone().into_dispatch(),
    );
    Ok(Tensor::from_dispatch(o))
}

/// The multiprocessors of the device of `like` (1 where it has no CubeCL kernels).
fn multiprocessors(like: &Tensor<4>) -> usize {
    match like.device().inner().as_dispatch() {
        DispatchDevice::Cube(cube) => launch::multiprocessors(cube),
        #[allow(unreachable_patterns)]
        _ => 1,
    }
}

/// The shared memory one cube may use on the device of `like`.
fn max_shared_memory(like: &Tensor<4>) -> usize {
    match like.device().inner().as_dispatch() {
        DispatchDevice::Cube(cube) => launch::max_shared_memory(cube),
        #[allow(unreachable_patterns)]
        _ => 0,
    }
}

/// [`launch::probe_vector_helpers`] on a CubeCL `device` (a test probe; panics elsewhere).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn probe_vector_helpers(
    device: &Device,
    x: &[f32],
    seq: usize,
    width: usize,
    start: (usize, usize),
    states: &[f32],
    f: f32,
    fresh: bool,
    shape: (usize, usize, usize),
) -> ProbedHelpers {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Cube(cube) => {
            launch::probe_vector_helpers(cube, x, seq, width, start, states, f, fresh, shape)
        }
        #[allow(unreachable_patterns)]
        _ => panic!("probe_vector_helpers: {device:?} has no CubeCL kernels"),
    }
}
