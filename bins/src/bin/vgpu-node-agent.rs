//! `vgpu-node-agent`: the GPU module's node agent (being built, issue #20).

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("vgpu-node-agent: not implemented yet (issue #20)");
    ExitCode::from(1)
}
