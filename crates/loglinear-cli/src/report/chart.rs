//! What the figures share: the bundled font, colours, the house style (axes, ticks, legend),
//! and the writer of the PNG and the SVG.

use std::fs;
use std::io::BufWriter;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail, ensure};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// DejaVu Sans (Bitstream Vera licence, see `assets/DejaVuSans-LICENSE.txt`).
static FONT_BYTES: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Family name of all text, registered with plotters under this exact string; in the SVG it is
/// the `font-family` attribute, i.e. a CSS fallback list.
const FAMILY: &str = "DejaVu Sans, Verdana, sans-serif";

const INK: RGBColor = RGBColor(34, 34, 34);
pub(super) const FRAME: RGBColor = RGBColor(70, 70, 70);
pub(super) const NAN_GREY: RGBColor = RGBColor(205, 205, 205);

/// matplotlib's "tab10" qualitative palette.
pub(super) fn palette(i: usize) -> RGBColor {
    const TAB10: [u32; 10] = [
        0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22,
        0x17becf,
    ];
    let c = TAB10[i % TAB10.len()];
    RGBColor((c >> 16) as u8, (c >> 8) as u8, c as u8)
}

/// matplotlib's "tab20" (tab10's colours, each followed by a lighter shade): for eleven to twenty
/// things to tell apart, where tab10 would repeat its colours.
pub(super) fn palette20(i: usize) -> RGBColor {
    const TAB20: [u32; 20] = [
        0x1f77b4, 0xaec7e8, 0xff7f0e, 0xffbb78, 0x2ca02c, 0x98df8a, 0xd62728, 0xff9896, 0x9467bd,
        0xc5b0d5, 0x8c564b, 0xc49c94, 0xe377c2, 0xf7b6d2, 0x7f7f7f, 0xc7c7c7, 0xbcbd22, 0xdbdb8d,
        0x17becf, 0x9edae5,
    ];
    let c = TAB20[i % TAB20.len()];
    RGBColor((c >> 16) as u8, (c >> 8) as u8, c as u8)
}

/// Figures are laid out in logical pixels; `k` device pixels make one (2 in the supersampled
/// PNG, 1 in the SVG).
#[derive(Clone, Copy)]
pub(super) struct Scale {
    pub k: f64,
    pub svg: bool,
}

impl Scale {
    /// A length in device pixels.
    pub fn px(self, v: f64) -> i32 {
        (v * self.k).round() as i32
    }
    /// A width in device pixels, at least one.
    pub fn w(self, v: f64) -> u32 {
        (v * self.k).round().max(1.0) as u32
    }
    pub fn font(self, size: f64) -> TextStyle<'static> {
        (FAMILY, size * self.k).into_font().color(&INK)
    }
}

pub(super) type Area<DB> = DrawingArea<DB, Shift>;
pub(super) type Builder<'a, DB> = ChartBuilder<'a, 'static, DB>;
pub(super) type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Axis, Axis>>;

/// A plotters backend whose errors can travel in an `anyhow::Error`.
pub(super) trait Backend: DrawingBackend<ErrorType: 'static> {}
impl<DB: DrawingBackend<ErrorType: 'static>> Backend for DB {}

/// An axis: plotters' linear or log coordinate, with the ticks (value and label) where we put
/// them: round numbers, powers of two, categories, cell centres, the exact extremes of a scale.
pub(super) struct Axis {
    linear: RangedCoordf64,
    /// plotters' log coordinate over the same range, when the axis is logarithmic.
    log: Option<LogCoord<f64>>,
    ticks: Vec<(f64, String)>,
}

impl Axis {
    pub fn new((lo, hi): (f64, f64), log: bool, ticks: Vec<(f64, String)>) -> Self {
        let (linear, log) = ((lo..hi).into(), log.then(|| (lo..hi).log_scale().into()));
        Axis { linear, log, ticks }
    }
    /// Ticks at `values`, labelled by [`fmt_num`].
    pub fn numbers(range: (f64, f64), log: bool, values: &[f64]) -> Self {
        let ticks = values.iter().map(|&v| (v, fmt_num(v)));
        Self::new(range, log, ticks.collect())
    }
    /// Ticks at about `n` round values on a linear axis; on a log axis at powers of ten, with
    /// 2 and 5 (or every digit) between them when that is what it takes to have a few.
    pub fn auto(range: (f64, f64), log: bool, n: usize) -> Self {
        match log {
            true => Self::numbers(range, log, &log_ticks(range)),
            false => Self::numbers(range, log, &round_ticks(range, n)),
        }
    }
}

/// About `n` round values over `(lo, hi)`, as plotters picks them.
pub(super) fn round_ticks((lo, hi): (f64, f64), n: usize) -> Vec<f64> {
    RangedCoordf64::from(lo..hi).key_points(n)
}

/// Ticks of a log axis (see [`Axis::auto`]): round linear ones within a factor of two.
fn log_ticks((lo, hi): (f64, f64)) -> Vec<f64> {
    let decades = lo.log10().floor() as i32..=hi.log10().ceil() as i32;
    let every: Vec<f64> = (1..10).map(f64::from).collect();
    let ticks = [&[1.0][..], &[1.0, 2.0, 5.0], &every].map(|digits| {
        let decade = |k: i32| digits.iter().map(move |d| d * 10f64.powi(k));
        let all = decades.clone().flat_map(decade);
        all.filter(|v| (lo..=hi).contains(v)).collect::<Vec<_>>()
    });
    match ticks.iter().find(|t| t.len() >= 4) {
        Some(t) => t.clone(),
        None if ticks[2].len() >= 2 => ticks[2].clone(),
        None => round_ticks((lo, hi), 5),
    }
}

impl Ranged for Axis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;
    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let log = self.log.as_ref();
        log.map_or_else(|| self.linear.map(v, limit), |log| log.map(v, limit))
    }
    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // the ticks are the bold points (labels, grid); no light lines between them
        let bold = !hint.weight().allow_light_points();
        self.ticks.iter().filter(|_| bold).map(|t| t.0).collect()
    }
    fn range(&self) -> Range<f64> {
        self.linear.range()
    }
}

impl ValueFormatter<f64> for Axis {
    fn format_ext(&self, v: &f64) -> String {
        let tick = self.ticks.iter().find(|t| t.0 == *v);
        tick.map(|t| t.1.clone()).unwrap_or_default()
    }
}

/// A chart builder on `area` with the house margins, label areas and title.
pub(super) fn house<'a, DB: Backend>(area: &'a Area<DB>, s: Scale, title: &str) -> Builder<'a, DB> {
    let mut b = ChartBuilder::on(area);
    b.margin(s.px(16.0)).margin_right(s.px(30.0));
    b.x_label_area_size(s.px(62.0))
        .y_label_area_size(s.px(96.0));
    if !title.is_empty() {
        b.caption(title, s.font(27.0));
    }
    b
}

/// The chart `b` builds, with axes, tick marks and labels, the axis descriptions, and grid
/// lines at the ticks of x and y where `grid` says so.
pub(super) fn chart<'a, DB: Backend>(
    mut b: Builder<'a, DB>,
    s: Scale,
    (x_desc, y_desc): (&str, &str),
    (x, y): (Axis, Axis),
    grid: (bool, bool),
) -> Result<Chart<'a, DB>> {
    let mut c = b.build_cartesian_2d(x, y)?;
    let mut m = c.configure_mesh();
    m.x_desc(x_desc)
        .y_desc(y_desc)
        .axis_desc_style(s.font(21.0));
    m.label_style(s.font(17.0))
        .set_all_tick_mark_size(s.px(6.0));
    m.bold_line_style(RGBColor(222, 222, 222).stroke_width(s.w(1.0)));
    m.axis_style(FRAME.stroke_width(s.w(1.2)));
    if !grid.0 {
        m.disable_x_mesh();
    }
    if !grid.1 {
        m.disable_y_mesh();
    }
    m.draw()?;
    Ok(c)
}

/// The legend of the series labelled so far, in the corner of the plot that the `paths` (in
/// data coordinates; the curves, outlines and bars drawn) cross least.
pub(super) fn legend<'a, DB: Backend + 'a>(
    c: &mut Chart<'a, DB>,
    s: Scale,
    entries: usize,
    paths: &[Vec<(f64, f64)>],
) -> Result<()> {
    use SeriesLabelPosition::*;
    let (xr, yr) = c.plotting_area().get_pixel_range();
    let (w, h) = (xr.len() as f64, yr.len() as f64);
    // a point as fractions of the plot's width and height from its lower left corner
    let frac = |p: &(f64, f64)| {
        let (x, y) = c.backend_coord(p);
        ((x - xr.start) as f64 / w, (yr.end - y) as f64 / h)
    };
    // the paths as points every 1 % of the plot
    let mut points = vec![];
    for path in paths.iter().map(|p| p.iter().map(frac).collect::<Vec<_>>()) {
        points.extend(path.last());
        for ab in path.windows(2) {
            let ((x0, y0), (x1, y1)) = (ab[0], ab[1]);
            let n = ((x1 - x0).hypot(y1 - y0) * 100.0).ceil().min(200.0);
            let at = |t: f64| (x0 + t * (x1 - x0), y0 + t * (y1 - y0));
            points.extend((0..n as usize).map(|i| at(i as f64 / n)));
        }
    }
    // the legend's rough extent as a fraction of the plot, and the points it would cover
    let (fw, fh) = (0.42, ((entries as f64 * 26.0 + 16.0) * s.k / h).min(0.9));
    let covered = |(right, top): (f64, f64)| {
        let near = |(x, y): &&(f64, f64)| (x - right).abs() <= fw && (y - top).abs() <= fh;
        points.iter().filter(near).count()
    };
    let positions = [UpperRight, UpperLeft, LowerRight, LowerLeft];
    let corners = [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (0.0, 0.0)];
    let best = positions
        .into_iter()
        .zip(corners)
        .min_by_key(|p| covered(p.1));
    c.configure_series_labels()
        .position(best.map_or(UpperRight, |p| p.0))
        .margin(s.px(12.0))
        .legend_area_size(s.px(30.0))
        .label_font(s.font(17.0))
        .background_style(WHITE.mix(0.9))
        .border_style(FRAME.stroke_width(s.w(1.0)))
        .draw()?;
    Ok(())
}

/// A legend marker at `at` (the entry's anchor in device pixels): a line with an optional dot
/// (`fill` transparent), or a filled patch (`color` transparent). One element type for both,
/// since a `DynElement` here would need a `'static` backend.
pub(super) fn mark<'a, DB: DrawingBackend + 'a>(
    s: Scale,
    color: RGBAColor,
    dot: bool,
    fill: ShapeStyle,
    at: (i32, i32),
) -> impl IntoDynElement<'a, DB, (i32, i32)> {
    let line = PathElement::new(vec![(0, 0), (s.px(24.0), 0)], color.stroke_width(s.w(2.4)));
    let radius = if dot { s.w(4.0) } else { 0 };
    let dot = Circle::new((s.px(12.0), 0), radius, color.filled());
    let patch = Rectangle::new([(0, -s.px(7.0)), (s.px(24.0), s.px(7.0))], fill);
    EmptyElement::at(at) + patch + line + dot
}

/// A note centred in the plot (e.g. "no data").
pub(super) fn note<DB: Backend>(c: &Chart<'_, DB>, s: Scale, text: &str) -> Result<()> {
    let plot = c.plotting_area().strip_coord_spec();
    let (w, h) = plot.dim_in_pixel();
    let style = s.font(22.0).pos(Pos::new(HPos::Center, VPos::Center));
    plot.draw(&Text::new(text, (w as i32 / 2, h as i32 / 2), style))?;
    Ok(())
}

/// A value with up to 4 significant digits, trailing zeros trimmed; scientific outside
/// [1e-3, 1e5).
pub(super) fn fmt_num(v: f64) -> String {
    let trim = |s: &str| match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => s.to_string(),
    };
    if v == 0.0 || !v.is_finite() {
        return if v == 0.0 { "0".into() } else { v.to_string() };
    }
    if !(1e-3..1e5).contains(&v.abs()) {
        let s = format!("{v:.3e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        return format!("{}e{e}", trim(m));
    }
    let dec = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let s = trim(&format!("{v:.dec$}"));
    if s == "-0" { "0".into() } else { s }
}

/// Finite min and max of `vals` (NaN, NaN when there are none).
pub(super) fn min_max(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let extend = |(a, b): (f64, f64), v: f64| (a.min(v), b.max(v));
    let (none, nan) = ((f64::INFINITY, -f64::INFINITY), (f64::NAN, f64::NAN));
    let (lo, hi) = vals.filter(|v| v.is_finite()).fold(none, extend);
    if lo <= hi { (lo, hi) } else { nan }
}

/// A usable axis range from the data extent `(lo, hi)`: finite, lo < hi (constant data widened
/// around the value), positive on log axes, padded by `frac` of the span on both sides (in log
/// space for log axes).
pub(super) fn padded((lo, hi): (f64, f64), frac: f64, log: bool) -> (f64, f64) {
    let ok = |v: f64| v.is_finite() && (!log || v > 0.0);
    let (lo, hi) = match (ok(lo), ok(hi)) {
        (true, true) => (lo.min(hi), lo.max(hi)),
        (true, false) | (false, true) => (lo.max(hi), lo.max(hi)),
        (false, false) if log => (1.0, 10.0),
        (false, false) => (0.0, 1.0),
    };
    let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
    let (lo, hi) = match hi - lo > 1e-12 * hi.abs().max(lo.abs()) {
        true => (lo, hi),
        false if log => (lo / 2.0, hi * 2.0),
        false => (lo - d, hi + d),
    };
    if log {
        let f = 10f64.powf((hi / lo).log10() * frac);
        (lo / f, hi * f)
    } else {
        (lo - (hi - lo) * frac, hi + (hi - lo) * frac)
    }
}

/// Draws a figure into `dir/stem.png` and `dir/stem.svg` and returns both paths (PNG first):
/// `figure!(dir, stem, (width, height), |root, s| { … Ok(()) })`, where `root` is the drawing
/// area and `s` its [`Scale`]. The body is written once and compiled for each backend, since a
/// closure cannot be generic over plotters' backends.
macro_rules! figure {
    ($dir:expr, $stem:expr, $size:expr, |$root:ident, $s:ident| $body:block) => {
        $crate::report::chart::render(
            $dir,
            $stem,
            $size,
            |$root: &$crate::report::chart::Area<plotters::prelude::BitMapBackend<'_>>,
             $s|
             -> anyhow::Result<()> { $body },
            |$root: &$crate::report::chart::Area<plotters::prelude::SVGBackend<'_>>,
             $s|
             -> anyhow::Result<()> { $body },
        )
    };
}
pub(super) use figure;

/// What [`figure!`] expands to: the figure drawn by `png` and by `svg` (the same code on each
/// backend), written out.
pub(super) fn render(
    dir: &Path,
    stem: &str,
    (w, h): (u32, u32),
    png: impl FnOnce(&Area<BitMapBackend<'_>>, Scale) -> Result<()>,
    svg: impl FnOnce(&Area<SVGBackend<'_>>, Scale) -> Result<()>,
) -> Result<Vec<PathBuf>> {
    if stem.is_empty() || stem.contains(['/', '\\']) || stem == "." || stem == ".." {
        bail!("invalid plot file stem {stem:?}: must be a plain file name without extension");
    }
    ensure_font()?;
    fs::create_dir_all(dir)
        .with_context(|| format!("creating plot directory {}", dir.display()))?;
    let paths = ["png", "svg"].map(|ext| dir.join(format!("{stem}.{ext}")));
    let drawing = |i: usize| format!("drawing {}", paths[i].display());
    let writing = |i: usize| format!("writing {}", paths[i].display());

    // The PNG is drawn at twice its size and box-filtered down: plotters' bitmap backend does
    // not anti-alias lines.
    let (wu, mut big) = (w as usize, vec![255u8; (w * h * 12) as usize]);
    let root = BitMapBackend::with_buffer(&mut big, (w * 2, h * 2)).into_drawing_area();
    png(&root, Scale { k: 2.0, svg: false }).with_context(|| drawing(0))?;
    root.present().with_context(|| drawing(0))?;
    drop(root);
    // channel `i % 3` of pixel `i / 3`, at the `d`th of its four subpixels
    let at = |i: usize, d: usize| {
        let (x, y) = (i / 3 % wu * 2 + d % 2, i / 3 / wu * 2 + d / 2);
        big[(y * 2 * wu + x) * 3 + i % 3] as u32
    };
    let small: Vec<u8> = (0..wu * h as usize * 3)
        .map(|i| (((0..4).map(|d| at(i, d)).sum::<u32>() + 2) / 4) as u8)
        .collect();
    let write_png = || -> Result<()> {
        let file = BufWriter::new(fs::File::create(&paths[0])?);
        let mut enc = png::Encoder::new(file, w, h);
        enc.set_color(png::ColorType::Rgb);
        let mut writer = enc.write_header()?;
        writer.write_image_data(&small)?;
        Ok(writer.finish()?)
    };
    write_png().with_context(|| writing(0))?;

    let mut text = String::new();
    let root = SVGBackend::with_string(&mut text, (w, h)).into_drawing_area();
    root.fill(&WHITE)?;
    svg(&root, Scale { k: 1.0, svg: true }).with_context(|| drawing(1))?;
    root.present().with_context(|| drawing(1))?;
    drop(root);
    fs::write(&paths[1], text).with_context(|| writing(1))?;
    Ok(paths.into())
}

/// Registers the bundled font for every family plotters may ask for (its defaults use
/// "sans-serif"), so that no system font is needed.
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = REGISTERED.get_or_init(|| {
        let families = [FAMILY, "sans-serif", "serif", "monospace"];
        let styles = families.map(|f| [FontStyle::Normal, FontStyle::Bold].map(|st| (f, st)));
        let register = |&(f, st): &(&str, FontStyle)| {
            plotters::style::register_font(f, st, FONT_BYTES).is_ok()
        };
        styles.iter().flatten().all(register)
    });
    ensure!(*ok, "the bundled plot font could not be loaded");
    Ok(())
}
