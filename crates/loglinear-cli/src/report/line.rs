//! Line plots with optional ± error bars or bands, on linear or log axes.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::chart::{
    Figure, Labels, Scale, chart, legend, mark, mesh, min_max, note, padded, palette,
};
use super::{LineOpts, Series};

/// Series up to this many points get markers and capped error bars; longer ones a band.
const MARKER_MAX: usize = 60;

pub(super) struct LineFig {
    labels: Labels,
    /// Per series its name and its points `[x, y, ± error]` (finite, positive on log axes; an
    /// error of 0 where there is none).
    series: Vec<(String, Vec<[f64; 3]>)>,
    x: (f64, f64),
    y: (f64, f64),
    /// Ticks of the log axes (plotters' own are powers of ten only).
    log_ticks: (Option<Vec<f64>>, Option<Vec<f64>>),
}

impl LineFig {
    pub fn new(labels: Labels, series: &[Series], opts: &LineOpts) -> Self {
        let ok = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
        let series: Vec<_> = series
            .iter()
            .map(|s| {
                let err = |j: usize| s.err.as_ref().and_then(|e| e.get(j)).copied();
                let err = |j| err(j).filter(|e| e.is_finite()).map_or(0.0, f64::abs);
                let pts = (s.points.iter().enumerate())
                    .filter(|(_, p)| ok(p.0, opts.log_x) && ok(p.1, opts.log_y))
                    .map(|(j, p)| [p.0, p.1, err(j)]);
                (s.name.clone(), pts.collect())
            })
            .collect();
        let all = || {
            series
                .iter()
                .flat_map(|s: &(String, Vec<[f64; 3]>)| s.1.iter())
        };
        let pad = if series.iter().all(|s| s.1.len() <= MARKER_MAX) {
            0.04
        } else {
            0.0
        };
        let x = padded(min_max(all().map(|p| p[0])), pad, opts.log_x);
        let y = match opts.y_range {
            Some((lo, hi)) if lo < hi && ok(lo, opts.log_y) && hi.is_finite() => (lo, hi),
            // error bars that reach zero or below on a log axis are cut at the axis
            _ => {
                let low = |p: &[f64; 3]| {
                    if ok(p[1] - p[2], opts.log_y) {
                        p[1] - p[2]
                    } else {
                        p[1]
                    }
                };
                padded(
                    min_max(all().flat_map(|p| [low(p), p[1] + p[2]])),
                    0.05,
                    opts.log_y,
                )
            }
        };
        // powers of two on x when every x is one (sequence lengths)
        let pow2 =
            |v: f64| (1.0..1e18).contains(&v) && v.fract() == 0.0 && (v as u64).is_power_of_two();
        let powers = (0..60)
            .map(|k| 2f64.powi(k))
            .filter(|v| (x.0..=x.1).contains(v));
        let powers: Vec<f64> = powers.collect();
        let x_ticks = || match all().count() > 0 && all().all(|p| pow2(p[0])) && powers.len() > 1 {
            true => powers.clone(),
            false => log_ticks(x),
        };
        let log_ticks = (opts.log_x.then(x_ticks), opts.log_y.then(|| log_ticks(y)));
        LineFig {
            labels,
            series,
            x,
            y,
            log_ticks,
        }
    }

    /// The plot on one combination of axis types (linear or log, for x and y).
    fn plot<DB, X, Y>(&self, root: &DrawingArea<DB, Shift>, s: Scale, x: X, y: Y) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
        X: AsRangedCoord<Value = f64, CoordDescType: ValueFormatter<f64>>,
        Y: AsRangedCoord<Value = f64, CoordDescType: ValueFormatter<f64>>,
    {
        let mut c = chart(root, s, &self.labels.title, x, y)?;
        mesh(&mut c, s, (&self.labels.x, &self.labels.y), |_| {})?;
        let (ylo, yhi) = self.y;
        let log_y = self.log_ticks.1.is_some();
        // the ends of an error bar, inside the axis (cut at its bottom on a log axis)
        let ends = |p: &[f64; 3]| {
            let lo = if log_y && p[1] - p[2] <= 0.0 {
                ylo
            } else {
                p[1] - p[2]
            };
            (lo.clamp(ylo, yhi), (p[1] + p[2]).clamp(ylo, yhi))
        };
        for (i, (name, pts)) in self.series.iter().enumerate() {
            let (color, long) = (palette(i), pts.len() > MARKER_MAX);
            if long && pts.iter().any(|p| p[2] > 0.0) {
                // the ± band: along the upper ends, back along the lower ones
                let up = pts.iter().map(|p| (p[0], ends(p).1));
                let band = up.chain(pts.iter().rev().map(|p| (p[0], ends(p).0)));
                let band = Polygon::new(band.collect::<Vec<_>>(), color.mix(0.18).filled());
                c.draw_series([band])?;
            }
            let line = LineSeries::new(
                pts.iter().map(|p| (p[0], p[1])),
                color.stroke_width(s.w(2.4)),
            );
            let label = if pts.is_empty() {
                format!("{name} (no data)")
            } else {
                name.clone()
            };
            let no_fill = TRANSPARENT.filled();
            (c.draw_series(line)?.label(label))
                .legend(move |at| mark(s, color.into(), !long, no_fill, at));
            // markers, with capped error bars where there is an error
            if !long {
                let style = color.filled().stroke_width(s.w(1.6));
                let shown = pts.iter().filter(|p| (ylo..=yhi).contains(&p[1]));
                let bar = |p: &[f64; 3]| {
                    let (lo, hi) = ends(p);
                    ErrorBar::new_vertical(p[0], lo, p[1], hi, style, s.w(9.0))
                };
                c.draw_series(shown.map(bar))?;
            }
        }
        if self.series.iter().all(|(_, p)| p.is_empty()) {
            note(root, &c, s, "no data")?;
        }
        let lone_unnamed = self.series.len() == 1 && self.series[0].0.is_empty();
        if !self.series.is_empty() && !lone_unnamed {
            let paths: Vec<Vec<(f64, f64)>> = (self.series.iter())
                .map(|(_, pts)| pts.iter().map(|p| (p[0], p[1].clamp(ylo, yhi))).collect())
                .collect();
            legend(&mut c, s, self.series.len(), &paths)?;
        }
        Ok(())
    }
}

impl Figure for LineFig {
    fn size(&self) -> (u32, u32) {
        (1200, 760)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, s: Scale) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let (x, y) = (self.x.0..self.x.1, self.y.0..self.y.1);
        let log = |r: std::ops::Range<f64>, t: &Vec<f64>| r.log_scale().with_key_points(t.clone());
        match &self.log_ticks {
            (None, None) => self.plot(root, s, x, y),
            (None, Some(ty)) => self.plot(root, s, x, log(y, ty)),
            (Some(tx), None) => self.plot(root, s, log(x, tx), y),
            (Some(tx), Some(ty)) => self.plot(root, s, log(x, tx), log(y, ty)),
        }
    }
}

/// Ticks of a log axis over `(lo, hi)`: powers of ten, with 2 and 5 (or every digit) between
/// them when that is what it takes to have a few.
fn log_ticks((lo, hi): (f64, f64)) -> Vec<f64> {
    let decades = lo.log10().floor() as i32..=hi.log10().ceil() as i32;
    let mut ticks = vec![];
    for digits in [
        &[1.0][..],
        &[1.0, 2.0, 5.0],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    ] {
        let all = decades
            .clone()
            .flat_map(|k| digits.iter().map(move |d| d * 10f64.powi(k)));
        ticks = all.filter(|v| (lo..=hi).contains(v)).collect();
        if ticks.len() >= 4 {
            return ticks;
        }
    }
    // less than a factor of two: round linear ticks
    if ticks.len() < 2 {
        RangedCoordf64::from(lo..hi).key_points(5)
    } else {
        ticks
    }
}
