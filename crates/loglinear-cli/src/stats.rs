//! The statistics `loglinear summarize` reports when it compares λ modes: an exact (Clopper–
//! Pearson) binomial interval for the fraction of runs that solved a task, Fisher's exact test
//! between two such fractions, the exact McNemar test when the runs pair up by seed, and a
//! percentile-bootstrap interval for a difference of means.
//! Few seeds give bimodal outcomes (a run solves the task or stays at chance), so a mean ± std
//! alone says little; these are the standard small-sample tools for either kind of outcome.

use rand::{Rng, SeedableRng};

/// `ln n!` (exact sum; the counts here are runs, at most a few thousand).
fn ln_factorial(n: usize) -> f64 {
    (2..=n).map(|i| (i as f64).ln()).sum()
}

/// `ln C(n, k)`.
fn ln_choose(n: usize, k: usize) -> f64 {
    ln_factorial(n) - ln_factorial(k) - ln_factorial(n - k)
}

/// `P(X ≤ k)` for `X ~ Binomial(n, p)`.
fn binomial_cdf(k: usize, n: usize, p: f64) -> f64 {
    if p <= 0.0 {
        return 1.0;
    }
    if p >= 1.0 {
        return if k >= n { 1.0 } else { 0.0 };
    }
    (0..=k.min(n))
        .map(|i| (ln_choose(n, i) + i as f64 * p.ln() + (n - i) as f64 * (1.0 - p).ln()).exp())
        .sum::<f64>()
        .min(1.0)
}

/// The `p` in `[0, 1]` where the monotone `f` crosses `target` (bisection to machine precision).
fn solve(f: impl Fn(f64) -> f64, target: f64, increasing: bool) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if (f(mid) < target) == increasing {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The exact (Clopper–Pearson) two-sided interval for a binomial proportion: `k` successes in
/// `n` trials, coverage `confidence` (e.g. 0.95). Conservative: it covers at least that often.
///
/// # Panics
/// If `n == 0`, `k > n` or `confidence` is not in (0, 1).
pub fn binomial_interval(k: usize, n: usize, confidence: f64) -> (f64, f64) {
    assert!(n > 0 && k <= n, "binomial_interval: k = {k} of n = {n}");
    assert!(
        confidence > 0.0 && confidence < 1.0,
        "binomial_interval: confidence {confidence} not in (0, 1)"
    );
    let tail = (1.0 - confidence) / 2.0;
    // lower: P(X ≥ k | p) = tail, i.e. 1 − P(X ≤ k − 1 | p), increasing in p.
    let lower = if k == 0 {
        0.0
    } else {
        solve(|p| 1.0 - binomial_cdf(k - 1, n, p), tail, true)
    };
    // upper: P(X ≤ k | p) = tail, decreasing in p.
    let upper = if k == n {
        1.0
    } else {
        solve(|p| binomial_cdf(k, n, p), tail, false)
    };
    (lower, upper)
}

/// Two-sided p-value of Fisher's exact test on the 2 × 2 table `[[a, b], [c, d]]` (rows: the two
/// groups; columns: solved, not solved): the probability, with the margins fixed, of a table at
/// most as likely as the one observed.
pub fn fisher_exact(a: usize, b: usize, c: usize, d: usize) -> f64 {
    let (row1, row2, col1) = (a + b, c + d, a + c);
    let total = row1 + row2;
    let ln_denominator = ln_choose(total, col1);
    let probability =
        |x: usize| (ln_choose(row1, x) + ln_choose(row2, col1 - x) - ln_denominator).exp();
    let observed = probability(a);
    let first = col1.saturating_sub(row2);
    let last = row1.min(col1);
    (first..=last)
        .map(probability)
        // A relative margin so that tables as likely as the observed one (ties up to rounding)
        // are counted, as R's fisher.test does.
        .filter(|&p| p <= observed * (1.0 + 1e-7))
        .sum::<f64>()
        .min(1.0)
}

/// Two-sided p-value of the exact McNemar test for paired outcomes: `only_first` pairs where only
/// the first of the two solved, `only_second` where only the second did (pairs where both or
/// neither did carry no information). Under the null each discordant pair goes either way with
/// probability ½: `min(1, 2 · P(X ≤ min(b, c)))` for `X ~ Binomial(b + c, ½)`, as R's
/// `binom.test(min(b, c), b + c)`.
pub fn mcnemar_exact(only_first: usize, only_second: usize) -> f64 {
    let n = only_first + only_second;
    if n == 0 {
        return 1.0;
    }
    (2.0 * binomial_cdf(only_first.min(only_second), n, 0.5)).min(1.0)
}

/// Difference of means `mean(x) − mean(y)` with its percentile-bootstrap interval at
/// `confidence`: each group resampled with replacement `resamples` times (seeded, so the
/// interval is reproducible). Returns `(difference, lower, upper)`.
///
/// # Panics
/// If either group is empty.
pub fn bootstrap_mean_difference(
    x: &[f64],
    y: &[f64],
    confidence: f64,
    resamples: usize,
    seed: u64,
) -> (f64, f64, f64) {
    assert!(
        !x.is_empty() && !y.is_empty(),
        "bootstrap_mean_difference: empty group ({} and {} values)",
        x.len(),
        y.len()
    );
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut resampled_mean = |v: &[f64]| {
        (0..v.len())
            .map(|_| v[rng.random_range(0..v.len())])
            .sum::<f64>()
            / v.len() as f64
    };
    let mut differences: Vec<f64> = (0..resamples.max(1))
        .map(|_| resampled_mean(x) - resampled_mean(y))
        .collect();
    differences.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        let i = (q * (differences.len() - 1) as f64).round() as usize;
        differences[i]
    };
    let tail = (1.0 - confidence) / 2.0;
    (mean(x) - mean(y), quantile(tail), quantile(1.0 - tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// Reference values from R 4.3: `binom.test(k, n)$conf.int`.
    #[test]
    fn clopper_pearson_matches_r() {
        for (k, n, lo, hi) in [
            (0, 10, 0.0, 0.308_497_2),
            (10, 10, 0.691_502_8, 1.0),
            (5, 10, 0.187_086_0, 0.812_914_0),
            (3, 20, 0.032_070_94, 0.378_926_83),
            (1, 3, 0.008_403_759, 0.905_700_675),
        ] {
            let (a, b) = binomial_interval(k, n, 0.95);
            assert!(
                close(a, lo, 1e-6) && close(b, hi, 1e-6),
                "k = {k}, n = {n}: [{a}, {b}], R gives [{lo}, {hi}]"
            );
        }
    }

    /// Reference values from R: `fisher.test(matrix(c(a, c, b, d), 2))$p.value`.
    #[test]
    fn fisher_exact_matches_r() {
        for (a, b, c, d, p) in [
            (3, 1, 1, 3, 0.485_714_3),
            (1, 9, 11, 3, 0.002_759_456),
            (5, 0, 0, 5, 0.007_936_508),
            (2, 3, 2, 3, 1.0),
            (0, 3, 3, 0, 0.1),
        ] {
            let got = fisher_exact(a, b, c, d);
            assert!(
                close(got, p, 1e-6),
                "[[{a}, {b}], [{c}, {d}]]: {got}, R gives {p}"
            );
        }
    }

    /// Reference values from R: `binom.test(min(b, c), b + c)$p.value`.
    #[test]
    fn mcnemar_exact_matches_r() {
        for (b, c, p) in [
            (5, 2, 0.453_125),
            (10, 3, 0.092_285_16),
            (6, 0, 0.031_25),
            (4, 4, 1.0),
            (0, 0, 1.0),
            (1, 12, 0.003_417_969),
        ] {
            let got = mcnemar_exact(b, c);
            assert!(close(got, p, 1e-6), "b = {b}, c = {c}: {got}, R gives {p}");
        }
    }

    /// The point estimate is the difference of the means; the interval is reproducible from the
    /// seed, contains 0 for two draws of the same values, and excludes it for separated groups.
    #[test]
    fn bootstrap_interval_brackets_the_difference() {
        let x = [0.9, 0.95, 0.85, 0.92, 0.88];
        let y = [0.1, 0.15, 0.05, 0.12, 0.2];
        let (d, lo, hi) = bootstrap_mean_difference(&x, &y, 0.95, 10_000, 7);
        assert!(close(d, 0.9 - 0.124, 1e-12));
        assert!(
            lo > 0.6 && hi < 0.9 && lo < d && d < hi,
            "[{lo}, {hi}] around {d}"
        );
        assert_eq!(
            (d, lo, hi),
            bootstrap_mean_difference(&x, &y, 0.95, 10_000, 7)
        );
        let (d, lo, hi) = bootstrap_mean_difference(&x, &x, 0.95, 10_000, 7);
        assert!(d == 0.0 && lo < 0.0 && hi > 0.0, "[{lo}, {hi}]");
        // A bimodal pair of groups (solved / not) with overlapping outcomes: a wide interval.
        let a = [0.99, 0.016, 0.98];
        let b = [0.016, 0.017, 0.99];
        let (_, lo, hi) = bootstrap_mean_difference(&a, &b, 0.95, 10_000, 7);
        assert!(lo < 0.0 && hi > 0.5, "[{lo}, {hi}]");
    }
}
