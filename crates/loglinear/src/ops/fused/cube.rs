//! The scalar forward kernel (launched from `launch.rs`) and the helpers every kernel shares.
//!
//! [`causal_kernel`] computes `out[t] = Σ_{s≤t} λ[t, ℓ(t,s)] e^{Γt−Γs} (a_t·b_s) c_s` wherever the
//! tensor-core forward does not run (f32 and f16 inputs, key widths that are no multiple of 16,
//! devices without `cmma`). It walks the sequence chunk by chunk inside one cube per
//! (batch·head, value tile), so every input is read once and the O(log T) level states never
//! leave the cube's reach between chunks.
//!
//! Chunk `j` (of `C` tokens) sees earlier chunks through chunk levels `i ≥ 1` (token level
//! `log2 C + i`): the pairs of chunk level `i` are keys in the first half and queries in the
//! second half of an aligned period of `2^i` chunks. One accumulator per chunk level holds the
//! current period's key half as an `nk × pt` state in a global scratch buffer (L2-resident at
//! best; keeping them in shared memory forced narrow tiles and one cube per multiprocessor, 1.2–1.6×
//! slower on the H200, bench/RESULTS.md session 2), with a lazy decay factor per level in shared memory (a
//! multiply per chunk instead of a pass over the state). Decays are exponentials of in-chunk
//! cumulative sums and of per-chunk totals only, never of long differences. See
//! `ops/fused/README.md` for the derivation.

use cubecl::prelude::*;

/// Units per cube of every kernel but the tensor-core backward pair.
pub const THREADS: usize = 256;

/// Units per cube of the tensor-core backward pair. Their shared memory (150–185 KB) leaves room
/// for one cube per multiprocessor, so with 256 units each scheduler had two warps to choose
/// from and issued in under a third of its cycles (Nsight Compute on the H200, bench/RESULTS.md
/// session 22); 512 units double the warps at the same shared memory.
pub const TC_BACKWARD_THREADS: usize = 512;

/// The compile-time sizes of one launch, shared by every kernel: a kernel is compiled once per
/// geometry (the planner in `launch.rs` chooses `chunk` and `pt`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Geometry {
    /// Tokens per chunk (16, 32 or 64).
    pub chunk: usize,
    /// Key width `N` (of `q`, `k`).
    pub nk: usize,
    /// Value columns per cube (16, 32 or 64); a launch has `ceil(P / pt)` value tiles.
    pub pt: usize,
    /// λ slots per token (`L`).
    pub levels: usize,
    /// Level states a cube keeps: the chunk levels of the sequence (for Mamba-2, one state once
    /// there is an earlier chunk).
    pub nlev: usize,
    /// Units per cube ([`THREADS`], or [`TC_BACKWARD_THREADS`] for the tensor-core backward), a
    /// multiple of 32.
    pub threads: usize,
    /// Whether the value width is split over several cubes (`P > pt`). `dq` and `dk` are then
    /// sums of per-tile partials, each from its own rounded weights, and partials that cancel
    /// amplify the rounding: the tensor-core backward splits their operands in two only then.
    pub tiled: bool,
    /// How the tensor-core forward keeps its level states (set by the launcher for whole walks
    /// of the log-linear op, [`super::launch::compact_levels`]; Mamba-2's one state and walks
    /// in segments keep f32 levels): level 0 — an even chunk's key state alone, which the next
    /// chunk reads and retires — stays in the carry's registers across the chunk boundary and
    /// is never written; every other level is two input-dtype planes in its f32 slot,
    /// `hi = E(x)` then `lo = E(x − hi)` (together `x` to about 2⁻¹⁶): a level read only for
    /// the product loads `hi`, the operand the product rounds to anyway (half the bytes, no
    /// conversion); a level the chunk retires loads both and adds `hi + lo` to the carry in f32
    /// (`tensor_core::read_level_planes`). Forward −6.6 % at T = 2048 and −8.9 % at 8192 on an
    /// H100 (bench/RESULTS.md session 42).
    pub compact_levels: bool,
}

/// Number of bits of `x` (`bitlen(0) = 0`), the level of a pair at distance pattern `x = t ^ s`.
#[cube]
pub fn bitlen(x: usize) -> usize {
    // One count-leading-zeros instruction: the weights of every chunk pair and the in-chunk dλ
    // sums take it per element, where a shift loop cost a data-dependent branch per bit.
    usize::cast_from(32u32 - u32::cast_from(x).leading_zeros())
}

/// Number of trailing one bits of `j`: the level into which causal chunk `j` carries the levels
/// it retires (see `tensor_core::carry_len`).
#[cube]
pub fn trailing_ones(j: usize) -> usize {
    let mut ones = 0usize;
    while (j >> ones) & 1 == 1 {
        ones += 1;
    }
    ones
}

/// The chunks a cube walks: `seg_chunks` from token `t_start` on, fewer where the sequence of
/// `seq` tokens ends first.
///
/// Every kernel of the op walks one row of a grid of `batch·segments·heads` cubes: the whole
/// sequence where `segments` is 1 (`seg_chunks` ≥ its chunks), else aligned segments of
/// `seg_chunks` chunks (a power of two), each its own cube, so that a few long sequences still
/// fill the card. A segment reads the levels above its own from states written before the
/// launch (the pairs across segments, `segments.rs`); its chunks index those levels by their
/// place in the whole sequence (`jg = seg·seg_chunks + j`), so the level structure is the one
/// launch's.
#[cube]
pub fn segment_chunks(
    seq: usize,
    t_start: usize,
    seg_chunks: usize,
    #[comptime] chunk: usize,
) -> usize {
    let left = (seq - t_start).div_ceil(chunk);
    let mut n = seg_chunks;
    if left < n {
        n = left;
    }
    n
}

/// Cube row `bh` of the grid's `batch·segments·heads` rows (see [`segment_chunks`]): its sequence
/// `bi`, segment `seg`, head `h` and the segment's first token `t_start`, as
/// `(bi, seg, h, t_start)`.
#[cube]
pub fn walk_row(
    bh: usize,
    heads: usize,
    segments: usize,
    seg_chunks: usize,
    #[comptime] chunk: usize,
) -> (usize, usize, usize, usize) {
    let seg = (bh / heads) % segments;
    (
        bh / heads / segments,
        seg,
        bh % heads,
        seg * seg_chunks * chunk,
    )
}

/// The chunk levels inside a segment of `seg_chunks` chunks (all `nlev` in one launch): the
/// anticausal kernels clear and update these, and only read the levels above.
#[cube]
pub fn own_levels(seg_chunks: usize, #[comptime] nlev: usize) -> usize {
    let mut own = bitlen(seg_chunks - 1);
    if own > nlev {
        own = nlev;
    }
    own
}

/// Flat offset of token `t` of (batch `b`, head `h`) in a `[B, T, H, width]` tensor.
#[cube]
pub fn row(b: usize, t: usize, h: usize, seq: usize, heads: usize, width: usize) -> usize {
    ((b * seq + t) * heads + h) * width
}

/// Loads a chunk's `a` rows (padded to `nk + 1`) and `b` transposed (rows of `kt_stride`) into
/// shared memory as f32 (zero past the end of the sequence), then its λ and decays
/// ([`load_decays`]). Ends with a barrier, so every shared buffer written before the call (the
/// value tile) is visible too.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn load_chunk<E: Float, G: Float>(
    a: &Tensor<E>,
    b: &Tensor<E>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    qs: &mut Shared<[f32]>,
    kt: &mut Shared<[f32]>,
    lam: &mut Shared<[f32]>,
    graw: &mut Shared<[f32]>,
    gam: &mut Shared<[f32]>,
    kd: &mut Shared<[f32]>,
    eg: &mut Shared<[f32]>,
    u: usize,
    t0: usize,
    bi: usize,
    h: usize,
    seq: usize,
    heads: usize,
    #[comptime] chunk: usize,
    #[comptime] kt_stride: usize,
    #[comptime] nk: usize,
    #[comptime] levels: usize,
) {
    let qs_stride = comptime!(nk + 1);
    let mut idx = u;
    while idx < comptime!(chunk * nk) {
        let i = idx / nk;
        let n = idx % nk;
        let t = t0 + i;
        let mut av = 0.0f32;
        let mut bv = 0.0f32;
        if t < seq {
            let off = row(bi, t, h, seq, heads, nk) + n;
            av = f32::cast_from(a[off]);
            bv = f32::cast_from(b[off]);
        }
        qs[i * qs_stride + n] = av;
        kt[n * kt_stride + i] = bv;
        idx += THREADS;
    }
    load_decays::<G>(
        g, lambda, lam, graw, gam, kd, eg, u, t0, bi, h, seq, heads, chunk, levels, THREADS, false,
    );
}

/// Loads a chunk's λ (`[chunk, levels]`, zero past the end of the sequence) and `g`, then its
/// decays: `γ` (in-chunk inclusive cumsum of `g`), `kd = e^{γ_last − γ}` and `eg = e^{γ}`. Ends
/// with a barrier, so every shared buffer written before the call is visible too. With
/// `plane_scan` (the tensor-core kernels: CUDA planes of 32, chunks of 32 or 64) the cumsum is
/// a plane scan; the scalar kernels also run on WGPU, whose plane width varies (8 on lavapipe),
/// and sum serially.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn load_decays<G: Float>(
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    lam: &mut Shared<[f32]>,
    graw: &mut Shared<[f32]>,
    gam: &mut Shared<[f32]>,
    kd: &mut Shared<[f32]>,
    eg: &mut Shared<[f32]>,
    u: usize,
    t0: usize,
    bi: usize,
    h: usize,
    seq: usize,
    heads: usize,
    #[comptime] chunk: usize,
    #[comptime] levels: usize,
    #[comptime] threads: usize,
    #[comptime] plane_scan: bool,
) {
    // Every load of a unit (its λ entries and its `g`) is issued before its first store: a loop
    // of load-then-store trips waited on global memory once per trip (the causal backward's
    // λ loads and their widening took about 4 % of its stall samples that way: session 31's
    // Nsight Compute source page, bench/RESULTS.md session 35).
    let total = comptime!(chunk * levels);
    let trips = comptime!(total.div_ceil(threads));
    let mut held = Array::<G>::new(trips);
    #[unroll]
    for r in 0..trips {
        let idx = u + r * threads;
        let t = t0 + idx / levels;
        let mut lv = G::cast_from(0.0f32);
        if idx < total && t < seq {
            lv = lambda[row(bi, t, h, seq, heads, levels) + idx % levels];
        }
        held[r] = lv;
    }
    let mut gv = G::cast_from(0.0f32);
    if u < chunk && t0 + u < seq {
        gv = g[(bi * seq + t0 + u) * heads + h];
    }
    #[unroll]
    for r in 0..trips {
        let idx = u + r * threads;
        if idx < total {
            lam[idx] = f32::cast_from(held[r]);
        }
    }
    if u < chunk {
        graw[u] = f32::cast_from(gv);
    }
    sync_cube();
    if u < chunk {
        if plane_scan {
            // The first `chunk` units take their prefix and the total with plane scans: a
            // plane's inclusive sum plus the totals of the planes before it. No serial pass over
            // the chunk (a loop of `chunk` dependent shared reads that every unit waited for).
            comptime!(assert!(
                chunk.is_multiple_of(32),
                "load_decays: plane scans need whole planes"
            ));
            let lane = u % 32;
            let mut prefix = plane_inclusive_sum(graw[u]);
            let mut total = 0.0f32;
            #[unroll]
            for p in 0..comptime!(chunk / 32) {
                let plane_total = plane_sum(graw[p * 32 + lane]);
                total += plane_total;
                if p < u / 32 {
                    prefix += plane_total;
                }
            }
            gam[u] = prefix;
            kd[u] = (total - prefix).exp();
            eg[u] = prefix.exp();
        } else {
            // Each of the first `chunk` units sums its own prefix (and the total): no serial
            // section, one barrier.
            let mut prefix = 0.0f32;
            let mut total = 0.0f32;
            for i in 0..chunk {
                let gi = graw[i];
                total += gi;
                if i <= u {
                    prefix += gi;
                }
            }
            gam[u] = prefix;
            kd[u] = (total - prefix).exp();
            eg[u] = prefix.exp();
        }
    }
    sync_cube();
}

/// Which level states a chunk rewrites, for [`advance_scales`].
pub const REWRITES_CLEAR_BITS: u32 = 0;
/// The anticausal kernels: levels whose bit of the chunk index is set (and that exist).
pub const REWRITES_SET_BITS: u32 = 1;
/// Mamba-2's single state: rewritten by every chunk.
pub const REWRITES_ALL: u32 = 2;

/// Advances the lazy decay factors past chunk `j`: a level whose state the chunk rewrote is
/// referenced to the chunk's end again (factor 1), the others decay by the chunk's total
/// `e^{γ_last}`. Causal kernels rewrite the levels whose bit of `j` is clear, anticausal ones
/// those whose bit is set. The caller's next barrier publishes the factors.
#[allow(clippy::too_many_arguments)]
#[cube]
pub fn advance_scales(
    scale: &mut Shared<[f32]>,
    eg: &Shared<[f32]>,
    u: usize,
    j: usize,
    #[comptime] chunk: usize,
    #[comptime] levels: usize,
    #[comptime] nlev: usize,
    #[comptime] rewrites: u32,
) {
    if u < nlev {
        let log_c = comptime!(chunk.trailing_zeros() as usize);
        let mut rewritten = (j >> u) & 1 == 0;
        if rewrites == REWRITES_SET_BITS {
            rewritten = (j >> u) & 1 == 1 && log_c + u + 1 < levels;
        }
        if rewrites == REWRITES_ALL {
            rewritten = true;
        }
        if rewritten {
            scale[u] = 1.0f32;
        } else {
            scale[u] *= eg[comptime!(chunk - 1)];
        }
    }
}

/// The forward op (with `single`, Mamba-2: λ ignored, one state read and rewritten by every
/// chunk, as in the tensor-core kernel).
///
/// Shapes: `a, b: [B, T, H, nk]`, `c: [B, T, H, width]` (dtype `E`), `g: [B, T, H]`,
/// `lambda: [B, T, H, levels]` (dtype `G`, f32 under mixed precision), all contiguous;
/// `out: [B, T, H, width]` (dtype `E`, rounded once from the f32 accumulator); `states`:
/// `tiles·B·H·nlev·nk·pt` f32 scratch. Grid `(B·H, tiles)`, [`THREADS`] units.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub fn causal_kernel<E: Float, G: Float>(
    a: &Tensor<E>,
    b: &Tensor<E>,
    c: &Tensor<E>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    out: &mut Tensor<E>,
    states: &mut Tensor<f32>,
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
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let (bi, seg, h, t_start) = walk_row(bh, heads, segments, seg_chunks, chunk);
    let u = UNIT_POS_X as usize;
    let p0 = tile * pt;
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    let qs_stride = comptime!(nk + 1);
    let rstep = comptime!(THREADS / pt);
    let rows_out = comptime!(chunk / (THREADS / pt));
    let rows_state = comptime!(nk.div_ceil(THREADS / pt));
    let sj = comptime!(THREADS / chunk);
    let per_row = comptime!(chunk * chunk / THREADS);
    let level_size = comptime!(nk * pt);
    let state_base = (tile * batch * segments * heads + bh) * comptime!(nlev.max(1) * nk * pt);

    let mut qs = Shared::<[f32]>::new_slice(comptime!(chunk * (nk + 1)));
    let mut kt = Shared::<[f32]>::new_slice(comptime!(nk * chunk));
    let mut vs = Shared::<[f32]>::new_slice(comptime!(chunk * pt));
    let mut sc = Shared::<[f32]>::new_slice(comptime!(chunk * chunk));
    let mut lam = Shared::<[f32]>::new_slice(comptime!(chunk * levels));
    let mut graw = Shared::<[f32]>::new_slice(chunk);
    let mut gam = Shared::<[f32]>::new_slice(chunk);
    let mut kd = Shared::<[f32]>::new_slice(chunk);
    let mut eg = Shared::<[f32]>::new_slice(chunk);
    let mut scale = Shared::<[f32]>::new_slice(comptime!(nlev.max(1)));

    if u < nlev {
        scale[u] = 1.0f32;
    }
    let pc = u % pt;
    let rbase = u / pt;
    let n_chunks = segment_chunks(seq, t_start, seg_chunks, chunk);

    for j in 0..n_chunks {
        let t0 = t_start + j * chunk;
        // The chunk's index in the whole sequence: its bits say which levels it reads.
        let jg = seg * seg_chunks + j;
        // (1) Load the chunk (the value tile here, the rest in `load_chunk`) and (2) its decays.
        let mut idx = u;
        while idx < comptime!(chunk * pt) {
            let i = idx / pt;
            let p = p0 + idx % pt;
            let t = t0 + i;
            let mut cv = 0.0f32;
            if t < seq && p < width {
                cv = f32::cast_from(c[row(bi, t, h, seq, heads, width) + p]);
            }
            vs[idx] = cv;
            idx += THREADS;
        }
        load_chunk::<E, G>(
            a, b, g, lambda, &mut qs, &mut kt, &mut lam, &mut graw, &mut gam, &mut kd, &mut eg, u,
            t0, bi, h, seq, heads, chunk, chunk, nk, levels,
        );
        // (3) Intra-chunk scores, causal: (a_i·b_j) e^{γi−γj} λ[i, ℓ(i,j)].
        let si = u / sj;
        #[unroll]
        for r in 0..per_row {
            let sjj = u % sj + r * sj;
            let mut s = 0.0f32;
            if sjj <= si {
                for n in 0..nk {
                    s += qs[si * qs_stride + n] * kt[n * chunk + sjj];
                }
                s *= (gam[si] - gam[sjj]).exp();
                let lvl = bitlen(si ^ sjj);
                if single {
                    // Mamba-2: every pair weighs 1.
                } else if lvl < levels {
                    s *= lam[si * levels + lvl];
                } else {
                    s = 0.0f32;
                }
            }
            sc[si * chunk + sjj] = s;
        }
        sync_cube();

        let mut acc = Array::<f32>::new(rows_out);
        #[unroll]
        for r in 0..rows_out {
            acc[r] = 0.0f32;
        }
        // (4) In-chunk output: scores × values.
        for jj in 0..chunk {
            let cv = vs[jj * pt + pc];
            #[unroll]
            for r in 0..rows_out {
                acc[r] += sc[(rbase + r * rstep) * chunk + jj] * cv;
            }
        }
        // (5) Earlier chunks: chunk level i is read when chunk j is in the second half of its
        // period of 2^i chunks (bit i−1 of j set); the state holds the first half, decayed to
        // the end of chunk j−1 (times the lazy factor scale[i−1]).
        for lvi in 0..nlev {
            let token_level = log_c + lvi + 1;
            let mut read = (jg >> lvi) & 1 == 1 && token_level < levels;
            if single {
                read = j > 0;
            }
            if read {
                let base = state_base + lvi * level_size;
                let mut tmp = Array::<f32>::new(rows_out);
                #[unroll]
                for r in 0..rows_out {
                    tmp[r] = 0.0f32;
                }
                for n in 0..nk {
                    let z = states[base + n * pt + pc];
                    #[unroll]
                    for r in 0..rows_out {
                        tmp[r] += qs[(rbase + r * rstep) * qs_stride + n] * z;
                    }
                }
                let f = scale[lvi];
                #[unroll]
                for r in 0..rows_out {
                    let i = rbase + r * rstep;
                    let mut w = f * eg[i];
                    if !single {
                        w *= lam[i * levels + token_level];
                    }
                    acc[r] += tmp[r] * w;
                }
            }
        }
        // (6) Outputs.
        #[unroll]
        for r in 0..rows_out {
            let t = t0 + rbase + r * rstep;
            let p = p0 + pc;
            if t < seq && p < width {
                out[row(bi, t, h, seq, heads, width) + p] = E::cast_from(acc[r]);
            }
        }
        // (7) This chunk's key state Σ_i e^{γlast−γi} b_i c_iᵀ and the levels the chunk
        // retires become one level. A level is never read and rewritten by one chunk — but
        // Mamba-2's single state is, so every unit must have read it before any rewrites it.
        if single {
            sync_cube();
        }
        if nlev > 0 {
            let mut ks = Array::<f32>::new(rows_state);
            #[unroll]
            for r in 0..rows_state {
                ks[r] = 0.0f32;
            }
            for i in 0..chunk {
                let cv = vs[i * pt + pc] * kd[i];
                #[unroll]
                for r in 0..rows_state {
                    let n = rbase + r * rstep;
                    if n < nk {
                        ks[r] += kt[n * chunk + i] * cv;
                    }
                }
            }
            let chunk_decay = eg[comptime!(chunk - 1)];
            if single {
                let f = scale[0] * chunk_decay;
                #[unroll]
                for r in 0..rows_state {
                    let n = rbase + r * rstep;
                    if n < nk {
                        let e = state_base + n * pt + pc;
                        let mut old = 0.0f32;
                        if j > 0 {
                            old = states[e] * f;
                        }
                        states[e] = old + ks[r];
                    }
                }
            } else {
                // The levels of the trailing ones of j (all read above) and this chunk's state
                // become level `ones`; no other level changes (see `tensor_core::carry_len`).
                // Counted on the index in the whole sequence: level `ones` then has its bit of
                // `jg` clear, so no unit of this chunk reads it. (The index in a segment can
                // name a level across segments that this chunk reads: a race.)
                let ones = trailing_ones(jg);
                if ones < nlev && log_c + ones + 1 < levels {
                    #[unroll]
                    for r in 0..rows_state {
                        let n = rbase + r * rstep;
                        if n < nk {
                            let e = n * pt + pc;
                            let mut sum = 0.0f32;
                            for lvi in 0..ones {
                                sum += states[state_base + lvi * level_size + e] * scale[lvi];
                            }
                            states[state_base + ones * level_size + e] = sum * chunk_decay + ks[r];
                        }
                    }
                }
            }
        }
        sync_storage();
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
}
