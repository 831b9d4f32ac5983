//! `vgpuctl`: the operator's command-line tool for vgpu.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod gates;
mod topology;

/// Inspect and check vgpu configuration, annotations and placement.
#[derive(Debug, Parser)]
#[command(name = "vgpuctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List, check and render feature gates.
    #[command(subcommand)]
    Gates(gates::GatesCommand),
    /// Score GPU sets and run best-effort allocation on a GPU link topology.
    #[command(subcommand)]
    Topology(topology::TopologyCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Gates(cmd) => gates::run(cmd),
        Command::Topology(cmd) => topology::run(cmd),
    }
}
