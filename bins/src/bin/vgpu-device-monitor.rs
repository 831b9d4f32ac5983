//! `vgpu-device-monitor`: the per-node vGPU metrics exporter.

use std::process::ExitCode;

use clap::Parser;
use vgpu_bins::{CoreGateArgs, configure_gates, init_tracing, not_implemented};

/// the per-node vGPU metrics exporter.
#[derive(Debug, Parser)]
#[command(name = "vgpu-device-monitor", version, about)]
struct Cli {
    #[command(flatten)]
    gates: CoreGateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let _gates = match configure_gates(vgpu_gates::device_monitor(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    not_implemented("vgpu-device-monitor", "no issue filed yet")
}
