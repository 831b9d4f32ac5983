//! `vgpu-device-monitor`: the per-node vGPU metrics exporter.

use std::process::ExitCode;

use clap::Parser;
use vgpu_bins::{CoreGateArgs, gates_then_not_implemented};

/// The per-node vGPU metrics exporter.
#[derive(Debug, Parser)]
#[command(name = "vgpu-device-monitor", version, about)]
struct Cli {
    #[command(flatten)]
    gates: CoreGateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    gates_then_not_implemented(
        vgpu_gates::device_monitor(),
        &cli.gates.feature_gates,
        "vgpu-device-monitor",
        "no issue filed yet",
    )
}
