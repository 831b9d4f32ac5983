//! `vgpuctl`: the operator's command-line tool for vgpu.
//!
//! Exit status: 0 on success, 2 on any input error (bad flags, unreadable, oversized or non-UTF-8 input,
//! malformed values), 1 when stdout cannot be written (and `simulate`'s over-commit verdict).
//!
//! As a kubectl plugin: a symlink or copy named `kubectl-vgpu` on `$PATH` makes `kubectl vgpu cluster`,
//! `kubectl vgpu pod NS/NAME`, … run the same commands; help, usage and `--version` then say `kubectl vgpu`.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod cluster;
mod crds;
mod decode;
mod devices;
mod from_cluster;
mod gates;
mod input;
mod output;
mod pod;
mod pod_shape;
mod progress;
mod simulate;
mod snapshot;
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
    /// Nodes x GPUs of a live cluster (read-only): allocated vGPUs, cores and memory, pods per GPU,
    /// fragmentation, unhealthy GPUs.
    Cluster(cluster::ClusterArgs),
    /// Where a pod of a live cluster runs and on which GPUs, or why it is pending (its events and the
    /// extender's placement run locally).
    Pod(pod::PodArgs),
}

/// Installed as `kubectl-vgpu` (a symlink or copy), `kubectl vgpu …` runs it: name and usage say so.
const PLUGIN_NAME: &str = "kubectl-vgpu";

/// Parses the command line; called as [`PLUGIN_NAME`], help and usage name `kubectl vgpu`.
fn parse() -> Cli {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let mut cmd = Cli::command();
    if std::path::Path::new(&argv0).file_stem().is_some_and(|s| s == PLUGIN_NAME) {
        cmd = cmd.name(PLUGIN_NAME).bin_name("kubectl vgpu");
    }
    let matches = cmd.clone().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
}

fn main() -> ExitCode {
    let cli = parse();
    let max_bytes = cli.max_bytes;
    match cli.command {
        Command::Gates(cmd) => gates::run(cmd, max_bytes),
        Command::Decode(args) => decode::run(args, max_bytes),
        Command::Topology(cmd) => topology::run(cmd, max_bytes),
        Command::Devices(args) => devices::run(args, max_bytes),
        Command::Simulate(args) => simulate::run(args),
        Command::Crds(args) => crds::run(args),
        Command::Cluster(args) => cluster::run(args),
        Command::Pod(args) => pod::run(args),
    }
}
