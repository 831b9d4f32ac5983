//! `vgpu-kubelet-plugin`: the DRA kubelet plugin for vGPU claims.

use std::process::ExitCode;

use clap::Parser;
use vgpu_bins::{DraGateArgs, configure_gates, init_tracing, not_implemented};

/// the DRA kubelet plugin for vGPU claims.
#[derive(Debug, Parser)]
#[command(name = "vgpu-kubelet-plugin", version, about)]
struct Cli {
    #[command(flatten)]
    gates: DraGateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let _gates = match configure_gates(vgpu_gates::kubelet_plugin(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    not_implemented("vgpu-kubelet-plugin", "no issue filed yet")
}
