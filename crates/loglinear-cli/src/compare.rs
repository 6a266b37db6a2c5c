//! The comparison section of `summary.md`: how many runs of each setting solved the task (with an
//! exact binomial interval), optionally by given steps, and each value of the compared key (the
//! λ mode by default) against the baseline value at the same setting — Fisher's exact test on
//! solved / not solved, and a bootstrap interval for the difference of mean best accuracy (mean
//! best perplexity for language models).

use crate::stats::{binomial_interval, bootstrap_mean_difference, fisher_exact, mcnemar_exact};
use crate::sweep::{SummaryOptions, SummaryRow};

/// Confidence of every interval.
const CONFIDENCE: f64 = 0.95;
/// Bootstrap resamples (fixed seed: a summary is reproducible).
const RESAMPLES: usize = 10_000;

/// Rows that share a setting apart from the compared key: that setting, and the rows.
type Group<'a> = (Vec<(String, String)>, Vec<&'a SummaryRow>);

/// When run `curve` (`(step, accuracy)` per evaluation) first reached `solved_at`.
fn first_solved(curve: &[(usize, f64)], solved_at: f64) -> Option<usize> {
    curve
        .iter()
        .find(|(_, acc)| *acc >= solved_at)
        .map(|(s, _)| *s)
}

/// `k/n` as shown in the tables.
fn count(k: usize, n: usize) -> String {
    format!("{k}/{n}")
}

/// The markdown section for `rows` (empty when there is nothing to compare or count).
pub fn comparisons(rows: &[SummaryRow], options: &SummaryOptions) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let lm = rows.iter().any(|r| r.lm);
    // Rows grouped by their setting without the compared key, in the summary's order.
    let mut groups: Vec<Group> = Vec::new();
    for row in rows {
        let rest: Vec<(String, String)> = row
            .setting
            .iter()
            .filter(|(k, _)| **k != options.compare)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match groups.iter_mut().find(|(g, _)| *g == rest) {
            Some((_, members)) => members.push(row),
            None => groups.push((rest, vec![row])),
        }
    }
    let compared = rows
        .iter()
        .any(|r| r.setting.contains_key(&options.compare));
    let key = &options.compare;
    let mut s = String::new();
    if lm {
        if !compared {
            return s;
        }
        s.push_str(&format!(
            "\n## Comparisons\n\nEach `{key}` against `{key} = {}` at the same setting (or the first \
             value where the sweep lacks it): the difference of mean best validation perplexity \
             (lower is better) with a {:.0} % percentile-bootstrap interval ({RESAMPLES} resamples \
             of the seeds).\n\n| setting | `{key}` | n | Δ mean best perplexity vs baseline ({:.0} % CI) |\n|---|---|---|---|\n",
            options.baseline,
            100.0 * CONFIDENCE,
            100.0 * CONFIDENCE
        ));
        for (rest, members) in &groups {
            let base = baseline(members, options);
            for row in members {
                let value = row.setting.get(key).cloned().unwrap_or_default();
                let delta = if std::ptr::eq(*row, base) {
                    "baseline".to_string()
                } else {
                    let (d, lo, hi) = bootstrap_mean_difference(
                        &row.per_seed,
                        &base.per_seed,
                        CONFIDENCE,
                        RESAMPLES,
                        0,
                    );
                    format!("{d:+.2} [{lo:+.2}, {hi:+.2}]")
                };
                s.push_str(&format!(
                    "| {} | {value} | {} | {delta} |\n",
                    setting_text(rest),
                    row.n
                ));
            }
        }
        return s;
    }

    s.push_str(&format!(
        "\n## Solved runs{}\n\nA run counts as **solved** when its best held-out accuracy reaches \
         {:.0} %. Solved: runs that did, with the exact (Clopper–Pearson) {:.0} % interval of the \
         solved fraction.",
        if compared { " and comparisons" } else { "" },
        100.0 * options.solved_at,
        100.0 * CONFIDENCE
    ));
    if !options.by_steps.is_empty() {
        s.push_str(
            " Solved by step s: runs whose held-out accuracy had reached the threshold at an \
             evaluation at or before s (a run that ended before s unsolved is counted as not \
             solved and marked).",
        );
    }
    if compared {
        s.push_str(&format!(
            " Against `{key} = {}` at the same setting (or the first value where the sweep lacks \
             it): Fisher's exact test (two-sided) on solved / not solved, and the difference of \
             mean best accuracy (percentage points) with a {:.0} % percentile-bootstrap interval \
             ({RESAMPLES} resamples of the seeds). Both treat the two groups' runs as \
             independent; runs with the same seed see the same data (the tasks' generators are \
             seeded by the run's seed) and their outcomes go together, so the **paired** column \
             matches the runs by seed (and pooled values): `b/c` = pairs where only the \
             baseline / only this value solved, with the exact McNemar p-value (two-sided \
             binomial test on the discordant pairs).",
            options.baseline,
            100.0 * CONFIDENCE
        ));
    }
    s.push_str("\n\n");
    let mut header = vec!["setting".to_string()];
    if compared {
        header.push(format!("`{key}`"));
    }
    header.extend([
        "n".into(),
        "solved".into(),
        format!("{:.0} % CI", 100.0 * CONFIDENCE),
    ]);
    header.extend(options.by_steps.iter().map(|st| format!("by step {st}")));
    if compared {
        header.extend([
            "Fisher p vs baseline".into(),
            "Δ mean best (pp, 95 % CI)".into(),
            "paired by seed: b/c, McNemar p".into(),
        ]);
    }
    s.push_str(&format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        "---|".repeat(header.len())
    ));
    for (rest, members) in &groups {
        let base = baseline(members, options);
        let solved_of = |r: &SummaryRow| {
            r.per_seed
                .iter()
                .filter(|v| **v >= options.solved_at)
                .count()
        };
        for row in members {
            let k = solved_of(row);
            let (lo, hi) = binomial_interval(k, row.n.max(1), CONFIDENCE);
            let mut cells = vec![setting_text(rest)];
            if compared {
                cells.push(row.setting.get(key).cloned().unwrap_or_default());
            }
            cells.extend([
                row.n.to_string(),
                count(k, row.n),
                format!("{:.0}–{:.0} %", 100.0 * lo, 100.0 * hi),
            ]);
            for &step in &options.by_steps {
                let solved = row
                    .curves
                    .iter()
                    .filter(|c| first_solved(c, options.solved_at).is_some_and(|s| s <= step))
                    .count();
                let ended = row
                    .curves
                    .iter()
                    .filter(|c| {
                        first_solved(c, options.solved_at).is_none()
                            && c.last().is_none_or(|(s, _)| *s < step)
                    })
                    .count();
                cells.push(if ended > 0 {
                    format!("{} ({ended} ended before)", count(solved, row.curves.len()))
                } else {
                    count(solved, row.curves.len())
                });
            }
            if compared {
                if std::ptr::eq(*row, base) {
                    cells.extend(["baseline".into(), "baseline".into(), "baseline".into()]);
                } else {
                    let kb = solved_of(base);
                    let p = fisher_exact(k, row.n - k, kb, base.n - kb);
                    let (d, lo, hi) = bootstrap_mean_difference(
                        &row.per_seed,
                        &base.per_seed,
                        CONFIDENCE,
                        RESAMPLES,
                        0,
                    );
                    cells.extend([
                        format!("{p:.3}"),
                        format!("{:+.1} [{:+.1}, {:+.1}]", 100.0 * d, 100.0 * lo, 100.0 * hi),
                        paired(row, base, options.solved_at),
                    ]);
                }
            }
            s.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
    }
    s
}

/// `b/c, p (n pairs)`: runs of `row` and `base` matched by label (seed and pooled values), `b`
/// the pairs where only the baseline solved, `c` where only `row` did, and the exact McNemar
/// p-value; "–" when no run pairs up.
fn paired(row: &SummaryRow, base: &SummaryRow, solved_at: f64) -> String {
    let solved: std::collections::HashMap<&str, bool> = base
        .labels
        .iter()
        .zip(&base.per_seed)
        .map(|(l, v)| (l.as_str(), *v >= solved_at))
        .collect();
    let (mut pairs, mut only_base, mut only_row) = (0, 0, 0);
    for (label, v) in row.labels.iter().zip(&row.per_seed) {
        if let Some(&base_solved) = solved.get(label.as_str()) {
            pairs += 1;
            match (base_solved, *v >= solved_at) {
                (true, false) => only_base += 1,
                (false, true) => only_row += 1,
                _ => {}
            }
        }
    }
    if pairs == 0 {
        return "–".into();
    }
    format!(
        "{only_base}/{only_row}, {:.3} ({pairs} pairs)",
        mcnemar_exact(only_base, only_row)
    )
}

/// The row of `members` the others are compared against.
fn baseline<'a>(members: &[&'a SummaryRow], options: &SummaryOptions) -> &'a SummaryRow {
    members
        .iter()
        .find(|r| r.setting.get(&options.compare) == Some(&options.baseline))
        .unwrap_or(&members[0])
}

/// `key = value, …` of a setting without the compared key ("all" when nothing else is swept).
fn setting_text(rest: &[(String, String)]) -> String {
    if rest.is_empty() {
        return "all".into();
    }
    rest.iter()
        .map(|(k, v)| format!("{} = {v}", k.rsplit('.').next().unwrap_or(k)))
        .collect::<Vec<_>>()
        .join(", ")
}
