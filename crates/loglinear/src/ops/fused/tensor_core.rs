//! The forward kernel on tensor cores (bf16 inputs; launched from `launch.rs`).
//!
//! Same walk as [`causal_kernel`](super::cube::causal_kernel) — one cube per (batch·head, value
//! tile), chunk by chunk, one level state per chunk level in a global f32 scratch with lazy decay
//! factors — but the four products of a chunk run on the tensor cores in 16×16 output tiles (f32
//! accumulation; [`tile_matmul`]) spread over the cube's eight planes:
//!
//! 1. scores `S = Q Kᵀ` (`C × C`, lower-triangular tiles only);
//! 2. `S̃ V` with `S̃ = S ⊙ e^{γi−γj} λ[i, ℓ(i,j)]` (masked and weighted in f32, rounded to the
//!    input dtype as the tensor cores take it);
//! 3. per chunk level read, `Y = Q H` with the level state `H` rounded to the input dtype;
//!    the output adds `λ[i, ℓ] e^{γi} f Y` in f32;
//! 4. the chunk's key state `Kᵀ (kd ⊙ V)` (`nk × pt`), merged into the f32 level states.
//!
//! The elementwise steps (weights, decays, state merges) stay f32 scalar code between the tile
//! products. The scores and the key state pass through one f32 shared staging buffer; the output
//! (S̃ V plus the weighted level reads) stays in the tensor cores' accumulator registers through
//! the chunk and is staged once (since v35; narrow value tiles stage every product). Requires `nk` a
//! multiple of 16 and `chunk` ∈ {32, 64} (the value tile `pt` is 16, 32 or 64 whatever P is;
//! columns past P are zero); other shapes use the scalar kernel.
//!
//! Memory access, as profiled on the H200 (bench/RESULTS.md, session 4): inputs are read as
//! vectors with all of a unit's loads in flight before it stores any ([`load_rows`]), level
//! states four floats at a time ([`read_level`], [`merge_level`]), and every shared tile's rows
//! are padded 16 bytes ([`row_len_input`], [`row_len_f32`]) so that a tile's 16 rows do not
//! share banks.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;

use super::cube::{
    Geometry, REWRITES_ALL, REWRITES_CLEAR_BITS, THREADS, advance_scales, bitlen, load_decays, row,
    segment_chunks, trailing_ones, walk_row,
};

/// Edge of one tensor-core tile.
pub const TILE: usize = crate::ops::TENSOR_CORE_TILE;
/// Byte alignment of the shared buffers that tiles are loaded from or stored to.
pub const ALIGN: usize = 128;

/// The forward op `out[t] = Σ_{s≤t} λ[t, ℓ(t,s)] e^{Γt−Γs} (q_t·k_s) v_s` on tensor cores.
///
/// With `single`, Mamba-2 (SSD) instead: `out[t] = Σ_{s≤t} e^{Γt−Γs} (q_t·k_s) v_s`, λ ignored,
/// `nlev = 1` state read and rewritten by every chunk — the λ ≡ 1 case of the op without its
/// Fenwick levels, the baseline that log-linear attention's extra state passes are measured by.
///
/// Shapes: `q, k: [B, T, H, nk]`, `v: [B, T, H, width]` (dtype `E`; launched for bf16),
/// `g: [B, T, H]`, `lambda: [B, T, H, levels]` (dtype `G`); `out: [B, T, H, width]` (dtype
/// `E`, rounded once from the f32 accumulator); `states`: `tiles·B·H·nlev·nk·pt` f32 scratch.
/// Grid `(B·H, tiles)`, [`THREADS`] units.
#[allow(clippy::too_many_arguments)]
#[cube(launch, create_dummy_kernel)]
pub fn causal_tc_kernel<E: Float, G: Float, N: Size>(
    q: &Tensor<Vector<E, N>>,
    k: &Tensor<Vector<E, N>>,
    v: &Tensor<Vector<E, N>>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    out: &mut Tensor<E>,
    states: &mut Tensor<Vector<f32, StateVec>>,
    batch: usize,
    seq: usize,
    heads: usize,
    width: usize,
    segments: usize,
    seg_chunks: usize,
    #[comptime] geo: Geometry,
    #[comptime] single: bool,
    #[define(E, G)] _dtypes: [ElemType; 2],
) {
    let (chunk, nk, pt) = comptime!((geo.chunk, geo.nk, geo.pt));
    let (levels, nlev) = comptime!((geo.levels, geo.nlev));
    let (threads, planes) = comptime!((geo.threads, geo.threads / 32));
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let (bi, seg, h, t_start) = walk_row(bh, heads, segments, seg_chunks, chunk);
    let u = UNIT_POS_X as usize;
    let plane = u / 32;
    let p0 = tile * pt;
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    // Output mapping of the f32 accumulators in registers: lanes over value columns.
    let pc = u % pt;
    let rbase = u / pt;
    let rstep = comptime!(threads / pt);
    let rows_out = comptime!(chunk / (threads / pt));
    // The output tiles (`C × pt`, 16×16 each) stay in the tensor cores' accumulator registers
    // through the chunk where they divide among the planes, one or two a plane in one column of
    // tiles (chunk 64, value tiles of 32 or 64 columns: the anchors): S̃V accumulates into them
    // and each level's product is added with its row weights in registers, one staging through
    // shared memory per chunk instead of one per product (v35: forward 7.05 → 6.75 ms at
    // T = 2048 on an H100, bench/RESULTS.md session 39). Narrow value tiles (few rows of B·H)
    // stage every product as before.
    let col_tiles = comptime!(pt / TILE);
    let out_tiles = comptime!(chunk / TILE * col_tiles);
    let in_registers = comptime!(
        out_tiles.is_multiple_of(planes)
            && out_tiles / planes <= 2
            && planes.is_multiple_of(col_tiles)
    );
    let two_tiles = comptime!(in_registers && out_tiles / planes == 2);
    // This plane's tiles: (ti_a, tp) and, with `two_tiles`, (ti_b, tp).
    let (ti_a, tp) = (plane / col_tiles, plane % col_tiles);
    let ti_b = (plane + planes) / col_tiles;
    let def = MmaDefinition::<E, E, f32>::new(TILE, HALF, TILE);
    let size!(NC) = def.vector_size(MatrixIdent::Accumulator);
    // Rows and columns of this unit's cells in an m16n8 accumulator: its first vector holds two
    // columns of row r0, its second two of row r1.
    let (r0, c0) = def.position_of_nth(UNIT_POS_PLANE, 0u32, MatrixIdent::Accumulator);
    let (r1, c1) = def.position_of_nth(UNIT_POS_PLANE, 2u32, MatrixIdent::Accumulator);
    let (r0, c0, r1, c1) = (r0 as usize, c0 as usize, r1 as usize, c1 as usize);
    // The level states are read and written four floats at a time: offsets count vectors.
    let level_size = comptime!(nk * pt);
    let state_base = (tile * batch * segments * heads + bh) * comptime!(nlev.max(1) * nk * pt / 4);

    // Rows of every shared tile are padded (8 bf16, 4 f32) so that the 16 rows of a tile fall
    // on different banks: with rows of 128 bf16 or 64 f32 (256 bytes) every row of a tile
    // started on the same bank, and the shared-memory pipe was the kernel's busiest unit
    // (unpadded: 2.0× the forward and 1.8× the forward+backward time at T = 8192, bench/RESULTS.md
    // session 4).
    let ldk = comptime!(row_len_input(nk));
    let ldv = comptime!(row_len_input(pt));
    let ldw = comptime!(row_len_input(chunk));
    let lss = comptime!(row_len_f32(chunk));
    let lso = comptime!(row_len_f32(pt));
    let mut qb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldk), ALIGN);
    let mut kb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldk), ALIGN);
    let mut vb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    // One buffer, three uses in turn: the in-chunk weights S̃ (`C × C`), each level state read
    // (`nk × pt`), the key-decayed values kd ⊙ V (`C × pt`).
    let mut scratch =
        Shared::<[E]>::new_aligned_slice(comptime!(tc_scratch_len(chunk, nk, pt)), ALIGN);
    // The low half of a split operand, never written here (`read_level` without `split`).
    let mut unused = Shared::<[E]>::new_slice(1usize);
    // Staging of every product's f32 result: scores, S̃V, QH, the key state.
    let stage_size = comptime!(stage_len(chunk, nk, pt));
    let mut stage = Shared::<[f32]>::new_aligned_slice(stage_size, ALIGN);
    let mut lam = Shared::<[f32]>::new_slice(comptime!(chunk * levels));
    let mut graw = Shared::<[f32]>::new_slice(chunk);
    let mut gam = Shared::<[f32]>::new_slice(chunk);
    let mut kd = Shared::<[f32]>::new_slice(chunk);
    let mut eg = Shared::<[f32]>::new_slice(chunk);
    let mut scale = Shared::<[f32]>::new_slice(comptime!(nlev.max(1)));
    // A level read's row weights f · e^{γ_i} · λ[i, level] (see `LEVEL_WEIGHT_SLOTS`).
    let mut level_weights = Shared::<[f32]>::new_slice(comptime!(LEVEL_WEIGHT_SLOTS * chunk));

    if u < nlev {
        scale[u] = 1.0f32;
    }
    let n_chunks = segment_chunks(seq, t_start, seg_chunks, chunk);

    // The sum of the levels a chunk retires, (4) to (5); declared across chunks since with
    // `compact_levels` an even chunk leaves level 0 in it for the next (see `Geometry`).
    let compact = comptime!(geo.compact_levels);
    let carry_vectors = comptime!(if geo.compact_levels {
        planes_carry_len(nk, pt, threads)
    } else {
        carry_len(nk, pt, threads)
    });
    let mut carry = Array::<Vector<f32, StateVec>>::new(carry_vectors);
    #[unroll]
    for r in 0..carry_vectors {
        carry[r] = Vector::<f32, StateVec>::zeroed();
    }

    for j in 0..n_chunks {
        let t0 = t_start + j * chunk;
        // The chunk's index in the whole sequence: its bits say which levels it reads.
        let jg = seg * seg_chunks + j;
        // (1) Load q, k (row-major) and the value tile in the input dtype; zero past the end.
        load_rows::<E, N>(
            q, &mut qb, u, t0, 0, bi, h, seq, heads, nk, chunk, nk, ldk, threads, true,
        );
        load_rows::<E, N>(
            k, &mut kb, u, t0, 0, bi, h, seq, heads, nk, chunk, nk, ldk, threads, true,
        );
        load_rows::<E, N>(
            v, &mut vb, u, t0, p0, bi, h, seq, heads, width, chunk, pt, ldv, threads, true,
        );
        load_decays::<G>(
            g, lambda, &mut lam, &mut graw, &mut gam, &mut kd, &mut eg, u, t0, bi, h, seq, heads,
            chunk, levels, threads, true,
        );

        // (2) Scores Q Kᵀ, lower-triangular tiles (Kᵀ is K read column-major).
        tile_matmul::<E>(
            &qb, &qb, &kb, &kb, &mut stage, plane, planes, chunk, nk, chunk, false, ldk, true, ldk,
            FULL, LOWER, EXACT, lss,
        );
        sync_cube();
        // Weights: e^{γi−γj} λ[i, ℓ(i,j)] below the diagonal, zero above.
        let mut idx = u;
        while idx < comptime!(chunk * chunk) {
            let i = idx / chunk;
            let jj = idx % chunk;
            let mut s = 0.0f32;
            if jj <= i {
                let lvl = bitlen(i ^ jj);
                if single {
                    s = stage[i * lss + jj] * exp_approx(gam[i] - gam[jj]);
                } else if lvl < levels {
                    s = stage[i * lss + jj] * exp_approx(gam[i] - gam[jj]) * lam[i * levels + lvl];
                }
            }
            scratch[i * ldw + jj] = E::cast_from(s);
            idx += threads;
        }
        sync_cube();

        // (3) In-chunk output S̃ V.
        let mut out_al = zero_accumulators::<NC>();
        let mut out_ar = zero_accumulators::<NC>();
        let mut out_bl = zero_accumulators::<NC>();
        let mut out_br = zero_accumulators::<NC>();
        let mut acc = Array::<f32>::new(rows_out);
        if comptime!(in_registers) {
            mma_into::<E, NC>(
                &def,
                &scratch,
                &vb,
                &mut out_al,
                &mut out_ar,
                &mut out_bl,
                &mut out_br,
                ti_a,
                ti_b,
                tp,
                two_tiles,
                chunk,
                ldw,
                ldv,
                LOWER,
            );
            sync_cube();
        } else {
            tile_matmul::<E>(
                &scratch, &scratch, &vb, &vb, &mut stage, plane, planes, chunk, chunk, pt, false,
                ldw, false, ldv, LOWER, FULL, EXACT, lso,
            );
            sync_cube();
            #[unroll]
            for r in 0..rows_out {
                acc[r] = stage[(rbase + r * rstep) * lso + pc];
            }
        }
        // Staged, no barrier here nor after each level's epilogue below: the next write of
        // `stage` is a product that follows a barrier (a level's, or the one before the key
        // state's product) which every unit reaches only after its reads of `stage`, and the next
        // write of `scratch` (a level read, or kd ⊙ V) follows the barrier after the last product
        // that read it. In registers, the barrier after each level's product stands in for that
        // last one (no staged read follows the product).
        // (4) Earlier chunks: chunk level i is read when bit i−1 of j is set.
        // The levels of the trailing ones of j are read here and then retired: their sum,
        // decayed by this chunk, plus this chunk's key state becomes level `ones` in (5).
        // With `compact_levels` an odd chunk finds level 0, the previous chunk's key state, in
        // `carry` as that chunk left it. (`j > 0` is implied in a whole walk, where `jg = j`, but
        // spelled out: with it ptxas keeps the forward at T = 32,768 × 4 in 86 registers, with
        // `j % 2 == 1` alone in 80 and a four-byte spill.)
        let mut held = false;
        if compact {
            held = jg % 2 == 1 && j > 0;
        }
        let mut ones = 0usize;
        if !single {
            if !held {
                #[unroll]
                for r in 0..carry_vectors {
                    carry[r] = Vector::<f32, StateVec>::zeroed();
                }
            }
            // On the whole-sequence index: a level this chunk does not read (see `cube.rs`).
            ones = trailing_ones(jg);
        }
        let mut slot = 0usize;
        for lvi in 0..nlev {
            let token_level = log_c + lvi + 1;
            let mut read = (jg >> lvi) & 1 == 1 && token_level < levels;
            if single {
                read = j > 0;
            }
            if read {
                // This level's row weights, published by the barrier after the level read.
                if u < chunk {
                    let mut w = scale[lvi] * eg[u];
                    if !single {
                        w *= lam[u * levels + token_level];
                    }
                    level_weights[slot * chunk + u] = w;
                }
                let base = state_base + lvi * comptime!(level_size / 4);
                if held && lvi == 0 {
                    // Level 0 from registers; an odd chunk retires it, so the carry starts as
                    // `scale_0 · U_0`, as a read added to a zero carry would make it.
                    store_held::<E>(&mut carry, &mut scratch, scale[0], u, nk, pt, ldv, threads);
                } else {
                    if compact {
                        read_level_planes::<E>(
                            states,
                            &mut scratch,
                            &mut carry,
                            scale[lvi],
                            lvi < ones,
                            base,
                            u,
                            nk,
                            pt,
                            ldv,
                            threads,
                        );
                    } else {
                        read_level_carry::<E>(
                            states,
                            &mut scratch,
                            &mut unused,
                            &mut carry,
                            scale[lvi],
                            lvi < ones,
                            base,
                            u,
                            nk,
                            pt,
                            ldv,
                            false,
                            threads,
                            true,
                        );
                    }
                }
                sync_cube();
                if comptime!(in_registers) {
                    // Y = Q H into fresh accumulators, added with the row weights in f32.
                    let mut lev_al = zero_accumulators::<NC>();
                    let mut lev_ar = zero_accumulators::<NC>();
                    let mut lev_bl = zero_accumulators::<NC>();
                    let mut lev_br = zero_accumulators::<NC>();
                    mma_into::<E, NC>(
                        &def,
                        &qb,
                        &scratch,
                        &mut lev_al,
                        &mut lev_ar,
                        &mut lev_bl,
                        &mut lev_br,
                        ti_a,
                        ti_b,
                        tp,
                        two_tiles,
                        nk,
                        ldk,
                        ldv,
                        FULL,
                    );
                    let wa = slot * chunk + ti_a * TILE;
                    let (w0, w1) = (level_weights[wa + r0], level_weights[wa + r1]);
                    add_row_weighted::<NC>(&mut out_al, &lev_al, w0, w1);
                    add_row_weighted::<NC>(&mut out_ar, &lev_ar, w0, w1);
                    if comptime!(two_tiles) {
                        let wb = slot * chunk + ti_b * TILE;
                        let (w0, w1) = (level_weights[wb + r0], level_weights[wb + r1]);
                        add_row_weighted::<NC>(&mut out_bl, &lev_bl, w0, w1);
                        add_row_weighted::<NC>(&mut out_br, &lev_br, w0, w1);
                    }
                    // The next level's read rewrites `scratch`.
                    sync_cube();
                } else {
                    tile_matmul::<E>(
                        &qb, &qb, &scratch, &scratch, &mut stage, plane, planes, chunk, nk, pt,
                        false, ldk, false, ldv, FULL, FULL, EXACT, lso,
                    );
                    sync_cube();
                    #[unroll]
                    for r in 0..rows_out {
                        let i = rbase + r * rstep;
                        acc[r] += stage[i * lso + pc] * level_weights[slot * chunk + i];
                    }
                }
                slot = (slot + 1) % LEVEL_WEIGHT_SLOTS;
            }
        }
        if comptime!(in_registers) {
            // The output tiles through `stage` (no product of this chunk wrote it since the
            // barrier after the in-chunk weights read the scores), then stored by columns.
            let oa = ti_a * TILE * lso + tp * TILE;
            store_accumulators::<NC>(
                &mut stage,
                &out_al,
                &out_ar,
                oa + r0 * lso + c0,
                oa + r1 * lso + c1,
            );
            if comptime!(two_tiles) {
                let ob = ti_b * TILE * lso + tp * TILE;
                store_accumulators::<NC>(
                    &mut stage,
                    &out_bl,
                    &out_br,
                    ob + r0 * lso + c0,
                    ob + r1 * lso + c1,
                );
            }
            sync_cube();
            #[unroll]
            for r in 0..rows_out {
                acc[r] = stage[(rbase + r * rstep) * lso + pc];
            }
        }
        #[unroll]
        for r in 0..rows_out {
            let t = t0 + rbase + r * rstep;
            let p = p0 + pc;
            if t < seq && p < width {
                out[row(bi, t, h, seq, heads, width) + p] = E::cast_from(acc[r]);
            }
        }
        // (5) This chunk's key state Kᵀ (kd ⊙ V) and the levels it retired become level `ones`
        // (see `carry_len`); Mamba-2's one state decays and takes it.
        if nlev > 0 {
            // Key-decayed values kd ⊙ V (the scratch buffer is free: every read of it ended
            // before the last barrier).
            idx = u;
            while idx < comptime!(chunk * pt) {
                let i = idx / pt;
                let c = idx % pt;
                scratch[i * ldv + c] = E::cast_from(f32::cast_from(vb[i * ldv + c]) * kd[i]);
                idx += threads;
            }
            sync_cube();
            if !single {
                // Every unit's reads of the levels this chunk retires ended before that barrier.
                // With `compact_levels` level 0 is never written: nothing of it to drop.
                let mut first = 0usize;
                if compact && ones > 0 {
                    first = 1;
                }
                discard_levels(states, state_base, first, ones - first, u, nk, pt, threads);
            }
            // Kᵀ (kd ⊙ V): Kᵀ is K read column-major.
            tile_matmul::<E>(
                &kb, &kb, &scratch, &scratch, &mut stage, plane, planes, nk, chunk, pt, true, ldk,
                false, ldv, FULL, FULL, EXACT, lso,
            );
            sync_cube();
            if single {
                // Mamba-2: the one state decays through the chunk and takes its key state.
                merge_level(
                    states,
                    &stage,
                    state_base,
                    scale[0] * eg[comptime!(chunk - 1)],
                    j == 0,
                    u,
                    nk,
                    pt,
                    lso,
                    threads,
                );
            } else if ones < nlev && log_c + ones + 1 < levels {
                let mut hold = false;
                if compact {
                    hold = ones == 0;
                }
                if hold {
                    // An even chunk's level 0 is its key state alone (it retires nothing:
                    // `carry` is zero), kept in `carry` for the next chunk, which reads and
                    // retires it: never written to `states`.
                    hold_key_state(&stage, &mut carry, u, nk, pt, lso, threads);
                } else {
                    if compact {
                        write_carry_planes::<E>(
                            states,
                            &stage,
                            &carry,
                            eg[comptime!(chunk - 1)],
                            state_base + ones * comptime!(level_size / 4),
                            u,
                            nk,
                            pt,
                            lso,
                            threads,
                        );
                    } else {
                        write_carry(
                            states,
                            &stage,
                            &carry,
                            eg[comptime!(chunk - 1)],
                            state_base + ones * comptime!(level_size / 4),
                            u,
                            nk,
                            pt,
                            lso,
                            threads,
                        );
                    }
                }
            }
        }
        // A cube barrier, not `sync_storage`: these kernels run on CUDA only, where
        // `__syncthreads` already orders the cube's global writes for the cube's own later reads
        // (the level states are read back only by the cube that wrote them), and
        // `sync_storage`'s device-scope fence held every unit until its stores reached L2
        // (the membar stalls of the forward's profile, bench/RESULTS.md session 36).
        sync_cube();
        advance_scales(
            &mut scale,
            &eg,
            u,
            jg,
            chunk,
            levels,
            nlev,
            comptime!(if single {
                REWRITES_ALL
            } else {
                REWRITES_CLEAR_BITS
            }),
        );
        sync_cube();
    }
    // The walk is over: every level is dead (the loop's last barrier follows every access);
    // with `compact_levels` level 0 was never written.
    let written = comptime!(if geo.compact_levels && nlev > 0 { 1 } else { 0 });
    discard_levels(
        states,
        state_base,
        written,
        comptime!(nlev - written),
        u,
        nk,
        pt,
        threads,
    );
}

/// Buffers of per-row level weights (`f · e^{γ_i} · λ[i, level]`, one float per row) that the
/// level reads of the causal kernels take in turn. A level's weights are written while its state
/// is read (before the barrier ahead of its product) and read in its epilogue, where every
/// element of a unit's rows took two shared loads, an index product and two multiplies (the
/// causal backward's level epilogue was its busiest region, bench/RESULTS.md session 36). Two
/// buffers, because a unit may write the next level's weights while another still reads the
/// current ones: the write of the level after that waits behind the next level's barriers.
pub const LEVEL_WEIGHT_SLOTS: usize = 2;

/// No triangular structure.
pub const FULL: u32 = 0;
/// Lower-triangular in tiles (tile column ≤ tile row).
pub const LOWER: u32 = 1;
/// Upper-triangular in tiles (tile column ≥ tile row).
pub const UPPER: u32 = 2;

/// `e^x` as `2^{x·log₂e}` by the hardware's approximation (`ex2.approx.ftz.f32`: two
/// instructions where the accurate `expf` takes about eight; relative error ≈ 2⁻²², far below the
/// inputs' bf16 rounding; `e^0 = 1` exactly, so the diagonal's weights stay exact). The in-chunk
/// weight loops take one per element of the `chunk × chunk` square: with the accurate `expf`
/// they were 17.6 % of the forward's instructions, and `ex2.approx` took forward+backward 1.6 %
/// (T = 2048) and 2.7 % (T = 8192) faster (bench/RESULTS.md session 37). The arguments are
/// `γ_i − γ_j ≤ 0`; results below 2⁻¹²⁶ flush to zero. CUDA only (inline PTX), as are the
/// tensor-core kernels.
#[cube]
pub fn exp_approx(x: f32) -> f32 {
    let scaled = x * comptime!(std::f32::consts::LOG2_E);
    let y: f32;
    gpu_asm!("ex2.approx.ftz.f32 {}, {};", out(_) y, in(_) scaled, options(pure, nomem));
    y
}

/// Operands as they are.
pub const EXACT: u32 = 0;
/// `A = a + a2`: an f32 operand split into its rounding to the input dtype and the remainder,
/// two products instead of one, ≈ 16 mantissa bits instead of 8.
pub const SPLIT_A: u32 = 1;
/// `B = b + b2`, likewise.
pub const SPLIT_B: u32 = 2;

/// `stage[rows × cols]` (f32, row-major, rows `ldc` apart) `= A · B`, one 16×16 output tile per
/// plane at a time.
/// `A` (`rows × inner`) is read from `a` row-major (`a[r·lda + k]`) or, with `a_col`,
/// column-major (`a[k·lda + r]`, i.e. the transpose of a row-major buffer); `B` (`inner × cols`)
/// likewise from `b` (`b_col`: `b[c·ldb + k]`). `a_tri` skips the zero tiles of a triangular `A`
/// (`inner == rows`); `out_tri` computes only the output tiles of that triangle (the rest of
/// `stage` is left as it was). With `split` ([`SPLIT_A`] / [`SPLIT_B`]) the operand is `a + a2`
/// (`b + b2`, same layout); with [`EXACT`], `a2` and `b2` are not read.
///
/// Each output tile is two `mma.sync` m16n8k16 products per 16-deep step, their operands loaded
/// by `ldmatrix` (one instruction per 8×8 matrix group, transposing where the buffer runs the
/// other way). Until v13 the tiles were `cmma` (WMMA) fragments, whose loads CubeCL emits as
/// 32-bit loads through generic pointers — four per fragment and unit, plus `MOVM` transposes of
/// the column-major ones: 22 % of the anticausal backward's instructions (Nsight Compute,
/// bench/RESULTS.md session 29). Every buffer is 16-byte aligned and every row a multiple of 16
/// bytes ([`row_len_input`]), as `ldmatrix` requires.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn tile_matmul<E: Float>(
    a: &Shared<[E]>,
    a2: &Shared<[E]>,
    b: &Shared<[E]>,
    b2: &Shared<[E]>,
    stage: &mut Shared<[f32]>,
    plane: usize,
    #[comptime] planes: usize,
    #[comptime] rows: usize,
    #[comptime] inner: usize,
    #[comptime] cols: usize,
    #[comptime] a_col: bool,
    #[comptime] lda: usize,
    #[comptime] b_col: bool,
    #[comptime] ldb: usize,
    #[comptime] a_tri: u32,
    #[comptime] out_tri: u32,
    #[comptime] split: u32,
    #[comptime] ldc: usize,
) {
    let col_tiles = comptime!(cols / TILE);
    let inner_tiles = comptime!(inner / TILE);
    let def = MmaDefinition::<E, E, f32>::new(TILE, HALF, TILE);
    let size!(NA) = def.vector_size(MatrixIdent::A);
    let size!(NB) = def.vector_size(MatrixIdent::B);
    let size!(NC) = def.vector_size(MatrixIdent::Accumulator);
    // Each unit hands `ldmatrix` the address of one 16-byte row of one 8×8 matrix: unit l
    // addresses row l % 8 of matrix l / 8. A's four matrices are (row block, inner block)
    // (0,0), (1,0), (0,1), (1,1), in the order of the mma's A registers; B's two (per 8-column
    // half) are inner blocks 0 and 1. A buffer whose rows run along the operand's inner
    // dimension (A row-major, B read column-major) is read as is; the other is transposed
    // by the instruction.
    let lane = UNIT_POS_PLANE as usize;
    let (q, r) = (lane / 8, lane % 8);
    let mut a_lane = (r + (q % 2) * 8) * lda + (q / 2) * 8;
    if a_col {
        a_lane = (r + (q / 2) * 8) * lda + (q % 2) * 8;
    }
    // B takes two matrices per half: the upper 16 units repeat the lower 16 units' rows.
    let q2 = (lane % 16) / 8;
    let mut b_lane = (r + q2 * 8) * ldb;
    if b_col {
        b_lane = r * ldb + q2 * 8;
    }
    // The second 8-column half of a B tile.
    let b_half = comptime!(if b_col { HALF * ldb } else { HALF });
    let (a_trans, b_trans) = comptime!((a_col, !b_col));
    // Accumulator cells of this unit: (row, column) of the first element of its two vectors.
    let (r0, c0) = def.position_of_nth(lane as u32, 0u32, MatrixIdent::Accumulator);
    let (r1, c1) = def.position_of_nth(lane as u32, 2u32, MatrixIdent::Accumulator);
    let at0 = r0 as usize * ldc + c0 as usize;
    let at1 = r1 as usize * ldc + c1 as usize;
    // Full products with an even number of output tiles per plane take them two at a time
    // (`ot`, `ot + planes`): two independent accumulator chains, and one B fragment for both
    // where the two tiles share a column (1.04× on forward+backward at T = 8192, H100; bench/
    // RESULTS.md session 24).
    let paired = comptime!(
        a_tri == FULL
            && out_tri == FULL
            && (rows / TILE * (cols / TILE)).is_multiple_of(2 * planes)
    );
    let share_b = comptime!(planes.is_multiple_of(col_tiles));
    if paired {
        let mut ot = plane;
        while ot < comptime!(rows / TILE * (cols / TILE)) {
            let ti = ot / col_tiles;
            let tp = ot % col_tiles;
            let ti2 = (ot + planes) / col_tiles;
            let tp2 = (ot + planes) % col_tiles;
            let mut acc = zero_accumulators::<NC>();
            let mut acc_r = zero_accumulators::<NC>();
            let mut acc2 = zero_accumulators::<NC>();
            let mut acc2_r = zero_accumulators::<NC>();
            for kk in 0..inner_tiles {
                let mut a_off = ti * TILE * lda + kk * TILE;
                let mut a_off2 = ti2 * TILE * lda + kk * TILE;
                if a_col {
                    a_off = kk * TILE * lda + ti * TILE;
                    a_off2 = kk * TILE * lda + ti2 * TILE;
                }
                let mut b_off = kk * TILE * ldb + tp * TILE;
                let mut b_off2 = kk * TILE * ldb + tp2 * TILE;
                if b_col {
                    b_off = tp * TILE * ldb + kk * TILE;
                    b_off2 = tp2 * TILE * ldb + kk * TILE;
                }
                let am = load_a::<E, NA>(&def, a, a_off + a_lane, a_trans);
                let am2 = load_a::<E, NA>(&def, a, a_off2 + a_lane, a_trans);
                let bm = load_b::<E, NB>(&def, b, b_off + b_lane, b_trans);
                let bm_r = load_b::<E, NB>(&def, b, b_off + b_lane + b_half, b_trans);
                def.execute_inplace(&am, &bm, &mut acc);
                def.execute_inplace(&am, &bm_r, &mut acc_r);
                if share_b {
                    def.execute_inplace(&am2, &bm, &mut acc2);
                    def.execute_inplace(&am2, &bm_r, &mut acc2_r);
                } else {
                    let bm2 = load_b::<E, NB>(&def, b, b_off2 + b_lane, b_trans);
                    let bm2_r = load_b::<E, NB>(&def, b, b_off2 + b_lane + b_half, b_trans);
                    def.execute_inplace(&am2, &bm2, &mut acc2);
                    def.execute_inplace(&am2, &bm2_r, &mut acc2_r);
                }
                if split == SPLIT_A {
                    let al = load_a::<E, NA>(&def, a2, a_off + a_lane, a_trans);
                    let al2 = load_a::<E, NA>(&def, a2, a_off2 + a_lane, a_trans);
                    def.execute_inplace(&al, &bm, &mut acc);
                    def.execute_inplace(&al, &bm_r, &mut acc_r);
                    if share_b {
                        def.execute_inplace(&al2, &bm, &mut acc2);
                        def.execute_inplace(&al2, &bm_r, &mut acc2_r);
                    } else {
                        let bm2 = load_b::<E, NB>(&def, b, b_off2 + b_lane, b_trans);
                        let bm2_r = load_b::<E, NB>(&def, b, b_off2 + b_lane + b_half, b_trans);
                        def.execute_inplace(&al2, &bm2, &mut acc2);
                        def.execute_inplace(&al2, &bm2_r, &mut acc2_r);
                    }
                }
                if split == SPLIT_B {
                    let bl = load_b::<E, NB>(&def, b2, b_off + b_lane, b_trans);
                    let bl_r = load_b::<E, NB>(&def, b2, b_off + b_lane + b_half, b_trans);
                    def.execute_inplace(&am, &bl, &mut acc);
                    def.execute_inplace(&am, &bl_r, &mut acc_r);
                    if share_b {
                        def.execute_inplace(&am2, &bl, &mut acc2);
                        def.execute_inplace(&am2, &bl_r, &mut acc2_r);
                    } else {
                        let bl2 = load_b::<E, NB>(&def, b2, b_off2 + b_lane, b_trans);
                        let bl2_r = load_b::<E, NB>(&def, b2, b_off2 + b_lane + b_half, b_trans);
                        def.execute_inplace(&am2, &bl2, &mut acc2);
                        def.execute_inplace(&am2, &bl2_r, &mut acc2_r);
                    }
                }
            }
            let out = ti * TILE * ldc + tp * TILE;
            store_accumulators::<NC>(stage, &acc, &acc_r, out + at0, out + at1);
            let out2 = ti2 * TILE * ldc + tp2 * TILE;
            store_accumulators::<NC>(stage, &acc2, &acc2_r, out2 + at0, out2 + at1);
            ot += comptime!(2 * planes);
        }
    } else {
        let mut ot = plane;
        while ot < comptime!(rows / TILE * (cols / TILE)) {
            let ti = ot / col_tiles;
            let tp = ot % col_tiles;
            let mut wanted = true;
            if out_tri == LOWER {
                wanted = tp <= ti;
            }
            if out_tri == UPPER {
                wanted = tp >= ti;
            }
            if wanted {
                let mut acc = zero_accumulators::<NC>();
                let mut acc_r = zero_accumulators::<NC>();
                for kk in 0..inner_tiles {
                    let mut nonzero = true;
                    if a_tri == LOWER {
                        nonzero = kk <= ti;
                    }
                    if a_tri == UPPER {
                        nonzero = kk >= ti;
                    }
                    if nonzero {
                        let mut a_off = ti * TILE * lda + kk * TILE;
                        if a_col {
                            a_off = kk * TILE * lda + ti * TILE;
                        }
                        let mut b_off = kk * TILE * ldb + tp * TILE;
                        if b_col {
                            b_off = tp * TILE * ldb + kk * TILE;
                        }
                        let am = load_a::<E, NA>(&def, a, a_off + a_lane, a_trans);
                        let bm = load_b::<E, NB>(&def, b, b_off + b_lane, b_trans);
                        let bm_r = load_b::<E, NB>(&def, b, b_off + b_lane + b_half, b_trans);
                        def.execute_inplace(&am, &bm, &mut acc);
                        def.execute_inplace(&am, &bm_r, &mut acc_r);
                        if split == SPLIT_A {
                            let al = load_a::<E, NA>(&def, a2, a_off + a_lane, a_trans);
                            def.execute_inplace(&al, &bm, &mut acc);
                            def.execute_inplace(&al, &bm_r, &mut acc_r);
                        }
                        if split == SPLIT_B {
                            let bl = load_b::<E, NB>(&def, b2, b_off + b_lane, b_trans);
                            let bl_r = load_b::<E, NB>(&def, b2, b_off + b_lane + b_half, b_trans);
                            def.execute_inplace(&am, &bl, &mut acc);
                            def.execute_inplace(&am, &bl_r, &mut acc_r);
                        }
                    }
                }
                let out = ti * TILE * ldc + tp * TILE;
                store_accumulators::<NC>(stage, &acc, &acc_r, out + at0, out + at1);
            }
            ot += planes;
        }
    }
}

/// Edge of the mma's N dimension: a 16×16 output tile is two m16n8k16 products.
pub const HALF: usize = 8;

/// The A operand of one m16n8k16 step (16×16, four 8×8 matrices) by `ldmatrix.x4`; `at` is this
/// unit's row address (see [`tile_matmul`]), `trans` whether the buffer runs along the rows.
#[cube]
pub fn load_a<E: Float, NA: Size>(
    def: &MmaDefinition<E, E, f32>,
    buf: &Shared<[E]>,
    at: usize,
    #[comptime] trans: bool,
) -> Array<Vector<E, NA>> {
    def.load_matrix::<E, NA>(buf.slice(at, at + HALF), MatrixIdent::A, 4usize, trans)
}

/// The B operand of one m16n8k16 step (16×8, two 8×8 matrices) by `ldmatrix.x2`.
#[cube]
pub fn load_b<E: Float, NB: Size>(
    def: &MmaDefinition<E, E, f32>,
    buf: &Shared<[E]>,
    at: usize,
    #[comptime] trans: bool,
) -> Array<Vector<E, NB>> {
    def.load_matrix::<E, NB>(buf.slice(at, at + HALF), MatrixIdent::B, 2usize, trans)
}

/// The two accumulator vectors of one m16n8 product, zero.
#[cube]
fn zero_accumulators<NC: Size>() -> Array<Vector<f32, NC>> {
    let mut acc = Array::<Vector<f32, NC>>::new(2usize);
    acc[0usize] = Vector::<f32, NC>::zeroed();
    acc[1usize] = Vector::<f32, NC>::zeroed();
    acc
}

/// A 16×16 output tile from its two m16n8 halves: this unit's cells at `at0`, `at0 + 1` (first
/// vector) and `at1`, `at1 + 1` (second) of the left half, 8 columns on for the right half.
#[cube]
fn store_accumulators<NC: Size>(
    stage: &mut Shared<[f32]>,
    left: &Array<Vector<f32, NC>>,
    right: &Array<Vector<f32, NC>>,
    at0: usize,
    at1: usize,
) {
    let (x, y) = (left[0usize], left[1usize]);
    stage[at0] = x.extract(0usize);
    stage[at0 + 1] = x.extract(1usize);
    stage[at1] = y.extract(0usize);
    stage[at1 + 1] = y.extract(1usize);
    let (x, y) = (right[0usize], right[1usize]);
    stage[at0 + HALF] = x.extract(0usize);
    stage[at0 + HALF + 1] = x.extract(1usize);
    stage[at1 + HALF] = y.extract(0usize);
    stage[at1 + HALF + 1] = y.extract(1usize);
}

/// Adds `A · B` to one or two output tiles held in
/// registers, tiles `(ti_a, tp)` and, with `two`, `(ti_b, tp)` (same column: one B fragment for
/// both). `A` (`· × inner`) and `B` (`inner × ·`) are row-major shared buffers; with
/// `a_tri == LOWER` the zero tiles of a lower-triangular `A` are skipped (`kk > ti`).
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn mma_into<E: Float, NC: Size>(
    def: &MmaDefinition<E, E, f32>,
    a: &Shared<[E]>,
    b: &Shared<[E]>,
    acc_al: &mut Array<Vector<f32, NC>>,
    acc_ar: &mut Array<Vector<f32, NC>>,
    acc_bl: &mut Array<Vector<f32, NC>>,
    acc_br: &mut Array<Vector<f32, NC>>,
    ti_a: usize,
    ti_b: usize,
    tp: usize,
    #[comptime] two: bool,
    #[comptime] inner: usize,
    #[comptime] lda: usize,
    #[comptime] ldb: usize,
    #[comptime] a_tri: u32,
) {
    let size!(NA) = def.vector_size(MatrixIdent::A);
    let size!(NB) = def.vector_size(MatrixIdent::B);
    // Lane addresses as in `tile_matmul` (A row-major, B row-major: transposed by `ldmatrix`).
    let lane = UNIT_POS_PLANE as usize;
    let (q, r) = (lane / 8, lane % 8);
    let a_lane = (r + (q % 2) * 8) * lda + (q / 2) * 8;
    let q2 = (lane % 16) / 8;
    let b_lane = (r + q2 * 8) * ldb;
    for kk in 0..comptime!(inner / TILE) {
        // Tiles of a triangular A past the diagonal are zero (every tile of B is read by the
        // second output tile, the lower one, while `kk ≤ ti_b`).
        let mut use_b = true;
        if a_tri == LOWER {
            use_b = kk <= ti_a;
            if two {
                use_b = kk <= ti_b;
            }
        }
        if use_b {
            let b_off = kk * TILE * ldb + tp * TILE;
            let bm = load_b::<E, NB>(def, b, b_off + b_lane, true);
            let bm_r = load_b::<E, NB>(def, b, b_off + b_lane + HALF, true);
            let mut use_a = true;
            if a_tri == LOWER {
                use_a = kk <= ti_a;
            }
            if use_a {
                let am = load_a::<E, NA>(def, a, ti_a * TILE * lda + kk * TILE + a_lane, false);
                def.execute_inplace(&am, &bm, acc_al);
                def.execute_inplace(&am, &bm_r, acc_ar);
            }
            if two {
                let am2 = load_a::<E, NA>(def, a, ti_b * TILE * lda + kk * TILE + a_lane, false);
                def.execute_inplace(&am2, &bm, acc_bl);
                def.execute_inplace(&am2, &bm_r, acc_br);
            }
        }
    }
}

/// `acc += part ⊙ w` for one m16n8 accumulator pair, `w0` the weight of the first
/// vector's row, `w1` of the second's.
#[cube]
pub fn add_row_weighted<NC: Size>(
    acc: &mut Array<Vector<f32, NC>>,
    part: &Array<Vector<f32, NC>>,
    w0: f32,
    w1: f32,
) {
    let x = acc[0usize] + part[0usize] * Vector::<f32, NC>::new(w0);
    let y = acc[1usize] + part[1usize] * Vector::<f32, NC>::new(w1);
    acc[0usize] = x;
    acc[1usize] = y;
}

/// Shared row length of a tile `cols` wide in the input dtype: 8 more (16 bytes),
/// so that consecutive rows start 4 banks apart and a tile's 16 rows spread over all banks.
pub const fn row_len_input(cols: usize) -> usize {
    cols + 8
}

/// Shared row length of an f32 tile `cols` wide: 4 more (16 bytes), as
/// [`row_len_input`].
pub const fn row_len_f32(cols: usize) -> usize {
    cols + 4
}

/// f32 elements of the forward's staging buffer: the largest product result (scores `C × C`,
/// outputs `C × pt`, key state `nk × pt`).
pub const fn stage_len(chunk: usize, nk: usize, pt: usize) -> usize {
    let mut len = chunk * row_len_f32(chunk);
    if chunk * row_len_f32(pt) > len {
        len = chunk * row_len_f32(pt);
    }
    if nk * row_len_f32(pt) > len {
        len = nk * row_len_f32(pt);
    }
    len
}

/// Input-dtype elements of the forward's scratch buffer (weights `C × C`, a level state
/// `nk × pt`, kd ⊙ V `C × pt`).
pub const fn tc_scratch_len(chunk: usize, nk: usize, pt: usize) -> usize {
    let mut len = chunk * row_len_input(chunk);
    if nk * row_len_input(pt) > len {
        len = nk * row_len_input(pt);
    }
    if chunk * row_len_input(pt) > len {
        len = chunk * row_len_input(pt);
    }
    len
}

/// Shared memory (bytes) of one cube of [`causal_tc_kernel`] with `elem` bytes per input
/// element, plus the alignment padding of the five aligned buffers.
pub fn tc_shared_bytes(chunk: usize, nk: usize, pt: usize, levels: usize, elem: usize) -> usize {
    let inputs = elem
        * (2 * chunk * row_len_input(nk)
            + chunk * row_len_input(pt)
            + tc_scratch_len(chunk, nk, pt)
            + 1);
    let floats =
        stage_len(chunk, nk, pt) + chunk * levels + 4 * chunk + LEVEL_WEIGHT_SLOTS * chunk + 32;
    inputs + 4 * floats + 5 * ALIGN
}

/// f32 elements per access of the level states: 16 bytes.
pub type StateVec = Const<4>;

/// `buf[i·ld + c] = x[b, t0 + i, h, c0 + c]` (`c < cols`) for a chunk of rows, in the input
/// dtype (zero past the end of the sequence or of the `width` columns), read `N` elements at a
/// time (the launch's vector size: 16 bytes where the row widths and buffer offsets allow) with
/// every load of a unit issued before its first store — one element per loop trip, each waited
/// for, left the kernels waiting on global memory for about half their cycles (Nsight Compute on
/// the H200, bench/RESULTS.md). `cols`, `width` and `c0` are multiples of `N`. The caller's next
/// barrier publishes the buffer. With `vector_stores` each loaded vector is stored whole (one
/// 16-byte store instead of eight 16-bit ones); WGSL cannot view a shared array as vectors, so
/// the WGPU probe of this helper stores element by element.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn load_rows<E: Float, N: Size>(
    x: &Tensor<Vector<E, N>>,
    buf: &mut Shared<[E]>,
    u: usize,
    t0: usize,
    c0: usize,
    bi: usize,
    h: usize,
    seq: usize,
    heads: usize,
    width: usize,
    #[comptime] chunk: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] threads: usize,
    #[comptime] vector_stores: bool,
) {
    let n = x.vector_size();
    let per_row = comptime!(cols / n);
    let total = comptime!(chunk * cols / n);
    let trips = comptime!(total.div_ceil(threads));
    let mut held = Array::<Vector<E, N>>::new(trips);
    #[unroll]
    for r in 0..trips {
        let idx = u + r * threads;
        let t = t0 + idx / per_row;
        let c = c0 + (idx % per_row) * n;
        let mut val = Vector::<E, N>::zeroed();
        if idx < total && t < seq && c < width {
            val = x[(row(bi, t, h, seq, heads, width) + c) / n];
        }
        held[r] = val;
    }
    if vector_stores {
        // Rows are `ld` long, a multiple of the vector size: every vector lands aligned.
        let dst = buf
            .as_mut_slice()
            .as_vectorized_mut()
            .with_vector_size_mut::<N>();
        #[unroll]
        for r in 0..trips {
            let idx = u + r * threads;
            if idx < total {
                dst[((idx / per_row) * ld + (idx % per_row) * n) / n] = held[r];
            }
        }
    } else {
        #[unroll]
        for r in 0..trips {
            let idx = u + r * threads;
            if idx < total {
                let val = held[r];
                let first = (idx / per_row) * ld + (idx % per_row) * n;
                #[unroll]
                for e in 0..n {
                    buf[first + e] = val.extract(e);
                }
            }
        }
    }
}

/// One level state (`rows × cols` floats, row-major, at vector `base` of `states`) becomes
/// `(fresh ? 0 : f U) + stage` (`stage` rows `ld` apart): four floats per access, every load of
/// a unit issued before its first store.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn merge_level(
    states: &mut Tensor<Vector<f32, StateVec>>,
    stage: &Shared<[f32]>,
    base: usize,
    f: f32,
    fresh: bool,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] threads: usize,
) {
    let per_row = comptime!(cols / 4);
    let total = comptime!(rows * cols / 4);
    let held = load_level(states, base, u, fresh, rows, cols, threads);
    #[unroll]
    for r in 0..comptime!(carry_len(rows, cols, threads)) {
        let idx = u + r * threads;
        if idx < total {
            let old = held[r];
            let first = (idx / per_row) * ld + (idx % per_row) * 4;
            let mut x = Vector::<f32, StateVec>::zeroed();
            #[unroll]
            for e in 0..4 {
                x.insert(e, old.extract(e) * f + stage[first + e]);
            }
            states[base + idx] = x;
        }
    }
}

/// A level state (`rows × cols` floats at vector `base` of `states`) into shared memory in the
/// input dtype, rows `ld` apart: `hi = E(x)` and, with `split`, `lo = E(x − hi)` (≈ 16 mantissa
/// bits together). Four floats per access, every load of a unit issued before its first store
/// ([`load_level`]); returns the unit's vectors as read.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn read_level<E: Float>(
    states: &mut Tensor<Vector<f32, StateVec>>,
    hi: &mut Shared<[E]>,
    lo: &mut Shared<[E]>,
    base: usize,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] split: bool,
    #[comptime] threads: usize,
    #[comptime] vector_stores: bool,
) -> Array<Vector<f32, StateVec>> {
    let held = load_level(states, base, u, false, rows, cols, threads);
    store_level::<E>(
        &held,
        hi,
        lo,
        u,
        rows,
        cols,
        ld,
        split,
        threads,
        vector_stores,
    );
    held
}

/// This unit's vectors of one level state (`rows × cols` floats at vector `base` of `states`,
/// four per vector; trip `r` of unit `u` is vector `u + r·threads`), every load issued before
/// any is used; zero past the state's end, or everywhere with `skip`.
#[allow(clippy::too_many_arguments)]
#[cube]
fn load_level(
    states: &mut Tensor<Vector<f32, StateVec>>,
    base: usize,
    u: usize,
    skip: bool,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] threads: usize,
) -> Array<Vector<f32, StateVec>> {
    let total = comptime!(rows * cols / 4);
    let trips = comptime!(carry_len(rows, cols, threads));
    let mut held = Array::<Vector<f32, StateVec>>::new(trips);
    #[unroll]
    for r in 0..trips {
        let idx = u + r * threads;
        let mut x = Vector::<f32, StateVec>::zeroed();
        if idx < total && !skip {
            x = states[base + idx];
        }
        held[r] = x;
    }
    held
}

/// `hi[at..at + 4] = E(x)` and, with `split`, `lo[at..at + 4] = E(x − hi)`. With
/// `vector_stores` as vector conversions and stores (paired `bf16x2` conversions and one 8-byte
/// store each, where element by element they are four conversions, packing moves and 16-bit
/// stores: the hottest instructions of the causal backward, bench/RESULTS.md session 31); WGSL
/// cannot view a shared array as vectors, so the WGPU probe stores element by element. `at` is a
/// multiple of 4.
#[cube]
pub fn store_split<E: Float>(
    hi: &mut Shared<[E]>,
    lo: &mut Shared<[E]>,
    x: Vector<f32, StateVec>,
    at: usize,
    #[comptime] split: bool,
    #[comptime] vector_stores: bool,
) {
    if vector_stores {
        let h = Vector::<E, StateVec>::cast_from(x);
        let hi_v = hi
            .as_mut_slice()
            .as_vectorized_mut()
            .with_vector_size_mut::<StateVec>();
        hi_v[at / 4] = h;
        if split {
            let lo_v = lo
                .as_mut_slice()
                .as_vectorized_mut()
                .with_vector_size_mut::<StateVec>();
            lo_v[at / 4] =
                Vector::<E, StateVec>::cast_from(x - Vector::<f32, StateVec>::cast_from(h));
        }
    } else {
        #[unroll]
        for e in 0..4 {
            let xe = x.extract(e);
            let h = E::cast_from(xe);
            hi[at + e] = h;
            if split {
                lo[at + e] = E::cast_from(xe - f32::cast_from(h));
            }
        }
    }
}

/// How the causal kernels keep their level states: as a binary counter of chunks. Before chunk
/// `j`, the set bits of `j` are exactly the levels the chunk reads, and level `i`'s state is the
/// key half of its period (chunks `j & !(2^(i+1) − 1)` up to `2^i` on). Chunk `j` turns the
/// trailing ones of `j` (levels `0 … r−1`, all read by it) into bit `r`: level `r` becomes
/// `e^{γ_last} Σ_{i<r} scale_i U_i + KS_j`, written once, and the retired levels are dead until
/// a later carry rewrites them (so [`advance_scales`] with `REWRITES_CLEAR_BITS` stays right:
/// of the levels whose bit is clear only `r` is live, and its factor restarts at 1). Per chunk that is one level written instead of a
/// read-modify-write of every level whose bit is clear (half of them), and no extra reads: the
/// sum is taken from the reads the chunk makes anyway ([`read_level_carry`]). Forward 1.32×
/// faster at T = 8192 on the H100 (bench/RESULTS.md session 24).
///
/// Vectors of a level state held per unit for the carry (`nk × pt` floats, four per vector).
pub const fn carry_len(nk: usize, pt: usize, threads: usize) -> usize {
    (nk * pt / 4).div_ceil(threads)
}

/// [`read_level`] that also adds `f ·` the state to `carry` when `add` (each unit its own
/// vectors: trip `r` of unit `u` is vector `u + r·threads`, as in [`write_carry`]): the causal
/// kernels sum the levels a chunk reads and then retires (see [`carry_len`]).
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn read_level_carry<E: Float>(
    states: &mut Tensor<Vector<f32, StateVec>>,
    hi: &mut Shared<[E]>,
    lo: &mut Shared<[E]>,
    carry: &mut Array<Vector<f32, StateVec>>,
    f: f32,
    add: bool,
    base: usize,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] split: bool,
    #[comptime] threads: usize,
    #[comptime] vector_stores: bool,
) {
    let held = read_level::<E>(
        states,
        hi,
        lo,
        base,
        u,
        rows,
        cols,
        ld,
        split,
        threads,
        vector_stores,
    );
    if add {
        add_scaled(carry, &held, f, comptime!(carry_len(rows, cols, threads)));
    }
}

/// `acc += f · held`, vector by vector (`trips` of them).
#[cube]
fn add_scaled(
    acc: &mut Array<Vector<f32, StateVec>>,
    held: &Array<Vector<f32, StateVec>>,
    f: f32,
    #[comptime] trips: usize,
) {
    #[unroll]
    for r in 0..trips {
        let sum = acc[r] + held[r] * Vector::<f32, StateVec>::new(f);
        acc[r] = sum;
    }
}

/// `acc += f ·` one level state (`rows × cols` floats at vector `base` of `states`), four
/// floats per access, vectors mapped to units as in [`read_level_carry`] (trip `r` of unit `u`
/// is vector `u + r·threads`), every load issued before the first add.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn add_level(
    states: &mut Tensor<Vector<f32, StateVec>>,
    acc: &mut Array<Vector<f32, StateVec>>,
    f: f32,
    base: usize,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] threads: usize,
) {
    let held = load_level(states, base, u, false, rows, cols, threads);
    add_scaled(acc, &held, f, comptime!(carry_len(rows, cols, threads)));
}

/// Where carry vector `m` of unit `u` lies in an `nk × pt` level state with `compact_levels`, as
/// a flat row-major offset (a multiple of 4): trip `m / 2` covers the eight values from
/// `(u + (m / 2)·threads)·8` (one 16-byte access of a plane), and vector `m` is half `m % 2` of
/// them ([`planes_carry_len`]).
#[cube]
pub fn carry_offset(m: usize, u: usize, #[comptime] threads: usize) -> usize {
    (u + (m / 2) * threads) * 8 + (m % 2) * 4
}

/// `carry = stage` (the chunk's key state, f32, rows `ld` apart) in the carry's layout with
/// `compact_levels` ([`carry_offset`]): level 0 held in registers for the next chunk.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn hold_key_state(
    stage: &Shared<[f32]>,
    carry: &mut Array<Vector<f32, StateVec>>,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] threads: usize,
) {
    #[unroll]
    for m in 0..comptime!(planes_carry_len(rows, cols, threads)) {
        let flat = carry_offset(m, u, threads);
        if flat < comptime!(rows * cols) {
            let first = (flat / cols) * ld + flat % cols;
            let mut x = Vector::<f32, StateVec>::zeroed();
            #[unroll]
            for e in 0..4 {
                x.insert(e, stage[first + e]);
            }
            carry[m] = x;
        }
    }
}

/// The level held in `carry` ([`hold_key_state`]) into `hi` (shared, rows `ld` apart) as `E(x)`,
/// the product's operand as [`read_level_planes`] stores it, four values a store; then
/// `carry = f · carry`.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn store_held<E: Float>(
    carry: &mut Array<Vector<f32, StateVec>>,
    hi: &mut Shared<[E]>,
    f: f32,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] threads: usize,
) {
    let hi_v = hi
        .as_mut_slice()
        .as_vectorized_mut()
        .with_vector_size_mut::<StateVec>();
    #[unroll]
    for m in 0..comptime!(planes_carry_len(rows, cols, threads)) {
        let flat = carry_offset(m, u, threads);
        if flat < comptime!(rows * cols) {
            let x = carry[m];
            hi_v[((flat / cols) * ld + flat % cols) / 4] = Vector::<E, StateVec>::cast_from(x);
            carry[m] = x * Vector::<f32, StateVec>::new(f);
        }
    }
}

/// Input-dtype values per 16-byte access of a level plane (`compact_levels`).
pub type PlaneVec = Const<8>;

/// Vectors of the carry a unit holds with `compact_levels` (level planes): trip `r` covers plane
/// vector `u + r·threads` (eight values), carry vectors `2r` and `2r + 1`.
pub const fn planes_carry_len(nk: usize, pt: usize, threads: usize) -> usize {
    2 * (nk * pt / 8).div_ceil(threads)
}

/// One level state in planes (f32 vectors from `base`: the `hi` plane's `rows·cols/8` 16-byte
/// words, then the `lo` plane's) into `hi` (shared, rows `ld` apart) as it is, and with `add`
/// `carry += f · (hi + lo)` in f32. Every load is issued before the first store; `lo` is loaded
/// only with `add`. Two-byte input dtypes only (eight values a 16-byte word): the tensor-core
/// kernels take bf16.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn read_level_planes<E: Float>(
    states: &mut Tensor<Vector<f32, StateVec>>,
    hi: &mut Shared<[E]>,
    carry: &mut Array<Vector<f32, StateVec>>,
    f: f32,
    add: bool,
    base: usize,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] threads: usize,
) {
    let per_row = comptime!(cols / 8);
    let total = comptime!(rows * cols / 8);
    let trips = comptime!(total.div_ceil(threads));
    let mut hw = Array::<Vector<f32, StateVec>>::new(trips);
    let mut lw = Array::<Vector<f32, StateVec>>::new(trips);
    #[unroll]
    for r in 0..trips {
        let idx = u + r * threads;
        let mut h = Vector::<f32, StateVec>::zeroed();
        let mut l = Vector::<f32, StateVec>::zeroed();
        if idx < total {
            h = states[base + idx];
            if add {
                l = states[base + total + idx];
            }
        }
        hw[r] = h;
        lw[r] = l;
    }
    let hi_v = hi
        .as_mut_slice()
        .as_vectorized_mut()
        .with_vector_size_mut::<PlaneVec>();
    #[unroll]
    for r in 0..trips {
        let idx = u + r * threads;
        if idx < total {
            let h = Vector::<E, PlaneVec>::reinterpret(hw[r]);
            hi_v[((idx / per_row) * ld + (idx % per_row) * 8) / 8] = h;
            if add {
                let l = Vector::<E, PlaneVec>::reinterpret(lw[r]);
                #[unroll]
                for half in 0..2 {
                    let mut c = carry[2 * r + half];
                    #[unroll]
                    for e in 0..4 {
                        let x = f32::cast_from(h.extract(4 * half + e))
                            + f32::cast_from(l.extract(4 * half + e));
                        c.insert(e, c.extract(e) + f * x);
                    }
                    carry[2 * r + half] = c;
                }
            }
        }
    }
}

/// [`write_carry`] into planes: `x = f · carry +` the key state (`stage`, rows `ld` apart),
/// written as `hi = E(x)` and `lo = E(x − hi)`, each plane's eight values one 16-byte store.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn write_carry_planes<E: Float>(
    states: &mut Tensor<Vector<f32, StateVec>>,
    stage: &Shared<[f32]>,
    carry: &Array<Vector<f32, StateVec>>,
    f: f32,
    base: usize,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] threads: usize,
) {
    let per_row = comptime!(cols / 8);
    let total = comptime!(rows * cols / 8);
    let trips = comptime!(total.div_ceil(threads));
    #[unroll]
    for r in 0..trips {
        let idx = u + r * threads;
        if idx < total {
            let first = (idx / per_row) * ld + (idx % per_row) * 8;
            let mut hv = Vector::<E, PlaneVec>::zeroed();
            let mut lv = Vector::<E, PlaneVec>::zeroed();
            #[unroll]
            for half in 0..2 {
                let c = carry[2 * r + half];
                #[unroll]
                for e in 0..4 {
                    let x = c.extract(e) * f + stage[first + 4 * half + e];
                    let h = E::cast_from(x);
                    hv.insert(4 * half + e, h);
                    lv.insert(4 * half + e, E::cast_from(x - f32::cast_from(h)));
                }
            }
            states[base + idx] = Vector::<f32, StateVec>::reinterpret(hv);
            states[base + total + idx] = Vector::<f32, StateVec>::reinterpret(lv);
        }
    }
}

/// A state summed in registers by [`add_level`] into shared memory in the input dtype (rows `ld`
/// apart): `hi = E(x)` and, with `split`, `lo = E(x − hi)`, as [`read_level`] stores a level.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn store_level<E: Float>(
    acc: &Array<Vector<f32, StateVec>>,
    hi: &mut Shared<[E]>,
    lo: &mut Shared<[E]>,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] split: bool,
    #[comptime] threads: usize,
    #[comptime] vector_stores: bool,
) {
    let per_row = comptime!(cols / 4);
    let total = comptime!(rows * cols / 4);
    #[unroll]
    for r in 0..comptime!(carry_len(rows, cols, threads)) {
        let idx = u + r * threads;
        if idx < total {
            store_split::<E>(
                hi,
                lo,
                acc[r],
                (idx / per_row) * ld + (idx % per_row) * 4,
                split,
                vector_stores,
            );
        }
    }
}

/// The level a causal chunk writes (`rows × cols` floats at vector `base`): `f · carry + stage`
/// (`stage` rows `ld` apart), four floats per store, vectors mapped to units as in
/// [`read_level_carry`].
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn write_carry(
    states: &mut Tensor<Vector<f32, StateVec>>,
    stage: &Shared<[f32]>,
    carry: &Array<Vector<f32, StateVec>>,
    f: f32,
    base: usize,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
    #[comptime] threads: usize,
) {
    let per_row = comptime!(cols / 4);
    let total = comptime!(rows * cols / 4);
    let trips = comptime!(total.div_ceil(threads));
    #[unroll]
    for r in 0..trips {
        let idx = u + r * threads;
        if idx < total {
            let c = carry[r];
            let first = (idx / per_row) * ld + (idx % per_row) * 4;
            let mut x = Vector::<f32, StateVec>::zeroed();
            #[unroll]
            for e in 0..4 {
                x.insert(e, c.extract(e) * f + stage[first + e]);
            }
            states[base + idx] = x;
        }
    }
}

/// Drops levels `first .. first + count` (each `rows × cols` floats, level `i` at vector
/// `base + i · rows · cols / 4`) from L2 without writing them back (`discard.global.L2`, one
/// 128-byte line per unit and trip; CUDA only). A level a chunk retires is dead until a later
/// carry rewrites it, and every level is dead once the walk ends, but its dirty lines would still
/// be written to DRAM when L2 evicts them: in the forward at T = 2048 the level states were
/// about half of the DRAM traffic (bench/RESULTS.md session 36). Call it after a barrier that
/// follows every read of those levels. States are 512-byte aligned (CubeCL's CUDA allocator)
/// and a level is a whole number of lines.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn discard_levels(
    states: &mut Tensor<Vector<f32, StateVec>>,
    base: usize,
    first: usize,
    count: usize,
    u: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] threads: usize,
) {
    // Vectors of four floats: eight to a line.
    let level_vectors = comptime!(rows * cols / 4);
    comptime!(assert!(
        level_vectors % 8 == 0,
        "discard_levels: a level is whole 128-byte lines"
    ));
    let start = base + first * level_vectors;
    let lines = count * comptime!(level_vectors / 8);
    let mut line = u;
    while line < lines {
        let at = start + line * 8;
        let ptr = states.slice(at, at + 8).as_ptr();
        gpu_asm!("discard.global.L2 [{}], 128;", mem_in(_) ptr, options(explicit_mem));
        line += threads;
    }
}

/// Test probe of the vector-access helpers ([`load_rows`] with vectors, [`merge_level`],
/// [`read_level`], [`read_level_carry`] and [`write_carry`], [`add_level`] and [`store_level`])
/// in one cube: the tensor-core kernels that use them need `mma.sync`, which
/// software Vulkan lacks, so the probe lets CPU-only CI run the same helper code on f32.
/// `rows = chunk × cols` of `x: [1, seq, 1, width]` from (`t0`, `c0`), loaded with padded rows;
/// the level at `states[len..2·len]` (`len / cols` rows) merged with the first `len` loaded
/// values (factor `f`, `fresh` ≠ 0 starts it afresh); `level` = that level read back as
/// `hi + lo`; `carried` the first level rewritten from a carry; `summed` = `2 ·` the merged level
/// `− 0.25 ·` the first level as given, summed by `add_level` and read back from `store_level` as
/// `hi + lo`. `vector_stores` as in the tensor-core kernels where the device runs them (CUDA),
/// element stores elsewhere (WGSL cannot view a shared array as vectors).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub fn vector_helpers_probe_kernel<N: Size>(
    x: &Tensor<Vector<f32, N>>,
    states: &mut Tensor<Vector<f32, StateVec>>,
    rows: &mut Tensor<f32>,
    level: &mut Tensor<f32>,
    carried: &mut Tensor<f32>,
    summed: &mut Tensor<f32>,
    seq: usize,
    width: usize,
    t0: usize,
    c0: usize,
    f: f32,
    fresh: u32,
    #[comptime] chunk: usize,
    #[comptime] cols: usize,
    #[comptime] len: usize,
    #[comptime] vector_stores: bool,
) {
    let u = UNIT_POS_X as usize;
    // Rows padded as in the kernels: the helpers must honour the row stride.
    let ld = comptime!(row_len_input(cols));
    let rows_level = comptime!(len / cols);
    let mut buf = Shared::<[f32]>::new_aligned_slice(comptime!(chunk * ld), ALIGN);
    load_rows::<f32, N>(
        x,
        &mut buf,
        u,
        t0,
        c0,
        0,
        0,
        seq,
        1,
        width,
        chunk,
        cols,
        ld,
        THREADS,
        vector_stores,
    );
    sync_cube();
    let mut idx = u;
    while idx < comptime!(chunk * cols) {
        rows[idx] = buf[(idx / cols) * ld + idx % cols];
        idx += THREADS;
    }
    merge_level(
        states,
        &buf,
        comptime!(len / 4),
        f,
        fresh != 0,
        u,
        rows_level,
        cols,
        ld,
        THREADS,
    );
    sync_storage();
    let mut hi = Shared::<[f32]>::new_aligned_slice(comptime!(rows_level * ld), ALIGN);
    let mut lo = Shared::<[f32]>::new_aligned_slice(comptime!(rows_level * ld), ALIGN);
    read_level::<f32>(
        states,
        &mut hi,
        &mut lo,
        comptime!(len / 4),
        u,
        rows_level,
        cols,
        ld,
        true,
        THREADS,
        vector_stores,
    );
    sync_cube();
    read_back_split(&hi, &lo, level, u, len, cols, ld);
    sync_cube();
    // The carry: f·(merged level) + 0.5·(first level), a third read that must not add, then
    // the first level rewritten as 1.5·carry + the loaded rows.
    let mut carry =
        Array::<Vector<f32, StateVec>>::new(comptime!(carry_len(rows_level, cols, THREADS)));
    #[unroll]
    for r in 0..comptime!(carry_len(rows_level, cols, THREADS)) {
        carry[r] = Vector::<f32, StateVec>::zeroed();
    }
    read_level_carry::<f32>(
        states,
        &mut hi,
        &mut lo,
        &mut carry,
        f,
        true,
        comptime!(len / 4),
        u,
        rows_level,
        cols,
        ld,
        true,
        THREADS,
        vector_stores,
    );
    read_level_carry::<f32>(
        states,
        &mut hi,
        &mut lo,
        &mut carry,
        0.5f32,
        true,
        0usize,
        u,
        rows_level,
        cols,
        ld,
        false,
        THREADS,
        vector_stores,
    );
    read_level_carry::<f32>(
        states,
        &mut hi,
        &mut lo,
        &mut carry,
        7.0f32,
        false,
        0usize,
        u,
        rows_level,
        cols,
        ld,
        false,
        THREADS,
        vector_stores,
    );
    // The anticausal kernel's level sum: two levels added in registers, stored split. Each unit
    // writes the shared cells its own reads above wrote (same vectors), so no barrier before.
    let mut sum =
        Array::<Vector<f32, StateVec>>::new(comptime!(carry_len(rows_level, cols, THREADS)));
    #[unroll]
    for r in 0..comptime!(carry_len(rows_level, cols, THREADS)) {
        sum[r] = Vector::<f32, StateVec>::zeroed();
    }
    add_level(
        states,
        &mut sum,
        2.0f32,
        comptime!(len / 4),
        u,
        rows_level,
        cols,
        THREADS,
    );
    add_level(
        states, &mut sum, -0.25f32, 0usize, u, rows_level, cols, THREADS,
    );
    store_level::<f32>(
        &sum,
        &mut hi,
        &mut lo,
        u,
        rows_level,
        cols,
        ld,
        true,
        THREADS,
        vector_stores,
    );
    sync_cube();
    read_back_split(&hi, &lo, summed, u, len, cols, ld);
    sync_storage();
    write_carry(
        states, &buf, &carry, 1.5f32, 0usize, u, rows_level, cols, ld, THREADS,
    );
    sync_storage();
    idx = u;
    while idx < comptime!(len / 4) {
        let x = states[idx];
        #[unroll]
        for e in 0..4usize {
            carried[idx * 4 + e] = x.extract(e);
        }
        idx += THREADS;
    }
}

/// `out[e] = hi + lo` at element `e` of a `len`-float state stored split with rows `ld` apart
/// (the probe's read-back).
#[cube]
fn read_back_split(
    hi: &Shared<[f32]>,
    lo: &Shared<[f32]>,
    out: &mut Tensor<f32>,
    u: usize,
    #[comptime] len: usize,
    #[comptime] cols: usize,
    #[comptime] ld: usize,
) {
    let mut idx = u;
    while idx < len {
        let at = (idx / cols) * ld + idx % cols;
        out[idx] = hi[at] + lo[at];
        idx += THREADS;
    }
}
