//! The states across segments, for launches that walk long sequences in aligned segments
//! (launched from `launch.rs`; the walk itself is in every kernel, see
//! [`segment_chunks`](super::cube::segment_chunks)).
//!
//! A cube that walks segment `j` of `S = 2^m` chunks keeps its own levels `0 .. m` as one launch
//! does, but the levels above are the pairs across segments: chunk level `m + i` (token level
//! `log2 C + m + i + 1`) pairs the key half of an aligned period of `2^(i+1)` segments with its
//! query half (`ops/README.md`). Within one segment such a level never changes but for its decay,
//! so it is computed before the launch, from one small state per segment:
//!
//! ```text
//! c_j     = Σ_{s in j} g_s                                     (segment_key_states_kernel)
//! KS_j    = Σ_{s in j} e^{c_j − γ_s} k_s v_sᵀ                   γ: inclusive cumsum inside j
//! QS_j,i  = Σ_{t in j} λ[t, ℓ_i] e^{γ_t} q_t dO_tᵀ              (segment_query_states_kernel)
//! R_j,i   = Σ_{j' in key half}   e^{c_{j'+1} + … + c_{j−1}} KS_j'     bit i of j set
//! D_j,i   = Σ_{j' in query half} e^{c_{j+1} + … + c_{j'−1}} QS_j',i   bit i of j clear
//! ```
//!
//! (`across_states_kernel`). `R` is the causal kernels' level `m + i` at the start of segment
//! `j` (read when bit `i` of `j` is set, decayed chunk by chunk by their lazy factors); `D` is
//! the anticausal kernels' level `m + i` at the end of segment `j` (read when the bit is clear).
//! Every exponent is a sum of log-decays (≤ 0). With `R` and `D` every kernel computes its
//! outputs and gradients over all pairs — inside and across segments — and `dΓ`'s identity
//! `Σ_ℓ λ dλ − v·dv` holds per token as in one launch.
//!
//! These three kernels are plain f32 code (no tensor cores): each (segment, value tile) is one
//! cube whose units own `4 × nb` blocks of the `nk × pt` state. Their work is one product per
//! segment for `KS` and one per segment and level for `QS`.

use cubecl::prelude::*;

use super::cube::{Geometry, THREADS, load_decays, row, segment_chunks, walk_row};
use super::tensor_core::{
    ALIGN, FULL, SPLIT_B, load_rows, row_len_f32, row_len_input, tile_matmul,
};

/// Value columns per unit block of the state kernels (a value tile is 16, 32 or 64 wide).
const BLOCK_COLS: usize = 4;

/// Key rows per unit block for key width `nk` and value tile `pt`.
pub const fn block_rows(nk: usize, pt: usize) -> usize {
    let groups = THREADS / (pt / BLOCK_COLS);
    nk.div_ceil(groups)
}

/// State elements per unit of [`across_states_kernel`].
const fn elements_per_unit(nk: usize, pt: usize) -> usize {
    (nk * pt).div_ceil(THREADS)
}

/// `out[(n, p)] = Σ_s w_s a_s[n] b_s[p]` over the tokens of one segment, with the weights of
/// `key`: `KS_j` (`a = k`, `b = v`, `w_s = e^{c_j − γ_s}`) and the segment's total log-decay
/// `c_j`; else `QS_j,i` (`a = q`, `b = dO`, `w_t = λ[t, ℓ_i] e^{γ_t}`) for level `i =
/// CUBE_POS_Z` above the segment's own `own` levels, only where segment `j` reads it across
/// (bit `i` of `j` set: its queries pair with the key half of the period).
///
/// Shapes: `a: [B, T, H, nk]`, `b: [B, T, H, width]` (dtype `E`), `g: [B, T, H]`, `lambda:
/// [B, T, H, levels]` (dtype `G`); `out: [tiles, B·segments, H, I, nk, pt]` f32 (`I = 1` for
/// `key`); `totals: [B·segments, H]` f32 (written with `key` only). Grid `(B·segments·H, tiles,
/// I)`, [`THREADS`] units.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub fn segment_states_kernel<E: Float, G: Float>(
    a: &Tensor<E>,
    b: &Tensor<E>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    out: &mut Tensor<f32>,
    totals: &mut Tensor<f32>,
    batch: usize,
    seq: usize,
    heads: usize,
    width: usize,
    segments: usize,
    seg_chunks: usize,
    own: usize,
    #[comptime] geo: Geometry,
    #[comptime] key: bool,
    #[define(E, G)] _dtypes: [ElemType; 2],
) {
    let (chunk, nk, pt, levels) = comptime!((geo.chunk, geo.nk, geo.pt, geo.levels));
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let level = CUBE_POS_Z as usize;
    let per_level = CUBE_COUNT_Z as usize;
    let (bi, seg, h, t_start) = walk_row(bh, heads, segments, seg_chunks, chunk);
    let u = UNIT_POS_X as usize;
    let p0 = tile * pt;
    let token_level = log_c + own + level + 1;
    let mut active = true;
    if !key {
        active = (seg >> level) & 1 == 1 && token_level < levels;
    }
    let pbk = comptime!(pt / BLOCK_COLS);
    let groups = comptime!(THREADS / (pt / BLOCK_COLS));
    let nb = comptime!(block_rows(nk, pt));
    let pb = u % pbk;
    let ng = u / pbk;
    let mut sa = Shared::<[f32]>::new_slice(comptime!(chunk * nk));
    let mut sb = Shared::<[f32]>::new_slice(comptime!(chunk * pt));
    let mut lam = Shared::<[f32]>::new_slice(comptime!(chunk * levels));
    let mut graw = Shared::<[f32]>::new_slice(chunk);
    let mut gam = Shared::<[f32]>::new_slice(chunk);
    let mut kd = Shared::<[f32]>::new_slice(chunk);
    let mut eg = Shared::<[f32]>::new_slice(chunk);
    let mut acc = Array::<f32>::new(comptime!(block_rows(nk, pt) * BLOCK_COLS));
    #[unroll]
    for r in 0..comptime!(block_rows(nk, pt) * BLOCK_COLS) {
        acc[r] = 0.0f32;
    }
    // e^{γ} at the start of the chunk (query states), the segment's log-decay so far (key).
    let mut offset = 1.0f32;
    let mut log_total = 0.0f32;
    let mut n_chunks = segment_chunks(seq, t_start, seg_chunks, chunk);
    // A cube with nothing to compute walks no chunk (uniform over the cube: its barriers
    // are all reached or all skipped, as WGSL requires) and writes nothing.
    if !active {
        n_chunks = 0;
    }
    for j in 0..n_chunks {
        let t0 = t_start + j * chunk;
        let mut idx = u;
        while idx < comptime!(chunk * nk) {
            let t = t0 + idx / nk;
            let mut x = 0.0f32;
            if t < seq {
                x = f32::cast_from(a[row(bi, t, h, seq, heads, nk) + idx % nk]);
            }
            sa[idx] = x;
            idx += THREADS;
        }
        // The chunk's decays (γ in-chunk: `kd = e^{total − γ}`, `eg = e^{γ}`) and λ; ends with
        // a barrier that also publishes `sa`.
        load_decays::<G>(
            g, lambda, &mut lam, &mut graw, &mut gam, &mut kd, &mut eg, u, t0, bi, h, seq, heads,
            chunk, levels, THREADS, false,
        );
        // Per-token weights: e^{total − γ} (key), λ e^{offset + γ} (query).
        idx = u;
        while idx < comptime!(chunk * pt) {
            let i = idx / pt;
            let t = t0 + i;
            let p = p0 + idx % pt;
            let mut w = kd[i];
            if !key {
                w = lam[i * levels + token_level] * offset * eg[i];
            }
            let mut x = 0.0f32;
            if t < seq && p < width {
                x = f32::cast_from(b[row(bi, t, h, seq, heads, width) + p]) * w;
            }
            sb[idx] = x;
            idx += THREADS;
        }
        let total = gam[comptime!(chunk - 1)];
        sync_cube();
        if key {
            // Earlier chunks decay through this one.
            let d = total.exp();
            #[unroll]
            for r in 0..comptime!(block_rows(nk, pt) * BLOCK_COLS) {
                acc[r] *= d;
            }
        }
        for i in 0..chunk {
            let mut bv = Array::<f32>::new(BLOCK_COLS);
            #[unroll]
            for c in 0..BLOCK_COLS {
                bv[c] = sb[i * pt + pb * BLOCK_COLS + c];
            }
            #[unroll]
            for rn in 0..nb {
                let n = ng + rn * groups;
                let mut av = 0.0f32;
                if n < nk {
                    av = sa[i * nk + n];
                }
                #[unroll]
                for c in 0..BLOCK_COLS {
                    acc[rn * BLOCK_COLS + c] += av * bv[c];
                }
            }
        }
        offset *= total.exp();
        log_total += total;
        sync_cube();
    }
    let base = ((tile * batch * segments + bh / heads) * heads + h) * per_level + level;
    #[unroll]
    for rn in 0..nb {
        let n = ng + rn * groups;
        if active && n < nk {
            #[unroll]
            for c in 0..BLOCK_COLS {
                out[(base * nk + n) * pt + pb * BLOCK_COLS + c] = acc[rn * BLOCK_COLS + c];
            }
        }
    }
    if key && tile == 0 && u == 0 {
        totals[bh] = log_total;
    }
}

/// [`segment_states_kernel`] on tensor cores (bf16 inputs, widths multiples of 16): per chunk one
/// product `aᵀ (w ⊙ b)` (`nk × C × pt`, the weighted operand split in two, `hi + lo`, as the
/// kernels' own state products: the states feed `dλ` and `dv`, whose `dg` needs ≈ 16 mantissa
/// bits), staged in f32 and added to the unit's share of the state in registers (decayed first
/// with `key`). Same outputs, shapes and grid as [`segment_states_kernel`], `geo.threads` units.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub fn segment_states_tc_kernel<E: Float, G: Float, N: Size>(
    a: &Tensor<Vector<E, N>>,
    b: &Tensor<Vector<E, N>>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    out: &mut Tensor<f32>,
    totals: &mut Tensor<f32>,
    batch: usize,
    seq: usize,
    heads: usize,
    width: usize,
    segments: usize,
    seg_chunks: usize,
    own: usize,
    #[comptime] geo: Geometry,
    #[comptime] key: bool,
    #[define(E, G)] _dtypes: [ElemType; 2],
) {
    let (chunk, nk, pt, levels) = comptime!((geo.chunk, geo.nk, geo.pt, geo.levels));
    let (threads, planes) = comptime!((geo.threads, geo.threads / 32));
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let level = CUBE_POS_Z as usize;
    let per_level = CUBE_COUNT_Z as usize;
    let (bi, seg, h, t_start) = walk_row(bh, heads, segments, seg_chunks, chunk);
    let u = UNIT_POS_X as usize;
    let plane = u / 32;
    let p0 = tile * pt;
    let token_level = log_c + own + level + 1;
    let mut active = true;
    if !key {
        active = (seg >> level) & 1 == 1 && token_level < levels;
    }
    let ldk = comptime!(row_len_input(nk));
    let ldv = comptime!(row_len_input(pt));
    let lsv = comptime!(row_len_f32(pt));
    let mut ab = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldk), ALIGN);
    let mut bb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    let mut wb = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    let mut wb_lo = Shared::<[E]>::new_aligned_slice(comptime!(chunk * ldv), ALIGN);
    let mut stage = Shared::<[f32]>::new_aligned_slice(comptime!(nk * lsv), ALIGN);
    let mut lam = Shared::<[f32]>::new_slice(comptime!(chunk * levels));
    let mut graw = Shared::<[f32]>::new_slice(chunk);
    let mut gam = Shared::<[f32]>::new_slice(chunk);
    let mut kd = Shared::<[f32]>::new_slice(chunk);
    let mut eg = Shared::<[f32]>::new_slice(chunk);
    // This unit's state elements: `u + r·threads` of the row-major `nk × pt` state.
    let per_unit = comptime!((nk * pt).div_ceil(threads));
    let mut acc = Array::<f32>::new(per_unit);
    #[unroll]
    for r in 0..per_unit {
        acc[r] = 0.0f32;
    }
    // e^{γ} at the start of the chunk (query states), the segment's log-decay so far (key).
    let mut offset = 1.0f32;
    let mut log_total = 0.0f32;
    let mut n_chunks = segment_chunks(seq, t_start, seg_chunks, chunk);
    // A cube with nothing to compute walks no chunk (uniform over the cube) and writes nothing.
    if !active {
        n_chunks = 0;
    }
    for j in 0..n_chunks {
        let t0 = t_start + j * chunk;
        load_rows::<E, N>(
            a, &mut ab, u, t0, 0, bi, h, seq, heads, nk, chunk, nk, ldk, threads, true,
        );
        load_rows::<E, N>(
            b, &mut bb, u, t0, p0, bi, h, seq, heads, width, chunk, pt, ldv, threads, true,
        );
        // Ends with barriers that also publish `ab` and `bb`.
        load_decays::<G>(
            g, lambda, &mut lam, &mut graw, &mut gam, &mut kd, &mut eg, u, t0, bi, h, seq, heads,
            chunk, levels, threads, true,
        );
        // Per-token weights: e^{total − γ} (key), λ e^{offset + γ} (query); rows past the end
        // were loaded as zeros.
        let mut idx = u;
        while idx < comptime!(chunk * pt) {
            let i = idx / pt;
            let at = i * ldv + idx % pt;
            let mut w = kd[i];
            if !key {
                w = lam[i * levels + token_level] * offset * eg[i];
            }
            let x = f32::cast_from(bb[at]) * w;
            let hi = E::cast_from(x);
            wb[at] = hi;
            wb_lo[at] = E::cast_from(x - f32::cast_from(hi));
            idx += threads;
        }
        // Read before the barriers: the next chunk's `load_decays` may rewrite `gam` once every
        // unit has passed the second one.
        let total = gam[comptime!(chunk - 1)];
        sync_cube();
        // aᵀ (w ⊙ b): `a` read column-major.
        tile_matmul::<E>(
            &ab, &ab, &wb, &wb_lo, &mut stage, plane, planes, nk, chunk, pt, true, ldk, false, ldv,
            FULL, FULL, SPLIT_B, lsv,
        );
        sync_cube();
        // Earlier chunks decay through this one (key states). `stage` is next written by the
        // next chunk's product, behind its barriers.
        let d = total.exp();
        #[unroll]
        for r in 0..per_unit {
            let e = u + r * threads;
            if e < comptime!(nk * pt) {
                let mut x = acc[r];
                if key {
                    x *= d;
                }
                acc[r] = x + stage[(e / pt) * lsv + e % pt];
            }
        }
        offset *= d;
        log_total += total;
    }
    let base = ((tile * batch * segments + bh / heads) * heads + h) * per_level + level;
    #[unroll]
    for r in 0..per_unit {
        let e = u + r * threads;
        if active && e < comptime!(nk * pt) {
            out[base * comptime!(nk * pt) + e] = acc[r];
        }
    }
    if key && tile == 0 && u == 0 {
        totals[bh] = log_total;
    }
}

/// The level states above the segments' own `own` levels, written into the kernels' level
/// scratch `states` (`[tiles, B·segments, H, nlev, nk, pt]` f32) at levels `own + i`, `i =
/// CUBE_POS_Z`: with `causal`, `R_j,i` from the segments' key states `seg_states` (`[tiles,
/// B·segments, H, 1, nk, pt]`) where bit `i` of segment `j` is set; else `D_j,i` from their
/// query states (`[tiles, B·segments, H, I, nk, pt]`) where the bit is clear (zero where the
/// period's query half lies past the end). Levels a segment does not read are left as they are.
/// `totals: [B·segments, H]`, the segments' log-decays. With `value_major` the levels are
/// written `[pt, nk]` (the scalar causal backward's layout), else `[nk, pt]` as the segments'
/// states. Grid `(B·segments·H, tiles, I)`, [`THREADS`] units.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub fn across_states_kernel(
    seg_states: &Tensor<f32>,
    totals: &Tensor<f32>,
    states: &mut Tensor<f32>,
    batch: usize,
    heads: usize,
    segments: usize,
    own: usize,
    #[comptime] geo: Geometry,
    #[comptime] causal: bool,
    #[comptime] value_major: bool,
) {
    let (chunk, nk, pt, levels, nlev) =
        comptime!((geo.chunk, geo.nk, geo.pt, geo.levels, geo.nlev));
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    let level_size = comptime!(nk * pt);
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let level = CUBE_POS_Z as usize;
    let per_level = CUBE_COUNT_Z as usize;
    let r = bh / heads;
    let bi = r / segments;
    let seg = r % segments;
    let h = bh % heads;
    let u = UNIT_POS_X as usize;
    let token_level = log_c + own + level + 1;
    // Causal levels are read where bit `level` of the segment is set, anticausal ones where
    // it is clear.
    let mut reads = (seg >> level) & 1 == 1;
    if !causal {
        reads = !reads;
    }
    reads = reads && token_level < levels;
    if reads {
        let half = 1usize << level;
        let first = (seg >> (level + 1)) << (level + 1);
        let mut lo = first;
        let mut hi = first + half;
        if !causal {
            lo = first + half;
            hi = first + 2 * half;
            if hi > segments {
                hi = segments;
            }
        }
        let per_unit = comptime!(elements_per_unit(nk, pt));
        let mut acc = Array::<f32>::new(comptime!(elements_per_unit(nk, pt)));
        #[unroll]
        for e in 0..comptime!(elements_per_unit(nk, pt)) {
            acc[e] = 0.0f32;
        }
        let mut other = lo;
        while other < hi {
            // The log-decay of the segments strictly between the two.
            let mut from = other + 1;
            let mut to = seg;
            if !causal {
                from = seg + 1;
                to = other;
            }
            let mut between = 0.0f32;
            for y in from..to {
                between += totals[(bi * segments + y) * heads + h];
            }
            let f = between.exp();
            // Key states have one slot a segment, query states one a level.
            let mut src = (tile * batch * segments + bi * segments + other) * heads + h;
            if !causal {
                src = src * per_level + level;
            }
            #[unroll]
            for e in 0..per_unit {
                let el = u + e * THREADS;
                if el < level_size {
                    // Element (p, n) of a value-major level is (n, p) of the key-major states.
                    let mut from = el;
                    if value_major {
                        from = (el % nk) * pt + el / nk;
                    }
                    acc[e] += f * seg_states[src * level_size + from];
                }
            }
            other += 1;
        }
        let dst = ((tile * batch * segments + bh / heads) * heads + h) * nlev + own + level;
        #[unroll]
        for e in 0..per_unit {
            let el = u + e * THREADS;
            if el < level_size {
                states[dst * level_size + el] = acc[e];
            }
        }
    }
}
