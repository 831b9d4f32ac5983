//! `vgpu-scheduler-extender`: the kube-scheduler extender for vGPU placement.

use std::process::ExitCode;

use clap::Parser;
use vgpu_bins::{CoreGateArgs, configure_gates, init_tracing, not_implemented};

/// the kube-scheduler extender for vGPU placement.
#[derive(Debug, Parser)]
#[command(name = "vgpu-scheduler-extender", version, about)]
struct Cli {
    #[command(flatten)]
    gates: CoreGateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let _gates = match configure_gates(vgpu_gates::scheduler_extender(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    not_implemented("vgpu-scheduler-extender", "issue #5")
}
