//! `loglinear`: log-linear attention with adaptive memory decay, from the command line.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod op;

/// Log-linear attention (Fenwick-tree states) with adaptive memory decay.
#[derive(Parser, Debug)]
#[command(name = "loglinear", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the core op on tensors from a safetensors file (cross-framework checks).
    Op(op::OpArgs),
}

fn main() {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Op(args) => op::run(args),
    };
    if let Err(err) = result {
        // One line: the error and its context chain.
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
