//! Plots (PNG and SVG) of curves, sweeps and λ.
//!
//! Every function takes plain data, writes `<dir>/<stem>.png` and `<dir>/<stem>.svg` (creating
//! `dir` if needed) and returns both paths, PNG first. Figures carry a title, axis labels, a legend
//! when there is more than one thing to tell apart, and heat-maps a colour bar with its scale.
//!
//! Text is rendered with a bundled copy of DejaVu Sans (`assets/DejaVuSans.ttf`), so nothing is
//! needed from the system (no fonts, fontconfig or freetype). In the SVG, text stays text.
//!
//! Data are forgiving: NaN and infinite values are skipped (non-positive ones too on a log axis),
//! empty inputs give an empty, labelled chart with a "no data" note, and constant data get a
//! sensible range.

mod axis;
mod bar;
mod canvas;
mod heatmap;
mod histogram;
mod line;

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::Result;

/// One curve of a line plot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// (x, y) points, drawn in the given order.
    pub points: Vec<(f64, f64)>,
    /// Optional ± error per point (e.g. std over seeds), same length as `points`.
    pub err: Option<Vec<f64>>,
}

impl Series {
    /// A series without error bars.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            err: None,
        }
    }

    /// A series with a ± error per point.
    pub fn with_err(name: impl Into<String>, points: Vec<(f64, f64)>, err: Vec<f64>) -> Self {
        Series {
            name: name.into(),
            points,
            err: Some(err),
        }
    }
}

/// A marked region of the x axis of a heat-map (in column indices), e.g. "key-value pairs".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shade {
    pub label: String,
    /// Columns covered (`start..end`, end exclusive).
    pub range: Range<usize>,
    pub color: (u8, u8, u8),
}

/// One group of a [`bar_chart`]: name (legend entry), one value per category, optional ± error
/// per category.
pub type BarGroup = (String, Vec<f64>, Option<Vec<f64>>);

/// Options of [`line_plot`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineOpts {
    /// Log-scale x axis (non-positive x are skipped).
    pub log_x: bool,
    /// Log-scale y axis (non-positive y are skipped).
    pub log_y: bool,
    /// Fixed y range (lo, hi); data outside it are clipped. `None`: fit the data.
    pub y_range: Option<(f64, f64)>,
}

/// Line plot: training curves, or a metric against a swept variable with ± std error bars.
///
/// Short series (≤ 60 points) get dot markers and capped error bars; longer ones a translucent
/// ± band. When all x are powers of two on a log x axis, ticks are placed at powers of two.
pub fn line_plot(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    opts: &LineOpts,
) -> Result<Vec<PathBuf>> {
    let fig = line::LineFig::new(title, x_label, y_label, series, opts);
    canvas::render(dir, stem, &fig)
}

/// Heat-map of a `rows`×`cols` matrix given row-major (`data[r * cols + c]`), row 0 at the bottom,
/// with the viridis colour map and a colour bar labelled with its scale (including the exact
/// minimum and maximum). `shades` mark column ranges with a coloured band above the map, labelled
/// in place or in a legend, so the data themselves stay unobscured. NaN cells are grey.
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
    anyhow::ensure!(
        rows.checked_mul(cols) == Some(data.len()),
        "heat-map {stem:?}: {} values do not form a {rows}×{cols} matrix",
        data.len()
    );
    let fig = heatmap::HeatFig::new(
        title,
        x_label,
        y_label,
        colorbar_label,
        data,
        rows,
        cols,
        shades,
    );
    canvas::render(dir, stem, &fig)
}

/// Overlaid histograms on common bins, density-normalised (each integrates to 1), with a legend.
pub fn histogram(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    series: &[(String, Vec<f64>)],
    bins: usize,
) -> Result<Vec<PathBuf>> {
    let fig = histogram::HistFig::new(title, x_label, series, bins);
    canvas::render(dir, stem, &fig)
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
    let fig = bar::BarFig::new(title, x_label, y_label, categories, groups);
    canvas::render(dir, stem, &fig)
}
