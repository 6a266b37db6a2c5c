//! The experiment side of `loglinear`: tasks, configs, training, evaluation, sweeps, reports and
//! plots. The binary `loglinear` (src/main.rs) is a thin command-line front end over this crate.

pub mod report;
pub mod tasks;
