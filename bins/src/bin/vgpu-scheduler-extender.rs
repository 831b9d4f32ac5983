//! `vgpu-scheduler-extender`: the kube-scheduler extender for vGPU placement.

use std::process::ExitCode;

use clap::Parser;
use vgpu_bins::{CoreGateArgs, gates_then_not_implemented};

/// The kube-scheduler extender for vGPU placement.
#[derive(Debug, Parser)]
#[command(name = "vgpu-scheduler-extender", version, about)]
struct Cli {
    #[command(flatten)]
    gates: CoreGateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    gates_then_not_implemented(
        vgpu_gates::scheduler_extender(),
        &cli.gates.feature_gates,
        "vgpu-scheduler-extender",
        "issue #5",
    )
}
