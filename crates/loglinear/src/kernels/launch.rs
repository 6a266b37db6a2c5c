//! Tile planning and launchers of the two kernels.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::CubeDevice;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::ops::reshape;
use burn_cubecl::tensor::CubeTensor;
use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

use super::backward::{anticausal_backward_kernel, causal_backward_kernel, key_lanes};
use super::cross_entropy::{ce_backward_kernel, ce_forward_kernel};
use super::cube::{THREADS, causal_kernel};
use super::tensor_core::{TILE, causal_tc_kernel, tc_shared_bytes};
use super::tensor_core_backward::{
    anticausal_backward_tc_kernel, causal_backward_tc_kernel, tc_backward_shared_bytes,
};
use crate::fenwick::bitlen;

/// Chunk size and value-tile width of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Tokens per chunk (16, 32 or 64).
    pub chunk: usize,
    /// Value columns per cube (16, 32 or 64).
    pub pt: usize,
    /// Whether the level states live in shared memory (else in a global scratch buffer).
    pub shared_states: bool,
}

/// Where the level states live: `LOGLINEAR_FUSED_STATES=shared` keeps them in shared memory where
/// they fit (narrowing the value tile or the chunk as needed); by default they live in a global
/// scratch buffer. Measured on the H200 (bench/RESULTS.md): global states with wide tiles and
/// room for four cubes per multiprocessor beat shared states with narrow tiles and one cube by
/// 1.2–1.6×.
fn prefer_shared_states() -> bool {
    matches!(
        std::env::var("LOGLINEAR_FUSED_STATES").as_deref(),
        Ok("shared")
    )
}

/// Shared memory (bytes) of one cube of the scalar forward kernel.
pub fn shared_bytes(plan: Plan, nk: usize, levels: usize, nlev: usize) -> usize {
    let Plan {
        chunk,
        pt,
        shared_states,
    } = plan;
    let states = if shared_states {
        nlev.max(1) * nk * pt
    } else {
        1
    };
    let floats = chunk * (nk + 1)
        + nk * chunk
        + chunk * pt
        + chunk * chunk
        + chunk * levels
        + 4 * chunk
        + nlev.max(1)
        + states
        + 2;
    4 * floats
}

/// The preferred chunk size: `LOGLINEAR_FUSED_CHUNK` (16, 32 or 64) when set, else 32, which
/// leaves room for several cubes per multiprocessor.
fn preferred_chunk() -> usize {
    std::env::var("LOGLINEAR_FUSED_CHUNK")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|c| [16, 32, 64].contains(c))
        .unwrap_or(32)
}

/// The largest tiles that fit `max_shared` bytes for a launch with key width `nk`, value width
/// `width`, `levels` λ slots over `seq` tokens; `None` when nothing fits. With `parallel =
/// Some((cubes, sms))` (batch·heads and the device's multiprocessors), narrower value tiles are
/// chosen while there would be fewer than two cubes per multiprocessor: each cube walks the
/// whole sequence, so long sequences with few heads need the extra cubes more than they lose to
/// recomputing the scores per tile.
pub fn plan(
    nk: usize,
    width: usize,
    levels: usize,
    seq: usize,
    max_shared: usize,
    parallel: Option<(usize, usize)>,
) -> Option<Plan> {
    let first = preferred_chunk();
    let placements: &[bool] = if prefer_shared_states() {
        &[true, false]
    } else {
        &[false]
    };
    for &shared_states in placements {
        for chunk in [first, 32, 16].into_iter().filter(|&c| c <= first) {
            let nlev = bitlen(seq.div_ceil(chunk).saturating_sub(1));
            let mut pt = 16;
            while pt < 64 && pt < width {
                pt *= 2;
            }
            while pt >= 16 {
                // Every thread owns whole rows of the output tile: chunk·pt ≥ THREADS.
                let plan = Plan {
                    chunk,
                    pt,
                    shared_states,
                };
                let starved = parallel.is_some_and(|(cubes, sms)| {
                    pt > 16 && chunk * pt / 2 >= THREADS && cubes * width.div_ceil(pt) < 2 * sms
                });
                if !starved
                    && chunk * pt >= THREADS
                    && shared_bytes(plan, nk, levels, nlev) <= max_shared
                {
                    return Some(plan);
                }
                pt /= 2;
            }
        }
    }
    None
}

/// Whether the fused op can run for key width `n`, value width `p`, `l` λ slots over `t`
/// tokens with `max_shared` bytes per cube; otherwise the reason.
pub fn supported(n: usize, p: usize, l: usize, t: usize, max_shared: usize) -> Result<(), String> {
    if plan(n, p, l, t, max_shared, None).is_none() {
        return Err(format!(
            "no tile of the forward kernel fits {max_shared} bytes of shared memory \
             (key width {n}, value width {p}, {l} λ levels)"
        ));
    }
    if plan_backward(n, p, l, t, max_shared, None).is_none() {
        return Err(format!(
            "no tile of the backward kernels fits {max_shared} bytes of shared memory \
             (key width {n}, value width {p}, {l} λ levels)"
        ));
    }
    Ok(())
}

/// The shared memory one cube may use on `device`.
pub fn max_shared_memory(device: &CubeDevice) -> usize {
    device.client().properties().hardware.max_shared_memory_size
}

/// The multiprocessors of `device` (a guess of 1 where the runtime does not say).
fn multiprocessors(device: &CubeDevice) -> usize {
    device
        .client()
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .unwrap_or(1) as usize
}

// Outputs are allocated strictly contiguous: the runtime's default allocation may pad rows (a
// `[.., L]` tensor with L = 9 gets a row pitch of 12), and the kernels index flat offsets.

fn dims(a: &CubeTensor, c: &CubeTensor, lambda: &CubeTensor) -> [usize; 6] {
    let [b, t, h, nk] = a.meta.shape().dims::<4>();
    [b, t, h, nk, c.meta.shape()[3], lambda.meta.shape()[3]]
}

/// The forward op, `out[t] = Σ_{s≤t} λ[t, ℓ(t,s)] e^{Γt−Γs} (a_t·b_s) c_s`, as f32
/// `[B, T, H, width]`: on tensor cores where [`plan_tensor_core`] allows, else the scalar kernel.
pub fn causal(
    a: CubeTensor,
    b: CubeTensor,
    c: CubeTensor,
    g: CubeTensor,
    lambda: CubeTensor,
) -> CubeTensor {
    causal_with(a, b, c, g, lambda, false)
}

/// [`causal`], or with `single` Mamba-2 (λ ignored, one state for the whole past).
fn causal_with(
    a: CubeTensor,
    b: CubeTensor,
    c: CubeTensor,
    g: CubeTensor,
    lambda: CubeTensor,
    single: bool,
) -> CubeTensor {
    let [bs, t, h, nk, width, levels] = dims(&a, &c, &lambda);
    if let Some(plan) = plan_tensor_core(&a, nk, width, levels, bs * h) {
        return causal_tensor_core(a, b, c, g, lambda, plan, single);
    }
    let client = a.client.clone();
    let device = a.device.clone();
    let dtype = a.dtype;
    let g_dtype = g.dtype;
    let max_shared = max_shared_memory(&device);
    let parallel = Some((bs * h, multiprocessors(&device)));
    let plan = plan(nk, width, levels, t, max_shared, parallel).unwrap_or_else(|| {
        panic!("log_linear_fused: no tile fits (nk {nk}, width {width}, L {levels}, T {t})")
    });
    let tiles = width.div_ceil(plan.pt);
    let nlev = state_levels(t, plan.chunk, single);
    let out = empty_device_contiguous_dtype(
        client.clone(),
        device.clone(),
        Shape::new([bs, t, h, width]),
        DType::F32,
    );
    let states = empty_device_contiguous_dtype(
        client.clone(),
        device,
        Shape::new([if plan.shared_states {
            1
        } else {
            tiles * bs * h * nlev.max(1) * nk * plan.pt
        }]),
        DType::F32,
    );
    causal_kernel::launch(
        &client,
        CubeCount::Static((bs * h) as u32, tiles as u32, 1),
        CubeDim::new_1d(THREADS as u32),
        into_contiguous(a).into_tensor_arg(),
        into_contiguous(b).into_tensor_arg(),
        into_contiguous(c).into_tensor_arg(),
        into_contiguous(g).into_tensor_arg(),
        into_contiguous(lambda).into_tensor_arg(),
        out.clone().into_tensor_arg(),
        states.into_tensor_arg(),
        bs,
        t,
        h,
        width,
        plan.chunk,
        nk,
        plan.pt,
        levels,
        nlev,
        plan.shared_states,
        single,
        [dtype_to_storage_type(dtype), dtype_to_storage_type(g_dtype)],
    );
    out
}

/// Level states a causal walk over `t` tokens in chunks of `chunk` keeps: one per chunk level,
/// or for Mamba-2 (`single`) one state once there is an earlier chunk to hold.
fn state_levels(t: usize, chunk: usize, single: bool) -> usize {
    if single {
        usize::from(t > chunk)
    } else {
        bitlen(t.div_ceil(chunk) - 1)
    }
}

/// Shared memory (bytes) of one cube of the causal (`causal`) or anticausal backward kernel.
pub fn backward_shared_bytes(
    chunk: usize,
    pt: usize,
    nk: usize,
    levels: usize,
    nlev: usize,
    causal: bool,
) -> usize {
    let red = if causal { chunk * key_lanes(nk) } else { 0 };
    let floats = chunk * (nk + 1)
        + nk * (chunk + 1)
        + 2 * chunk * (pt + 1)
        + 2 * chunk * chunk
        + chunk * levels
        + red
        + 4 * chunk
        + nlev.max(1);
    4 * floats
}

/// The largest tiles of the backward kernels (states always in global scratch) that fit
/// `max_shared` bytes; as [`plan`] otherwise.
pub fn plan_backward(
    nk: usize,
    width: usize,
    levels: usize,
    seq: usize,
    max_shared: usize,
    parallel: Option<(usize, usize)>,
) -> Option<Plan> {
    let first = preferred_chunk();
    for chunk in [first, 32, 16].into_iter().filter(|&c| c <= first) {
        let nlev = bitlen(seq.div_ceil(chunk).saturating_sub(1));
        let mut pt = 16;
        while pt < 64 && pt < width {
            pt *= 2;
        }
        while pt >= 16 {
            let starved = parallel.is_some_and(|(cubes, sms)| {
                pt > 16 && chunk * pt / 2 >= THREADS && cubes * width.div_ceil(pt) < 2 * sms
            });
            let fits = [true, false].into_iter().all(|causal| {
                backward_shared_bytes(chunk, pt, nk, levels, nlev, causal) <= max_shared
            });
            if !starved && chunk * pt >= THREADS && fits {
                return Some(Plan {
                    chunk,
                    pt,
                    shared_states: false,
                });
            }
            pt /= 2;
        }
    }
    None
}

/// The fused backward's two launches: `(dq, dλ, dk)` per value tile (f32 `[tiles, B, T, H, N]`,
/// `[tiles, B, T, H, L]`, `[tiles, B, T, H, N]`, summed by the caller) and `dv` (f32
/// `[B, T, H, P]`), from the inputs and the output gradient `d_o` (dtype of `q`).
pub fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    lambda: CubeTensor,
    d_o: CubeTensor,
) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
    let [bs, t, h, nk, width, levels] = dims(&q, &v, &lambda);
    let client = q.client.clone();
    let device = q.device.clone();
    let dtype = q.dtype;
    let g_dtype = g.dtype;
    let max_shared = max_shared_memory(&device);
    let parallel = Some((bs * h, multiprocessors(&device)));
    let tensor_cores = plan_tensor_core_backward(&q, nk, width, levels, bs * h);
    let plan = tensor_cores
        .or_else(|| plan_backward(nk, width, levels, t, max_shared, parallel))
        .unwrap_or_else(|| {
            panic!("log_linear_fused backward: no tile fits (N {nk}, P {width}, L {levels}, T {t})")
        });
    let tiles = width.div_ceil(plan.pt);
    let nlev = bitlen(t.div_ceil(plan.chunk) - 1);
    let alloc = |shape: Vec<usize>| {
        empty_device_contiguous_dtype(
            client.clone(),
            device.clone(),
            Shape::from(shape),
            DType::F32,
        )
    };
    let dq = alloc(vec![tiles, bs, t, h, nk]);
    let dl = alloc(vec![tiles, bs, t, h, levels]);
    let dk = alloc(vec![tiles, bs, t, h, nk]);
    let dv = alloc(vec![bs, t, h, width]);
    // One scratch serves both launches (they run one after the other on the stream).
    let states = alloc(vec![tiles * bs * h * nlev.max(1) * nk * plan.pt]);
    let [q, k, v, g, lambda, d_o] = [q, k, v, g, lambda, d_o].map(into_contiguous);
    let dtypes = [dtype_to_storage_type(dtype), dtype_to_storage_type(g_dtype)];
    let cubes = CubeCount::Static((bs * h) as u32, tiles as u32, 1);
    // The two kernel pairs take the same arguments, and the tensor-core pair two more: the vector
    // size of its input loads and whether it pads its shared rows.
    macro_rules! launch_pair {
        ($causal:ident, $anticausal:ident $(, $vector:expr, $pad:expr)?) => {{
            $causal::launch(
                &client,
                cubes.clone(),
                CubeDim::new_1d(THREADS as u32),
                $($vector,)?
                q.clone().into_tensor_arg(),
                k.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                d_o.clone().into_tensor_arg(),
                g.clone().into_tensor_arg(),
                lambda.clone().into_tensor_arg(),
                dq.clone().into_tensor_arg(),
                dl.clone().into_tensor_arg(),
                states.clone().into_tensor_arg(),
                bs,
                t,
                h,
                width,
                plan.chunk,
                nk,
                plan.pt,
                levels,
                nlev,
                $($pad,)?
                dtypes,
            );
            $anticausal::launch(
                &client,
                cubes,
                CubeDim::new_1d(THREADS as u32),
                $($vector,)?
                q.into_tensor_arg(),
                k.into_tensor_arg(),
                v.into_tensor_arg(),
                d_o.into_tensor_arg(),
                g.into_tensor_arg(),
                lambda.into_tensor_arg(),
                dk.clone().into_tensor_arg(),
                dv.clone().into_tensor_arg(),
                states.into_tensor_arg(),
                bs,
                t,
                h,
                width,
                plan.chunk,
                nk,
                plan.pt,
                levels,
                nlev,
                $($pad,)?
                dtypes,
            );
        }};
    }
    if tensor_cores.is_some() {
        let (vector, pad) = (vector_size(&[&q, &k, &v, &d_o]), pad_rows());
        launch_pair!(
            causal_backward_tc_kernel,
            anticausal_backward_tc_kernel,
            vector,
            pad
        );
    } else {
        launch_pair!(causal_backward_kernel, anticausal_backward_kernel);
    }
    (dq, dl, dk, dv)
}

/// The tensor-core forward's tiles for `q: [B, T, H, nk]` and values `width` wide, when it can
/// run: [`crate::ops::on_tensor_cores`] (bf16 inputs, `nk` a multiple of 16, a device whose
/// `cmma` takes bf16 tiles) and the buffers fitting its shared memory. The chunk is
/// `LOGLINEAR_TC_CHUNK` (32 or 64; default 64: the level states are read and merged once per
/// chunk, so longer chunks halve that traffic); `LOGLINEAR_FUSED_TC=0` turns the path off.
fn plan_tensor_core(
    q: &CubeTensor,
    nk: usize,
    width: usize,
    levels: usize,
    cubes: usize,
) -> Option<Plan> {
    plan_tc(q, nk, width, cubes, |chunk, pt| {
        tc_shared_bytes(chunk, nk, pt, levels, 2, pad_rows())
    })
}

/// The tensor-core backward's tiles (both kernels must fit), as [`plan_tensor_core`].
fn plan_tensor_core_backward(
    q: &CubeTensor,
    nk: usize,
    width: usize,
    levels: usize,
    cubes: usize,
) -> Option<Plan> {
    plan_tc(q, nk, width, cubes, |chunk, pt| {
        [true, false]
            .into_iter()
            .map(|causal| tc_backward_shared_bytes(chunk, nk, pt, levels, 2, causal, pad_rows()))
            .max()
            .unwrap_or(0)
    })
}

/// Whether `device`'s `cmma` takes 16×16×16 bf16 tiles with f32 accumulation and
/// `LOGLINEAR_FUSED_TC` is not `0`: the device's half of [`crate::ops::on_tensor_cores`].
pub fn bf16_cmma(device: &CubeDevice) -> bool {
    props_bf16_cmma(device.client().properties())
}

/// [`bf16_cmma`] from a device's properties (a launch has them at hand).
fn props_bf16_cmma(props: &cubecl::ir::DeviceProperties) -> bool {
    if matches!(std::env::var("LOGLINEAR_FUSED_TC").as_deref(), Ok("0")) {
        return false;
    }
    let elem = ElemType::Float(FloatKind::BF16);
    let mma = MmaConfig {
        a_type: elem,
        b_type: elem,
        cd_type: ElemType::Float(FloatKind::F32),
        m: TILE as u32,
        n: TILE as u32,
        k: TILE as u32,
    };
    props.features.matmul.cmma.contains(&mma)
}

/// Tensor-core tiles for inputs like `q` whose cubes need `shared(chunk, pt)` bytes: the
/// preferred chunk (then 32), the widest value tile that fits and keeps two cubes per
/// multiprocessor busy; `None` where the path cannot run.
fn plan_tc(
    q: &CubeTensor,
    nk: usize,
    width: usize,
    cubes: usize,
    shared: impl Fn(usize, usize) -> usize,
) -> Option<Plan> {
    let props = q.client.properties();
    // The same condition as `Form::Auto`'s choice of the fused form.
    if !crate::ops::on_tensor_cores(q.dtype, nk, props_bf16_cmma(props)) {
        return None;
    }
    let first = std::env::var("LOGLINEAR_TC_CHUNK")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|c| [32, 64].contains(c))
        .unwrap_or(64);
    let max_shared = props.hardware.max_shared_memory_size;
    let sms = multiprocessors(&q.device);
    for chunk in [first, 32].into_iter().filter(|&c| c <= first) {
        let mut pt = 64;
        while pt > 16 && pt / 2 >= width {
            pt /= 2;
        }
        while pt >= 16 {
            let starved = pt > 16 && cubes * width.div_ceil(pt) < 2 * sms;
            if !starved && shared(chunk, pt) <= max_shared {
                return Some(Plan {
                    chunk,
                    pt,
                    shared_states: false,
                });
            }
            pt /= 2;
        }
    }
    None
}

/// Mamba-2 (SSD), `o[t] = Σ_{s≤t} e^{Γt−Γs} (q_t·k_s) v_s` as f32 `[B, T, H, P]`: the forward
/// kernel (on tensor cores where [`plan_tensor_core`] allows) with one state instead of the
/// Fenwick levels — λ ≡ 1 without the levels.
pub fn mamba2(q: CubeTensor, k: CubeTensor, v: CubeTensor, g: CubeTensor) -> CubeTensor {
    let [bs, t, h, _] = q.meta.shape().dims::<4>();
    // The kernels read a λ of one level they then ignore: g itself, viewed as [B, T, H, 1].
    let g = into_contiguous(g);
    let lambda = reshape(g.clone(), Shape::new([bs, t, h, 1]));
    causal_with(q, k, v, g, lambda, true)
}

/// The forward on tensor cores ([`causal_tc_kernel`]) with `plan`; `single`: Mamba-2.
fn causal_tensor_core(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    lambda: CubeTensor,
    plan: Plan,
    single: bool,
) -> CubeTensor {
    let [bs, t, h, nk, width, levels] = dims(&q, &v, &lambda);
    let client = q.client.clone();
    let device = q.device.clone();
    let dtypes = [
        dtype_to_storage_type(q.dtype),
        dtype_to_storage_type(g.dtype),
    ];
    let tiles = width.div_ceil(plan.pt);
    let nlev = state_levels(t, plan.chunk, single);
    let alloc = |shape: Vec<usize>| {
        empty_device_contiguous_dtype(
            client.clone(),
            device.clone(),
            Shape::from(shape),
            DType::F32,
        )
    };
    let out = alloc(vec![bs, t, h, width]);
    let states = alloc(vec![tiles * bs * h * nlev.max(1) * nk * plan.pt]);
    let [q, k, v, g, lambda] = [q, k, v, g, lambda].map(into_contiguous);
    let vector = vector_size(&[&q, &k, &v]);
    causal_tc_kernel::launch(
        &client,
        CubeCount::Static((bs * h) as u32, tiles as u32, 1),
        CubeDim::new_1d(THREADS as u32),
        vector,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        g.into_tensor_arg(),
        lambda.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        states.into_tensor_arg(),
        bs,
        t,
        h,
        width,
        plan.chunk,
        nk,
        plan.pt,
        levels,
        nlev,
        single,
        pad_rows(),
        dtypes,
    );
    out
}

/// Whether the tensor-core kernels pad the rows of their shared tiles against bank conflicts
/// (`LOGLINEAR_TC_PAD=0` turns it off, for comparisons).
fn pad_rows() -> bool {
    !matches!(std::env::var("LOGLINEAR_TC_PAD").as_deref(), Ok("0"))
}

/// The vector size (elements per load) of the tensor-core kernels' bf16 `inputs` (contiguous,
/// rows of `nk` or `width` elements): the widest the runtime loads well (8 = 16 bytes on CUDA)
/// that divides every row width and buffer offset, else 1. `LOGLINEAR_TC_VEC=1` forces one
/// element per load (for comparisons).
fn vector_size(inputs: &[&CubeTensor]) -> usize {
    if matches!(std::env::var("LOGLINEAR_TC_VEC").as_deref(), Ok("1")) {
        return 1;
    }
    let Some(first) = inputs.first() else {
        return 1;
    };
    first
        .client
        .io_optimized_vector_sizes(first.dtype.size())
        .filter(|&n| {
            inputs.iter().all(|x| {
                x.meta.shape()[3].is_multiple_of(n)
                    && x.handle
                        .offset_start
                        .unwrap_or(0)
                        .is_multiple_of((n * x.dtype.size()) as u64)
            })
        })
        .max()
        .unwrap_or(1)
}

/// Runs [`vector_helpers_probe_kernel`](super::tensor_core::vector_helpers_probe_kernel) on
/// `device` and returns `(rows, level)`; `x` is `[1, seq, 1, width]`, `states` `2·len` floats.
/// (`chunk`, `cols`, `len`) ∈ {(16, 16, 256), (64, 32, 2048)}: the kernel's shapes are compiled in.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn probe_vector_helpers(
    device: &CubeDevice,
    x: &[f32],
    seq: usize,
    width: usize,
    (t0, c0): (usize, usize),
    states: &[f32],
    f: f32,
    fresh: bool,
    (chunk, cols, len): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    use super::tensor_core::vector_helpers_probe_kernel;
    assert_eq!(
        x.len(),
        seq * width,
        "probe_vector_helpers: x is not seq × width"
    );
    assert_eq!(
        states.len(),
        2 * len,
        "probe_vector_helpers: states is not 2·len"
    );
    let client = device.client();
    let upload = |v: &[f32]| {
        let bytes: Vec<u8> = v.iter().flat_map(|e| e.to_le_bytes()).collect();
        client.create_from_slice(&bytes)
    };
    let arg = |handle: &cubecl::server::Handle, shape: Vec<usize>| {
        let strides: Vec<usize> = (0..shape.len())
            .map(|i| shape[i + 1..].iter().product())
            .collect();
        // SAFETY: shapes and strides describe the whole contiguous buffer just created.
        unsafe { TensorArg::from_raw_parts(handle.clone(), strides.into(), shape.into()) }
    };
    let x_h = upload(x);
    let s_h = upload(states);
    let rows_h = upload(&vec![f32::NAN; chunk * cols]);
    let level_h = upload(&vec![f32::NAN; len]);
    vector_helpers_probe_kernel::launch(
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(THREADS as u32),
        4,
        arg(&x_h, vec![1, seq, 1, width]),
        arg(&s_h, vec![2 * len]),
        arg(&rows_h, vec![chunk * cols]),
        arg(&level_h, vec![len]),
        seq,
        width,
        t0,
        c0,
        f,
        u32::from(fresh),
        chunk,
        cols,
        len,
    );
    let read = |h: cubecl::server::Handle| -> Vec<f32> {
        let bytes = client
            .read_one(h)
            .expect("probe_vector_helpers: reading back");
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    (read(rows_h), read(level_h))
}

/// Units per cube of the cross-entropy kernels (one cube per row of logits).
pub const CE_THREADS: usize = 256;

/// One cube per row, on a 2-D grid: some runtimes cap a grid axis at 65,535 cubes.
fn row_grid(rows: usize) -> CubeCount {
    let x = rows.clamp(1, 65_535);
    CubeCount::Static(x as u32, rows.div_ceil(x) as u32, 1)
}

/// Softmax cross-entropy per row: `(nll, lse)`, f32 `[rows]` each, from `logits: [rows, V]` and
/// integer `targets: [rows]` in `0..V` (see `cross_entropy.rs`).
pub fn cross_entropy(logits: CubeTensor, targets: CubeTensor) -> (CubeTensor, CubeTensor) {
    let [rows, vocab] = logits.meta.shape().dims::<2>();
    let (client, device) = (logits.client.clone(), logits.device.clone());
    let column = || {
        empty_device_contiguous_dtype(
            client.clone(),
            device.clone(),
            Shape::new([rows]),
            DType::F32,
        )
    };
    let (nll, lse) = (column(), column());
    if rows > 0 {
        let dtypes = [
            dtype_to_storage_type(logits.dtype),
            dtype_to_storage_type(targets.dtype),
        ];
        ce_forward_kernel::launch(
            &client,
            row_grid(rows),
            CubeDim::new_1d(CE_THREADS as u32),
            into_contiguous(logits).into_tensor_arg(),
            into_contiguous(targets).into_tensor_arg(),
            nll.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            rows,
            vocab,
            dtypes,
        );
    }
    (nll, lse)
}

/// The gradient of [`cross_entropy`]'s `nll` with respect to the logits, `[rows, V]` in their
/// dtype, for an output gradient `grad: [rows]` (f32) and the forward's `lse`.
pub fn cross_entropy_backward(
    logits: CubeTensor,
    targets: CubeTensor,
    lse: CubeTensor,
    grad: CubeTensor,
) -> CubeTensor {
    let [rows, vocab] = logits.meta.shape().dims::<2>();
    let (client, device, dtype) = (logits.client.clone(), logits.device.clone(), logits.dtype);
    let out =
        empty_device_contiguous_dtype(client.clone(), device, Shape::new([rows, vocab]), dtype);
    if rows > 0 {
        ce_backward_kernel::launch(
            &client,
            row_grid(rows),
            CubeDim::new_1d(CE_THREADS as u32),
            into_contiguous(logits).into_tensor_arg(),
            into_contiguous(targets.clone()).into_tensor_arg(),
            into_contiguous(lse).into_tensor_arg(),
            into_contiguous(grad).into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows,
            vocab,
            [
                dtype_to_storage_type(dtype),
                dtype_to_storage_type(targets.dtype),
            ],
        );
    }
    out
}
