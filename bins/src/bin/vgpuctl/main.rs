//! `vgpuctl`: the operator's command-line tool for vgpu.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod decode;
mod devices;
mod gates;
mod output;
mod simulate;
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
    /// List the GPUs a backend sees (table or JSON), optionally with the link matrix.
    Devices(devices::DevicesArgs),
    /// Stream a seeded mix of vGPU pods through the extender's filter and bind over an in-memory cluster.
    Simulate(simulate::SimulateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Gates(cmd) => gates::run(cmd),
        Command::Decode(args) => decode::run(args),
        Command::Topology(cmd) => topology::run(cmd),
        Command::Devices(args) => devices::run(args),
        Command::Simulate(args) => simulate::run(args),
    }
}
