//! `vgpuctl`: the operator's command-line tool for vgpu.
//!
//! Exit status: 0 on success, 2 on any input error (bad flags, unreadable, oversized or non-UTF-8 input,
//! malformed values), 1 when stdout cannot be written (and `simulate`'s over-commit verdict).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod crds;
mod decode;
mod devices;
mod from_cluster;
mod gates;
mod input;
mod output;
mod pod_shape;
mod progress;
mod simulate;
mod stages;
mod topology;

/// Inspect and check vgpu configuration, annotations and placement.
#[derive(Debug, Parser)]
#[command(name = "vgpuctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Largest input accepted, in bytes (suffixes Ki, Mi, Gi), for every file and stdin this invocation
    /// reads. Defaults: 256 KiB for annotation values (decode, topology --topology), 4 MiB for documents
    /// (gates render --values, devices --mock-config).
    #[arg(long, global = true, value_name = "N", value_parser = input::parse_max_bytes)]
    max_bytes: Option<u64>,
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
    /// Stream a seeded mix of vGPU pods through the extender's filter and bind over an in-memory cluster, or
    /// (`--from-cluster`) pods of one shape through a read-only snapshot of a live cluster.
    Simulate(simulate::SimulateArgs),
    /// Print the GPU module's CRDs (PhysicalGPU, GPUClass) as YAML, for the default group or --group.
    Crds(crds::CrdsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let max_bytes = cli.max_bytes;
    match cli.command {
        Command::Gates(cmd) => gates::run(cmd, max_bytes),
        Command::Decode(args) => decode::run(args, max_bytes),
        Command::Topology(cmd) => topology::run(cmd, max_bytes),
        Command::Devices(args) => devices::run(args, max_bytes),
        Command::Simulate(args) => simulate::run(args),
        Command::Crds(args) => crds::run(args),
    }
}
