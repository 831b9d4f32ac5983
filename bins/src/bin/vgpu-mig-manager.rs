//! `vgpu-mig-manager`: device-plugin mode's MIG manager (issue #20 item 6; see the `vgpu_mig_manager` crate
//! docs).
//!
//! Thin wiring: parse and validate flags (exit 2 naming the flag) → open the device backend → Kubernetes
//! client → one reconcile pass every `--interval` (from `--retry-interval`, doubling up to
//! `--max-retry-interval`, while pods are being evicted) until SIGTERM/SIGINT. `--drain` evicts every pod
//! but DaemonSet and mirror pods instead of the GPU pods only; `--gpu-reset=false` asks for a node reboot
//! (never a GPU reset) when a MIG mode change is pending. It has no feature gates.

use std::{collections::BTreeMap, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use vgpu_bins::{parse_go_duration, shutdown_signal};
use vgpu_core::node_config::MigStrategy;
use vgpu_mig_manager::{ManagerConfig, MigManager, drain::EvictionScope, kube_cluster::KubeCluster};
use vgpu_nvml::select::{BackendChoice, SelectOptions, open_backend};

/// Applies the MIG layout named by the node's `nvidia.com/mig.config` label, with the node in maintenance.
#[derive(Debug, Parser)]
#[command(name = "vgpu-mig-manager", version, about)]
struct Cli {
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The mig-parted configuration ConfigMap, `<namespace>/<name>`.
    #[arg(long, env = "MIG_CONFIGMAP", default_value = "d8-gpu/default-mig-parted-config")]
    config_map: String,
    /// The key of the configuration file in the ConfigMap.
    #[arg(long, default_value = "config.yaml")]
    config_key: String,
    /// Resource name prefix that makes a pod a GPU pod (evicted before a change); repeatable.
    #[arg(long = "gpu-resource-prefix", default_value = "nvidia.com/")]
    gpu_resource_prefixes: Vec<String>,
    /// Label selector `k=v[,k=v]` of the device plugin pods deleted after a change (so they re-advertise);
    /// empty: none.
    #[arg(long, default_value = "app.kubernetes.io/name=vgpu-device-plugin")]
    device_plugin_selector: String,
    /// Publish GPU feature labels compatible with gpu-feature-discovery.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    gfd_labels: bool,
    /// The device plugin's MIG strategy, for the labels: none, single or mixed.
    #[arg(long, env = "MIG_STRATEGY", default_value = "mixed")]
    mig_strategy: String,
    /// The machine's DMI product name file, for `nvidia.com/gpu.machine` (absent: no label).
    #[arg(long, default_value = "/sys/class/dmi/id/product_name")]
    machine_type_file: PathBuf,
    /// Time between passes (Go duration).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    interval: Duration,
    /// Time between passes while pods are being evicted, the first time (Go duration); it doubles on each
    /// further wait.
    #[arg(long, default_value = "2s", value_parser = parse_go_duration)]
    retry_interval: Duration,
    /// The longest time between passes while evictions are refused or pods terminate (Go duration).
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    max_retry_interval: Duration,
    /// Drain the node for a MIG change (every pod but DaemonSet and mirror pods, through the Eviction API so
    /// PodDisruptionBudgets hold) instead of evicting the GPU pods only.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    drain: bool,
    /// Reset a GPU whose MIG mode change is pending; false: request a node reboot at once.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    gpu_reset: bool,
    /// Device backend: auto, nvml, metax or mock. Also env `VGPU_BACKEND`: a chart whose command line is
    /// fixed (vgpu-manager's own) selects the backend through its containers' extra env.
    #[arg(long, env = "VGPU_BACKEND", default_value = "auto")]
    backend: BackendChoice,
    /// The mock backend's description file (`--backend mock`); also env `VGPU_MOCK_CONFIG`.
    #[arg(long, env = "VGPU_MOCK_CONFIG", value_name = "FILE")]
    mock_config: Option<PathBuf>,
    #[command(flatten)]
    kube: vgpu_bins::KubeClientArgs,
    #[command(flatten)]
    log: vgpu_bins::LogArgs,
    #[command(flatten)]
    pprof: vgpu_bins::PprofArgs,
}

fn bad_flag(err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-mig-manager: {err}");
    ExitCode::from(2)
}

fn parse_selector(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(format!("invalid --device-plugin-selector {text:?}: expected key=value[,key=value]")),
        })
        .collect()
}

/// The resolved configuration, or the message naming the flag.
fn manager_config(cli: &Cli) -> Result<ManagerConfig, String> {
    let node = cli.node_name.trim();
    if node.is_empty() {
        return Err("invalid --node-name \"\" (NODE_NAME): expected this node's name".to_owned());
    }
    let (namespace, name) = cli
        .config_map
        .split_once('/')
        .filter(|(ns, n)| !ns.trim().is_empty() && !n.trim().is_empty() && !n.contains('/'))
        .ok_or_else(|| format!("invalid --config-map {:?}: expected <namespace>/<name>", cli.config_map))?;
    if cli.config_key.trim().is_empty() {
        return Err("invalid --config-key \"\": expected a ConfigMap key such as config.yaml".to_owned());
    }
    for (flag, d) in [
        ("--interval", cli.interval),
        ("--retry-interval", cli.retry_interval),
        ("--max-retry-interval", cli.max_retry_interval),
    ] {
        if d.is_zero() {
            return Err(format!("invalid {flag} 0s: expected a positive duration, e.g. 10s"));
        }
    }
    if cli.gpu_resource_prefixes.iter().any(|p| p.trim().is_empty()) {
        return Err("invalid --gpu-resource-prefix \"\": expected a prefix such as nvidia.com/".to_owned());
    }
    let mut config = ManagerConfig::new(node, namespace.trim());
    config.config_map_name = name.trim().to_owned();
    config.config_key = cli.config_key.trim().to_owned();
    config.gpu_resource_prefixes = cli.gpu_resource_prefixes.clone();
    config.device_plugin_selector = parse_selector(&cli.device_plugin_selector)?;
    config.gfd_labels = cli.gfd_labels;
    config.mig_strategy = MigStrategy::parse(&cli.mig_strategy)
        .map_err(|e| format!("invalid --mig-strategy {:?}: {e}", cli.mig_strategy))?;
    config.machine = std::fs::read_to_string(&cli.machine_type_file).ok().map(|s| s.trim().to_owned());
    config.period = cli.interval;
    config.retry_period = cli.retry_interval;
    if cli.max_retry_interval < cli.retry_interval {
        return Err(format!(
            "invalid --max-retry-interval {:?}: expected at least --retry-interval ({:?})",
            cli.max_retry_interval, cli.retry_interval
        ));
    }
    config.max_retry_period = cli.max_retry_interval;
    config.eviction = if cli.drain { EvictionScope::Drain } else { EvictionScope::GpuPods };
    config.gpu_reset = cli.gpu_reset;
    Ok(config)
}

async fn run(cli: Cli, config: ManagerConfig) -> anyhow::Result<()> {
    let mut options = SelectOptions::default();
    options.mock_config.clone_from(&cli.mock_config);
    let opened = open_backend(cli.backend, &options).context("opening the device backend")?;
    for w in &opened.warnings {
        tracing::warn!("{w}");
    }
    let backend: Arc<dyn vgpu_core::backend::DeviceBackend> = Arc::from(opened.backend);
    // Without kube's default retry layer: it retries a 429 up to 15 times with a growing delay, so a
    // PodDisruptionBudget's refusal of an eviction would never come back as one (the pass would time out);
    // the manager retries on its next pass with its own backoff instead.
    let options = cli.kube.options(vgpu_bins::COMPONENT_RATE);
    let bucket = options.bucket().context("the Kubernetes client rate limit")?;
    let kube_config = vgpu_kube::client::without_retry(
        options.config().await.context("the Kubernetes client configuration")?,
    );
    let client = vgpu_kube::client::client_with_bucket(kube_config, bucket)
        .context("building the Kubernetes client")?;
    tracing::info!(config = ?config, backend = backend.name(), "starting the MIG manager");
    let shutdown = shutdown_signal()?;
    MigManager::new(config, KubeCluster::new(client), backend).run(shutdown).await;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-mig-manager: {e}");
        return ExitCode::from(2);
    }
    let config = match manager_config(&cli) {
        Ok(c) => c,
        Err(e) => return bad_flag(e),
    };
    vgpu_bins::run_async("vgpu-mig-manager", &cli.pprof.clone(), run(cli, config))
}
