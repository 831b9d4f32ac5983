//! `vgpuctl`: the operator's command-line tool for vgpu.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod decode;
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
    /// Decode an annotation value (node-devices, node-config, node-topology, pod-devices) to normalized JSON.
    Decode(decode::DecodeArgs),
    /// Score GPU sets and run best-effort allocation on a GPU link topology.
    #[command(subcommand)]
    Topology(topology::TopologyCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Gates(cmd) => gates::run(cmd),
        Command::Decode(args) => decode::run(args),
        Command::Topology(cmd) => topology::run(cmd),
    }
}
