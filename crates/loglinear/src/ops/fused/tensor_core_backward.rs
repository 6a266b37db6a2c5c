//! The fused backward on tensor cores (bf16 inputs; launched from `launch.rs`): the two
//! kernels of `backward.rs` — same formulas, same states, same chunk walks — with every product
//! as 16×16 tensor-core tiles through [`tile_matmul`], and the elementwise steps (weights, decays,
//! state merges, the dλ row sums) as f32 scalar code between them.
//!
//! Operands computed in f32 that `dg` depends on — the `dv` weights, the λ-weighted `dO` of the
//! anticausal states, the key-decayed values of the causal states and the level states read for
//! `dλ` and `dv` — enter the tiles split in two, `x = hi + lo` with both parts in the input
//! dtype: two products instead of one and ≈ 16 mantissa bits instead of 8. With one rounding,
//! `dg` — a reverse cumulative sum of the differences `λ·dλ − v·dv` — lost 2 % of its largest
//! entry at T = 4096 and did not cancel at T = 1 (measured on the H200); with only the anticausal
//! updates' operand rounded once, `dg` went from 4.3e-5 to 1.5e-2 of its largest entry at
//! T = 32,768 (v41z, bench/RESULTS.md session 44). `dq` and `dk` do not
//! enter `dg`, so with one value tile their weights and `dk`'s level reads take one rounding, as
//! the forward's do; when the value width is tiled (`Geometry::tiled`) they are sums of per-tile
//! partials whose cancellation amplifies that rounding (1.3e-2 of the largest `dq` entry at
//! T = 1 in four tiles, 2.5e-3 split; bench/RESULTS.md session 22), and they are split too. The
//! diagonal of the `dv` weights is added in f32 outside the tiles, so that at T = 1 the two terms
//! of `dΓ` agree exactly.
//!
//! Each cube has [`TC_BACKWARD_THREADS`](super::cube::TC_BACKWARD_THREADS) units: its shared
//! memory allows one cube per multiprocessor, and 16 warps hide more latency than 8 (1.17× on
//! forward+backward at T = 8192). Products whose results are used together go to two staging
//! buffers between one pair of barriers.
//!
//! Accumulators live in registers under a flat mapping (unit `u` owns elements `u + r·threads`
//! of a row-major `rows × cols` result), so reading a product out of the staging buffer is one
//! conflict-free pass.

use cubecl::prelude::*;

use super::cube::{
    Geometry, REWRITES_CLEAR_BITS, REWRITES_SET_BITS, advance_scales, bitlen, load_decays,
    own_levels, row, segment_chunks, trailing_ones, walk_row,
};
use super::tensor_core::{
    ALIGN, EXACT, FULL, LEVEL_WEIGHT_SLOTS, LOWER, SPLIT_A, SPLIT_B, StateVec, UPPER, add_level,
    carry_len, discard_levels, exp_approx, load_rows, merge_level, read_level_carry, row_len_f32,
    row_len_input, store_level, store_split, tile_matmul, write_carry,
};

/// f32 elements of the backward kernels' staging buffer: the largest product (`C × C`,
/// `C × nk`, `C × pt`, `nk × pt`), rows padded (see `row_len_input`).
pub const fn stage_len_backward(chunk: usize, nk: usize, pt: usize) -> usize {
    let mut len = chunk * row_len_f32(chunk);
    if chunk * row_len_f32(nk) > len {
        len = chunk * row_len_f32(nk);
    }
    if chunk * row_len_f32(pt) > len {
        len = chunk * row_len_f32(pt);
    }
    if nk * row_len_f32(pt) > len {
        len = nk * row_len_f32(pt);
    }
    len
}

/// Whether a `rows × cols` f32 tile staged in shared memory can be read by the row mapping of
/// [`row_block`] with `threads` units: whole units per row, a plane's worth at most, and each
/// unit a whole number of 4-float blocks.
pub const fn row_epilogue_fits(rows: usize, cols: usize, threads: usize) -> bool {
    if !threads.is_multiple_of(rows) || !cols.is_multiple_of(4) {
        return false;
    }
    let upr = threads / rows;
    upr <= 32 && 32usize.is_multiple_of(upr) && (cols / 4).is_multiple_of(upr)
}

/// The row mapping of the causal backward's level epilogues over the `C × nk` product staged in
/// shared memory. Unit `u` of plane `p` owns row `p · rpp + (u % 32) % rpp` (`rpp` rows a plane,
/// `upr = 32 / rpp` units a row) and, as part `(u % 32) / rpp` of it, the 4-float blocks
/// `row_block(part, m)` for `m < cols / 4 / upr`: one row weight a unit instead of one per
/// element, 16-byte shared loads, and the row's dλ summed over its units by `log2 upr`
/// shuffles (v30 gave each unit one column, then summed dλ by one plane per row, reading `q`
/// and the product again, in five shuffle steps; bench/RESULTS.md session 38 has the
/// comparison). With the padded rows (`row_len_f32`:
/// 4 floats past a multiple of 32 banks) the eight units one 16-byte load serves hit eight
/// different 4-bank groups: eight rows when `rpp = 8`; when `rpp = 4` (`upr = 8`, the anchors'
/// 512 units over 64 rows) four rows × two parts, whose blocks differ by four (the order below;
/// checked by enumeration for `C` = 64, `nk` = 64 and 128).
#[cube]
pub fn row_block(part: usize, m: usize, #[comptime] upr: usize, #[comptime] rpp: usize) -> usize {
    let mut b = part + upr * m;
    if comptime!(rpp == 4 && upr == 8) {
        b = 4 * (part % 2) + part / 2 + 8 * m;
    }
    b
}

/// The 4-float block of `stage` at `at` (a multiple of 4) in one 16-byte read, through the
/// vector view the stores use (`tensor_core::store_split`). v31x's reads through an immutable
/// view (`as_slice().as_vectorized()`), a bf16 vector view of `q` and a shuffle mask in a
/// compile-time mutable failed CubeCL's IR verifier on CUDA (session 38); which of the three did
/// is not known.
#[cube]
#[allow(unused_assignments)] // the zeroed local below (the form that compiled on CUDA)
fn read_block(stage: &mut Shared<[f32]>, at: usize) -> Vector<f32, StateVec> {
    let view = stage
        .as_mut_slice()
        .as_vectorized_mut()
        .with_vector_size_mut::<StateVec>();
    // Through a local, as the build that passed on CUDA wrote it.
    let mut x = Vector::<f32, StateVec>::zeroed();
    x = view[at / 4];
    x
}

/// `stage[at .. at + 4] = x` (`at` a multiple of 4) in one 16-byte store.
#[cube]
fn write_block(stage: &mut Shared<[f32]>, at: usize, x: Vector<f32, StateVec>) {
    let view = stage
        .as_mut_slice()
        .as_vectorized_mut()
        .with_vector_size_mut::<StateVec>();
    view[at / 4] = x;
}

/// Four input-dtype values of `buf` at `at` (a multiple of 4) as f32: one 8-byte read and paired
/// conversions, through the vector view the stores use ([`read_block`]).
#[cube]
#[allow(unused_assignments)] // the zeroed local below (the form `read_block` compiles in)
fn read_input_block<E: Float>(buf: &mut Shared<[E]>, at: usize) -> Vector<f32, StateVec> {
    let view = buf
        .as_mut_slice()
        .as_vectorized_mut()
        .with_vector_size_mut::<StateVec>();
    let mut x = Vector::<E, StateVec>::zeroed();
    x = view[at / 4];
    Vector::<f32, StateVec>::cast_from(x)
}

/// f32 elements of the anticausal kernel's second staging buffer: `C × C` (the `V dOᵀ` scores)
/// or `C × nk` (the dk products), rows padded.
pub const fn stage_len_second(chunk: usize, nk: usize) -> usize {
    if nk > chunk {
        chunk * row_len_f32(nk)
    } else {
        chunk * row_len_f32(chunk)
    }
}

/// Shared memory (bytes) of one cube of the causal (`causal`) or anticausal tensor-core backward
/// kernel with `elem` bytes per input element, rows padded (see `row_len_input`).
pub fn tc_backward_shared_bytes(
    chunk: usize,
    nk: usize,
    pt: usize,
    levels: usize,
    elem: usize,
    causal: bool,
    tiled: bool,
) -> usize {
    let (ldk, ldv, ldw) = (row_len_input(nk), row_len_input(pt), row_len_input(chunk));
    // The dq or dk weights are split in two only when the value width is tiled.
    let weight_parts = if tiled { 2 } else { 1 };
    let inputs = if causal {
        // q, k, v, dO; kd ⊙ v and one level state, each split in two; the dq weights
        elem * (2 * chunk * ldk
            + 2 * chunk * ldv
            + 2 * (chunk * ldv + nk * ldv)
            + weight_parts * chunk * ldw)
    } else {
        // q, k, v, dO; the dv weights (reused for λ-weighted dO) and one state, each split in
        // two; the dk weights
        let square = chunk * ldw.max(ldv);
        elem * (2 * chunk * ldk + 2 * chunk * ldv + 2 * (square + nk * ldv) + weight_parts * square)
    };
    let mut floats = stage_len_backward(chunk, nk, pt) + chunk * levels + 5 * chunk + 32;
    if causal {
        // The in-chunk dλ product, the level reads' row weights, the chunk's dλ rows.
        floats += chunk * row_len_f32(chunk) + LEVEL_WEIGHT_SLOTS * chunk + chunk * levels;
    } else {
        // The second stage, the causal kernel's dΓ of the chunk's rows.
        floats += stage_len_second(chunk, nk) + chunk;
    }
    inputs + 4 * floats + 14 * ALIGN
}

/// Causal half of the backward on tensor cores: `dq`, `dλ` and `dΓ`'s first term per value tile,
/// as [`causal_backward_kernel`](super::backward::causal_backward_kernel) but with the level
/// states key-major (`[nk][pt]`, as the forward's).
#[allow(clippy::too_many_arguments)]
#[cube(launch, create_dummy_kernel)]
pub fn causal_backward_tc_kernel<E: Float, G: Float, O: Float, N: Size>(
    q: &Tensor<Vector<E, N>>,
    k: &Tensor<Vector<E, N>>,
    v: &Tensor<Vector<E, N>>,
    d_o: &Tensor<Vector<E, N>>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    dq: &mut Tensor<O>,
    dl: &mut Tensor<f32>,
    dgamma: &mut Tensor<f32>,
    states: &mut Tensor<Vector<f32, StateVec>>,
    batch: usize,
    seq: usize,
    heads: usize,
    width: usize,
    segments: usize,
    seg_chunks: usize,
    #[comptime] geo: Geometry,
    #[define(E, G, O)] _dtypes: [ElemType; 3],
) {
    let (chunk, nk, pt) = comptime!((geo.chunk, geo.nk, geo.pt));
    // The elementwise product operands are built four columns a trip (`store_split`).
    comptime!(assert!(
        pt.is_multiple_of(4) && chunk.is_multiple_of(4),
        "tensor-core backward: value tile and chunk must be multiples of 4"
    ));
    let (levels, nlev) = comptime!((geo.levels, geo.nlev));
    let (threads, planes) = comptime!((geo.threads, geo.threads / 32));
    // The dq weights: split in two only when the value width is tiled (`Geometry::tiled`).
    let w_split_a = comptime!(if geo.tiled { SPLIT_A } else { EXACT });
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let (bi, seg, h, t_start) = walk_row(bh, heads, segments, seg_chunks, chunk);
    let u = UNIT_POS_X as usize;
    let plane = u / 32;
    let p0 = tile * pt;
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    let rows_q = comptime!(chunk * nk / threads);
    // The level epilogues give each unit `nvq` blocks of four in one row (`row_block`) where the
    // shape divides evenly (the anchors' do), else one column each (`rows_q` elements).
    let row_mode = comptime!(row_epilogue_fits(chunk, nk, threads));
    let upr = comptime!(if row_mode { threads / chunk } else { 1 });
    let rpp = comptime!(if row_mode { 32 / upr } else { 1 });
    let nvq = comptime!(if row_mode { nk / 4 / upr } else { 1 });
    let my_row = (u / 32) * rpp + (u % 32) % rpp;
    let part = (u % 32) / rpp;
    let level_size = comptime!(nk * pt);
    // The level states are read and written four floats at a time: offsets count vectors.
    let state_base = (tile * batch * segments * heads + bh) * comptime!(nlev.max(1) * nk * pt / 4);
    let stage_size = comptime!(stage_len_backward(chunk, nk, pt));
    // Shared rows padded against bank conflicts (see `row_len_input`).
    let ldk = comptime!(row_len_input(nk));
    let ldv = comptime!(row_len_input(pt));
    let ldw = comptime!(row_len_input(chunk));
    let lss = comptime!(row_len_f32(chunk));
    let lsk = comptime!(row_len_f32(nk));
    let lsv = comptime!(row_len_f32(pt));

    let mut qb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldk), ALIGN);
    let mut kb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldk), ALIGN);
    let mut vb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    let mut ob = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    // Operands computed in f32 are split in two (`x = hi + lo`, both in the input dtype), so
    // the gradients keep ≈ 16 mantissa bits where one rounding would keep 8.
    let mut vt = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    let mut vt_lo = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    let mut sc = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldw), ALIGN);
    // The dq weights' low half, used only when the value width is tiled (`Geometry::tiled`).
    let mut sc_lo =
        Shared::<[E]>::new_aligned_slice(comptime!(if geo.tiled { chunk * ldw } else { 1 }), ALIGN);
    let mut hb = Shared::<[E]>::new_aligned_slice(comptime!(nk * ldv), ALIGN);
    let mut hb_lo = Shared::<[E]>::new_aligned_slice(comptime!(nk * ldv), ALIGN);
    let mut stage = Shared::<[f32]>::new_aligned_slice(stage_size, ALIGN);
    // The in-chunk dλ terms, staged first as the product dO Vᵀ.
    let sd_size = comptime!(chunk * row_len_f32(chunk));
    let mut sd = Shared::<[f32]>::new_aligned_slice(sd_size, ALIGN);
    let mut lam = Shared::<[f32]>::new_slice(comptime!(chunk * levels));
    let mut graw = Shared::<[f32]>::new_slice(chunk);
    let mut gam = Shared::<[f32]>::new_slice(chunk);
    let mut kd = Shared::<[f32]>::new_slice(chunk);
    let mut eg = Shared::<[f32]>::new_slice(chunk);
    let mut scale = Shared::<[f32]>::new_slice(comptime!(nlev.max(1)));
    // dO_t·o_t = Σ_ℓ λ[t,ℓ] dλ[t,ℓ] per row, summed by the unit that writes the row's dλ of
    // the in-chunk levels (lane i % 32 of the row's plane, which also sees the level reads).
    let mut read = Shared::<[f32]>::new_slice(chunk);
    // A level read's row weights f · e^{γ_i} · λ[i, level] (see `LEVEL_WEIGHT_SLOTS`).
    let mut level_weights = Shared::<[f32]>::new_slice(comptime!(LEVEL_WEIGHT_SLOTS * chunk));
    // The chunk's dλ rows (`C × levels`), written to `dl` at the chunk's end in one coalesced
    // pass: staged here rather than stored a level at a time by single lanes as they are found
    // (session 41: −1.5 % forward+backward at T = 2048 on its own).
    let mut dls = Shared::<[f32]>::new_slice(comptime!(chunk * levels));

    if u < nlev {
        scale[u] = 1.0f32;
    }
    let n_chunks = segment_chunks(seq, t_start, seg_chunks, chunk);

    for j in 0..n_chunks {
        let t0 = t_start + j * chunk;
        // The chunk's index in the whole sequence: its bits say which levels it reads.
        let jg = seg * seg_chunks + j;
        load_rows::<E, N>(
            q, &mut qb, u, t0, 0, bi, h, seq, heads, nk, chunk, nk, ldk, threads, true,
        );
        load_rows::<E, N>(
            k, &mut kb, u, t0, 0, bi, h, seq, heads, nk, chunk, nk, ldk, threads, true,
        );
        load_rows::<E, N>(
            v, &mut vb, u, t0, p0, bi, h, seq, heads, width, chunk, pt, ldv, threads, true,
        );
        load_rows::<E, N>(
            d_o, &mut ob, u, t0, p0, bi, h, seq, heads, width, chunk, pt, ldv, threads, true,
        );
        load_decays::<G>(
            g, lambda, &mut lam, &mut graw, &mut gam, &mut kd, &mut eg, u, t0, bi, h, seq, heads,
            chunk, levels, threads, true,
        );
        // Key-decayed values kd ⊙ V, split. The elementwise operands of the products are built
        // four columns a trip: one 8-byte or 16-byte read, paired conversions and vector stores,
        // where element by element each value took its own conversions and 16-bit stores (v43:
        // −2.0 % of the backward, bench/RESULTS.md session 44; the same values).
        let mut idx = u;
        while idx < comptime!(chunk * pt / 4) {
            let i = (idx * 4) / pt;
            let at = i * ldv + (idx * 4) % pt;
            let x = read_input_block::<E>(&mut vb, at) * Vector::<f32, StateVec>::new(kd[i]);
            store_split::<E>(&mut vt, &mut vt_lo, x, at, true, true);
            idx += threads;
        }
        // A = Q Kᵀ into `stage`, B = dO Vᵀ into `sd` (lower tiles); then, in place,
        // sd = e^{γt−γs} A B (the dλ terms) and sc = λ e^{γt−γs} B (the dq weights).
        tile_matmul::<E>(
            &qb, &qb, &kb, &kb, &mut stage, plane, planes, chunk, nk, chunk, false, ldk, true, ldk,
            FULL, LOWER, EXACT, lss,
        );
        tile_matmul::<E>(
            &ob, &ob, &vb, &vb, &mut sd, plane, planes, chunk, pt, chunk, false, ldv, true, ldv,
            FULL, LOWER, EXACT, lss,
        );
        sync_cube();
        idx = u;
        while idx < comptime!(chunk * chunk / 4) {
            let i = (idx * 4) / chunk;
            let j0 = (idx * 4) % chunk;
            let a = read_block(&mut stage, i * lss + j0);
            let b = read_block(&mut sd, i * lss + j0);
            let mut xv = Vector::<f32, StateVec>::zeroed();
            let mut wv = Vector::<f32, StateVec>::zeroed();
            #[unroll]
            for e in 0..4 {
                let jj = j0 + e;
                let mut w = 0.0f32;
                let mut x = 0.0f32;
                if jj <= i {
                    let decay = exp_approx(gam[i] - gam[jj]);
                    let bv = b.extract(e);
                    x = a.extract(e) * decay * bv;
                    let lvl = bitlen(i ^ jj);
                    if lvl < levels {
                        w = lam[i * levels + lvl] * decay * bv;
                    }
                }
                xv.insert(e, x);
                wv.insert(e, w);
            }
            write_block(&mut sd, i * lss + j0, xv);
            store_split::<E>(&mut sc, &mut sc_lo, wv, i * ldw + j0, geo.tiled, true);
            idx += threads;
        }
        sync_cube();
        // dλ of the in-chunk levels, one plane per row. Row i pairs with column jj at level
        // bitlen(i ^ jj): level 0 is the diagonal and level ℓ ≥ 1 the aligned block of 2^(ℓ−1)
        // columns beside i's own (columns past i hold zeros). A butterfly over the plane's lanes
        // sums aligned blocks of 1, 2, 4, 8, 16 columns; the sibling block's sum that lane i % 32
        // receives at step ℓ − 1 is level ℓ. With C = 64 the rows of the second half add level 6,
        // the first half's sum. Levels above the chunk's are zero unless a level read below
        // sets them.
        comptime!(assert!(
            chunk == 32 || chunk == 64,
            "tensor-core chunks are 32 or 64"
        ));
        let lane = u % 32;
        #[unroll]
        for rr in 0..comptime!(chunk / planes) {
            let i = plane + rr * planes;
            let half = i / 32;
            let owner = lane == i % 32;
            let mut block = sd[i * lss + half * 32 + lane];
            let lam_row = i * levels;
            let mut dot = lam[lam_row] * block;
            if owner {
                dls[lam_row] = block;
            }
            #[unroll]
            for step in 0..5u32 {
                let sibling = plane_shuffle_xor(block, 1u32 << step);
                let lvl = usize::cast_from(step) + 1;
                if lvl < levels {
                    dot += lam[lam_row + lvl] * sibling;
                    if owner {
                        dls[lam_row + lvl] = sibling;
                    }
                }
                block += sibling;
            }
            if comptime!(chunk == 64) {
                // Uniform over the plane: i is the plane's row.
                let mut first_half = 0.0f32;
                if half == 1 {
                    first_half = plane_sum(sd[i * lss + lane]);
                }
                if 6 < levels {
                    dot += lam[lam_row + 6] * first_half;
                    if owner {
                        dls[lam_row + 6] = first_half;
                    }
                }
            }
            if owner {
                read[i] = dot;
                for lvl in comptime!(log_c + 1)..levels {
                    dls[lam_row + lvl] = 0.0f32;
                }
            }
        }
        // dq in-chunk: sc K.
        tile_matmul::<E>(
            &sc, &sc_lo, &kb, &kb, &mut stage, plane, planes, chunk, chunk, nk, false, ldw, false,
            ldk, LOWER, FULL, w_split_a, lsk,
        );
        sync_cube();
        let mut acc = Array::<f32>::new(rows_q);
        let mut acc_v = Array::<Vector<f32, StateVec>>::new(nvq);
        if comptime!(row_mode) {
            #[unroll]
            for m in 0..nvq {
                acc_v[m] = read_block(&mut stage, my_row * lsk + 4 * row_block(part, m, upr, rpp));
            }
        } else {
            #[unroll]
            for r in 0..rows_q {
                let e = u + r * threads;
                acc[r] = stage[(e / nk) * lsk + e % nk];
            }
        }
        // No barrier here nor after each level below (as in the forward): the next write of
        // `stage` is a product behind a later barrier — a level's, or the one before the key
        // state's product — and a level read writes only `hb`, which the last product that read
        // it finished before the barrier that followed it.
        // Earlier chunks (bit i−1 of j set): X = dO Hᵀ (`C × nk`), dq += λ e f X and
        // dλ = e f q·X (row sums by one owner unit per row).
        // The levels of the trailing ones of j are read here and then retired: their sum, decayed
        // by this chunk, plus this chunk's state becomes level `ones` (see `write_carry`).
        let mut carry = Array::<Vector<f32, StateVec>>::new(comptime!(carry_len(nk, pt, threads)));
        #[unroll]
        for r in 0..comptime!(carry_len(nk, pt, threads)) {
            carry[r] = Vector::<f32, StateVec>::zeroed();
        }
        // On the whole-sequence index: a level this chunk does not read (see `cube.rs`).
        let ones = trailing_ones(jg);
        let mut slot = 0usize;
        for lvi in 0..nlev {
            let token_level = log_c + lvi + 1;
            if (jg >> lvi) & 1 == 1 && token_level < levels {
                // This level's row weights, published by the barrier after the level read.
                if u < chunk {
                    level_weights[slot * chunk + u] =
                        scale[lvi] * eg[u] * lam[u * levels + token_level];
                }
                let base = state_base + lvi * comptime!(level_size / 4);
                read_level_carry::<E>(
                    states,
                    &mut hb,
                    &mut hb_lo,
                    &mut carry,
                    scale[lvi],
                    lvi < ones,
                    base,
                    u,
                    nk,
                    pt,
                    ldv,
                    true,
                    threads,
                    true,
                );
                sync_cube();
                // Hᵀ: the key-major state read column-major.
                tile_matmul::<E>(
                    &ob, &ob, &hb, &hb_lo, &mut stage, plane, planes, chunk, pt, nk, false, ldv,
                    true, ldv, FULL, FULL, SPLIT_B, lsk,
                );
                sync_cube();
                let f = scale[lvi];
                if comptime!(row_mode) {
                    // dq += w X and dλ = e f q·X for the unit's row: its blocks of X once, a
                    // sum over the row's `upr` units (lanes `rpp` apart) for dλ.
                    let w = Vector::<f32, StateVec>::new(level_weights[slot * chunk + my_row]);
                    let mut dot = 0.0f32;
                    #[unroll]
                    for m in 0..nvq {
                        let c0 = 4 * row_block(part, m, upr, rpp);
                        let x = read_block(&mut stage, my_row * lsk + c0);
                        let sum = acc_v[m] + x * w;
                        acc_v[m] = sum;
                        #[unroll]
                        for e in 0..4 {
                            dot += f32::cast_from(qb[my_row * ldk + c0 + e]) * x.extract(e);
                        }
                    }
                    // Lanes `rpp`, `2 rpp`, … apart hold the row's other parts.
                    let shift = comptime!(rpp.trailing_zeros());
                    #[unroll]
                    for step in 0..comptime!(upr.trailing_zeros()) {
                        dot += plane_shuffle_xor(dot, 1u32 << (step + shift));
                    }
                    let sum = dot * f * eg[my_row];
                    if part == 0 {
                        read[my_row] += lam[my_row * levels + token_level] * sum;
                        dls[my_row * levels + token_level] = sum;
                    }
                } else {
                    #[unroll]
                    for r in 0..rows_q {
                        let e = u + r * threads;
                        let i = e / nk;
                        acc[r] += stage[i * lsk + e % nk] * level_weights[slot * chunk + i];
                    }
                    // dλ = e f q·X: one plane per row, lanes over keys, a plane sum.
                    #[unroll]
                    for rr in 0..comptime!(chunk / planes) {
                        let i = plane + rr * planes;
                        let mut part = 0.0f32;
                        #[unroll]
                        for m in 0..comptime!(nk.div_ceil(32)) {
                            let n = lane + m * 32;
                            if n < nk {
                                part += f32::cast_from(qb[i * ldk + n]) * stage[i * lsk + n];
                            }
                        }
                        let sum = plane_sum(part) * f * eg[i];
                        if lane == i % 32 {
                            read[i] += lam[i * levels + token_level] * sum;
                            dls[i * levels + token_level] = sum;
                        }
                    }
                }
                slot = (slot + 1) % LEVEL_WEIGHT_SLOTS;
            }
        }
        if comptime!(row_mode) {
            let t = t0 + my_row;
            if t < seq {
                let dq_row = (((tile * batch + bi) * seq + t) * heads + h) * nk;
                // Four dq values a store: a row starts at a multiple of nk, a block at a
                // multiple of four (session 41: −0.8 ms of 38.9 at T = 2048 on its own).
                let dq_v = dq
                    .as_mut_slice()
                    .as_vectorized_mut()
                    .with_vector_size_mut::<StateVec>();
                #[unroll]
                for m in 0..nvq {
                    let c0 = 4 * row_block(part, m, upr, rpp);
                    dq_v[(dq_row + c0) / 4] = Vector::<O, StateVec>::cast_from(acc_v[m]);
                }
                // The in-chunk owner's write of `read` is behind the barrier after the in-chunk
                // dq product; the levels' additions are this unit's.
                if part == 0 {
                    dgamma[((tile * batch + bi) * seq + t) * heads + h] = read[my_row];
                }
            }
        } else {
            #[unroll]
            for r in 0..rows_q {
                let e = u + r * threads;
                let t = t0 + e / nk;
                if t < seq {
                    dq[(((tile * batch + bi) * seq + t) * heads + h) * nk + e % nk] =
                        O::cast_from(acc[r]);
                }
            }
            // The row's owner wrote `read` (no barrier needed: the same unit).
            #[unroll]
            for rr in 0..comptime!(chunk / planes) {
                let i = plane + rr * planes;
                let t = t0 + i;
                if lane == i % 32 && t < seq {
                    dgamma[((tile * batch + bi) * seq + t) * heads + h] = read[i];
                }
            }
        }
        // This chunk's key state Kᵀ (kd ⊙ V) and the levels it retired become level `ones`
        // (the forward's state, key-major; see `tensor_core::carry_len`).
        if nlev > 0 {
            // Every unit's reads of `stage` above end here.
            sync_cube();
            // And its reads of the levels this chunk retires (see `discard_levels`).
            discard_levels(states, state_base, 0, ones, u, nk, pt, threads);
            tile_matmul::<E>(
                &kb, &kb, &vt, &vt_lo, &mut stage, plane, planes, nk, chunk, pt, true, ldk, false,
                ldv, FULL, FULL, SPLIT_B, lsv,
            );
            sync_cube();
            if ones < nlev && log_c + ones + 1 < levels {
                write_carry(
                    states,
                    &stage,
                    &carry,
                    eg[comptime!(chunk - 1)],
                    state_base + ones * comptime!(level_size / 4),
                    u,
                    nk,
                    pt,
                    lsv,
                    threads,
                );
            }
        }
        // A cube barrier is enough on CUDA (see the forward's `causal_tc_kernel`).
        sync_cube();
        // The chunk's rows of dl, each `levels` contiguous floats: consecutive units write
        // consecutive floats (every write of `dls` is behind the barrier above, and the next
        // chunk's first write behind the one below).
        let mut e = u;
        while e < comptime!(chunk * levels) {
            let t = t0 + e / levels;
            if t < seq {
                dl[(((tile * batch + bi) * seq + t) * heads + h) * levels + e % levels] = dls[e];
            }
            e += threads;
        }
        advance_scales(
            &mut scale,
            &eg,
            u,
            jg,
            chunk,
            levels,
            nlev,
            REWRITES_CLEAR_BITS,
        );
        sync_cube();
    }
    // The walk is over: every level is dead (the loop's last barrier follows every access).
    discard_levels(states, state_base, 0, nlev, u, nk, pt, threads);
}

/// Anticausal half of the backward on tensor cores: `dv` (this value tile), `dk` (per value
/// tile) and `dΓ`'s second term, as
/// [`anticausal_backward_kernel`](super::backward::anticausal_backward_kernel).
#[allow(clippy::too_many_arguments)]
#[cube(launch, create_dummy_kernel)]
pub fn anticausal_backward_tc_kernel<E: Float, G: Float, O: Float, N: Size>(
    q: &Tensor<Vector<E, N>>,
    k: &Tensor<Vector<E, N>>,
    v: &Tensor<Vector<E, N>>,
    d_o: &Tensor<Vector<E, N>>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    dk: &mut Tensor<O>,
    dv: &mut Tensor<E>,
    dgamma: &mut Tensor<f32>,
    states: &mut Tensor<Vector<f32, StateVec>>,
    batch: usize,
    seq: usize,
    heads: usize,
    width: usize,
    segments: usize,
    seg_chunks: usize,
    #[comptime] geo: Geometry,
    #[define(E, G, O)] _dtypes: [ElemType; 3],
) {
    let (chunk, nk, pt) = comptime!((geo.chunk, geo.nk, geo.pt));
    // The elementwise product operands are built four columns a trip (`store_split`).
    comptime!(assert!(
        pt.is_multiple_of(4) && chunk.is_multiple_of(4),
        "tensor-core backward: value tile and chunk must be multiples of 4"
    ));
    let (levels, nlev) = comptime!((geo.levels, geo.nlev));
    let (threads, planes) = comptime!((geo.threads, geo.threads / 32));
    // The dk weights and dk's level reads: split in two only when the value width is tiled
    // (`Geometry::tiled`).
    let w_split_a = comptime!(if geo.tiled { SPLIT_A } else { EXACT });
    let w_split_b = comptime!(if geo.tiled { SPLIT_B } else { EXACT });
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let (bi, seg, h, t_start) = walk_row(bh, heads, segments, seg_chunks, chunk);
    let u = UNIT_POS_X as usize;
    let plane = u / 32;
    let p0 = tile * pt;
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    let rows_k = comptime!(chunk * nk / threads);
    let rows_v = comptime!(chunk * pt / threads);
    let level_size = comptime!(nk * pt);
    // The level states are read and written four floats at a time: offsets count vectors.
    let state_base = (tile * batch * segments * heads + bh) * comptime!(nlev.max(1) * nk * pt / 4);
    let stage_size = comptime!(stage_len_backward(chunk, nk, pt));
    // Shared rows padded against bank conflicts (see `row_len_input`).
    let ldk = comptime!(row_len_input(nk));
    let ldv = comptime!(row_len_input(pt));
    let ldw = comptime!(row_len_input(chunk));
    let lss = comptime!(row_len_f32(chunk));
    let lsk = comptime!(row_len_f32(nk));
    let lsv = comptime!(row_len_f32(pt));
    // `sa` holds the dv weights (`C × C`, rows `ldw`) and later λ-weighted dO (`C × pt`, rows
    // `ldv`); `sb` the dk weights.
    let square = comptime!(chunk * if ldw > ldv { ldw } else { ldv });

    let mut qb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldk), ALIGN);
    let mut kb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldk), ALIGN);
    let mut vb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    let mut ob = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    // `sa`: the dv weights, then (per level update) λ-weighted dO; `sb`: the dk weights.
    // Operands computed in f32 are split in two (`x = hi + lo`), as in the causal kernel.
    let mut sa = Shared::<[E]>::new_aligned_slice(square, ALIGN);
    let mut sa_lo = Shared::<[E]>::new_aligned_slice(square, ALIGN);
    let mut sb = Shared::<[E]>::new_aligned_slice(square, ALIGN);
    // The dk weights' low half, used only when the value width is tiled (`Geometry::tiled`).
    let mut sb_lo =
        Shared::<[E]>::new_aligned_slice(comptime!(if geo.tiled { square } else { 1 }), ALIGN);
    let mut gb = Shared::<[E]>::new_aligned_slice(comptime!(nk * ldv), ALIGN);
    let mut gb_lo = Shared::<[E]>::new_aligned_slice(comptime!(nk * ldv), ALIGN);
    let mut stage = Shared::<[f32]>::new_aligned_slice(stage_size, ALIGN);
    // A second staging buffer, so that the products of a step whose results are consumed
    // together (the score pair K Qᵀ and V dOᵀ, the dv and dk products, the two products of the
    // summed levels) share one pair of barriers.
    let stage2_len = comptime!(stage_len_second(chunk, nk));
    let mut stage2 = Shared::<[f32]>::new_aligned_slice(stage2_len, ALIGN);
    let mut lam = Shared::<[f32]>::new_slice(comptime!(chunk * levels));
    let mut graw = Shared::<[f32]>::new_slice(chunk);
    let mut gam = Shared::<[f32]>::new_slice(chunk);
    let mut kd = Shared::<[f32]>::new_slice(chunk);
    let mut eg = Shared::<[f32]>::new_slice(chunk);
    let mut dga = Shared::<[f32]>::new_slice(chunk);
    // The causal kernel's dΓ of the chunk's rows, loaded with the chunk's inputs.
    let mut dg_causal = Shared::<[f32]>::new_slice(chunk);
    let mut scale = Shared::<[f32]>::new_slice(comptime!(nlev.max(1)));

    if u < nlev {
        scale[u] = 1.0f32;
    }
    // A period whose later half lies past the end is read before anything was added to it.
    // Only the levels inside a segment: the ones above it hold the states of the later
    // segments, written before the launch (`segments.rs`), and are only read here.
    let own = own_levels(seg_chunks, nlev);
    let mut idx = u;
    while idx < own * comptime!(level_size / 4) {
        states[state_base + idx] = Vector::<f32, StateVec>::zeroed();
        idx += threads;
    }
    // A cube barrier is enough on CUDA (see the forward's `causal_tc_kernel`).
    sync_cube();
    let n_chunks = segment_chunks(seq, t_start, seg_chunks, chunk);

    for step in 0..n_chunks {
        let j = n_chunks - 1 - step;
        let t0 = t_start + j * chunk;
        // The chunk's index in the whole sequence: its bits say which levels it reads.
        let jg = seg * seg_chunks + j;
        // The causal dΓ of the chunk's rows, issued before the inputs' loads and stored after
        // them, so that its latency overlaps theirs: read-modify-written at the chunk's end, it
        // held 5.8 % of the kernel's stall samples (long-scoreboard waits; session 41: −1.2 ms
        // of 38.9 at T = 2048 on its own).
        let mut dg_row = 0.0f32;
        if u < chunk && t0 + u < seq {
            dg_row = dgamma[((tile * batch + bi) * seq + t0 + u) * heads + h];
        }
        load_rows::<E, N>(
            q, &mut qb, u, t0, 0, bi, h, seq, heads, nk, chunk, nk, ldk, threads, true,
        );
        load_rows::<E, N>(
            k, &mut kb, u, t0, 0, bi, h, seq, heads, nk, chunk, nk, ldk, threads, true,
        );
        load_rows::<E, N>(
            v, &mut vb, u, t0, p0, bi, h, seq, heads, width, chunk, pt, ldv, threads, true,
        );
        load_rows::<E, N>(
            d_o, &mut ob, u, t0, p0, bi, h, seq, heads, width, chunk, pt, ldv, threads, true,
        );
        load_decays::<G>(
            g, lambda, &mut lam, &mut graw, &mut gam, &mut kd, &mut eg, u, t0, bi, h, seq, heads,
            chunk, levels, threads, true,
        );
        if u < chunk {
            dg_causal[u] = dg_row;
        }
        // Row s, column t ≥ s: A = K Qᵀ, B = V dOᵀ (upper tiles), each times
        // W = λ[t, ℓ(t,s)] e^{γt−γs}.
        tile_matmul::<E>(
            &kb, &kb, &qb, &qb, &mut stage, plane, planes, chunk, nk, chunk, false, ldk, true, ldk,
            FULL, UPPER, EXACT, lss,
        );
        tile_matmul::<E>(
            &vb,
            &vb,
            &ob,
            &ob,
            &mut stage2,
            plane,
            planes,
            chunk,
            pt,
            chunk,
            false,
            ldv,
            true,
            ldv,
            FULL,
            UPPER,
            EXACT,
            lss,
        );
        sync_cube();
        idx = u;
        while idx < comptime!(chunk * chunk / 4) {
            let si = (idx * 4) / chunk;
            let t0c = (idx * 4) % chunk;
            let a = read_block(&mut stage, si * lss + t0c);
            let b = read_block(&mut stage2, si * lss + t0c);
            let mut xv = Vector::<f32, StateVec>::zeroed();
            let mut yv = Vector::<f32, StateVec>::zeroed();
            #[unroll]
            for e in 0..4 {
                let tj = t0c + e;
                let mut w = 0.0f32;
                if tj >= si {
                    let lvl = bitlen(si ^ tj);
                    if lvl < levels {
                        w = exp_approx(gam[tj] - gam[si]) * lam[tj * levels + lvl];
                    }
                }
                let mut x = a.extract(e) * w;
                if tj == si {
                    // The diagonal term enters dΓ_s twice, as λ dλ (f32) and as v·dv, where the
                    // two cancel exactly at T = 1: it is added in f32, not through the tiles.
                    dga[si] = x;
                    x = 0.0f32;
                }
                xv.insert(e, x);
                yv.insert(e, b.extract(e) * w);
            }
            store_split::<E>(&mut sa, &mut sa_lo, xv, si * ldw + t0c, true, true);
            store_split::<E>(&mut sb, &mut sb_lo, yv, si * ldw + t0c, geo.tiled, true);
            idx += threads;
        }
        sync_cube();
        // dv = (W ⊙ A) dO, dk = (W ⊙ B) Q (upper-triangular weights).
        tile_matmul::<E>(
            &sa, &sa_lo, &ob, &ob, &mut stage, plane, planes, chunk, chunk, pt, false, ldw, false,
            ldv, UPPER, FULL, SPLIT_A, lsv,
        );
        tile_matmul::<E>(
            &sb,
            &sb_lo,
            &qb,
            &qb,
            &mut stage2,
            plane,
            planes,
            chunk,
            chunk,
            nk,
            false,
            ldw,
            false,
            ldk,
            UPPER,
            FULL,
            w_split_a,
            lsk,
        );
        sync_cube();
        let mut acc_v = Array::<f32>::new(rows_v);
        #[unroll]
        for r in 0..rows_v {
            let e = u + r * threads;
            let (i, c) = (e / pt, e % pt);
            acc_v[r] = stage[i * lsv + c] + dga[i] * f32::cast_from(ob[i * ldv + c]);
        }
        let mut acc_k = Array::<f32>::new(rows_k);
        #[unroll]
        for r in 0..rows_k {
            let e = u + r * threads;
            acc_k[r] = stage2[(e / nk) * lsk + e % nk];
        }
        // No barrier here nor after each level read or update below (as in the forward): a
        // staging buffer is next written by a product behind a later barrier, and a level read
        // (`gb`) or an update's operand (`sa`) only after the barrier that followed the last
        // product that read it.
        // Later chunks (bit i−1 of j clear): dv += kd K G, dk += kd V Gᵀ with
        // G = Σ_levels f G_level. The level states carry their λ already, so the rows' weight
        // kd is the same at every level and the levels are summed first, in f32 registers (one
        // operand, one pair of products and two barriers a chunk, where every level read
        // took its own pair of products and two barriers: about half of all levels each chunk).
        let mut gsum = Array::<Vector<f32, StateVec>>::new(comptime!(carry_len(nk, pt, threads)));
        #[unroll]
        for r in 0..comptime!(carry_len(nk, pt, threads)) {
            gsum[r] = Vector::<f32, StateVec>::zeroed();
        }
        let mut later = false;
        for lvi in 0..nlev {
            let token_level = log_c + lvi + 1;
            if (jg >> lvi) & 1 == 0 && token_level < levels {
                add_level(
                    states,
                    &mut gsum,
                    scale[lvi],
                    state_base + lvi * comptime!(level_size / 4),
                    u,
                    nk,
                    pt,
                    threads,
                );
                later = true;
            }
        }
        // `later` is the same in every unit (it depends on the chunk only).
        if later {
            store_level::<E>(
                &gsum, &mut gb, &mut gb_lo, u, nk, pt, ldv, true, threads, true,
            );
            sync_cube();
            tile_matmul::<E>(
                &kb, &kb, &gb, &gb_lo, &mut stage, plane, planes, chunk, nk, pt, false, ldk, false,
                ldv, FULL, FULL, SPLIT_B, lsv,
            );
            // Gᵀ: the key-major state read column-major.
            tile_matmul::<E>(
                &vb,
                &vb,
                &gb,
                &gb_lo,
                &mut stage2,
                plane,
                planes,
                chunk,
                pt,
                nk,
                false,
                ldv,
                true,
                ldv,
                FULL,
                FULL,
                w_split_b,
                lsk,
            );
            sync_cube();
            #[unroll]
            for r in 0..rows_v {
                let e = u + r * threads;
                let i = e / pt;
                acc_v[r] += stage[i * lsv + e % pt] * kd[i];
            }
            #[unroll]
            for r in 0..rows_k {
                let e = u + r * threads;
                let i = e / nk;
                acc_k[r] += stage2[i * lsk + e % nk] * kd[i];
            }
        }
        // Every unit's reads of `stage` and `stage2` above end here.
        sync_cube();
        // dv, and v ⊙ dv staged for dΓ's second term.
        #[unroll]
        for r in 0..rows_v {
            let e = u + r * threads;
            let (i, c) = (e / pt, e % pt);
            let t = t0 + i;
            let p = p0 + c;
            if t < seq && p < width {
                dv[row(bi, t, h, seq, heads, width) + p] = E::cast_from(acc_v[r]);
            }
            stage[i * lsv + c] = acc_v[r] * f32::cast_from(vb[i * ldv + c]);
        }
        #[unroll]
        for r in 0..rows_k {
            let e = u + r * threads;
            let t = t0 + e / nk;
            if t < seq {
                dk[(((tile * batch + bi) * seq + t) * heads + h) * nk + e % nk] =
                    O::cast_from(acc_k[r]);
            }
        }
        sync_cube();
        // dΓ_t −= v_t·dv_t over this tile's columns (the causal kernel wrote the first term):
        // one plane per row, lanes over columns (zero past the width), a plane sum.
        #[unroll]
        for rr in 0..comptime!(chunk / planes) {
            let i = plane + rr * planes;
            let t = t0 + i;
            let lane = u % 32;
            let mut part = 0.0f32;
            #[unroll]
            for m in 0..comptime!(pt.div_ceil(32)) {
                let c = lane + m * 32;
                if c < pt {
                    part += stage[i * lsv + c];
                }
            }
            let written = plane_sum(part);
            if lane == 0 && t < seq {
                let at = ((tile * batch + bi) * seq + t) * heads + h;
                dgamma[at] = dg_causal[i] - written;
            }
        }
        // Updates (bit i−1 of j set): G += Qᵀ (λ[·, ℓ] e^{γ} ⊙ dO), one product per level.
        let chunk_decay = eg[comptime!(chunk - 1)];
        for lvi in 0..nlev {
            let token_level = log_c + lvi + 1;
            if lvi < own && (jg >> lvi) & 1 == 1 && token_level < levels {
                idx = u;
                while idx < comptime!(chunk * pt / 4) {
                    let i = (idx * 4) / pt;
                    let at = i * ldv + (idx * 4) % pt;
                    let x = read_input_block::<E>(&mut ob, at)
                        * Vector::<f32, StateVec>::new(eg[i])
                        * Vector::<f32, StateVec>::new(lam[i * levels + token_level]);
                    store_split::<E>(&mut sa, &mut sa_lo, x, at, true, true);
                    idx += threads;
                }
                sync_cube();
                // Qᵀ: q read column-major.
                tile_matmul::<E>(
                    &qb, &qb, &sa, &sa_lo, &mut stage, plane, planes, nk, chunk, pt, true, ldk,
                    false, ldv, FULL, FULL, SPLIT_B, lsv,
                );
                sync_cube();
                let base = state_base + lvi * comptime!(level_size / 4);
                let period = 2usize << lvi;
                let fresh = jg % period == period - 1;
                let f = scale[lvi] * chunk_decay;
                merge_level(states, &stage, base, f, fresh, u, nk, pt, lsv, threads);
            }
        }
        // A cube barrier is enough on CUDA (see the forward's `causal_tc_kernel`).
        sync_cube();
        advance_scales(
            &mut scale,
            &eg,
            u,
            jg,
            chunk,
            levels,
            nlev,
            REWRITES_SET_BITS,
        );
        sync_cube();
    }
    // The walk is over: every level is dead (the loop's last barrier follows every access).
    discard_levels(states, state_base, 0, nlev, u, nk, pt, threads);
}
