//! The chunkwise form of log-linear Gated DeltaNet (spec §5.3): the UT transform inside each
//! chunk, then one tree of block states and block transitions whose levels are the chunk
//! levels. O(T·C·(N+P) + T·log(T/C)·N·(N+P) + (T/C)·N²·(N+P)).
//!
//! Inside a chunk the scalar decays factor out of `𝒜_r = a_r (I − β_r k_r k_rᵀ)`, so the
//! delta-rule products are undecayed (UT transform, `𝐓 = I + strictly_lower(diag(β) K Kᵀ)`) and
//! the decays are differences of the chunk's cumulative log-decay. Between chunks, the pairs of
//! level `lv > c` are keys in the first half and queries in the second half of an aligned period
//! of `2^lv` tokens, as in the Mamba-2 op; here the key half's state must be carried through
//! matrices, so the states and transitions of aligned blocks are merged pairwise up a tree
//! (`Z = G₂ Z₁ + Z₂`, `G = G₂ G₁`): the blocks of `2^(lv−1)` tokens serve level `lv`, each query
//! is carried back to the start of its block by the same merges, and the whole tree is
//! log2(T/C) batched steps instead of a scan over chunks per level. The derivation is in
//! `ops/gdn/README.md`.

use burn::prelude::*;

use super::{GdnInput, empty_segment};
use crate::fenwick::{self, bitlen};
use crate::linalg::Gemm;
use crate::ops::{
    AttnOutput, FenwickState, float_tensor, heads_first, initial_state_output, int_tensor,
    pad_zeros, zeros_as,
};

/// Chunkwise log-linear Gated DeltaNet with chunk size `chunk` (a power of two). Any `T`: the
/// segment is zero-padded to whole chunks; a padding token has `k = 0`, `β = 0`, `g = 0`, so
/// its transition is the identity and it inserts nothing, which leaves every real output and
/// the state unchanged; the padding is sliced off again.
///
/// # Shapes
/// See [`GdnInput`]; `o: [B, T, H, P]`.
///
/// # Panics
/// If `chunk` is not a power of two, or on the shape errors of [`GdnInput::dims`].
pub fn chunked(
    x: &GdnInput,
    chunk: usize,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    const OP: &str = "gdn_attn(chunked)";
    assert!(
        chunk.is_power_of_two(),
        "{OP}: chunk size {chunk} is not a power of two"
    );
    let d = x.dims();
    let start = initial.map_or(0, |s| s.position);
    fenwick::check_levels(OP, d.l, start + d.t);
    if let Some(s) = initial {
        s.check(OP, &d);
    }
    if d.t == 0 {
        return empty_segment(x, initial, return_state);
    }
    let (b, t, h, n, p, l) = (d.b, d.t, d.h, d.n, d.p, d.l);
    let device = x.device();
    let dtype = x.dtype();
    let c = chunk.trailing_zeros() as usize;
    let end = start + t;

    // Shift the padded segment's start back to a multiple of the largest period any pair inside
    // it uses, so chunks and blocks sit at multiples of their size, as the level structure needs
    // (the same alignment as the Mamba-2 chunked form).
    let align = 1usize << bitlen(start ^ (end - 1)).max(c);
    let base = start / align * align;
    let front = start - base;
    let len = (front + t).div_ceil(chunk) * chunk;
    let back = len - front - t;
    let nt = len / chunk;
    // Index of the last real token in the padded segment; its bits above c are the chunk levels.
    let last = front + t - 1;
    let pad4 = |x: Tensor<4>| pad_zeros(heads_first(x), 2, front, back);
    let pad3 = |x: Tensor<3>| pad_zeros(x.swap_dims(1, 2), 2, front, back);
    let lambda = pad4(x.lambda.clone()); // [B, H, T', L]
    let qc = pad4(x.q.clone()).reshape([b, h, nt, chunk, n]);
    let kc = pad4(x.k.clone()).reshape([b, h, nt, chunk, n]);
    let vc = pad4(x.v.clone()).reshape([b, h, nt, chunk, p]);
    let bc = pad3(x.beta.clone()).reshape([b, h, nt, chunk]);
    let gc = pad3(x.g.clone()).reshape([b, h, nt, chunk]).cumsum(3); // γ: [B, H, NT, C]

    // (a) Intra-chunk: Â = tril(Q Kᵀ) 𝐓⁻¹ diag(β) with 𝐓 = I + strictly_lower(diag(β) K Kᵀ),
    // decayed by exp(γ_t − γ_s) and weighted by λ of the pair's level; the C×C level pattern is the same in every chunk. Levels above
    // L − 1 only occur between padding tokens, so they are clamped to stay in range.
    let tinv = ut_inverse(&kc, &bc); // [B, H, NT, C, C]
    let qk = qc.clone().gemm(kc.clone().swap_dims(3, 4)).tril(0); // [B, H, NT, C, C]
    let scores = qk.clone().gemm(tinv.clone() * bc.clone().unsqueeze_dim(3));
    let mut pattern = vec![0i64; chunk * chunk];
    for i in 0..chunk {
        for j in 0..=i {
            pattern[i * chunk + j] = fenwick::level(i, j).min(l - 1) as i64;
        }
    }
    let pattern =
        int_tensor(pattern, [1, 1, 1, chunk, chunk], &device).expand([b, h, nt, chunk, chunk]);
    let hier = lambda
        .clone()
        .reshape([b, h, nt, chunk, l])
        .gather(4, pattern); // [B, H, NT, C, C]
    let above = Tensor::<2, Bool>::tril_mask([chunk, chunk], 0, &device)
        .unsqueeze::<5>()
        .expand([b, h, nt, chunk, chunk]);
    let diff = gc.clone().unsqueeze_dim::<5>(4) - gc.clone().unsqueeze_dim::<5>(3);
    let decay = diff.mask_fill(above, 0.0).exp(); // [B, H, NT, C, C]
    // Â is exactly zero above the diagonal (a lower-triangular product), so no mask is needed.
    let mut o = (scores * decay * hier)
        .gemm(vc.clone())
        .reshape([b, h, len, p]);

    // (b) Chunk summaries. WY form: Π_{r∈chunk} (I − β_r k_r k_rᵀ) = I − Kᵀ W, W = 𝐓⁻¹ diag(β) K;
    // its partial products (the rows s ≤ t of W) carry query t back to the chunk start.
    let w = tinv.clone().gemm(kc.clone() * bc.clone().unsqueeze_dim(4)); // [B, H, NT, C, N]
    let rows = (qc - qk.gemm(w.clone())) * gc.clone().exp().unsqueeze_dim(4); // [B, H, NT, C, N]
    let g_last = gc.clone().narrow(3, chunk - 1, 1); // [B, H, NT, 1]
    let eye = identity(n, dtype, &device);
    let trans = (eye.clone().unsqueeze_dim::<5>(0).expand([b, h, nt, n, n])
        - kc.clone().swap_dims(3, 4).gemm(w))
        * g_last.clone().exp().unsqueeze_dim(4); // G: [B, H, NT, N, N]
    // Keys carried to the chunk end, k̃_s = (Π_{r>s} 𝒜_r) β_s k_s: the rows of
    // diag(β e^{γ_last − γ}) 𝐓⁻ᵀ K; the chunk's state is Σ_s k̃_s v_sᵀ.
    let to_end = (g_last - gc).exp() * bc; // [B, H, NT, C]
    let k_end = tinv.swap_dims(3, 4).gemm(kc) * to_end.unsqueeze_dim(4); // [B, H, NT, C, N]
    let states = k_end.clone().swap_dims(3, 4).gemm(vc.clone()); // Z: [B, H, NT, N, P]

    // The final state holds, per level, the bucket of the last token carried to it. Levels ≤ c
    // are buckets inside the last chunk; `carried` = Π 𝒜 from the start of the last token's
    // block to the last token, extended as the blocks grow.
    let mut slots: Vec<Option<Tensor<4>>> = vec![None; l];
    let mut carried = None;
    if return_state {
        let jc = last / chunk;
        let kk = k_end.narrow(2, jc, 1).squeeze_dim::<4>(2); // [B, H, C, N]
        let vv = vc.narrow(2, jc, 1).squeeze_dim::<4>(2); // [B, H, C, P]
        for (lv, range) in fenwick::buckets(last % chunk) {
            let (i0, size) = (range.start, range.len());
            let kr = kk.clone().narrow(2, i0, size).swap_dims(2, 3); // [B, H, N, size]
            slots[lv] = Some(kr.gemm(vv.clone().narrow(2, i0, size)));
        }
        carried = Some(trans.clone().narrow(2, jc, 1).squeeze_dim::<4>(2)); // [B, H, N, N]
    }

    // (c) The tree. At step m the blocks hold 2^m tokens: `trans` and `states` per block, and
    // `rows` = every query carried back to the start of its block.
    let top = bitlen(last);
    let need_root = initial.is_some() || return_state;
    let mut rows = rows.reshape([b, h, len, n]);
    let (mut trans, mut states) = (trans, states);
    let mut m = c;
    loop {
        let blocks = trans.dims()[2];
        if !(m < top || (need_root && blocks > 1)) {
            break;
        }
        // An odd count gets one empty block: identity transition, zero state.
        if blocks % 2 == 1 {
            let one = eye.clone().reshape([1, 1, 1, n, n]).expand([b, h, 1, n, n]);
            trans = Tensor::cat(vec![trans, one], 2);
            states = Tensor::cat(vec![states.clone(), zeros_as(&states, [b, h, 1, n, p])], 2);
        }
        let size = 1usize << m;
        let pairs = trans.dims()[2] / 2;
        let rows_len = pairs * 2 * size;
        let pair_trans = trans.reshape([b, h, pairs, 2 * n, n]);
        let (t_even, t_odd) = (
            pair_trans.clone().narrow(3, 0, n),
            pair_trans.narrow(3, n, n),
        );
        let pair_states = states.reshape([b, h, pairs, 2 * n, p]);
        let (s_even, s_odd) = (
            pair_states.clone().narrow(3, 0, n),
            pair_states.narrow(3, n, n),
        );
        let extra = rows_len - rows.dims()[2];
        let pair_rows = pad_zeros(rows, 2, 0, extra).reshape([b, h, pairs, 2 * size, n]);
        let (r_even, r_odd) = (
            pair_rows.clone().narrow(3, 0, size),
            pair_rows.narrow(3, size, size),
        );
        let lv = m + 1;
        if lv <= top {
            // Level lv: the queries of an odd block read the state of the even block before it.
            let lam = pad_zeros(
                lambda.clone().narrow(3, lv, 1).squeeze_dim::<3>(3),
                2,
                0,
                rows_len - len,
            )
            .reshape([b, h, pairs, 2 * size])
            .narrow(3, size, size); // [B, H, pairs, 2^m]
            let read = r_odd.clone().gemm(s_even.clone()) * lam.unsqueeze_dim(4);
            let level_out = Tensor::cat(vec![zeros_as(&read, [b, h, pairs, size, p]), read], 3)
                .reshape([b, h, rows_len, p])
                .narrow(2, 0, len);
            o = o + level_out;
        }
        if (last >> m) & 1 == 1 {
            // The last token sits in an odd block: level lv of the final state is the even
            // block's state carried to it, and its block now starts at the even block.
            let pair = last >> (m + 1);
            if let Some(mc) = carried {
                let even = |x: &Tensor<5>| x.clone().narrow(2, pair, 1).squeeze_dim::<4>(2);
                slots[lv] = Some(mc.clone().gemm(even(&s_even)));
                carried = Some(mc.gemm(even(&t_even)));
            }
        }
        rows =
            Tensor::cat(vec![r_even, r_odd.gemm(t_even.clone())], 3).reshape([b, h, rows_len, n]);
        states = t_odd.clone().gemm(s_even) + s_odd;
        trans = t_odd.gemm(t_even);
        m += 1;
    }

    let mut o = o.narrow(2, front, t); // [B, H, T, P]
    if let Some(init) = initial {
        // `rows` now carries every query, decays included, back to the segment start.
        let q_start = rows.narrow(2, front, t);
        let lambda = heads_first(x.lambda.clone());
        let no_decay = zeros_as(&x.g, [b, h, t]);
        o = o + initial_state_output(&q_start, &lambda, &no_decay, init);
    }
    let state = carried.map(|through| {
        // `through` = Π 𝒜 over the whole segment: what every old level goes through.
        if let Some(init) = initial {
            for j in 0..init.num_levels() {
                if let Some(r) = init.representative(j) {
                    let lv = fenwick::level(end - 1, r);
                    let old = through.clone().gemm(init.level(j));
                    slots[lv] = Some(match slots[lv].take() {
                        Some(s) => s + old,
                        None => old,
                    });
                }
            }
        }
        let zeros: Tensor<4> = zeros_as(&x.v, [b, h, n, p]);
        let levels = slots
            .into_iter()
            .map(|s| s.unwrap_or_else(|| zeros.clone()))
            .collect();
        FenwickState {
            levels: Tensor::stack(levels, 2),
            position: end,
        }
    });
    AttnOutput {
        o: o.swap_dims(1, 2),
        state,
    }
}

/// `(I + strictly_lower(diag(β) K Kᵀ))⁻¹` per chunk, the triangular inverse of the UT
/// transform, by doubling inverted diagonal blocks:
/// `[[A, 0], [C, D]]⁻¹ = [[A⁻¹, 0], [−D⁻¹ C A⁻¹, D⁻¹]]` with `C = diag(β₂) K₂ K₁ᵀ` — log2(C)
/// batched steps, exact zeros above the diagonal. Forward substitution would take C
/// sequential steps; the Neumann series would lose digits to cancellation.
///
/// # Shapes
/// `k: [B, H, NT, C, N]`, `beta: [B, H, NT, C]` → `[B, H, NT, C, C]`.
fn ut_inverse(k: &Tensor<5>, beta: &Tensor<4>) -> Tensor<5> {
    let [b, h, nt, chunk, n] = k.dims();
    let x = b * h * nt;
    let k = k.clone().reshape([x, chunk, n]);
    let beta = beta.clone().reshape([x, chunk]);
    // Blocks of one token: the unit diagonal.
    let mut inv: Tensor<4> = Tensor::ones([x, chunk, 1, 1], (&k.device(), k.dtype()));
    let mut m = 1;
    while m < chunk {
        let groups = chunk / (2 * m);
        let pair = inv.reshape([x, groups, 2 * m, m]);
        let a_inv = pair.clone().narrow(2, 0, m);
        let d_inv = pair.narrow(2, m, m);
        let kg = k.clone().reshape([x, groups, 2 * m, n]);
        let corner = kg
            .clone()
            .narrow(2, m, m)
            .gemm(kg.narrow(2, 0, m).swap_dims(2, 3))
            * beta
                .clone()
                .reshape([x, groups, 2 * m])
                .narrow(2, m, m)
                .unsqueeze_dim(3); // [x, groups, m, m]
        let lower = d_inv.clone().gemm(corner).gemm(a_inv.clone()).neg();
        let upper = Tensor::cat(vec![a_inv.clone(), a_inv.zeros_like()], 3);
        inv = Tensor::cat(vec![upper, Tensor::cat(vec![lower, d_inv], 3)], 2);
        m *= 2;
    }
    inv.reshape([b, h, nt, chunk, chunk])
}

/// The `n × n` identity in `dtype`.
fn identity(n: usize, dtype: burn::tensor::DType, device: &Device) -> Tensor<4> {
    let eye: Vec<f64> = (0..n * n)
        .map(|i| f64::from(u8::from(i / n == i % n)))
        .collect();
    float_tensor(eye, [1, 1, n, n], dtype, device)
}
