//! Histograms, and clusters of bars or spreads (boxes) over categories.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::chart::{FRAME, Figure, Labels, Scale, Ticked, chart, legend, mark, mesh, min_max};
use super::chart::{note, padded, palette};
use super::{Spread, SpreadGroup};

/// Overlaid, density-normalised histograms on common bins.
pub(super) struct HistFig {
    labels: Labels,
    edges: Vec<f64>,
    /// Per series its legend entry (with n) and its density per bin.
    hists: Vec<(String, Vec<f64>)>,
}

impl HistFig {
    pub fn new(labels: Labels, series: &[(String, Vec<f64>)], bins: usize) -> Self {
        let (lo, hi) = min_max(series.iter().flat_map(|(_, v)| v.iter().copied()));
        // a constant sample: an odd number of bins puts the value in the middle of one
        let bins = bins.clamp(1, 10_000) | if lo == hi { 1 } else { 0 };
        let (lo, hi) = padded((lo, hi), 0.0, false);
        let width = (hi - lo) / bins as f64;
        let hists = (series.iter())
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
        let edges = (0..=bins).map(|i| lo + i as f64 * width).collect();
        HistFig {
            labels,
            edges,
            hists,
        }
    }
}

impl Figure for HistFig {
    fn size(&self) -> (u32, u32) {
        (1200, 760)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, s: Scale) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let (e, bins) = (&self.edges, self.edges.len() - 1);
        let top = self
            .hists
            .iter()
            .flat_map(|h| h.1.iter().copied())
            .fold(0.0, f64::max);
        let x = padded((e[0], e[bins]), 0.02, false);
        let y = 0.0..if top > 0.0 { top * 1.1 } else { 1.0 };
        let mut c = chart(root, s, &self.labels.title, x.0..x.1, y)?;
        mesh(&mut c, s, (&self.labels.x, &self.labels.y), |_| {})?;
        let alpha = if self.hists.len() > 1 { 0.28 } else { 0.45 };
        // translucent bars first, then the step outlines on top
        for (i, (name, density)) in self.hists.iter().enumerate() {
            let fill = palette(i).mix(alpha).filled();
            let bars = (0..bins).filter(|&b| density[b] > 0.0);
            let bars = bars.map(|b| Rectangle::new([(e[b], 0.0), (e[b + 1], density[b])], fill));
            let no_line = TRANSPARENT;
            (c.draw_series(bars)?.label(name)).legend(move |at| mark(s, no_line, false, fill, at));
        }
        let mut paths = vec![];
        for (i, (_, density)) in self.hists.iter().enumerate() {
            let steps = (0..bins).flat_map(|b| [(e[b], density[b]), (e[b + 1], density[b])]);
            let outline = [(e[0], 0.0)]
                .into_iter()
                .chain(steps)
                .chain([(e[bins], 0.0)]);
            let outline: Vec<(f64, f64)> = outline.collect();
            c.draw_series(LineSeries::new(
                outline.clone(),
                palette(i).stroke_width(s.w(2.0)),
            ))?;
            // the area under the outline counts as taken for the legend
            paths.extend((0..bins).map(|b| vec![(e[b], 0.0), (e[b], density[b])]));
            paths.push(outline);
        }
        if self.hists.iter().all(|h| h.1.iter().all(|d| *d == 0.0)) {
            note(root, &c, s, "no data")?;
        }
        legend(&mut c, s, self.hists.len(), &paths)
    }
}

/// What stands in one slot of a cluster.
#[derive(Clone, Copy)]
enum Item {
    /// A bar from zero to the value, with an optional ± error.
    Bar(f64, Option<f64>),
    Spread(Spread),
}

/// One cluster per category along x, one slot per group (bars or spreads).
pub(super) struct Clusters {
    labels: Labels,
    categories: Vec<String>,
    groups: Vec<(String, Vec<Option<Item>>)>,
}

/// Fraction of a category's width covered by its cluster.
const CLUSTER: f64 = 0.8;

impl Clusters {
    /// Bars: per group its name and (value, ± error) per category.
    pub fn bars(labels: Labels, categories: &[String], groups: Vec<super::Bars>) -> Self {
        let bar = |b: Option<(f64, Option<f64>)>| b.map(|(v, e)| Item::Bar(v, e));
        let groups = (groups.into_iter())
            .map(|(name, v)| (name, v.into_iter().map(bar).collect()))
            .collect();
        Clusters {
            labels,
            categories: categories.to_vec(),
            groups,
        }
    }

    pub fn spreads(labels: Labels, categories: &[String], groups: &[SpreadGroup]) -> Self {
        let at = |v: &Vec<Option<Spread>>, j: usize| v.get(j).copied().flatten().map(Item::Spread);
        let groups = (groups.iter())
            .map(|(name, v)| {
                (
                    name.clone(),
                    (0..categories.len()).map(|j| at(v, j)).collect(),
                )
            })
            .collect();
        Clusters {
            labels,
            categories: categories.to_vec(),
            groups,
        }
    }
}

impl Figure for Clusters {
    fn size(&self) -> (u32, u32) {
        (1200, 760)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, s: Scale) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let items = || self.groups.iter().flat_map(|g| g.1.iter().flatten());
        let bars = items().any(|it| matches!(it, Item::Bar(..)));
        let (lo, hi) = min_max(items().flat_map(|it| match *it {
            Item::Bar(v, e) => [v - e.unwrap_or(0.0), v + e.unwrap_or(0.0), 0.0],
            Item::Spread(q) => [q.q10, q.q90, q.q10],
        }));
        let y = value_axis((lo, hi), bars);
        // one tick per category, thinned to at most 16 labels
        let n = self.categories.len();
        let ticks = (0..n)
            .step_by(n.div_ceil(16).max(1))
            .map(|i| i as f64)
            .collect();
        let x = Ticked::new(-0.5..n.max(1) as f64 - 0.5, ticks);
        let mut c = chart(root, s, &self.labels.title, x, y.clone())?;
        let name = |v: &f64| {
            self.categories
                .get(v.round() as usize)
                .cloned()
                .unwrap_or_default()
        };
        // no vertical grid lines: they would cut through the clusters
        mesh(&mut c, s, (&self.labels.x, &self.labels.y), |m| {
            m.x_label_formatter(&name).disable_x_mesh();
        })?;

        let width = CLUSTER / self.groups.len().max(1) as f64;
        let slot_px = c.backend_coord(&(width, 0.0)).0 - c.backend_coord(&(0.0, 0.0)).0;
        // cap width, also the diameter of the dot ErrorBar puts at the median (or the bar top)
        let cap = (slot_px as f64 * 0.3).clamp(4.0 * s.k, 12.0 * s.k) as u32;
        let mut paths = vec![];
        for (gi, (gname, vals)) in self.groups.iter().enumerate() {
            let color = palette(gi);
            for (ci, it) in vals.iter().enumerate() {
                let x0 = ci as f64 - CLUSTER / 2.0 + (gi as f64 + 0.06) * width;
                let (x1, xm) = (x0 + 0.88 * width, x0 + 0.44 * width);
                match *it {
                    None => {}
                    Some(Item::Bar(v, e)) => {
                        c.draw_series([Rectangle::new([(x0, 0.0), (x1, v)], color.filled())])?;
                        if let Some(e) = e.filter(|e| *e > 0.0) {
                            let style = FRAME.stroke_width(s.w(1.6));
                            c.draw_series([ErrorBar::new_vertical(
                                xm,
                                v - e,
                                v,
                                v + e,
                                style,
                                cap,
                            )])?;
                        }
                        let e = e.unwrap_or(0.0);
                        paths.push(vec![(x0, v), (x1, v), (x1, 0.0)]);
                        paths.push(vec![(xm, 0.0), (xm, v + e.copysign(v))]);
                    }
                    Some(Item::Spread(q)) => {
                        let corners = [(x0, q.q25), (x1, q.q75)];
                        let (fill, line) = (color.mix(0.35).filled(), color.stroke_width(s.w(1.6)));
                        c.draw_series([
                            Rectangle::new(corners, fill),
                            Rectangle::new(corners, line),
                        ])?;
                        let style = color.filled().stroke_width(s.w(1.8));
                        let whiskers =
                            ErrorBar::new_vertical(xm, q.q10, q.median, q.q90, style, cap);
                        c.draw_series([whiskers])?;
                        paths.push(vec![(xm, q.q10), (xm, q.q90)]);
                        paths.push(vec![(x0, q.q75), (x1, q.q75)]);
                    }
                }
            }
            // a legend entry: bars as patches, spreads as their whiskers' dot
            let anno = c.draw_series(std::iter::empty::<Circle<(f64, f64), u32>>())?;
            let fill = if bars {
                color.filled()
            } else {
                TRANSPARENT.filled()
            };
            let line: RGBAColor = if bars { TRANSPARENT } else { color.into() };
            anno.label(gname)
                .legend(move |at| mark(s, line, !bars, fill, at));
        }
        if y.start < 0.0 && y.end > 0.0 {
            let zero = [(-0.5, 0.0), (n as f64 - 0.5, 0.0)];
            c.draw_series(LineSeries::new(zero, FRAME.stroke_width(s.w(1.0))))?;
        }
        if self.groups.iter().all(|g| g.1.iter().all(Option::is_none)) {
            note(root, &c, s, "no data")?;
        }
        if self.groups.len() > 1 || self.groups.first().is_some_and(|g| !g.0.is_empty()) {
            legend(&mut c, s, self.groups.len(), &paths)?;
        }
        Ok(())
    }
}

/// The value axis over the data extent `(lo, hi)`, padded: bars start at zero, and the spreads
/// of a quantity ≥ 0 (λ) keep the axis at or above zero.
fn value_axis((lo, hi): (f64, f64), bars: bool) -> std::ops::Range<f64> {
    let (plo, phi) = padded((lo, hi), 0.06, false);
    let bottom = if lo >= 0.0 && (bars || plo < 0.0) {
        0.0
    } else {
        plo
    };
    bottom..if bars && hi <= 0.0 { 0.0 } else { phi }
}

#[cfg(test)]
mod tests {
    use super::value_axis;

    #[test]
    fn value_axis_starts_at_zero_for_bars_and_stays_above_it_for_spreads_of_positives() {
        // spreads of λ near zero: the padding alone would reach below zero
        assert_eq!(value_axis((0.01, 1.0), false).start, 0.0);
        // spreads well above zero keep their padded range
        let r = value_axis((0.9, 1.1), false);
        assert!(0.85 < r.start && r.start < 0.9, "{r:?}");
        // bars start at zero; negative ones get room below their lowest value and end at zero
        assert_eq!(value_axis((0.0, 2.0), true).start, 0.0);
        assert!(value_axis((-1.0, 2.0), true).start < -1.0);
        assert_eq!(value_axis((-2.0, 0.0), true).end, 0.0);
    }
}
