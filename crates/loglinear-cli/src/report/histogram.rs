//! Overlaid, density-normalised histograms on common bins.

use anyhow::Result;
use plotters::prelude::*;

use super::axis::{Axis, Frame, Layout, Mark, clip_polyline, draw_legend, padded};
use super::canvas::{Canvas, Figure, Pt, palette};
use super::line::{min_max, sample_polyline};

struct Hist {
    name: String,
    color: RGBColor,
    n: usize,
    density: Vec<f64>,
}

pub(crate) struct HistFig {
    title: String,
    x_label: String,
    edges: Vec<f64>,
    hists: Vec<Hist>,
    xa: Axis,
    ya: Axis,
}

impl HistFig {
    pub fn new(title: &str, x_label: &str, series: &[(String, Vec<f64>)], bins: usize) -> Self {
        let mut bins = bins.clamp(1, 10_000);
        let (lo, hi) = min_max(series.iter().flat_map(|(_, v)| v.iter().copied()));
        if lo == hi {
            // constant sample: an odd number of bins puts the value in the middle of one
            bins |= 1;
        }
        let (lo, hi) = if lo.is_finite() {
            padded(lo, hi, 0.0, false) // widens a constant sample to a small range around it
        } else {
            (0.0, 1.0)
        };
        let width = (hi - lo) / bins as f64;
        let edges: Vec<f64> = (0..=bins).map(|i| lo + i as f64 * width).collect();
        let hists: Vec<Hist> = series
            .iter()
            .enumerate()
            .map(|(i, (name, vals))| {
                let mut counts = vec![0usize; bins];
                let mut n = 0;
                for &v in vals.iter().filter(|v| v.is_finite()) {
                    let b = (((v - lo) / width).floor().max(0.0) as usize).min(bins - 1);
                    counts[b] += 1;
                    n += 1;
                }
                let density = counts
                    .iter()
                    .map(|&k| {
                        if n == 0 {
                            0.0
                        } else {
                            k as f64 / (n as f64 * width)
                        }
                    })
                    .collect();
                Hist {
                    name: name.clone(),
                    color: palette(i),
                    n,
                    density,
                }
            })
            .collect();
        let ymax = hists
            .iter()
            .flat_map(|h| h.density.iter().copied())
            .fold(0.0, f64::max);
        let ymax = if ymax > 0.0 && ymax.is_finite() {
            ymax * 1.1
        } else {
            1.0
        };
        let (xlo, xhi) = padded(lo, hi, 0.02, false);
        HistFig {
            title: title.into(),
            x_label: x_label.into(),
            edges,
            hists,
            xa: Axis::new(xlo, xhi, false),
            ya: Axis::new(0.0, ymax, false),
        }
    }
}

impl Figure for HistFig {
    fn size(&self) -> (u32, u32) {
        (1200, 760)
    }

    fn draw<DB: DrawingBackend>(&self, c: &Canvas<DB>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let l = Layout {
            size: self.size(),
            title: &self.title,
            x_label: &self.x_label,
            y_label: "density",
            extra_top: 0.0,
            extra_right: 0.0,
        };
        let f = Frame::new(&l, self.xa.clone(), self.ya.clone());
        f.draw_grid(c, true)?;
        let mut occupied: Vec<Pt> = vec![];
        let alpha = if self.hists.len() > 1 { 0.28 } else { 0.45 };
        // translucent fills first, then all outlines on top
        for h in &self.hists {
            for (i, &d) in h.density.iter().enumerate() {
                if d > 0.0 {
                    c.fill_rect(
                        f.pt((self.edges[i], 0.0)),
                        f.pt((self.edges[i + 1], d)),
                        h.color.mix(alpha),
                    )?;
                }
            }
        }
        for h in &self.hists {
            if h.n == 0 {
                continue;
            }
            // step outline
            let mut pts: Vec<Pt> = vec![(self.edges[0], 0.0)];
            for (i, &d) in h.density.iter().enumerate() {
                pts.push((self.edges[i], d));
                pts.push((self.edges[i + 1], d));
            }
            pts.push((*self.edges.last().unwrap_or(&0.0), 0.0));
            let norm: Vec<Pt> = pts.iter().map(|&p| f.norm(p)).collect();
            occupied.extend(sample_polyline(&norm));
            for (i, &d) in h.density.iter().enumerate() {
                // the area under the curve counts as occupied too
                let x = (self.edges[i] + self.edges[i + 1]) / 2.0;
                let steps = 6;
                for k in 0..steps {
                    occupied.push(f.norm((x, d * k as f64 / steps as f64)));
                }
            }
            for piece in clip_polyline(&norm) {
                let px: Vec<Pt> = piece.into_iter().map(|q| f.pt(f.denorm(q))).collect();
                c.line(&px, h.color.into(), 2.0)?;
            }
        }
        f.draw_axes(c, &l)?;
        if self.hists.iter().all(|h| h.n == 0) {
            f.note(c, "no data")?;
        }
        let entries: Vec<(String, Mark)> = self
            .hists
            .iter()
            .map(|h| {
                (
                    format!("{} (n={})", h.name, h.n),
                    Mark::Patch {
                        color: h.color,
                        alpha,
                    },
                )
            })
            .collect();
        draw_legend(c, &f, &entries, &occupied)?;
        Ok(())
    }
}
