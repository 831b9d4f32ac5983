//! `vgpu-webhook`: the admission webhook (being built, issue #19).

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("vgpu-webhook: not implemented yet (issue #19)");
    ExitCode::from(1)
}
