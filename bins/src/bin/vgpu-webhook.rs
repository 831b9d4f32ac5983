//! `vgpu-webhook`: the admission webhook (contract §1.4, §10).
//!
//! Thin wiring: parse and validate flags (exit 2 naming the flag) → Kubernetes client → HTTPS server with the
//! certificate `<--cert-dir>/<--tls-cert-name>` and key `<--cert-dir>/<--tls-key-name>` (re-read when they
//! change, so cert-manager rotations need no restart) until SIGTERM/SIGINT. Routes: `/pods/mutate`,
//! `/pods/validate`, `/resourceclaims/validate`, `/volcano-jobs/mutate`, `/volcano-jobs/validate`, `/healthz`,
//! `/readyz` (see the `vgpu_webhook` crate docs).
//! The webhook has no feature gates (vgpu-manager registers none for it).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use vgpu_bins::shutdown_signal;
use vgpu_core::domain::ResourceDomain;
use vgpu_kube::claims::KubeApi;
use vgpu_webhook::admit::Admission;
use vgpu_webhook::config::{self, WebhookConfig};
use vgpu_webhook::server::ServerConfig;

/// The vgpu admission webhook: pod mutation and validation, device-plugin → DRA conversion.
#[derive(Debug, Parser)]
#[command(name = "vgpu-webhook", version, about)]
struct Cli {
    /// Port of the HTTPS server (1-65535).
    #[arg(long, default_value_t = 9443)]
    server_bind_port: u16,
    #[command(flatten)]
    server: vgpu_bins::WebhookServerArgs,
    /// Scheduler name set on vGPU pods that name none (or default-scheduler); empty: leave it.
    #[arg(long, default_value = "")]
    scheduler_name: String,
    /// Default node scheduling policy of vGPU pods: binpack or spread (empty: none).
    #[arg(long, default_value = "")]
    default_node_policy: String,
    /// Default device scheduling policy of vGPU pods: binpack or spread (empty: none).
    #[arg(long, default_value = "")]
    default_device_policy: String,
    /// Default topology mode of pods with a multi-GPU container: numa, numa-strict, link or link-strict.
    #[arg(long, default_value = "")]
    default_topology_mode: String,
    /// Default runtimeClassName of vGPU pods (empty: none).
    #[arg(long, default_value = "")]
    default_runtime_class: String,
    /// DeviceClass of the ResourceClaims made by the DRA conversion.
    #[arg(long, default_value = config::DEFAULT_DEVICE_CLASS_NAME)]
    vgpu_device_class_name: String,
    /// Enforce the DRA claim-sharing rules in /pods/validate and /resourceclaims/validate.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    dra_admission_enabled: bool,
    /// Convert vGPU extended resources into DRA ResourceClaims (ResourceClaimTemplates for Volcano Jobs).
    #[arg(long = "default-convert2-dra", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    default_convert2_dra: bool,
    /// One ResourceClaim per pod instead of one per container (requires --default-convert2-dra).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    combined_resource_claim: bool,
    /// Resource and annotation domain.
    #[arg(long, default_value = "nvidia.com")]
    domain: String,
    #[command(flatten)]
    kube: vgpu_bins::KubeClientArgs,
    #[command(flatten)]
    log: vgpu_bins::LogArgs,
    #[command(flatten)]
    pprof: vgpu_bins::PprofArgs,
}

fn bad_flag(err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-webhook: {err}");
    ExitCode::from(2)
}

fn non_empty(s: &str) -> Option<String> {
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_owned())
}

/// The resolved configuration, or the message naming the flag.
fn webhook_config(cli: &Cli) -> Result<WebhookConfig, String> {
    if cli.server_bind_port == 0 {
        return Err("invalid --server-bind-port 0: expected a port in 1..65535".to_owned());
    }
    let domain = ResourceDomain::new(&cli.domain).map_err(|e| format!("invalid --domain: {e}"))?;
    let config = WebhookConfig {
        domain,
        scheduler_name: non_empty(&cli.scheduler_name),
        default_node_policy: config::parse_default_policy("default-node-policy", &cli.default_node_policy)
            .map_err(|e| e.to_string())?,
        default_device_policy: config::parse_default_policy(
            "default-device-policy",
            &cli.default_device_policy,
        )
        .map_err(|e| e.to_string())?,
        default_topology_mode: config::parse_default_topology_mode(&cli.default_topology_mode)
            .map_err(|e| e.to_string())?,
        default_runtime_class: non_empty(&cli.default_runtime_class),
        device_class_name: cli.vgpu_device_class_name.trim().to_owned(),
        dra_admission: cli.dra_admission_enabled,
        convert_to_dra: cli.default_convert2_dra,
        combined_claim: cli.combined_resource_claim,
    };
    config.validate().map_err(|e| e.to_string())?;
    cli.server.check().map_err(|e| e.to_string())?;
    Ok(config)
}

async fn run(cli: Cli, config: WebhookConfig) -> anyhow::Result<()> {
    let client = cli.kube.client(vgpu_bins::COMPONENT_RATE).await?;
    let server = ServerConfig::new(
        cli.server.bind_address(cli.server_bind_port),
        cli.server.cert_file(),
        cli.server.key_file(),
    );
    tracing::info!(address = %server.bind_address, config = ?config, "serving the admission webhook");
    let admission = Arc::new(Admission::new(config, KubeApi::new(client)));
    let shutdown = shutdown_signal()?;
    vgpu_webhook::server::run(server, admission, shutdown).await.context("the HTTPS server")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-webhook: {e}");
        return ExitCode::from(2);
    }
    let config = match webhook_config(&cli) {
        Ok(c) => c,
        Err(e) => return bad_flag(e),
    };
    vgpu_bins::run_async("vgpu-webhook", &cli.pprof.clone(), run(cli, config))
}
