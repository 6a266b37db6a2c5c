//! Grouped bar charts with optional ± error bars.

use anyhow::Result;
use plotters::prelude::*;

use super::BarGroup;
use super::axis::{Axis, Frame, Layout, Mark, draw_legend, padded};
use super::canvas::{Canvas, FRAME, Figure, Pt, palette};
use super::line::min_max;

struct Group {
    name: String,
    color: RGBColor,
    /// (value, error) per category; None where missing or NaN.
    vals: Vec<Option<(f64, Option<f64>)>>,
}

pub(crate) struct BarFig {
    title: String,
    x_label: String,
    y_label: String,
    ncat: usize,
    groups: Vec<Group>,
    xa: Axis,
    ya: Axis,
}

/// Fraction of a category's width covered by its cluster of bars.
const CLUSTER: f64 = 0.8;

impl BarFig {
    pub fn new(
        title: &str,
        x_label: &str,
        y_label: &str,
        categories: &[String],
        groups: &[BarGroup],
    ) -> Self {
        let ncat = categories.len();
        let groups: Vec<Group> = groups
            .iter()
            .enumerate()
            .map(|(i, (name, vals, errs))| Group {
                name: name.clone(),
                color: palette(i),
                vals: (0..ncat)
                    .map(|j| {
                        let v = vals.get(j).copied().filter(|v| v.is_finite())?;
                        let e = errs
                            .as_ref()
                            .and_then(|e| e.get(j))
                            .copied()
                            .filter(|e| e.is_finite() && *e != 0.0)
                            .map(f64::abs);
                        Some((v, e))
                    })
                    .collect(),
            })
            .collect();
        let ext = groups.iter().flat_map(|g| {
            g.vals.iter().flatten().flat_map(|&(v, e)| {
                let e = e.unwrap_or(0.0);
                [v - e, v + e]
            })
        });
        let (lo, hi) = min_max(ext.chain([0.0]));
        let (plo, phi) = padded(lo, hi, 0.06, false);
        // bars start at zero: no padding below zero unless there are negative values
        let ylo = if lo >= 0.0 { 0.0 } else { plo };
        let yhi = if hi <= 0.0 && lo < 0.0 { 0.0 } else { phi };
        let ticks: Vec<(f64, String)> = categories
            .iter()
            .enumerate()
            .map(|(i, s)| (i as f64, s.clone()))
            .collect();
        let xa = Axis::new(-0.5, ncat.max(1) as f64 - 0.5, false).with_ticks(ticks);
        BarFig {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            ncat,
            groups,
            xa,
            ya: Axis::new(ylo, yhi, false),
        }
    }
}

impl Figure for BarFig {
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
            y_label: &self.y_label,
            extra_top: 0.0,
            extra_right: 0.0,
        };
        let mut f = Frame::new(&l, self.xa.clone(), self.ya.clone());
        // horizontal grid only: vertical lines would cut through the clusters
        let xticks = std::mem::take(&mut f.xticks);
        f.draw_grid(c, true)?;
        f.xticks = xticks;

        let ng = self.groups.len().max(1) as f64;
        let bw = CLUSTER / ng;
        let mut occupied: Vec<Pt> = vec![];
        for (gi, g) in self.groups.iter().enumerate() {
            for (ci, v) in g.vals.iter().enumerate() {
                let Some((v, e)) = *v else { continue };
                let x0 = ci as f64 - CLUSTER / 2.0 + gi as f64 * bw;
                let x1 = x0 + bw;
                let vc = v.clamp(f.ya.lo, f.ya.hi);
                let base = 0f64.clamp(f.ya.lo, f.ya.hi);
                let gap = (bw * 0.06).min(0.02);
                c.fill_rect(f.pt((x0 + gap, base)), f.pt((x1 - gap, vc)), g.color.into())?;
                for k in 0..=4 {
                    let t = k as f64 / 4.0;
                    occupied.push(f.norm((x0 + t * bw, vc)));
                    occupied.push(f.norm(((x0 + x1) / 2.0, base + t * (vc - base))));
                }
                if let Some(e) = e {
                    let xm = f.px((x0 + x1) / 2.0);
                    let (ylo, yhi) = (f.py(v - e), f.py(v + e));
                    let ink = FRAME.into();
                    c.line(&[(xm, ylo), (xm, yhi)], ink, 1.6)?;
                    let cap = (f.px(x1) - f.px(x0)).clamp(4.0, 24.0) * 0.25;
                    c.line(&[(xm - cap, ylo), (xm + cap, ylo)], ink, 1.6)?;
                    c.line(&[(xm - cap, yhi), (xm + cap, yhi)], ink, 1.6)?;
                    occupied.push(f.norm(((x0 + x1) / 2.0, v + e)));
                }
            }
        }
        // zero line when bars go both ways
        if f.ya.lo < 0.0 && f.ya.hi > 0.0 {
            let y = f.py(0.0);
            c.line(&[(f.left, y), (f.right, y)], FRAME.into(), 1.0)?;
        }
        f.draw_axes(c, &l)?;
        if self.ncat == 0
            || self
                .groups
                .iter()
                .all(|g| g.vals.iter().all(Option::is_none))
        {
            f.note(c, "no data")?;
        }
        if self.groups.len() > 1 || self.groups.first().is_some_and(|g| !g.name.is_empty()) {
            let entries: Vec<(String, Mark)> = self
                .groups
                .iter()
                .map(|g| {
                    (
                        g.name.clone(),
                        Mark::Patch {
                            color: g.color,
                            alpha: 1.0,
                        },
                    )
                })
                .collect();
            draw_legend(c, &f, &entries, &occupied)?;
        }
        Ok(())
    }
}
