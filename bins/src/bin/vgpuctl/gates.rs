//! `vgpuctl gates`.

use std::process::ExitCode;

/// `vgpuctl gates` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum GatesCommand {
    /// List gates.
    List,
}

/// Runs a `gates` subcommand.
pub fn run(_cmd: GatesCommand) -> ExitCode {
    ExitCode::FAILURE
}
