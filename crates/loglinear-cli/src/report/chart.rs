//! What the figures share: the bundled font, colours, sizes, a chart with the house style (axes,
//! ticks, legend), and the writer of the PNG and the SVG.

use std::fs;
use std::io::BufWriter;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail, ensure};
use plotters::chart::MeshStyle;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, DefaultFormatting, KeyPointHint, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// DejaVu Sans (Bitstream Vera licence, see `assets/DejaVuSans-LICENSE.txt`).
static FONT_BYTES: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Family name of all text, registered with plotters under this exact string; in the SVG it is
/// the `font-family` attribute, i.e. a CSS fallback list.
const FAMILY: &str = "DejaVu Sans, Verdana, sans-serif";

pub(super) const INK: RGBColor = RGBColor(34, 34, 34);
pub(super) const FRAME: RGBColor = RGBColor(70, 70, 70);
pub(super) const NAN_GREY: RGBColor = RGBColor(205, 205, 205);

/// matplotlib's "tab10" qualitative palette.
pub(super) fn palette(i: usize) -> RGBColor {
    const TAB10: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = TAB10[i % TAB10.len()];
    RGBColor(r, g, b)
}

/// Title and axis labels of a figure.
pub(super) struct Labels {
    pub title: String,
    pub x: String,
    pub y: String,
}

impl Labels {
    pub fn new(title: &str, x: &str, y: &str) -> Self {
        let [title, x, y] = [title, x, y].map(String::from);
        Labels { title, x, y }
    }
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

/// A figure that can draw itself on any plotters backend.
pub(super) trait Figure {
    /// Size in logical pixels (also the PNG's size in pixels).
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, s: Scale) -> Result<()>
    where
        DB::ErrorType: 'static;
}

pub(super) type Chart<'a, DB, X, Y> = ChartContext<'a, DB, Cartesian2d<X, Y>>;

/// A linear axis with its ticks where we put them (categories, cell centres, exact extremes).
/// plotters' `with_key_points` does this too, but on an f64 range it loses the value formatter
/// that drawing the mesh needs.
#[derive(Clone)]
pub(super) struct Ticked(RangedCoordf64, Vec<f64>);

impl Ticked {
    pub fn new(range: Range<f64>, ticks: Vec<f64>) -> Self {
        Ticked(range.into(), ticks)
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;
    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        self.0.map(v, limit)
    }
    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // the ticks are the bold points (labels, grid); no light lines between them
        let light = hint.weight().allow_light_points();
        if light { vec![] } else { self.1.clone() }
    }
    fn range(&self) -> Range<f64> {
        self.0.range()
    }
}

/// A chart with the house style on `area`: title, margins and label areas.
pub(super) fn chart<'a, DB, X, Y>(
    area: &'a DrawingArea<DB, Shift>,
    s: Scale,
    title: &str,
    x: X,
    y: Y,
) -> Result<Chart<'a, DB, X::CoordDescType, Y::CoordDescType>>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: AsRangedCoord,
    Y: AsRangedCoord,
{
    let mut b = ChartBuilder::on(area);
    b.margin(s.px(16.0)).margin_right(s.px(30.0));
    b.x_label_area_size(s.px(62.0))
        .y_label_area_size(s.px(96.0));
    if !title.is_empty() {
        b.caption(title, s.font(27.0));
    }
    Ok(b.build_cartesian_2d(x, y)?)
}

/// Axes, ticks (labels through [`fmt_num`] unless `tweak` sets a formatter), grid lines and the
/// axis descriptions; `tweak` adjusts the style before it is drawn.
pub(super) fn mesh<'a, 'b, DB, X, Y>(
    chart: &'b mut Chart<'a, DB, X, Y>,
    s: Scale,
    (x, y): (&str, &str),
    tweak: impl FnOnce(&mut MeshStyle<'a, 'b, X, Y, DB>),
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut m = chart.configure_mesh();
    m.x_desc(x)
        .y_desc(y)
        .axis_desc_style(s.font(21.0))
        .label_style(s.font(17.0));
    // a function item, so that the reference lives as long as the chart
    fn label(v: &f64) -> String {
        fmt_num(*v)
    }
    m.x_label_formatter(&label).y_label_formatter(&label);
    m.bold_line_style(RGBColor(222, 222, 222).stroke_width(s.w(1.0)));
    m.light_line_style(TRANSPARENT)
        .axis_style(FRAME.stroke_width(s.w(1.2)));
    m.set_all_tick_mark_size(s.px(6.0)).x_labels(9).y_labels(8);
    tweak(&mut m);
    m.draw()?;
    Ok(())
}

/// The legend of the series labelled so far, in the corner of the plot that the `paths` (in
/// data coordinates; the curves, outlines and bars drawn) cross least.
pub(super) fn legend<'a, DB, X, Y>(
    chart: &mut Chart<'a, DB, X, Y>,
    s: Scale,
    entries: usize,
    paths: &[Vec<(f64, f64)>],
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    use SeriesLabelPosition::*;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let (w, h) = ((xr.end - xr.start) as f64, (yr.end - yr.start) as f64);
    // the legend's rough extent as a fraction of the plot
    let (fw, fh) = (0.42, ((entries as f64 * 26.0 + 16.0) * s.k / h).min(0.9));
    let corners = [
        (UpperRight, 1.0, 1.0),
        (UpperLeft, 0.0, 1.0),
        (LowerRight, 1.0, 0.0),
        (LowerLeft, 0.0, 0.0),
    ];
    let mut crossed = [0usize; 4];
    for path in paths {
        let px: Vec<(f64, f64)> = path
            .iter()
            .map(|p| chart.backend_coord(p))
            .map(|(x, y)| ((x - xr.start) as f64 / w, (yr.end - y) as f64 / h))
            .collect();
        // points every few pixels along each segment
        let segments = px.windows(2).flat_map(|ab| {
            let n = ((ab[1].0 - ab[0].0).hypot(ab[1].1 - ab[0].1) * 100.0)
                .ceil()
                .min(200.0);
            (0..n as usize).map(move |i| {
                let t = i as f64 / n;
                (
                    ab[0].0 + t * (ab[1].0 - ab[0].0),
                    ab[0].1 + t * (ab[1].1 - ab[0].1),
                )
            })
        });
        for (u, v) in segments.chain(px.last().copied()) {
            for (n, (_, right, top)) in crossed.iter_mut().zip(&corners) {
                let inside = |t: f64, end: f64, f: f64| (t - end).abs() <= f;
                *n += (inside(u, *right, fw) && inside(v, *top, fh)) as usize;
            }
        }
    }
    let best = (0..4).min_by_key(|&i| crossed[i]).unwrap_or(0);
    chart
        .configure_series_labels()
        .position(corners[best].0.clone())
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
    let dot = Circle::new(
        (s.px(12.0), 0),
        if dot { s.w(4.0) } else { 0 },
        color.filled(),
    );
    let patch = Rectangle::new([(0, -s.px(7.0)), (s.px(24.0), s.px(7.0))], fill);
    EmptyElement::at(at) + patch + line + dot
}

/// A note centred in the plot (e.g. "no data").
pub(super) fn note<DB: DrawingBackend, X: Ranged, Y: Ranged>(
    root: &DrawingArea<DB, Shift>,
    chart: &Chart<'_, DB, X, Y>,
    s: Scale,
    text: &str,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let at = ((xr.start + xr.end) / 2, (yr.start + yr.end) / 2);
    let style = s.font(22.0).pos(Pos::new(HPos::Center, VPos::Center));
    root.draw(&Text::new(text.to_string(), at, style))?;
    Ok(())
}

/// A value with up to 4 significant digits, trailing zeros trimmed; scientific outside
/// [1e-3, 1e5).
pub(super) fn fmt_num(v: f64) -> String {
    let trim = |s: String| match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => s,
    };
    if v == 0.0 || !v.is_finite() {
        return if v == 0.0 { "0".into() } else { v.to_string() };
    }
    if !(1e-3..1e5).contains(&v.abs()) {
        let s = format!("{v:.3e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        return format!("{}e{e}", trim(m.to_string()));
    }
    let dec = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let s = trim(format!("{v:.dec$}"));
    if s == "-0" { "0".into() } else { s }
}

/// Finite min and max of `vals` (NaN, NaN when there are none).
pub(super) fn min_max(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = vals
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if lo > hi {
        (f64::NAN, f64::NAN)
    } else {
        (lo, hi)
    }
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

/// Renders `fig` to `dir/stem.png` and `dir/stem.svg`; returns both paths (PNG first).
pub(super) fn render(dir: &Path, stem: &str, fig: &impl Figure) -> Result<Vec<PathBuf>> {
    if stem.is_empty() || stem.contains(['/', '\\']) || stem == "." || stem == ".." {
        bail!("invalid plot file stem {stem:?}: must be a plain file name without extension");
    }
    ensure_font()?;
    fs::create_dir_all(dir)
        .with_context(|| format!("creating plot directory {}", dir.display()))?;
    let (png, svg) = (
        dir.join(format!("{stem}.png")),
        dir.join(format!("{stem}.svg")),
    );
    let (w, h) = fig.size();
    // The PNG is drawn at twice its size and box-filtered down: plotters' bitmap backend does
    // not anti-alias lines.
    let mut buf = vec![255u8; (w * 2 * h * 2 * 3) as usize];
    let root = BitMapBackend::with_buffer(&mut buf, (w * 2, h * 2)).into_drawing_area();
    let drawn = fig.draw(&root, Scale { k: 2.0, svg: false });
    drawn
        .and_then(|_| Ok(root.present()?))
        .with_context(|| format!("drawing {}", png.display()))?;
    drop(root);
    let small: Vec<u8> = (0..(w * h * 3) as usize)
        .map(|i| {
            let (x, y, ch, w) = ((i / 3) % w as usize, i / 3 / w as usize, i % 3, w as usize);
            let at =
                |dx: usize, dy: usize| buf[((2 * y + dy) * 2 * w + 2 * x + dx) * 3 + ch] as u32;
            ((at(0, 0) + at(1, 0) + at(0, 1) + at(1, 1) + 2) / 4) as u8
        })
        .collect();
    write_png(&png, &small, w, h).with_context(|| format!("writing {}", png.display()))?;

    let mut text = String::new();
    let root = SVGBackend::with_string(&mut text, (w, h)).into_drawing_area();
    root.fill(&WHITE)?;
    let drawn = fig.draw(&root, Scale { k: 1.0, svg: true });
    drawn
        .and_then(|_| Ok(root.present()?))
        .with_context(|| format!("drawing {}", svg.display()))?;
    drop(root);
    fs::write(&svg, text).with_context(|| format!("writing {}", svg.display()))?;
    Ok(vec![png, svg])
}

/// Registers the bundled font for every family plotters may ask for (its defaults use
/// "sans-serif"), so that no system font is needed.
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = REGISTERED.get_or_init(|| {
        let styles = [FontStyle::Normal, FontStyle::Bold];
        let all = [FAMILY, "sans-serif", "serif", "monospace"].map(|name| {
            styles.map(|st| plotters::style::register_font(name, st, FONT_BYTES).is_ok())
        });
        all.iter().flatten().all(|ok| *ok)
    });
    ensure!(*ok, "the bundled plot font could not be loaded");
    Ok(())
}

fn write_png(path: &Path, rgb: &[u8], w: u32, h: u32) -> Result<()> {
    let mut enc = png::Encoder::new(BufWriter::new(fs::File::create(path)?), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(rgb)?;
    Ok(writer.finish()?)
}
