//! Plotting layer: every function writes a decodable PNG and an SVG with its text as text; the
//! PNG shows the data (each series in its colour inside the axes, heat-map cells in viridis, grey
//! cells without a value, region bands), the SVG the title, axis labels, ticks and legend
//! entries; awkward data (empty, single point, constant, NaN, long, wide) never panic, and empty
//! charts say "no data".
//!
//! Set `LOGLINEAR_PLOT_DIR=<dir>` to keep the generated figures there for a look.

use std::fs;
use std::path::{Path, PathBuf};

use loglinear_cli::report::{
    BarGroup, LineOpts, Series, Shade, Spread, SpreadGroup, bar_chart, heatmap, histogram,
    line_plot, spread_chart,
};

/// Output directory: a fresh temp dir, or `$LOGLINEAR_PLOT_DIR/<test>` when set.
fn out_dir(test: &str) -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("LOGLINEAR_PLOT_DIR") {
        Some(d) => (None, PathBuf::from(d).join(test)),
        None => {
            let t = tempfile::tempdir().unwrap();
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    }
}

/// A decoded PNG.
struct Png {
    w: u32,
    h: u32,
    rgb: Vec<[u8; 3]>,
}

impl Png {
    fn read(path: &Path) -> Png {
        let bytes = fs::read(path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        let ch = info.color_type.samples();
        let rgb = buf[..info.buffer_size()]
            .chunks(ch)
            .map(|p| [p[0], p[1], p[2]])
            .collect();
        Png {
            w: info.width,
            h: info.height,
            rgb,
        }
    }

    /// Pixels within `tol` (per channel) of `color` inside the region given as fractions of the
    /// image `(x0, y0, x1, y1)`, y down.
    fn count(&self, color: (u8, u8, u8), tol: u8, (x0, y0, x1, y1): (f64, f64, f64, f64)) -> usize {
        let (w, h) = (self.w as f64, self.h as f64);
        let near = |a: u8, b: u8| a.abs_diff(b) <= tol;
        (0..self.rgb.len())
            .filter(|&i| {
                let (x, y) = (
                    (i % self.w as usize) as f64 / w,
                    (i / self.w as usize) as f64 / h,
                );
                let p = self.rgb[i];
                (x0..x1).contains(&x)
                    && (y0..y1).contains(&y)
                    && near(p[0], color.0)
                    && near(p[1], color.1)
                    && near(p[2], color.2)
            })
            .count()
    }

    /// Non-white pixels in a region.
    fn ink(&self, (x0, y0, x1, y1): (f64, f64, f64, f64)) -> usize {
        let total = self.count((255, 255, 255), 255, (x0, y0, x1, y1));
        total - self.count((255, 255, 255), 55, (x0, y0, x1, y1))
    }
}

/// Where the data of a 1200×760 chart are drawn (inside the axes, clear of the tick labels).
const PLOT: (f64, f64, f64, f64) = (0.12, 0.05, 0.97, 0.86);
/// matplotlib's tab10, the series colours in order.
const BLUE: (u8, u8, u8) = (31, 119, 180);
const ORANGE: (u8, u8, u8) = (255, 127, 14);
const GREEN: (u8, u8, u8) = (44, 160, 44);

/// Checks both files and returns the decoded PNG and the SVG text.
fn check(paths: &[PathBuf], stem: &str) -> (Png, String) {
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert_eq!(
        paths[0].file_name().unwrap(),
        format!("{stem}.png").as_str()
    );
    assert_eq!(
        paths[1].file_name().unwrap(),
        format!("{stem}.svg").as_str()
    );
    let png = Png::read(&paths[0]);
    assert!((1000..=1400).contains(&png.w), "PNG width {}", png.w);
    assert!((400..=1100).contains(&png.h), "PNG height {}", png.h);
    // text, axes and data leave a fair amount of non-white pixels
    let ink = png.ink((0.0, 0.0, 1.0, 1.0));
    assert!(ink > 5_000, "PNG looks blank ({ink} non-white pixels)");
    let svg = fs::read_to_string(&paths[1]).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "SVG header"
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    (png, svg)
}

/// How many SVG `<text>` elements hold exactly `needle`.
fn text_count(svg: &str, needle: &str) -> usize {
    svg.split("<text")
        .skip(1)
        .filter(|t| {
            t.split_once('>')
                .and_then(|(_, rest)| rest.split_once("</text>"))
                .is_some_and(|(content, _)| content.trim() == needle)
        })
        .count()
}

/// `needle` appears as the content of an SVG `<text>` element.
fn has_text(svg: &str, needle: &str) -> bool {
    text_count(svg, needle) > 0
}

fn assert_texts(svg: &str, needles: &[&str]) {
    for n in needles {
        assert!(has_text(svg, n), "SVG has no <text> {n:?}");
    }
}

#[test]
fn line_plot_writes_png_and_svg_with_labels() {
    let (_t, dir) = out_dir("line");
    let lens: [f64; 6] = [64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0];
    let series: Vec<Series> = ["linear", "mlp_softplus", "ones"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let pts = lens
                .iter()
                .map(|&t| (t, 1.0 - (i as f64 * 0.1 + 0.05) * t.log2() / 11.0))
                .collect();
            Series::with_err(*name, pts, vec![0.02 + 0.01 * i as f64; lens.len()])
        })
        .collect();
    let opts = LineOpts {
        log_x: true,
        y_range: Some((0.0, 1.0)),
        ..Default::default()
    };
    let paths = line_plot(
        &dir,
        "mqar_acc",
        "MQAR accuracy vs sequence length (λ modes)",
        "sequence length T (tokens)",
        "accuracy",
        &series,
        &opts,
    )
    .unwrap();
    let (png, svg) = check(&paths, "mqar_acc");
    assert_eq!((png.w, png.h), (1200, 760));
    // every curve is drawn in its own colour inside the axes
    for color in [BLUE, ORANGE, GREEN] {
        let n = png.count(color, 8, PLOT);
        assert!(n > 1_000, "{color:?}: {n} pixels in the plot");
    }
    assert_texts(
        &svg,
        &[
            "MQAR accuracy vs sequence length (λ modes)",
            "sequence length T (tokens)",
            "accuracy",
            "linear",
            "mlp_softplus",
            "ones",
            // a log x axis over powers of two has its ticks on them
            "64",
            "128",
            "256",
            "512",
            "1024",
            "2048",
        ],
    );
}

#[test]
fn line_plot_training_curves_long_and_log() {
    let (_t, dir) = out_dir("line_long");
    let n = 5000;
    let curve = |scale: f64, phase: f64| -> Vec<(f64, f64)> {
        (0..n)
            .map(|i| {
                let s = i as f64;
                let noise = 0.08 * ((s * 0.37 + phase).sin() * (s * 0.011).cos());
                (s, scale * (4.0 * (-s / 900.0).exp() + 0.3) * (1.0 + noise))
            })
            .collect()
    };
    let mut a = Series::with_err("log-linear Mamba-2", curve(1.0, 0.0), vec![0.05; n]);
    a.points[10].1 = f64::NAN; // skipped
    a.points[11].0 = f64::INFINITY; // skipped
    let b = Series::new("Mamba-2", curve(1.15, 1.0));
    let paths = line_plot(
        &dir,
        "loss",
        "Training loss",
        "step",
        "loss (nats/token)",
        &[a.clone(), b.clone()],
        &LineOpts {
            log_y: true,
            ..Default::default()
        },
    )
    .unwrap();
    let (png, svg) = check(&paths, "loss");
    // the log y axis (0.3 … 5) has ticks between its powers of ten
    assert_texts(
        &svg,
        &[
            "Training loss",
            "step",
            "loss (nats/token)",
            "Mamba-2",
            "log-linear Mamba-2",
            "0.5",
            "1",
            "2",
            "5",
        ],
    );
    // both curves, and the translucent ± band of the first (blue at 18 % on white)
    assert!(png.count(BLUE, 8, PLOT) > 2_000 && png.count(ORANGE, 8, PLOT) > 2_000);
    let band = png.count((215, 231, 242), 6, PLOT);
    assert!(band > 2_000, "± band: {band} pixels");
    // the SVG stays a sensible size even for thousands of points
    assert!(svg.len() < 2_000_000, "SVG is {} bytes", svg.len());

    let paths = line_plot(
        &dir,
        "loss_lin",
        "Training loss",
        "step",
        "loss (nats/token)",
        &[a, b],
        &LineOpts::default(),
    )
    .unwrap();
    check(&paths, "loss_lin");
}

#[test]
fn line_plot_series_of_one_name_share_a_colour_and_a_legend_entry() {
    let (_t, dir) = out_dir("line_shared_names");
    // twelve runs of three settings (four seeds each), interleaved as a sweep lists them
    let names = [
        "linear (4 runs)",
        "mlp_softplus (4 runs)",
        "mlp_softmax (4 runs)",
    ];
    let series: Vec<Series> = (0..12)
        .map(|i| {
            let (setting, seed) = (i % 3, i / 3);
            let level = 20.0 + 25.0 * setting as f64 + 3.0 * seed as f64;
            let pts = (0..300)
                .map(|s| (s as f64 * 100.0, level + (s as f64 * 0.1).sin()))
                .collect();
            Series::new(names[setting], pts)
        })
        .collect();
    let opts = LineOpts {
        y_range: Some((0.0, 100.0)),
        ..Default::default()
    };
    let paths = line_plot(
        &dir,
        "runs",
        "Held-out accuracy of every run",
        "step",
        "accuracy (%)",
        &series,
        &opts,
    )
    .unwrap();
    let (png, svg) = check(&paths, "runs");
    for name in names {
        assert_eq!(text_count(&svg, name), 1, "legend entries {name:?}");
    }
    // three colours, the settings'; none of the palette's fourth to twelfth
    for color in [BLUE, ORANGE, GREEN] {
        let n = png.count(color, 8, PLOT);
        assert!(n > 1_000, "{color:?}: {n} pixels in the plot");
    }
    for color in [(214, 39, 40), (148, 103, 189), (140, 86, 75)] {
        let n = png.count(color, 8, (0.0, 0.0, 1.0, 1.0));
        assert!(
            n < 20,
            "{color:?}: {n} pixels: a run got a colour of its own"
        );
    }

    // Twelve settings: tab20, whose second colour (light blue) tab10 lacks, so none repeats.
    let series: Vec<Series> = (0..12)
        .map(|i| {
            let pts = (0..300)
                .map(|s| (s as f64 * 100.0, 5.0 + 7.5 * i as f64))
                .collect();
            Series::new(format!("setting {i}"), pts)
        })
        .collect();
    let paths = line_plot(
        &dir,
        "settings",
        "Twelve settings",
        "step",
        "accuracy (%)",
        &series,
        &opts,
    )
    .unwrap();
    let (png, svg) = check(&paths, "settings");
    assert_eq!(text_count(&svg, "setting 11"), 1);
    for color in [BLUE, (174, 199, 232), (196, 156, 148)] {
        let n = png.count(color, 8, PLOT);
        assert!(n > 300, "{color:?}: {n} pixels in the plot");
    }
}

#[test]
fn line_plot_edge_cases_do_not_panic() {
    let (_t, dir) = out_dir("line_edge");
    let cases: Vec<(&str, Vec<Series>, LineOpts)> = vec![
        ("no_series", vec![], LineOpts::default()),
        (
            "empty_points",
            vec![Series::new("empty", vec![])],
            LineOpts::default(),
        ),
        (
            "single",
            vec![Series::with_err("one", vec![(3.0, 0.5)], vec![0.1])],
            LineOpts::default(),
        ),
        (
            "constant",
            vec![Series::new(
                "flat",
                vec![(0.0, 2.0), (1.0, 2.0), (2.0, 2.0)],
            )],
            LineOpts::default(),
        ),
        (
            "all_nan",
            vec![Series::new("nan", vec![(f64::NAN, 1.0), (1.0, f64::NAN)])],
            LineOpts::default(),
        ),
        (
            "log_nonpositive",
            vec![Series::with_err(
                "mixed",
                vec![
                    (-1.0, 1.0),
                    (0.0, 2.0),
                    (1.0, -3.0),
                    (10.0, 0.5),
                    (100.0, 0.2),
                ],
                vec![0.1, 0.1, 0.1, 1.0, f64::NAN],
            )],
            LineOpts {
                log_x: true,
                log_y: true,
                y_range: None,
            },
        ),
        (
            "out_of_range",
            vec![Series::new(
                "wild",
                vec![(0.0, -5.0), (1.0, 0.5), (2.0, 9.0), (3.0, 0.2)],
            )],
            LineOpts {
                y_range: Some((0.0, 1.0)),
                ..Default::default()
            },
        ),
        (
            "bad_range",
            vec![Series::new("s", vec![(0.0, 1.0), (1.0, 2.0)])],
            LineOpts {
                y_range: Some((1.0, f64::NAN)),
                log_y: true,
                ..Default::default()
            },
        ),
        (
            "err_len_mismatch",
            vec![Series::with_err(
                "s",
                vec![(0.0, 1.0), (1.0, 2.0), (2.0, 1.5)],
                vec![0.3],
            )],
            LineOpts::default(),
        ),
        (
            "tiny_values",
            vec![Series::new(
                "lr",
                vec![(0.0, 1e-5), (1.0, 3e-4), (2.0, 2e-4)],
            )],
            LineOpts::default(),
        ),
    ];
    for (stem, series, opts) in cases {
        let paths = line_plot(&dir, stem, stem, "x", "y", &series, &opts)
            .unwrap_or_else(|e| panic!("{stem}: {e:#}"));
        let (png, svg) = check(&paths, stem);
        assert_texts(&svg, &[stem, "x", "y"]);
        let empty = matches!(stem, "no_series" | "empty_points" | "all_nan");
        assert_eq!(has_text(&svg, "no data"), empty, "{stem}: 'no data' note");
        if !empty {
            let n = png.count(BLUE, 8, PLOT);
            assert!(n > 50, "{stem}: the data are not drawn ({n} pixels)");
        }
    }
}

fn lambda_like(rows: usize, cols: usize) -> Vec<f64> {
    let mut d = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let t = c as f64 / cols as f64;
            d[r * cols + c] =
                (0.5 + 0.5 * ((r as f64 * 0.7) + t * 9.0).sin()) * (r as f64 + 1.0) / rows as f64;
        }
    }
    d
}

#[test]
fn heatmap_writes_colorbar_with_min_and_max() {
    let (_t, dir) = out_dir("heatmap");
    let (rows, cols) = (11, 1024);
    let mut data = lambda_like(rows, cols);
    data[5] = -2.5; // minimum
    data[rows * cols - 7] = 7.25; // maximum
    let shades = [
        Shade {
            label: "key-value pairs".into(),
            range: 0..640,
            color: (44, 160, 44),
        },
        Shade {
            label: "queries".into(),
            range: 640..1024,
            color: (214, 39, 40),
        },
    ];
    let paths = heatmap(
        &dir,
        "lambda",
        "λ per Fenwick level (layer 0, head 0)",
        "token position t",
        "Fenwick level ℓ",
        "λ (gate value)",
        &data,
        rows,
        cols,
        &shades,
    )
    .unwrap();
    let (png, svg) = check(&paths, "lambda");
    assert_eq!(png.w, 1300);
    // the map, in viridis: its darkest (the minimum) and brightest (the maximum) colours, and
    // the blue-green of the bulk of the data
    let map = (0.09, 0.2, 0.84, 0.88);
    assert!(
        png.count((68, 1, 84), 10, (0.84, 0.1, 0.95, 0.95)) > 50,
        "colour bar bottom"
    );
    assert!(
        png.count((253, 231, 37), 10, (0.84, 0.1, 0.95, 0.95)) > 50,
        "colour bar top"
    );
    let bulk = png.count((38, 130, 142), 40, map);
    assert!(bulk > 20_000, "map cells: {bulk} pixels");
    // the task's regions as coloured bands above the map
    for color in [(44, 160, 44), (214, 39, 40)] {
        let n = png.count(color, 6, (0.0, 0.0, 1.0, 0.2));
        assert!(n > 5_000, "region band {color:?}: {n} pixels");
    }
    assert_texts(
        &svg,
        &[
            "λ per Fenwick level (layer 0, head 0)",
            "token position t",
            "Fenwick level ℓ",
            "λ (gate value)",
            "-2.5",
            "7.25",
            "key-value pairs",
            "queries",
            "0",
            "10",
        ],
    );
}

#[test]
fn heatmap_edge_cases_do_not_panic() {
    let (_t, dir) = out_dir("heatmap_edge");
    // constant: the colour bar still has a scale, centred on the value
    let paths = heatmap(
        &dir,
        "constant",
        "constant",
        "t",
        "level",
        "λ",
        &[0.5; 40],
        4,
        10,
        &[],
    )
    .unwrap();
    let (_, svg) = check(&paths, "constant");
    assert_texts(&svg, &["constant", "0.5", "0.45", "0.55"]);

    // all zero
    let paths = heatmap(
        &dir,
        "zeros",
        "zeros",
        "t",
        "level",
        "λ",
        &[0.0; 12],
        3,
        4,
        &[],
    )
    .unwrap();
    let (_, svg) = check(&paths, "zeros");
    assert_texts(&svg, &["0"]);

    // NaN cells are skipped for the scale
    let mut d = lambda_like(6, 50);
    d[3] = f64::NAN;
    d[17] = f64::INFINITY;
    d[0] = 0.0;
    d[1] = 3.0;
    let paths = heatmap(&dir, "nan", "with NaN", "t", "level", "λ", &d, 6, 50, &[]).unwrap();
    let (png, svg) = check(&paths, "nan");
    assert_texts(&svg, &["0", "3", "no value"]);
    // the two cells without a value are grey (plus the key under the colour bar)
    let grey = png.count((205, 205, 205), 3, (0.05, 0.0, 0.85, 1.0));
    assert!(grey > 400, "grey cells: {grey} pixels");

    // all NaN, single cell, empty, big square, shades out of range / empty / narrow
    let narrow = [
        Shade {
            label: "kv".into(),
            range: 0..3,
            color: (44, 160, 44),
        },
        Shade {
            label: "a long label for a narrow band".into(),
            range: 3..5,
            color: (214, 39, 40),
        },
        Shade {
            label: "beyond".into(),
            range: 90..200,
            color: (0, 0, 255),
        },
        Shade {
            label: "empty".into(),
            range: 7..7,
            color: (0, 0, 255),
        },
        #[allow(clippy::reversed_empty_ranges)]
        Shade {
            label: "reversed".into(),
            range: 9..2,
            color: (0, 0, 255),
        },
    ];
    heatmap(
        &dir,
        "all_nan",
        "all NaN",
        "t",
        "l",
        "λ",
        &[f64::NAN; 6],
        2,
        3,
        &narrow,
    )
    .unwrap();
    heatmap(
        &dir,
        "single",
        "single",
        "t",
        "l",
        "λ",
        &[1.5],
        1,
        1,
        &narrow,
    )
    .unwrap();
    let paths = heatmap(&dir, "empty", "empty", "t", "l", "λ", &[], 0, 0, &[]).unwrap();
    let (_, svg) = check(&paths, "empty");
    assert_texts(&svg, &["no data"]);
    let big = lambda_like(600, 700);
    let paths = heatmap(&dir, "big", "big", "t", "l", "λ", &big, 600, 700, &narrow).unwrap();
    let (_, svg) = check(&paths, "big");
    assert!(svg.len() < 15_000_000, "SVG is {} bytes", svg.len());
    let paths = heatmap(
        &dir,
        "narrow",
        "narrow shades",
        "t",
        "l",
        "λ",
        &lambda_like(5, 10),
        5,
        10,
        &narrow,
    )
    .unwrap();
    let (_, svg) = check(&paths, "narrow");
    assert_texts(&svg, &["kv", "a long label for a narrow band"]);

    // a size mismatch is an error, not a panic
    let err = heatmap(&dir, "bad", "bad", "t", "l", "λ", &[1.0; 5], 2, 3, &[]).unwrap_err();
    assert!(format!("{err:#}").contains("2×3"), "{err:#}");
}

#[test]
fn histogram_overlays_with_legend() {
    let (_t, dir) = out_dir("histogram");
    let sample = |n: usize, mu: f64, s: f64| -> Vec<f64> {
        // deterministic, roughly bell-shaped
        (0..n)
            .map(|i| {
                let u = (i as f64 + 0.5) / n as f64;
                let z = (u - 0.5) * 6.0;
                mu + s * z.signum() * z.abs().powf(0.7) * 0.6
            })
            .collect()
    };
    let mut b = sample(3000, 0.6, 0.15);
    b.push(f64::NAN);
    let series = vec![
        ("linear".to_string(), sample(4000, 0.3, 0.2)),
        ("mlp_softplus".to_string(), b),
        ("mlp_softmax".to_string(), sample(2000, 0.8, 0.05)),
    ];
    let paths = histogram(&dir, "lambda_hist", "λ values by λ mode", "λ", &series, 60).unwrap();
    let (png, svg) = check(&paths, "lambda_hist");
    // translucent fills and solid outlines of the three histograms
    for color in [BLUE, ORANGE, GREEN] {
        let n = png.count(color, 10, PLOT);
        assert!(n > 500, "{color:?} outline: {n} pixels");
    }
    assert!(png.count((192, 215, 232), 8, PLOT) > 10_000, "blue fill");
    assert_texts(
        &svg,
        &[
            "λ values by λ mode",
            "λ",
            "density",
            "linear (n=4000)",
            "mlp_softplus (n=3000)",
        ],
    );
}

#[test]
fn histogram_edge_cases_do_not_panic() {
    let (_t, dir) = out_dir("histogram_edge");
    type Case = (&'static str, Vec<(String, Vec<f64>)>, usize);
    let cases: Vec<Case> = vec![
        ("none", vec![], 10),
        ("empty", vec![("a".into(), vec![])], 10),
        ("constant", vec![("ones".into(), vec![1.0; 100])], 20),
        ("single", vec![("one".into(), vec![0.25])], 20),
        (
            "nan",
            vec![("nan".into(), vec![f64::NAN, f64::INFINITY])],
            20,
        ),
        ("zero_bins", vec![("a".into(), vec![0.0, 1.0, 2.0])], 0),
        (
            "many_bins",
            vec![("a".into(), (0..10_000).map(|i| i as f64).collect())],
            5000,
        ),
    ];
    for (stem, series, bins) in cases {
        let paths = histogram(&dir, stem, stem, "value", &series, bins)
            .unwrap_or_else(|e| panic!("{stem}: {e:#}"));
        let (_, svg) = check(&paths, stem);
        assert_texts(&svg, &[stem, "value", "density"]);
        let empty = matches!(stem, "none" | "empty" | "nan");
        assert_eq!(has_text(&svg, "no data"), empty, "{stem}: 'no data' note");
    }
}

#[test]
fn bar_chart_groups_with_errors() {
    let (_t, dir) = out_dir("bar");
    let cats: Vec<String> = (0..12).map(|l| l.to_string()).collect();
    let groups: Vec<BarGroup> = (0..3)
        .map(|g| {
            let v = (0..12)
                .map(|l| 0.9 - 0.05 * l as f64 + 0.07 * g as f64)
                .collect();
            let e = (0..12).map(|l| 0.01 + 0.004 * l as f64).collect();
            (format!("layer {g}"), v, Some(e))
        })
        .collect();
    let paths = bar_chart(
        &dir,
        "lambda_by_level",
        "Mean λ per Fenwick level",
        "Fenwick level ℓ",
        "mean λ",
        &cats,
        &groups,
    )
    .unwrap();
    let (png, svg) = check(&paths, "lambda_by_level");
    for color in [BLUE, ORANGE, GREEN] {
        let n = png.count(color, 4, PLOT);
        assert!(n > 10_000, "bars {color:?}: {n} pixels");
    }
    assert_texts(
        &svg,
        &[
            "Mean λ per Fenwick level",
            "Fenwick level ℓ",
            "mean λ",
            "layer 0",
            "layer 2",
            "0",
            "11",
        ],
    );
}

#[test]
fn bar_chart_edge_cases_do_not_panic() {
    let (_t, dir) = out_dir("bar_edge");
    let cats = |n: usize| (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>();
    type G = Vec<BarGroup>;
    let cases: Vec<(&str, Vec<String>, G)> = vec![
        ("nothing", vec![], vec![]),
        ("no_groups", cats(3), vec![]),
        (
            "short_values",
            cats(4),
            vec![("g".into(), vec![1.0], Some(vec![]))],
        ),
        (
            "nan_and_negative",
            cats(3),
            vec![
                (
                    "a".into(),
                    vec![f64::NAN, -1.0, 2.0],
                    Some(vec![0.1, f64::NAN, 0.5]),
                ),
                ("b".into(), vec![0.5, -0.5, f64::INFINITY], None),
            ],
        ),
        (
            "all_zero",
            cats(2),
            vec![("z".into(), vec![0.0, 0.0], None)],
        ),
        (
            "many",
            cats(64),
            vec![("g".into(), (0..64).map(|i| i as f64).collect(), None)],
        ),
    ];
    for (stem, c, g) in cases {
        let paths = bar_chart(&dir, stem, stem, "category", "value", &c, &g)
            .unwrap_or_else(|e| panic!("{stem}: {e:#}"));
        let (_, svg) = check(&paths, stem);
        assert_texts(&svg, &[stem, "category", "value"]);
        let empty = matches!(stem, "nothing" | "no_groups");
        assert_eq!(has_text(&svg, "no data"), empty, "{stem}: 'no data' note");
    }
}

#[test]
fn spread_quantiles_interpolate_between_order_statistics() {
    // 1..=11 shuffled, with values that do not count
    let mut v: Vec<f64> = vec![7.0, 3.0, 11.0, 1.0, 9.0, 5.0, 2.0, 10.0, 4.0, 8.0, 6.0];
    v.extend([f64::NAN, f64::INFINITY]);
    let q = Spread::of(&v).unwrap();
    assert_eq!(
        (q.q10, q.q25, q.median, q.q75, q.q90, q.n),
        (2.0, 3.5, 6.0, 8.5, 10.0, 11)
    );
    let one = Spread::of(&[0.25]).unwrap();
    assert_eq!((one.q10, one.median, one.q90), (0.25, 0.25, 0.25));
    assert!(Spread::of(&[]).is_none() && Spread::of(&[f64::NAN]).is_none());
}

#[test]
fn spread_chart_draws_boxes_and_stays_at_or_above_zero() {
    let (_t, dir) = out_dir("spread");
    let cats: Vec<String> = (0..9).map(|l| l.to_string()).collect();
    // skewed, non-negative samples (like λ): mean − std would be negative for the wide ones
    let groups: Vec<SpreadGroup> = (0..2)
        .map(|g| {
            let spreads = (0..9)
                .map(|l| {
                    let vals: Vec<f64> = (0..200)
                        .map(|i| (0.02 + 0.1 * l as f64 + 0.2 * g as f64) * (i as f64 / 40.0).exp())
                        .collect();
                    (l != 4 || g == 0).then(|| Spread::of(&vals).unwrap())
                })
                .collect();
            (format!("layer {g}"), spreads)
        })
        .collect();
    let title = "λ per Fenwick level (median, 25–75 %, 10–90 %)";
    let paths = spread_chart(&dir, "spread", title, "Fenwick level", "λ", &cats, &groups).unwrap();
    let (png, svg) = check(&paths, "spread");
    assert_texts(
        &svg,
        &[title, "Fenwick level", "λ", "layer 0", "layer 1", "0", "8"],
    );
    // the y axis starts at zero: no negative tick
    let negative = svg.split("<text").skip(1).any(|t| {
        t.split_once('>')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('-'))
    });
    assert!(!negative, "a negative tick on the axis of a quantity ≥ 0");
    // whiskers and outlines in each group's colour, translucent boxes (35 % on white)
    for color in [BLUE, ORANGE] {
        let n = png.count(color, 8, PLOT);
        assert!(n > 2_000, "{color:?}: {n} pixels");
    }
    assert!(png.count((176, 205, 225), 8, PLOT) > 5_000, "blue boxes");
    // nothing to show at all: a labelled empty chart
    let paths = spread_chart(&dir, "none", "none", "x", "y", &cats, &[]).unwrap();
    let (_, svg) = check(&paths, "none");
    assert_texts(&svg, &["none", "no data"]);
}

#[test]
fn errors_name_the_path() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("not_a_dir");
    fs::write(&file, "x").unwrap();
    let err = line_plot(&file, "p", "t", "x", "y", &[], &LineOpts::default()).unwrap_err();
    assert!(format!("{err:#}").contains("not_a_dir"), "{err:#}");
    let err = histogram(t.path(), "a/b", "t", "x", &[], 10).unwrap_err();
    assert!(format!("{err:#}").contains("a/b"), "{err:#}");
}
