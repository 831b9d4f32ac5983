//! `vgpu-scheduler-extender`: the kube-scheduler extender for vGPU placement (contract §1.2, §3).
//!
//! Thin wiring: parse flags → validate gates → Kubernetes client → watch-driven cache, optional leader
//! election, HTTP(S) server until SIGTERM/SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vgpu_bins::{CoreGateArgs, configure_gates, init_tracing, parse_go_duration};

/// The kube-scheduler extender for vGPU placement.
#[derive(Debug, Parser)]
#[command(name = "vgpu-scheduler-extender", version, about)]
struct Cli {
    /// Scheduler name, also the source of the events the extender records.
    #[arg(long, default_value = vgpu_scheduler::DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
    /// Port of the HTTP(S) server.
    #[arg(long, default_value_t = vgpu_scheduler::DEFAULT_PORT)]
    server_bind_port: u16,
    /// Address of the HTTP(S) server.
    #[arg(long, default_value = "0.0.0.0")]
    server_bind_address: std::net::IpAddr,
    /// Serve HTTPS with --tls-cert-file and --tls-key-file (reloaded when they change).
    #[arg(long)]
    enable_tls: bool,
    /// TLS private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<PathBuf>,
    /// TLS certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// How often the TLS files are checked for changes (Go duration).
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    cert_refresh_interval: Duration,
    /// How long a pre-allocation holds GPUs before the pod must be bound (Go duration, ≥ 1s).
    #[arg(long, default_value = "30s", value_parser = parse_go_duration)]
    stuck_grace_period: Duration,
    /// Follow the co-located kube-scheduler's Lease: ready only while it is held by our identity prefix.
    #[arg(long, conflicts_with = "leader_elect")]
    watch_lease: bool,
    /// Elect a leader among the extender replicas on a Lease; followers are not ready.
    #[arg(long)]
    leader_elect: bool,
    /// Identity prefix in the Lease (default: $POD_NAME, else $HOSTNAME, else the host name).
    #[arg(long)]
    leader_identity_prefix: Option<String>,
    /// Name of the Lease (required with --leader-elect or --watch-lease).
    #[arg(long)]
    leader_elect_resource_name: Option<String>,
    /// Namespace of the Lease (default: $POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE")]
    leader_elect_resource_namespace: Option<String>,
    /// Resource and annotation domain.
    #[arg(long, default_value = "nvidia.com")]
    domain: String,
    /// Kubeconfig file; default: in-cluster config, then `$KUBECONFIG` / `~/.kube/config`.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    gates: CoreGateArgs,
}

fn bad_flag(flag: &str, err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-scheduler-extender: invalid value for --{flag}: {err}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let gates = match configure_gates(vgpu_gates::scheduler_extender(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    if cli.stuck_grace_period < Duration::from_secs(1) {
        return bad_flag(
            "stuck-grace-period",
            format!("{:?} (expected at least 1s)", cli.stuck_grace_period),
        );
    }
    let _ = gates;
    vgpu_bins::not_implemented("vgpu-scheduler-extender", "issue #5")
}
