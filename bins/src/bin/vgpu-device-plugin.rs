//! `vgpu-device-plugin`: the kubelet device plugin for vGPU resources.

use std::process::ExitCode;

use clap::Parser;
use vgpu_bins::{CoreGateArgs, configure_gates, init_tracing, not_implemented};

/// The kubelet device plugin for vGPU resources.
#[derive(Debug, Parser)]
#[command(name = "vgpu-device-plugin", version, about)]
struct Cli {
    #[command(flatten)]
    gates: CoreGateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let _gates = match configure_gates(vgpu_gates::device_plugin(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    not_implemented("vgpu-device-plugin", "issue #6")
}
