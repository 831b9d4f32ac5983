//! `vgpu-device-plugin`: the kubelet device plugin for vGPU resources (contract §1.1, §5).
//!
//! Thin wiring: parse flags → validate gates → build the configuration → open the backend and the
//! Kubernetes client → run [`Daemon`] until SIGTERM/SIGINT (SIGHUP restarts the plugins).

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use vgpu_bins::{CoreGateArgs, configure_gates, init_tracing};
use vgpu_core::{
    domain::ResourceDomain,
    node_config::{DeviceListStrategy, ExcludeDevices, MigStrategy, NodeConfigFile, NodeSettings},
};
use vgpu_deviceplugin::{
    config::{DEFAULT_MANAGER_DIR, PluginConfig},
    daemon::Daemon,
    kube_cluster::KubeCluster,
    publisher::DriverLabels,
};
use vgpu_nvml::select::{BackendChoice, SelectOptions, open_backend};

/// The kubelet device plugin for vGPU resources.
#[derive(Debug, Parser)]
#[command(name = "vgpu-device-plugin", version, about)]
struct Cli {
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// vGPU slots per physical GPU.
    #[arg(long, default_value_t = 10)]
    device_split_count: u32,
    /// Multiplier of the 100 cores per GPU.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    device_cores_scaling: f64,
    /// Multiplier of each GPU's memory (> 1 = virtual memory).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    device_memory_scaling: f64,
    /// MiB per `vgpu-memory` unit.
    #[arg(long, default_value_t = 1)]
    device_memory_factor: u32,
    /// The node configuration file (JSON or YAML); empty for none.
    #[arg(long, default_value = "")]
    node_config_path: String,
    /// GPUs to advertise as unhealthy: indices, `a..b` / `a-b` ranges or UUIDs, comma separated.
    #[arg(long, default_value = "")]
    exclude_devices: String,
    /// The kubelet's device-plugin directory.
    #[arg(long, default_value = vgpu_deviceplugin::DEFAULT_DEVICE_PLUGIN_PATH)]
    device_plugin_path: PathBuf,
    /// How devices reach containers: envvar, volume-mounts, cdi-annotations, cdi-cri (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "envvar")]
    device_list_strategy: Vec<String>,
    /// MIG strategy: none, single or mixed.
    #[arg(long, default_value = "mixed")]
    mig_strategy: String,
    /// Resource and annotation domain.
    #[arg(long, default_value = "nvidia.com")]
    domain: String,
    /// Kubeconfig file; default: in-cluster config, then `$KUBECONFIG` / `~/.kube/config`.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Host path of the manager directory.
    #[arg(long, env = "HOST_MANAGER_DIR", default_value = DEFAULT_MANAGER_DIR)]
    host_manager_dir: PathBuf,
    /// Device backend: auto, nvml, metax or mock.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// The mock backend's description file (`--backend mock`).
    #[arg(long, value_name = "FILE")]
    mock_config: Option<PathBuf>,
    /// Seconds between two publications of the node annotations.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    node_publish_interval: u64,
    #[command(flatten)]
    gates: CoreGateArgs,
}

/// A flag value that parses but is not valid: exit 2 naming the flag.
fn bad_flag(flag: &str, err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-device-plugin: invalid value for --{flag}: {err}");
    ExitCode::from(2)
}

fn settings(cli: &Cli) -> Result<NodeSettings, ExitCode> {
    let mut s = NodeSettings {
        device_split_count: cli.device_split_count,
        device_cores_scaling: cli.device_cores_scaling,
        device_memory_scaling: cli.device_memory_scaling,
        device_memory_factor: cli.device_memory_factor,
        ..NodeSettings::default()
    };
    if !cli.exclude_devices.trim().is_empty() {
        s.exclude_devices =
            cli.exclude_devices.parse::<ExcludeDevices>().map_err(|e| bad_flag("exclude-devices", e))?;
    }
    s.device_list_strategy = cli
        .device_list_strategy
        .iter()
        .map(|v| DeviceListStrategy::parse(v.trim()))
        .collect::<Result<_, _>>()
        .map_err(|e| bad_flag("device-list-strategy", e))?;
    s.mig_strategy = MigStrategy::parse(&cli.mig_strategy).map_err(|e| bad_flag("mig-strategy", e))?;
    for (flag, value) in
        [("device-cores-scaling", s.device_cores_scaling), ("device-memory-scaling", s.device_memory_scaling)]
    {
        if !value.is_finite() || value < 0.0 {
            return Err(bad_flag(flag, format!("{value} (expected a finite number ≥ 0)")));
        }
    }
    if s.device_memory_factor == 0 {
        return Err(bad_flag("device-memory-factor", "0 (expected an integer > 0)"));
    }
    Ok(s)
}

async fn kube_client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading --kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no Kubernetes configuration (not in a cluster, no --kubeconfig, no $KUBECONFIG or ~/.kube/config)",
        )?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

async fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

async fn run(
    cli: Cli,
    gates: vgpu_gates::FeatureGates<'static, vgpu_gates::CoreGate>,
    node: String,
    settings: NodeSettings,
) -> anyhow::Result<()> {
    let domain = ResourceDomain::new(&cli.domain).map_err(|e| anyhow::anyhow!("--domain: {e}"))?;
    let mut options = SelectOptions::default();
    options.mock_config.clone_from(&cli.mock_config);
    let opened = open_backend(cli.backend, &options).context("opening the device backend")?;
    for w in &opened.warnings {
        tracing::warn!("{w}");
    }
    let client = kube_client(cli.kubeconfig.as_ref()).await?;
    let cluster = Arc::new(KubeCluster::new(client));

    let mut config = PluginConfig::new(node);
    config.device_plugin_path.clone_from(&cli.device_plugin_path);
    config.host_manager_dir.clone_from(&cli.host_manager_dir);
    config.domain = domain;
    config.settings = settings;
    config.gates = gates;
    let mut driver = DriverLabels::default();
    if let Some(info) = &opened.driver {
        config.driver_version.clone_from(&info.driver_version);
        driver =
            DriverLabels { driver_version: info.driver_version.clone(), cuda_version: info.cuda_version };
    }
    let backend: Arc<dyn vgpu_core::backend::DeviceBackend> = Arc::from(opened.backend);
    let mut daemon = Daemon::new(config, backend, cluster.clone(), cluster)?;
    daemon.driver = driver;
    daemon.publisher.interval = Duration::from_secs(cli.node_publish_interval);

    let shutdown = shutdown_signal().await?;
    let (restart_tx, restart_rx) = tokio::sync::mpsc::channel(1);
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP received");
            let _ = restart_tx.try_send(());
        }
    });
    daemon.run(shutdown, restart_rx).await?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let gates = match configure_gates(vgpu_gates::device_plugin(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    let mut settings = match settings(&cli) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let Some(node) = cli.node_name.clone().filter(|n| !n.trim().is_empty()) else {
        eprintln!("vgpu-device-plugin: --node-name (or NODE_NAME) is required");
        return ExitCode::from(2);
    };
    if !cli.node_config_path.is_empty() {
        let resolved = NodeConfigFile::load(&cli.node_config_path).and_then(|f| f.resolve(&node, settings));
        settings = match resolved {
            Ok(s) => s,
            Err(e) => return bad_flag("node-config-path", e),
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vgpu-device-plugin: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli, gates, node, settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-device-plugin: {e:#}");
            ExitCode::FAILURE
        }
    }
}
