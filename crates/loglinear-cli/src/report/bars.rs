//! Histograms, and clusters of bars or spreads (boxes) over categories.

use std::path::{Path, PathBuf};

use anyhow::Result;
use plotters::prelude::*;

use super::chart::{
    Axis, FRAME, chart, figure, house, legend, mark, min_max, note, padded, palette,
};
use super::{BarGroup, Spread, SpreadGroup};

/// Overlaid histograms on common bins, density-normalised (each integrates to 1), with a legend.
pub fn histogram(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    series: &[(String, Vec<f64>)],
    bins: usize,
) -> Result<Vec<PathBuf>> {
    let (lo, hi) = min_max(series.iter().flat_map(|(_, v)| v.iter().copied()));
    // a constant sample: an odd number of bins puts the value in the middle of one
    let bins = bins.clamp(1, 10_000) | if lo == hi { 1 } else { 0 };
    let (lo, hi) = padded((lo, hi), 0.0, false);
    let width = (hi - lo) / bins as f64;
    let e = |b: usize| lo + b as f64 * width;
    // per series its legend entry (with n) and its density per bin
    let hists: Vec<(String, Vec<f64>)> = (series.iter())
        .map(|(name, vals)| {
            let mut counts = vec![0usize; bins];
            for v in vals.iter().filter(|v| v.is_finite()) {
                counts[(((v - lo) / width).floor().max(0.0) as usize).min(bins - 1)] += 1;
            }
            let n: usize = counts.iter().sum();
            let density = counts.iter().map(|&k| k as f64 / (n.max(1) as f64 * width));
            (format!("{name} (n={n})"), density.collect())
        })
        .collect();
    let top = hists
        .iter()
        .flat_map(|h| &h.1)
        .fold(0.0, |a: f64, &d| a.max(d));
    let x = padded((e(0), e(bins)), 0.02, false);
    let y = (0.0, if top > 0.0 { top * 1.1 } else { 1.0 });

    figure!(dir, stem, (1200, 760), |root, s| {
        let axes = (Axis::auto(x, false, 9), Axis::auto(y, false, 8));
        let b = house(root, s, title);
        let mut c = chart(b, s, (x_label, "density"), axes, (true, true))?;
        let alpha = if hists.len() > 1 { 0.28 } else { 0.45 };
        // translucent bars first, then the step outlines on top
        for (i, (name, density)) in hists.iter().enumerate() {
            let fill = palette(i).mix(alpha).filled();
            let bars = (0..bins).filter(|&b| density[b] > 0.0);
            let bars = bars.map(|b| Rectangle::new([(e(b), 0.0), (e(b + 1), density[b])], fill));
            (c.draw_series(bars)?.label(name))
                .legend(move |at| mark(s, TRANSPARENT, false, fill, at));
        }
        let mut paths = vec![];
        for (i, (_, density)) in hists.iter().enumerate() {
            let steps = (0..bins).flat_map(|b| [(e(b), density[b]), (e(b + 1), density[b])]);
            let mut outline = vec![(e(0), 0.0)];
            outline.extend(steps.chain([(e(bins), 0.0)]));
            let style = palette(i).stroke_width(s.w(2.0));
            c.draw_series(LineSeries::new(outline.clone(), style))?;
            // the area under the outline counts as taken for the legend
            paths.extend((0..bins).map(|b| vec![(e(b), 0.0), (e(b), density[b])]));
            paths.push(outline);
        }
        if top == 0.0 {
            note(&c, s, "no data")?;
        }
        legend(&mut c, s, hists.len(), &paths)
    })
}

/// Grouped bar chart: one cluster per category along x, one bar per group (with a legend), each
/// with an optional ± error bar. Values missing or NaN are left out.
pub fn bar_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    categories: &[String],
    groups: &[BarGroup],
) -> Result<Vec<PathBuf>> {
    let finite = |v: Option<&f64>| v.copied().filter(|v| v.is_finite());
    let groups = (groups.iter()).map(|(name, vals, errs)| {
        let err = |j: usize| finite(errs.as_ref().and_then(|e| e.get(j))).map_or(0.0, f64::abs);
        let bar = |j: usize| Some(Item::Bar(finite(vals.get(j))?, err(j)));
        (name.as_str(), (0..categories.len()).map(bar).collect())
    });
    let groups = groups.collect();
    clusters(dir, stem, (title, x_label, y_label), categories, groups)
}

/// Grouped spreads: one cluster per category along x, one box per group (with a legend): the
/// 25–75 % box, 10–90 % whiskers and a dot at the median of each [`Spread`].
pub fn spread_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    categories: &[String],
    groups: &[SpreadGroup],
) -> Result<Vec<PathBuf>> {
    let groups = (groups.iter()).map(|(name, spreads)| {
        let spread = |j: usize| spreads.get(j).copied().flatten().map(Item::Spread);
        (name.as_str(), (0..categories.len()).map(spread).collect())
    });
    let groups = groups.collect();
    clusters(dir, stem, (title, x_label, y_label), categories, groups)
}

/// What stands in one slot of a cluster.
#[derive(Clone, Copy)]
enum Item {
    /// A bar from zero to the value, with a ± error (0: none).
    Bar(f64, f64),
    Spread(Spread),
}

/// Fraction of a category's width covered by its cluster.
const CLUSTER: f64 = 0.8;

/// One cluster per category along x, one slot per group (`None`: left empty), and a legend of
/// the groups unless there is a single one without a name.
fn clusters(
    dir: &Path,
    stem: &str,
    (title, x_label, y_label): (&str, &str, &str),
    categories: &[String],
    groups: Vec<(&str, Vec<Option<Item>>)>,
) -> Result<Vec<PathBuf>> {
    let items = || groups.iter().flat_map(|g| g.1.iter().flatten());
    let bars = items().any(|it| matches!(it, Item::Bar(..)));
    let (lo, hi) = min_max(items().flat_map(|it| match *it {
        Item::Bar(v, e) => [v - e, v + e, 0.0],
        Item::Spread(q) => [q.q10, q.q90, q.q10],
    }));
    let y = value_axis((lo, hi), bars);
    // one tick per category, thinned to at most 16 labels
    let n = categories.len();
    let ticks = categories.iter().enumerate().step_by(n.div_ceil(16).max(1));
    let ticks: Vec<(f64, String)> = ticks.map(|(i, name)| (i as f64, name.clone())).collect();
    let width = CLUSTER / groups.len().max(1) as f64;

    figure!(dir, stem, (1200, 760), |root, s| {
        let x = Axis::new((-0.5, n.max(1) as f64 - 0.5), false, ticks.clone());
        let (b, axes) = (house(root, s, title), (x, Axis::auto(y, false, 8)));
        // no vertical grid lines: they would cut through the clusters
        let mut c = chart(b, s, (x_label, y_label), axes, (false, true))?;
        let slot_px = c.backend_coord(&(width, 0.0)).0 - c.backend_coord(&(0.0, 0.0)).0;
        // cap width, also the diameter of the dot ErrorBar puts at the median (or the bar top)
        let cap = (slot_px as f64 * 0.3).clamp(4.0 * s.k, 12.0 * s.k) as u32;
        let mut paths = vec![];
        for (gi, (name, vals)) in groups.iter().enumerate() {
            let color = palette(gi);
            for (ci, it) in vals.iter().enumerate() {
                let x0 = ci as f64 - CLUSTER / 2.0 + (gi as f64 + 0.06) * width;
                let (x1, xm) = (x0 + 0.88 * width, x0 + 0.44 * width);
                match *it {
                    None => {}
                    Some(Item::Bar(v, e)) => {
                        c.draw_series([Rectangle::new([(x0, 0.0), (x1, v)], color.filled())])?;
                        let style = FRAME.stroke_width(s.w(1.6));
                        let err = ErrorBar::new_vertical(xm, v - e, v, v + e, style, cap);
                        c.draw_series((e > 0.0).then_some(err))?;
                        paths.push(vec![(x0, v), (x1, v), (x1, 0.0)]);
                        paths.push(vec![(xm, 0.0), (xm, v + e.copysign(v))]);
                    }
                    Some(Item::Spread(q)) => {
                        let corners = [(x0, q.q25), (x1, q.q75)];
                        let (fill, line) = (color.mix(0.35).filled(), color.stroke_width(s.w(1.6)));
                        let boxes = [Rectangle::new(corners, fill), Rectangle::new(corners, line)];
                        c.draw_series(boxes)?;
                        let style = color.filled().stroke_width(s.w(1.8));
                        let (lo, mid, hi) = (q.q10, q.median, q.q90);
                        c.draw_series([ErrorBar::new_vertical(xm, lo, mid, hi, style, cap)])?;
                        paths.push(vec![(xm, q.q10), (xm, q.q90)]);
                        paths.push(vec![(x0, q.q75), (x1, q.q75)]);
                    }
                }
            }
            // a legend entry: bars as patches, spreads as their whiskers' dot
            let (line, fill) = match bars {
                true => (TRANSPARENT, color.filled()),
                false => (color.into(), TRANSPARENT.filled()),
            };
            let entry = c.draw_series(std::iter::empty::<Circle<(f64, f64), u32>>())?;
            (entry.label(*name)).legend(move |at| mark(s, line, !bars, fill, at));
        }
        if y.0 < 0.0 && y.1 > 0.0 {
            let zero = [(-0.5, 0.0), (n as f64 - 0.5, 0.0)];
            c.draw_series(LineSeries::new(zero, FRAME.stroke_width(s.w(1.0))))?;
        }
        if items().next().is_none() {
            note(&c, s, "no data")?;
        }
        if groups.len() > 1 || groups.first().is_some_and(|g| !g.0.is_empty()) {
            legend(&mut c, s, groups.len(), &paths)?;
        }
        Ok(())
    })
}

/// The value axis over the data extent `(lo, hi)`, padded: bars start at zero, and the spreads
/// of a quantity ≥ 0 (λ) keep the axis at or above zero.
fn value_axis((lo, hi): (f64, f64), bars: bool) -> (f64, f64) {
    let (plo, phi) = padded((lo, hi), 0.06, false);
    let zero = lo >= 0.0 && (bars || plo < 0.0);
    let bottom = if zero { 0.0 } else { plo };
    (bottom, if bars && hi <= 0.0 { 0.0 } else { phi })
}

#[cfg(test)]
mod tests {
    use super::value_axis;

    #[test]
    fn value_axis_starts_at_zero_for_bars_and_stays_above_it_for_spreads_of_positives() {
        // spreads of λ near zero: the padding alone would reach below zero
        assert_eq!(value_axis((0.01, 1.0), false).0, 0.0);
        // spreads well above zero keep their padded range
        let r = value_axis((0.9, 1.1), false);
        assert!(0.85 < r.0 && r.0 < 0.9, "{r:?}");
        // bars start at zero; negative ones get room below their lowest value and end at zero
        assert_eq!(value_axis((0.0, 2.0), true).0, 0.0);
        assert!(value_axis((-1.0, 2.0), true).0 < -1.0);
        assert_eq!(value_axis((-2.0, 0.0), true).1, 0.0);
    }
}
