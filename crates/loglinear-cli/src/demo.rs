//! `loglinear demo`: the main job on its embedded default. A small MQAR comparison of the
//! published linear λ against the adaptive MLP-softplus λ (two seeds each) on the CPU, with the
//! comparison table, the λ heat-map and the training curves.

use std::path::Path;

use anyhow::{Context, Result};

use crate::config::ConfigFile;
use crate::{sweep, viz};

/// The embedded demo config (also at `experiments/demo.toml`).
pub const DEMO_CONFIG: &str = include_str!("../../../experiments/demo.toml");

/// Runs the demo into `out` (restartable: finished runs are kept).
pub fn run(out: &Path, overrides: &[String], device_name: &str) -> Result<()> {
    let device = &crate::device::parse_device(device_name)?;
    let file = ConfigFile::parse(DEMO_CONFIG, overrides).context("in the embedded demo config")?;
    let runs = out.join("runs");
    let points = file.expand()?;
    println!(
        "loglinear demo: {} runs ({}), writing into {}",
        points.len(),
        points
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join("; "),
        out.display()
    );
    let rows = sweep::run_sweep(
        &file,
        &runs,
        &sweep::SweepOptions {
            device: device_name.to_string(),
            ..Default::default()
        },
    )?;
    println!();
    print!("{}", std::fs::read_to_string(runs.join("summary.md"))?);
    // λ of the first MLP-softplus run, and the curves; then both modes side by side.
    let pick = |mode: &str| {
        points
            .iter()
            .find(|(_, c)| c.model.lambda().name() == mode)
            .map(|(n, _)| runs.join(n))
    };
    let mut shown = Vec::new();
    for (mode, dir) in [
        ("mlp_softplus", "lambda_mlp_softplus"),
        ("linear", "lambda_linear"),
    ] {
        if let Some(run) = pick(mode) {
            viz::visualise_run(&run, &out.join(dir), 8, device)?;
            println!(
                "{mode}: λ heat-maps, histogram, mean λ per level and curves in {}",
                out.join(dir).display()
            );
            shown.push(run);
        }
    }
    if shown.len() == 2 {
        viz::compare_runs(&shown, &out.join("compare"), 8, device)?;
        println!("side by side: {}", out.join("compare").display());
    }
    println!(
        "accuracy vs setting: {} ({} settings)",
        runs.join("accuracy.png").display(),
        rows.len()
    );
    Ok(())
}
