//! Tile planning (one planner for every kernel) and the launchers of the fused kernels.

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
use super::cube::{Geometry, TC_BACKWARD_THREADS, THREADS, causal_kernel};
use super::segments::{across_states_kernel, segment_states_kernel, segment_states_tc_kernel};
use super::tensor_core::{TILE, causal_tc_kernel, tc_shared_bytes};
use super::tensor_core_backward::{
    anticausal_backward_tc_kernel, causal_backward_tc_kernel, tc_backward_shared_bytes,
};
use crate::fenwick::bitlen;

/// Chunk size, value-tile width and units per cube of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Tokens per chunk (16, 32 or 64).
    pub chunk: usize,
    /// Value columns per cube (16, 32 or 64).
    pub pt: usize,
    /// Units per cube ([`Kernels::threads`]).
    pub threads: usize,
}

impl Plan {
    /// The kernels' compile-time sizes for key width `nk`, value width `width`, `levels` λ slots
    /// and `nlev` level states.
    pub(super) fn geometry(self, nk: usize, width: usize, levels: usize, nlev: usize) -> Geometry {
        Geometry {
            chunk: self.chunk,
            nk,
            pt: self.pt,
            levels,
            nlev,
            threads: self.threads,
            tiled: width > self.pt,
            compact_levels: false,
        }
    }
}

/// The kernels a plan is for. The families differ in their preferred chunk and their shared
/// memory per cube; everything else about choosing tiles is common ([`plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// The scalar forward (`causal_kernel`).
    Forward,
    /// The scalar backward pair (`causal_backward_kernel`, `anticausal_backward_kernel`).
    Backward,
    /// The tensor-core forward (`causal_tc_kernel`, bf16 inputs).
    TensorCoreForward,
    /// The tensor-core backward pair (`causal_backward_tc_kernel`,
    /// `anticausal_backward_tc_kernel`, bf16 inputs).
    TensorCoreBackward,
}

impl Kernels {
    /// Chunk sizes to try, preferred first. The scalar kernels prefer 32 tokens, which leaves
    /// room for several cubes per multiprocessor (their first version at chunk 16 was 1.6–1.8×
    /// slower, bench/RESULTS.md session 2); the tensor-core ones 64, since the level states are
    /// read and merged once per chunk and longer chunks halve that traffic (chunk 32: 1.1–1.5×
    /// slower forward, 1.06–1.1× forward+backward, session 3).
    fn chunks(self) -> &'static [usize] {
        match self {
            Kernels::Forward | Kernels::Backward => &[32, 16],
            Kernels::TensorCoreForward | Kernels::TensorCoreBackward => &[64, 32],
        }
    }

    /// Units per cube: [`TC_BACKWARD_THREADS`] for the tensor-core backward, whose shared memory
    /// allows one cube per multiprocessor, else [`THREADS`].
    pub fn threads(self) -> usize {
        match self {
            Kernels::TensorCoreBackward => TC_BACKWARD_THREADS,
            _ => THREADS,
        }
    }

    /// Shared memory (bytes) of one cube (of the larger kernel of a pair) with tiles `plan`,
    /// key width `nk`, value width `width`, `levels` λ slots and `nlev` level states.
    fn shared_bytes(
        self,
        plan: Plan,
        nk: usize,
        width: usize,
        levels: usize,
        nlev: usize,
    ) -> usize {
        let Plan { chunk, pt, .. } = plan;
        let bf16 = 2;
        match self {
            Kernels::Forward => forward_shared_bytes(chunk, pt, nk, levels, nlev),
            Kernels::Backward => [true, false]
                .map(|causal| backward_shared_bytes(chunk, pt, nk, levels, nlev, causal))
                .into_iter()
                .max()
                .unwrap_or(0),
            Kernels::TensorCoreForward => tc_shared_bytes(chunk, nk, pt, levels, bf16),
            Kernels::TensorCoreBackward => [true, false]
                .map(|causal| {
                    tc_backward_shared_bytes(chunk, nk, pt, levels, bf16, causal, width > pt)
                })
                .into_iter()
                .max()
                .unwrap_or(0),
        }
    }
}

/// The tiles of `kernels` for a launch with key width `nk`, value width `width` and `levels` λ
/// slots over `seq` tokens, within `max_shared` bytes of shared memory per cube; `None` when
/// nothing fits. For each chunk size (preferred first), the widest value tile (16, 32 or 64
/// columns, no wider than `width` needs) that fits. With `parallel = Some((cubes, sms))`
/// (batch·heads and the device's multiprocessors), narrower value tiles are chosen while there
/// would be fewer than two cubes per multiprocessor: each cube walks the whole sequence, so long
/// sequences with few heads need the extra cubes more than they lose to recomputing the scores
/// per tile.
pub fn plan(
    kernels: Kernels,
    nk: usize,
    width: usize,
    levels: usize,
    seq: usize,
    max_shared: usize,
    parallel: Option<(usize, usize)>,
) -> Option<Plan> {
    for &chunk in kernels.chunks() {
        let nlev = bitlen(seq.div_ceil(chunk).saturating_sub(1));
        let mut pt = 16;
        while pt < 64 && pt < width {
            pt *= 2;
        }
        let threads = kernels.threads();
        while pt >= 16 {
            let plan = Plan { chunk, pt, threads };
            // Every unit owns whole rows of the output tile: chunk·pt ≥ threads.
            let starved = parallel.is_some_and(|(cubes, sms)| {
                pt > 16 && chunk * pt / 2 >= threads && cubes * width.div_ceil(pt) < 2 * sms
            });
            if !starved
                && chunk * pt >= threads
                && kernels.shared_bytes(plan, nk, width, levels, nlev) <= max_shared
            {
                return Some(plan);
            }
            pt /= 2;
        }
    }
    None
}

/// Shared memory (bytes) of one cube of the scalar forward kernel.
pub fn forward_shared_bytes(
    chunk: usize,
    pt: usize,
    nk: usize,
    levels: usize,
    nlev: usize,
) -> usize {
    let floats = chunk * (nk + 1)
        + nk * chunk
        + chunk * pt
        + chunk * chunk
        + chunk * levels
        + 4 * chunk
        + nlev.max(1)
        + 2;
    4 * floats
}

/// Shared memory (bytes) of one cube of the scalar causal (`causal`) or anticausal backward
/// kernel.
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

/// Whether the fused op can run for key width `n`, value width `p`, `l` λ slots over `t`
/// tokens with `max_shared` bytes per cube (the scalar kernels, which every device runs);
/// otherwise the reason.
pub fn supported(n: usize, p: usize, l: usize, t: usize, max_shared: usize) -> Result<(), String> {
    for (kernels, name) in [
        (Kernels::Forward, "forward"),
        (Kernels::Backward, "backward"),
    ] {
        if plan(kernels, n, p, l, t, max_shared, None).is_none() {
            return Err(format!(
                "no tile of the {name} kernels fits {max_shared} bytes of shared memory \
                 (key width {n}, value width {p}, {l} λ levels)"
            ));
        }
    }
    Ok(())
}

/// The shared memory one cube may use on `device`.
pub fn max_shared_memory(device: &CubeDevice) -> usize {
    device.client().properties().hardware.max_shared_memory_size
}

/// The multiprocessors of `device` (a guess of 1 where the runtime does not say).
pub fn multiprocessors(device: &CubeDevice) -> usize {
    device
        .client()
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .unwrap_or(1) as usize
}

/// Whether `device` has the bf16 tensor-core instructions the kernels' products are written in:
/// `mma.sync` m16n8k16 with bf16 operands and f32 accumulation, its operands loaded from shared
/// memory by `ldmatrix` (see `tensor_core::tile_matmul`): the device's half of
/// [`crate::ops::on_tensor_cores`].
pub fn bf16_cmma(device: &CubeDevice) -> bool {
    props_bf16_cmma(device.client().properties())
}

/// [`bf16_cmma`] from a device's properties (a launch has them at hand).
fn props_bf16_cmma(props: &cubecl::ir::DeviceProperties) -> bool {
    let elem = ElemType::Float(FloatKind::BF16);
    let mma = MmaConfig {
        a_type: elem,
        b_type: elem,
        cd_type: ElemType::Float(FloatKind::F32),
        m: TILE as u32,
        n: (TILE / 2) as u32,
        k: TILE as u32,
    };
    props.features.matmul.mma.contains(&mma) && props.features.matmul.ldmatrix.contains(&elem)
}

/// The plan of a launch over inputs like `q: [B, T, H, nk]` with values `width` wide and
/// `levels` λ slots: on tensor cores (`tensor_cores` kernels) where
/// [`crate::ops::on_tensor_cores`] allows (bf16 inputs, `nk` a multiple of 16, a device whose
/// `cmma` takes bf16 tiles — the condition `Form::Auto` uses to choose the fused form) and
/// their tiles fit, else the `scalar` kernels. Returns whether the tensor-core kernels run.
fn plan_launch(
    q: &CubeTensor,
    width: usize,
    levels: usize,
    segments: usize,
    (tensor_cores, scalar): (Kernels, Kernels),
) -> (Plan, bool) {
    let [bs, t, h, nk] = q.meta.shape().dims::<4>();
    let props = q.client.properties();
    let max_shared = props.hardware.max_shared_memory_size;
    let parallel = Some((bs * segments * h, multiprocessors(&q.device)));
    if crate::ops::on_tensor_cores(q.dtype, nk, props_bf16_cmma(props))
        && let Some(plan) = plan(tensor_cores, nk, width, levels, t, max_shared, parallel)
    {
        return (plan, true);
    }
    let plan = plan(scalar, nk, width, levels, t, max_shared, parallel).unwrap_or_else(|| {
        panic!("log_linear_fused ({scalar:?}): no tile fits (N {nk}, P {width}, L {levels}, T {t})")
    });
    (plan, false)
}

/// How a launch walks its sequences: each in one cube (`segments` = 1, `seg_chunks` its chunks),
/// or in `segments` aligned segments of `seg_chunks` chunks (a power of two), each a cube of its
/// own, reading the levels across segments from states written before the launch
/// (`segments.rs`). More cubes where few long sequences would leave the card idle.
#[derive(Clone, Copy, Debug)]
struct Walk {
    segments: usize,
    seg_chunks: usize,
}

impl Walk {
    /// Segments of `segment` tokens over `t` (1 for `segment` 0 or `≥ t`), before the chunk is
    /// known (for the planner's count of cubes).
    fn segments_of(t: usize, segment: usize) -> usize {
        if segment == 0 || segment >= t {
            1
        } else {
            t.div_ceil(segment)
        }
    }

    /// The walk for `segment` (a power of two; segments shorter than a chunk are one chunk).
    fn new(t: usize, segment: usize, chunk: usize) -> Self {
        let chunks = t.div_ceil(chunk);
        if Self::segments_of(t, segment) == 1 {
            return Walk {
                segments: 1,
                seg_chunks: chunks,
            };
        }
        assert!(
            segment.is_power_of_two(),
            "log_linear_fused: segment length {segment} is not a power of two"
        );
        let seg_chunks = (segment / chunk).max(1);
        Walk {
            segments: chunks.div_ceil(seg_chunks),
            seg_chunks,
        }
    }

    /// The chunk levels inside a segment.
    fn own_levels(self) -> usize {
        bitlen(self.seg_chunks - 1)
    }

    /// The causal kernels' level scratch with the levels across segments written (`R`;
    /// `value_major` for the scalar causal backward, whose levels are `[pt, nk]`), and the
    /// segments' log-decays `[B·segments, H]` for [`Walk::query_side`].
    #[allow(clippy::too_many_arguments)]
    fn key_side(
        self,
        k: &CubeTensor,
        v: &CubeTensor,
        g: &CubeTensor,
        lambda: &CubeTensor,
        geo: Geometry,
        tiles: usize,
        value_major: bool,
        tensor_cores: bool,
    ) -> (CubeTensor, CubeTensor) {
        let [bs, _, h, nk] = k.meta.shape().dims::<4>();
        let rows = bs * self.segments;
        let key_states = alloc_f32(k, vec![tiles, rows, h, 1, nk, geo.pt]);
        let totals = alloc_f32(k, vec![rows, h]);
        self.segment_states(
            k,
            v,
            g,
            lambda,
            &key_states,
            &totals,
            geo,
            true,
            tensor_cores,
        );
        let states = self.across(&key_states, &totals, geo, tiles, true, value_major);
        (states, totals)
    }

    /// The anticausal kernels' level scratch with the levels across segments written (`D`),
    /// from `q`, the output gradient `d_o` and the segments' log-decays `totals`.
    #[allow(clippy::too_many_arguments)]
    fn query_side(
        self,
        q: &CubeTensor,
        d_o: &CubeTensor,
        g: &CubeTensor,
        lambda: &CubeTensor,
        totals: &CubeTensor,
        geo: Geometry,
        tiles: usize,
        tensor_cores: bool,
    ) -> CubeTensor {
        let [bs, _, h, nk] = q.meta.shape().dims::<4>();
        let above = geo.nlev - self.own_levels();
        let query_states = alloc_f32(q, vec![tiles, bs * self.segments, h, above, nk, geo.pt]);
        self.segment_states(
            q,
            d_o,
            g,
            lambda,
            &query_states,
            totals,
            geo,
            false,
            tensor_cores,
        );
        self.across(&query_states, totals, geo, tiles, false, false)
    }

    /// `segment_states_kernel` into `out` (`[tiles, B·segments, H, I, nk, pt]`, one cube per
    /// segment, value tile and slot `I`): the key states of `a = k`, `b = v` and the segments'
    /// log-decays into `totals` with `key`, else the query states of `a = q`, `b = dO` per level
    /// above the segments.
    #[allow(clippy::too_many_arguments)]
    fn segment_states(
        self,
        a: &CubeTensor,
        b: &CubeTensor,
        g: &CubeTensor,
        lambda: &CubeTensor,
        out: &CubeTensor,
        totals: &CubeTensor,
        geo: Geometry,
        key: bool,
        tensor_cores: bool,
    ) {
        let [bs, t, h, _] = a.meta.shape().dims::<4>();
        let [tiles, rows, _, slots, _, _] = out.meta.shape().dims::<6>();
        debug_assert_eq!(rows, bs * self.segments);
        let cubes = CubeCount::Static((rows * h) as u32, tiles as u32, slots as u32);
        let geo = Geometry {
            threads: THREADS,
            ..geo
        };
        let dtypes = [
            dtype_to_storage_type(a.dtype),
            dtype_to_storage_type(g.dtype),
        ];
        macro_rules! launch {
            ($kernel:ident $(, $vector:expr)?) => {
                $kernel::launch(
                    &a.client,
                    cubes,
                    CubeDim::new_1d(THREADS as u32),
                    $($vector,)?
                    a.clone().into_tensor_arg(),
                    b.clone().into_tensor_arg(),
                    g.clone().into_tensor_arg(),
                    lambda.clone().into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    totals.clone().into_tensor_arg(),
                    bs,
                    t,
                    h,
                    b.meta.shape()[3],
                    self.segments,
                    self.seg_chunks,
                    self.own_levels(),
                    geo,
                    key,
                    dtypes,
                )
            };
        }
        if tensor_cores {
            let vector = vector_size(&[a, b]);
            launch!(segment_states_tc_kernel, vector);
        } else {
            launch!(segment_states_kernel);
        }
    }

    /// A level scratch `[tiles, B·segments, H, nlev, nk, pt]` (`value_major`: `pt, nk`) with the
    /// levels across segments written from the segments' states (`across_states_kernel`).
    fn across(
        self,
        seg_states: &CubeTensor,
        totals: &CubeTensor,
        geo: Geometry,
        tiles: usize,
        causal: bool,
        value_major: bool,
    ) -> CubeTensor {
        let [_, rows, h, _, nk, pt] = seg_states.meta.shape().dims::<6>();
        let bs = rows / self.segments;
        let above = geo.nlev - self.own_levels();
        let states = alloc_f32(seg_states, vec![tiles * rows * h * geo.nlev * nk * pt]);
        across_states_kernel::launch(
            &seg_states.client,
            CubeCount::Static((rows * h) as u32, tiles as u32, above as u32),
            CubeDim::new_1d(THREADS as u32),
            seg_states.clone().into_tensor_arg(),
            totals.clone().into_tensor_arg(),
            states.clone().into_tensor_arg(),
            bs,
            h,
            self.segments,
            self.own_levels(),
            Geometry {
                threads: THREADS,
                ..geo
            },
            causal,
            value_major,
        );
        states
    }
}

/// Whether a forward keeps its level states compactly (`Geometry::compact_levels`: level 0 in
/// registers, the others as input-dtype planes): the log-linear op (not Mamba-2's one state) on
/// tensor cores, walked whole — in segments the levels across segments are written by another
/// kernel as f32, and a segment's first chunk would find no level 0 held.
pub(super) fn compact_levels(tensor_cores: bool, single: bool, segments: usize) -> bool {
    tensor_cores && !single && segments == 1
}

// Outputs are allocated strictly contiguous: the runtime's default allocation may pad rows (a
// `[.., L]` tensor with L = 9 gets a row pitch of 12), and the kernels index flat offsets.

/// An f32 tensor of `shape` on the device of `like`, strictly contiguous.
fn alloc_f32(like: &CubeTensor, shape: Vec<usize>) -> CubeTensor {
    alloc(like, shape, DType::F32)
}

/// A tensor of `shape` and `dtype` on the device of `like`, strictly contiguous.
fn alloc(like: &CubeTensor, shape: Vec<usize>, dtype: DType) -> CubeTensor {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        dtype,
    )
}

/// The forward op, `out[t] = Σ_{s≤t} λ[t, ℓ(t,s)] e^{Γt−Γs} (q_t·k_s) v_s`, as `[B, T, H, P]`
/// in the dtype of `q` (rounded once from f32 accumulators) from `q, k: [B, T, H, N]`,
/// `v: [B, T, H, P]`, `g: [B, T, H]`,
/// `lambda: [B, T, H, L]`: on tensor cores where they run, else the scalar kernel.
///
/// `segment`: 0 (or `≥ T`) walks each sequence in one cube; else aligned segments of `segment`
/// tokens (a power of two, at least one chunk) walk in cubes of their own, the levels across
/// segments written before the launch ([`Walk`]).
pub fn causal(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    lambda: CubeTensor,
    segment: usize,
) -> CubeTensor {
    causal_with(q, k, v, g, lambda, false, segment)
}

/// Mamba-2 (SSD), `o[t] = Σ_{s≤t} e^{Γt−Γs} (q_t·k_s) v_s` as `[B, T, H, P]` in the dtype of
/// `q`: the forward kernels with one state instead of the Fenwick levels — λ ≡ 1 without the
/// levels.
pub fn mamba2(q: CubeTensor, k: CubeTensor, v: CubeTensor, g: CubeTensor) -> CubeTensor {
    let [bs, t, h, _] = q.meta.shape().dims::<4>();
    // The kernels read a λ of one level they then ignore: g itself, viewed as [B, T, H, 1].
    let g = into_contiguous(g);
    let lambda = reshape(g.clone(), Shape::new([bs, t, h, 1]));
    causal_with(q, k, v, g, lambda, true, 0)
}

/// [`causal`], or with `single` Mamba-2 (λ ignored, one state for the whole past; one walk).
fn causal_with(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    lambda: CubeTensor,
    single: bool,
    segment: usize,
) -> CubeTensor {
    let [bs, t, h, nk] = q.meta.shape().dims::<4>();
    let width = v.meta.shape()[3];
    let levels = lambda.meta.shape()[3];
    let segment = if single { 0 } else { segment };
    let (plan, tensor_cores) = plan_launch(
        &q,
        width,
        levels,
        Walk::segments_of(t, segment),
        (Kernels::TensorCoreForward, Kernels::Forward),
    );
    let walk = Walk::new(t, segment, plan.chunk);
    let tiles = width.div_ceil(plan.pt);
    let nlev = if single {
        usize::from(t > plan.chunk)
    } else {
        bitlen(t.div_ceil(plan.chunk) - 1)
    };
    let geometry = Geometry {
        compact_levels: compact_levels(tensor_cores, single, walk.segments),
        ..plan.geometry(nk, width, levels, nlev)
    };
    // Written in the input dtype: a separate cast of an f32 output read 4 and wrote 2 bytes a
    // value more (≈ 0.8 ms at T = 8192, B = 16, H = 48, P = 64).
    let out = alloc(&q, vec![bs, t, h, width], q.dtype);
    let [q, k, v, g, lambda] = [q, k, v, g, lambda].map(into_contiguous);
    let states = if walk.segments > 1 {
        walk.key_side(&k, &v, &g, &lambda, geometry, tiles, false, tensor_cores)
            .0
    } else {
        alloc_f32(&q, vec![tiles * bs * h * nlev.max(1) * nk * plan.pt])
    };
    let client = q.client.clone();
    let dtypes = [
        dtype_to_storage_type(q.dtype),
        dtype_to_storage_type(g.dtype),
    ];
    let cubes = CubeCount::Static((bs * walk.segments * h) as u32, tiles as u32, 1);
    let threads = CubeDim::new_1d(plan.threads as u32);
    macro_rules! launch {
        ($kernel:ident $(, $vector:expr)?) => {
            $kernel::launch(
                &client,
                cubes,
                threads,
                $($vector,)?
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
                walk.segments,
                walk.seg_chunks,
                geometry,
                single,
                dtypes,
            )
        };
    }
    if tensor_cores {
        let vector = vector_size(&[&q, &k, &v]);
        launch!(causal_tc_kernel, vector);
    } else {
        launch!(causal_kernel);
    }
    out
}

/// What the fused backward's two launches return. `dq`, `dk`, `dl` and `dgamma` come per value
/// tile (leading dimension `tiles`) and sum over it; with one tile `dq` and `dk` are already in
/// the dtype of `q`, with several they are f32 partials.
pub struct BackwardGrads {
    /// `[tiles, B, T, H, N]`.
    pub dq: CubeTensor,
    /// `[tiles, B, T, H, N]`.
    pub dk: CubeTensor,
    /// `[B, T, H, P]`, dtype of `q`.
    pub dv: CubeTensor,
    /// `[tiles, B, T, H, L]`, f32.
    pub dl: CubeTensor,
    /// `dΓ_t = Σ_ℓ λ[t,ℓ] dλ[t,ℓ] − v_t·dv_t` (`dO_t·o_t − v_t·dv_t`), `[tiles, B, T, H]`, f32:
    /// `dg` is its reverse cumulative sum over time.
    pub dgamma: CubeTensor,
}

/// The fused backward's two launches ([`BackwardGrads`]) from the inputs and the output
/// gradient `d_o` (dtype of `q`), walking the sequences as [`causal`] does for `segment`.
pub fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    lambda: CubeTensor,
    d_o: CubeTensor,
    segment: usize,
) -> BackwardGrads {
    let [bs, t, h, nk] = q.meta.shape().dims::<4>();
    let width = v.meta.shape()[3];
    let levels = lambda.meta.shape()[3];
    let (plan, tensor_cores) = plan_launch(
        &q,
        width,
        levels,
        Walk::segments_of(t, segment),
        (Kernels::TensorCoreBackward, Kernels::Backward),
    );
    let walk = Walk::new(t, segment, plan.chunk);
    let tiles = width.div_ceil(plan.pt);
    let nlev = bitlen(t.div_ceil(plan.chunk) - 1);
    let geometry = plan.geometry(nk, width, levels, nlev);
    // Gradients the kernels write whole are written in the input dtype (a separate cast read 4
    // and wrote 2 bytes a value more: ≈ 4 ms of dq, dk and dv at T = 8192, B = 16, H = 48 on an
    // H100, bench/RESULTS.md session 29); per-tile partials stay f32 until they are summed.
    let partial = if tiles == 1 { q.dtype } else { DType::F32 };
    let dq = alloc(&q, vec![tiles, bs, t, h, nk], partial);
    let dk = alloc(&q, vec![tiles, bs, t, h, nk], partial);
    let dv = alloc(&q, vec![bs, t, h, width], q.dtype);
    let dl = alloc_f32(&q, vec![tiles, bs, t, h, levels]);
    let dgamma = alloc_f32(&q, vec![tiles, bs, t, h]);
    let client = q.client.clone();
    let dtypes = [
        dtype_to_storage_type(q.dtype),
        dtype_to_storage_type(g.dtype),
        dtype_to_storage_type(partial),
    ];
    let [q, k, v, g, lambda, d_o] = [q, k, v, g, lambda, d_o].map(into_contiguous);
    // In one walk one scratch serves both launches (they run one after the other on the
    // stream); in segments each kernel starts from the levels across segments of its side.
    let (causal_states, anticausal_states) = if walk.segments > 1 {
        // The scalar causal backward keeps its levels value-major.
        let (states, totals) = walk.key_side(
            &k,
            &v,
            &g,
            &lambda,
            geometry,
            tiles,
            !tensor_cores,
            tensor_cores,
        );
        let query = walk.query_side(
            &q,
            &d_o,
            &g,
            &lambda,
            &totals,
            geometry,
            tiles,
            tensor_cores,
        );
        (states, query)
    } else {
        let states = alloc_f32(&q, vec![tiles * bs * h * nlev.max(1) * nk * plan.pt]);
        (states.clone(), states)
    };
    let cubes = CubeCount::Static((bs * walk.segments * h) as u32, tiles as u32, 1);
    let threads = CubeDim::new_1d(plan.threads as u32);
    // The causal kernel writes dq, dλ and dΓ's first term, then the anticausal one dk, dv and
    // subtracts dΓ's second (it must run after); the tensor-core pair takes the vector size of
    // its input loads first.
    macro_rules! launch {
        ($kernel:ident, $first:expr, $second:expr, $states:expr $(, $vector:expr)?) => {
            $kernel::launch(
                &client,
                cubes.clone(),
                threads,
                $($vector,)?
                q.clone().into_tensor_arg(),
                k.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                d_o.clone().into_tensor_arg(),
                g.clone().into_tensor_arg(),
                lambda.clone().into_tensor_arg(),
                $first.clone().into_tensor_arg(),
                $second.clone().into_tensor_arg(),
                dgamma.clone().into_tensor_arg(),
                $states.clone().into_tensor_arg(),
                bs,
                t,
                h,
                width,
                walk.segments,
                walk.seg_chunks,
                geometry,
                dtypes,
            )
        };
    }
    if tensor_cores {
        let vector = vector_size(&[&q, &k, &v, &d_o]);
        launch!(causal_backward_tc_kernel, dq, dl, causal_states, vector);
        launch!(
            anticausal_backward_tc_kernel,
            dk,
            dv,
            anticausal_states,
            vector
        );
    } else {
        launch!(causal_backward_kernel, dq, dl, causal_states);
        launch!(anticausal_backward_kernel, dk, dv, anticausal_states);
    }
    BackwardGrads {
        dq,
        dk,
        dv,
        dl,
        dgamma,
    }
}

/// The vector size (elements per load) of the tensor-core kernels' bf16 `inputs` (contiguous,
/// rows of `nk` or `width` elements): the widest the runtime loads well (8 = 16 bytes on CUDA)
/// that divides every row width and buffer offset, else 1 (one element per load: 3 % slower at
/// T = 8192 on the H200, bench/RESULTS.md session 4).
fn vector_size(inputs: &[&CubeTensor]) -> usize {
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

/// What [`probe_vector_helpers`] read back (see
/// [`vector_helpers_probe_kernel`](super::tensor_core::vector_helpers_probe_kernel)).
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct ProbedHelpers {
    /// The loaded rows, `chunk × cols`.
    pub rows: Vec<f32>,
    /// The merged level read back as `hi + lo`, `len`.
    pub level: Vec<f32>,
    /// The first level rewritten from the carry, `len`.
    pub carried: Vec<f32>,
    /// Two levels summed in registers and stored split, read back as `hi + lo`, `len`.
    pub summed: Vec<f32>,
}

/// Runs [`vector_helpers_probe_kernel`](super::tensor_core::vector_helpers_probe_kernel) on
/// `device`; `x` is `[1, seq, 1, width]`, `states` `2·len` floats.
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
) -> ProbedHelpers {
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
    let carried_h = upload(&vec![f32::NAN; len]);
    let summed_h = upload(&vec![f32::NAN; len]);
    vector_helpers_probe_kernel::launch(
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(THREADS as u32),
        4,
        arg(&x_h, vec![1, seq, 1, width]),
        arg(&s_h, vec![2 * len]),
        arg(&rows_h, vec![chunk * cols]),
        arg(&level_h, vec![len]),
        arg(&carried_h, vec![len]),
        arg(&summed_h, vec![len]),
        seq,
        width,
        t0,
        c0,
        f,
        u32::from(fresh),
        chunk,
        cols,
        len,
        // The tensor-core kernels' stores where they run (CUDA); element stores elsewhere.
        props_bf16_cmma(client.properties()),
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
    ProbedHelpers {
        rows: read(rows_h),
        level: read(level_h),
        carried: read(carried_h),
        summed: read(summed_h),
    }
}
