//! The two kernels of the fused backward (launched from `launch.rs`).
//!
//! With `W[t,s] = λ[t,ℓ(t,s)] e^{Γt−Γs}` (s ≤ t), `A[t,s] = q_t·k_s` and `B[t,s] = dO_t·v_s`:
//!
//! * `dq_t = Σ_s W B k_s` and `dλ[t,ℓ] = Σ_{s in level ℓ} e^{Γt−Γs} A B` read the past through
//!   the *same* causal level states `H = Σ_s e^{…} k_s v_sᵀ` as the forward ([`causal_backward_kernel`]):
//!   per level, one product `X_t = H dO_t` gives both `dq_t += λ e X_t` and `dλ = e q_t·X_t`;
//! * `dv_s = Σ_t W A dO_t` and `dk_s = Σ_t W B q_t` read the future through the same anticausal
//!   level states `G = Σ_t λ e^{…} q_t dO_tᵀ` ([`anticausal_backward_kernel`]):
//!   `dv_s += e k_sᵀG`, `dk_s += e G v_s`.
//!
//! So the backward is two launches that build two sets of states, where four launches of the
//! forward kernels (`dq`, `dλ`, `dv`, `dk`) built four. One cube per (batch·head, value tile);
//! `dq`, `dk`, `dλ` and `dΓ_t = Σ_ℓ λ[t,ℓ] dλ[t,ℓ] − v_t·dv_t` (whose reverse cumsum is `dg`) sum
//! over the value columns and are returned per tile (summed by the caller).
//!
//! Shared-memory rows are padded by one element (`nk + 1`, `chunk + 1`, `pt + 1`) so that the
//! products whose lanes walk a row stride do not hit one bank 32 times.

use cubecl::prelude::*;

use super::cube::{
    Geometry, REWRITES_CLEAR_BITS, REWRITES_SET_BITS, THREADS, advance_scales, bitlen, load_chunk,
    own_levels, row, segment_chunks, trailing_ones, walk_row,
};

/// Causal half of the backward: `dq`, `dλ` and `dΓ`'s first term `Σ_ℓ λ[t,ℓ] dλ[t,ℓ]`
/// (`= dO_t·o_t`), each per value tile.
///
/// Shapes: `q, k: [B, T, H, nk]`, `v, d_o: [B, T, H, width]` (dtype `E`), `g: [B, T, H]`,
/// `lambda: [B, T, H, levels]` (dtype `G`); `dq: [tiles, B, T, H, nk]` (dtype `O`: `E` with one
/// tile, else f32 partials), `dl: [tiles, B, T, H, levels]`, `dgamma: [tiles, B, T, H]` (f32);
/// `states`: `tiles·B·H·nlev·pt·nk` f32 scratch, each level stored value-major (`[pt][nk]`) so
/// that `X = H dO` reads it along the key lanes. Grid `(B·H, tiles)`, [`THREADS`] units.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub fn causal_backward_kernel<E: Float, G: Float, O: Float>(
    q: &Tensor<E>,
    k: &Tensor<E>,
    v: &Tensor<E>,
    d_o: &Tensor<E>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    dq: &mut Tensor<O>,
    dl: &mut Tensor<f32>,
    dgamma: &mut Tensor<f32>,
    states: &mut Tensor<f32>,
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
    let (levels, nlev) = comptime!((geo.levels, geo.nlev));
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let (bi, seg, h, t_start) = walk_row(bh, heads, segments, seg_chunks, chunk);
    let u = UNIT_POS_X as usize;
    let p0 = tile * pt;
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    let qs_stride = comptime!(nk + 1);
    let kt_stride = comptime!(chunk + 1);
    let vst = comptime!(pt + 1);
    // Key mapping: lanes over key columns `n = cn + c·cs`, rows `rb + r·rg` (chunk rows for dq,
    // value rows for the state update).
    let cs = comptime!(key_lanes(nk));
    let cp = comptime!(nk.div_ceil(key_lanes(nk)));
    let rg = comptime!(THREADS / key_lanes(nk));
    let rows_k = comptime!(chunk.div_ceil(THREADS / key_lanes(nk)));
    let rows_p = comptime!(pt.div_ceil(THREADS / key_lanes(nk)));
    let cn = u % cs;
    let rb = u / cs;
    let sj = comptime!(THREADS / chunk);
    let per_row = comptime!(chunk * chunk / THREADS);
    let level_size = comptime!(nk * pt);
    let state_base = (tile * batch * segments * heads + bh) * comptime!(nlev.max(1) * nk * pt);

    let mut qs = Shared::<[f32]>::new_slice(comptime!(chunk * (nk + 1)));
    let mut kt = Shared::<[f32]>::new_slice(comptime!(nk * (chunk + 1)));
    let mut vs = Shared::<[f32]>::new_slice(comptime!(chunk * (pt + 1)));
    let mut ws = Shared::<[f32]>::new_slice(comptime!(chunk * (pt + 1)));
    let mut sc = Shared::<[f32]>::new_slice(comptime!(chunk * chunk));
    let mut sd = Shared::<[f32]>::new_slice(comptime!(chunk * chunk));
    let mut lam = Shared::<[f32]>::new_slice(comptime!(chunk * levels));
    let mut red = Shared::<[f32]>::new_slice(comptime!(chunk * key_lanes(nk)));
    let mut graw = Shared::<[f32]>::new_slice(chunk);
    let mut gam = Shared::<[f32]>::new_slice(chunk);
    let mut kd = Shared::<[f32]>::new_slice(chunk);
    let mut eg = Shared::<[f32]>::new_slice(chunk);
    let mut scale = Shared::<[f32]>::new_slice(comptime!(nlev.max(1)));

    if u < nlev {
        scale[u] = 1.0f32;
    }
    let n_chunks = segment_chunks(seq, t_start, seg_chunks, chunk);

    for j in 0..n_chunks {
        let t0 = t_start + j * chunk;
        // The chunk's index in the whole sequence: its bits say which levels it reads.
        let jg = seg * seg_chunks + j;
        load_values::<E>(
            v, d_o, &mut vs, &mut ws, u, t0, p0, bi, h, seq, heads, width, chunk, pt,
        );
        load_chunk::<E, G>(
            q, k, g, lambda, &mut qs, &mut kt, &mut lam, &mut graw, &mut gam, &mut kd, &mut eg, u,
            t0, bi, h, seq, heads, chunk, kt_stride, nk, levels,
        );
        // In-chunk pairs s ≤ t: `sc = λ e B` (weights of dq), `sd = e A B` (terms of dλ).
        let si = u / sj;
        #[unroll]
        for r in 0..per_row {
            let sjj = u % sj + r * sj;
            let mut s_dq = 0.0f32;
            let mut s_dl = 0.0f32;
            if sjj <= si {
                let mut a = 0.0f32;
                for n in 0..nk {
                    a += qs[si * qs_stride + n] * kt[n * kt_stride + sjj];
                }
                let mut b = 0.0f32;
                for p in 0..pt {
                    b += ws[si * vst + p] * vs[sjj * vst + p];
                }
                let e = (gam[si] - gam[sjj]).exp();
                s_dl = e * a * b;
                let lvl = bitlen(si ^ sjj);
                if lvl < levels {
                    s_dq = lam[si * levels + lvl] * e * b;
                }
            }
            sc[si * chunk + sjj] = s_dq;
            sd[si * chunk + sjj] = s_dl;
        }
        sync_cube();

        // dλ of the in-chunk levels: level-segmented row sums (one owner unit per row, which
        // also adds the chunk levels below).
        let dl_t = t0 + u;
        let dl_row = (((tile * batch + bi) * seq + dl_t) * heads + h) * levels;
        // The row's Σ_ℓ λ dλ, summed by its owner as it writes dλ.
        let mut read = 0.0f32;
        if u < chunk && dl_t < seq {
            for lvl in 0..levels {
                let mut sum = 0.0f32;
                if lvl <= log_c {
                    for jj in 0..chunk {
                        if jj <= u && bitlen(u ^ jj) == lvl {
                            sum += sd[u * chunk + jj];
                        }
                    }
                }
                dl[dl_row + lvl] = sum;
                read += lam[u * levels + lvl] * sum;
            }
        }
        // dq of the in-chunk pairs: Σ_s sc[t,s] k_s.
        let mut acc = Array::<f32>::new(comptime!(rows_k * cp));
        #[unroll]
        for x in 0..comptime!(rows_k * cp) {
            acc[x] = 0.0f32;
        }
        for jj in 0..chunk {
            #[unroll]
            for r in 0..rows_k {
                let i = rb + r * rg;
                if i < chunk {
                    let w = sc[i * chunk + jj];
                    #[unroll]
                    for c in 0..cp {
                        let n = cn + c * cs;
                        if n < nk {
                            acc[r * cp + c] += w * kt[n * kt_stride + jj];
                        }
                    }
                }
            }
        }
        // Earlier chunks through chunk level i (bit i−1 of j set): X_t = H dO_t, then
        // dq_t += λ e X_t and dλ[t] = e q_t·X_t (row sums through `red`).
        for lvi in 0..nlev {
            let token_level = log_c + lvi + 1;
            if (jg >> lvi) & 1 == 1 && token_level < levels {
                let base = state_base + lvi * level_size;
                let mut x = Array::<f32>::new(comptime!(rows_k * cp));
                #[unroll]
                for e in 0..comptime!(rows_k * cp) {
                    x[e] = 0.0f32;
                }
                for pp in 0..pt {
                    #[unroll]
                    for c in 0..cp {
                        let n = cn + c * cs;
                        if n < nk {
                            let z = states[base + pp * nk + n];
                            #[unroll]
                            for r in 0..rows_k {
                                let i = rb + r * rg;
                                if i < chunk {
                                    x[r * cp + c] += z * ws[i * vst + pp];
                                }
                            }
                        }
                    }
                }
                let f = scale[lvi];
                #[unroll]
                for r in 0..rows_k {
                    let i = rb + r * rg;
                    if i < chunk {
                        let wgt = f * eg[i];
                        let lw = lam[i * levels + token_level] * wgt;
                        let mut partial = 0.0f32;
                        #[unroll]
                        for c in 0..cp {
                            let n = cn + c * cs;
                            if n < nk {
                                acc[r * cp + c] += lw * x[r * cp + c];
                                partial += qs[i * qs_stride + n] * x[r * cp + c];
                            }
                        }
                        red[i * cs + cn] = partial * wgt;
                    }
                }
                sync_cube();
                if u < chunk && dl_t < seq {
                    let mut s = 0.0f32;
                    for c in 0..cs {
                        s += red[u * cs + c];
                    }
                    dl[dl_row + token_level] = s;
                    read += lam[u * levels + token_level] * s;
                }
                sync_cube();
            }
        }
        if u < chunk && dl_t < seq {
            dgamma[((tile * batch + bi) * seq + dl_t) * heads + h] = read;
        }
        #[unroll]
        for r in 0..rows_k {
            let i = rb + r * rg;
            let t = t0 + i;
            if i < chunk && t < seq {
                let out_row = (((tile * batch + bi) * seq + t) * heads + h) * nk;
                #[unroll]
                for c in 0..cp {
                    let n = cn + c * cs;
                    if n < nk {
                        dq[out_row + n] = O::cast_from(acc[r * cp + c]);
                    }
                }
            }
        }
        // This chunk's key state Σ_i e^{γlast−γi} v_i k_iᵀ (value-major) and the levels of the
        // trailing ones of j (all read above) become level `ones` (see `tensor_core::carry_len`).
        if nlev > 0 {
            let mut ks = Array::<f32>::new(comptime!(rows_p * cp));
            #[unroll]
            for e in 0..comptime!(rows_p * cp) {
                ks[e] = 0.0f32;
            }
            for i in 0..chunk {
                let kdi = kd[i];
                #[unroll]
                for c in 0..cp {
                    let n = cn + c * cs;
                    if n < nk {
                        let kv = kt[n * kt_stride + i] * kdi;
                        #[unroll]
                        for r in 0..rows_p {
                            let pp = rb + r * rg;
                            if pp < pt {
                                ks[r * cp + c] += kv * vs[i * vst + pp];
                            }
                        }
                    }
                }
            }
            let chunk_decay = eg[comptime!(chunk - 1)];
            // On the whole-sequence index: a level this chunk does not read (see `cube.rs`).
            let ones = trailing_ones(jg);
            if ones < nlev && log_c + ones + 1 < levels {
                #[unroll]
                for r in 0..rows_p {
                    let pp = rb + r * rg;
                    #[unroll]
                    for c in 0..cp {
                        let n = cn + c * cs;
                        if pp < pt && n < nk {
                            let e = pp * nk + n;
                            let mut sum = 0.0f32;
                            for lvi in 0..ones {
                                sum += states[state_base + lvi * level_size + e] * scale[lvi];
                            }
                            states[state_base + ones * level_size + e] =
                                sum * chunk_decay + ks[r * cp + c];
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
            REWRITES_CLEAR_BITS,
        );
        sync_cube();
    }
}

/// Anticausal half of the backward: `dv` (this value tile), `dk` (per value tile) and `dΓ`'s
/// second term: `dgamma[tile, b, t, h] −= v_t·dv_t` over the tile's columns, after the causal
/// kernel wrote the first.
///
/// Shapes as [`causal_backward_kernel`]; `dk: [tiles, B, T, H, nk]` (dtype `O`),
/// `dv: [B, T, H, width]` (dtype `E`); `states`: `tiles·B·H·nlev·nk·pt` f32 scratch (key-major
/// `[nk][pt]`). Chunks run from last to first; λ weighs the later token.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub fn anticausal_backward_kernel<E: Float, G: Float, O: Float>(
    q: &Tensor<E>,
    k: &Tensor<E>,
    v: &Tensor<E>,
    d_o: &Tensor<E>,
    g: &Tensor<G>,
    lambda: &Tensor<G>,
    dk: &mut Tensor<O>,
    dv: &mut Tensor<E>,
    dgamma: &mut Tensor<f32>,
    states: &mut Tensor<f32>,
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
    let (levels, nlev) = comptime!((geo.levels, geo.nlev));
    let bh = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let (bi, seg, h, t_start) = walk_row(bh, heads, segments, seg_chunks, chunk);
    let u = UNIT_POS_X as usize;
    let p0 = tile * pt;
    let log_c = comptime!(chunk.trailing_zeros() as usize);
    let qs_stride = comptime!(nk + 1);
    let kt_stride = comptime!(chunk + 1);
    let vst = comptime!(pt + 1);
    // Value mapping (dv, the state update): lanes over value columns, rows over chunk / keys.
    let pc = u % pt;
    let rbase = u / pt;
    let rstep = comptime!(THREADS / pt);
    let rows_out = comptime!(chunk / (THREADS / pt));
    let rows_state = comptime!(nk.div_ceil(THREADS / pt));
    // Key mapping (dk): lanes over key columns, rows over the chunk.
    let cs = comptime!(key_lanes(nk));
    let cp = comptime!(nk.div_ceil(key_lanes(nk)));
    let rg = comptime!(THREADS / key_lanes(nk));
    let rows_k = comptime!(chunk.div_ceil(THREADS / key_lanes(nk)));
    let cn = u % cs;
    let rb = u / cs;
    let sj = comptime!(THREADS / chunk);
    let per_row = comptime!(chunk * chunk / THREADS);
    let level_size = comptime!(nk * pt);
    let state_base = (tile * batch * segments * heads + bh) * comptime!(nlev.max(1) * nk * pt);

    // `ks`: k row-major (the output side), `qt`: q transposed (the state side).
    let mut ks = Shared::<[f32]>::new_slice(comptime!(chunk * (nk + 1)));
    let mut qt = Shared::<[f32]>::new_slice(comptime!(nk * (chunk + 1)));
    let mut vs = Shared::<[f32]>::new_slice(comptime!(chunk * (pt + 1)));
    let mut ws = Shared::<[f32]>::new_slice(comptime!(chunk * (pt + 1)));
    let mut sa = Shared::<[f32]>::new_slice(comptime!(chunk * chunk));
    let mut sb = Shared::<[f32]>::new_slice(comptime!(chunk * chunk));
    let mut lam = Shared::<[f32]>::new_slice(comptime!(chunk * levels));
    let mut graw = Shared::<[f32]>::new_slice(chunk);
    let mut gam = Shared::<[f32]>::new_slice(chunk);
    let mut kd = Shared::<[f32]>::new_slice(chunk);
    let mut eg = Shared::<[f32]>::new_slice(chunk);
    let mut scale = Shared::<[f32]>::new_slice(comptime!(nlev.max(1)));

    if u < nlev {
        scale[u] = 1.0f32;
    }
    // A period whose later half lies past the end is read before anything was added to it.
    // Only the levels inside a segment: the ones above it hold the states of the later
    // segments, written before the launch (`segments.rs`), and are only read here.
    let own = own_levels(seg_chunks, nlev);
    let mut idx = u;
    while idx < own * level_size {
        states[state_base + idx] = 0.0f32;
        idx += THREADS;
    }
    sync_storage();
    let n_chunks = segment_chunks(seq, t_start, seg_chunks, chunk);

    for step in 0..n_chunks {
        let j = n_chunks - 1 - step;
        let t0 = t_start + j * chunk;
        // The chunk's index in the whole sequence: its bits say which levels it reads.
        let jg = seg * seg_chunks + j;
        load_values::<E>(
            v, d_o, &mut vs, &mut ws, u, t0, p0, bi, h, seq, heads, width, chunk, pt,
        );
        load_chunk::<E, G>(
            k, q, g, lambda, &mut ks, &mut qt, &mut lam, &mut graw, &mut gam, &mut kd, &mut eg, u,
            t0, bi, h, seq, heads, chunk, kt_stride, nk, levels,
        );
        // In-chunk pairs t ≥ s (row s, column t): `sa = W A` (weights of dv), `sb = W B` (of dk).
        let si = u / sj;
        #[unroll]
        for r in 0..per_row {
            let sjj = u % sj + r * sj;
            let mut s_a = 0.0f32;
            let mut s_b = 0.0f32;
            if sjj >= si {
                let lvl = bitlen(si ^ sjj);
                if lvl < levels {
                    let mut a = 0.0f32;
                    for n in 0..nk {
                        a += ks[si * qs_stride + n] * qt[n * kt_stride + sjj];
                    }
                    let mut b = 0.0f32;
                    for p in 0..pt {
                        b += ws[sjj * vst + p] * vs[si * vst + p];
                    }
                    let w = (gam[sjj] - gam[si]).exp() * lam[sjj * levels + lvl];
                    s_a = w * a;
                    s_b = w * b;
                }
            }
            sa[si * chunk + sjj] = s_a;
            sb[si * chunk + sjj] = s_b;
        }
        sync_cube();

        let mut acc_v = Array::<f32>::new(rows_out);
        #[unroll]
        for r in 0..rows_out {
            acc_v[r] = 0.0f32;
        }
        let mut acc_k = Array::<f32>::new(comptime!(rows_k * cp));
        #[unroll]
        for e in 0..comptime!(rows_k * cp) {
            acc_k[e] = 0.0f32;
        }
        for jj in 0..chunk {
            let wv = ws[jj * vst + pc];
            #[unroll]
            for r in 0..rows_out {
                acc_v[r] += sa[(rbase + r * rstep) * chunk + jj] * wv;
            }
            #[unroll]
            for r in 0..rows_k {
                let i = rb + r * rg;
                if i < chunk {
                    let w = sb[i * chunk + jj];
                    #[unroll]
                    for c in 0..cp {
                        let n = cn + c * cs;
                        if n < nk {
                            acc_k[r * cp + c] += w * qt[n * kt_stride + jj];
                        }
                    }
                }
            }
        }
        // Later chunks through chunk level i (bit i−1 of j clear): the state holds the second
        // half of the period, decayed to the end of chunk j (times the lazy factor).
        for lvi in 0..nlev {
            let token_level = log_c + lvi + 1;
            if (jg >> lvi) & 1 == 0 && token_level < levels {
                let base = state_base + lvi * level_size;
                let f = scale[lvi];
                let mut tmp = Array::<f32>::new(rows_out);
                #[unroll]
                for r in 0..rows_out {
                    tmp[r] = 0.0f32;
                }
                for n in 0..nk {
                    let z = states[base + n * pt + pc];
                    #[unroll]
                    for r in 0..rows_out {
                        tmp[r] += ks[(rbase + r * rstep) * qs_stride + n] * z;
                    }
                }
                #[unroll]
                for r in 0..rows_out {
                    acc_v[r] += tmp[r] * f * kd[rbase + r * rstep];
                }
                let mut x = Array::<f32>::new(comptime!(rows_k * cp));
                #[unroll]
                for e in 0..comptime!(rows_k * cp) {
                    x[e] = 0.0f32;
                }
                for pp in 0..pt {
                    #[unroll]
                    for c in 0..cp {
                        let n = cn + c * cs;
                        if n < nk {
                            let z = states[base + n * pt + pp];
                            #[unroll]
                            for r in 0..rows_k {
                                let i = rb + r * rg;
                                if i < chunk {
                                    x[r * cp + c] += z * vs[i * vst + pp];
                                }
                            }
                        }
                    }
                }
                #[unroll]
                for r in 0..rows_k {
                    let i = rb + r * rg;
                    if i < chunk {
                        let wgt = f * kd[i];
                        #[unroll]
                        for c in 0..cp {
                            acc_k[r * cp + c] += wgt * x[r * cp + c];
                        }
                    }
                }
            }
        }
        #[unroll]
        for r in 0..rows_out {
            let t = t0 + rbase + r * rstep;
            let p = p0 + pc;
            if t < seq && p < width {
                dv[row(bi, t, h, seq, heads, width) + p] = E::cast_from(acc_v[r]);
            }
        }
        #[unroll]
        for r in 0..rows_k {
            let i = rb + r * rg;
            let t = t0 + i;
            if i < chunk && t < seq {
                let out_row = (((tile * batch + bi) * seq + t) * heads + h) * nk;
                #[unroll]
                for c in 0..cp {
                    let n = cn + c * cs;
                    if n < nk {
                        dk[out_row + n] = O::cast_from(acc_k[r * cp + c]);
                    }
                }
            }
        }
        // dΓ_t −= v_t·dv_t: `vs` takes v ⊙ dv once every unit is done reading it (the barrier),
        // and each of the first `chunk` units sums its row (zero past the width).
        sync_cube();
        #[unroll]
        for r in 0..rows_out {
            let at = (rbase + r * rstep) * vst + pc;
            vs[at] *= acc_v[r];
        }
        sync_cube();
        if u < chunk && t0 + u < seq {
            let mut written = 0.0f32;
            for pp in 0..pt {
                written += vs[u * vst + pp];
            }
            dgamma[((tile * batch + bi) * seq + t0 + u) * heads + h] -= written;
        }
        // This chunk joins, weighted by its own λ at each level, every level whose period has
        // chunk j in its second half (Σ_i λ[i,ℓ] e^{γi} q_i dO_iᵀ); the last chunk of a period
        // starts it afresh. States are referenced to the end of chunk j − 1 afterwards.
        let chunk_decay = eg[comptime!(chunk - 1)];
        for lvi in 0..nlev {
            let token_level = log_c + lvi + 1;
            if lvi < own && (jg >> lvi) & 1 == 1 && token_level < levels {
                let mut gs = Array::<f32>::new(rows_state);
                #[unroll]
                for r in 0..rows_state {
                    gs[r] = 0.0f32;
                }
                for i in 0..chunk {
                    let wv = ws[i * vst + pc] * eg[i] * lam[i * levels + token_level];
                    #[unroll]
                    for r in 0..rows_state {
                        let n = rbase + r * rstep;
                        if n < nk {
                            gs[r] += qt[n * kt_stride + i] * wv;
                        }
                    }
                }
                let base = state_base + lvi * level_size;
                let period = 2usize << lvi;
                let fresh = jg % period == period - 1;
                let f = scale[lvi] * chunk_decay;
                #[unroll]
                for r in 0..rows_state {
                    let n = rbase + r * rstep;
                    if n < nk {
                        let e = base + n * pt + pc;
                        let mut old = 0.0f32;
                        if !fresh {
                            old = states[e] * f;
                        }
                        states[e] = old + gs[r];
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
            REWRITES_SET_BITS,
        );
        sync_cube();
    }
}

/// Lanes of the key mapping: the key width rounded up to a power of two, at most [`THREADS`].
pub const fn key_lanes(nk: usize) -> usize {
    let lanes = nk.next_power_of_two();
    if lanes < THREADS { lanes } else { THREADS }
}

/// Loads the value tile of `v` into `vs` and of `d_o` into `ws` (rows padded to `pt + 1`; zero
/// past the sequence or the width). The caller's next barrier publishes them.
#[allow(clippy::too_many_arguments)]
#[cube]
fn load_values<E: Float>(
    v: &Tensor<E>,
    d_o: &Tensor<E>,
    vs: &mut Shared<[f32]>,
    ws: &mut Shared<[f32]>,
    u: usize,
    t0: usize,
    p0: usize,
    bi: usize,
    h: usize,
    seq: usize,
    heads: usize,
    width: usize,
    #[comptime] chunk: usize,
    #[comptime] pt: usize,
) {
    let vst = comptime!(pt + 1);
    let mut idx = u;
    while idx < comptime!(chunk * pt) {
        let i = idx / pt;
        let pp = idx % pt;
        let t = t0 + i;
        let p = p0 + pp;
        let mut vv = 0.0f32;
        let mut dv = 0.0f32;
        if t < seq && p < width {
            let off = row(bi, t, h, seq, heads, width) + p;
            vv = f32::cast_from(v[off]);
            dv = f32::cast_from(d_o[off]);
        }
        vs[i * vst + pp] = vv;
        ws[i * vst + pp] = dv;
        idx += THREADS;
    }
}
