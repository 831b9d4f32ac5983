//! `vgpu-kubelet-plugin`: the DRA kubelet plugin for vGPU claims.

use std::process::ExitCode;

use clap::Parser;
use vgpu_bins::{DraGateArgs, gates_then_not_implemented};

/// The DRA kubelet plugin for vGPU claims.
#[derive(Debug, Parser)]
#[command(name = "vgpu-kubelet-plugin", version, about)]
struct Cli {
    #[command(flatten)]
    gates: DraGateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    gates_then_not_implemented(
        vgpu_gates::kubelet_plugin(),
        &cli.gates.feature_gates,
        "vgpu-kubelet-plugin",
        "no issue filed yet",
    )
}
