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

pub use bars::{bar_chart, histogram, spread_chart};
pub use heatmap::heatmap;
pub use line::line_plot;

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
        let (name, err) = (name.into(), None);
        Series { name, points, err }
    }

    /// A series with a ± error per point.
    pub fn with_err(name: impl Into<String>, points: Vec<(f64, f64)>, err: Vec<f64>) -> Self {
        let (name, err) = (name.into(), Some(err));
        Series { name, points, err }
    }
}

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

/// One group of a [`spread_chart`]: name (legend entry) and the spread per category (`None`
/// where there is nothing to show).
pub type SpreadGroup = (String, Vec<Option<Spread>>);

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
