//! `vgpu-controller`: the GPU module's controller (issue #20; library `vgpu_controller`).
//!
//! Thin wiring: parse and validate flags (exit 2 naming the flag) → Kubernetes client → watch caches of
//! GPUClass, PhysicalGPU, Node, ResourceClaim, ResourceSlice and our DeviceClasses → reconcile passes (only on
//! the Lease leader with `--leader-elect`, vgpu-scheduler's election) → one HTTPS server for the admission
//! routes, `/healthz`, `/readyz` (caches synced), `/version` and `/metrics` (TokenReview +
//! SubjectAccessReview with `--enable-rbac`), with the certificate `<--cert-dir>/<--tls-cert-name>` re-read
//! when it changes. Every replica serves admission; SIGTERM/SIGINT stop everything. No feature gates.
//! The leader also gives each ResourceClaim the pod mutation created its pod as owner, and deletes one whose
//! pod does not exist after `--orphaned-claim-grace-period` (`vgpu_controller::claims`).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use vgpu_bins::{parse_go_duration, shutdown_signal};
use vgpu_controller::admission::Admission;
use vgpu_controller::config::{ControllerConfig, parse_driver_flag};
use vgpu_controller::kube_cluster::KubeCluster;
use vgpu_controller::metrics::Metrics;
use vgpu_controller::reconcile::Reconciler;
use vgpu_controller::server::{self, ControllerServer};
use vgpu_kube::claims::KubeApi;
use vgpu_lease::{LeaderConfig, LeaderMode, Readiness, Role, leader};
use vgpu_serve::authz::Authorizer;
use vgpu_serve::http::HttpTimeouts;

/// The GPU module controller: GPUClass → DeviceClass, PhysicalGPU occupancy, admission for DRA objects.
#[derive(Debug, Parser)]
#[command(name = "vgpu-controller", version, about)]
struct Cli {
    /// Port of the HTTPS server (admission, health, metrics; 1-65535).
    #[arg(long, default_value_t = 9443)]
    server_bind_port: u16,
    #[command(flatten)]
    server: vgpu_bins::WebhookServerArgs,
    /// API group of PhysicalGPU and GPUClass.
    #[arg(long, default_value = vgpu_api::DEFAULT_GROUP)]
    group: String,
    /// DRA driver of a vendor, `<vendor>=<driver>` (repeatable; adds to or overrides nvidia=manager.nvidia.com, metax=gpu.metax-tech.com).
    #[arg(long = "driver", value_name = "VENDOR=DRIVER")]
    drivers: Vec<String>,
    /// How old a ResourceClaim made by the pod mutation must be before it is deleted when its pod does not
    /// exist (the pod was refused after the mutation, or never stored); Go duration, more than 0.
    #[arg(long, default_value = "60s", value_parser = parse_go_duration)]
    orphaned_claim_grace_period: Duration,
    /// Authorize /metrics scrapes with TokenReview + SubjectAccessReview (`get` on the non-resource URL /metrics).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    enable_rbac: bool,
    /// Elect one reconciling replica on a Lease (admission runs on every replica).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Prefix of this replica's identity in the Lease (default: POD_NAME, HOSTNAME or the host name).
    #[arg(long)]
    leader_identity_prefix: Option<String>,
    /// Name of the Lease.
    #[arg(long, default_value = "vgpu-controller")]
    leader_elect_resource_name: String,
    /// Namespace of the Lease (default: POD_NAMESPACE, else kube-system).
    #[arg(long)]
    leader_elect_resource_namespace: Option<String>,
    #[command(flatten)]
    kube: vgpu_bins::KubeClientArgs,
    #[command(flatten)]
    log: vgpu_bins::LogArgs,
    #[command(flatten)]
    pprof: vgpu_bins::PprofArgs,
}

fn bad_flag(err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-controller: {err}");
    ExitCode::from(2)
}

/// The resolved configuration, or the message naming the flag.
fn resolve(cli: &Cli) -> Result<(ControllerConfig, LeaderConfig), String> {
    if cli.server_bind_port == 0 {
        return Err("invalid --server-bind-port 0: expected a port in 1..65535".to_owned());
    }
    let mut config = ControllerConfig::with_group(&cli.group).map_err(|e| format!("invalid --group: {e}"))?;
    if cli.orphaned_claim_grace_period.is_zero() {
        return Err("invalid --orphaned-claim-grace-period 0s: expected more than 0 (the time a pod takes from the mutation to being stored)".to_owned());
    }
    config.orphan_grace = cli.orphaned_claim_grace_period;
    for value in &cli.drivers {
        let (vendor, driver) = parse_driver_flag(value).map_err(|e| e.to_string())?;
        config.drivers.insert(vendor, driver);
    }
    cli.server.check().map_err(|e| e.to_string())?;
    let leader = if cli.leader_elect {
        let namespace = cli
            .leader_elect_resource_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "kube-system".to_owned());
        let mut l = LeaderConfig::new(LeaderMode::Elect, namespace, cli.leader_elect_resource_name.clone());
        if let Some(prefix) = cli.leader_identity_prefix.clone().filter(|p| !p.trim().is_empty()) {
            l.identity_prefix = prefix;
        }
        // The scheduler's role label is the extender's; the controller's pod gets none.
        l.pod_name = None;
        l.pod_namespace = None;
        l.validate().map_err(|e| format!("invalid --leader-elect-resource-name/namespace: {e}"))?;
        l
    } else {
        LeaderConfig::off()
    };
    Ok((config, leader))
}

async fn run(cli: Cli, config: ControllerConfig, leader_config: LeaderConfig) -> anyhow::Result<()> {
    let client = cli.kube.client(vgpu_bins::COMPONENT_RATE).await?;
    let tls = cli.server.tls_files();
    // Load the certificate before binding, so a bad file fails before the port is taken.
    drop(tls.start().context("the serving certificate")?);
    let address = cli.server.bind_address(cli.server_bind_port);
    let listener = TcpListener::bind(address).await.with_context(|| format!("listening on {address}"))?;

    let (registry, metrics) = Metrics::with_registry();
    let (cluster, watches) = KubeCluster::new(client.clone(), config.clone()).context("--group")?;
    let cluster = Arc::new(cluster);
    let changes = Arc::new(Notify::new());
    let synced = Arc::new(AtomicBool::new(false));
    let readiness = Readiness::new(leader_config.initial_role());

    let stop = tokio_util::sync::CancellationToken::new();
    let watch_task = {
        let changes = changes.clone();
        let stop = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            tokio::select! {
                () = watches.run(changes) => {}
                () = stop => {}
            }
        })
    };
    let elector = tokio::spawn(leader::run(
        client.clone(),
        leader_config,
        readiness.clone(),
        stop.clone().cancelled_owned(),
    ));
    let reconciler = {
        let cluster = cluster.clone();
        let synced = synced.clone();
        let readiness = readiness.clone();
        let metrics = metrics.clone();
        let config = config.clone();
        let stop = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            tokio::select! {
                r = cluster.wait_synced() => {
                    if r.is_err() {
                        return;
                    }
                }
                () = stop => return,
            }
            synced.store(true, Ordering::Release);
            tracing::info!("caches synced; reconciling");
            let r = Reconciler::new(config, cluster, metrics);
            let leading = move || matches!(readiness.role(), Role::Leader | Role::Standalone);
            r.run(changes, leading, std::future::pending()).await;
        })
    };

    let authorizer = cli.enable_rbac.then(|| Arc::new(Authorizer::kube(client.clone())));
    let admission = Arc::new(Admission::new(config, cluster, KubeApi::new(client), metrics));
    let timeouts = HttpTimeouts::default();
    let routes = ControllerServer::new(admission, registry, authorizer, synced, timeouts.read_timeout);
    let shutdown = shutdown_signal()?;
    tracing::info!(%address, rbac = cli.enable_rbac, "serving the controller");
    let stop_all = stop.clone();
    let served = server::serve(listener, routes, &tls, timeouts, async move {
        shutdown.await;
        stop_all.cancel();
    })
    .await;
    stop.cancel();
    reconciler.abort();
    watch_task.await.context("the watches panicked")?;
    elector.await.context("the leader elector panicked")?.context("leader election")?;
    served.context("the HTTPS server")?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-controller: {e}");
        return ExitCode::from(2);
    }
    let (config, leader_config) = match resolve(&cli) {
        Ok(c) => c,
        Err(e) => return bad_flag(e),
    };
    vgpu_bins::run_async("vgpu-controller", &cli.pprof.clone(), run(cli, config, leader_config))
}
