//! Causal softmax attention as fused kernels (FlashAttention-2's algorithm) for the Transformer
//! baseline: the scores of a block of queries against a block of keys live in shared memory and
//! registers only, never in device memory, each way.
//!
//! Why: [`super::block_attention`] runs two cuBLAS products around a softmax kernel per block of
//! 1,024 queries, so every score goes through device memory twice forward and four times
//! backward; at T = 8192 × 4 its softmax passes took 52 ms of our Transformer's 129 ms step
//! against 103 ms for the whole step of a FlashAttention-2 model (bench/RESULTS.md). A softmax
//! baseline that slow would make "log-linear vs softmax" a comparison of implementations.
//!
//! Forward, one cube per (sequence·head, block of `block` queries): the query block stays in
//! shared memory; for each key block it sees, `S = Q Kᵀ` ([`product`]: 16×16×16 tensor-core tiles
//! where the device takes bf16 ones, scalar code elsewhere), the online softmax update of each
//! row's running maximum `m` and sum `l` (f32), `P = e^{scale·S − m}` rounded to the input dtype,
//! and `O ← O · e^{m_old − m} + P V` with `O` in f32 registers. The output is `O / l`; the rows'
//! `lse = m + ln l` (f32) is kept for the backward.
//!
//! Backward, with `Δ_i = Σ_c dO_ic O_ic` ([`flash_delta_kernel`]) and `P` recomputed from `lse`:
//! `dV = Pᵀ dO`, `dS = scale · P ⊙ (dO Vᵀ − Δ)`, `dK = dSᵀ Q` in one kernel with a cube per key
//! block walking the query blocks that see it, and `dQ = dS K` in another with a cube per query
//! block walking its key blocks (two kernels instead of FlashAttention-2's atomic adds to dQ:
//! deterministic, at the price of recomputing `S` and `dO Vᵀ` once more).
//!
//! Masking: query `i` sits at position `past + i` and sees keys `0 ..= past + i` (`past` keys of
//! a cache before the queries). Key 0 is seen by every query, so every row's maximum is finite
//! after its first key block. Query rows past the sequence's end are computed as if they were
//! there and not stored; key rows past the end are zero and masked.
//!
//! Shapes: `q: [B, H, T, d]`, `k, v: [B, H, S, d]` with any strides whose last is 1 (the
//! Transformer passes views of its `q | k | v` projection), `d` ∈ {16, 32, 64, 128}.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::tensor::{DType, Shape};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::ops::fused::tensor_core::{ALIGN, EXACT, FULL, row_len_f32, row_len_input, tile_matmul};

/// Units per cube (eight planes of 32).
pub const THREADS: usize = 256;
/// Head widths the kernels take.
pub const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];
/// Query and key block edges the planner chooses from, largest first.
const BLOCKS: [usize; 3] = [64, 32, 16];

/// `([B, H, T, d], [B, H, T])`: the output's and the rows' `lse` shapes for `q: [B, H, T, d]`,
/// `k, v: [B, H, S, d]`; panics on other shapes.
pub(crate) fn flash_shapes(q: &Shape, k: &Shape, v: &Shape) -> (Shape, Shape) {
    let ok = q.num_dims() == 4
        && k.num_dims() == 4
        && v.num_dims() == 4
        && q[0] == k[0]
        && q[1] == k[1]
        && k.as_slice() == v.as_slice()
        && q[3] == k[3];
    assert!(
        ok,
        "flash_attention: q {:?}, k {:?}, v {:?} (expected [B, H, T, d], [B, H, S, d], \
         [B, H, S, d])",
        q.as_slice(),
        k.as_slice(),
        v.as_slice()
    );
    (q.clone(), Shape::new([q[0], q[1], q[2]]))
}

/// Fused causal attention as a backend extension with its own backward.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait FlashAttentionKernels: Backend {
    /// `(out, lse)`: `softmax(scale · q kᵀ + causal mask) · v` in the dtype of `q`, and each
    /// query row's `ln Σ_j e^{scale · q·k_j}` over the keys it sees (f32, `[B, H, T]`; not
    /// differentiable). `block`: the query and key block edge (0: the largest that fits).
    #[allow(clippy::type_complexity)]
    #[fusion(meta = |q, k, v, _scale, _past, _block| {
        let (out, lse) = flash_shapes(&q.shape, &k.shape, &v.shape);
        (
            burn::backend::fusion::custom::TensorSpec::new(out, q.dtype),
            burn::backend::fusion::custom::TensorSpec::new(lse, DType::F32),
        )
    })]
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `(dq, dk, dv)` of [`Self::flash_attention`]'s `out` for the output gradient `dout`, from
    /// the forward's `out` and `lse`.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    #[fusion(meta = |q, k, v, _out, _lse, _dout, _scale, _past, _block| (
        burn::backend::fusion::custom::TensorSpec::new(q.shape.clone(), q.dtype),
        burn::backend::fusion::custom::TensorSpec::new(k.shape.clone(), k.dtype),
        burn::backend::fusion::custom::TensorSpec::new(v.shape.clone(), v.dtype),
    ))]
    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

/// `stage[r · ldc + c] = Σ_k A[r, k] B[k, c]` for `A: rows × inner`, `B: inner × cols` in shared
/// memory (`a_col`: `A[r, k]` at `a[k · lda + r]`, else `a[r · lda + k]`; `b_col` alike), f32
/// results. On tensor cores ([`tile_matmul`], 16×16×16 tiles over the cube's planes) or, without
/// them, one output entry per unit at a time. Every unit of the cube must call it.
#[cube]
#[allow(clippy::too_many_arguments)]
fn product<E: Float>(
    a: &Shared<[E]>,
    b: &Shared<[E]>,
    stage: &mut Shared<[f32]>,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] inner: usize,
    #[comptime] cols: usize,
    #[comptime] a_col: bool,
    #[comptime] lda: usize,
    #[comptime] b_col: bool,
    #[comptime] ldb: usize,
    #[comptime] ldc: usize,
    #[comptime] tc: bool,
) {
    if comptime!(tc) {
        tile_matmul::<E>(
            a,
            a,
            b,
            b,
            stage,
            u / 32,
            THREADS / 32,
            rows,
            inner,
            cols,
            a_col,
            lda,
            b_col,
            ldb,
            FULL,
            FULL,
            EXACT,
            ldc,
        );
    } else {
        let mut e = u;
        while e < comptime!(rows * cols) {
            let r = e / cols;
            let c = e % cols;
            let mut s = 0.0f32;
            for kk in 0..inner {
                let av = if comptime!(a_col) {
                    a[kk * lda + r]
                } else {
                    a[r * lda + kk]
                };
                let bv = if comptime!(b_col) {
                    b[c * ldb + kk]
                } else {
                    b[kk * ldb + c]
                };
                s += f32::cast_from(av) * f32::cast_from(bv);
            }
            stage[r * ldc + c] = s;
            e += THREADS;
        }
    }
}

/// Rows `r0 .. r0 + block` of one (sequence, head) of `src: [B, H, rows, d]` (starting at element
/// `base`, rows `st` elements apart; read `N` elements per load) into `dst` at row length `ld`;
/// rows at or past `valid` are zero. Every load of a unit is in flight before it stores any:
/// loading and storing element by element waited out one memory latency per element (the first
/// version of these kernels ran at a quarter of their speed so).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_block<E: Float, N: Size>(
    src: &Tensor<Vector<E, N>>,
    dst: &mut Shared<[E]>,
    base: usize,
    st: usize,
    r0: usize,
    valid: usize,
    u: usize,
    #[comptime] block: usize,
    #[comptime] d: usize,
    #[comptime] ld: usize,
) {
    let n = src.vector_size();
    let per_row = comptime!(d / n);
    let total = comptime!(block * d / n);
    let trips = comptime!(total.div_ceil(THREADS));
    let mut held = Array::<Vector<E, N>>::new(trips);
    #[unroll]
    for r in 0..trips {
        let idx = u + r * THREADS;
        let row = idx / per_row;
        let c = (idx % per_row) * n;
        let mut val = Vector::<E, N>::zeroed();
        if idx < total && r0 + row < valid {
            val = src[(base + (r0 + row) * st + c) / n];
        }
        held[r] = val;
    }
    #[unroll]
    for r in 0..trips {
        let idx = u + r * THREADS;
        if idx < total {
            let val = held[r];
            let first = (idx / per_row) * ld + (idx % per_row) * n;
            #[unroll]
            for e in 0..n {
                dst[first + e] = val.extract(e);
            }
        }
    }
}

/// Whether query row `qrow` (of `t`) sees key `key` (of `s`).
#[cube]
fn visible(key: usize, qrow: usize, past: usize, s: usize) -> bool {
    key <= past + qrow && key < s
}

/// Geometry of the kernels, fixed at compile time: block edge, head width, tensor cores, and
/// the shared row lengths derived from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashGeometry {
    /// Queries (and keys) per block.
    pub block: usize,
    /// Head width `d`.
    pub d: usize,
    /// Products on 16×16×16 tensor-core tiles.
    pub tc: bool,
}

impl FlashGeometry {
    /// Row length of a `block × d` input-dtype tile in shared memory.
    pub const fn ld_in(self) -> usize {
        row_len_input(self.d)
    }
    /// Row length of a `block × block` input-dtype tile (probabilities, `dS`).
    pub const fn ld_p(self) -> usize {
        row_len_input(self.block)
    }
    /// Row length of the f32 scores in the staging buffer.
    pub const fn ld_s(self) -> usize {
        row_len_f32(self.block)
    }
    /// Row length of an f32 `block × d` product result in the staging buffer.
    pub const fn ld_o(self) -> usize {
        row_len_f32(self.d)
    }
    /// f32 elements of the staging buffer.
    pub const fn stage_len(self) -> usize {
        let (s, o) = (self.block * self.ld_s(), self.block * self.ld_o());
        if s > o { s } else { o }
    }
    /// Units working on one row of scores, and the columns each takes.
    pub const fn units_per_row(self) -> usize {
        THREADS / self.block
    }
    pub const fn cols_per_unit(self) -> usize {
        self.block * self.block / THREADS
    }
    /// Rows of the `block × d` register accumulators per unit (units over columns, then rows).
    pub const fn rows_per_unit(self) -> usize {
        self.block * self.d / THREADS
    }
    /// Shared memory (bytes) of the largest kernel (the `dK, dV` one) for `elem`-byte inputs.
    pub const fn shared_bytes(self, elem: usize) -> usize {
        let tiles = 4 * self.block * self.ld_in() + 2 * self.block * self.ld_p();
        elem * tiles + 4 * (self.stage_len() + 2 * self.block + THREADS) + 8 * ALIGN
    }
}

/// Forward: `out` and `lse` for one (sequence·head, query block) per cube (grid `(⌈T/block⌉,
/// B·H)`), `out: [B, H, T, d]` contiguous, `lse: [B·H·T]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn flash_forward_kernel<E: Float, N: Size>(
    q: &Tensor<Vector<E, N>>,
    k: &Tensor<Vector<E, N>>,
    v: &Tensor<Vector<E, N>>,
    out: &mut Tensor<E>,
    lse: &mut Tensor<f32>,
    scale: f32,
    past: usize,
    #[comptime] geo: FlashGeometry,
    #[define(E)] _dtype: ElemType,
) {
    let (block, d, tc) = comptime!((geo.block, geo.d, geo.tc));
    let (ldi, ldp, lds, ldo) = comptime!((geo.ld_in(), geo.ld_p(), geo.ld_s(), geo.ld_o()));
    let (upr, cpu, rpu) = comptime!((
        geo.units_per_row(),
        geo.cols_per_unit(),
        geo.rows_per_unit()
    ));
    let stage_size = comptime!(geo.stage_len());
    let heads = q.shape(1);
    let t = q.shape(2);
    let s = k.shape(2);
    let n = CUBE_POS_Y as usize;
    let (b, h) = (n / heads, n % heads);
    let r0 = CUBE_POS_X as usize * block;
    let u = UNIT_POS_X as usize;

    let mut qs = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut ks = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut vs = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut ps = Shared::<[E]>::new_aligned_slice(comptime!(block * ldp), ALIGN);
    let mut stage = Shared::<[f32]>::new_aligned_slice(stage_size, ALIGN);
    let mut m_s = Shared::<[f32]>::new_slice(block);
    let mut l_s = Shared::<[f32]>::new_slice(block);
    let mut corr = Shared::<[f32]>::new_slice(block);
    let mut red = Shared::<[f32]>::new_slice(THREADS);

    let qbase = b * q.stride(0) + h * q.stride(1);
    let kbase = b * k.stride(0) + h * k.stride(1);
    let vbase = b * v.stride(0) + h * v.stride(1);
    load_block::<E, N>(q, &mut qs, qbase, q.stride(2), r0, t, u, block, d, ldi);
    if u < block {
        m_s[u] = f32::min_value();
        l_s[u] = 0.0f32;
    }
    // Accumulators: unit u holds column u % d of rows u / d, u / d + THREADS / d, ...
    let pc = u % d;
    let rbase = u / d;
    let rstep = comptime!(THREADS / d);
    let mut acc = Array::<f32>::new(rpu);
    #[unroll]
    for r in 0..rpu {
        acc[r] = 0.0f32;
    }
    // Scores: unit u takes columns part · cpu .. (part + 1) · cpu of row u / upr.
    let row = u / upr;
    let part = u % upr;
    let mut kend = past + r0 + block;
    if kend > s {
        kend = s;
    }
    let key_blocks = kend.div_ceil(block);
    for j in 0..key_blocks {
        let c0 = j * block;
        load_block::<E, N>(k, &mut ks, kbase, k.stride(2), c0, s, u, block, d, ldi);
        load_block::<E, N>(v, &mut vs, vbase, v.stride(2), c0, s, u, block, d, ldi);
        sync_cube();
        // S = Q Kᵀ (Kᵀ: K read column-major).
        product::<E>(
            &qs, &ks, &mut stage, u, block, d, block, false, ldi, true, ldi, lds, tc,
        );
        sync_cube();
        // The online softmax: the row's new maximum over this block's visible scores ...
        let mut mx = f32::min_value();
        #[unroll]
        for cc in 0..cpu {
            let c = part * cpu + cc;
            if visible(c0 + c, r0 + row, past, s) {
                mx = f32::max(mx, stage[row * lds + c] * scale);
            }
        }
        red[u] = mx;
        sync_cube();
        let m_old = m_s[row];
        let mut m_new = m_old;
        for p in 0..upr {
            m_new = f32::max(m_new, red[row * upr + p]);
        }
        // ... the probabilities against it, and their sum.
        let mut sum = 0.0f32;
        #[unroll]
        for cc in 0..cpu {
            let c = part * cpu + cc;
            let mut p = 0.0f32;
            if visible(c0 + c, r0 + row, past, s) {
                p = (stage[row * lds + c] * scale - m_new).exp();
            }
            ps[row * ldp + c] = E::cast_from(p);
            sum += p;
        }
        sync_cube();
        red[u] = sum;
        sync_cube();
        if part == 0 {
            let mut total = 0.0f32;
            for p in 0..upr {
                total += red[row * upr + p];
            }
            let f = (m_old - m_new).exp();
            l_s[row] = l_s[row] * f + total;
            m_s[row] = m_new;
            corr[row] = f;
        }
        sync_cube();
        // O ← O · e^{m_old − m_new} + P V.
        product::<E>(
            &ps, &vs, &mut stage, u, block, block, d, false, ldp, false, ldi, ldo, tc,
        );
        sync_cube();
        #[unroll]
        for r in 0..rpu {
            let i = rbase + r * rstep;
            acc[r] = acc[r] * corr[i] + stage[i * ldo + pc];
        }
        sync_cube();
    }
    let obase = n * t * d;
    #[unroll]
    for r in 0..rpu {
        let i = rbase + r * rstep;
        if r0 + i < t {
            out[obase + (r0 + i) * d + pc] = E::cast_from(acc[r] / l_s[i]);
        }
    }
    if u < block && r0 + u < t {
        lse[n * t + r0 + u] = m_s[u] + l_s[u].ln();
    }
}

/// `delta[row] = Σ_c dout[row, c] · out[row, c]` (f32) for the rows of `out: [B, H, T, d]`
/// (contiguous) and `dout` (any strides, the last 1); one unit per row.
#[cube(launch)]
pub fn flash_delta_kernel<E: Float>(
    out: &Tensor<E>,
    dout: &Tensor<E>,
    delta: &mut Tensor<f32>,
    #[comptime] d: usize,
    #[define(E)] _dtype: ElemType,
) {
    let heads = dout.shape(1);
    let t = dout.shape(2);
    let rows = dout.shape(0) * heads * t;
    let idx = (CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize) * THREADS
        + UNIT_POS_X as usize;
    if idx < rows {
        let i = idx % t;
        let n = idx / t;
        let (b, h) = (n / heads, n % heads);
        let gbase = b * dout.stride(0) + h * dout.stride(1) + i * dout.stride(2);
        let mut s = 0.0f32;
        for c in 0..d {
            s += f32::cast_from(dout[gbase + c]) * f32::cast_from(out[idx * d + c]);
        }
        delta[idx] = s;
    }
}

/// Loads the `lse` and `delta` of query rows `r0 .. r0 + block` of sequence·head `n` (0 past `t`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_row_stats(
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    lse_s: &mut Shared<[f32]>,
    delta_s: &mut Shared<[f32]>,
    n: usize,
    t: usize,
    r0: usize,
    u: usize,
    #[comptime] block: usize,
) {
    if u < block {
        let mut l = 0.0f32;
        let mut dl = 0.0f32;
        if r0 + u < t {
            l = lse[n * t + r0 + u];
            dl = delta[n * t + r0 + u];
        }
        lse_s[u] = l;
        delta_s[u] = dl;
    }
}

/// Backward for the keys: `dK` and `dV` of one (sequence·head, key block) per cube (grid
/// `(⌈S/block⌉, B·H)`), walking the query blocks that see the block. `dk, dv: [B, H, S, d]`
/// contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_kv_kernel<E: Float, N: Size>(
    q: &Tensor<Vector<E, N>>,
    k: &Tensor<Vector<E, N>>,
    v: &Tensor<Vector<E, N>>,
    dout: &Tensor<Vector<E, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dk: &mut Tensor<E>,
    dv: &mut Tensor<E>,
    scale: f32,
    past: usize,
    #[comptime] geo: FlashGeometry,
    #[define(E)] _dtype: ElemType,
) {
    let (block, d, tc) = comptime!((geo.block, geo.d, geo.tc));
    let (ldi, ldp, lds, ldo) = comptime!((geo.ld_in(), geo.ld_p(), geo.ld_s(), geo.ld_o()));
    let (upr, cpu, rpu) = comptime!((
        geo.units_per_row(),
        geo.cols_per_unit(),
        geo.rows_per_unit()
    ));
    let stage_size = comptime!(geo.stage_len());
    let heads = q.shape(1);
    let t = q.shape(2);
    let s = k.shape(2);
    let n = CUBE_POS_Y as usize;
    let (b, h) = (n / heads, n % heads);
    let c0 = CUBE_POS_X as usize * block;
    let u = UNIT_POS_X as usize;

    let mut qs = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut gs = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut ks = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut vs = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut ps = Shared::<[E]>::new_aligned_slice(comptime!(block * ldp), ALIGN);
    let mut dss = Shared::<[E]>::new_aligned_slice(comptime!(block * ldp), ALIGN);
    let mut stage = Shared::<[f32]>::new_aligned_slice(stage_size, ALIGN);
    let mut lse_s = Shared::<[f32]>::new_slice(block);
    let mut delta_s = Shared::<[f32]>::new_slice(block);

    let qbase = b * q.stride(0) + h * q.stride(1);
    let gbase = b * dout.stride(0) + h * dout.stride(1);
    let kbase = b * k.stride(0) + h * k.stride(1);
    let vbase = b * v.stride(0) + h * v.stride(1);
    load_block::<E, N>(k, &mut ks, kbase, k.stride(2), c0, s, u, block, d, ldi);
    load_block::<E, N>(v, &mut vs, vbase, v.stride(2), c0, s, u, block, d, ldi);
    let pc = u % d;
    let rbase = u / d;
    let rstep = comptime!(THREADS / d);
    let mut acc_k = Array::<f32>::new(rpu);
    let mut acc_v = Array::<f32>::new(rpu);
    #[unroll]
    for r in 0..rpu {
        acc_k[r] = 0.0f32;
        acc_v[r] = 0.0f32;
    }
    let row = u / upr;
    let part = u % upr;
    let mut preg = Array::<f32>::new(cpu);
    // The first query that sees key c0 sits at position c0: query row c0 − past.
    let mut first = 0usize;
    if c0 > past {
        first = c0 - past;
    }
    let query_blocks = t.div_ceil(block);
    for i in first / block..query_blocks {
        let r0 = i * block;
        load_block::<E, N>(q, &mut qs, qbase, q.stride(2), r0, t, u, block, d, ldi);
        load_block::<E, N>(
            dout,
            &mut gs,
            gbase,
            dout.stride(2),
            r0,
            t,
            u,
            block,
            d,
            ldi,
        );
        load_row_stats(lse, delta, &mut lse_s, &mut delta_s, n, t, r0, u, block);
        sync_cube();
        // P = e^{scale · Q Kᵀ − lse} (rows: queries, columns: keys).
        product::<E>(
            &qs, &ks, &mut stage, u, block, d, block, false, ldi, true, ldi, lds, tc,
        );
        sync_cube();
        #[unroll]
        for cc in 0..cpu {
            let c = part * cpu + cc;
            let mut p = 0.0f32;
            if r0 + row < t && visible(c0 + c, r0 + row, past, s) {
                p = (stage[row * lds + c] * scale - lse_s[row]).exp();
            }
            preg[cc] = p;
            ps[row * ldp + c] = E::cast_from(p);
        }
        sync_cube();
        // dV += Pᵀ dO (Pᵀ: P read column-major).
        product::<E>(
            &ps, &gs, &mut stage, u, block, block, d, true, ldp, false, ldi, ldo, tc,
        );
        sync_cube();
        #[unroll]
        for r in 0..rpu {
            acc_v[r] += stage[(rbase + r * rstep) * ldo + pc];
        }
        sync_cube();
        // dS = scale · P ⊙ (dO Vᵀ − Δ).
        product::<E>(
            &gs, &vs, &mut stage, u, block, d, block, false, ldi, true, ldi, lds, tc,
        );
        sync_cube();
        #[unroll]
        for cc in 0..cpu {
            let c = part * cpu + cc;
            let ds = preg[cc] * (stage[row * lds + c] - delta_s[row]) * scale;
            dss[row * ldp + c] = E::cast_from(ds);
        }
        sync_cube();
        // dK += dSᵀ Q.
        product::<E>(
            &dss, &qs, &mut stage, u, block, block, d, true, ldp, false, ldi, ldo, tc,
        );
        sync_cube();
        #[unroll]
        for r in 0..rpu {
            acc_k[r] += stage[(rbase + r * rstep) * ldo + pc];
        }
        sync_cube();
    }
    let obase = n * s * d;
    #[unroll]
    for r in 0..rpu {
        let i = rbase + r * rstep;
        if c0 + i < s {
            dk[obase + (c0 + i) * d + pc] = E::cast_from(acc_k[r]);
            dv[obase + (c0 + i) * d + pc] = E::cast_from(acc_v[r]);
        }
    }
}

/// Backward for the queries: `dQ` of one (sequence·head, query block) per cube (grid
/// `(⌈T/block⌉, B·H)`), walking the key blocks it sees. `dq: [B, H, T, d]` contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_q_kernel<E: Float, N: Size>(
    q: &Tensor<Vector<E, N>>,
    k: &Tensor<Vector<E, N>>,
    v: &Tensor<Vector<E, N>>,
    dout: &Tensor<Vector<E, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dq: &mut Tensor<E>,
    scale: f32,
    past: usize,
    #[comptime] geo: FlashGeometry,
    #[define(E)] _dtype: ElemType,
) {
    let (block, d, tc) = comptime!((geo.block, geo.d, geo.tc));
    let (ldi, ldp, lds, ldo) = comptime!((geo.ld_in(), geo.ld_p(), geo.ld_s(), geo.ld_o()));
    let (upr, cpu, rpu) = comptime!((
        geo.units_per_row(),
        geo.cols_per_unit(),
        geo.rows_per_unit()
    ));
    let stage_size = comptime!(geo.stage_len());
    let heads = q.shape(1);
    let t = q.shape(2);
    let s = k.shape(2);
    let n = CUBE_POS_Y as usize;
    let (b, h) = (n / heads, n % heads);
    let r0 = CUBE_POS_X as usize * block;
    let u = UNIT_POS_X as usize;

    let mut qs = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut gs = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut ks = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut vs = Shared::<[E]>::new_aligned_slice(comptime!(block * ldi), ALIGN);
    let mut dss = Shared::<[E]>::new_aligned_slice(comptime!(block * ldp), ALIGN);
    let mut stage = Shared::<[f32]>::new_aligned_slice(stage_size, ALIGN);
    let mut lse_s = Shared::<[f32]>::new_slice(block);
    let mut delta_s = Shared::<[f32]>::new_slice(block);

    let qbase = b * q.stride(0) + h * q.stride(1);
    let gbase = b * dout.stride(0) + h * dout.stride(1);
    let kbase = b * k.stride(0) + h * k.stride(1);
    let vbase = b * v.stride(0) + h * v.stride(1);
    load_block::<E, N>(q, &mut qs, qbase, q.stride(2), r0, t, u, block, d, ldi);
    load_block::<E, N>(
        dout,
        &mut gs,
        gbase,
        dout.stride(2),
        r0,
        t,
        u,
        block,
        d,
        ldi,
    );
    load_row_stats(lse, delta, &mut lse_s, &mut delta_s, n, t, r0, u, block);
    let pc = u % d;
    let rbase = u / d;
    let rstep = comptime!(THREADS / d);
    let mut acc = Array::<f32>::new(rpu);
    #[unroll]
    for r in 0..rpu {
        acc[r] = 0.0f32;
    }
    let row = u / upr;
    let part = u % upr;
    let mut preg = Array::<f32>::new(cpu);
    let mut kend = past + r0 + block;
    if kend > s {
        kend = s;
    }
    let key_blocks = kend.div_ceil(block);
    for j in 0..key_blocks {
        let c0 = j * block;
        load_block::<E, N>(k, &mut ks, kbase, k.stride(2), c0, s, u, block, d, ldi);
        load_block::<E, N>(v, &mut vs, vbase, v.stride(2), c0, s, u, block, d, ldi);
        sync_cube();
        product::<E>(
            &qs, &ks, &mut stage, u, block, d, block, false, ldi, true, ldi, lds, tc,
        );
        sync_cube();
        #[unroll]
        for cc in 0..cpu {
            let c = part * cpu + cc;
            let mut p = 0.0f32;
            if r0 + row < t && visible(c0 + c, r0 + row, past, s) {
                p = (stage[row * lds + c] * scale - lse_s[row]).exp();
            }
            preg[cc] = p;
        }
        sync_cube();
        product::<E>(
            &gs, &vs, &mut stage, u, block, d, block, false, ldi, true, ldi, lds, tc,
        );
        sync_cube();
        #[unroll]
        for cc in 0..cpu {
            let c = part * cpu + cc;
            let ds = preg[cc] * (stage[row * lds + c] - delta_s[row]) * scale;
            dss[row * ldp + c] = E::cast_from(ds);
        }
        sync_cube();
        // dQ += dS K.
        product::<E>(
            &dss, &ks, &mut stage, u, block, block, d, false, ldp, false, ldi, ldo, tc,
        );
        sync_cube();
        #[unroll]
        for r in 0..rpu {
            acc[r] += stage[(rbase + r * rstep) * ldo + pc];
        }
        sync_cube();
    }
    let obase = n * t * d;
    #[unroll]
    for r in 0..rpu {
        let i = rbase + r * rstep;
        if r0 + i < t {
            dq[obase + (r0 + i) * d + pc] = E::cast_from(acc[r]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Launches
// ---------------------------------------------------------------------------------------------

/// Whether the products of `t`'s kernels run on tensor cores: bf16 inputs on a device whose
/// `cmma` takes 16×16×16 bf16 tiles with f32 accumulation.
fn tensor_cores(t: &CubeTensor) -> bool {
    t.dtype == DType::BF16 && crate::ops::fused::cube_bf16_cmma(&t.device)
}

/// The geometry for `q`: the largest block of [`BLOCKS`] (or `block` when asked) whose kernels fit
/// the device's shared memory, tensor cores where they take the dtype. Panics on a head width
/// outside [`HEAD_DIMS`] or a block asked for that does not fit.
pub fn plan(q: &CubeTensor, block: usize) -> FlashGeometry {
    let d = q.meta.shape()[3];
    assert!(
        HEAD_DIMS.contains(&d),
        "flash_attention: head width {d} (expected one of {HEAD_DIMS:?})"
    );
    let tc = tensor_cores(q);
    let max = q.client.properties().hardware.max_shared_memory_size;
    let elem = q.dtype.size();
    let fits = |block: usize| FlashGeometry { block, d, tc }.shared_bytes(elem) <= max;
    if block > 0 {
        assert!(
            BLOCKS.contains(&block) && fits(block),
            "flash_attention: block {block} (expected one of {BLOCKS:?} that fits {max} bytes \
             of shared memory at head width {d})"
        );
        return FlashGeometry { block, d, tc };
    }
    let block = BLOCKS.into_iter().find(|&b| fits(b)).unwrap_or_else(|| {
        panic!("flash_attention: no block fits {max} bytes of shared memory at head width {d}")
    });
    FlashGeometry { block, d, tc }
}

/// `t` with a unit last stride (a copy otherwise; the kernels read the other strides).
fn unit_last_stride(t: CubeTensor) -> CubeTensor {
    let strides = t.meta.strides();
    if strides[strides.len() - 1] == 1 && t.meta.tiling == Default::default() {
        t
    } else {
        into_contiguous(t)
    }
}

/// Elements per load of the inputs (`[B, H, rows, d]`, unit last stride): the widest the runtime
/// loads well (8 bf16 = 16 bytes on CUDA) that divides the head width, every other stride and
/// every buffer offset, else 1.
fn vector_size(inputs: &[&CubeTensor]) -> usize {
    let first = inputs[0];
    first
        .client
        .io_optimized_vector_sizes(first.dtype.size())
        .filter(|&n| {
            inputs.iter().all(|x| {
                let strides = x.meta.strides();
                x.meta.shape()[3].is_multiple_of(n)
                    && strides[..3].iter().all(|s| s.is_multiple_of(n))
                    && x.handle
                        .offset_start
                        .unwrap_or(0)
                        .is_multiple_of((n * x.dtype.size()) as u64)
            })
        })
        .max()
        .unwrap_or(1)
}

fn empty(like: &CubeTensor, shape: Shape, dtype: DType) -> CubeTensor {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

fn forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    scale: f32,
    past: usize,
    block: usize,
) -> (CubeTensor, CubeTensor) {
    let (out_shape, lse_shape) = flash_shapes(q.meta.shape(), k.meta.shape(), v.meta.shape());
    let dtype = q.dtype;
    let (q, k, v) = (
        unit_last_stride(q),
        unit_last_stride(super::cast(k, dtype)),
        unit_last_stride(super::cast(v, dtype)),
    );
    let geo = plan(&q, block);
    let out = empty(&q, out_shape.clone(), dtype);
    let lse = empty(&q, lse_shape, DType::F32);
    let [b, h, t, _] = out_shape.dims::<4>();
    if b * h * t > 0 && k.meta.shape()[2] > 0 {
        let vector = vector_size(&[&q, &k, &v]);
        flash_forward_kernel::launch(
            &q.client.clone(),
            CubeCount::Static(t.div_ceil(geo.block) as u32, (b * h) as u32, 1),
            CubeDim::new_1d(THREADS as u32),
            vector,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            scale,
            past,
            geo,
            dtype_to_storage_type(dtype),
        );
    }
    (out, lse)
}

#[allow(clippy::too_many_arguments)]
fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    out: CubeTensor,
    lse: CubeTensor,
    dout: CubeTensor,
    scale: f32,
    past: usize,
    block: usize,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let (out_shape, lse_shape) = flash_shapes(q.meta.shape(), k.meta.shape(), v.meta.shape());
    assert!(
        dout.meta.shape() == &out_shape && lse.meta.shape() == &lse_shape,
        "flash_attention_backward: dout {:?}, lse {:?} for an output {:?}",
        dout.meta.shape().as_slice(),
        lse.meta.shape().as_slice(),
        out_shape.as_slice()
    );
    let dtype = q.dtype;
    let (k_dtype, v_dtype) = (k.dtype, v.dtype);
    let (q, k, v) = (
        unit_last_stride(q),
        unit_last_stride(super::cast(k, dtype)),
        unit_last_stride(super::cast(v, dtype)),
    );
    let out = into_contiguous(super::cast(out, dtype));
    let dout = unit_last_stride(super::cast(dout, dtype));
    let lse = into_contiguous(super::cast(lse, DType::F32));
    let geo = plan(&q, block);
    let [b, h, t, d] = out_shape.dims::<4>();
    let s = k.meta.shape()[2];
    let dq = empty(&q, out_shape.clone(), dtype);
    let dk = empty(&q, k.meta.shape().clone(), dtype);
    let dv = empty(&q, v.meta.shape().clone(), dtype);
    if b * h * t == 0 || s == 0 {
        let zeros = |t: CubeTensor| {
            burn_cubecl::ops::numeric::zeros_client(
                t.client.clone(),
                t.device.clone(),
                t.meta.shape().clone(),
                t.dtype,
            )
        };
        return (zeros(dq), zeros(dk), zeros(dv));
    }
    let client = q.client.clone();
    let storage = dtype_to_storage_type(dtype);
    let vector = vector_size(&[&q, &k, &v, &dout]);
    let delta = empty(&q, lse_shape, DType::F32);
    flash_delta_kernel::launch(
        &client,
        super::rows::row_grid((b * h * t).div_ceil(THREADS)),
        CubeDim::new_1d(THREADS as u32),
        out.into_tensor_arg(),
        dout.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        d,
        storage,
    );
    flash_backward_kv_kernel::launch(
        &client,
        CubeCount::Static(s.div_ceil(geo.block) as u32, (b * h) as u32, 1),
        CubeDim::new_1d(THREADS as u32),
        vector,
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        dout.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        dk.clone().into_tensor_arg(),
        dv.clone().into_tensor_arg(),
        scale,
        past,
        geo,
        storage,
    );
    flash_backward_q_kernel::launch(
        &client,
        CubeCount::Static(t.div_ceil(geo.block) as u32, (b * h) as u32, 1),
        CubeDim::new_1d(THREADS as u32),
        vector,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        dout.into_tensor_arg(),
        lse.into_tensor_arg(),
        delta.into_tensor_arg(),
        dq.clone().into_tensor_arg(),
        scale,
        past,
        geo,
        storage,
    );
    (dq, super::cast(dk, k_dtype), super::cast(dv, v_dtype))
}

impl FlashAttentionKernels for CubeBackend {
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        forward(q, k, v, scale, past, block)
    }

    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        backward(q, k, v, out, lse, dout, scale, past, block)
    }
}

impl<B: Backend + FlashAttentionKernels, C: CheckpointStrategy> FlashAttentionKernels
    for Autodiff<B, C>
{
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        #[derive(Debug)]
        struct FlashBackward;

        impl<B: Backend + FlashAttentionKernels> Backward<B, 3> for FlashBackward {
            // The inputs, the output and the rows' lse: the backward recomputes P.
            type State = ([FloatTensor<B>; 5], f32, usize, usize);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let ([q, k, v, out, lse], scale, past, block) = ops.state;
                let (dq, dk, dv) =
                    B::flash_attention_backward(q, k, v, out, lse, grad, scale, past, block);
                for (parent, g) in ops.parents.into_iter().zip([dq, dk, dv]) {
                    if let Some(node) = parent {
                        grads.register::<B>(node.id, g);
                    }
                }
            }
        }

        let nodes = [q.node(), k.node(), v.node()];
        let [q, k, v] = [q.into_primitive(), k.into_primitive(), v.into_primitive()];
        let (out, lse) = B::flash_attention(q.clone(), k.clone(), v.clone(), scale, past, block);
        let out = match FlashBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(
                ([q, k, v, out.clone(), lse.clone()], scale, past, block),
                out,
            ),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        (
            out,
            <Self as burn::backend::AutodiffBackend>::from_inner(lse),
        )
    }

    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Not itself differentiable: constants.
        let (a, b, c) = B::flash_attention_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            out.into_primitive(),
            lse.into_primitive(),
            dout.into_primitive(),
            scale,
            past,
            block,
        );
        let inner = <Self as burn::backend::AutodiffBackend>::from_inner;
        (inner(a), inner(b), inner(c))
    }
}
