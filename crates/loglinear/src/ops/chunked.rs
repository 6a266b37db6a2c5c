//! The chunkwise form: O(T·C) intra-chunk blocks plus one vectorised pass per chunk level,
//! O(T log(T/C)) in all (spec §3.3).
//!
//! For chunk size `C = 2^c`, every pair of tokens in different chunks has level
//! `lv = bitlen(t XOR s) > c`, and the pairs of level `lv` are exactly: keys in the first half
//! and queries in the second half of an aligned period of `2^lv` tokens. So each level is
//! one pass over the sequence cut into periods: sum the key half into one `N×P` state (decayed
//! to the end of the key half), then read it from every query of the second half (decayed from
//! there). Decays are differences of cumulative sums *within a period*, never long products.
//! This is the same decomposition as the published kernels' "one state pass per chunk level",
//! with the state of a period computed in one product instead of a scan over its chunks.

use burn::prelude::*;

use super::{
    AttnOutput, FenwickState, LogLinearInput, final_state, heads_first, initial_state_output,
    int_tensor, pad_zeros, zeros_as,
};
use crate::fenwick::{self, bitlen};
use crate::linalg::matmul;

/// Chunkwise log-linear attention with chunk size `chunk` (a power of two). Any `T`: the
/// segment is zero-padded to whole chunks (and periods), which leaves every real output
/// unchanged by causality; the padding is sliced off again.
///
/// # Shapes
/// See [`LogLinearInput`]; `o: [B, T, H, P]`.
///
/// # Panics
/// If `chunk` is not a power of two, or on the shape errors of [`LogLinearInput::dims`].
pub fn chunked(
    x: &LogLinearInput,
    chunk: usize,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    const OP: &str = "log_linear_attn(chunked)";
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
    let (b, t, h, n, p, l) = (d.b, d.t, d.h, d.n, d.p, d.l);
    if t == 0 {
        let state = return_state.then(|| match initial {
            Some(s) => s.clone(),
            None => FenwickState::empty(b, h, l, n, p, x.dtype(), &x.device()),
        });
        return AttnOutput {
            o: zeros_as(&x.v, [b, 0, h, p]),
            state,
        };
    }
    let device = x.device();
    let c = chunk.trailing_zeros() as usize;
    let end = start + t;

    // Shift the padded segment's start back to a multiple of the largest period any pair inside
    // it uses, so chunks and periods sit at multiples of their size, as the level structure needs.
    let align = 1usize << bitlen(start ^ (end - 1)).max(c);
    let base = start / align * align;
    let front = start - base;
    let len = (front + t).div_ceil(chunk) * chunk;
    let back = len - front - t;
    let nt = len / chunk;
    let pad = |x: Tensor<4>| pad_zeros(heads_first(x), 2, front, back);
    let q = pad(x.q.clone()); // [B, H, T', N]
    let k = pad(x.k.clone()); // [B, H, T', N]
    let v = pad(x.v.clone()); // [B, H, T', P]
    let lambda = pad(x.lambda.clone()); // [B, H, T', L]
    let g = pad_zeros(x.g.clone().swap_dims(1, 2), 2, front, back); // [B, H, T']

    // (a) Intra-chunk blocks: the C×C level pattern is the same in every chunk. Levels above
    // L − 1 only occur between padding tokens, so they are clamped to stay in range.
    let mut pattern = vec![0i64; chunk * chunk];
    for i in 0..chunk {
        for j in 0..=i {
            pattern[i * chunk + j] = fenwick::level(i, j).min(l - 1) as i64;
        }
    }
    let pattern =
        int_tensor(pattern, [1, 1, 1, chunk, chunk], &device).expand([b, h, nt, chunk, chunk]);
    let above = Tensor::<2, Bool>::tril_mask([chunk, chunk], 0, &device)
        .unsqueeze::<5>()
        .expand([b, h, nt, chunk, chunk]);
    let gc = g.clone().reshape([b, h, nt, chunk]).cumsum(3); // [B, H, NT, C]
    let diff = gc.clone().unsqueeze_dim::<5>(4) - gc.unsqueeze_dim::<5>(3);
    let decay = diff.mask_fill(above.clone(), 0.0).exp(); // [B, H, NT, C, C]
    let hier = lambda
        .clone()
        .reshape([b, h, nt, chunk, l])
        .gather(4, pattern);
    let qc = q.clone().reshape([b, h, nt, chunk, n]);
    let kc = k.clone().reshape([b, h, nt, chunk, n]);
    let scores = matmul(qc, kc.swap_dims(3, 4)); // [B, H, NT, C, C]
    let mask = (scores * decay * hier).mask_fill(above, 0.0);
    let vc = v.clone().reshape([b, h, nt, chunk, p]);
    let mut o = matmul(mask, vc).reshape([b, h, len, p]);

    // (b) One pass per level above the chunk: keys in the first half of each aligned period of
    // 2^lv tokens, queries in the second half. `top` is the highest level any real pair uses.
    let top = bitlen(end - 1 - base);
    for lv in (c + 1)..=top {
        let half = 1usize << (lv - 1);
        let period = 2 * half;
        let np = len.div_ceil(period);
        let extra = np * period - len;
        let split = |x: Tensor<4>, width: usize| {
            pad_zeros(x, 2, 0, extra).reshape([b, h, np, period, width])
        };
        let qp = split(q.clone(), n); // [B, H, NP, 2·half, N]
        let kp = split(k.clone(), n);
        let vp = split(v.clone(), p);
        let gp = pad_zeros(g.clone(), 2, 0, extra)
            .reshape([b, h, np, period])
            .cumsum(3); // [B, H, NP, 2·half]
        let lam = pad_zeros(
            lambda.clone().narrow(3, lv, 1).squeeze_dim::<3>(3),
            2,
            0,
            extra,
        )
        .reshape([b, h, np, period])
        .narrow(3, half, half); // [B, H, NP, half]
        let key_end = gp.clone().narrow(3, half - 1, 1); // [B, H, NP, 1]
        let key_decay = (key_end.clone() - gp.clone().narrow(3, 0, half)).exp();
        let keys = kp.narrow(3, 0, half).swap_dims(3, 4); // [B, H, NP, N, half]
        let values = vp.narrow(3, 0, half) * key_decay.unsqueeze_dim(4); // [B, H, NP, half, P]
        let state = matmul(keys, values); // [B, H, NP, N, P]
        let query_weight = (gp.narrow(3, half, half) - key_end).exp() * lam; // [B, H, NP, half]
        let read = matmul(qp.narrow(3, half, half), state) * query_weight.unsqueeze_dim(4);
        let level_out = Tensor::cat(vec![zeros_as(&read, [b, h, np, half, p]), read], 3)
            .reshape([b, h, np * period, p])
            .narrow(2, 0, len);
        o = o + level_out;
    }

    let mut o = o.narrow(2, front, t); // [B, H, T, P]
    if initial.is_some() || return_state {
        let gamma = x.g.clone().swap_dims(1, 2).cumsum(2); // [B, H, T]
        if let Some(init) = initial {
            let q = heads_first(x.q.clone());
            let lambda = heads_first(x.lambda.clone());
            o = o + initial_state_output(&q, &lambda, &gamma, init);
        }
        if return_state {
            let k = heads_first(x.k.clone());
            let v = heads_first(x.v.clone());
            let state = final_state(&k, &v, &gamma, l, initial);
            return AttnOutput {
                o: o.swap_dims(1, 2),
                state: Some(state),
            };
        }
    }
    AttnOutput {
        o: o.swap_dims(1, 2),
        state: None,
    }
}
