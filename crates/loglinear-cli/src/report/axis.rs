//! Axes: ranges (linear or log), tick placement and labels, the plot frame with title and axis
//! labels, legends, and clipping of data to the plot rectangle.

use anyhow::Result;
use plotters::prelude::*;
use plotters::style::RGBAColor;

use super::canvas::{
    CENTER_CENTER, CENTER_TOP, Canvas, FRAME, GRID, GRID_MINOR, INK, LEFT_CENTER, Pt, RIGHT_CENTER,
    SOFT_INK, text_width,
};

pub(crate) const TITLE_SIZE: f64 = 27.0;
pub(crate) const LABEL_SIZE: f64 = 21.0;
pub(crate) const TICK_SIZE: f64 = 17.0;
pub(crate) const LEGEND_SIZE: f64 = 17.0;
const TICK_LEN: f64 = 6.0;

// ---------------------------------------------------------------------------------------------
// Number formatting

/// Smallest number of decimals (≤ 10) that represents `step` exactly enough.
fn decimals_for(step: f64) -> usize {
    for d in 0..=10 {
        let s = step * 10f64.powi(d as i32);
        if (s - s.round()).abs() <= 1e-6 * s.abs().max(1e-12) {
            return d;
        }
    }
    10
}

fn use_sci(v: f64) -> bool {
    let a = v.abs();
    a != 0.0 && !(1e-3..1e5).contains(&a)
}

/// "2.5e-4" style: mantissa with trailing zeros trimmed.
fn sci(v: f64, sig: usize) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let s = format!("{:.*e}", sig.saturating_sub(1), v);
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let m = trim_zeros(m);
    format!("{m}e{e}")
}

fn trim_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

fn neg_zero_fix(s: String) -> String {
    if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') {
        s[1..].to_string()
    } else {
        s
    }
}

/// A value with up to `sig` significant digits, trailing zeros removed (used for single values
/// such as colour-bar extremes and log-axis ticks).
pub(crate) fn fmt_sig(v: f64, sig: usize) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    if v == 0.0 {
        return "0".into();
    }
    if use_sci(v) {
        return sci(v, sig);
    }
    let mag = v.abs().log10().floor() as i32;
    let dec = (sig as i32 - 1 - mag).clamp(0, 12) as usize;
    neg_zero_fix(trim_zeros(&format!("{v:.dec$}")))
}

/// Tick label for a value on a linear grid of spacing `step` (same number of decimals for all).
pub(crate) fn fmt_step(v: f64, step: f64, span_max: f64) -> String {
    if use_sci(span_max) {
        if v == 0.0 {
            return "0".into();
        }
        // mantissa precision from the step relative to the value's magnitude
        let exp = v.abs().log10().floor();
        let rel = step / 10f64.powf(exp);
        let sig = 1 + decimals_for(rel).min(4);
        return sci(v, sig);
    }
    let d = decimals_for(step);
    neg_zero_fix(format!("{v:.d$}"))
}

// ---------------------------------------------------------------------------------------------
// Axis

/// One axis: a range, linear or log10, with automatic "nice" ticks or fixed labelled ticks.
#[derive(Clone, Debug)]
pub(crate) struct Axis {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    /// Fixed ticks (position, label), thinned to fit when there are too many.
    pub fixed: Option<Vec<(f64, String)>>,
}

impl Axis {
    pub fn new(lo: f64, hi: f64, log: bool) -> Self {
        let (lo, hi) = sane_range(lo, hi, log);
        Axis {
            lo,
            hi,
            log,
            fixed: None,
        }
    }

    pub fn with_ticks(mut self, ticks: Vec<(f64, String)>) -> Self {
        self.fixed = Some(ticks);
        self
    }

    fn tf(&self, v: f64) -> f64 {
        if self.log { v.log10() } else { v }
    }

    fn itf(&self, t: f64) -> f64 {
        if self.log { 10f64.powf(t) } else { t }
    }

    /// Position of `v` in [0, 1] along the axis (outside for values out of range, NaN for invalid).
    pub fn norm(&self, v: f64) -> f64 {
        let (a, b) = (self.tf(self.lo), self.tf(self.hi));
        (self.tf(v) - a) / (b - a)
    }

    pub fn denorm(&self, t: f64) -> f64 {
        let (a, b) = (self.tf(self.lo), self.tf(self.hi));
        self.itf(a + t * (b - a))
    }

    pub fn contains(&self, v: f64) -> bool {
        let t = self.norm(v);
        (-1e-9..=1.0 + 1e-9).contains(&t)
    }

    /// Major ticks (at most about `n`) with their labels.
    pub fn ticks(&self, n: usize) -> Vec<(f64, String)> {
        let n = n.max(2);
        if let Some(fixed) = &self.fixed {
            let inside: Vec<_> = fixed
                .iter()
                .filter(|(v, _)| self.contains(*v))
                .cloned()
                .collect();
            let stride = inside.len().div_ceil(n).max(1);
            return inside.into_iter().step_by(stride).collect();
        }
        if self.log {
            self.log_ticks(n)
        } else {
            linear_ticks(self.lo, self.hi, n)
        }
    }

    fn log_ticks(&self, n: usize) -> Vec<(f64, String)> {
        let (a, b) = (self.lo.log10(), self.hi.log10());
        let label = |v: f64| (v, fmt_sig(v, 3));
        let mut decades = vec![];
        let mut k = (a - 1e-9).floor() as i32;
        while (k as f64) <= b + 1e-9 {
            decades.push(k);
            k += 1;
        }
        let in_range = |v: f64| v >= self.lo * (1.0 - 1e-9) && v <= self.hi * (1.0 + 1e-9);
        let mults = |ms: &[f64]| -> Vec<f64> {
            decades
                .iter()
                .flat_map(|&k| ms.iter().map(move |m| m * 10f64.powi(k)))
                .filter(|&v| in_range(v))
                .collect()
        };
        let powers = mults(&[1.0]);
        let span = b - a;
        if span <= 2.6 {
            let t125 = mults(&[1.0, 2.0, 5.0]);
            if t125.len() >= 3 && t125.len() <= n {
                return t125.into_iter().map(label).collect();
            }
            if powers.len() < 2 {
                let t = mults(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
                if t.len() >= 3 && t.len() <= n {
                    return t.into_iter().map(label).collect();
                }
                // within less than a decade: plain linear ticks
                return linear_ticks(self.lo, self.hi, n.min(6));
            }
        }
        let stride = powers.len().div_ceil(n).max(1);
        powers.into_iter().step_by(stride).map(label).collect()
    }

    /// Minor tick positions for light grid lines (log axes only: 2..9 × 10^k).
    pub fn minor(&self) -> Vec<f64> {
        if !self.log || self.fixed.is_some() {
            return vec![];
        }
        let (a, b) = (self.lo.log10(), self.hi.log10());
        if b - a > 8.0 {
            return vec![];
        }
        let mut out = vec![];
        let mut k = (a - 1e-9).floor() as i32;
        while (k as f64) <= b {
            for m in 2..=9 {
                let v = m as f64 * 10f64.powi(k);
                if v > self.lo && v < self.hi {
                    out.push(v);
                }
            }
            k += 1;
        }
        out
    }
}

/// Make a usable range: finite, lo < hi, positive for log axes.
fn sane_range(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (lo, hi);
    if log {
        if !(lo.is_finite() && lo > 0.0) {
            lo = if hi.is_finite() && hi > 0.0 {
                hi / 10.0
            } else {
                1.0
            };
        }
        if !(hi.is_finite() && hi > 0.0) {
            hi = lo * 10.0;
        }
    } else {
        if !lo.is_finite() {
            lo = if hi.is_finite() { hi - 1.0 } else { 0.0 };
        }
        if !hi.is_finite() {
            hi = lo + 1.0;
        }
    }
    if lo > hi {
        std::mem::swap(&mut lo, &mut hi);
    }
    if lo == hi || (hi - lo) <= 1e-12 * hi.abs().max(lo.abs()) {
        if log {
            lo /= 2.0;
            hi *= 2.0;
        } else {
            let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
            lo -= d;
            hi += d;
        }
    }
    (lo, hi)
}

/// Data extent `[lo, hi]` padded by `frac` of its span on both sides (in log space for log).
pub(crate) fn padded(lo: f64, hi: f64, frac: f64, log: bool) -> (f64, f64) {
    let (lo, hi) = sane_range(lo, hi, log);
    if log {
        let (a, b) = (lo.log10(), hi.log10());
        let d = (b - a) * frac;
        (10f64.powf(a - d), 10f64.powf(b + d))
    } else {
        let d = (hi - lo) * frac;
        (lo - d, hi + d)
    }
}

/// A "nice" step (1, 2, 2.5, 5 × 10^k) giving at most about `n` intervals over `span`.
pub(crate) fn nice_step(span: f64, n: usize) -> f64 {
    let raw = span / n.max(1) as f64;
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= raw * (1.0 - 1e-9) {
            return m * mag;
        }
    }
    10.0 * mag
}

fn linear_ticks(lo: f64, hi: f64, n: usize) -> Vec<(f64, String)> {
    let step = nice_step(hi - lo, n.saturating_sub(1).max(1));
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    let span_max = lo.abs().max(hi.abs());
    (first..=last)
        .take(1000)
        .map(|i| {
            let v = i as f64 * step;
            (v, fmt_step(v, step, span_max))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Frame: the plot rectangle with its two axes

/// The plot rectangle in logical pixels (`top` < `bottom`) and its axes.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    pub left: f64,
    pub right: f64,
    pub top: f64,
    pub bottom: f64,
    pub xa: Axis,
    pub ya: Axis,
    pub xticks: Vec<(f64, String)>,
    pub yticks: Vec<(f64, String)>,
}

/// What surrounds the plot rectangle.
pub(crate) struct Layout<'a> {
    pub size: (u32, u32),
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Extra room reserved above the plot (below the title) and to its right.
    pub extra_top: f64,
    pub extra_right: f64,
}

impl Frame {
    pub fn new(l: &Layout, xa: Axis, ya: Axis) -> Frame {
        let (w, h) = (l.size.0 as f64, l.size.1 as f64);
        let top =
            22.0 + if l.title.is_empty() {
                0.0
            } else {
                TITLE_SIZE + 20.0
            } + l.extra_top;
        let bottom = h
            - 16.0
            - TICK_LEN
            - 8.0
            - TICK_SIZE
            - if l.x_label.is_empty() {
                0.0
            } else {
                14.0 + LABEL_SIZE
            };
        // y ticks first (they decide the left margin)
        let per_tick = if ya.fixed.is_some() { 1.5 } else { 3.2 };
        let ny = (((bottom - top) / (TICK_SIZE * per_tick)).floor() as usize).clamp(2, 40);
        let yticks = ya.ticks(ny);
        let ytw = yticks
            .iter()
            .map(|(_, s)| text_width(s, TICK_SIZE))
            .fold(0.0, f64::max);
        let left =
            18.0 + if l.y_label.is_empty() {
                0.0
            } else {
                LABEL_SIZE + 14.0
            } + ytw
                + 8.0
                + TICK_LEN;
        // leave room for the last x tick label to overhang
        let right = w - 30.0 - l.extra_right;
        // x ticks: as many as fit without overlapping labels
        let mut nx = xa.fixed.as_ref().map_or(10, |t| t.len().max(10));
        let xticks = loop {
            let t = xa.ticks(nx);
            if nx <= 2 || fits_x(&t, &xa, left, right) {
                break t;
            }
            nx -= 1;
        };
        Frame {
            left,
            right,
            top,
            bottom,
            xa,
            ya,
            xticks,
            yticks,
        }
    }

    pub fn width(&self) -> f64 {
        self.right - self.left
    }

    pub fn height(&self) -> f64 {
        self.bottom - self.top
    }

    pub fn px(&self, x: f64) -> f64 {
        self.left + self.xa.norm(x) * self.width()
    }

    pub fn py(&self, y: f64) -> f64 {
        self.bottom - self.ya.norm(y) * self.height()
    }

    pub fn pt(&self, (x, y): Pt) -> Pt {
        (self.px(x), self.py(y))
    }

    /// Normalised position (both in [0, 1] inside the plot, y up).
    pub fn norm(&self, (x, y): Pt) -> Pt {
        (self.xa.norm(x), self.ya.norm(y))
    }

    /// Data point for a normalised position.
    pub fn denorm(&self, (tx, ty): Pt) -> Pt {
        (self.xa.denorm(tx), self.ya.denorm(ty))
    }

    /// White plot background and grid lines (call before the data).
    pub fn draw_grid<DB: DrawingBackend>(&self, c: &Canvas<DB>, grid: bool) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        if !grid {
            return Ok(());
        }
        let minor: RGBAColor = GRID_MINOR.into();
        let major: RGBAColor = GRID.into();
        for v in self.xa.minor() {
            let x = self.px(v);
            c.line(&[(x, self.top), (x, self.bottom)], minor, 1.0)?;
        }
        for v in self.ya.minor() {
            let y = self.py(v);
            c.line(&[(self.left, y), (self.right, y)], minor, 1.0)?;
        }
        for (v, _) in &self.xticks {
            let x = self.px(*v);
            c.line(&[(x, self.top), (x, self.bottom)], major, 1.0)?;
        }
        for (v, _) in &self.yticks {
            let y = self.py(*v);
            c.line(&[(self.left, y), (self.right, y)], major, 1.0)?;
        }
        Ok(())
    }

    /// Frame, ticks, tick labels, axis labels and title (call after the data).
    pub fn draw_axes<DB: DrawingBackend>(&self, c: &Canvas<DB>, l: &Layout) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let ink: RGBAColor = FRAME.into();
        c.stroke_rect((self.left, self.top), (self.right, self.bottom), ink, 1.2)?;
        for (v, s) in &self.xticks {
            let x = self.px(*v);
            c.line(&[(x, self.bottom), (x, self.bottom + TICK_LEN)], ink, 1.2)?;
            c.text(
                s,
                (x, self.bottom + TICK_LEN + 6.0),
                TICK_SIZE,
                INK,
                CENTER_TOP,
                false,
            )?;
        }
        for (v, s) in &self.yticks {
            let y = self.py(*v);
            c.line(&[(self.left - TICK_LEN, y), (self.left, y)], ink, 1.2)?;
            c.text(
                s,
                (self.left - TICK_LEN - 6.0, y),
                TICK_SIZE,
                INK,
                RIGHT_CENTER,
                false,
            )?;
        }
        let cx = (self.left + self.right) / 2.0;
        if !l.x_label.is_empty() {
            let y = self.bottom + TICK_LEN + 6.0 + TICK_SIZE + 14.0;
            c.text(l.x_label, (cx, y), LABEL_SIZE, INK, CENTER_TOP, false)?;
        }
        if !l.y_label.is_empty() {
            let x = 18.0 + LABEL_SIZE / 2.0;
            let cy = (self.top + self.bottom) / 2.0;
            c.text(l.y_label, (x, cy), LABEL_SIZE, INK, CENTER_CENTER, true)?;
        }
        if !l.title.is_empty() {
            c.text(l.title, (cx, 20.0), TITLE_SIZE, INK, CENTER_TOP, false)?;
        }
        Ok(())
    }

    /// A grey note in the middle of the plot (e.g. "no data").
    pub fn note<DB: DrawingBackend>(&self, c: &Canvas<DB>, s: &str) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let at = (
            (self.left + self.right) / 2.0,
            (self.top + self.bottom) / 2.0,
        );
        c.text(s, at, LABEL_SIZE, SOFT_INK, CENTER_CENTER, false)
    }
}

fn fits_x(ticks: &[(f64, String)], xa: &Axis, left: f64, right: f64) -> bool {
    let px = |v: f64| left + xa.norm(v) * (right - left);
    let mut prev_end = f64::NEG_INFINITY;
    for (v, s) in ticks {
        let w = text_width(s, TICK_SIZE);
        let x = px(*v);
        if x - w / 2.0 < prev_end + 12.0 {
            return false;
        }
        prev_end = x + w / 2.0;
    }
    true
}

// ---------------------------------------------------------------------------------------------
// Legend

/// How a legend entry is drawn.
#[derive(Clone, Copy)]
pub(crate) enum Mark {
    /// A line, optionally with a dot marker.
    Line { color: RGBColor, marker: bool },
    /// A filled swatch with an outline (histograms, bars, shaded regions).
    Patch { color: RGBColor, alpha: f64 },
}

const SWATCH_W: f64 = 30.0;
const ROW_H: f64 = LEGEND_SIZE + 9.0;
const PAD: f64 = 10.0;

fn legend_size(entries: &[(String, Mark)]) -> (f64, f64) {
    let tw = entries
        .iter()
        .map(|(s, _)| text_width(s, LEGEND_SIZE))
        .fold(0.0, f64::max);
    (
        PAD * 2.0 + SWATCH_W + 8.0 + tw,
        PAD * 2.0 + ROW_H * entries.len() as f64 - 9.0,
    )
}

/// Draw a legend inside the plot, in the corner where it covers the fewest of `occupied`
/// (normalised plot positions of the data, y up).
pub(crate) fn draw_legend<DB: DrawingBackend>(
    c: &Canvas<DB>,
    f: &Frame,
    entries: &[(String, Mark)],
    occupied: &[Pt],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    if entries.is_empty() {
        return Ok(());
    }
    let (lw, lh) = legend_size(entries);
    let m = 12.0;
    let corners = [
        (f.right - m - lw, f.top + m),              // upper right
        (f.left + m, f.top + m),                    // upper left
        (f.right - m - lw, f.bottom - m - lh),      // lower right
        (f.left + m, f.bottom - m - lh),            // lower left
        ((f.left + f.right - lw) / 2.0, f.top + m), // upper centre
    ];
    let covered = |(x0, y0): Pt| {
        let (x1, y1) = (x0 + lw, y0 + lh);
        occupied
            .iter()
            .filter(|(tx, ty)| {
                let px = f.left + tx * f.width();
                let py = f.bottom - ty * f.height();
                px >= x0 - 6.0 && px <= x1 + 6.0 && py >= y0 - 6.0 && py <= y1 + 6.0
            })
            .count()
    };
    let mut best = corners[0];
    let mut best_n = usize::MAX;
    for &corner in &corners {
        let n = covered(corner);
        if n < best_n {
            best = corner;
            best_n = n;
        }
    }
    let (x0, y0) = best;
    c.fill_rect(
        (x0, y0),
        (x0 + lw, y0 + lh),
        WHITE.mix(if best_n == 0 { 1.0 } else { 0.85 }),
    )?;
    c.stroke_rect(
        (x0, y0),
        (x0 + lw, y0 + lh),
        RGBColor(190, 190, 190).into(),
        1.0,
    )?;
    for (i, (label, mark)) in entries.iter().enumerate() {
        let cy = y0 + PAD + LEGEND_SIZE / 2.0 + i as f64 * ROW_H;
        let sx = x0 + PAD;
        draw_mark(
            c,
            *mark,
            (sx, cy - LEGEND_SIZE / 2.0 + 1.0),
            (sx + SWATCH_W, cy + LEGEND_SIZE / 2.0 - 1.0),
        )?;
        c.text(
            label,
            (sx + SWATCH_W + 8.0, cy),
            LEGEND_SIZE,
            INK,
            LEFT_CENTER,
            false,
        )?;
    }
    Ok(())
}

/// Draw a legend mark into the box `a`–`b`.
pub(crate) fn draw_mark<DB: DrawingBackend>(c: &Canvas<DB>, mark: Mark, a: Pt, b: Pt) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let cy = (a.1 + b.1) / 2.0;
    match mark {
        Mark::Line { color, marker } => {
            c.line(&[(a.0, cy), (b.0, cy)], color.into(), 2.5)?;
            if marker {
                c.dot(((a.0 + b.0) / 2.0, cy), 4.0, color.into())?;
            }
        }
        Mark::Patch { color, alpha } => {
            c.fill_rect(a, b, color.mix(alpha))?;
            c.stroke_rect(a, b, color.into(), 1.5)?;
        }
    }
    Ok(())
}

/// Legend entries laid out in one horizontal row centred at `center` (used above heat-maps).
pub(crate) fn draw_legend_row<DB: DrawingBackend>(
    c: &Canvas<DB>,
    entries: &[(String, Mark)],
    center: Pt,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let gap = 24.0;
    let widths: Vec<f64> = entries
        .iter()
        .map(|(s, _)| 22.0 + 7.0 + text_width(s, LEGEND_SIZE))
        .collect();
    let total = widths.iter().sum::<f64>() + gap * (entries.len().saturating_sub(1)) as f64;
    let mut x = center.0 - total / 2.0;
    for ((s, mark), w) in entries.iter().zip(&widths) {
        let h = LEGEND_SIZE - 3.0;
        draw_mark(
            c,
            *mark,
            (x, center.1 - h / 2.0),
            (x + 22.0, center.1 + h / 2.0),
        )?;
        c.text(
            s,
            (x + 29.0, center.1),
            LEGEND_SIZE,
            INK,
            LEFT_CENTER,
            false,
        )?;
        x += w + gap;
    }
    Ok(())
}

pub(crate) fn legend_row_width(entries: &[(String, Mark)]) -> f64 {
    entries
        .iter()
        .map(|(s, _)| 22.0 + 7.0 + text_width(s, LEGEND_SIZE))
        .sum::<f64>()
        + 24.0 * (entries.len().saturating_sub(1)) as f64
}

// ---------------------------------------------------------------------------------------------
// Clipping (in normalised plot coordinates, the unit square)

/// Clip a polyline to the unit square; returns the visible pieces.
pub(crate) fn clip_polyline(pts: &[Pt]) -> Vec<Vec<Pt>> {
    let mut out: Vec<Vec<Pt>> = vec![];
    let mut cur: Vec<Pt> = vec![];
    for w in pts.windows(2) {
        match clip_segment(w[0], w[1]) {
            Some((a, b)) => {
                let joined = cur
                    .last()
                    .is_some_and(|l| (l.0 - a.0).abs() < 1e-12 && (l.1 - a.1).abs() < 1e-12);
                if !joined {
                    if cur.len() >= 2 {
                        out.push(std::mem::take(&mut cur));
                    }
                    cur.clear();
                    cur.push(a);
                }
                cur.push(b);
            }
            None => {
                if cur.len() >= 2 {
                    out.push(std::mem::take(&mut cur));
                }
                cur.clear();
            }
        }
    }
    if cur.len() >= 2 {
        out.push(cur);
    }
    out
}

/// Liang–Barsky clipping of one segment to the unit square.
fn clip_segment(a: Pt, b: Pt) -> Option<(Pt, Pt)> {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let mut t0 = 0.0f64;
    let mut t1 = 1.0f64;
    for (p, q) in [(-dx, a.0), (dx, 1.0 - a.0), (-dy, a.1), (dy, 1.0 - a.1)] {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
        } else {
            let r = q / p;
            if p < 0.0 {
                t0 = t0.max(r);
            } else {
                t1 = t1.min(r);
            }
        }
    }
    if t0 > t1 {
        return None;
    }
    Some((
        (a.0 + t0 * dx, a.1 + t0 * dy),
        (a.0 + t1 * dx, a.1 + t1 * dy),
    ))
}

/// Sutherland–Hodgman clipping of a polygon to the unit square.
pub(crate) fn clip_polygon(poly: &[Pt]) -> Vec<Pt> {
    type Edge = fn(Pt) -> f64; // signed distance, ≥ 0 inside
    let edges: [Edge; 4] = [|p| p.0, |p| 1.0 - p.0, |p| p.1, |p| 1.0 - p.1];
    let mut cur: Vec<Pt> = poly.to_vec();
    for d in edges {
        if cur.is_empty() {
            break;
        }
        let mut next = Vec::with_capacity(cur.len() + 4);
        for i in 0..cur.len() {
            let p = cur[i];
            let q = cur[(i + 1) % cur.len()];
            let (dp, dq) = (d(p), d(q));
            if dp >= 0.0 {
                next.push(p);
            }
            if (dp >= 0.0) != (dq >= 0.0) {
                let t = dp / (dp - dq);
                next.push((p.0 + t * (q.0 - p.0), p.1 + t * (q.1 - p.1)));
            }
        }
        cur = next;
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_sig(0.123456, 4), "0.1235");
        assert_eq!(fmt_sig(-2.5, 4), "-2.5");
        assert_eq!(fmt_sig(7.25, 4), "7.25");
        assert_eq!(fmt_sig(1.0, 4), "1");
        assert_eq!(fmt_sig(2.5e-5, 3), "2.5e-5");
        assert_eq!(fmt_step(0.5, 0.25, 1.0), "0.50");
        assert_eq!(fmt_step(-0.0, 0.5, 1.0), "0.0");
        assert_eq!(nice_step(1.0, 5), 0.2);
    }

    #[test]
    fn log_ticks() {
        let a = Axis::new(1.0, 1e4, true);
        let t: Vec<String> = a.ticks(8).into_iter().map(|t| t.1).collect();
        assert_eq!(t, ["1", "10", "100", "1000", "10000"]);
        let a = Axis::new(20.0, 80.0, true);
        assert!(a.ticks(8).len() >= 2);
    }

    #[test]
    fn clipping() {
        let pieces = clip_polyline(&[(-1.0, 0.5), (0.5, 0.5), (0.5, 2.0)]);
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0], vec![(0.0, 0.5), (0.5, 0.5), (0.5, 1.0)]);
        let poly = clip_polygon(&[(-1.0, -1.0), (2.0, -1.0), (2.0, 2.0), (-1.0, 2.0)]);
        assert_eq!(poly.len(), 4);
    }
}
