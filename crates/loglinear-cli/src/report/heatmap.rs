//! Heat-maps with a viridis colour bar and marked column ranges.

use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::Shade;
use super::chart::round_ticks;
use super::chart::{Axis, FRAME, NAN_GREY, chart, figure, house, min_max, note, padded};

/// Width of the colour-bar column, the band of regions above the map, and the row of region
/// labels that do not fit in their band (logical pixels).
const BAR_COLUMN: f64 = 165.0;
const BAND: f64 = 30.0;
const ROW: f64 = 30.0;
/// Most cells drawn in the SVG (larger matrices are block-averaged).
const SVG_MAX_CELLS: usize = 50_000;

/// Heat-map of a `rows`×`cols` matrix given row-major (`data[r * cols + c]`), row 0 at the bottom,
/// with the viridis colour map and a colour bar labelled with its scale (including the exact
/// minimum and maximum). `shades` mark column ranges with a coloured band above the map, labelled
/// in place or in a row above, so the data themselves stay unobscured. NaN cells are grey.
#[allow(clippy::too_many_arguments)]
pub fn heatmap(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    colorbar_label: &str,
    data: &[f64],
    rows: usize,
    cols: usize,
    shades: &[Shade],
) -> Result<Vec<PathBuf>> {
    ensure!(
        rows.checked_mul(cols) == Some(data.len()),
        "heat-map {stem:?}: {} values do not form a {rows}×{cols} matrix",
        data.len()
    );
    // the colour scale: the data's exact extremes (a small range around a constant)
    let (lo, hi) = padded(min_max(data.iter().copied()), 0.0, false);
    let color = |v: f64| match v.is_finite() {
        true => ViridisRGB::get_color_normalized(v, lo, hi),
        false => NAN_GREY,
    };
    // its ticks: round ones inside and the exact extremes at the ends (float noise around zero,
    // 8e-12 on a 0..1 scale, reads 0)
    let inner = round_ticks((lo, hi), 5).into_iter();
    let inner = inner.filter(|v| (v - lo).min(hi - v) > 0.08 * (hi - lo));
    let scale = [lo].into_iter().chain(inner).chain([hi]);
    let noise = |v: f64| if v.abs() < (hi - lo) * 1e-9 { 0.0 } else { v };
    let scale: Vec<f64> = scale.map(noise).collect();
    // the regions within the map
    let mut shades = shades.to_vec();
    shades
        .iter_mut()
        .for_each(|sh| sh.range.end = sh.range.end.min(cols));
    shades.retain(|sh| !sh.range.is_empty());
    let map_h = (rows as f64 * 34.0).clamp(300.0, 560.0);
    let band_h = if shades.is_empty() { 0.0 } else { 60.0 };
    let size = (1300, (map_h + 180.0 + band_h) as u32);
    let (fc, fr) = (cols.max(1) as f64, rows.max(1) as f64);

    figure!(dir, stem, size, |root, s| {
        let centre = Pos::new(HPos::Center, VPos::Center);
        let at = (root.dim_in_pixel().0 as i32 / 2, s.px(26.0));
        root.draw(&Text::new(title, at, s.font(27.0).pos(centre)))?;
        let body = root.margin(s.px(48.0), 0, 0, 0);
        let (left, right) =
            body.split_horizontally(body.dim_in_pixel().0 as i32 - s.px(BAR_COLUMN));
        // region labels that do not fit in their band go into a row above it
        let font = s.font(16.0);
        let map_w = left.dim_in_pixel().0 as f64 - s.k * (96.0 + 16.0 + 30.0);
        let text_w = |t: &str| root.estimate_text_size(t, &font).map_or(0, |t| t.0 as i32);
        let fits = |sh: &Shade| {
            let w = sh.range.len() as f64 / fc * map_w;
            (text_w(&sh.label) + s.px(10.0)) as f64 <= w
        };
        let row = if shades.iter().all(fits) { 0.0 } else { ROW };
        let top = if shades.is_empty() {
            0.0
        } else {
            row + BAND + 6.0
        };
        let (strip, map) = left.split_vertically(s.px(top));

        let axes = (index_axis(cols), index_axis(rows));
        let b = house(&map, s, "");
        let mut c = chart(b, s, (x_label, y_label), axes, (false, false))?;
        // cells, block-averaged down to what the output can show; runs of one colour merged
        if rows > 0 && cols > 0 {
            let (xr, yr) = c.plotting_area().get_pixel_range();
            let (mut nr, mut nc) = (rows.min(yr.len()).max(1), cols.min(xr.len()).max(1));
            if s.svg && nr * nc > SVG_MAX_CELLS {
                let f = (SVG_MAX_CELLS as f64 / (nr * nc) as f64).sqrt();
                let shrink = |n: usize| ((n as f64 * f) as usize).max(1);
                (nr, nc) = (shrink(nr), shrink(nc));
            }
            let grid = resample(data, (rows, cols), (nr, nc));
            let (cw, rh) = (fc / nc as f64, fr / nr as f64);
            let mut cells = vec![];
            for (i, row) in grid.chunks(nc).enumerate() {
                let mut j = 0;
                for run in row.chunk_by(|a, b| color(*a) == color(*b)) {
                    let (x0, x1) = (j as f64 * cw, (j + run.len()) as f64 * cw);
                    let corners = [(x0, i as f64 * rh), (x1, (i + 1) as f64 * rh)];
                    cells.push(Rectangle::new(corners, color(run[0]).filled()));
                    j += run.len();
                }
            }
            c.draw_series(cells)?;
        }
        if rows == 0 || cols == 0 {
            note(&c, s, "no data")?;
        } else if data.iter().all(|v| !v.is_finite()) {
            note(&c, s, "no finite values")?;
        }

        // the task's regions: coloured bands above the map, on the map's x scale
        if !shades.is_empty() {
            let mut band = ChartBuilder::on(&strip);
            band.margin_left(s.px(16.0)).margin_right(s.px(30.0));
            band.margin_top(s.px(row)).y_label_area_size(s.px(96.0));
            let mut band = band.build_cartesian_2d(0.0..fc, 0.0..1.0)?;
            let (xr, yr) = band.plotting_area().get_pixel_range();
            // labels that do not fit: patches with text in a row above, from the left edge
            let (mut x, y) = (xr.start, yr.start - s.px(row / 2.0 + 3.0));
            for sh in &shades {
                let ((r, g, b), label) = (sh.color, sh.label.clone());
                let (x0, x1) = (sh.range.start as f64, sh.range.end as f64);
                let color = RGBColor(r, g, b);
                band.draw_series([Rectangle::new([(x0, 0.0), (x1, 1.0)], color.filled())])?;
                if fits(sh) {
                    let light = 0.299 * r as f64 + 0.587 * g as f64 + 0.114 * b as f64;
                    let ink = if light > 150.0 { BLACK } else { WHITE };
                    let style = font.color(&ink).pos(centre);
                    band.draw_series([Text::new(label, ((x0 + x1) / 2.0, 0.5), style)])?;
                } else {
                    let patch = [(x, y - s.px(7.0)), (x + s.px(22.0), y + s.px(7.0))];
                    root.draw(&Rectangle::new(patch, color.filled()))?;
                    let style = font.pos(Pos::new(HPos::Left, VPos::Center));
                    root.draw(&Text::new(label, (x + s.px(28.0), y), style))?;
                    x += s.px(50.0) + text_w(&sh.label);
                }
            }
        }

        // the colour bar, level with the map, its scale on the right
        let mut bar = ChartBuilder::on(&right);
        bar.margin_top(s.px(top + 16.0)).margin_bottom(s.px(78.0));
        bar.margin_left(s.px(8.0)).margin_right(s.px(12.0));
        bar.right_y_label_area_size(s.px(BAR_COLUMN - 50.0));
        let (x, y) = (
            Axis::new((0.0, 1.0), false, vec![]),
            Axis::numbers((lo, hi), false, &scale),
        );
        let mut bar = chart(bar, s, ("", colorbar_label), (x, y), (false, false))?;
        let n = if s.svg { 160 } else { 400 };
        let step = (hi - lo) / n as f64;
        let strip =
            |v: f64| Rectangle::new([(0.0, v), (1.0, v + step)], color(v + step / 2.0).filled());
        bar.draw_series((0..n).map(|i| strip(lo + i as f64 * step)))?;
        let frame = Rectangle::new([(0.0, lo), (1.0, hi)], FRAME.stroke_width(s.w(1.0)));
        bar.draw_series([frame])?;
        // the grey of cells without a value (levels a query does not read), under the bar
        if data.iter().any(|v| !v.is_finite()) {
            let (xr, yr) = bar.plotting_area().get_pixel_range();
            let y = yr.end + s.px(22.0);
            let r = [(xr.start, y - s.px(8.0)), (xr.end, y + s.px(8.0))];
            root.draw(&Rectangle::new(r, NAN_GREY.filled()))?;
            root.draw(&Rectangle::new(r, FRAME.stroke_width(s.w(1.0))))?;
            let style = s.font(17.0).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new("no value", (xr.end + s.px(10.0), y), style))?;
        }
        Ok(())
    })
}

/// An axis over `n` cells with ticks at their centres, labelled with their index, at a round
/// spacing.
fn index_axis(n: usize) -> Axis {
    let raw = n as f64 / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = match n {
        0..=16 => 1,
        _ if n.is_power_of_two() => n / 8,
        _ => {
            let m = [1.0, 2.0, 2.5, 5.0].into_iter().find(|m| m * mag >= raw);
            (m.unwrap_or(10.0) * mag) as usize
        }
    };
    let ticks = (0..n).step_by(step.max(1));
    let ticks = ticks.map(|i| (i as f64 + 0.5, i.to_string())).collect();
    Axis::new((0.0, n.max(1) as f64), false, ticks)
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
