//! Drawing surface shared by all plots: the bundled font, colours, a thin pixel-space canvas over
//! a plotters backend, and the writer that renders one figure to both a PNG and an SVG.
//!
//! Every figure is laid out in logical pixels. The PNG is drawn at twice that resolution and
//! box-filtered down (plotters' bitmap backend does not anti-alias lines), the SVG at 1:1 with text
//! kept as `<text>` elements.

use std::fs;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, PxScale, PxScaleFont, ScaleFont, point};
use anyhow::{Context, Result, anyhow, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, FontTransform, RGBAColor};

/// DejaVu Sans (Bitstream Vera licence, see `assets/DejaVuSans-LICENSE.txt`), registered with
/// plotters at run time so that no system font, fontconfig or freetype is needed.
static FONT_BYTES: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Family name used for all text. Registered under this exact string for the PNG; in the SVG it is
/// written as the `font-family` attribute, i.e. a CSS fallback list.
pub(crate) const FAMILY: &str = "DejaVu Sans, Verdana, sans-serif";

/// Supersampling factor of the PNG.
const SS: u32 = 2;

pub(crate) fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        let mut ok = font().is_some();
        for name in [FAMILY, "sans-serif", "serif", "monospace"] {
            for style in [FontStyle::Normal, FontStyle::Bold] {
                ok &= plotters::style::register_font(name, style, FONT_BYTES).is_ok();
            }
        }
        ok
    });
    if !ok {
        bail!("the bundled plot font could not be loaded");
    }
    Ok(())
}

/// The bundled font, parsed once (used to measure text and to rasterise it into the PNG).
fn font() -> Option<&'static FontRef<'static>> {
    static FONT: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    FONT.get_or_init(|| FontRef::try_from_slice(FONT_BYTES).ok())
        .as_ref()
}

/// Font sizes are given the way plotters takes them: the em is `size / 1.24` pixels (this is
/// what the SVG backend writes as `font-size`). Returns the ab_glyph scale for that em.
fn px_scale(f: &FontRef<'_>, size: f64) -> PxScale {
    let em = size / 1.24;
    let upm = f.units_per_em().unwrap_or(2048.0) as f64;
    PxScale::from((em * f.height_unscaled() as f64 / upm) as f32)
}

/// Cap height and descender depth of DejaVu Sans, in em.
const CAP_EM: f64 = 0.729;
const DESC_EM: f64 = 0.236;

// ---------------------------------------------------------------------------------------------
// Colours

/// matplotlib's "tab10" qualitative palette.
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

pub(crate) fn palette(i: usize) -> RGBColor {
    let (r, g, b) = TAB10[i % TAB10.len()];
    RGBColor(r, g, b)
}

/// viridis sampled at 33 evenly spaced points (from matplotlib), linearly interpolated.
const VIRIDIS: [(u8, u8, u8); 33] = [
    (68, 1, 84),
    (71, 13, 96),
    (72, 24, 106),
    (72, 35, 116),
    (71, 45, 123),
    (69, 55, 129),
    (66, 64, 134),
    (62, 73, 137),
    (59, 82, 139),
    (55, 91, 141),
    (51, 99, 141),
    (47, 107, 142),
    (44, 114, 142),
    (41, 122, 142),
    (38, 130, 142),
    (35, 137, 142),
    (33, 145, 140),
    (31, 152, 139),
    (31, 160, 136),
    (34, 167, 133),
    (40, 174, 128),
    (50, 182, 122),
    (63, 188, 115),
    (78, 195, 107),
    (94, 201, 98),
    (112, 207, 87),
    (132, 212, 75),
    (152, 216, 62),
    (173, 220, 48),
    (194, 223, 35),
    (216, 226, 25),
    (236, 229, 27),
    (253, 231, 37),
];

/// viridis at `t` in [0, 1] (clamped); NaN gives a neutral grey.
pub(crate) fn viridis(t: f64) -> RGBColor {
    if !t.is_finite() {
        return NAN_GREY;
    }
    let t = t.clamp(0.0, 1.0) * (VIRIDIS.len() - 1) as f64;
    let i = (t.floor() as usize).min(VIRIDIS.len() - 2);
    let f = t - i as f64;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    let mix = |p: u8, q: u8| (p as f64 + (q as f64 - p as f64) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

pub(crate) const NAN_GREY: RGBColor = RGBColor(205, 205, 205);
pub(crate) const INK: RGBColor = RGBColor(34, 34, 34);
pub(crate) const SOFT_INK: RGBColor = RGBColor(90, 90, 90);
pub(crate) const FRAME: RGBColor = RGBColor(70, 70, 70);
pub(crate) const GRID: RGBColor = RGBColor(222, 222, 222);
pub(crate) const GRID_MINOR: RGBColor = RGBColor(240, 240, 240);

/// Black or white, whichever reads better on `bg`.
pub(crate) fn contrast_ink(bg: RGBColor) -> RGBColor {
    let l = 0.299 * bg.0 as f64 + 0.587 * bg.1 as f64 + 0.114 * bg.2 as f64;
    if l > 150.0 {
        RGBColor(20, 20, 20)
    } else {
        WHITE
    }
}

// ---------------------------------------------------------------------------------------------
// Canvas

/// Text anchor: horizontal and vertical alignment of the given point relative to the text.
#[derive(Clone, Copy)]
pub(crate) struct Anchor(pub HPos, pub VPos);

pub(crate) const LEFT_CENTER: Anchor = Anchor(HPos::Left, VPos::Center);
pub(crate) const RIGHT_CENTER: Anchor = Anchor(HPos::Right, VPos::Center);
pub(crate) const CENTER_TOP: Anchor = Anchor(HPos::Center, VPos::Top);
pub(crate) const CENTER_CENTER: Anchor = Anchor(HPos::Center, VPos::Center);

/// A drawing surface in logical pixels over a plotters backend (`k` device pixels per logical one).
pub(crate) struct Canvas<DB: DrawingBackend> {
    root: DrawingArea<DB, Shift>,
    k: f64,
    svg: bool,
}

pub(crate) type Pt = (f64, f64);

impl<DB: DrawingBackend> Canvas<DB>
where
    DB::ErrorType: 'static,
{
    fn p(&self, (x, y): Pt) -> (i32, i32) {
        let c = |v: f64| (v * self.k).round().clamp(-1.0e6, 1.0e6) as i32;
        (c(x), c(y))
    }

    fn stroke(&self, color: RGBAColor, width: f64) -> ShapeStyle {
        ShapeStyle {
            color,
            filled: false,
            stroke_width: (width * self.k).round().max(1.0) as u32,
        }
    }

    /// A polyline.
    pub fn line(&self, pts: &[Pt], color: RGBAColor, width: f64) -> Result<()> {
        if pts.len() < 2 {
            return Ok(());
        }
        let v: Vec<_> = pts.iter().map(|&q| self.p(q)).collect();
        self.root
            .draw(&PathElement::new(v, self.stroke(color, width)))?;
        Ok(())
    }

    /// A filled axis-aligned rectangle given two opposite corners.
    pub fn fill_rect(&self, a: Pt, b: Pt, color: RGBAColor) -> Result<()> {
        let (a, b) = (self.p(a), self.p(b));
        if a.0 == b.0 || a.1 == b.1 {
            return Ok(());
        }
        let (x0, x1) = (a.0.min(b.0), a.0.max(b.0));
        let (y0, y1) = (a.1.min(b.1), a.1.max(b.1));
        self.root
            .draw(&Rectangle::new([(x0, y0), (x1, y1)], color.filled()))?;
        Ok(())
    }

    /// A rectangle outline.
    pub fn stroke_rect(&self, a: Pt, b: Pt, color: RGBAColor, width: f64) -> Result<()> {
        let (x0, x1) = (a.0.min(b.0), a.0.max(b.0));
        let (y0, y1) = (a.1.min(b.1), a.1.max(b.1));
        self.line(
            &[(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)],
            color,
            width,
        )
    }

    /// A filled polygon.
    pub fn polygon(&self, pts: &[Pt], color: RGBAColor) -> Result<()> {
        if pts.len() < 3 {
            return Ok(());
        }
        let v: Vec<_> = pts.iter().map(|&q| self.p(q)).collect();
        self.root.draw(&Polygon::new(v, color.filled()))?;
        Ok(())
    }

    /// A filled circle (radius in logical pixels).
    pub fn dot(&self, c: Pt, r: f64, color: RGBAColor) -> Result<()> {
        let r = (r * self.k).round().max(1.0) as u32;
        self.root.draw(&Circle::new(self.p(c), r, color.filled()))?;
        Ok(())
    }

    /// Text at `at`, aligned by `anchor`. `vertical` rotates it to read bottom-to-top (y labels).
    pub fn text(
        &self,
        s: &str,
        at: Pt,
        size: f64,
        color: RGBColor,
        anchor: Anchor,
        vertical: bool,
    ) -> Result<()> {
        if s.is_empty() {
            return Ok(());
        }
        if self.svg {
            // The SVG backend anchors with `dy` in em/ex; nudge centred text so caps sit centred.
            let nudge = if matches!(anchor.1, VPos::Center) {
                0.07 * size
            } else {
                0.0
            };
            let (at, transform) = if vertical {
                ((at.0 + nudge, at.1), FontTransform::Rotate270)
            } else {
                ((at.0, at.1 + nudge), FontTransform::None)
            };
            let style = TextStyle::from((FAMILY, size * self.k).into_font())
                .color(&color)
                .pos(Pos::new(anchor.0, anchor.1))
                .transform(transform);
            self.root
                .draw(&Text::new(s.to_string(), self.p(at), style))?;
            return Ok(());
        }
        self.raster_text(s, at, size, color, anchor, vertical)
    }

    /// Rasterise text with ab_glyph at subpixel glyph positions (plotters' own bitmap text
    /// rounds every glyph to whole pixels, which makes letter spacing uneven).
    fn raster_text(
        &self,
        s: &str,
        at: Pt,
        size: f64,
        color: RGBColor,
        anchor: Anchor,
        vertical: bool,
    ) -> Result<()> {
        let Some(f) = font() else { return Ok(()) };
        let size = size * self.k;
        let em = size / 1.24;
        let sf = f.as_scaled(px_scale(f, size));
        let width = advance(&sf, s);
        // text-local frame: u along the text, v downwards, baseline at v = base
        let u0 = match anchor.0 {
            HPos::Left => 0.0,
            HPos::Center => -width / 2.0,
            HPos::Right => -width,
        };
        let base = match anchor.1 {
            VPos::Top => CAP_EM * em,
            VPos::Center => CAP_EM * em / 2.0,
            VPos::Bottom => -DESC_EM * em,
        };
        let (ox, oy) = (at.0 * self.k, at.1 * self.k);
        let mut pixels: Vec<(i32, i32, f32)> = vec![];
        let mut pen = u0;
        let mut prev = None;
        for ch in s.chars() {
            let id = sf.glyph_id(ch);
            if let Some(p) = prev {
                pen += sf.kern(p, id) as f64;
            }
            prev = Some(id);
            // horizontal text is positioned in device space directly (exact subpixel offset);
            // vertical text is laid out at the origin and rotated by whole pixels
            let pos = if vertical {
                point(pen as f32, base as f32)
            } else {
                point((ox + pen) as f32, (oy + base) as f32)
            };
            let glyph = id.with_scale_and_position(sf.scale(), pos);
            pen += sf.h_advance(id) as f64;
            let Some(outline) = f.outline_glyph(glyph) else {
                continue;
            };
            let b = outline.px_bounds();
            let (bx, by) = (b.min.x as i32, b.min.y as i32);
            let (rx, ry) = (ox.round() as i32, oy.round() as i32);
            outline.draw(|px, py, cov| {
                let (lx, ly) = (bx + px as i32, by + py as i32);
                let xy = if vertical {
                    (rx + ly, ry - lx)
                } else {
                    (lx, ly)
                };
                pixels.push((xy.0, xy.1, cov));
            });
        }
        for (x, y, cov) in pixels {
            if cov > 0.003 {
                self.root
                    .draw_pixel((x, y), &color.mix(cov.min(1.0) as f64))?;
            }
        }
        Ok(())
    }

    /// Whether this canvas writes SVG (vector) rather than pixels.
    pub fn is_svg(&self) -> bool {
        self.svg
    }
}

/// Width of `s` in logical pixels at font size `size` (laid out with the bundled font).
pub(crate) fn text_width(s: &str, size: f64) -> f64 {
    match font() {
        Some(f) => advance(&f.as_scaled(px_scale(f, size)), s),
        None => 0.55 * size * s.chars().count() as f64,
    }
}

/// Advance width of `s` (with kerning) in the units of `sf`.
fn advance(sf: &PxScaleFont<&FontRef<'_>>, s: &str) -> f64 {
    let mut w = 0.0;
    let mut prev = None;
    for ch in s.chars() {
        let id = sf.glyph_id(ch);
        if let Some(p) = prev {
            w += sf.kern(p, id) as f64;
        }
        w += sf.h_advance(id) as f64;
        prev = Some(id);
    }
    w
}

// ---------------------------------------------------------------------------------------------
// Output

/// A figure that can draw itself on any backend.
pub(crate) trait Figure {
    /// Size in logical pixels (also the PNG's size in pixels).
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, c: &Canvas<DB>) -> Result<()>
    where
        DB::ErrorType: 'static;
}

/// Render `fig` to `dir/stem.png` and `dir/stem.svg`; returns both paths (PNG first).
pub(crate) fn render(dir: &Path, stem: &str, fig: &impl Figure) -> Result<Vec<PathBuf>> {
    if stem.is_empty() || stem.contains(['/', '\\']) || stem == "." || stem == ".." {
        bail!("invalid plot file stem {stem:?}: must be a plain file name without extension");
    }
    ensure_font()?;
    fs::create_dir_all(dir)
        .with_context(|| format!("creating plot directory {}", dir.display()))?;
    let png_path = dir.join(format!("{stem}.png"));
    let svg_path = dir.join(format!("{stem}.svg"));
    let (w, h) = fig.size();

    // PNG, supersampled.
    let (bw, bh) = (w * SS, h * SS);
    let mut buf = vec![255u8; (bw as usize) * (bh as usize) * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (bw, bh)).into_drawing_area();
        let c = Canvas {
            root,
            k: SS as f64,
            svg: false,
        };
        fig.draw(&c)
            .with_context(|| format!("drawing {}", png_path.display()))?;
        c.root
            .present()
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("drawing {}", png_path.display()))?;
    }
    let small = downsample(&buf, w as usize, h as usize, SS as usize);
    write_png(&png_path, &small, w, h)
        .with_context(|| format!("writing {}", png_path.display()))?;

    // SVG.
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let c = Canvas {
            root,
            k: 1.0,
            svg: true,
        };
        fig.draw(&c)
            .with_context(|| format!("drawing {}", svg_path.display()))?;
        c.root
            .present()
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("drawing {}", svg_path.display()))?;
    }
    fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;

    Ok(vec![png_path, svg_path])
}

/// Box-filter an RGB image of (w*f)×(h*f) down to w×h.
fn downsample(buf: &[u8], w: usize, h: usize, f: usize) -> Vec<u8> {
    let bw = w * f;
    let mut out = vec![0u8; w * h * 3];
    let n = (f * f) as u32;
    for y in 0..h {
        for x in 0..w {
            for ch in 0..3 {
                let mut s = 0u32;
                for dy in 0..f {
                    let row = (y * f + dy) * bw;
                    for dx in 0..f {
                        s += buf[(row + x * f + dx) * 3 + ch] as u32;
                    }
                }
                out[(y * w + x) * 3 + ch] = ((s + n / 2) / n) as u8;
            }
        }
    }
    out
}

fn write_png(path: &Path, rgb: &[u8], w: u32, h: u32) -> Result<()> {
    let file = fs::File::create(path)?;
    let mut enc = png::Encoder::new(BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(())
}
