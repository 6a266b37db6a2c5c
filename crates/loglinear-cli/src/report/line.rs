//! Line plots with optional ± error bars or bands, on linear or log axes.

use std::path::{Path, PathBuf};

use anyhow::Result;
use plotters::prelude::*;

use super::chart::{
    Axis, chart, figure, house, legend, mark, min_max, note, padded, palette, palette20,
};
use super::{LineOpts, Series};

/// Series up to this many points get markers and capped error bars; longer ones a band.
const MARKER_MAX: usize = 60;

/// Line plot: training curves, or a metric against a swept variable with ± std error bars.
///
/// Short series (≤ 60 points) get dot markers and capped error bars; longer ones a translucent
/// ± band. When all x are powers of two on a log x axis, ticks are placed at powers of two.
/// Series that share a name share a colour and one legend entry (the seeds of one setting, say);
/// beyond ten series the lines are drawn thinner, beyond ten names in tab20's twenty colours.
pub fn line_plot(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    opts: &LineOpts,
) -> Result<Vec<PathBuf>> {
    let (log_x, log_y) = (opts.log_x, opts.log_y);
    let ok = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
    // per series its points [x, y, ± error]: finite, positive on log axes, an error of 0 where
    // there is none
    let data: Vec<(&str, Vec<[f64; 3]>)> = (series.iter())
        .map(|s| {
            let err = |j: usize| s.err.as_ref().and_then(|e| e.get(j)).copied();
            let err = |j| err(j).filter(|e| e.is_finite()).map_or(0.0, f64::abs);
            let pts = (s.points.iter().enumerate())
                .filter(|(_, p)| ok(p.0, log_x) && ok(p.1, log_y))
                .map(|(j, p)| [p.0, p.1, err(j)]);
            (s.name.as_str(), pts.collect())
        })
        .collect();
    let all = || data.iter().flat_map(|s| &s.1);
    let short = data.iter().all(|s| s.1.len() <= MARKER_MAX);
    let x = padded(
        min_max(all().map(|p| p[0])),
        if short { 0.04 } else { 0.0 },
        log_x,
    );
    // the lower end of an error bar, unless it reaches zero or below on a log axis
    let low = |p: &[f64; 3]| Some(p[1] - p[2]).filter(|&lo| ok(lo, log_y));
    let y = match opts.y_range {
        Some((lo, hi)) if lo < hi && ok(lo, log_y) && hi.is_finite() => (lo, hi),
        _ => padded(
            min_max(all().flat_map(|p| [low(p).unwrap_or(p[1]), p[1] + p[2]])),
            0.05,
            log_y,
        ),
    };
    let (ylo, yhi) = y;
    // the ends of an error bar inside the axis (cut at its bottom on a log axis)
    let ends = |p: &[f64; 3]| [low(p).unwrap_or(ylo), p[1] + p[2]].map(|v| v.clamp(ylo, yhi));
    // powers of two on a log x axis when every x is one (sequence lengths)
    let pow2 = |v: f64| (1.0..1e18).contains(&v) && v.fract() == 0.0;
    let pow2 = |p: &[f64; 3]| pow2(p[0]) && (p[0] as u64).is_power_of_two();
    let in_x = |v: &f64| (x.0..=x.1).contains(v);
    let powers: Vec<f64> = (0..60).map(|k| 2f64.powi(k)).filter(in_x).collect();
    let by_powers = log_x && all().next().is_some() && all().all(pow2) && powers.len() > 1;

    figure!(dir, stem, (1200, 760), |root, s| {
        let x = match by_powers {
            true => Axis::numbers(x, true, &powers),
            false => Axis::auto(x, log_x, 9),
        };
        let axes = (x, Axis::auto(y, log_y, 8));
        let b = house(root, s, title);
        let mut c = chart(b, s, (x_label, y_label), axes, (true, true))?;
        let mut paths = vec![];
        // the distinct names in order of first appearance: a name's place is its colour's index
        let mut names: Vec<&str> = vec![];
        for (name, _) in &data {
            if !names.contains(name) {
                names.push(name);
            }
        }
        // tab10 while its colours suffice, tab20 (lighter shades between) up to twenty names
        let colour = if names.len() > 10 { palette20 } else { palette };
        let width = if data.len() > 10 { 1.4 } else { 2.4 };
        for (j, (name, pts)) in data.iter().enumerate() {
            let i = names.iter().position(|n| n == name).expect("listed above");
            // the first series of a name carries its legend entry
            let first = !data[..j].iter().any(|(n, _)| n == name);
            let (color, long) = (colour(i), pts.len() > MARKER_MAX);
            if long && pts.iter().any(|p| p[2] > 0.0) {
                // the ± band: along the upper ends, back along the lower ones
                let up = pts.iter().map(|p| (p[0], ends(p)[1]));
                let band = up.chain(pts.iter().rev().map(|p| (p[0], ends(p)[0])));
                let band = Polygon::new(band.collect::<Vec<_>>(), color.mix(0.18).filled());
                c.draw_series([band])?;
            }
            let line = pts.iter().map(|p| (p[0], p[1]));
            let line = LineSeries::new(line, color.stroke_width(s.w(width)));
            let drawn = c.draw_series(line)?;
            if first {
                let empty = !data.iter().any(|(n, p)| n == name && !p.is_empty());
                let label = format!("{name}{}", if empty { " (no data)" } else { "" });
                let no_fill = TRANSPARENT.filled();
                drawn
                    .label(label)
                    .legend(move |at| mark(s, color.into(), !long, no_fill, at));
            }
            if !long {
                // markers, with capped error bars where there is an error
                let style = color.filled().stroke_width(s.w(1.6));
                let shown = pts.iter().filter(|p| (ylo..=yhi).contains(&p[1]));
                let bar = |p: &[f64; 3]| {
                    let [lo, hi] = ends(p);
                    ErrorBar::new_vertical(p[0], lo, p[1], hi, style, s.w(9.0))
                };
                c.draw_series(shown.map(bar))?;
            }
            paths.push(pts.iter().map(|p| (p[0], p[1].clamp(ylo, yhi))).collect());
        }
        if all().next().is_none() {
            note(&c, s, "no data")?;
        }
        if names.len() > 1 || names.first().is_some_and(|name| !name.is_empty()) {
            legend(&mut c, s, names.len(), &paths)?;
        }
        Ok(())
    })
}
