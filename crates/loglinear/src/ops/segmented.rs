//! The sequence-parallel form: the sequence cut into aligned segments of `S = 2^s` tokens, each
//! computed by another form as an independent row of the batch (every pair inside a segment),
//! plus the chunked form's level passes for the pairs across segments.
//!
//! Aligned segments keep the level structure. A segment starts at a multiple of `S`, so a pair
//! inside it has the level of its local positions (`t XOR s` is unchanged) and its decay is a
//! difference of local cumulative sums: the inner form computes it exactly. A pair across
//! segments has level `bitlen(t XOR s) > s`, and the pairs of each such level are the key and
//! query halves of aligned periods, as in the chunked form with a chunk of `S` tokens
//! ([`super::chunked::add_level_passes`]; `ops/README.md`).
//!
//! Why: the fused kernels walk a (batch·head)'s whole sequence in one cube, so a long sequence
//! with few heads (B = 1 at T = 131,072) leaves most of a GPU idle; as segments it is
//! `B·H·T/S` rows, and the levels above `s` are `log2(T/S)` batched products.

use burn::prelude::*;
use burn::tensor::DType;

use super::chunked::add_level_passes;
use super::{LogLinearInput, heads_first, pad_zeros};
use crate::fenwick::{self, bitlen};

/// Log-linear attention over aligned segments of `segment` tokens: `inner` computes every
/// segment as one row of a batch of `B·⌈T/segment⌉` sequences (given λ's first
/// `num_levels(segment)` levels), the pairs across segments are added by one chunked level pass
/// per level above the segment. Any `T` (the last segment is zero-padded, which leaves every
/// real output unchanged by causality); sequences no longer than one segment go to `inner`
/// whole. Half-precision inputs: the passes across segments compute in f32, and `o` is returned
/// in the input dtype.
///
/// # Shapes
/// See [`LogLinearInput`]; `o: [B, T, H, P]`; `inner` maps a `LogLinearInput` of
/// `[B·T'/segment, segment, H, ·]` to its `o`.
///
/// # Panics
/// If `segment` is not a power of two, or on the shape errors of [`LogLinearInput::dims`].
pub fn segmented(
    x: &LogLinearInput,
    segment: usize,
    inner: impl FnOnce(&LogLinearInput) -> Tensor<4>,
) -> Tensor<4> {
    const OP: &str = "log_linear_attn(segmented)";
    assert!(
        segment.is_power_of_two(),
        "{OP}: segment length {segment} is not a power of two"
    );
    let d = x.dims();
    fenwick::check_levels(OP, d.l, d.t);
    if d.t <= segment {
        return inner(x);
    }
    let (b, t, h, n, p) = (d.b, d.t, d.h, d.n, d.p);
    let dtype = x.dtype();
    let len = t.div_ceil(segment) * segment;
    let rows = b * (len / segment);
    let pad = |x: Tensor<4>| pad_zeros(x, 1, 0, len - t);
    let (q, k, v, lambda) = (
        pad(x.q.clone()),
        pad(x.k.clone()),
        pad(x.v.clone()),
        pad(x.lambda.clone()),
    );
    let g = pad_zeros(x.g.clone(), 1, 0, len - t); // [B, T', H]
    let inner_levels = fenwick::num_levels(segment);
    let local = LogLinearInput {
        q: q.clone().reshape([rows, segment, h, n]),
        k: k.clone().reshape([rows, segment, h, n]),
        v: v.clone().reshape([rows, segment, h, p]),
        g: g.clone().reshape([rows, segment, h]),
        lambda: lambda
            .clone()
            .narrow(3, 0, inner_levels)
            .reshape([rows, segment, h, inner_levels]),
    };
    let inside = inner(&local).reshape([b, len, h, p]);

    // The pairs across segments, heads first; half precision widened as in the tensor forms
    // (decays are differences of cumulative sums, which bf16 cannot hold).
    let wide = match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    };
    let heads = |x: Tensor<4>| heads_first(x).cast(wide);
    let across = add_level_passes(
        Tensor::zeros([b, h, len, p], (&x.device(), wide)),
        &heads(q),
        &heads(k),
        &heads(v),
        &g.swap_dims(1, 2).cast(wide),
        &heads(lambda),
        (bitlen(segment - 1) + 1)..=bitlen(t - 1),
    );
    let o = inside.cast(wide) + across.swap_dims(1, 2);
    o.narrow(1, 0, t).cast(dtype)
}
