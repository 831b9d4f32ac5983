//! `vgpu-device-client`: registers a vGPU container with the device plugin's client-mode registry
//! (contract §1.6, gate `DevicePluginClientMode`). Installed on the host as
//! `<HOST_MANAGER_DIR>/registry/device-client`; the in-container library runs it at start-up.
//!
//! Exit status: 0 registered; 1 the registry refused or the call failed (the message says why); 2 bad
//! flags.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::Parser;
use vgpu_deviceplugin::device_client::{CONTAINER_SOCKET, DeviceClientError, RegisterTarget, register};

/// Registers this container's devices with the vGPU device plugin (client mode).
#[derive(Debug, Parser)]
#[command(name = "vgpu-device-client", version, about)]
struct Cli {
    /// The registry's unix socket (must exist).
    #[arg(long, default_value = CONTAINER_SOCKET)]
    address: PathBuf,
    /// The pod's UID (required unless --register-uuid).
    #[arg(long, env = "VGPU_POD_UID")]
    pod_uid: Option<String>,
    /// The container's name (required unless --register-uuid).
    #[arg(long, env = "VGPU_CONTAINER_NAME")]
    container_name: Option<String>,
    /// A DRA claim's register UUID (instead of the pod and container).
    #[arg(long, env = "MANAGER_CLIENT_REGISTER_UUID")]
    register_uuid: Option<String>,
    /// Limit of the whole call: whole seconds as vgpu-manager's `--timeout` takes it (12), or a Go duration
    /// (12s, 500ms, 1m).
    #[arg(long, default_value = "12s", value_parser = parse_timeout)]
    timeout: Duration,
    #[command(flatten)]
    log: vgpu_bins::LogArgs,
}

/// `--timeout`: an integer is seconds (vgpu-manager's `IntVar`), anything else a Go duration; more than 0.
fn parse_timeout(value: &str) -> Result<Duration, String> {
    if let Ok(seconds) = value.trim().parse::<i64>() {
        return match u64::try_from(seconds) {
            Ok(s) if s > 0 => Ok(Duration::from_secs(s)),
            _ => Err(format!("{value:?} (expected a duration > 0)")),
        };
    }
    match vgpu_bins::parse_go_duration(value)? {
        d if d.is_zero() => Err(format!("{value:?} (expected a duration > 0)")),
        d => Ok(d),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-device-client: {e}");
        return ExitCode::from(2);
    }
    let target = match RegisterTarget::from_parts(
        cli.pod_uid.as_deref(),
        cli.container_name.as_deref(),
        cli.register_uuid.as_deref(),
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vgpu-device-client: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vgpu-device-client: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(register(&cli.address, &target, cli.timeout)) {
        Ok(()) => {
            tracing::info!(?target, "registered");
            ExitCode::SUCCESS
        }
        Err(e @ DeviceClientError::NoSocket { .. }) => {
            eprintln!("vgpu-device-client: --address: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("vgpu-device-client: {e}");
            ExitCode::FAILURE
        }
    }
}
