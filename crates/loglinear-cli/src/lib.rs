//! The experiment side of `loglinear`: tasks, configs, training, evaluation, sweeps, reports and
//! plots. The binary `loglinear` (src/main.rs) is a thin command-line front end over this crate.

pub mod bench;
pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod data;
pub mod data_parallel;
pub mod demo;
pub mod device;
pub mod generate;
pub mod kernel_cache;
pub mod model;
pub mod optim;
pub mod pack;
#[cfg(feature = "persistence")]
pub mod profile;
pub mod report;
pub mod run_dir;
pub mod stats;
pub mod stop;
pub mod sweep;
pub mod tasks;
pub mod train;
pub mod viz;
