//! Line plots with optional ± error bars or bands.

use anyhow::Result;
use plotters::prelude::*;

use super::axis::{Axis, Frame, Layout, Mark, clip_polygon, clip_polyline, draw_legend, padded};
use super::canvas::{Canvas, Figure, Pt, palette};
use super::{LineOpts, Series};

/// Series up to this many points get markers and capped error bars; longer ones a band.
const MARKER_MAX: usize = 60;

struct Prep {
    name: String,
    color: RGBColor,
    pts: Vec<Pt>,
    err: Vec<Option<f64>>,
}

pub(crate) struct LineFig {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<Prep>,
    xa: Axis,
    ya: Axis,
}

impl LineFig {
    pub fn new(
        title: &str,
        x_label: &str,
        y_label: &str,
        series: &[Series],
        opts: &LineOpts,
    ) -> Self {
        let ok = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
        let series: Vec<Prep> = series
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut pts = vec![];
                let mut err = vec![];
                for (j, &(x, y)) in s.points.iter().enumerate() {
                    if ok(x, opts.log_x) && ok(y, opts.log_y) {
                        pts.push((x, y));
                        let e = s.err.as_ref().and_then(|e| e.get(j)).copied();
                        err.push(e.filter(|e| e.is_finite()).map(f64::abs));
                    }
                }
                Prep {
                    name: s.name.clone(),
                    color: palette(i),
                    pts,
                    err,
                }
            })
            .collect();

        // x range
        let xs = series.iter().flat_map(|s| s.pts.iter().map(|p| p.0));
        let (xlo, xhi) = min_max(xs);
        let few = series.iter().all(|s| s.pts.len() <= MARKER_MAX);
        let (xlo, xhi) = padded(xlo, xhi, if few { 0.04 } else { 0.0 }, opts.log_x);
        let mut xa = Axis::new(xlo, xhi, opts.log_x);
        if opts.log_x
            && let Some(t) = pow2_ticks(&series, &xa)
        {
            xa = xa.with_ticks(t);
        }

        // y range
        let ya = match opts.y_range {
            Some((lo, hi))
                if lo.is_finite() && hi.is_finite() && lo < hi && (!opts.log_y || lo > 0.0) =>
            {
                Axis::new(lo, hi, opts.log_y)
            }
            _ => {
                let ys = series.iter().flat_map(|s| {
                    s.pts.iter().zip(&s.err).flat_map(|(p, e)| {
                        let e = e.unwrap_or(0.0);
                        let lo = if opts.log_y && p.1 - e <= 0.0 {
                            p.1
                        } else {
                            p.1 - e
                        };
                        [lo, p.1 + e]
                    })
                });
                let (ylo, yhi) = min_max(ys);
                let (ylo, yhi) = padded(ylo, yhi, 0.05, opts.log_y);
                Axis::new(ylo, yhi, opts.log_y)
            }
        };

        LineFig {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series,
            xa,
            ya,
        }
    }

    fn layout(&self) -> Layout<'_> {
        Layout {
            size: self.size(),
            title: &self.title,
            x_label: &self.x_label,
            y_label: &self.y_label,
            extra_top: 0.0,
            extra_right: 0.0,
        }
    }
}

/// Finite min and max of `vals` (NaN, NaN when there are none).
pub(crate) fn min_max(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for v in vals.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        (f64::NAN, f64::NAN)
    } else {
        (lo, hi)
    }
}

/// Ticks at powers of two when every x is a power of two ≥ 1 (sequence lengths, sizes).
fn pow2_ticks(series: &[Prep], xa: &Axis) -> Option<Vec<(f64, String)>> {
    let mut n = 0;
    for s in series {
        for &(x, _) in &s.pts {
            if !(x >= 1.0 && x <= 2f64.powi(60) && x.fract() == 0.0 && (x as u64).is_power_of_two())
            {
                return None;
            }
            n += 1;
        }
    }
    if n == 0 {
        return None;
    }
    let mut ticks = vec![];
    let mut k = 0;
    while k <= 62 {
        let v = 2f64.powi(k);
        if v > xa.hi {
            break;
        }
        if xa.contains(v) {
            ticks.push((v, format!("{}", v as u64)));
        }
        k += 1;
    }
    (ticks.len() >= 2).then_some(ticks)
}

impl Figure for LineFig {
    fn size(&self) -> (u32, u32) {
        (1200, 760)
    }

    fn draw<DB: DrawingBackend>(&self, c: &Canvas<DB>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let l = self.layout();
        let f = Frame::new(&l, self.xa.clone(), self.ya.clone());
        f.draw_grid(c, true)?;
        let to_px = |q: Pt| f.pt(f.denorm(q));
        let mut occupied: Vec<Pt> = vec![];

        // ± bands for long series
        for s in &self.series {
            if s.pts.len() <= MARKER_MAX || s.err.iter().all(Option::is_none) {
                continue;
            }
            // one band per run of points that have an error
            let mut run: Vec<(Pt, f64)> = vec![];
            let flush = |run: &mut Vec<(Pt, f64)>| -> Result<()> {
                if run.len() >= 2 {
                    let mut poly: Vec<Pt> =
                        run.iter().map(|&((x, y), e)| f.norm((x, y + e))).collect();
                    poly.extend(run.iter().rev().map(|&((x, y), e)| {
                        let lo = if f.ya.log && y - e <= 0.0 {
                            f.ya.lo
                        } else {
                            y - e
                        };
                        f.norm((x, lo))
                    }));
                    let poly: Vec<Pt> = clip_polygon(&poly).into_iter().map(to_px).collect();
                    c.polygon(&poly, s.color.mix(0.18))?;
                }
                run.clear();
                Ok(())
            };
            for (p, e) in s.pts.iter().zip(&s.err) {
                match e {
                    Some(e) => run.push((*p, *e)),
                    None => flush(&mut run)?,
                }
            }
            flush(&mut run)?;
        }

        // lines
        for s in &self.series {
            let norm: Vec<Pt> = s.pts.iter().map(|&p| f.norm(p)).collect();
            occupied.extend(sample_polyline(&norm));
            for piece in clip_polyline(&norm) {
                let px: Vec<Pt> = piece.into_iter().map(to_px).collect();
                c.line(&px, s.color.into(), 2.4)?;
            }
            if s.pts.len() == 1 {
                // a lone point has no line: always mark it
                let p = s.pts[0];
                if f.xa.contains(p.0) && f.ya.contains(p.1) {
                    c.dot(f.pt(p), 4.5, s.color.into())?;
                }
            }
        }

        // error bars and markers for short series
        for s in &self.series {
            if s.pts.len() > MARKER_MAX {
                continue;
            }
            for (&(x, y), e) in s.pts.iter().zip(&s.err) {
                if !f.xa.contains(x) {
                    continue;
                }
                let px = f.px(x);
                if let Some(e) = *e
                    && e > 0.0
                {
                    let lo = y - e;
                    let hi = y + e;
                    let lo_in = f.ya.contains(lo) && !(f.ya.log && lo <= 0.0);
                    let hi_in = f.ya.contains(hi);
                    let ylo = if lo_in { f.py(lo) } else { f.bottom };
                    let yhi = if hi_in { f.py(hi) } else { f.top };
                    let (ylo, yhi) = (ylo.min(f.bottom), yhi.max(f.top));
                    if ylo > yhi {
                        c.line(&[(px, ylo), (px, yhi)], s.color.into(), 1.6)?;
                        let cap = 5.0;
                        if lo_in {
                            c.line(&[(px - cap, ylo), (px + cap, ylo)], s.color.into(), 1.6)?;
                        }
                        if hi_in {
                            c.line(&[(px - cap, yhi), (px + cap, yhi)], s.color.into(), 1.6)?;
                        }
                    }
                }
                if f.ya.contains(y) {
                    c.dot((px, f.py(y)), 4.0, s.color.into())?;
                }
            }
        }

        f.draw_axes(c, &l)?;
        if self.series.iter().all(|s| s.pts.is_empty()) {
            f.note(c, "no data")?;
        }
        let entries: Vec<(String, Mark)> = self
            .series
            .iter()
            .map(|s| {
                let name = if s.pts.is_empty() {
                    format!("{} (no data)", s.name)
                } else {
                    s.name.clone()
                };
                let marker = s.pts.len() <= MARKER_MAX;
                (
                    name,
                    Mark::Line {
                        color: s.color,
                        marker,
                    },
                )
            })
            .collect();
        let lone_unnamed = entries.len() == 1 && self.series[0].name.is_empty();
        if !entries.is_empty() && !lone_unnamed {
            draw_legend(c, &f, &entries, &occupied)?;
        }
        Ok(())
    }
}

/// Points along the visible part of a (normalised) polyline, dense enough to tell which regions
/// of the plot it crosses.
pub(crate) fn sample_polyline(pts: &[Pt]) -> Vec<Pt> {
    let inside = |p: &Pt| (0.0..=1.0).contains(&p.0) && (0.0..=1.0).contains(&p.1);
    if pts.len() > 4000 {
        let stride = pts.len() / 4000;
        return pts.iter().step_by(stride).copied().filter(inside).collect();
    }
    let mut out = Vec::with_capacity(pts.len() * 2);
    for piece in clip_polyline(pts) {
        out.extend_from_slice(&piece);
        for w in piece.windows(2) {
            let (a, b) = (w[0], w[1]);
            let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
            let n = (len / 0.01).ceil().min(200.0) as usize;
            for i in 1..n {
                let t = i as f64 / n as f64;
                out.push((a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1)));
            }
        }
    }
    out
}
