//! Heat-maps with a viridis colour bar and marked column ranges.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::Shade;
use super::chart::{FRAME, Figure, Labels, NAN_GREY, Scale, Ticked, chart, mesh, min_max, note};

/// Width of the colour-bar column, the band of regions above the map, and the row of region
/// labels that do not fit in their band (logical pixels).
const BAR_COLUMN: f64 = 165.0;
const BAND: f64 = 30.0;
const ROW: f64 = 30.0;
/// Most cells drawn in the SVG (larger matrices are block-averaged).
const SVG_MAX_CELLS: usize = 50_000;

pub(super) struct HeatFig<'a> {
    labels: Labels,
    cb_label: String,
    data: &'a [f64],
    rows: usize,
    cols: usize,
    shades: Vec<Shade>,
    /// Colour scale: the data's exact extremes (a small range around a constant).
    lo: f64,
    hi: f64,
}

impl<'a> HeatFig<'a> {
    pub fn new(
        labels: Labels,
        cb_label: &str,
        data: &'a [f64],
        (rows, cols): (usize, usize),
        shades: &[Shade],
    ) -> Self {
        let (lo, hi) = super::chart::padded(min_max(data.iter().copied()), 0.0, false);
        let shades = (shades.iter())
            .filter(|s| s.range.start < s.range.end.min(cols))
            .map(|s| Shade {
                range: s.range.start..s.range.end.min(cols),
                ..s.clone()
            })
            .collect();
        let cb_label = cb_label.into();
        HeatFig {
            labels,
            cb_label,
            data,
            rows,
            cols,
            shades,
            lo,
            hi,
        }
    }

    fn color(&self, v: f64) -> RGBColor {
        if v.is_finite() {
            ViridisRGB::get_color_normalized(v, self.lo, self.hi)
        } else {
            NAN_GREY
        }
    }
}

/// Ticks at the centres of `n` cells (labelled with their index), at a round spacing.
fn index_ticks(n: usize) -> Vec<f64> {
    let raw = n as f64 / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = match n {
        0..=16 => 1,
        _ if n.is_power_of_two() => n / 8,
        _ => {
            ([1.0, 2.0, 2.5, 5.0, 10.0]
                .into_iter()
                .find(|m| m * mag >= raw)
                .unwrap()
                * mag) as usize
        }
    };
    (0..n)
        .step_by(step.max(1))
        .map(|i| i as f64 + 0.5)
        .collect()
}

/// Block-averages a rows×cols matrix to nr×nc (NaN-aware; all-NaN blocks stay NaN).
fn resample(data: &[f64], (rows, cols): (usize, usize), (nr, nc): (usize, usize)) -> Vec<f64> {
    let span = |i: usize, n: usize, of: usize| i * of / n..((i + 1) * of / n).max(i * of / n + 1);
    let cell = |i: usize, j: usize| {
        let vals =
            span(i, nr, rows).flat_map(|r| span(j, nc, cols).map(move |c| data[r * cols + c]));
        let (sum, k) = vals
            .filter(|v| v.is_finite())
            .fold((0.0, 0), |(s, k), v| (s + v, k + 1));
        if k == 0 { f64::NAN } else { sum / k as f64 }
    };
    (0..nr * nc).map(|i| cell(i / nc, i % nc)).collect()
}

impl Figure for HeatFig<'_> {
    fn size(&self) -> (u32, u32) {
        let plot_h = (self.rows as f64 * 34.0).clamp(300.0, 560.0);
        let top = 70.0 + if self.shades.is_empty() { 0.0 } else { 60.0 };
        (1300, (plot_h + top + 110.0) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, s: Scale) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let centre = Pos::new(HPos::Center, VPos::Center);
        let at = (root.dim_in_pixel().0 as i32 / 2, s.px(26.0));
        root.draw(&Text::new(
            self.labels.title.clone(),
            at,
            s.font(27.0).pos(centre),
        ))?;
        let body = root.margin(s.px(48.0), 0, 0, 0);
        let (left, right) =
            body.split_horizontally(body.dim_in_pixel().0 as i32 - s.px(BAR_COLUMN));
        let (cols, rows) = (self.cols.max(1) as f64, self.rows.max(1) as f64);

        // Region labels that do not fit in their band go into a row above it.
        let label = s.font(16.0);
        let plot_w = left.dim_in_pixel().0 as f64 - s.k * (96.0 + 16.0 + 30.0);
        let text_w = |t: &str| root.estimate_text_size(t, &label).map_or(0, |t| t.0 as i32);
        let fits = |sh: &Shade| {
            let w = (sh.range.end - sh.range.start) as f64 / cols * plot_w;
            (text_w(&sh.label) + s.px(10.0)) as f64 <= w
        };
        let row = if self.shades.iter().all(fits) {
            0.0
        } else {
            ROW
        };
        let top = if self.shades.is_empty() {
            0.0
        } else {
            row + BAND + 6.0
        };
        let (strip, map) = left.split_vertically(s.px(top));

        let x = Ticked::new(0.0..cols, index_ticks(self.cols));
        let mut c = chart(
            &map,
            s,
            "",
            x,
            Ticked::new(0.0..rows, index_ticks(self.rows)),
        )?;
        let index = |v: &f64| format!("{}", v.floor());
        mesh(&mut c, s, (&self.labels.x, &self.labels.y), |m| {
            m.disable_mesh()
                .x_label_formatter(&index)
                .y_label_formatter(&index);
        })?;
        // cells, block-averaged down to what the output can show; runs of one colour merged
        if self.rows > 0 && self.cols > 0 {
            let (xr, yr) = c.plotting_area().get_pixel_range();
            let (mut nr, mut nc) = (
                self.rows.min(yr.len()).max(1),
                self.cols.min(xr.len()).max(1),
            );
            if s.svg && nr * nc > SVG_MAX_CELLS {
                let f = (SVG_MAX_CELLS as f64 / (nr * nc) as f64).sqrt();
                (nr, nc) = (
                    ((nr as f64 * f) as usize).max(1),
                    ((nc as f64 * f) as usize).max(1),
                );
            }
            let grid = resample(self.data, (self.rows, self.cols), (nr, nc));
            let (cw, rh) = (cols / nc as f64, rows / nr as f64);
            let mut cells = vec![];
            for (i, row) in grid.chunks(nc).enumerate() {
                let mut j = 0;
                while j < nc {
                    let color = self.color(row[j]);
                    let end = (j + 1..nc)
                        .find(|&e| self.color(row[e]) != color)
                        .unwrap_or(nc);
                    let corners = [
                        (j as f64 * cw, i as f64 * rh),
                        (end as f64 * cw, (i + 1) as f64 * rh),
                    ];
                    cells.push(Rectangle::new(corners, color.filled()));
                    j = end;
                }
            }
            c.draw_series(cells)?;
        }
        if self.rows == 0 || self.cols == 0 {
            note(root, &c, s, "no data")?;
        } else if self.data.iter().all(|v| !v.is_finite()) {
            note(root, &c, s, "no finite values")?;
        }

        // the task's regions: coloured bands above the map, on the map's x scale
        if !self.shades.is_empty() {
            let mut band = ChartBuilder::on(&strip)
                .margin_left(s.px(16.0))
                .margin_right(s.px(30.0))
                .margin_top(s.px(row))
                .y_label_area_size(s.px(96.0))
                .build_cartesian_2d(0.0..cols, 0.0..1.0)?;
            let (xr, yr) = band.plotting_area().get_pixel_range();
            // labels that do not fit: patches with text in a row above, from the left edge
            let mut x = xr.start;
            let y = yr.start - s.px(row / 2.0 + 3.0);
            for sh in &self.shades {
                let color = RGBColor(sh.color.0, sh.color.1, sh.color.2);
                let (a, b) = (sh.range.start as f64, sh.range.end as f64);
                band.draw_series([Rectangle::new([(a, 0.0), (b, 1.0)], color.filled())])?;
                if fits(sh) {
                    let light =
                        0.299 * color.0 as f64 + 0.587 * color.1 as f64 + 0.114 * color.2 as f64;
                    let ink = if light > 150.0 { BLACK } else { WHITE };
                    let text = Text::new(
                        sh.label.clone(),
                        ((a + b) / 2.0, 0.5),
                        label.color(&ink).pos(centre),
                    );
                    band.draw_series([text])?;
                } else {
                    let patch = [(x, y - s.px(7.0)), (x + s.px(22.0), y + s.px(7.0))];
                    root.draw(&Rectangle::new(patch, color.filled()))?;
                    let style = label.pos(Pos::new(HPos::Left, VPos::Center));
                    root.draw(&Text::new(sh.label.clone(), (x + s.px(28.0), y), style))?;
                    x += s.px(50.0) + text_w(&sh.label);
                }
            }
        }

        // colour bar, level with the map, its scale on the right: round ticks inside and the
        // exact extremes at the ends (float noise around zero, 8e-12 on a 0..1 scale, reads 0)
        let (lo, hi) = (self.lo, self.hi);
        let round = RangedCoordf64::from(lo..hi).key_points(5).into_iter();
        let inner = round.filter(|v| (v - lo).min(hi - v) > 0.08 * (hi - lo));
        let ticks = [lo].into_iter().chain(inner).chain([hi]);
        let ticks = ticks
            .map(|v| if v.abs() < (hi - lo) * 1e-9 { 0.0 } else { v })
            .collect();
        let mut bar = ChartBuilder::on(&right)
            .margin_top(s.px(top + 16.0))
            .margin_bottom(s.px(16.0))
            .margin_left(s.px(8.0))
            .margin_right(s.px(12.0))
            .x_label_area_size(s.px(62.0))
            .right_y_label_area_size(s.px(BAR_COLUMN - 50.0))
            .build_cartesian_2d(0.0..1.0, Ticked::new(lo..hi, ticks))?;
        mesh(&mut bar, s, ("", &self.cb_label), |m| {
            m.disable_mesh().disable_x_axis().x_labels(0);
        })?;
        let n = if s.svg { 160 } else { 400 };
        let step = (hi - lo) / n as f64;
        let strip = (0..n).map(|i| lo + i as f64 * step).map(|v| {
            Rectangle::new(
                [(0.0, v), (1.0, v + step)],
                self.color(v + step / 2.0).filled(),
            )
        });
        bar.draw_series(strip)?;
        bar.draw_series([Rectangle::new(
            [(0.0, lo), (1.0, hi)],
            FRAME.stroke_width(s.w(1.0)),
        )])?;
        // the grey of cells without a value (levels a query does not read), under the bar
        if self.data.iter().any(|v| !v.is_finite()) {
            let (xr, yr) = bar.plotting_area().get_pixel_range();
            let y = yr.end + s.px(22.0);
            let r = [(xr.start, y - s.px(8.0)), (xr.end, y + s.px(8.0))];
            root.draw(&Rectangle::new(r, NAN_GREY.filled()))?;
            root.draw(&Rectangle::new(r, FRAME.stroke_width(s.w(1.0))))?;
            let style = s.font(17.0).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new("no value", (xr.end + s.px(10.0), y), style))?;
        }
        Ok(())
    }
}
