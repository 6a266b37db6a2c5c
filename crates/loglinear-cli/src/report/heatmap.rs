//! Heat-maps with a viridis colour bar and marked column ranges.

use anyhow::Result;
use plotters::prelude::*;

use super::Shade;
use super::axis::{
    Axis, Frame, LABEL_SIZE, LEGEND_SIZE, Layout, Mark, TICK_SIZE, draw_legend_row, fmt_sig,
    fmt_step, legend_row_width, nice_step,
};
use super::canvas::{
    CENTER_CENTER, Canvas, FRAME, Figure, INK, LEFT_CENTER, NAN_GREY, contrast_ink, text_width,
    viridis,
};
use super::line::min_max;

const BAR_GAP: f64 = 26.0;
const BAR_W: f64 = 24.0;
const TRACK_H: f64 = 24.0;
const TRACK_GAP: f64 = 5.0;
const BAND_TEXT: f64 = 16.0;
/// Most cells drawn in the SVG (larger matrices are block-averaged).
const SVG_MAX_CELLS: usize = 50_000;

pub(crate) struct HeatFig<'a> {
    title: String,
    x_label: String,
    y_label: String,
    cb_label: String,
    data: &'a [f64],
    rows: usize,
    cols: usize,
    shades: Vec<Shade>,
    /// Colour scale [lo, hi] and the data's own min / max (None: no finite value).
    lo: f64,
    hi: f64,
    extremes: Option<(f64, f64)>,
    has_nan: bool,
    /// Colour-bar ticks (value, label).
    cb_ticks: Vec<(f64, String)>,
    xa: Axis,
    ya: Axis,
}

impl<'a> HeatFig<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        title: &str,
        x_label: &str,
        y_label: &str,
        cb_label: &str,
        data: &'a [f64],
        rows: usize,
        cols: usize,
        shades: &[Shade],
    ) -> Self {
        let (dmin, dmax) = min_max(data.iter().copied());
        let extremes = dmin.is_finite().then_some((dmin, dmax));
        let has_nan = data.iter().any(|v| !v.is_finite());
        let (lo, hi, cb_ticks) = match extremes {
            None => (0.0, 1.0, vec![]),
            Some((a, b)) if a == b => {
                // constant: centre the value on a small range around it
                let d = if a == 0.0 { 1.0 } else { a.abs() * 0.1 };
                let ticks = vec![
                    (a - d, fmt_sig(a - d, 4)),
                    (a, fmt_sig(a, 4)),
                    (a + d, fmt_sig(a + d, 4)),
                ];
                (a - d, a + d, ticks)
            }
            Some((a, b)) => {
                let step = nice_step(b - a, 5);
                let span_max = a.abs().max(b.abs());
                // exact extremes, except float noise around zero (e.g. 8e-12 on a 0..1 scale)
                let ext = |v: f64| {
                    if v.abs() < (b - a) * 1e-9 {
                        "0".to_string()
                    } else {
                        fmt_sig(v, 4)
                    }
                };
                let mut ticks = vec![(a, ext(a))];
                let first = (a / step).ceil() as i64;
                let last = (b / step).floor() as i64;
                for i in first..=last.min(first + 100) {
                    let v = i as f64 * step;
                    let t = (v - a) / (b - a);
                    if t > 0.08 && t < 0.92 {
                        ticks.push((v, fmt_step(v, step, span_max)));
                    }
                }
                ticks.push((b, ext(b)));
                (a, b, ticks)
            }
        };

        // x: token positions at column centres; y: row indices at row centres (row 0 at bottom)
        let xa = Axis::new(0.0, cols.max(1) as f64, false).with_ticks(index_ticks(cols, 8));
        let ya = Axis::new(0.0, rows.max(1) as f64, false).with_ticks(index_ticks(rows, 8));

        HeatFig {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            cb_label: cb_label.into(),
            data,
            rows,
            cols,
            shades: shades
                .iter()
                .filter_map(|s| {
                    let end = s.range.end.min(cols);
                    (s.range.start < end).then(|| Shade {
                        label: s.label.clone(),
                        range: s.range.start..end,
                        color: s.color,
                    })
                })
                .collect(),
            lo,
            hi,
            extremes,
            has_nan,
            cb_ticks,
            xa,
            ya,
        }
    }

    fn cb_label_w(&self) -> f64 {
        self.cb_ticks
            .iter()
            .map(|(_, s)| text_width(s, TICK_SIZE))
            .fold(text_width("no value", TICK_SIZE), f64::max)
    }

    fn layout(&self, extra_top: f64) -> Layout<'_> {
        let extra_right = BAR_GAP
            + BAR_W
            + 6.0
            + 6.0
            + self.cb_label_w()
            + if self.cb_label.is_empty() {
                0.0
            } else {
                14.0 + LABEL_SIZE
            }
            - 12.0;
        Layout {
            size: self.size(),
            title: &self.title,
            x_label: &self.x_label,
            y_label: &self.y_label,
            extra_top,
            extra_right,
        }
    }

    /// Shades whose label fits inside their band (pixel widths from frame `f`).
    fn fits_in_band(&self, f: &Frame, s: &Shade) -> bool {
        let w = f.px(s.range.end as f64) - f.px(s.range.start as f64);
        text_width(&s.label, BAND_TEXT) + 10.0 <= w
    }

    /// The frame, with room above the map for the shade track (and a legend row when some band
    /// labels do not fit in their band).
    fn frame(&self) -> (Frame, Layout<'_>, bool) {
        if self.shades.is_empty() {
            let l = self.layout(0.0);
            return (Frame::new(&l, self.xa.clone(), self.ya.clone()), l, false);
        }
        let probe = Frame::new(&self.layout(0.0), self.xa.clone(), self.ya.clone());
        let need_row = self.shades.iter().any(|s| !self.fits_in_band(&probe, s));
        let extra = TRACK_H + TRACK_GAP + 4.0 + if need_row { LEGEND_SIZE + 14.0 } else { 0.0 };
        let l = self.layout(extra);
        (
            Frame::new(&l, self.xa.clone(), self.ya.clone()),
            l,
            need_row,
        )
    }

    fn color(&self, v: f64) -> RGBColor {
        if !v.is_finite() {
            return NAN_GREY;
        }
        viridis((v - self.lo) / (self.hi - self.lo))
    }
}

/// Ticks at the centres of `n` cells labelled with their index, at a round spacing.
fn index_ticks(n: usize, target: usize) -> Vec<(f64, String)> {
    if n == 0 {
        return vec![];
    }
    let step = if n <= 16 {
        1
    } else if n.is_power_of_two() {
        n / target.next_power_of_two()
    } else {
        nice_step(n as f64, target).ceil().max(1.0) as usize
    };
    (0..n)
        .step_by(step.max(1))
        .map(|i| (i as f64 + 0.5, i.to_string()))
        .collect()
}

/// Block-average a rows×cols matrix to nr×nc (NaN-aware; all-NaN blocks stay NaN).
fn resample(data: &[f64], rows: usize, cols: usize, nr: usize, nc: usize) -> Vec<f64> {
    if nr == rows && nc == cols {
        return data.to_vec();
    }
    let mut out = Vec::with_capacity(nr * nc);
    for i in 0..nr {
        let (r0, r1) = (i * rows / nr, ((i + 1) * rows / nr).max(i * rows / nr + 1));
        for j in 0..nc {
            let (c0, c1) = (j * cols / nc, ((j + 1) * cols / nc).max(j * cols / nc + 1));
            let mut s = 0.0;
            let mut k = 0usize;
            for r in r0..r1.min(rows) {
                for v in &data[r * cols + c0..r * cols + c1.min(cols)] {
                    if v.is_finite() {
                        s += v;
                        k += 1;
                    }
                }
            }
            out.push(if k == 0 { f64::NAN } else { s / k as f64 });
        }
    }
    out
}

impl Figure for HeatFig<'_> {
    fn size(&self) -> (u32, u32) {
        let plot_h = (self.rows as f64 * 34.0).clamp(300.0, 560.0);
        let top = 70.0 + if self.shades.is_empty() { 0.0 } else { 60.0 };
        (1300, (plot_h + top + 110.0) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, c: &Canvas<DB>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let (f, l, need_row) = self.frame();

        // cells, block-averaged down to what the output can show
        if self.rows > 0 && self.cols > 0 {
            let k = if c.is_svg() { 1.0 } else { 2.0 };
            let mut nr = self.rows.min((f.height() * k) as usize).max(1);
            let mut nc = self.cols.min((f.width() * k) as usize).max(1);
            if c.is_svg() && nr * nc > SVG_MAX_CELLS {
                let s = (SVG_MAX_CELLS as f64 / (nr * nc) as f64).sqrt();
                nr = ((nr as f64 * s) as usize).max(1);
                nc = ((nc as f64 * s) as usize).max(1);
            }
            let grid = resample(self.data, self.rows, self.cols, nr, nc);
            let xs: Vec<f64> = (0..=nc)
                .map(|j| f.px(j as f64 * self.cols as f64 / nc as f64))
                .collect();
            let ys: Vec<f64> = (0..=nr)
                .map(|i| f.py(i as f64 * self.rows as f64 / nr as f64))
                .collect();
            for i in 0..nr {
                // merge runs of equal colour into one rectangle
                let mut j = 0;
                while j < nc {
                    let col = self.color(grid[i * nc + j]);
                    let mut e = j + 1;
                    while e < nc && self.color(grid[i * nc + e]) == col {
                        e += 1;
                    }
                    c.fill_rect((xs[j], ys[i]), (xs[e], ys[i + 1]), col.into())?;
                    j = e;
                }
            }
        }

        // shade track above the map
        let track_bottom = f.top - TRACK_GAP;
        let track_top = track_bottom - TRACK_H;
        let mut row_entries = vec![];
        for s in &self.shades {
            let color = RGBColor(s.color.0, s.color.1, s.color.2);
            let (x0, x1) = (f.px(s.range.start as f64), f.px(s.range.end as f64));
            c.fill_rect((x0, track_top), (x1, track_bottom), color.into())?;
            // boundary ticks joining the band to the map
            for x in [x0, x1] {
                c.line(&[(x, track_bottom), (x, f.top)], color.into(), 1.5)?;
            }
            if self.fits_in_band(&f, s) {
                c.text(
                    &s.label,
                    ((x0 + x1) / 2.0, (track_top + track_bottom) / 2.0),
                    BAND_TEXT,
                    contrast_ink(color),
                    CENTER_CENTER,
                    false,
                )?;
            } else {
                row_entries.push((s.label.clone(), Mark::Patch { color, alpha: 1.0 }));
            }
        }
        if need_row && !row_entries.is_empty() {
            let cy = track_top - 8.0 - LEGEND_SIZE / 2.0;
            let w = legend_row_width(&row_entries);
            let cx = ((f.left + f.right) / 2.0).max(f.left + w / 2.0);
            draw_legend_row(c, &row_entries, (cx, cy))?;
        }

        f.draw_axes(c, &l)?;
        if self.rows == 0 || self.cols == 0 {
            f.note(c, "no data")?;
        } else if self.extremes.is_none() {
            f.note(c, "no finite values")?;
        }

        // colour bar
        let bx0 = f.right + BAR_GAP;
        let bx1 = bx0 + BAR_W;
        let n = (f.height() * 2.0).clamp(64.0, 400.0) as usize;
        let n = if c.is_svg() { n.min(160) } else { n };
        for i in 0..n {
            let t0 = i as f64 / n as f64;
            let t1 = (i + 1) as f64 / n as f64;
            let y0 = f.bottom - t0 * f.height();
            let y1 = f.bottom - t1 * f.height();
            c.fill_rect((bx0, y0), (bx1, y1), viridis((t0 + t1) / 2.0).into())?;
        }
        c.stroke_rect((bx0, f.top), (bx1, f.bottom), FRAME.into(), 1.0)?;
        let ypos = |v: f64| f.bottom - (v - self.lo) / (self.hi - self.lo) * f.height();
        for (v, s) in &self.cb_ticks {
            let y = ypos(*v);
            c.line(&[(bx1, y), (bx1 + 6.0, y)], FRAME.into(), 1.2)?;
            c.text(s, (bx1 + 12.0, y), TICK_SIZE, INK, LEFT_CENTER, false)?;
        }
        if self.has_nan && self.rows * self.cols > 0 {
            let y = f.bottom + 18.0;
            c.fill_rect((bx0, y - 8.0), (bx1, y + 8.0), NAN_GREY.into())?;
            c.stroke_rect((bx0, y - 8.0), (bx1, y + 8.0), FRAME.into(), 1.0)?;
            c.text(
                "no value",
                (bx1 + 12.0, y),
                TICK_SIZE,
                INK,
                LEFT_CENTER,
                false,
            )?;
        }
        if !self.cb_label.is_empty() {
            let x = bx1 + 12.0 + self.cb_label_w() + 14.0 + LABEL_SIZE / 2.0;
            c.text(
                &self.cb_label,
                (x, (f.top + f.bottom) / 2.0),
                LABEL_SIZE,
                INK,
                CENTER_CENTER,
                true,
            )?;
        }
        Ok(())
    }
}
