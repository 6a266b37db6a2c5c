//! The sequence-parallel form: the sequence cut into aligned segments of `S = 2^s` tokens, each
//! computed by another form as an independent row of the batch (every pair inside a segment),
//! plus the pairs across segments from one `N×P` state per segment.
//!
//! Aligned segments keep the level structure. A segment starts at a multiple of `S`, so a pair
//! inside it has the level of its local positions (`t XOR s` is unchanged) and its decay is a
//! difference of local cumulative sums: the inner form computes it exactly. A pair across
//! segments `j' < j` has level `s + bitlen(j XOR j')`, and the pairs of level `s + i` are the key
//! half (segments) and query half of aligned periods of `2^i` segments (`ops/README.md`). So:
//!
//! ```text
//! γ_t   = local inclusive cumsum of g within its segment,  c_j = γ at the end of segment j
//! KS_j  = Σ_{s in j} e^{c_j − γ_s} k_s v_sᵀ                 one N×P state per segment (one product)
//! for i = 1 ..: per period p of 2^i segments, C = inclusive cumsum of c over the period
//!     R_{j,i} = Σ_{j' in key half} e^{C_{j−1} − C_j'} KS_j'    for j in the query half, else 0
//! o_t  += e^{γ_t} · Σ_i λ[t, s+i] · q_tᵀ R_{j,i}                 for t in segment j
//! ```
//!
//! Every exponent is ≤ 0 (sums of log-decays over spans that end where they are read). The key
//! side costs one product over the sequence for all levels; the per-level states `R` are small
//! (`N×P` a segment); and the reads of all levels are one product a segment, the queries times
//! the states side by side (`[R_{j,1} … R_{j,I}]`), weighted per level by `λ[t, s+i] e^{γ_t}` and
//! summed: the chunked form's level passes with the key side summarised per segment and the
//! levels side by side in one product.
//!
//! Why: the fused kernels walk a (batch·head)'s whole sequence in one cube, so a long sequence
//! with few heads (B = 1 at T = 131,072) leaves most of a GPU idle; as segments it is
//! `B·H·T/S` rows. (A first version, session 15, added the pairs across segments with the
//! chunked form's level passes over the whole sequence in f32: 20–55 ms a level on the H200,
//! slower than one launch everywhere; bench/RESULTS.md.)

use burn::prelude::*;
use burn::tensor::DType;

use super::{LogLinearInput, heads_first, pad_zeros, zeros_as};
use crate::fenwick::{self, bitlen};
use crate::linalg::matmul;

/// Log-linear attention over aligned segments of `segment` tokens: `inner` computes every
/// segment as one row of a batch of `B·⌈T/segment⌉` sequences (given λ's first
/// `num_levels(segment)` levels), the pairs across segments come from one state per segment
/// (module docs). Any `T` (the last segment is zero-padded, which leaves every real output
/// unchanged by causality); sequences no longer than one segment go to `inner` whole.
/// Half-precision inputs: products take operands in the input dtype with the decays, weights
/// and sums in f32 (as the fused kernels round their states), and `o` is returned in the input
/// dtype.
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
    let segments = t.div_ceil(segment);
    let len = segments * segment;
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
        q: q.clone().reshape([b * segments, segment, h, n]),
        k: k.clone().reshape([b * segments, segment, h, n]),
        v: v.clone().reshape([b * segments, segment, h, p]),
        g: g.clone().reshape([b * segments, segment, h]),
        lambda: lambda.clone().narrow(3, 0, inner_levels).reshape([
            b * segments,
            segment,
            h,
            inner_levels,
        ]),
    };
    let inside = inner(&local).reshape([b, len, h, p]);

    // Decays, weights and sums in f32 for half-precision inputs; products in the input dtype.
    let wide = match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    };
    let (s, ns) = (segment, segments);
    let q = heads_first(q); // [B, H, T', N]
    let k = heads_first(k).reshape([b, h, ns, s, n]);
    let v = heads_first(v).reshape([b, h, ns, s, p]);
    let lambda = heads_first(lambda).cast(wide); // [B, H, T', L]
    let gamma = g
        .swap_dims(1, 2)
        .cast(wide)
        .reshape([b, h, ns, s])
        .cumsum(3); // [B, H, NS, S]
    let ends = gamma.clone().narrow(3, s - 1, 1); // [B, H, NS, 1]

    // One state per segment, decayed to the segment's end: KS_j = Σ_s e^{c_j − γ_s} k_s v_sᵀ.
    let key_weight = (ends.clone() - gamma.clone()).exp(); // [B, H, NS, S]
    let weighted = (v.cast(wide) * key_weight.unsqueeze_dim(4)).cast(dtype);
    let states = matmul(k.swap_dims(3, 4), weighted).cast(wide); // [B, H, NS, N, P]
    let ends = ends.reshape([b, h, ns]);
    let read_decay = gamma.exp().reshape([b, h, len]); // e^{γ_t}, [B, H, T']

    // Per level of the pairs across segments, the state each segment reads, decayed to the
    // segment's start: a query-half segment j of a period of 2^i segments reads its key half's
    // states, R_{j,i} = Σ_{j' in key half} e^{C_{j−1} − C_j'} KS_j'; a key-half segment reads
    // nothing (R = 0). All small tensors: [B, H, NS, N·P] a level.
    let across_levels = bitlen(ns - 1);
    let mut level_states = Vec::with_capacity(across_levels);
    for i in 1..=across_levels {
        let period = 1usize << i;
        let half = period / 2;
        let np = ns.div_ceil(period);
        let extra = np * period - ns; // whole segments of padding
        let ends = pad_zeros(ends.clone(), 2, 0, extra).reshape([b, h, np, period]);
        let cum = ends.clone().cumsum(3); // C, [B, H, NP, 2^i]
        let key_end = cum.clone().narrow(3, half - 1, 1); // [B, H, NP, 1]
        let key_weight = (key_end.clone() - cum.clone().narrow(3, 0, half)).exp();
        let key_states = pad_zeros(states.clone(), 2, 0, extra)
            .reshape([b, h, np, period, n * p])
            .narrow(3, 0, half);
        let period_state = (key_states * key_weight.unsqueeze_dim(4)).sum_dim(3); // [B, H, NP, 1, N·P]
        // e^{C_{j−1} − C_end(key half)} for the query half's segments j.
        let query_decay = ((cum - ends).narrow(3, half, half) - key_end).exp(); // [B, H, NP, half]
        let read = period_state * query_decay.unsqueeze_dim(4); // [B, H, NP, half, N·P]
        let state = Tensor::cat(vec![zeros_as(&read, [b, h, np, half, n * p]), read], 3)
            .reshape([b, h, np * period, n * p])
            .narrow(2, 0, ns);
        level_states.push(state);
    }
    // Every level in one product: token t of segment j reads q_tᵀ [R_{j,1} … R_{j,I}] (the
    // states side by side, one [S, N] × [N, I·P] product a segment), then the weighted sum
    // Σ_i λ[t, s+i] e^{γ_t} (q_tᵀ R_{j,i}) in f32. (Weighting the queries instead — [w_{t,1} q_t,
    // …, w_{t,I} q_t] times the states stacked — moves I·N values a token instead of I·P, and
    // Burn runs its two-sided broadcast unfused: 5 ms slower on the LM step, session 17.)
    let states = Tensor::cat(
        level_states
            .into_iter()
            .map(|r| r.reshape([b, h, ns, n, p]))
            .collect(),
        4,
    ); // [B, H, NS, N, I·P]
    let reads = matmul(q.reshape([b, h, ns, s, n]), states.cast(dtype)).cast(wide); // [B, H, NS, S, I·P]
    // λ's levels s+1 .. s+I: all present, since I = bitlen(⌊(T−1)/S⌋) = bitlen(T−1) − s and
    // check_levels gave L ≥ bitlen(T−1) + 1.
    let levels = lambda.narrow(3, bitlen(s - 1) + 1, across_levels); // [B, H, T', I]
    let weight = levels * read_decay.unsqueeze_dim(3); // [B, H, T', I]
    let rows = b * h * len;
    let weighted =
        reads.reshape([rows, across_levels, p]) * weight.reshape([rows, across_levels, 1]);
    let across = weighted.sum_dim(1).reshape([b, h, len, p]);
    let o = inside.cast(wide) + across.swap_dims(1, 2);
    o.narrow(1, 0, t).cast(dtype)
}

/// Sequences shorter than this are walked whole whatever the rows: the shortest at which
/// segments were measured to win (the LM step at T = 8192, bench/RESULTS.md, session 16).
const PLAN_MIN_SEQUENCE: usize = 8192;
/// The shortest segment the plan cuts (each halving adds a level across segments).
const PLAN_MIN_SEGMENT: usize = 1024;
/// The rows per multiprocessor the plan aims at: at B = 1, T = 131,072, H = 48 on the H200's
/// 132 multiprocessors that is segments of 8,192 (768 rows).
const PLAN_ROWS_PER_MULTIPROCESSOR: usize = 4;
/// Rows per multiprocessor from which the backward keeps one walk per sequence: the
/// tensor-core backward runs one cube per multiprocessor, so fewer than two rows per
/// multiprocessor leave part of the card idle in the last wave (T = 32,768 × 4, H = 48: 192
/// rows, 1.45 waves; one walk 110.2 ms forward+backward on an H100, segments 83.2, session 34).
const PLAN_WHOLE_ROWS_PER_MULTIPROCESSOR: usize = 2;
/// The same for the forward, whose kernel runs two cubes per multiprocessor: segments only
/// below one row per multiprocessor (H100, session 34: T = 32,768 × 4, 1.45 rows per
/// multiprocessor, one walk 12.1 ms against 22.4 in segments; B = 1, T = 131,072, 0.36 rows,
/// one walk 29.6 ms against 22.8).
const PLAN_WHOLE_ROWS_PER_MULTIPROCESSOR_FORWARD: usize = 1;

/// How [`crate::ops::Form::Fused`] walks the sequences: the segment length of each pass, `None`
/// for one walk over each whole sequence. The forward and the backward each walk as suits their
/// kernels (the backward recomputes the states it needs, so it need not walk as the forward did).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedWalk {
    /// The forward kernel's walk (the output; in training the forward pass).
    pub forward: Option<usize>,
    /// The backward kernels' walk.
    pub backward: Option<usize>,
}

/// [`planned_segment`] for each pass: the forward with its own threshold
/// ([`PLAN_WHOLE_ROWS_PER_MULTIPROCESSOR_FORWARD`]), the backward as [`planned_segment`].
pub fn planned_walk(rows: usize, t: usize, multiprocessors: usize) -> PlannedWalk {
    PlannedWalk {
        forward: segment_below(
            PLAN_WHOLE_ROWS_PER_MULTIPROCESSOR_FORWARD,
            rows,
            t,
            multiprocessors,
        ),
        backward: planned_segment(rows, t, multiprocessors),
    }
}

/// The segment length the backward of [`crate::ops::Form::Fused`] walks in (the forward's:
/// [`planned_walk`]) on a device of `multiprocessors` multiprocessors, for `rows = B·H` sequences
/// of `t` tokens, or `None` for one walk over each whole sequence. Segments only where whole walks leave the card idle — fewer than
/// [`PLAN_WHOLE_ROWS_PER_MULTIPROCESSOR`] rows per multiprocessor, each walking a long
/// sequence — and then the longest power of two that gives [`PLAN_ROWS_PER_MULTIPROCESSOR`]
/// rows per multiprocessor, but no shorter than [`PLAN_MIN_SEGMENT`].
///
/// The kernels walk the segments themselves (each segment a cube, the levels across segments
/// written before the launch). Until session 32 the segments were batch rows of one launch
/// with the pairs across them added by tensor ops, which lost to one walk from one row per
/// multiprocessor up (T = 32,768 × 4 on an H100: 110 ms against 123–143, session 31) and won
/// below it (B = 1, T = 131,072, H = 48 on the H200: 483 → 189 ms, session 17).
pub fn planned_segment(rows: usize, t: usize, multiprocessors: usize) -> Option<usize> {
    segment_below(PLAN_WHOLE_ROWS_PER_MULTIPROCESSOR, rows, t, multiprocessors)
}

/// [`planned_segment`] with one walk kept from `whole` rows per multiprocessor.
fn segment_below(whole: usize, rows: usize, t: usize, multiprocessors: usize) -> Option<usize> {
    if rows >= whole * multiprocessors || t < PLAN_MIN_SEQUENCE {
        return None;
    }
    let want = PLAN_ROWS_PER_MULTIPROCESSOR * multiprocessors;
    // The longest power of two shorter than the sequence, halved until the rows suffice.
    let mut segment = t.next_power_of_two() / 2;
    while segment > PLAN_MIN_SEGMENT && rows * t.div_ceil(segment) < want {
        segment /= 2;
    }
    Some(segment.max(PLAN_MIN_SEGMENT))
}

#[cfg(test)]
mod tests {
    use super::{PlannedWalk, planned_segment, planned_walk};

    /// The plan picks the measured winners and leaves the measured losers in one launch.
    #[test]
    fn the_plan_segments_long_sequences_with_few_rows_only() {
        let h200 = 132;
        // B = 1, T = 131,072, H = 48: segments of 8,192 (768 rows).
        assert_eq!(planned_segment(48, 131_072, h200), Some(8192));
        // The LM step at 8192 × 4 with 8 heads: the shortest segment, 1,024 (256 rows).
        assert_eq!(planned_segment(32, 8192, h200), Some(1024));
        // 768 rows (T = 8192 × 16, H = 48): the card is full, one walk per sequence.
        assert_eq!(planned_segment(768, 8192, h200), None);
        // 192 rows (T = 32,768 × 4, H = 48): 1.45 rows per multiprocessor, segments of 8,192.
        assert_eq!(planned_segment(192, 32_768, h200), Some(8192));
        // Two rows per multiprocessor and more: one walk per sequence.
        assert_eq!(planned_segment(2 * h200, 1 << 20, h200), None);
        // Short sequences: one walk each, however few the rows.
        assert_eq!(planned_segment(1, 4096, h200), None);
        assert_eq!(planned_segment(1, 8191, h200), None);
        // Not a power of two: segments shorter than the sequence, a partial last one.
        assert_eq!(planned_segment(1, 10_000, h200), Some(1024));
        assert_eq!(planned_segment(100, 8192, h200), Some(1024));
        // Few multiprocessors: few segments.
        assert_eq!(planned_segment(2, 8192, 1), None);
        assert_eq!(planned_segment(1, 8192, 1), Some(2048));
        assert_eq!(planned_segment(1, 8192, 2), Some(1024));
        assert_eq!(planned_segment(2, 65_536, 4), Some(8192));
        for (rows, t, sms) in [(1, 9000, 132), (7, 200_000, 132), (3, 16_384, 8)] {
            let s = planned_segment(rows, t, sms).unwrap();
            assert!(
                s.is_power_of_two() && s < t && s >= 1024,
                "{rows} {t} {sms}: {s}"
            );
        }
    }

    /// The forward keeps one walk down to one row per multiprocessor, the backward to two.
    #[test]
    fn the_forward_walks_whole_sequences_down_to_one_row_per_multiprocessor() {
        let h200 = 132;
        let walk = |rows, t| planned_walk(rows, t, h200);
        // T = 32,768 × 4, H = 48 (192 rows): one forward walk, a backward in segments of 8,192.
        assert_eq!(
            walk(192, 32_768),
            PlannedWalk {
                forward: None,
                backward: Some(8192)
            }
        );
        // B = 1, T = 131,072, H = 48: both in segments of 8,192.
        assert_eq!(
            walk(48, 131_072),
            PlannedWalk {
                forward: Some(8192),
                backward: Some(8192)
            }
        );
        // One row per multiprocessor exactly: the forward walks whole sequences.
        assert_eq!(walk(h200, 65_536).forward, None);
        assert_eq!(walk(h200 - 1, 65_536).forward, Some(8192));
        // Where the forward segments, it cuts as the backward does.
        for (rows, t) in [(1, 9000), (7, 200_000), (100, 8192), (32, 8192)] {
            assert_eq!(walk(rows, t).forward, planned_segment(rows, t, h200));
        }
        // 768 rows (T = 8192 × 16, H = 48), short sequences: one walk in both passes.
        for (rows, t) in [(768, 8192), (1, 4096)] {
            assert_eq!(
                walk(rows, t),
                PlannedWalk {
                    forward: None,
                    backward: None
                }
            );
        }
    }
}
