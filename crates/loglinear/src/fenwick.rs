//! The Fenwick (binary-counter) level structure of log-linear attention (spec §1).
//!
//! Query `t` sees its past `[0, t]` through a sentinel bucket `{t}` (level 0) and one bucket per
//! set bit `j` of `t`: level `j + 1` holds the `2^j` positions `[hi, hi + 2^j)` with
//! `hi = (t >> (j + 1)) << (j + 1)`. The level of a pair is `bitlen(t XOR s)` (0 on the
//! diagonal). Everything here is integer arithmetic: no lookup tables, no cap on `T`.

use std::ops::Range;

/// Number of bits of `n` (`bitlen(0) = 0`, `bitlen(1) = 1`, `bitlen(2) = bitlen(3) = 2`).
#[inline]
pub fn bitlen(n: usize) -> usize {
    (usize::BITS - n.leading_zeros()) as usize
}

/// Level of key `s` seen from query `t` (0-based, `s ≤ t`): 0 for `s == t`, else
/// `bitlen(t XOR s)`, i.e. 1 + the index of the highest bit where `t` and `s` differ.
///
/// # Panics
/// If `s > t` (a key after its query has no level).
#[inline]
pub fn level(t: usize, s: usize) -> usize {
    assert!(
        s <= t,
        "fenwick::level({t}, {s}): the key comes after the query"
    );
    bitlen(t ^ s)
}

/// Number of λ slots a sequence of length `t_len` reads: `⌈log2 T⌉ + 1` (1 for `T ≤ 1`).
///
/// ```
/// use loglinear::fenwick::num_levels;
/// assert_eq!([1, 2, 3, 4, 8, 64, 16384].map(num_levels), [1, 2, 3, 3, 4, 7, 15]);
/// ```
pub fn num_levels(t_len: usize) -> usize {
    if t_len <= 1 { 1 } else { bitlen(t_len - 1) + 1 }
}

/// The longest sequence whose levels fit into `levels` λ slots: `2^(levels − 1)`.
///
/// # Panics
/// If `levels == 0`.
pub fn max_len(levels: usize) -> usize {
    assert!(
        levels > 0,
        "fenwick::max_len: a model needs at least one level"
    );
    1usize
        .checked_shl((levels - 1) as u32)
        .unwrap_or(usize::MAX)
}

/// Checks that `levels` λ slots cover positions `0..end` and says which count is needed if not.
///
/// `op` names the caller in the message.
pub fn check_levels(op: &str, levels: usize, end: usize) {
    let need = num_levels(end);
    assert!(
        levels >= need,
        "{op}: lambda has {levels} levels, but positions 0..{end} need {need} \
         (num_levels(T) = ceil(log2 T) + 1); build the model with at least {need} levels"
    );
}

/// The bucket of query `t` at `level`: a range of source positions, empty when the level is
/// unoccupied (bit `level − 1` of `t` is 0). Level 0 is `{t}`.
pub fn bucket(t: usize, level: usize) -> Range<usize> {
    if level == 0 {
        return t..t + 1;
    }
    let bit = level - 1;
    if bit >= usize::BITS as usize || (t >> bit) & 1 == 0 {
        return t..t;
    }
    let hi = (t >> level) << level;
    hi..hi + (1 << bit)
}

/// All non-empty buckets of query `t` as `(level, range)`, finest first.
pub fn buckets(t: usize) -> impl Iterator<Item = (usize, Range<usize>)> {
    (0..=bitlen(t))
        .map(move |l| (l, bucket(t, l)))
        .filter(|(_, r)| !r.is_empty())
}

/// Occupancy `n_ℓ` of each of `levels` slots of the recurrent state after `position` tokens
/// (tokens `0..position` inserted): 1 at level 0 and `2^(ℓ−1)` at every level whose bit of
/// `position − 1` is set (spec §3.2, oracle O5).
pub fn occupancy(position: usize, levels: usize) -> Vec<usize> {
    let mut counts = vec![0; levels];
    if position == 0 {
        return counts;
    }
    let last = position - 1;
    for (l, n) in counts.iter_mut().enumerate() {
        *n = bucket(last, l).len();
    }
    counts
}

/// Number of low levels that the binary-counter carry folds into level `m` when token `t` is
/// inserted (levels `0..m` are summed into level `m`): 0 for the first token, otherwise
/// `trailing_ones(t − 1) + 1`.
pub fn carry_levels(t: usize) -> usize {
    if t == 0 {
        0
    } else {
        (t - 1).trailing_ones() as usize + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recursive definition of the reference code (`get_level_index_weak`).
    fn level_recursive(t: usize, s: usize) -> usize {
        if s == t {
            return 0;
        }
        let m = bitlen(t) - 1;
        let v = 1 << m;
        if s < v {
            m + 1
        } else {
            level_recursive(t - v, s - v)
        }
    }

    #[test]
    fn level_matches_recursive_definition() {
        for t in 0..1024 {
            for s in 0..=t {
                assert_eq!(level(t, s), level_recursive(t, s), "t={t} s={s}");
            }
        }
    }

    #[test]
    fn oracle_o1_levels() {
        let cases = [
            (5, 4, 1),
            (5, 3, 3),
            (6, 5, 2),
            (7, 6, 1),
            (8, 0, 4),
            (15, 8, 3),
            (1023, 0, 10),
            (1024, 1023, 11),
        ];
        for (t, s, l) in cases {
            assert_eq!(level(t, s), l, "level({t},{s})");
        }
        let table8 = [
            "0", "10", "220", "2210", "33330", "333310", "3333220", "33332210",
        ];
        for (t, row) in table8.iter().enumerate() {
            let got: String = (0..=t)
                .map(|s| char::from(b'0' + level(t, s) as u8))
                .collect();
            assert_eq!(&got, row, "row {t}");
        }
    }

    #[test]
    fn num_levels_table() {
        let cases = [
            (1, 1),
            (2, 2),
            (3, 3),
            (4, 3),
            (8, 4),
            (64, 7),
            (128, 8),
            (256, 9),
            (512, 10),
            (1024, 11),
            (2048, 12),
            (16384, 15),
        ];
        for (t, l) in cases {
            assert_eq!(num_levels(t), l, "num_levels({t})");
            assert!(max_len(l) >= t && (l == 1 || max_len(l - 1) < t));
        }
        for t in 1..300 {
            for s in 0..t {
                assert!(level(t - 1, s) < num_levels(t));
            }
        }
    }

    #[test]
    fn buckets_partition_the_past() {
        for t in 0..2000usize {
            let mut seen = vec![0u8; t + 1];
            let mut total = 0;
            for (l, r) in buckets(t) {
                if l > 0 {
                    assert_eq!(r.len(), 1 << (l - 1), "t={t} l={l}");
                }
                for s in r.clone() {
                    assert_eq!(level(t, s), l);
                    seen[s] += 1;
                }
                total += r.len();
            }
            assert_eq!(total, t + 1);
            assert!(seen.iter().all(|&c| c == 1), "t={t}");
        }
    }

    /// Oracle O5: the counts of the spec's literal cascade, and the derived occupancy.
    #[test]
    fn oracle_o5_occupancy() {
        let expected = [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 0, 2, 0, 0],
            [1, 1, 2, 0, 0],
            [1, 0, 0, 4, 0],
            [1, 1, 0, 4, 0],
            [1, 0, 2, 4, 0],
            [1, 1, 2, 4, 0],
        ];
        // The spec's cascade with explicit counts.
        let mut n = [0usize; 5];
        for (t, row) in (0..16).zip(expected.iter().map(Some).chain(std::iter::repeat(None))) {
            let mut l = 0;
            while l + 1 < n.len() && n[l] == 1 << l {
                n[l + 1] += n[l];
                n[l] = 0;
                l += 1;
            }
            assert!(n[l] < 1 << l, "cascade overflow");
            n[0] += 1;
            if let Some(row) = row {
                assert_eq!(&n, row, "cascade after t={t}");
            }
            assert_eq!(occupancy(t + 1, 5), n.to_vec(), "occupancy after t={t}");
        }
        assert_eq!(n, [1, 1, 2, 4, 8]);
    }

    #[test]
    fn carry_folds_exactly_the_levels_the_cascade_merges() {
        for t in 1..5000usize {
            let before = occupancy(t, 16);
            let after = occupancy(t + 1, 16);
            let m = carry_levels(t);
            // levels 0..m end empty except the re-inserted level 0; level m holds their sum
            let folded: usize = before[..=m].iter().sum();
            assert_eq!(after[m], folded, "t={t}");
            assert!(after[1..m].iter().all(|&c| c == 0), "t={t}");
            assert_eq!(after[0], 1);
            assert_eq!(&after[m + 1..], &before[m + 1..]);
        }
    }

    #[test]
    fn oracle_o11_chunk_levels() {
        // C = 64: a chunk pair's level is c + bitlen(ct XOR cs) for every token pair in it.
        let c = 64;
        let check = |ct: usize, cs: usize, want: usize| {
            for (dt, ds) in [(0, 0), (63, 0), (0, 63), (17, 40)] {
                assert_eq!(level(ct * c + dt, cs * c + ds), want, "chunks ({ct},{cs})");
            }
        };
        check(5, 4, 7);
        for cs in 0..4 {
            check(5, cs, 9);
            check(4, cs, 9);
        }
        for cs in 0..8 {
            check(8, cs, 10);
        }
        check(255, 0, 14);
        for t in 0..64 {
            for s in 0..=t {
                assert!(level(t, s) <= 6);
            }
        }
    }

    #[test]
    #[should_panic(expected = "need 4")]
    fn check_levels_names_the_need() {
        check_levels("test", 3, 5);
    }
}
