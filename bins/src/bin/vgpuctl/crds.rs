//! `vgpuctl crds`: print the GPU module's CRDs (PhysicalGPU, GPUClass) as one YAML stream for
//! `kubectl apply -f -`, for the default group or another (`--group`). The default group's output is the
//! committed `deploy/gpu-module/crds/*.yaml`, joined with `---` (both come from `vgpu_api::crd_yaml`).

use std::process::ExitCode;

use crate::output;

/// Arguments of `vgpuctl crds`.
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// API group of the CRDs (a DNS subdomain with at least one dot).
    #[arg(long, default_value = vgpu_api::DEFAULT_GROUP)]
    pub group: String,
}

/// Prints the CRDs; exit 2 on an invalid group.
pub fn run(args: CrdsArgs) -> ExitCode {
    match vgpu_api::crds_yaml(&args.group) {
        Ok(yaml) => output::print(&yaml, ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: invalid --group: {e}");
            ExitCode::from(2)
        }
    }
}
