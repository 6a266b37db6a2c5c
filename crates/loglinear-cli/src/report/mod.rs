//! Plots (PNG and SVG) of curves, sweeps and λ, drawn with plotters' charts (`ChartBuilder`).
//!
//! Every function takes plain data, writes `<dir>/<stem>.png` and `<dir>/<stem>.svg` (creating
//! `dir` if needed) and returns both paths, PNG first. Figures carry a title, axis labels, a legend
//! when there is more than one thing to tell apart, and heat-maps a colour bar with its scale.
//!
//! Text uses a bundled copy of DejaVu Sans (`assets/DejaVuSans.ttf`) registered with plotters'
//! `ab_glyph` text backend, so nothing is needed from the system (no fonts, fontconfig or
//! freetype). In the SVG, text stays text. The PNG is drawn at twice its size and box-filtered
//! down, because plotters' bitmap backend does not anti-alias lines.
//!
//! Data are forgiving: NaN and infinite values are skipped (non-positive ones too on a log axis),
//! empty inputs give an empty, labelled chart with a "no data" note, and constant data get a
//! sensible range.

mod bars;
mod chart;
mod heatmap;
mod line;

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};

use chart::{Labels, render};

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
        let name = name.into();
        Series {
            name,
            points,
            err: None,
        }
    }

    /// A series with a ± error per point.
    pub fn with_err(name: impl Into<String>, points: Vec<(f64, f64)>, err: Vec<f64>) -> Self {
        let name = name.into();
        Series {
            name,
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

/// Quantiles of a sample (linear interpolation between order statistics, as numpy's default):
/// what [`spread_chart`] draws as a 25–75 % box, 10–90 % whiskers and a dot at the median.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub q10: f64,
    pub q25: f64,
    pub median: f64,
    pub q75: f64,
    pub q90: f64,
    /// Number of finite values the quantiles come from.
    pub n: usize,
}

impl Spread {
    /// Quantiles of the finite values of `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let r = p * (v.len() - 1) as f64;
            let (i, f) = (r.floor() as usize, r - r.floor());
            v[i] + (v[(i + 1).min(v.len() - 1)] - v[i]) * f
        };
        (!v.is_empty()).then(|| Spread {
            q10: q(0.1),
            q25: q(0.25),
            median: q(0.5),
            q75: q(0.75),
            q90: q(0.9),
            n: v.len(),
        })
    }
}

/// A group of bars as drawn: (value, ± error) per category, `None` where missing.
type Bars = (String, Vec<Option<(f64, Option<f64>)>>);

/// One group of a [`spread_chart`]: name (legend entry) and the spread per category (`None`
/// where there is nothing to show).
pub type SpreadGroup = (String, Vec<Option<Spread>>);

/// Options of [`line_plot`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineOpts {
    /// Log-scale x axis (non-positive x are skipped).
    pub log_x: bool,
    /// Log-scale y axis (non-positive y are skipped).
    pub log_y: bool,
    /// Fixed y range (lo, hi); data outside it are pinned to the frame. `None`: fit the data.
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
    let labels = Labels::new(title, x_label, y_label);
    render(dir, stem, &line::LineFig::new(labels, series, opts))
}

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
    let labels = Labels::new(title, x_label, y_label);
    let fig = heatmap::HeatFig::new(labels, colorbar_label, data, (rows, cols), shades);
    render(dir, stem, &fig)
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
    let labels = Labels::new(title, x_label, "density");
    render(dir, stem, &bars::HistFig::new(labels, series, bins))
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
    let labels = Labels::new(title, x_label, y_label);
    let at = |(vals, errs): (&Vec<f64>, &Option<Vec<f64>>), j: usize| {
        let v = vals.get(j).copied().filter(|v| v.is_finite())?;
        let e = errs.as_ref().and_then(|e| e.get(j)).copied();
        Some((v, e.filter(|e| e.is_finite()).map(f64::abs)))
    };
    let groups = (groups.iter())
        .map(|(name, v, e)| {
            (
                name.clone(),
                (0..categories.len()).map(|j| at((v, e), j)).collect(),
            )
        })
        .collect();
    render(dir, stem, &bars::Clusters::bars(labels, categories, groups))
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
    let labels = Labels::new(title, x_label, y_label);
    render(
        dir,
        stem,
        &bars::Clusters::spreads(labels, categories, groups),
    )
}
